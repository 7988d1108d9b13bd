//! A lost acquire answer, sent again, never leaves an orphan lease. Three
//! servers on PostgreSQL; a fault proxy in front of the leader lets the
//! request through and drops its answer (and resets the connection), so
//! the client hears nothing of a grant that happened. Carrying a request
//! id, the repeat on another member is answered with that same lease: one
//! lease, one token, and the resource is free right after the release.
//! The negative control sends the same request without an id: the repeat
//! finds the resource held by the lease nobody heard of (the orphan).

use std::time::{Duration, Instant};

use baton_client::{Acquired, Client, Release};
use baton_faults::Proxy;
use baton_proto::v1;
use baton_proto::v1::leases_client::LeasesClient;
use baton_systest::Cluster;
use baton_testkit::PgDb;

/// Three servers, each behind a fault proxy it advertises; the client
/// lists the proxies.
struct Setup {
    cluster: Cluster,
    leader: usize,
    proxies: Vec<Proxy>,
    _db: PgDb,
}

impl Setup {
    async fn start(name: &str) -> Self {
        let db = PgDb::create(name).await;
        let (cluster, proxies) = Cluster::start_behind_proxies(&db.url, 3).await;
        let leader = cluster.wait_leader(None).await;
        Self {
            cluster,
            leader,
            proxies,
            _db: db,
        }
    }

    /// The leader's proxy.
    fn proxy(&self) -> &Proxy {
        &self.proxies[self.leader]
    }

    /// Every proxy, the leader's first.
    fn servers(&self) -> String {
        let mut list = vec![self.proxy_url(self.leader)];
        for i in 0..self.proxies.len() {
            if i != self.leader {
                list.push(self.proxy_url(i));
            }
        }
        list.join(",")
    }

    fn proxy_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.proxies[i].addr().port())
    }

    /// Server `i` itself, not through its proxy.
    fn url(&self, i: usize) -> String {
        self.cluster.nodes[i].url()
    }
}

async fn status(url: &str, name: &str) -> v1::StatusResponse {
    let mut c = LeasesClient::connect(url.to_string()).await.unwrap();
    c.status(v1::StatusRequest {
        resource: name.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

fn acquire(name: &str, request_id: &[u8], first_sent_ms_ago: Option<u64>) -> v1::AcquireRequest {
    v1::AcquireRequest {
        resources: vec![name.into()],
        ttl_ms: Some(30_000),
        wait_ms: 0,
        holder: None,
        request_id: request_id.to_vec(),
        first_sent_ms_ago,
        shapes: Vec::new(),
    }
}

fn granted(r: v1::AcquireResponse) -> v1::Granted {
    match r.outcome {
        Some(v1::acquire_response::Outcome::Granted(g)) => g,
        other => panic!("not granted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_answer_sent_again_gets_the_same_lease_and_leaves_no_orphan() {
    let s = Setup::start("lost_answer").await;
    let leader = s.url(s.leader);
    s.proxy().drop_response_to(b"lost:rust");
    let mut client = Client::connect(&s.servers()).await.unwrap();
    let started = Instant::now();
    let lease = match client
        .acquire("lost:rust", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    let counts = s.proxy().counts();
    assert_eq!(counts.dropped_responses, 1, "the fault fired once");
    let held = status(&leader, "lost:rust").await;
    assert!(held.held);
    assert_eq!(
        held.holder_token,
        lease.token.get(),
        "one lease: the one the client holds"
    );
    let released = client
        .release("lost:rust", &lease.acquisition_id)
        .await
        .unwrap();
    assert!(matches!(released, Release::Released { .. }), "{released:?}");
    assert!(
        !status(&leader, "lost:rust").await.held,
        "free right after the release"
    );
    println!(
        "fault fired {} time(s); answered after {} ms with token {}; no orphan",
        counts.dropped_responses,
        started.elapsed().as_millis(),
        lease.token.get()
    );

    // Negative control: the same loss without a request id. The repeat
    // is a new request, refused: the first grant is an orphan, held until
    // its TTL by nobody.
    let mut through = LeasesClient::connect(s.proxy_url(s.leader)).await.unwrap();
    through
        .status(v1::StatusRequest {
            resource: "lost:bare".into(),
        })
        .await
        .unwrap();
    s.proxy().drop_response_to(b"lost:bare");
    let lost = through.acquire(acquire("lost:bare", &[], None)).await;
    assert!(lost.is_err(), "the answer was dropped: {lost:?}");
    assert_eq!(
        s.proxy().counts().dropped_responses,
        2,
        "the fault fired again"
    );
    let mut direct = LeasesClient::connect(leader.clone()).await.unwrap();
    let again = direct
        .acquire(acquire("lost:bare", &[], None))
        .await
        .unwrap()
        .into_inner();
    let Some(v1::acquire_response::Outcome::NotAcquired(n)) = again.outcome else {
        panic!("without an id the repeat is a new request: {again:?}");
    };
    let orphan = status(&leader, "lost:bare").await;
    assert!(
        orphan.held && orphan.holder_token == n.holder_token,
        "{orphan:?}"
    );
    println!(
        "negative control: without a request id the repeat was refused; the orphan (token {}) is held for {} ms more by nobody",
        orphan.holder_token, orphan.remaining_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_failover_finds_the_lease_the_old_leader_granted() {
    let mut s = Setup::start("lost_failover").await;
    let request_id = [0x5a; 16];
    let mut through = LeasesClient::connect(s.proxy_url(s.leader)).await.unwrap();
    // One round trip first: the proxy then takes the next chunk for the
    // request it is armed for, not for the connection's handshake.
    through
        .status(v1::StatusRequest {
            resource: "lost:failover".into(),
        })
        .await
        .unwrap();
    s.proxy().drop_response_to(b"lost:failover");
    let sent = Instant::now();
    let lost = through
        .acquire(acquire("lost:failover", &request_id, None))
        .await;
    assert!(lost.is_err(), "the answer was dropped: {lost:?}");
    assert_eq!(s.proxy().counts().dropped_responses, 1, "the fault fired");
    let first = status(&s.url(s.leader), "lost:failover").await;
    assert!(first.held, "the first attempt was granted: {first:?}");
    // The leader that granted it dies; another takes over.
    let old = s.leader;
    s.cluster.nodes[old].kill9();
    let new = s.cluster.wait_leader(Some(old)).await;
    let mut direct = LeasesClient::connect(s.url(new)).await.unwrap();
    let ago = sent.elapsed().as_millis() as u64;
    let again = direct
        .acquire(acquire("lost:failover", &request_id, Some(ago)))
        .await
        .unwrap()
        .into_inner();
    let g = granted(again);
    assert!(g.repeat, "answered as the repeat it is");
    let lease = &g.leases[0];
    assert!(lease.ttl_ms <= 30_000 && lease.ttl_ms > 0, "{lease:?}");
    let held = status(&s.url(new), "lost:failover").await;
    assert_eq!(
        held.holder_token, lease.token,
        "the one lease the old leader granted"
    );
    let released = direct
        .release(v1::ReleaseRequest {
            resource: "lost:failover".into(),
            acquisition_id: lease.acquisition_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(released.released);
    assert!(
        !status(&s.url(new), "lost:failover").await.held,
        "no orphan"
    );
    // Repeated once more after the release: ended, nothing granted again.
    let ago = sent.elapsed().as_millis() as u64;
    let late = direct
        .acquire(acquire("lost:failover", &request_id, Some(ago)))
        .await
        .unwrap()
        .into_inner();
    let Some(v1::acquire_response::Outcome::NotAcquired(n)) = late.outcome else {
        panic!("a repeat after the release must not be granted: {late:?}");
    };
    assert_eq!(n.reason(), v1::not_acquired::Reason::Ended);
    assert!(!status(&s.url(new), "lost:failover").await.held);
    println!(
        "fault fired once; leader {old} killed, {new} took over; the repeat after {ago} ms found token {}",
        lease.token
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_acquire_whose_answer_is_lost_is_sent_again_on_the_resumed_session() {
    let s = Setup::start("lost_session").await;
    let leader = s.url(s.leader);
    let client = Client::connect(&s.servers()).await.unwrap();
    let session = client.open_session(Duration::from_secs(20)).await.unwrap();
    s.proxy().drop_response_to(b"lost:session");
    let lease = match session
        .acquire("lost:session", Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    };
    assert_eq!(s.proxy().counts().dropped_responses, 1, "the fault fired");
    let held = status(&leader, "lost:session").await;
    assert_eq!(
        held.holder_token,
        lease.token.get(),
        "one lease: the session's"
    );
    assert!(matches!(
        session
            .release("lost:session", &lease.acquisition_id)
            .await
            .unwrap(),
        Release::Released { .. }
    ));
    assert!(!status(&leader, "lost:session").await.held, "no orphan");
    println!(
        "session: fault fired once; token {} held once",
        lease.token.get()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_id_is_refused_naming_the_rule() {
    let s = Setup::start("bad_request_id").await;
    let mut c = LeasesClient::connect(s.url(s.leader)).await.unwrap();
    let err = c
        .acquire(acquire("bad:id", &[1; 15], None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("request_id is 15 bytes; it must be exactly 16"),
        "{err:?}"
    );
    let err = c
        .acquire(acquire("bad:id", &[], Some(5)))
        .await
        .unwrap_err();
    assert!(
        err.message()
            .contains("first_sent_ms_ago is set without a request_id"),
        "{err:?}"
    );
    assert!(
        !status(&s.url(s.leader), "bad:id").await.held,
        "nothing granted"
    );
}

/// Sends `request_id`'s acquire of `name` as a first attempt, and expects
/// it answered "ended", with the resource left free.
async fn late_first_attempt_is_ended(url: &str, name: &str, request_id: &[u8]) {
    let mut c = LeasesClient::connect(url.to_string()).await.unwrap();
    for first_sent_ms_ago in [None, Some(1_000)] {
        let late = c
            .acquire(acquire(name, request_id, first_sent_ms_ago))
            .await
            .unwrap()
            .into_inner();
        let Some(v1::acquire_response::Outcome::NotAcquired(n)) = late.outcome else {
            panic!("granted twice ({first_sent_ms_ago:?} ms): {late:?}");
        };
        assert_eq!(n.reason(), v1::not_acquired::Reason::Ended);
    }
    assert!(!status(url, name).await.held, "nothing granted");
    // Not a blanket refusal: a request never granted is served.
    granted(
        c.acquire(acquire(name, &[0x77; 16], None))
            .await
            .unwrap()
            .into_inner(),
    );
}

/// Acquires `name` under `request_id` and releases it, then grants
/// another resource (a grant commits the lazy release with it).
async fn acquire_and_release(url: &str, name: &str, request_id: &[u8]) {
    let mut c = LeasesClient::connect(url.to_string()).await.unwrap();
    let g = granted(
        c.acquire(acquire(name, request_id, None))
            .await
            .unwrap()
            .into_inner(),
    );
    let released = c
        .release(v1::ReleaseRequest {
            resource: name.into(),
            acquisition_id: g.leases[0].acquisition_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(released.released);
    granted(
        c.acquire(acquire("lost:other", &[], None))
            .await
            .unwrap()
            .into_inner(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_restart_is_ended_never_granted_again() {
    // The embedded store keeps the ended lease across a SIGKILL: the same
    // request, arriving late after the restart, is not a new one.
    let dir = baton_systest::TempDir::new("late-after-restart");
    let mut server = baton_systest::serve(dir.path(), &[]);
    let request_id = [0x6b; 16];
    acquire_and_release(&server.url(), "lost:restart", &request_id).await;
    server.restart();
    late_first_attempt_is_ended(&server.url(), "lost:restart", &request_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_after_a_failover_is_ended_never_granted_again() {
    // The cluster's store keeps it across the leader's SIGKILL: the new
    // leader answers the request the old one granted and saw released.
    let mut s = Setup::start("lost_late_failover").await;
    let request_id = [0x6c; 16];
    acquire_and_release(&s.url(s.leader), "lost:late", &request_id).await;
    let old = s.leader;
    s.cluster.nodes[old].kill9();
    let new = s.cluster.wait_leader(Some(old)).await;
    late_first_attempt_is_ended(&s.url(new), "lost:late", &request_id).await;
    println!("leader {old} killed after the release; {new} answered the late attempt ended");
}
