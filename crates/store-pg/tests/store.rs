//! The PostgreSQL store against a real server: the schema's refusals, the
//! commit round trip, and the fencing of a deposed leader's commits.

use std::time::Duration;

use baton_core::{
    AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName, SessionRecord, Shape, Write,
};
use baton_store::{LeaseStore, StoreError};
use baton_store_pg::leader::{self, LeaderRow};
use baton_store_pg::{schema, PgError, PgLeaseStore};
use baton_testkit::PgDb;

async fn prepared(db: &PgDb, cluster: &str) -> (baton_store_pg::PgTarget, tokio_postgres::Client) {
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    schema::prepare(&mut client, cluster).await.unwrap();
    (pg, client)
}

fn lease(name: &str, token: u64) -> Write {
    Write::PutLease {
        resource: ResourceName::parse(name).unwrap(),
        record: LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([7; 16]).digest(),
            token: FencingToken::from_u64(token).unwrap(),
            ttl_ms: 5_000,
            session: None,
            holder: None,
            shape: Shape::Exclusive,
        },
    }
}

fn position(counter: u64) -> Write {
    Write::Tokens {
        epoch: Epoch::FIRST,
        counter,
    }
}

const T1: u64 = (1 << 40) + 1;

/// Change number `seq`: `job:a` granted at token [`T1`].
fn granted_a(seq: u64) -> baton_core::NumberedChange {
    baton_core::NumberedChange {
        seq,
        change: baton_core::Change {
            kind: baton_core::HolderChange::Granted,
            resource: "job:a".into(),
            slot: None,
            token: FencingToken::from_u64(T1).unwrap(),
            revoked: None,
            holder: None,
        },
    }
}

async fn take(client: &mut tokio_postgres::Client, node: &str) -> u64 {
    let row = leader::read(client).await.unwrap();
    leader::take_over(client, &row, node, "http://x:1")
        .await
        .unwrap()
        .expect("row unchanged")
        .term
}

/// The store's calls block on the runtime, as the engine thread does.
async fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_round_trips_and_the_position_never_moves_back() {
    let db = PgDb::create("pgstore_roundtrip").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "a").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let stored = on_thread(move || {
        store
            .commit(&[position(1), lease("job:a", T1), lease("job:b", T1 + 1)])
            .unwrap();
        store
            .commit(&[
                Write::DeleteLease {
                    resource: ResourceName::parse("job:b").unwrap(),
                },
                position(2),
            ])
            .unwrap();
        let stored = store.load().unwrap();
        let back = store.commit(&[position(1)]);
        (stored, back)
    })
    .await;
    let (stored, back) = stored;
    assert_eq!(stored.counter, 2);
    assert_eq!(stored.leases.len(), 1);
    assert_eq!(stored.leases[0].0.as_str(), "job:a");
    assert!(
        matches!(&back, Err(StoreError::Storage(m)) if m.contains("backwards")),
        "{back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write_anything() {
    let db = PgDb::create("pgstore_deposed").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let old_term = take(&mut client, "old").await;
    let mut old = PgLeaseStore::open(&pg, old_term, Duration::from_secs(5))
        .await
        .unwrap();
    // A new leader takes over (it waited out the old one's lease elsewhere).
    let new_term = take(&mut client, "new").await;
    assert!(new_term > old_term);
    let refused = on_thread(move || old.commit(&[position(9), lease("job:a", T1 + 8)])).await;
    assert!(
        matches!(&refused, Err(StoreError::Deposed { term, .. }) if *term == old_term),
        "{refused:?}"
    );
    let n: i64 = client
        .query_one("SELECT count(*) FROM baton_server.leases", &[])
        .await
        .unwrap()
        .get(0);
    let counter: i64 = client
        .query_one("SELECT counter FROM baton_server.meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (n, counter),
        (0, 0),
        "the deposed leader's commit left nothing"
    );
    // The old leader's renewals and step-down are refused as well.
    assert!(!leader::renew(&client, old_term, "old").await.unwrap());
    assert!(!leader::step_down(&client, old_term, "old").await.unwrap());
    assert!(leader::renew(&client, new_term, "new").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_a_commit_in_flight_and_a_stale_view_is_refused() {
    let db = PgDb::create("pgstore_race").await;
    let (_pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "a").await;
    // A commit in flight holds the row share-locked.
    let mut other = baton_store_pg::connect(&baton_store_pg::parse_url(&db.url).unwrap())
        .await
        .unwrap();
    let txn = other.transaction().await.unwrap();
    txn.execute(
        "SELECT baton_server.commit_batch($1, 1, 1, ARRAY['job:x'], ARRAY['\\x00112233445566778899aabbccddeeff'::bytea], ARRAY[1099511627777::bigint], ARRAY[1000::bigint], '{}')",
        &[&(term as i64)],
    )
    .await
    .unwrap();
    let seen = leader::read(&client).await.unwrap();
    let takeover = tokio::spawn(async move {
        let r = leader::take_over(&mut client, &seen, "b", "http://b:1").await;
        (r, client)
    });
    // The takeover blocks on the row lock until the commit ends.
    let watcher = db.connect().await;
    baton_testkit::eventually(Duration::from_secs(10), async || {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        waiting == 1
    })
    .await;
    assert!(
        !takeover.is_finished(),
        "the takeover must wait for the commit"
    );
    txn.commit().await.unwrap();
    let (r, client) = takeover.await.unwrap();
    let won = r.unwrap().expect("the row was unchanged");
    assert_eq!(won.term, term + 1);
    assert_eq!(
        won.position,
        (1 << 40) | 1,
        "the finished commit's position"
    );
    // The commit that finished first is there for the new leader to load.
    let n: i64 = client
        .query_one("SELECT count(*) FROM baton_server.leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    // A view of the row from before the takeover no longer takes over.
    let stale = LeaderRow {
        term,
        holder: Some("a".into()),
        advertise: Some("http://x:1".into()),
        beats: 0,
    };
    let mut client = client;
    assert_eq!(
        leader::take_over(&mut client, &stale, "c", "http://c:1")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_a_newer_schema_and_bad_addresses_are_refused() {
    let db = PgDb::create("pgstore_refuse").await;
    let (pg, client) = prepared(&db, "blue").await;
    let mut again = baton_store_pg::connect(&pg).await.unwrap();
    let e = schema::prepare(&mut again, "green").await.unwrap_err();
    assert!(
        matches!(&e, PgError::ClusterMismatch { found, .. } if found == "blue"),
        "{e}"
    );
    assert!(e
        .to_string()
        .contains("two clusters must not share one database"));
    // Preparing twice is fine.
    schema::prepare(&mut again, "blue").await.unwrap();
    client
        .execute("UPDATE baton_server.meta SET schema_version = 99", &[])
        .await
        .unwrap();
    let e = schema::prepare(&mut again, "blue").await.unwrap_err();
    assert!(matches!(e, PgError::NewerSchema { found: 99, .. }), "{e}");
    let version: i32 = client
        .query_one("SELECT schema_version FROM baton_server.meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 99, "a newer schema is left as it was");

    for bad in ["mysql://x/y", "localhost", "postgres://[::1/x", ""] {
        let e = baton_store_pg::parse_url(bad).unwrap_err();
        assert!(matches!(e, PgError::BadUrl { .. }), "{bad:?}: {e}");
    }
    for bad in ["", "Blue", "a b", &"x".repeat(65)] {
        let e = schema::check_cluster_name(bad).unwrap_err();
        assert!(e.to_string().contains("a-z, 0-9"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_privileges_is_told_what_it_needs() {
    let db = PgDb::create("pgstore_privs").await;
    let admin = db.connect().await;
    let role = format!("{}_ro", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             REVOKE CREATE ON DATABASE {name} FROM PUBLIC",
            name = db.name
        ))
        .await
        .unwrap();
    let url = format!("{} user={role}", db.url);
    let pg = baton_store_pg::parse_url(&url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    let e = schema::prepare(&mut client, "main").await.unwrap_err();
    drop(client);
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .ok();
    assert!(matches!(e, PgError::Privileges { .. }), "{e}");
    assert!(
        e.to_string().contains("needs CREATE on the database"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_their_leases_round_trip() {
    let db = PgDb::create("pgstore_sessions").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "a").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let s1 = AcquisitionId::from_bytes([1; 16]).digest();
    let s2 = AcquisitionId::from_bytes([2; 16]).digest();
    let bound = |name: &str, token: u64, session| Write::PutLease {
        resource: ResourceName::parse(name).unwrap(),
        record: LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([9; 16]).digest(),
            token: FencingToken::from_u64(token).unwrap(),
            ttl_ms: 3_000,
            session: Some(session),
            holder: Some(baton_core::Holder::parse(&format!("holder of {name}")).unwrap()),
            shape: Shape::Exclusive,
        },
    };
    let stored = on_thread(move || {
        store
            .commit(&[
                Write::PutSession {
                    record: SessionRecord {
                        digest: s1,
                        ttl_ms: 3_000,
                        opener: Some("alice".into()),
                    },
                },
                Write::PutSession {
                    record: SessionRecord {
                        digest: s2,
                        ttl_ms: 4_000,
                        opener: None,
                    },
                },
                position(2),
                bound("job:a", T1, s1),
                bound("job:b", T1 + 1, s2),
            ])
            .unwrap();
        // s2 ends: its lease goes first, then the session.
        store
            .commit(&[
                Write::DeleteLease {
                    resource: ResourceName::parse("job:b").unwrap(),
                },
                Write::DeleteSession { digest: s2 },
            ])
            .unwrap();
        store.load().unwrap()
    })
    .await;
    assert_eq!(
        stored.sessions,
        vec![SessionRecord {
            digest: s1,
            ttl_ms: 3_000,
            opener: Some("alice".into()),
        }]
    );
    assert_eq!(stored.leases.len(), 1);
    assert_eq!(stored.leases[0].1.session, Some(s1));
    assert_eq!(
        stored.leases[0].1.holder.as_ref().map(|h| h.as_str()),
        Some("holder of job:a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_upgraded_in_place_with_its_leases() {
    let db = PgDb::create("pgstore_upgrade").await;
    let mut client = db.connect().await;
    // What the previous release created, with one lease committed by it.
    client
        .batch_execute(include_str!("../sql/001_cluster.sql"))
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO baton_server.meta VALUES (1, 1, 'main', 'old', 1, 1);
             INSERT INTO baton_server.leader VALUES (1, 7, 'old-node', NULL, 0);
             SELECT baton_server.commit_batch(7, 1, 1, ARRAY['job:a'],
                 ARRAY['\\x07070707070707070707070707070707'::bytea], ARRAY[1099511627777],
                 ARRAY[5000], ARRAY[]::text[]);",
        )
        .await
        .unwrap();
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut admin = baton_store_pg::connect(&pg).await.unwrap();
    schema::prepare(&mut admin, "main").await.unwrap();
    let version: i32 = client
        .query_one("SELECT schema_version FROM baton_server.meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, schema::SCHEMA_VERSION);
    let term = take(&mut client, "a").await;
    let store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let stored = on_thread(move || store.load().unwrap()).await;
    assert_eq!(stored.leases.len(), 1, "the old lease survives the upgrade");
    assert_eq!(stored.leases[0].1.session, None);
    assert_eq!(stored.leases[0].1.token.get(), T1);
    assert!(stored.sessions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_schema_gains_holders_and_openers_in_place() {
    let db = PgDb::create("pgstore_upgrade2").await;
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    // The previous release: schema version 2, and a commit of its leader
    // (a session and a lease tied to it), through version 2's function.
    schema::prepare_version(&mut client, "main", 2)
        .await
        .unwrap();
    let old_term = take(&mut client, "old").await as i64;
    let old_commit = "SELECT baton_server.commit_batch($1, 1, 2,
        ARRAY['job:a', 'job:b'],
        ARRAY['\\x07070707070707070707070707070707'::bytea, '\\x08080808080808080808080808080808'::bytea],
        ARRAY[1099511627777, 1099511627778]::bigint[], ARRAY[5000, 4000]::bigint[],
        ARRAY[NULL, '\\x01010101010101010101010101010101'::bytea],
        ARRAY[]::text[],
        ARRAY['\\x01010101010101010101010101010101'::bytea], ARRAY[4000]::bigint[],
        ARRAY[]::bytea[])";
    client.execute(old_commit, &[&old_term]).await.unwrap();

    schema::prepare(&mut client, "main").await.unwrap();
    let version: i32 = client
        .query_one("SELECT schema_version FROM baton_server.meta", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, schema::SCHEMA_VERSION);
    let term = take(&mut client, "new").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    // The digest the old commit above wrote.
    let s1 = baton_core::AcquisitionDigest::from_bytes([1; 16]);
    let (before, after) = on_thread(move || {
        let before = store.load().unwrap();
        store
            .commit(&[
                Write::PutSession {
                    record: SessionRecord {
                        digest: s1,
                        ttl_ms: 4_000,
                        opener: Some("ops".into()),
                    },
                },
                Write::PutLease {
                    resource: ResourceName::parse("job:a").unwrap(),
                    record: LeaseRecord {
                        acquisition_digest: AcquisitionId::from_bytes([7; 16]).digest(),
                        token: FencingToken::from_u64(T1 + 2).unwrap(),
                        ttl_ms: 5_000,
                        session: None,
                        holder: Some(baton_core::Holder::parse("ops@db-1 pid 9").unwrap()),
                        shape: Shape::Exclusive,
                    },
                },
                position(3),
            ])
            .unwrap();
        (before, store.load().unwrap())
    })
    .await;
    // Everything the old release wrote is there, with no holder or opener.
    assert_eq!((before.epoch, before.counter), (Epoch::FIRST, 2));
    let old: Vec<_> = before
        .leases
        .iter()
        .map(|(r, l)| (r.to_string(), l.token.get(), l.session, l.holder.clone()))
        .collect();
    assert_eq!(
        old,
        vec![
            ("job:a".to_string(), T1, None, None),
            ("job:b".to_string(), T1 + 1, Some(s1), None),
        ]
    );
    assert_eq!(
        before.sessions,
        vec![SessionRecord {
            digest: s1,
            ttl_ms: 4_000,
            opener: None
        }]
    );
    // The upgraded schema keeps what the new release writes.
    let a = after.leases.iter().find(|(r, _)| r.as_str() == "job:a");
    assert_eq!(
        a.and_then(|(_, l)| l.holder.as_ref()).map(|h| h.as_str()),
        Some("ops@db-1 pid 9")
    );
    assert_eq!(after.sessions[0].opener.as_deref(), Some("ops"));
    // A leader still running the previous release (mid-upgrade) commits
    // through version 2's function: its re-grant leaves no stale holder.
    client
        .execute(
            "UPDATE baton_server.leader SET term = $1 WHERE id = 1",
            &[&old_term],
        )
        .await
        .unwrap();
    let regrant = "SELECT baton_server.commit_batch($1, 1, 4, ARRAY['job:a'],
        ARRAY['\\x09090909090909090909090909090909'::bytea], ARRAY[1099511627780]::bigint[],
        ARRAY[5000]::bigint[], ARRAY[NULL]::bytea[], ARRAY[]::text[],
        ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::bytea[])";
    client.execute(regrant, &[&old_term]).await.unwrap();
    let holder: Option<String> = client
        .query_one(
            "SELECT holder FROM baton_server.leases WHERE resource = 'job:a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holder, None);
}

/// The contract every `LeaseStore` keeps (`baton_testkit::store_contract`),
/// each reopen a new store for the same term, as a restarted leader's
/// engine would load it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_keeps_the_store_contract() {
    let db = PgDb::create("pgstore_contract").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "a").await;
    let runtime = tokio::runtime::Handle::current();
    on_thread(move || {
        baton_testkit::store_contract::check(|| {
            runtime
                .block_on(PgLeaseStore::open(&pg, term, Duration::from_secs(5)))
                .expect("open the store")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_schema_gains_ended_leases_and_its_leader_keeps_committing() {
    let db = PgDb::create("pgstore_upgrade3").await;
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    schema::prepare_version(&mut client, "main", 3)
        .await
        .unwrap();
    let old_term = take(&mut client, "old").await as i64;
    schema::prepare(&mut client, "main").await.unwrap();
    // A leader of the previous release, mid-upgrade: version 3's function
    // still commits (a lease, then its deletion), and records no end.
    let old_commit = "SELECT baton_server.commit_batch($1, 1, 1,
        ARRAY['job:a'], ARRAY['\\x07070707070707070707070707070707'::bytea],
        ARRAY[1099511627777]::bigint[], ARRAY[5000]::bigint[], ARRAY[NULL]::bytea[],
        ARRAY[NULL]::text[], ARRAY[]::text[],
        ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::bytea[])";
    client.execute(old_commit, &[&old_term]).await.unwrap();
    let term = take(&mut client, "new").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let ended = AcquisitionId::from_bytes([7; 16]).digest();
    let (before, after, leases) = on_thread(move || {
        let before = store.ended().unwrap();
        store
            .commit(&[
                Write::DeleteLease {
                    resource: ResourceName::parse("job:a").unwrap(),
                },
                Write::LeaseEnded { digest: ended },
            ])
            .unwrap();
        (before, store.ended().unwrap(), store.load().unwrap().leases)
    })
    .await;
    assert_eq!((before, after, leases), (vec![], vec![ended], vec![]));
    // Kept two minutes by the database's clock, then dropped by the
    // next commit that ends a lease (the past moved back 121 s, as if that
    // long had passed).
    client
        .batch_execute(
            "UPDATE baton_server.ended SET ended_at = ended_at - interval '121 seconds';
             UPDATE baton_server.meta SET ended_kept_from = ended_kept_from - interval '121 seconds'",
        )
        .await
        .unwrap();
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let other = AcquisitionId::from_bytes([8; 16]).digest();
    let kept = on_thread(move || {
        store
            .commit(&[Write::LeaseEnded { digest: other }])
            .unwrap();
        store.ended().unwrap()
    })
    .await;
    assert_eq!(kept, vec![other]);
    let rows: i64 = client
        .query_one("SELECT count(*) FROM baton_server.ended", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "the old row was dropped, not only skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_schema_gains_shapes_with_its_leases_and_old_leader() {
    let db = PgDb::create("pgstore_upgrade4").await;
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    schema::prepare_version(&mut client, "main", 4)
        .await
        .unwrap();
    let old_term = take(&mut client, "old").await as i64;
    // A lease of version 4, then the upgrade, then version 4's commit
    // from a leader of the previous release, mid-upgrade: both are
    // exclusive leases.
    let old_commit = |name: &str| {
        format!(
            "SELECT baton_server.commit_batch($1, 1, 1,
            ARRAY['{name}'], ARRAY['\\x07070707070707070707070707070707'::bytea],
            ARRAY[1099511627777]::bigint[], ARRAY[5000]::bigint[], ARRAY[NULL]::bytea[],
            ARRAY['old']::text[], ARRAY[]::text[],
            ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::bytea[],
            ARRAY[]::bytea[])"
        )
    };
    client
        .execute(&old_commit("job:before"), &[&old_term])
        .await
        .unwrap();
    schema::prepare(&mut client, "main").await.unwrap();
    client
        .execute(&old_commit("job:during"), &[&old_term])
        .await
        .unwrap();
    let term = take(&mut client, "new").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let jobs = ResourceName::parse("jobs").unwrap();
    let permit = |slot: u32, counter: u64| Write::PutLease {
        resource: jobs.slot(slot),
        record: LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([slot as u8; 16]).digest(),
            token: FencingToken::new(Epoch::FIRST, counter).unwrap(),
            ttl_ms: 5_000,
            session: None,
            holder: None,
            shape: Shape::Permits(3),
        },
    };
    let writes = [permit(0, 2), permit(2, 3)];
    let expected = writes.clone();
    let mut leases = on_thread(move || {
        store.commit(&writes).unwrap();
        store.load().unwrap().leases
    })
    .await;
    leases.sort_by(|a, b| a.0.cmp(&b.0));
    let shapes: Vec<_> = leases
        .iter()
        .map(|(r, l)| (r.as_str().to_owned(), l.shape))
        .collect();
    assert_eq!(
        shapes,
        [
            ("job:before".to_owned(), Shape::Exclusive),
            ("job:during".to_owned(), Shape::Exclusive),
            (jobs.slot(0).as_str().to_owned(), Shape::Permits(3)),
            (jobs.slot(2).as_str().to_owned(), Shape::Permits(3)),
        ]
    );
    for w in expected {
        let Write::PutLease { resource, record } = w else {
            unreachable!("a put")
        };
        assert!(leases.contains(&(resource, record)));
    }
    // The table refuses a count on a resource's own name.
    let bad = client
        .execute(
            "UPDATE baton_server.leases SET permits = 3 WHERE resource = 'job:before'",
            &[],
        )
        .await;
    assert!(bad.is_err(), "permits on an exclusive lease are refused");
}

/// A change numbered by this release's leader, then a commit of a leader
/// still on the previous release (schema 5's function) that changes a
/// holder: the kept changes go and the number moves up by one, so a watch
/// resuming from before it is told its number is too old. A change whose
/// number is not above the last is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_leaders_commit_breaks_the_kept_history_knowingly() {
    let db = PgDb::create("pgstore_changes").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "new").await;
    let store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let change = |seq: u64| Write::Changed(granted_a(seq));
    let (store, history) = on_thread(move || {
        let mut store = store;
        store
            .commit(&[position(1), lease("job:a", T1), change(41)])
            .unwrap();
        let history = store.history(10).unwrap();
        (store, history)
    })
    .await;
    assert_eq!((history.seq, history.changes.len()), (41, 1));
    let old_commit = "SELECT baton_server.commit_batch($1, NULL, NULL,
        ARRAY['job:b'], ARRAY['\\x07070707070707070707070707070707'::bytea],
        ARRAY[1099511627778]::bigint[], ARRAY[5000]::bigint[], ARRAY[NULL]::bytea[],
        ARRAY[NULL]::text[], ARRAY[NULL]::integer[], ARRAY[]::text[],
        ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::bytea[],
        ARRAY[]::bytea[])";
    client.execute(old_commit, &[&(term as i64)]).await.unwrap();
    let (store, history) = on_thread(move || {
        let history = store.history(10).unwrap();
        (store, history)
    })
    .await;
    assert_eq!(
        history.seq, 42,
        "one number for what the old leader changed"
    );
    assert!(history.changes.is_empty(), "no history with a hole in it");
    let refused = on_thread(move || {
        let mut store = store;
        store.commit(&[change(42)])
    })
    .await;
    assert!(
        matches!(&refused, Err(StoreError::Storage(m)) if m.contains("not above the last one")),
        "{refused:?}"
    );
}

/// Every function of schema `baton_server`, by name, as the server prints it.
async fn functions_in_force(
    client: &tokio_postgres::Client,
) -> std::collections::BTreeMap<String, String> {
    baton_testkit::pg_functions_in_force(client, "baton_server").await
}

const FUNCTIONS_HEADER: &str = "-- The definition in force (generated from the migrations by
-- crates/store-pg/tests/store.rs; do not edit by hand: change a migration,
-- then write these again with BATON_STORE_WRITE_FUNCTIONS=1 cargo test -p
-- baton-store-pg --test store functions). A start that installs or
-- upgrades the schema applies every file here after the migrations.
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_files_are_what_the_migrations_leave_in_force() {
    let db = PgDb::create("pgstore_functions").await;
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    let version = schema::SCHEMA_VERSION;
    // Every version but the last, then the last migration alone, as an
    // installation before these files had.
    schema::prepare_version(&mut client, "main", version - 1)
        .await
        .unwrap();
    let last = schema::MIGRATIONS[version as usize - 1];
    client.batch_execute(last).await.unwrap();
    let migrated = functions_in_force(&client).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/functions");
    if std::env::var_os("BATON_STORE_WRITE_FUNCTIONS").is_some() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, defs) in &migrated {
            let text = format!("{FUNCTIONS_HEADER}\n{defs}");
            std::fs::write(dir.join(format!("{name}.sql")), text).unwrap();
        }
    }
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let expected: Vec<String> = migrated.keys().map(|n| format!("{n}.sql")).collect();
    assert_eq!(files, expected, "sql/functions/ has one file per function");
    let listed: Vec<&str> = schema::FUNCTIONS.iter().map(|(f, _)| *f).collect();
    assert_eq!(listed, expected, "schema::FUNCTIONS lists every file");
    for (file, sql) in schema::FUNCTIONS {
        let name = file.trim_end_matches(".sql");
        assert!(
            sql.contains(migrated[name].as_str()),
            "{file} is not the definition in force: write the files again (see its header)"
        );
    }
    // An install and an upgrade from every earlier version end the same.
    for from in 0..version {
        let db = PgDb::create(&format!("pgstore_functions_from_{from}")).await;
        let mut client = db.connect().await;
        if from > 0 {
            schema::prepare_version(&mut client, "main", from)
                .await
                .unwrap();
        }
        schema::prepare(&mut client, "main").await.unwrap();
        assert_eq!(functions_in_force(&client).await, migrated, "from {from}");
    }
}

/// What this connection has done to a table and its index and not yet
/// reported (read before and after a commit in its transaction):
/// (sequential scans, index entries read, rows deleted).
async fn work_on(
    txn: &tokio_postgres::Transaction<'_>,
    (table, index): (&str, &str),
) -> (i64, i64, i64) {
    let row = txn
        .query_one(
            "SELECT pg_stat_get_xact_numscans($1::text::regclass),
                    pg_stat_get_xact_tuples_returned($2::text::regclass),
                    pg_stat_get_xact_tuples_deleted($1::text::regclass)",
            &[&table, &index],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Past the million kept changes, and two minutes after leases ended, a
/// commit on a schema upgraded from version 6 trims what fell out of the
/// window by a range starting where the last trim ended: it reads no
/// entry of what earlier trims left dead in the index (before vacuum; a scan from the index's start read them all
/// and a cluster's commits went from 1 ms to 4 ms in 30 s, or to 60 ms
/// while the table's statistics were stale), and a gap in the numbers
/// leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimming_reads_only_what_falls_out_of_the_window() {
    let db = PgDb::create("pgstore_trim").await;
    let pg = baton_store_pg::parse_url(&db.url).unwrap();
    let mut client = baton_store_pg::connect(&pg).await.unwrap();
    schema::prepare_version(&mut client, "main", 6)
        .await
        .unwrap();
    const KEPT: i64 = baton_core::HISTORY_LEN_MAX as i64;
    const DEAD: i64 = 100_000;
    // Version 6, as its trims left it: a million kept changes and the
    // hundred thousand before them deleted but not yet vacuumed; ended
    // leases older than two minutes. Then upgraded in place.
    client
        .batch_execute(&format!(
            "INSERT INTO baton_server.changes SELECT g, '\\x00' FROM generate_series(1, {all}) g;
             DELETE FROM baton_server.changes WHERE seq <= {DEAD};
             UPDATE baton_server.meta SET seq = {all};
             INSERT INTO baton_server.ended (ended_at, digest)
                 SELECT now() - interval '300 seconds', decode(lpad(to_hex(g), 32, '0'), 'hex')
                 FROM generate_series(1, {DEAD}) g;",
            all = KEPT + DEAD
        ))
        .await
        .unwrap();
    schema::prepare(&mut client, "main").await.unwrap();
    let term = take(&mut client, "trim").await as i64;
    let change = |seq: i64| baton_store::image::encode_change(&granted_a(seq as u64));
    let commit = "SELECT baton_server.commit_batch($1, NULL, NULL,
        ARRAY[]::text[], ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::bigint[],
        ARRAY[]::bytea[], ARRAY[]::text[], ARRAY[]::integer[], ARRAY[]::text[],
        ARRAY[]::bytea[], ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::bytea[],
        ARRAY[$2::bytea], $3, $4)";
    let mut commit_changes = async |seqs: std::ops::RangeInclusive<i64>, ended: u8| {
        let seqs: Vec<i64> = seqs.collect();
        let bodies: Vec<Vec<u8>> = seqs.iter().map(|s| change(*s)).collect();
        let txn = client.transaction().await.unwrap();
        let on_changes = ("baton_server.changes", "baton_server.changes_pkey");
        let on_ended = ("baton_server.ended", "baton_server.ended_by_time");
        let before = (
            work_on(&txn, on_changes).await,
            work_on(&txn, on_ended).await,
        );
        txn.execute(commit, &[&term, &[ended; 16].as_slice(), &seqs, &bodies])
            .await
            .unwrap();
        let after = (
            work_on(&txn, on_changes).await,
            work_on(&txn, on_ended).await,
        );
        txn.commit().await.unwrap();
        let minus = |a: (i64, i64, i64), b: (i64, i64, i64)| (a.0 - b.0, a.1 - b.1, a.2 - b.2);
        (minus(after.0, before.0), minus(after.1, before.1))
    };
    let last = KEPT + DEAD;
    // The first commit after an upgrade trims the old ended leases.
    let (changes, ended) = commit_changes(last + 1..=last + 10, 1).await;
    assert_eq!(
        changes,
        (0, 10, 10),
        "ten changes in, ten out, ten entries read"
    );
    assert_eq!(
        (ended.0, ended.2),
        (0, DEAD),
        "the ended leases past two minutes"
    );
    // Later commits read none of the dead entries either table left.
    let (changes, ended) = commit_changes(last + 11..=last + 20, 2).await;
    assert_eq!(changes, (0, 10, 10));
    assert_eq!(ended, (0, 0, 0), "nothing ended two minutes ago");
    // A gap in the numbers: what falls out is trimmed all the same.
    let (changes, _) = commit_changes(last + 30..=last + 31, 3).await;
    assert_eq!(changes, (0, 11, 11));
    let row = client
        .query_one(
            "SELECT count(*), min(seq), max(seq) FROM baton_server.changes",
            &[],
        )
        .await
        .unwrap();
    let (count, min, max): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (min, max),
        (last + 31 - KEPT + 1, last + 31),
        "the newest million by number"
    );
    assert_eq!(count, KEPT - 9, "less the nine numbers never used");
    let store = PgLeaseStore::open(&pg, term as u64, Duration::from_secs(5))
        .await
        .unwrap();
    let history = on_thread(move || store.history(3).unwrap()).await;
    let seqs: Vec<u64> = history.changes.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [last as u64 + 20, last as u64 + 30, last as u64 + 31]);
}

/// A leader whose grants and releases leave dead lease rows vacuums the
/// table itself once they outnumber the live ones (autovacuum comes once
/// a minute; commits meanwhile slowed as the dead rows grew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_vacuums_the_lease_rows_its_commits_leave_dead() {
    let db = PgDb::create("pgstore_vacuum").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "vacuum").await;
    let store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    let vacuums = async || -> i64 {
        client
            .query_one(
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'baton_server.leases'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(vacuums().await, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut store = Some(store);
    let mut cycles = 0;
    while vacuums().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no vacuum of baton_server.leases after {cycles} grants and releases"
        );
        // Grants and releases, as a leader under load commits them.
        let mut s = store.take().unwrap();
        store = Some(
            on_thread(move || {
                for i in 0..500 {
                    let name = format!("job:{}", i % 10);
                    s.commit(&[lease(&name, T1 + i)]).unwrap();
                    let resource = ResourceName::parse(&name).unwrap();
                    s.commit(&[Write::DeleteLease { resource }]).unwrap();
                }
                s
            })
            .await,
        );
        cycles += 500;
    }
    // Stopped with its term: the store's end ends the vacuum's connection.
    drop(store);
    let vacuum_connections = async || -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    };
    baton_testkit::eventually(Duration::from_secs(10), async || {
        vacuum_connections().await == 0
    })
    .await;
}

/// A leader sends a commit while the one before it is in flight: if that
/// one fails, the database refuses the next too, so what is durable is a
/// prefix of what was sent, and the outcomes come in the order sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_sent_behind_a_failed_one_is_refused() {
    let db = PgDb::create("pgstore_pipelined").await;
    let (pg, mut client) = prepared(&db, "main").await;
    let term = take(&mut client, "a").await;
    let mut store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(store.commits_in_flight_max() >= 2);
    // Every commit waits on the leader row this transaction holds, so all
    // three are sent before the first is answered, however the threads
    // are scheduled (a failure heard before a call is sent refuses it in
    // the store instead: `PreviousIo`, asserted below for the fourth).
    client
        .batch_execute("BEGIN; SELECT 1 FROM baton_server.leader WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    let committing = tokio::task::spawn_blocking(move || {
        let (tx, rx) = std::sync::mpsc::channel();
        let batches = [
            vec![position(5), lease("job:a", T1)],
            // The token position moving back: refused (BA002).
            vec![position(4)],
            // Valid on its own, sent before the one above is answered.
            vec![position(6), lease("job:b", T1 + 1)],
        ];
        for (i, writes) in batches.iter().enumerate() {
            let tx = tx.clone();
            store.start_commit(
                writes,
                Box::new(move |outcome| tx.send((i, outcome)).unwrap()),
            );
        }
        sent_tx.send(()).unwrap();
        let outcomes: Vec<_> = rx.iter().take(3).collect();
        let after = store.commit(&[position(7)]);
        (outcomes, after)
    });
    sent_rx.await.unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    let (outcomes, after) = committing.await.unwrap();
    let order: Vec<usize> = outcomes.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2], "outcomes in the order sent");
    assert!(outcomes[0].1.is_ok(), "{:?}", outcomes[0].1);
    assert!(
        matches!(&outcomes[1].1, Err(StoreError::Storage(m)) if m.contains("backwards")),
        "{:?}",
        outcomes[1].1
    );
    assert!(
        matches!(&outcomes[2].1, Err(StoreError::Storage(m)) if m.contains("does not follow the last one committed")),
        "refused by the database: {:?}",
        outcomes[2].1
    );
    assert!(
        matches!(after, Err(StoreError::PreviousIo)),
        "nothing is sent after a failure: {after:?}"
    );
    let rows = client
        .query(
            "SELECT resource FROM baton_server.leases ORDER BY resource",
            &[],
        )
        .await
        .unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        names,
        ["job:a"],
        "the commit behind the failed one left nothing"
    );
    let meta = client
        .query_one(
            "SELECT counter, commit_term, commits FROM baton_server.meta",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(meta.get::<_, i64>(0), 5);
    assert_eq!(
        (meta.get::<_, i64>(1), meta.get::<_, i64>(2)),
        (term as i64, 1)
    );
    // The database's own rule, whatever a client sends: commit 3 of the
    // term right after commit 1 is refused, naming the rule.
    let skipped = client
        .execute(
            "SELECT baton_server.commit_batch($1, 3, NULL, NULL, '{}', '{}', '{}', '{}', '{}', \
             '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')",
            &[&(term as i64)],
        )
        .await
        .unwrap_err();
    let db_error = skipped.as_db_error().expect("refused by the database");
    assert_eq!(db_error.code().code(), "BA003");
    assert!(
        db_error
            .message()
            .contains("does not follow the last one committed"),
        "{}",
        db_error.message()
    );
}

/// A commit started after the store's runtime stopped is answered as
/// failed, outcome unknown, never left unanswered: the committer waits
/// for every answer before it stops.
#[test]
fn a_commit_after_the_runtime_stopped_is_answered_not_lost() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (db, mut store) = rt.block_on(async {
        let db = PgDb::create("pgstore_stopped").await;
        let (pg, mut client) = prepared(&db, "main").await;
        let term = take(&mut client, "a").await;
        let store = PgLeaseStore::open(&pg, term, Duration::from_secs(5))
            .await
            .unwrap();
        (db, store)
    });
    store.commit(&[position(1)]).unwrap();
    drop(rt);
    let (tx, rx) = std::sync::mpsc::channel();
    store.start_commit(
        &[position(2)],
        Box::new(move |outcome| tx.send(outcome).unwrap()),
    );
    let outcome = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("answered, not left waiting");
    assert!(
        matches!(&outcome, Err(StoreError::Storage(m)) if m.contains("outcome unknown")),
        "{outcome:?}"
    );
    drop(store);
    drop(db);
}
