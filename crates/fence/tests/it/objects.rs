//! Immutable, generation-keyed objects with manifests, on a local directory.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use baton_fence::objects::{Candidate, ObjectError, ObjectKit, Provenance, Rejection};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{resource_name, FenceRequest, FencingToken, Outcome};

struct Dir(std::path::PathBuf);

impl Dir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("baton-objects-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const PATH: &str = "statements/account-42/2026-09-13";

fn provenance<'a>(snapshot: &'a str, op: &'a str) -> Provenance<'a> {
    Provenance {
        input_snapshot: snapshot,
        generator_version: "statements 1.0",
        operation: op,
        resource: "statement:account-42:2026-09-13",
    }
}

/// Puts a candidate for generation `token` with the given body and input snapshot.
async fn put(kit: &ObjectKit, token: u64, body: &[u8], snapshot: &str) -> Candidate {
    let op = format!("op-{token}");
    kit.put_candidate(
        PATH,
        t(token),
        "pdf",
        body.to_vec(),
        &provenance(snapshot, &op),
    )
    .await
    .unwrap()
}

fn t(n: u64) -> FencingToken {
    FencingToken::of(n).unwrap()
}

fn age(path: &std::path::Path, by: Duration) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - by).unwrap();
}

#[tokio::test]
async fn put_is_create_only() {
    let dir = Dir::new("create");
    let kit = ObjectKit::local(&dir.0).unwrap();
    let c = put(&kit, 108, b"bob's statement", "snap-7").await;
    assert_eq!(c.key, "statements/account-42/2026-09-13/generation-108.pdf");
    let again = kit
        .put_candidate(
            PATH,
            t(108),
            "pdf",
            b"something else".to_vec(),
            &provenance("snap-7", "op-108"),
        )
        .await;
    assert!(
        matches!(again, Err(ObjectError::AlreadyExists { .. })),
        "{again:?}"
    );
    assert_eq!(
        kit.read(&c.key).await.unwrap(),
        b"bob's statement",
        "never overwritten"
    );
    assert!(matches!(
        kit.put_candidate("../escape", t(1), "pdf", vec![1], &provenance("s", "o"))
            .await,
        Err(ObjectError::InvalidPath { .. })
    ));
    assert!(matches!(
        kit.put_candidate(PATH, t(1), "pdf", vec![1], &provenance("a\nb", "o"))
            .await,
        Err(ObjectError::InvalidManifestField { .. })
    ));
}

#[tokio::test]
async fn validation_catches_a_changed_byte_a_wrong_snapshot_and_a_missing_manifest() {
    let dir = Dir::new("validate");
    let kit = ObjectKit::local(&dir.0).unwrap();
    let c = put(&kit, 108, b"statement body", "snap-7").await;
    let m = kit
        .validate(&c.key, Some("snap-7"), Some("statements 1.0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m, c.manifest);
    assert!(matches!(
        kit.validate(&c.key, Some("snap-8"), None).await.unwrap(),
        Err(Rejection::WrongInputSnapshot { .. })
    ));
    assert!(matches!(
        kit.validate(&c.key, None, Some("statements 2.0"))
            .await
            .unwrap(),
        Err(Rejection::WrongGenerator { .. })
    ));
    // Flip one byte on disk.
    let file = dir.0.join(&c.key);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    assert!(matches!(
        kit.validate(&c.key, None, None).await.unwrap(),
        Err(Rejection::ChecksumMismatch { .. })
    ));
    // An upload that crashed before its manifest.
    let orphan = format!("{PATH}/generation-109.pdf");
    std::fs::write(dir.0.join(&orphan), b"partial").unwrap();
    assert_eq!(
        kit.validate(&orphan, None, None).await.unwrap(),
        Err(Rejection::NoManifest {
            key: orphan.clone()
        })
    );
}

#[tokio::test]
async fn gc_keeps_the_published_and_young_objects() {
    let dir = Dir::new("gc");
    let kit = ObjectKit::local(&dir.0).unwrap();
    let old = put(&kit, 107, b"alice", "s").await;
    let published = put(&kit, 108, b"bob", "s").await;
    let young = put(&kit, 109, b"carol", "s").await;
    let two_days = Duration::from_secs(2 * 86_400);
    for key in [&old.key, &published.key] {
        age(&dir.0.join(key), two_days);
        age(&dir.0.join(format!("{key}.manifest")), two_days);
    }
    let referenced: HashSet<String> = [published.key.clone()].into();
    let report = kit
        .gc("statements", &referenced, Duration::from_secs(86_400))
        .await
        .unwrap();
    assert_eq!(
        report.deleted,
        vec![old.key.clone(), format!("{}.manifest", old.key)]
    );
    assert_eq!((report.kept_published, report.kept_young), (2, 2));
    assert_eq!(
        kit.list("statements").await.unwrap(),
        vec![published.key.clone(), young.key.clone()]
    );
    assert!(kit
        .validate(&published.key, None, None)
        .await
        .unwrap()
        .is_ok());
    assert!(kit.validate(&young.key, None, None).await.unwrap().is_ok());
    assert!(kit.read(&old.key).await.is_err());
}

#[tokio::test]
async fn publish_a_validated_candidate_through_the_fenced_pointer() {
    let dir = Dir::new("publish");
    let kit = ObjectKit::local(&dir.0.join("objects")).unwrap();
    let mut conn = rusqlite::Connection::open(dir.0.join("fence.sqlite")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let resource = "statement:account-42:2026-09-13";
    // Alice (107) uploads, then pauses; Bob (108) uploads and publishes.
    let alice = put(&kit, 107, b"alice", "snap-6").await;
    let bob = put(&kit, 108, b"bob", "snap-7").await;
    let m = kit
        .validate(&bob.key, Some("snap-7"), None)
        .await
        .unwrap()
        .unwrap();
    let publish = |token: u64, op: &str, key: &str, fingerprint: &str| {
        FenceRequest::new(
            resource,
            FencingToken::of(token).unwrap(),
            op,
            fingerprint.as_bytes(),
            key.as_bytes(),
        )
        .unwrap()
    };
    assert!(
        SqliteFence::publish(&mut conn, &publish(108, "op-108", &bob.key, &m.sha256_hex))
            .unwrap()
            .is_applied()
    );
    // Alice resumes: her object exists, but her pointer update is stale.
    let late = SqliteFence::publish(
        &mut conn,
        &publish(107, "op-107", &alice.key, &alice.manifest.sha256_hex),
    )
    .unwrap();
    assert_eq!(
        late,
        Outcome::Stale {
            presented: t(107),
            current: t(108)
        }
    );
    let pointer = SqliteFence::publication(&conn, &resource_name(resource).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(pointer.object_key, bob.key);
    assert_eq!(kit.read(&pointer.object_key).await.unwrap(), b"bob");
    let counts: std::collections::HashMap<_, _> =
        baton_fence::metrics::outcome_counts().into_iter().collect();
    assert!(counts["applied"] >= 1 && counts["stale"] >= 1, "{counts:?}");
}

/// The kit's counters go through the `metrics` facade: whatever recorder the
/// application installs sees `baton_fence_outcomes_total` by outcome.
#[test]
fn outcomes_reach_the_installed_metrics_recorder() {
    use std::sync::{Arc, Mutex};
    #[derive(Default)]
    struct Names(Mutex<Vec<String>>);
    impl metrics::Recorder for Names {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            key: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            self.0
                .lock()
                .unwrap()
                .push(format!("{}{{{}}}", key.name(), labels.join(",")));
            metrics::Counter::noop()
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }
    let recorder = Arc::new(Names::default());
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    SqliteFence::migrate(&conn).unwrap();
    metrics::with_local_recorder(&*recorder, || {
        for (token, op) in [(108, "bob"), (107, "alice")] {
            let token = FencingToken::of(token).unwrap();
            let req = FenceRequest::new("doc", token, op, op.as_bytes(), b"").unwrap();
            SqliteFence::write(&mut conn, &req, |_| Ok::<(), baton_fence::FenceError>(())).unwrap();
        }
    });
    let names = recorder.0.lock().unwrap().clone();
    assert!(
        names.contains(&"baton_fence_outcomes_total{outcome=applied}".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"baton_fence_outcomes_total{outcome=stale}".to_string()),
        "{names:?}"
    );
}
