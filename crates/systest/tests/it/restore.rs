//! Backup and restore: a restore starts a new token epoch, so every token
//! issued afterwards is above every token issued before it, including tokens
//! issued after the backup was taken.

use std::time::Duration;

use baton_client::{Acquired, Client};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{resource_name, FenceRequest, FencingToken, Outcome};
use baton_systest as common;
use common::{cli, json_u64, TempDir};

async fn grant_tokens(url: &str, prefix: &str, n: usize) -> Vec<u64> {
    let mut c = Client::connect(url).await.unwrap();
    let mut tokens = Vec::new();
    for i in 0..n {
        match c
            .acquire(
                &format!("{prefix}:{i}"),
                Some(Duration::from_secs(30)),
                Duration::ZERO,
            )
            .await
            .unwrap()
        {
            Acquired::Granted(l) => tokens.push(l.token.get()),
            other => panic!("{other:?}"),
        }
    }
    tokens
}

/// Backs up the server at `url` to `out` with the CLI; the number of
/// leases it reports.
fn backup_leases(url: &str, out: &std::path::Path) -> u64 {
    let run = cli(&[
        "admin",
        "backup",
        "--out",
        out.to_str().unwrap(),
        "--server",
        url,
        "--json",
    ]);
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    json_u64(&String::from_utf8(run.stdout).unwrap(), "n_leases").expect("n_leases")
}

fn restore(
    backup: &std::path::Path,
    data_dir: &std::path::Path,
    extra: &[&str],
) -> (Option<i32>, String) {
    let mut args = vec![
        "admin",
        "restore",
        "--json",
        "--from",
        backup.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = cli(&args);
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn restore_starts_an_epoch_above_every_earlier_token() {
    let dir = TempDir::new("restore");
    let files = TempDir::new("restore-files");
    let backup = files.path().join("baton.backup");
    let mut s = common::serve(dir.path(), &[]);
    let before = grant_tokens(&s.url(), "before", 5).await;
    assert_eq!(backup_leases(&s.url(), &backup), 5);
    let after_backup = grant_tokens(&s.url(), "after", 5).await;
    let highest = *after_backup.iter().max().unwrap();
    assert!(highest > *before.iter().max().unwrap());

    // The store is locked while its server runs.
    let (code, text) = restore(&backup, dir.path(), &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("in use"), "{text}");
    assert!(
        text.contains(r#""action":"restore""#) && text.contains(r#""outcome":"failed""#),
        "a refused restore is audited: {text}"
    );
    s.kill9();

    // Restore over the same data directory.
    let (code, text) = restore(&backup, dir.path(), &[]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(json_u64(&text, "dropped_leases"), Some(5));
    let epoch = json_u64(&text, "epoch").unwrap();
    let first_token = json_u64(&text, "first_token").unwrap();
    assert!(
        text.contains(&format!(
            r#""action":"restore","resource":"{}","token":{first_token},"outcome":"ok""#,
            dir.path().display()
        )),
        "the restore is audited with its first token: {text}"
    );
    s.restart();
    let restored = grant_tokens(&s.url(), "after", 3).await;
    assert!(
        restored.iter().all(|t| *t > highest),
        "{restored:?} not above {highest}"
    );
    assert!(restored.iter().all(|t| t >> 40 == epoch));
    let highest_restored = *restored.iter().max().unwrap();
    drop(s);

    // Restoring the same old backup again onto a fresh directory, knowing the
    // epoch in use since then, stays above the first restore's tokens.
    let fresh = TempDir::new("restore-fresh");
    let min_epoch = ((highest_restored >> 40) + 1).to_string();
    let (code, text) = restore(&backup, fresh.path(), &["--min-epoch", &min_epoch]);
    assert_eq!(code, Some(0), "{text}");
    let s2 = common::serve(fresh.path(), &[]);
    let again = grant_tokens(&s2.url(), "again", 2).await;
    assert!(
        again.iter().all(|t| *t > highest_restored),
        "{again:?} not above {highest_restored}"
    );

    // A fresh directory without a hint still lands above the backup's epoch.
    let fresh2 = TempDir::new("restore-fresh2");
    let (code, text) = restore(&backup, fresh2.path(), &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(json_u64(&text, "epoch").unwrap() > before[0] >> 40);
}

/// A backup larger than gRPC's default 4 MiB message limit is taken and
/// restored whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_past_four_mebibytes_is_taken_and_restored_whole() {
    const N: usize = 10_240;
    let dir = TempDir::new("restore-big");
    let files = TempDir::new("restore-big-files");
    let backup = files.path().join("baton.backup");
    let s = common::serve(dir.path(), &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    let pad = "x".repeat(480);
    let names: Vec<String> = (0..N).map(|i| format!("big:{i:06}:{pad}")).collect();
    for chunk in names.chunks(64) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let out = c
            .acquire_all(&chunk, Some(Duration::from_secs(600)), Duration::ZERO)
            .await
            .unwrap();
        assert!(matches!(out, baton_client::AcquiredAll::Granted { .. }));
    }
    assert_eq!(backup_leases(&s.url(), &backup), N as u64);
    let len = std::fs::metadata(&backup).unwrap().len();
    assert!(len > 4 << 20, "the backup is only {len} bytes");
    drop(s);
    let (code, text) = restore(&backup, dir.path(), &[]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(json_u64(&text, "dropped_leases"), Some(N as u64));
}

/// One owner's write at the resource: acquire, publish with the token, release.
async fn owned_write(url: &str, conn: &mut rusqlite::Connection, op: &str) -> (u64, Outcome) {
    let mut c = Client::connect(url).await.unwrap();
    let lease = match c
        .acquire("doc", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    let token = lease.token.get();
    let outcome = publish(conn, token, op);
    c.release("doc", &lease.acquisition_id).await.unwrap();
    (token, outcome)
}

fn publish(conn: &mut rusqlite::Connection, token: u64, op: &str) -> Outcome {
    let req = FenceRequest::new(
        "doc",
        FencingToken::of(token).unwrap(),
        op,
        op.as_bytes(),
        op.as_bytes(),
    )
    .unwrap();
    SqliteFence::publish(conn, &req).unwrap()
}

/// The seed's restore hazard, end to end: the lease store goes back to an
/// old backup, while the resource has seen tokens issued after that backup.
/// The restored server starts a new epoch, so new work proceeds and every
/// pre-restore token is refused at the resource.
#[tokio::test]
async fn after_a_restore_from_an_old_backup_every_pre_restore_token_is_refused_at_the_resource() {
    let dir = TempDir::new("restore-fence");
    let files = TempDir::new("restore-fence-files");
    let backup = files.path().join("baton.backup");
    let mut conn = rusqlite::Connection::open(files.path().join("resource.sqlite")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let mut s = common::serve(dir.path(), &[]);
    let mut pre_restore = vec![owned_write(&s.url(), &mut conn, "w0").await];
    backup_leases(&s.url(), &backup);
    for op in ["w1", "w2", "w3"] {
        pre_restore.push(owned_write(&s.url(), &mut conn, op).await);
    }
    assert!(
        pre_restore
            .iter()
            .all(|(_, o)| matches!(o, Outcome::Applied { .. })),
        "{pre_restore:?}"
    );
    s.kill9();
    let (code, text) = restore(&backup, dir.path(), &[]);
    assert_eq!(code, Some(0), "{text}");
    s.restart();

    let (token, outcome) = owned_write(&s.url(), &mut conn, "after-restore").await;
    assert!(
        matches!(outcome, Outcome::Applied { .. }),
        "new work proceeds after the restore: {outcome:?}"
    );
    for (old, _) in &pre_restore {
        assert!(*old < token);
        let late = publish(&mut conn, *old, &format!("late-{old}"));
        assert!(
            matches!(late, Outcome::Stale { presented, current } if presented.get() == *old && current.get() == token),
            "pre-restore token {old}: {late:?}"
        );
    }
    let pointer = SqliteFence::publication(&conn, &resource_name("doc").unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(
        pointer.token.get() as u64,
        token,
        "the pointer names the post-restore write"
    );
}

#[test]
fn restore_refuses_a_file_that_is_not_a_backup() {
    let files = TempDir::new("restore-bad");
    let bogus = files.path().join("bogus");
    std::fs::write(&bogus, b"\xff\xff\xff not a snapshot").unwrap();
    let data = files.path().join("data");
    let (code, text) = restore(&bogus, &data, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("not a baton backup"), "{text}");
    assert!(
        !data.join("baton.redb").exists(),
        "nothing written on refusal"
    );
}

/// A backup of more leases than one part holds: `BackupParts` sends them
/// in parts of at most 4,096, the first with the header and the sessions;
/// the client's snapshot is the union, the same as the whole `Backup` an
/// older client asks for, and taken after every change so far (a release
/// just answered is not in it, though its write is lazy: the backup's
/// step flushes it, if the 100 ms flush has not yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_in_parts_is_the_whole_snapshot() {
    let dir = TempDir::new("backup-parts");
    let s = common::serve(dir.path(), &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    let n = 2 * baton_proto::BACKUP_PART_LEASES + 100;
    let names: Vec<String> = (0..n).map(|i| format!("parts:{i:05}")).collect();
    for chunk in names.chunks(64) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let granted = c
            .acquire_all(&refs, Some(Duration::from_secs(60)), Duration::ZERO)
            .await
            .unwrap();
        assert!(matches!(granted, baton_client::AcquiredAll::Granted { .. }));
    }
    let session = c.open_session(Duration::from_secs(60)).await.unwrap();
    let mut raw = baton_proto::v1::leases_client::LeasesClient::connect(s.url())
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20);
    // Two releases in a row, the second's write lazy behind the first's.
    for name in ["parts:released-1", "parts:released-2"] {
        let Acquired::Granted(gone) = c
            .acquire(name, Some(Duration::from_secs(60)), Duration::ZERO)
            .await
            .unwrap()
        else {
            panic!("free")
        };
        c.release(&gone.resource, &gone.acquisition_id)
            .await
            .unwrap();
    }
    let mut parts = raw
        .backup_parts(baton_proto::v1::BackupRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut sizes = Vec::new();
    let mut first = None;
    while let Some(part) = parts.message().await.unwrap() {
        assert!(
            part.stored_leases
                .iter()
                .all(|l| !l.resource.starts_with("parts:released")),
            "a lease released before the backup is not in it"
        );
        sizes.push((part.stored_leases.len(), part.sessions.len()));
        first.get_or_insert(part);
    }
    assert_eq!(
        sizes,
        vec![(4_096, 1), (4_096, 0), (100, 0)],
        "parts of 4,096 leases, the sessions in the first"
    );
    let whole = raw
        .backup(baton_proto::v1::BackupRequest {})
        .await
        .unwrap()
        .into_inner();
    let gathered = c.backup().await.unwrap();
    assert_eq!(gathered, whole, "the parts make the whole");
    assert_eq!(whole.stored_leases.len(), n);
    let first = first.unwrap();
    assert_eq!((first.epoch, first.counter), (whole.epoch, whole.counter));
    drop(session);
}
