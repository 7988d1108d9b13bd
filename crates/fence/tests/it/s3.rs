//! The object scenarios on a real S3-compatible server (moto's server
//! mode, one process per test; see `baton_testkit::s3`): create-only
//! candidates, manifest validation, publication through the fenced
//! pointer with a stale owner's late upload refused, reuse of a valid
//! candidate and regeneration for a changed input, garbage collection on
//! the store's clock, a multi-megabyte object in one create-only PUT, an
//! interrupted upload that leaves nothing visible, and a store that
//! ignores conditional create refused when the kit is opened.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use baton_fence::objects::{ObjectError, ObjectKit, Provenance, Rejection, PROBE_KEY};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{resource_name, FenceRequest, FencingToken, Outcome};
use baton_testkit::s3::{Mischief, Proxy, S3Server, ACCESS_KEY, SECRET_KEY};
use object_store::aws::AmazonS3Builder;

const PATH: &str = "statements/account-42/2026-09-13";
const RESOURCE: &str = "statement:account-42:2026-09-13";

fn t(n: u64) -> FencingToken {
    FencingToken::of(n).unwrap()
}

/// A kit on `endpoint`'s bucket under `prefix`, as an application builds one.
fn kit_at(endpoint: &str, bucket: &str, prefix: &str) -> ObjectKit {
    baton_telemetry::use_ring_for_https();
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .build()
        .unwrap();
    ObjectKit::new(Arc::new(store), prefix)
}

fn provenance<'a>(snapshot: &'a str, op: &'a str) -> Provenance<'a> {
    Provenance {
        input_snapshot: snapshot,
        generator_version: "statements 1.0",
        operation: op,
        resource: RESOURCE,
    }
}

#[tokio::test]
async fn candidates_are_create_only_and_validated_on_s3() {
    let s3 = S3Server::start("baton-create");
    let kit = kit_at(&s3.endpoint, &s3.bucket, "tenant-a");
    kit.check_create_only().await.unwrap();
    let c = kit
        .put_candidate(
            PATH,
            t(108),
            "pdf",
            b"bob's statement".to_vec(),
            &provenance("snap-7", "op-108"),
        )
        .await
        .unwrap();
    // A second upload of the same generation (a crashed owner retrying,
    // or anyone else) is refused; the object is never overwritten.
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
    assert_eq!(kit.read(&c.key).await.unwrap(), b"bob's statement");
    // Validation: the manifest's size, checksum, input, generator, operation.
    let m = kit
        .validate(&c.key, Some("snap-7"), Some("statements 1.0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m, c.manifest);
    assert_eq!(m.operation, "op-108");
    assert_eq!(m.size_bytes, 15);
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
    // An object whose manifest never came (a crash between the two PUTs),
    // and one whose bytes were replaced behind the kit's back.
    let orphan = format!("{PATH}/generation-109.pdf");
    put_raw(&s3, &format!("tenant-a/{orphan}"), b"partial").await;
    assert_eq!(
        kit.validate(&orphan, None, None).await.unwrap(),
        Err(Rejection::NoManifest {
            key: orphan.clone()
        })
    );
    let forged = kit
        .put_candidate(
            PATH,
            t(110),
            "pdf",
            b"carol".to_vec(),
            &provenance("snap-7", "op-110"),
        )
        .await
        .unwrap();
    put_raw(&s3, &format!("tenant-a/{}", forged.key), b"CAROL").await;
    assert!(matches!(
        kit.validate(&forged.key, None, None).await.unwrap(),
        Err(Rejection::ChecksumMismatch { .. })
    ));
    // The prefix keeps tenants apart.
    let other = kit_at(&s3.endpoint, &s3.bucket, "tenant-b");
    assert!(other.list("statements").await.unwrap().is_empty());
    assert_eq!(kit.list("statements").await.unwrap().len(), 3);
}

/// Overwrites `key` in the bucket without any condition (what a buggy or
/// hostile writer could do), through the S3 API.
async fn put_raw(s3: &S3Server, key: &str, bytes: &[u8]) {
    use object_store::ObjectStoreExt;
    baton_telemetry::use_ring_for_https();
    let store = AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_allow_http(true)
        .with_bucket_name(&s3.bucket)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .build()
        .unwrap();
    store
        .put(&object_store::path::Path::from(key), bytes.to_vec().into())
        .await
        .unwrap();
}

#[tokio::test]
async fn publication_reuse_regeneration_and_a_stale_late_upload_on_s3() {
    let s3 = S3Server::start("baton-publish");
    let kit = kit_at(&s3.endpoint, &s3.bucket, "");
    let dir = baton_testkit::TempDir::new("s3-publish");
    let mut conn = rusqlite::Connection::open(dir.path().join("fence.sqlite")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let publish = |token: u64, key: &str, sha: &str| {
        FenceRequest::new(
            RESOURCE,
            FencingToken::of(token).unwrap(),
            &format!("publish-{token}"),
            sha.as_bytes(),
            key.as_bytes(),
        )
        .unwrap()
    };
    // Alice (107) uploads and pauses. Bob (108) uploads and publishes.
    let alice = kit
        .put_candidate(
            PATH,
            t(107),
            "pdf",
            b"alice".to_vec(),
            &provenance("snap-6", "op-107"),
        )
        .await
        .unwrap();
    let bob = kit
        .put_candidate(
            PATH,
            t(108),
            "pdf",
            b"bob".to_vec(),
            &provenance("snap-7", "op-108"),
        )
        .await
        .unwrap();
    assert!(
        SqliteFence::publish(&mut conn, &publish(108, &bob.key, &bob.manifest.sha256_hex))
            .unwrap()
            .is_applied()
    );
    // Alice wakes: her late upload of her own generation is refused (it
    // exists), and her pointer move is stale.
    let late_upload = kit
        .put_candidate(
            PATH,
            t(107),
            "pdf",
            b"alice v2".to_vec(),
            &provenance("snap-6", "op-107"),
        )
        .await;
    assert!(matches!(
        late_upload,
        Err(ObjectError::AlreadyExists { .. })
    ));
    let late = SqliteFence::publish(
        &mut conn,
        &publish(107, &alice.key, &alice.manifest.sha256_hex),
    )
    .unwrap();
    assert_eq!(
        late,
        Outcome::Stale {
            presented: t(107),
            current: t(108)
        }
    );
    let pointer = SqliteFence::publication(&conn, &resource_name(RESOURCE).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(pointer.object_key, bob.key);
    assert_eq!(kit.read(&pointer.object_key).await.unwrap(), b"bob");

    // Carol (109) after a crash of Bob's successor: a candidate that
    // validates for the current input is reused (published as it is), one
    // made from an older input is not, and a new generation is made.
    let dave = kit
        .put_candidate(
            PATH,
            t(109),
            "pdf",
            b"dave".to_vec(),
            &provenance("snap-7", "op-109"),
        )
        .await
        .unwrap();
    assert!(
        kit.validate(&dave.key, Some("snap-7"), None)
            .await
            .unwrap()
            .is_ok(),
        "reusable"
    );
    assert!(matches!(
        kit.validate(&dave.key, Some("snap-8"), None).await.unwrap(),
        Err(Rejection::WrongInputSnapshot { .. })
    ));
    let erin = kit
        .put_candidate(
            PATH,
            t(110),
            "pdf",
            b"erin".to_vec(),
            &provenance("snap-8", "op-110"),
        )
        .await
        .unwrap();
    assert!(SqliteFence::publish(
        &mut conn,
        &publish(110, &erin.key, &erin.manifest.sha256_hex)
    )
    .unwrap()
    .is_applied());

    // Garbage collection, on the store's clock: with a day's retention
    // nothing is old enough; with none, every unreferenced candidate goes
    // and the published one stays.
    let referenced: HashSet<String> = [erin.key.clone()].into();
    let kept = kit
        .gc("statements", &referenced, Duration::from_secs(86_400))
        .await
        .unwrap();
    assert!(kept.deleted.is_empty(), "{kept:?}");
    assert_eq!(kept.kept_young, 6, "{kept:?}");
    let swept = kit
        .gc("statements", &referenced, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(swept.deleted.len(), 6, "{swept:?}");
    assert_eq!(swept.kept_published, 2);
    assert_eq!(
        kit.list("statements").await.unwrap(),
        vec![erin.key.clone()]
    );
    assert!(kit.validate(&erin.key, None, None).await.unwrap().is_ok());
}

#[tokio::test]
async fn a_multi_megabyte_object_is_one_create_only_put_and_a_cut_upload_leaves_nothing() {
    let s3 = S3Server::start("baton-large");
    let kit = kit_at(&s3.endpoint, &s3.bucket, "");
    let body: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let c = kit
        .put_candidate(
            PATH,
            t(200),
            "pdf",
            body.clone(),
            &provenance("snap-1", "op-200"),
        )
        .await
        .unwrap();
    assert_eq!(c.manifest.size_bytes, 8 * 1024 * 1024);
    assert!(kit
        .validate(&c.key, Some("snap-1"), None)
        .await
        .unwrap()
        .is_ok());
    assert_eq!(kit.read(&c.key).await.unwrap(), body);
    let again = kit
        .put_candidate(
            PATH,
            t(200),
            "pdf",
            vec![0; 6 * 1024 * 1024],
            &provenance("snap-1", "op-200"),
        )
        .await;
    assert!(
        matches!(again, Err(ObjectError::AlreadyExists { .. })),
        "{again:?}"
    );

    // The connection dies half-way through a PUT: the store shows nothing.
    let cut = Proxy::start(s3.port(), Mischief::CutPutBody).await;
    let cut_kit = kit_at(&cut.endpoint, &s3.bucket, "");
    let interrupted = tokio::time::timeout(
        Duration::from_secs(60),
        cut_kit.put_candidate(
            PATH,
            t(201),
            "pdf",
            body.clone(),
            &provenance("snap-1", "op-201"),
        ),
    )
    .await
    .expect("the upload gives up");
    assert!(interrupted.is_err(), "{interrupted:?}");
    assert_eq!(
        kit.list("statements").await.unwrap(),
        vec![c.key.clone()],
        "no partial object"
    );
    assert!(matches!(
        kit.validate(&format!("{PATH}/generation-201.pdf"), None, None)
            .await
            .unwrap(),
        Err(Rejection::NoManifest { .. } | Rejection::NoObject { .. })
    ));
}

#[tokio::test]
async fn a_store_that_ignores_conditional_create_is_refused() {
    let s3 = S3Server::start("baton-overwrite");
    let honest = kit_at(&s3.endpoint, &s3.bucket, "");
    honest.check_create_only().await.unwrap();
    honest.check_create_only().await.unwrap();
    // The same server behind a proxy that drops If-None-Match.
    let proxy = Proxy::start(s3.port(), Mischief::StripIfNoneMatch).await;
    let fooled = kit_at(&proxy.endpoint, &s3.bucket, "");
    let refused = fooled.check_create_only().await.unwrap_err();
    let message = refused.to_string();
    assert!(
        matches!(refused, ObjectError::NotCreateOnly { .. }),
        "{refused:?}"
    );
    assert!(
        message.contains("does not honour conditional create") && message.contains(PROBE_KEY),
        "{message}"
    );
    assert!(
        message.contains("baton-overwrite"),
        "names the store: {message}"
    );
    // What the probe protects against: through the proxy, a second
    // "create" of a generation overwrites it without an error.
    let first = fooled
        .put_candidate(
            PATH,
            t(300),
            "pdf",
            b"first".to_vec(),
            &provenance("s", "op-300"),
        )
        .await
        .unwrap();
    fooled
        .put_candidate(
            PATH,
            t(300),
            "pdf",
            b"second".to_vec(),
            &provenance("s", "op-300"),
        )
        .await
        .expect("the stripped condition lets the overwrite through");
    assert_eq!(honest.read(&first.key).await.unwrap(), b"second");
}
