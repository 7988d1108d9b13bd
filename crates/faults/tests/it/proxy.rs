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
    let pending = tokio::spawn(async move { via.acquire("held", Some(TTL), Duration::ZERO).await });
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
async fn a_dropped_response_took_effect_and_the_repeat_gets_that_lease() {
    let s = setup("drop").await;
    let mut via = s.proxied().await;
    let mut direct = s.direct().await;
    // One full round trip first, so that the HTTP/2 handshake is over and
    // the next bytes the client writes are the acquire itself.
    via.status("dropped").await.unwrap();
    s.proxy.drop_next_response();
    let Acquired::Granted(lease) = via
        .acquire("dropped", Some(TTL), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("the repeat gets the lease the lost answer carried");
    };
    assert_eq!(s.proxy.counts().dropped_responses, 1, "the fault fired");
    let status = direct.status("dropped").await.unwrap();
    assert_eq!(
        status.holder_token,
        Some(lease.token),
        "the acquire was applied once although its answer was lost"
    );
    // Another request (a new id) finds the resource held by that lease.
    let mut other = s.proxied().await;
    assert!(matches!(
        other
            .acquire("dropped", Some(TTL), Duration::ZERO)
            .await
            .unwrap(),
        Acquired::NotAcquired(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_while_waiting_rejoins_the_line_in_its_place_once() {
    let s = setup("reset").await;
    let mut direct = s.direct().await;
    let Acquired::Granted(held) = direct
        .acquire("busy", Some(TTL), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!()
    };
    let mut via = s.proxied().await;
    let waiting = tokio::spawn(async move {
        via.acquire("busy", Some(TTL), Duration::from_secs(30))
            .await
    });
    until(async || direct.status("busy").await.unwrap().n_waiters == 1).await;
    s.proxy.reset_all();
    assert!(s.proxy.counts().resets >= 1, "the fault fired");
    // The wait goes on as one waiter (the repeat replaces the first
    // attempt, or joins again once the server dropped it), never two.
    until(async || s.proxy.counts().connections >= 2).await;
    until(async || direct.status("busy").await.unwrap().n_waiters == 1).await;
    direct.release("busy", &held.acquisition_id).await.unwrap();
    let Acquired::Granted(got) = waiting.await.unwrap().unwrap() else {
        panic!("the waiter is served once the holder leaves");
    };
    let status = direct.status("busy").await.unwrap();
    assert_eq!(status.holder_token, Some(got.token));
    assert_eq!(
        status.n_waiters, 0,
        "nobody else waits: no second grant to come"
    );
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
            via.acquire(name, Some(TTL), Duration::ZERO).await.unwrap(),
            Acquired::Granted(_)
        ));
    }
    assert_eq!(s.proxy.counts().dropped_responses, 0);
    // The answer is dropped; the repeat (same request id) gets the lease.
    let lost = via
        .acquire("target:resource", Some(TTL), Duration::ZERO)
        .await;
    assert!(matches!(lost, Ok(Acquired::Granted(_))), "{lost:?}");
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
