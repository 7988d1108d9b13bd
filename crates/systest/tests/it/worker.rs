//! The worker runtime against a real server: guarded work completes and
//! releases, guarded work is stopped when the lease is taken away, and
//! acquisition backs off until a held resource frees up.

use std::time::Duration;

use baton_client::worker::{
    acquire_with_backoff, run_guarded, Backoff, Guarded, KeeperConfig, Ownership,
};
use baton_client::{Acquired, Client};
use baton_systest as common;
use common::TempDir;

#[tokio::test]
async fn guarded_work_completes_then_releases() {
    let dir = TempDir::new("guarded");
    let s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let out = run_guarded(
        &client,
        "job:ok",
        Duration::from_millis(600),
        Duration::ZERO,
        KeeperConfig::default(),
        |guard| async move {
            assert!(guard.may_start_effect());
            assert_eq!(guard.ownership(), Ownership::Held);
            guard.token()
        },
    )
    .await
    .unwrap();
    let Guarded::Completed(token) = out else {
        panic!("{out:?}")
    };
    let mut c = client.clone();
    assert_eq!(
        c.status("job:ok").await.unwrap().holder_token,
        None,
        "released at the end"
    );
    let Acquired::Granted(next) = c
        .acquire("job:ok", Some(Duration::from_secs(5)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(next.token > token);
}

#[tokio::test]
async fn guarded_work_is_stopped_when_the_lease_is_fenced() {
    let dir = TempDir::new("fenced");
    let s = common::serve(dir.path(), &[]);
    let client = Client::connect(&s.url()).await.unwrap();
    let mut operator = client.clone();
    let out = run_guarded(
        &client,
        "job:fenced",
        Duration::from_millis(600),
        Duration::ZERO,
        KeeperConfig::default(),
        |guard| async move {
            // The operator fences the resource while the work runs; the work never finishes by itself.
            operator.fence("job:fenced").await.unwrap();
            guard.cancellation().cancelled().await;
            assert!(!guard.may_start_effect());
            std::future::pending::<()>().await
        },
    )
    .await
    .unwrap();
    assert!(matches!(out, Guarded::Lost { .. }), "{out:?}");
}

#[tokio::test]
async fn acquisition_backs_off_until_the_resource_frees() {
    let dir = TempDir::new("backoff");
    let s = common::serve(dir.path(), &[]);
    let mut holder = Client::connect(&s.url()).await.unwrap();
    let Acquired::Granted(held) = holder
        .acquire("job:busy", Some(Duration::from_millis(300)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!()
    };
    let c = Client::connect(&s.url()).await.unwrap();
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
    let (leases, _session) = acquire_with_backoff(
        &c,
        &["job:busy"],
        Duration::from_secs(5),
        Duration::from_secs(10),
        &mut backoff,
    )
    .await
    .unwrap()
    .expect("acquired within the budget");
    assert!(leases[0].token > held.token);
    let mut none = Backoff::new(Duration::from_millis(10), Duration::from_millis(20));
    let gave_up = acquire_with_backoff(
        &holder,
        &["job:busy"],
        Duration::from_secs(5),
        Duration::from_millis(100),
        &mut none,
    )
    .await
    .unwrap();
    assert!(gave_up.is_none(), "a bounded budget gives up");
}
