//! Names an operator can trust: a name or holder description holding an
//! invisible or formatting character (Cf, default-ignorable) is refused
//! for a new lease, naming the rule; a lease stored under such a name by
//! an earlier release still loads, shows, and can be fenced and released.

use std::time::Duration;

use baton_client::{Acquired, Client, ClientError, Release};
use baton_core::{AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName, Write};
use baton_store::{LeaseStore, RedbStore};
use baton_systest::serve;
use baton_testkit::TempDir;

const LOOKALIKES: [&str; 3] = ["rtl:\u{202E}gnp.exe", "zw:a\u{200B}b", "vs:a\u{FE0F}"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_characters_are_refused_in_new_names_and_holders() {
    let dir = TempDir::new("names");
    let s = serve(dir.path(), &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    for name in LOOKALIKES {
        let e = c
            .acquire(name, Some(Duration::from_secs(5)), Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Invalid(_)), "{name:?}: {e:?}");
        assert!(
            e.to_string()
                .contains("invisible or formatting character U+"),
            "{name:?}: {e}"
        );
        assert!(c.status(name).await.unwrap().holder_token.is_none());
    }
    let holder = baton_core::Holder::parse("job\u{200D}7");
    assert!(holder
        .unwrap_err()
        .to_string()
        .contains("invisible or formatting character U+200D"));
    // Through the command line, too: a usage-level refusal, nothing held.
    let out = baton_systest::cli(&["acquire", LOOKALIKES[1], "--server", &s.url()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("U+200B"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_stored_under_such_a_name_still_loads_and_can_be_fenced_and_released() {
    let dir = TempDir::new("old_names");
    let data = dir.path().join("data");
    let id = AcquisitionId::from_bytes([9; 16]);
    let fenced_id = AcquisitionId::from_bytes([8; 16]);
    {
        // As an earlier release wrote them.
        let mut store = RedbStore::open(&data).unwrap();
        let lease = |n: &str, id: &AcquisitionId, counter| Write::PutLease {
            resource: ResourceName::parse_existing(n).unwrap(),
            record: LeaseRecord {
                acquisition_digest: id.digest(),
                token: FencingToken::new(Epoch::FIRST, counter).unwrap(),
                ttl_ms: 60_000,
                session: None,
                holder: None,
                shape: baton_core::Shape::Exclusive,
            },
        };
        store
            .commit(&[
                lease(LOOKALIKES[1], &id, 1),
                lease(LOOKALIKES[0], &fenced_id, 2),
                Write::Tokens {
                    epoch: Epoch::FIRST,
                    counter: 2,
                },
            ])
            .unwrap();
    }
    let s = serve(&data, &[]);
    let mut c = Client::connect(&s.url()).await.unwrap();
    let status = c.status(LOOKALIKES[1]).await.unwrap();
    assert_eq!(
        status.holder_token.map(|t| t.get()),
        Some(FencingToken::new(Epoch::FIRST, 1).unwrap().get())
    );
    let fenced = c.fence(LOOKALIKES[0]).await.unwrap();
    assert!(fenced.revoked.is_some(), "{fenced:?}");
    let released = c.release(LOOKALIKES[1], &id).await.unwrap();
    assert!(matches!(released, Release::Released { .. }), "{released:?}");
    // Free now, and still not grantable under that name.
    assert!(c
        .status(LOOKALIKES[1])
        .await
        .unwrap()
        .holder_token
        .is_none());
    let again = c
        .acquire(LOOKALIKES[1], Some(Duration::from_secs(5)), Duration::ZERO)
        .await;
    assert!(!matches!(again, Ok(Acquired::Granted(_))), "{again:?}");
}

/// A list's prefix is held to a watch's rule: a control character (which
/// no name holds, so the prefix could match nothing) is refused naming
/// the rule, by both calls, sent as raw requests past any client check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_a_control_character_is_refused_by_list_and_watch_alike() {
    use baton_proto::v1::{leases_client::LeasesClient, ListRequest, WatchRequest};
    let dir = TempDir::new("names-prefix");
    let s = serve(dir.path(), &[]);
    let mut raw = LeasesClient::connect(s.url()).await.unwrap();
    let prefix = "job:\u{7}".to_string();
    let list = raw
        .list(ListRequest {
            prefix: prefix.clone(),
            start_after: String::new(),
            limit: 0,
        })
        .await
        .unwrap_err();
    let watch = raw
        .watch(WatchRequest {
            prefix,
            after_seq: None,
        })
        .await
        .map(|_| ())
        .unwrap_err();
    for e in [&list, &watch] {
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .contains("control character '\\u{7}'; names never do"),
            "{e:?}"
        );
    }
    assert_eq!(list.message(), watch.message(), "one rule, one message");
}
