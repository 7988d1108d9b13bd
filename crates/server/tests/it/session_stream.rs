//! The server's session stream, in process against the lease engine on
//! an in-memory store, speaking the wire protocol itself: answers by id
//! in any order, the rules that answer one request and those that end the
//! stream, the limits, and a half-close (the rules `baton.proto` states).

use std::time::Duration;

use baton_client::{Acquired, AcquiredAll, Client};
use baton_proto::v1::{
    self, leases_client::LeasesClient, session_request::Op, session_response::Body,
};
use baton_server::{start_with_store, RunningServer, ServerConfig};
use baton_testkit::eventually;
use baton_testkit::store::MemStore;
use tokio_stream::wrappers::ReceiverStream;

/// A server on an in-memory store; `max_sessions` caps the open sessions.
async fn serve(max_sessions: Option<usize>) -> (RunningServer, String) {
    let mut config = ServerConfig::ephemeral(std::env::temp_dir().join("unused-in-memory"));
    if let Some(n) = max_sessions {
        config.limits.n_sessions_max = n;
    }
    let server = start_with_store(config, Box::new(MemStore::default()))
        .await
        .expect("start");
    let url = format!("http://{}", server.grpc_addr);
    (server, url)
}

/// A session stream with `requests` already sent; the sender keeps the
/// client's side open until it is dropped.
async fn stream_with(
    url: &str,
    requests: Vec<v1::SessionRequest>,
) -> (
    tokio::sync::mpsc::Sender<v1::SessionRequest>,
    tonic::Streaming<v1::SessionResponse>,
) {
    let mut lc = LeasesClient::connect(url.to_string()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for r in requests {
        tx.send(r).await.unwrap();
    }
    let stream = lc
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, stream)
}

fn granted(a: Acquired) -> baton_client::Lease {
    match a {
        Acquired::Granted(l) => l,
        other => panic!("not granted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_come_back_by_id_while_a_wait_is_pending() {
    let (_server, url) = serve(None).await;
    let client = Client::connect(&url).await.unwrap();
    let mut c = client.clone();
    let held = granted(
        c.acquire("s:slow", Some(Duration::from_secs(5)), Duration::ZERO)
            .await
            .unwrap(),
    );
    let session = client.open_session(Duration::from_secs(2)).await.unwrap();
    let waiter = session.clone();
    let wait = tokio::spawn(async move { waiter.acquire("s:slow", Duration::from_secs(10)).await });
    // While the first request waits, later ones on the same stream are answered.
    let mut own_ttl = Vec::new();
    for i in 0..20 {
        let AcquiredAll::Granted { mut leases, .. } = session
            .acquire_with_ttl(
                &[&format!("s:quick:{i}")],
                Duration::from_secs(1),
                Duration::ZERO,
            )
            .await
            .unwrap()
        else {
            panic!()
        };
        own_ttl.push(leases.pop().unwrap());
    }
    assert!(!wait.is_finished(), "the waiting acquire is still waiting");
    // Leases with their own TTL renew on the stream, and expire without it.
    let l = &own_ttl[0];
    assert!(matches!(
        session.renew(&l.resource, &l.acquisition_id).await.unwrap(),
        baton_client::Renewal::Renewed { .. }
    ));
    c.release(&held.resource, &held.acquisition_id)
        .await
        .unwrap();
    let got = granted(wait.await.unwrap().unwrap());
    assert!(got.token > held.token);
    eventually(Duration::from_secs(3), async || {
        c.status(&own_ttl[5].resource)
            .await
            .unwrap()
            .holder_token
            .is_none()
    })
    .await;
    assert_eq!(
        c.status("s:slow").await.unwrap().holder_token,
        Some(got.token)
    );
}

async fn raw(
    url: &str,
    requests: Vec<v1::SessionRequest>,
) -> Result<Vec<v1::SessionResponse>, tonic::Status> {
    let mut c = LeasesClient::connect(url.to_string()).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for r in requests {
        tx.send(r).await.unwrap();
    }
    let mut stream = c.session(ReceiverStream::new(rx)).await?.into_inner();
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
            Ok(Ok(Some(m))) => out.push(m),
            Ok(Ok(None)) | Err(_) => return Ok(out),
            Ok(Err(status)) => return if out.is_empty() { Err(status) } else { Ok(out) },
        }
    }
}

fn req(id: u64, op: Op) -> v1::SessionRequest {
    v1::SessionRequest {
        id,
        op: Some(op),
        traceparent: String::new(),
    }
}

/// An acquire of `resource` tied to the session, waiting up to `wait_ms`.
fn acquire(resource: &str, wait_ms: u64) -> Op {
    Op::Acquire(v1::SessionAcquire {
        resources: vec![resource.into()],
        ttl_ms: None,
        wait_ms,
        holder: None,
        request_id: Vec::new(),
        first_sent_ms_ago: None,
        shapes: Vec::new(),
    })
}

fn open(ttl_ms: u64) -> Op {
    Op::Open(v1::OpenSession {
        ttl_ms: Some(ttl_ms),
        resume: vec![],
        batches: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_session_protocol_gets_errors_that_name_the_rule() {
    let (_server, url) = serve(None).await;
    let code = |r: Result<Vec<v1::SessionResponse>, tonic::Status>| match r {
        Err(status) => (status.code(), status.message().to_string()),
        Ok(out) => panic!("expected a refusal, got {out:?}"),
    };
    let (c, m) = code(raw(&url, vec![req(1, Op::Heartbeat(v1::Heartbeat {}))]).await);
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains("must be `open`"), "{m}");
    let (c, m) = code(raw(&url, vec![req(1, open(5))]).await);
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains("session ttl 5ms is out of range"), "{m}");
    // A TTL that is present is a TTL: 0 is refused, not "the default".
    let (c, m) = code(raw(&url, vec![req(1, open(0))]).await);
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains("session ttl 0ms is out of range"), "{m}");
    let bad_resume = Op::Open(v1::OpenSession {
        ttl_ms: None,
        resume: vec![1, 2, 3],
        batches: false,
    });
    let (c, m) = code(raw(&url, vec![req(1, bad_resume)]).await);
    assert_eq!(c, tonic::Code::InvalidArgument);
    assert!(m.contains("resume is 3 bytes"), "{m}");
    // An unknown session is not resumed, and nothing is created.
    let unknown = Op::Open(v1::OpenSession {
        ttl_ms: None,
        resume: vec![7; 16],
        batches: false,
    });
    let out = raw(&url, vec![req(4, unknown)]).await.unwrap();
    assert!(
        matches!(
            out.as_slice(),
            [v1::SessionResponse {
                id: 4,
                body: Some(Body::Ended(_))
            }]
        ),
        "{out:?}"
    );
    // Per-request errors keep the stream; a second open ends it.
    let bad_name = acquire(" x", 0);
    let out = raw(
        &url,
        vec![
            req(1, open(1_000)),
            req(2, bad_name),
            req(
                3,
                Op::Release(v1::ReleaseRequest {
                    resource: "a".into(),
                    acquisition_id: vec![1],
                }),
            ),
            req(5, open(1_000)),
            req(6, Op::Heartbeat(v1::Heartbeat {})),
        ],
    )
    .await
    .unwrap();
    let body = |id: u64| out.iter().find(|r| r.id == id).and_then(|r| r.body.clone());
    assert!(matches!(body(1), Some(Body::Opened(_))), "{out:?}");
    let Some(Body::Error(e)) = body(2) else {
        panic!("{out:?}")
    };
    assert_eq!(e.code, tonic::Code::InvalidArgument as i32);
    assert!(e.message.contains("resources[0]"), "{}", e.message);
    let Some(Body::Error(e)) = body(3) else {
        panic!("{out:?}")
    };
    assert!(
        e.message.contains("acquisition_id is 1 bytes"),
        "{}",
        e.message
    );
    assert!(
        body(6).is_none(),
        "nothing is answered after a second open: {out:?}"
    );
    // The server still serves.
    let mut c = Client::connect(&url).await.unwrap();
    granted(
        c.acquire("s:fine", Some(Duration::from_secs(1)), Duration::ZERO)
            .await
            .unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_request_id_and_the_session_limit_are_refused_by_rule() {
    let (_server, url) = serve(Some(1)).await;
    let mut c = Client::connect(&url).await.unwrap();
    let held = granted(
        c.acquire("l:busy", Some(Duration::from_secs(5)), Duration::ZERO)
            .await
            .unwrap(),
    );
    // Request 2 waits for l:busy; a second request 2 while it waits is refused.
    let wait = acquire("l:busy", 10_000);
    let again = Op::Heartbeat(v1::Heartbeat {});
    let (tx, mut stream) =
        stream_with(&url, vec![req(1, open(1_000)), req(2, wait), req(2, again)]).await;
    let opened = stream.message().await.unwrap().unwrap();
    assert!(matches!(opened.body, Some(Body::Opened(_))), "{opened:?}");
    let refused = stream.message().await.unwrap().unwrap();
    let Some(Body::Error(e)) = refused.body else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (refused.id, e.code),
        (2, tonic::Code::InvalidArgument as i32)
    );
    assert!(e.message.contains("already in use"), "{}", e.message);
    // The server holds one session at most: another open is refused by name.
    let err = client_open(&url).await;
    assert_eq!(err.0, tonic::Code::ResourceExhausted, "{}", err.1);
    assert!(err.1.contains("open sessions"), "{}", err.1);
    // The first stream still works: the wait is granted once l:busy is free.
    c.release(&held.resource, &held.acquisition_id)
        .await
        .unwrap();
    let granted_on_stream = stream.message().await.unwrap().unwrap();
    assert_eq!(granted_on_stream.id, 2);
    assert!(
        matches!(
            granted_on_stream.body,
            Some(Body::Acquire(v1::AcquireResponse {
                outcome: Some(v1::acquire_response::Outcome::Granted(_))
            }))
        ),
        "{granted_on_stream:?}"
    );
    drop(tx);
}

async fn client_open(url: &str) -> (tonic::Code, String) {
    match raw(url, vec![req(1, open(1_000))]).await {
        Err(status) => (status.code(), status.message().to_string()),
        Ok(out) => panic!("expected a refusal, got {out:?}"),
    }
}

/// Half-close, as the proto says: the stream ends, an acquire still
/// waiting is withdrawn (the resource goes to nobody when it frees), and
/// the session lives on: it can be resumed within its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_close_withdraws_the_wait_and_the_session_lives_on() {
    let (_server, url) = serve(None).await;
    let mut c = Client::connect(&url).await.unwrap();
    let held = granted(
        c.acquire("h:busy", Some(Duration::from_secs(5)), Duration::ZERO)
            .await
            .unwrap(),
    );
    let wait = acquire("h:busy", 10_000);
    let (tx, mut stream) = stream_with(&url, vec![req(1, open(5_000)), req(2, wait)]).await;
    let Some(Body::Opened(opened)) = stream.message().await.unwrap().unwrap().body else {
        panic!("the first answer is `opened`")
    };
    // The wait is registered before the half-close (a second answer is
    // not due: the resource is held).
    eventually(Duration::from_secs(2), async || {
        c.status("h:busy").await.unwrap().n_waiters == 1
    })
    .await;
    drop(tx);
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the stream ends after a half-close");
    assert!(
        matches!(end, Ok(None)),
        "ends with OK and no answer to the wait: {end:?}"
    );
    // The withdrawn wait is not granted when the holder lets go.
    eventually(Duration::from_secs(2), async || {
        c.status("h:busy").await.unwrap().n_waiters == 0
    })
    .await;
    c.release(&held.resource, &held.acquisition_id)
        .await
        .unwrap();
    assert_eq!(c.status("h:busy").await.unwrap().holder_token, None);
    // The session itself lives on.
    let resume = Op::Open(v1::OpenSession {
        ttl_ms: None,
        resume: opened.session_id.clone(),
        batches: false,
    });
    let out = raw(&url, vec![req(1, resume)]).await.unwrap();
    assert!(
        matches!(out.first().and_then(|r| r.body.as_ref()), Some(Body::Opened(o)) if o.resumed),
        "{out:?}"
    );
}

fn batch(requests: Vec<v1::SessionRequest>) -> Op {
    Op::Batch(v1::SessionBatch { requests })
}

/// Reads answers (a batch message counts as each of its answers) until
/// every id of `ids` has one; how many messages carried them.
async fn answers_to(
    stream: &mut tonic::Streaming<v1::SessionResponse>,
    ids: &[u64],
) -> (std::collections::BTreeMap<u64, Body>, usize) {
    let mut got = std::collections::BTreeMap::new();
    let mut n_messages = 0;
    while !ids.iter().all(|id| got.contains_key(id)) {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("an answer within 10 s")
            .unwrap()
            .expect("the stream goes on");
        n_messages += 1;
        let answers = match message.body {
            Some(Body::Batch(b)) => b.answers,
            _ => vec![message],
        };
        for a in answers {
            assert!(
                !matches!(a.body, Some(Body::Batch(_))),
                "a batch inside a batch"
            );
            assert!(
                got.insert(a.id, a.body.unwrap()).is_none(),
                "request {} answered twice",
                a.id
            );
        }
    }
    (got, n_messages)
}

fn is_granted(body: &Body) -> bool {
    matches!(
        body,
        Body::Acquire(v1::AcquireResponse {
            outcome: Some(v1::acquire_response::Outcome::Granted(_))
        })
    )
}

/// A batch is taken in order, each request as if alone and answered by
/// its own id; a client that asked for batches may get its answers in
/// one, a client that did not never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_taken_in_order_and_each_request_answered_by_its_id() {
    let (_server, url) = serve(None).await;
    for reads_batches in [true, false] {
        let open = Op::Open(v1::OpenSession {
            ttl_ms: Some(5_000),
            resume: vec![],
            batches: reads_batches,
        });
        let tag = if reads_batches { "b" } else { "n" };
        let (one, two) = (format!("batch:{tag}:1"), format!("batch:{tag}:2"));
        let requests = vec![
            req(1, acquire(&one, 0)),
            req(2, acquire(&two, 0)),
            // Taken after request 1: held, so not acquired.
            req(3, acquire(&one, 0)),
            req(4, Op::Heartbeat(v1::Heartbeat {})),
        ];
        let (tx, mut stream) =
            stream_with(&url, vec![req(0, open), req(99, batch(requests))]).await;
        let opened = stream.message().await.unwrap().unwrap();
        let Some(Body::Opened(opened)) = opened.body else {
            panic!("{opened:?}")
        };
        assert!(opened.batches, "the server says it takes batches");
        let (got, n_messages) = answers_to(&mut stream, &[1, 2, 3, 4]).await;
        assert!(is_granted(&got[&1]) && is_granted(&got[&2]), "{got:?}");
        assert!(
            matches!(
                &got[&3],
                Body::Acquire(v1::AcquireResponse {
                    outcome: Some(v1::acquire_response::Outcome::NotAcquired(_))
                })
            ),
            "request 3 came after request 1 took the resource: {got:?}"
        );
        assert!(matches!(got[&4], Body::Heartbeat(_)), "{got:?}");
        assert!(
            !got.contains_key(&99),
            "a batch taken is not answered itself"
        );
        if !reads_batches {
            assert_eq!(n_messages, 4, "one message an answer without batches");
        }
        drop(tx);
    }
}

/// A batch that breaks a rule is answered by its own id naming the rule,
/// none of its requests is taken, and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_breaks_a_rule_is_refused_whole() {
    let (_server, url) = serve(None).await;
    let mut c = Client::connect(&url).await.unwrap();
    let too_many = (1..=257)
        .map(|i| req(i, acquire(&format!("refused:many:{i}"), 0)))
        .collect();
    let with_open = vec![req(1, acquire("refused:open", 0)), req(2, open(1_000))];
    let nested = vec![
        req(1, acquire("refused:nested", 0)),
        req(2, batch(vec![req(3, acquire("refused:inner", 0))])),
    ];
    let cases = [
        (10, batch(Vec::new()), "a batch holds 1 to 256 requests"),
        (11, batch(too_many), "a batch holds 1 to 256 requests"),
        (12, batch(with_open), "may not hold `open` or another batch"),
        (13, batch(nested), "may not hold `open` or another batch"),
    ];
    let mut requests = vec![req(0, open(5_000))];
    requests.extend(cases.iter().map(|(id, op, _)| req(*id, op.clone())));
    requests.push(req(20, Op::Heartbeat(v1::Heartbeat {})));
    let (tx, mut stream) = stream_with(&url, requests).await;
    let opened = stream.message().await.unwrap().unwrap();
    assert!(matches!(opened.body, Some(Body::Opened(_))), "{opened:?}");
    let (got, _) = answers_to(&mut stream, &[10, 11, 12, 13, 20]).await;
    for (id, _, rule) in &cases {
        let Body::Error(e) = &got[id] else {
            panic!("batch {id}: {:?}", got[id])
        };
        assert_eq!(e.code, tonic::Code::InvalidArgument as i32, "batch {id}");
        assert!(e.message.contains(rule), "batch {id}: {}", e.message);
    }
    assert!(matches!(got[&20], Body::Heartbeat(_)), "the stream goes on");
    assert_eq!(got.len(), 5, "nothing inside a refused batch was answered");
    for name in [
        "refused:many:1",
        "refused:open",
        "refused:nested",
        "refused:inner",
    ] {
        let status = c.status(name).await.unwrap();
        assert!(status.holder_token.is_none(), "{name} was taken");
    }
    drop(tx);
}
