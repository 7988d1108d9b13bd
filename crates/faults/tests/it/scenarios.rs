//! Seed scenarios that need a network fault: a renewal delayed past expiry,
//! a publication whose response is lost on the way back from PostgreSQL,
//! and a write delayed across deletion and recreation of its resource.

use std::time::Duration;

use baton_client::worker::{Keeper, KeeperConfig, Ownership};
use baton_client::{Acquired, Client};
use baton_faults::{Direction, Proxy};
use baton_fence::postgres::PgFence;
use baton_fence::{FenceRequest, FencingToken, Outcome};
use baton_testkit::{until, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_held_past_expiry_fails_and_the_worker_stops_before_its_next_effect() {
    let dir = TempDir::new("baton-faults-renew");
    let server = baton_server::start(baton_server::ServerConfig::ephemeral(
        dir.path().to_path_buf(),
    ))
    .await
    .unwrap();
    let proxy = Proxy::start(server.grpc_addr).await.unwrap();
    let mut via = Client::connect(&format!("http://{}", proxy.addr()))
        .await
        .unwrap();
    let mut direct = Client::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let ttl = Duration::from_millis(600);
    let Acquired::Granted(lease) = via
        .acquire("renew:held", Some(ttl), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!()
    };
    // Every renewal from now on waits in the network.
    proxy.hold(Direction::ClientToServer);
    let keeper = Keeper::start(via.clone(), lease.clone(), KeeperConfig::default());
    let guard = keeper.guard();
    until(async || proxy.counts().held_chunks >= 1).await;
    // The worker learns it lost the lease at its safe deadline, before the server even expires it.
    guard.cancellation().cancelled().await;
    assert_eq!(guard.ownership(), Ownership::Lost);
    assert!(!guard.may_start_effect(), "no effect after the deadline");
    until(async || {
        direct
            .status("renew:held")
            .await
            .unwrap()
            .holder_token
            .is_none()
    })
    .await;
    let Acquired::Granted(next) = direct
        .acquire("renew:held", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!()
    };
    // The late renewal finally arrives: it must not extend or recreate anything.
    proxy.release(Direction::ClientToServer);
    let late = via
        .renew("renew:held", &lease.acquisition_id)
        .await
        .unwrap();
    assert_eq!(late, baton_client::Renewal::NotOwner);
    assert_eq!(
        direct.status("renew:held").await.unwrap().holder_token,
        Some(next.token)
    );
    println!("faults fired: {:?}", proxy.counts());
    drop(keeper);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_publication_response_is_retried_to_the_saved_result_then_a_changed_payload_conflicts(
) {
    let db = baton_testkit::PgDb::create("baton_faults_lost").await;
    let mut setup = db.connect().await;
    PgFence::migrate(&mut setup).await.unwrap();
    // The worker reaches PostgreSQL through the proxy.
    let proxy = Proxy::start(db.upstream()).await.unwrap();
    let proxied = db.url_via(proxy.addr().port());
    let connect = async || {
        let client = baton_testkit::pg_connect(&proxied).await;
        let prepared = PgFence::prepare(&client).await.unwrap();
        (client, prepared)
    };
    let key = "statements/account-42/2026-09-13/generation-108.txt";
    let bob = FencingToken::of(108).unwrap();
    let req = FenceRequest::new(
        "statement:account-42:2026-09-13",
        bob,
        "publish-108",
        b"sha256:bob",
        key.as_bytes(),
    )
    .unwrap();
    let (first, prepared) = connect().await;
    proxy.drop_next_response();
    let lost = PgFence::publish(&first, &prepared, &req).await;
    assert!(lost.is_err(), "the answer was lost: {lost:?}");
    assert_eq!(proxy.counts().dropped_responses, 1, "the fault fired");
    // The retry, on a new connection with the same operation id, gets the saved result.
    let (second, prepared) = connect().await;
    let retry = PgFence::publish(&second, &prepared, &req).await.unwrap();
    assert_eq!(
        retry,
        Outcome::Replayed {
            token: bob,
            result: key.as_bytes().to_vec()
        }
    );
    let n: i64 = setup
        .query_one("SELECT count(*) FROM baton.operations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "one publication, not two");
    let changed = FenceRequest::new(
        "statement:account-42:2026-09-13",
        bob,
        "publish-108",
        b"sha256:other",
        key.as_bytes(),
    )
    .unwrap();
    assert!(matches!(
        PgFence::publish(&second, &prepared, &changed)
            .await
            .unwrap(),
        Outcome::Conflict { .. }
    ));
    drop((first, second, setup));
}

/// Deletion, then recreation of the same logical resource, while an old
/// owner's write waits in the network: when it finally arrives it is refused
/// (the tombstone kept the generation floor across the recreation), and the
/// pointer names the new incarnation's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_delayed_across_deletion_and_recreation_is_refused() {
    let db = baton_testkit::PgDb::create("baton_faults_recreate").await;
    let mut setup = db.connect().await;
    PgFence::migrate(&mut setup).await.unwrap();
    let dir = TempDir::new("baton-faults-recreate");
    let server = baton_server::start(baton_server::ServerConfig::ephemeral(
        dir.path().to_path_buf(),
    ))
    .await
    .unwrap();
    let mut baton = Client::connect(&format!("http://{}", server.grpc_addr))
        .await
        .unwrap();
    let resource = "report:tenant-3";
    let owner = async |c: &mut Client| match c
        .acquire(resource, Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    let req = |token: u64, op: &str| {
        FenceRequest::new(
            resource,
            FencingToken::of(token).unwrap(),
            op,
            op.as_bytes(),
            op.as_bytes(),
        )
        .unwrap()
    };
    let prepared = PgFence::prepare(&setup).await.unwrap();

    // Alice owns the resource and publishes once directly, then her second
    // publish goes through a proxy that holds it.
    let alice = owner(&mut baton).await;
    let a = alice.token.get();
    assert!(matches!(
        PgFence::publish(&setup, &prepared, &req(a, "alice-1"))
            .await
            .unwrap(),
        Outcome::Applied { .. }
    ));
    let proxy = Proxy::start(db.upstream()).await.unwrap();
    let slow = baton_testkit::pg_connect(&db.url_via(proxy.addr().port())).await;
    let slow_prepared = PgFence::prepare(&slow).await.unwrap();
    proxy.hold(Direction::ClientToServer);
    let late =
        tokio::spawn(
            async move { PgFence::publish(&slow, &slow_prepared, &req(a, "alice-2")).await },
        );
    until(async || proxy.counts().held_chunks >= 1).await;
    baton
        .release(resource, &alice.acquisition_id)
        .await
        .unwrap();

    // Bob deletes the resource; Carol recreates it and publishes.
    let bob = owner(&mut baton).await;
    assert!(matches!(
        PgFence::delete(&setup, &req(bob.token.get(), "bob-delete"))
            .await
            .unwrap(),
        Outcome::Applied { .. }
    ));
    baton.release(resource, &bob.acquisition_id).await.unwrap();
    let carol = owner(&mut baton).await;
    let key = baton_fence::resource_name(resource).unwrap();
    assert!(matches!(
        PgFence::recreate(
            &setup,
            &key,
            baton_fence::FencingToken::of(carol.token.get()).unwrap()
        )
        .await
        .unwrap(),
        baton_fence::Recreate::Recreated { .. }
    ));
    assert!(matches!(
        PgFence::publish(&setup, &prepared, &req(carol.token.get(), "carol-1"))
            .await
            .unwrap(),
        Outcome::Applied { .. }
    ));

    // Alice's request arrives.
    proxy.release(Direction::ClientToServer);
    let outcome = late.await.unwrap().unwrap();
    assert!(
        matches!(outcome, Outcome::Stale { .. } | Outcome::Deleted { .. }),
        "the old incarnation's write must be refused: {outcome:?}"
    );
    let pointer = PgFence::publication(&setup, &key).await.unwrap().unwrap();
    assert_eq!(pointer.operation, "carol-1");
    println!(
        "faults fired: {:?}; Alice {a} refused ({outcome:?}), Bob {} deleted, Carol {} recreated",
        proxy.counts(),
        bob.token.get(),
        carol.token.get()
    );
}
