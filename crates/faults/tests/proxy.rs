//! The proxy between a real client and a real Baton server on loopback.

use std::time::Duration;

use baton_client::{Acquired, Client};
use baton_faults::{Direction, Proxy};
use baton_testkit::{until, TempDir};

const TTL: Duration = Duration::from_secs(30);

struct Setup {
    _dir: TempDir,
    server: baton_server::RunningServer,
    proxy: Proxy,
}

async fn setup(tag: &str) -> Setup {
    let dir = TempDir::new(&format!("baton-faults-{tag}"));
    let server = baton_server::start(baton_server::ServerConfig::ephemeral(
        dir.path().to_path_buf(),
    ))
    .await
    .unwrap();
    let proxy = Proxy::start(server.grpc_addr).await.unwrap();
    Setup {
        _dir: dir,
        server,
        proxy,
    }
}

impl Setup {
    async fn direct(&self) -> Client {
        Client::connect(&format!("http://{}", self.server.grpc_addr))
            .await
            .unwrap()
    }

    async fn proxied(&self) -> Client {
        Client::connect(&format!("http://{}", self.proxy.addr()))
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_takes_effect_only_when_released() {
    let s = setup("hold").await;
    let mut via = s.proxied().await;
    let mut direct = s.direct().await;
    s.proxy.hold(Direction::ClientToServer);
    let pending = tokio::spawn(async move { via.acquire("held", TTL, Duration::ZERO).await });
    until(async || s.proxy.counts().held_chunks >= 1).await;
    assert_eq!(
        direct.status("held").await.unwrap().holder_token,
        None,
        "the request is still in the network"
    );
    s.proxy.release(Direction::ClientToServer);
    let Acquired::Granted(lease) = pending.await.unwrap().unwrap() else {
        panic!("not granted")
    };
    assert_eq!(
        direct.status("held").await.unwrap().holder_token,
        Some(lease.token)
    );
    println!("faults fired: {:?}", s.proxy.counts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_response_is_indeterminate_but_took_effect() {
    let s = setup("drop").await;
    let mut via = s.proxied().await;
    let mut direct = s.direct().await;
    // One full round trip first, so that the HTTP/2 handshake is over and
    // the next bytes the client writes are the acquire itself.
    via.status("dropped").await.unwrap();
    s.proxy.drop_next_response();
    let err = via
        .acquire("dropped", TTL, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(!err.is_definite(), "a lost answer is indeterminate: {err}");
    assert_eq!(s.proxy.counts().dropped_responses, 1);
    let status = direct.status("dropped").await.unwrap();
    assert!(
        status.holder_token.is_some(),
        "the acquire was applied although its answer was lost"
    );
    // A blind retry finds the resource held by the lease it never heard about.
    let mut retry = s.proxied().await;
    assert!(matches!(
        retry.acquire("dropped", TTL, Duration::ZERO).await.unwrap(),
        Acquired::NotAcquired(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_ends_a_waiting_request_and_the_server_forgets_the_waiter() {
    let s = setup("reset").await;
    let mut direct = s.direct().await;
    let Acquired::Granted(_) = direct.acquire("busy", TTL, Duration::ZERO).await.unwrap() else {
        panic!()
    };
    let mut via = s.proxied().await;
    let waiting =
        tokio::spawn(async move { via.acquire("busy", TTL, Duration::from_secs(30)).await });
    until(async || direct.status("busy").await.unwrap().n_waiters == 1).await;
    s.proxy.reset_all();
    let err = waiting.await.unwrap().unwrap_err();
    assert!(!err.is_definite(), "{err}");
    until(async || direct.status("busy").await.unwrap().n_waiters == 0).await;
    assert!(s.proxy.counts().resets >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_drop_hits_only_the_request_that_carries_its_pattern() {
    let s = setup("target").await;
    let mut via = s.proxied().await;
    let mut direct = s.direct().await;
    s.proxy.drop_response_to(b"target:resource");
    // Other requests on the same connection pass untouched.
    for name in ["other:1", "other:2"] {
        assert!(matches!(
            via.acquire(name, TTL, Duration::ZERO).await.unwrap(),
            Acquired::Granted(_)
        ));
    }
    assert_eq!(s.proxy.counts().dropped_responses, 0);
    let lost = via.acquire("target:resource", TTL, Duration::ZERO).await;
    assert!(lost.is_err(), "the answer was dropped: {lost:?}");
    assert_eq!(
        s.proxy.counts().dropped_responses,
        1,
        "the fault fired once"
    );
    assert!(
        direct
            .status("target:resource")
            .await
            .unwrap()
            .holder_token
            .is_some(),
        "the request itself was delivered and took effect"
    );
    // Disarmed after one hit.
    let mut again = s.proxied().await;
    assert!(again.status("target:resource").await.is_ok());
    assert_eq!(s.proxy.counts().dropped_responses, 1);
}
