//! A backup from a server that predates `BackupParts`: the client falls
//! back to `Backup` and gets the same snapshot.

use super::*;

#[tokio::test]
async fn a_server_without_backup_parts_is_asked_for_the_whole_snapshot() {
    let snapshot = v1::Snapshot {
        format: 2,
        epoch: 3,
        counter: 41,
        leases: Vec::new(),
        stored_leases: vec![v1::StoredLease {
            resource: "r:1".into(),
            acquisition_digest: vec![1; 16],
            token: (3 << 40) | 41,
            ttl_ms: 30_000,
            session_digest: Vec::new(),
            holder: String::new(),
            permits: 0,
        }],
        sessions: Vec::new(),
    };
    let (mut client, _streams) = scripted_with(Some(snapshot.clone())).await;
    assert_eq!(client.backup().await.unwrap(), snapshot);
}
