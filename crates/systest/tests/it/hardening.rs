//! Regression tests for the hardening defects, against real `baton serve`
//! processes: a lost or damaged store never restarts the token sequence,
//! idle sockets cannot lock a holder out, backups hold no usable
//! acquisition ids, non-UTF-8 names are the caller's error, readiness waits
//! for recovery, and a restore can start above what the resources recorded.

use std::io::Read;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_client::{Acquired, Client};
use baton_systest as common;
use common::{cli, eventually, json_u64, Proc, TempDir, BIN};

const TTL: Duration = Duration::from_secs(30);

async fn grant(url: &str, name: &str) -> baton_client::Lease {
    let mut c = Client::connect(url).await.unwrap();
    match c.acquire(name, Some(TTL), Duration::ZERO).await.unwrap() {
        Acquired::Granted(l) => l,
        other => panic!("{other:?}"),
    }
}

/// Runs `baton serve` expecting it to refuse to start: exit code and stderr.
fn serve_refused(data_dir: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(&*BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code(), text)
}

fn assert_clear_refusal(code: Option<i32>, text: &str, mentions: &str) {
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(mentions), "{text}");
    assert!(
        text.contains("baton admin restore"),
        "no recovery path in: {text}"
    );
    assert!(
        !text.contains("panicked") && !text.contains("backtrace"),
        "{text}"
    );
}

#[tokio::test]
async fn an_emptied_or_deleted_store_file_refuses_to_start_and_restore_continues_above() {
    let dir = TempDir::new("lost-store");
    let mut s = common::serve(dir.path(), &[]);
    let mut highest = 0;
    for i in 0..3 {
        highest = highest.max(grant(&s.url(), &format!("r{i}")).await.token.get());
    }
    s.kill9();
    let store = dir.path().join("baton.redb");
    std::fs::write(&store, b"").unwrap();
    let (code, text) = serve_refused(dir.path());
    assert_clear_refusal(code, &text, "is empty");
    std::fs::remove_file(&store).unwrap();
    let (code, text) = serve_refused(dir.path());
    assert_clear_refusal(code, &text, "is missing");
    assert!(!store.exists(), "a refused start must not create a store");

    let out = cli(&[
        "admin",
        "restore",
        "--empty",
        "--json",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    s.restart();
    let after = grant(&s.url(), "r0").await.token.get();
    assert!(
        after > highest,
        "token {after} after recovery is not above {highest}"
    );
}

#[tokio::test]
async fn a_damaged_store_file_is_one_clear_error_and_no_panic() {
    let dir = TempDir::new("damaged-store");
    let mut s = common::serve(dir.path(), &[]);
    grant(&s.url(), "d").await;
    s.kill9();
    let store = dir.path().join("baton.redb");
    let mut bytes = std::fs::read(&store).unwrap();
    let from = 4096.min(bytes.len());
    bytes[from..].fill(0);
    std::fs::write(&store, &bytes).unwrap();
    let (code, text) = serve_refused(dir.path());
    assert_clear_refusal(code, &text, "baton.redb");
}

#[tokio::test]
async fn backups_and_the_store_never_hold_an_acquisition_id() {
    let dir = TempDir::new("no-ids");
    let files = TempDir::new("no-ids-files");
    let mut s = common::serve(dir.path(), &[]);
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(grant(&s.url(), &format!("job:{i}")).await.acquisition_id);
    }
    let backup = files.path().join("b.backup");
    let out = cli(&[
        "admin",
        "backup",
        "--json",
        "--out",
        backup.to_str().unwrap(),
        "--server",
        &s.url(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        json_u64(&String::from_utf8_lossy(&out.stdout), "n_leases"),
        Some(20)
    );
    s.terminate();
    let mut haystacks = vec![std::fs::read(&backup).unwrap()];
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        haystacks.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    for id in &ids {
        for bytes in &haystacks {
            assert!(
                !bytes.windows(16).any(|w| w == id.as_bytes()),
                "an acquisition id is on disk"
            );
        }
    }
    // The leases survive the restart and their holders still prove ownership.
    s.restart();
    let mut c = Client::connect(&s.url()).await.unwrap();
    assert!(matches!(
        c.renew("job:0", &ids[0]).await.unwrap(),
        baton_client::Renewal::Renewed { .. }
    ));
}

#[tokio::test]
async fn a_name_that_is_not_utf8_is_invalid_argument() {
    let dir = TempDir::new("utf8");
    let s = common::serve(dir.path(), &[]);
    // AcquireRequest { resources: [0xff, 0xfe] }, sent as raw bytes.
    let channel = tonic::transport::Endpoint::from_shared(s.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/baton.v1.Leases/Acquire");
    let err = grpc
        .unary(
            tonic::Request::new(vec![0x0a, 0x02, 0xff, 0xfe]),
            path,
            raw::Codec,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("UTF-8"), "{}", err.message());
    grant(&s.url(), "still-serving").await;
}

/// A codec that sends bytes as they are, to put malformed messages on the wire.
mod raw {
    use tonic::codec::{DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    pub struct Codec;
    pub struct Enc;
    pub struct Dec;

    impl tonic::codec::Codec for Codec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Enc;
        type Decoder = Dec;
        fn encoder(&mut self) -> Enc {
            Enc
        }
        fn decoder(&mut self) -> Dec {
            Dec
        }
    }

    impl Encoder for Enc {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
            use bytes::BufMut;
            buf.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Dec {
        type Item = Vec<u8>;
        type Error = Status;
        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            use bytes::Buf;
            Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
        }
    }
}

/// Keeps `n` idle sockets open against `addr`, reopening every one the
/// server closes, until `stop`. Counts the reopenings.
fn hold_idle_sockets(
    addr: std::net::SocketAddr,
    n: usize,
    stop: Arc<AtomicBool>,
    reopened: Arc<AtomicU64>,
) {
    let open = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    };
    let mut sockets: Vec<TcpStream> = (0..n).map(|_| open()).collect();
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        for s in sockets.iter_mut() {
            let closed = match s.read(&mut buf) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            };
            if closed {
                *s = open();
                reopened.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Pace the attacker's loop; the test waits on the holder's renewals.
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_up_to_the_limit_do_not_lock_out_a_holder_that_reconnects() {
    let dir = TempDir::new("idle");
    let limit = 64;
    let s = common::serve(
        dir.path(),
        &[
            "--max-connections",
            &limit.to_string(),
            "--handshake-timeout",
            "2s",
        ],
    );
    let lease = grant(&s.url(), "held").await;
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicU64::new(0));
    let attacker = {
        let (stop, reopened, addr) = (stop.clone(), reopened.clone(), s.grpc);
        std::thread::spawn(move || hold_idle_sockets(addr, limit, stop, reopened))
    };
    eventually(Duration::from_secs(10), async || {
        s.metric("baton_connections") >= limit as u64
    })
    .await;
    let mut renewed = 0;
    let mut renew_over_fresh_connections = async || {
        for _ in 0..5 {
            // A fresh connection each time, as a holder whose connection broke.
            let mut c = Client::connect(&s.url())
                .await
                .expect("connect during the attack");
            match c
                .renew("held", &lease.acquisition_id)
                .await
                .expect("renew during the attack")
            {
                baton_client::Renewal::Renewed { token, .. } => assert_eq!(token, lease.token),
                other => panic!("{other:?}"),
            }
            renewed += 1;
        }
    };
    renew_over_fresh_connections().await;
    // The handshake deadline closes idle sockets even without newcomers; the
    // attacker opens them again, and the holder still gets in.
    eventually(Duration::from_secs(10), async || {
        s.metric("baton_connections_closed_idle_total") >= limit as u64 / 2
            && reopened.load(Ordering::Relaxed) >= limit as u64 / 2
    })
    .await;
    renew_over_fresh_connections().await;
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    let evicted = s.metric("baton_connections_evicted_total");
    let closed_idle = s.metric("baton_connections_closed_idle_total");
    let refused = s.metric("baton_connections_refused_total");
    println!(
        "idle-socket attack: {limit} sockets held, {} reopened by the attacker, {evicted} evicted, \
         {closed_idle} closed at the handshake deadline, {refused} refused; holder renewed {renewed} times over fresh connections",
        reopened.load(Ordering::Relaxed)
    );
    assert!(
        evicted >= 1,
        "the holder's connections never needed an eviction: the attack did not fill the limit"
    );
}

#[tokio::test]
async fn readyz_waits_for_recovery_and_the_gauges_are_set_from_it() {
    use baton_core::{AcquisitionId, Epoch, FencingToken, LeaseRecord, ResourceName, Write};
    use baton_store::LeaseStore;
    let dir = TempDir::new("ready");
    let n_leases = 300_000u64;
    {
        let mut store = baton_store::RedbStore::open(dir.path()).unwrap();
        let writes: Vec<Write> = (1..=n_leases)
            .map(|i| Write::PutLease {
                resource: ResourceName::parse(&format!("fill:{i}")).unwrap(),
                record: LeaseRecord {
                    acquisition_digest: AcquisitionId::from_bytes([1; 16]).digest(),
                    token: FencingToken::new(Epoch::FIRST, i).unwrap(),
                    ttl_ms: 600_000,
                    session: None,
                    holder: None,
                    shape: baton_core::Shape::Exclusive,
                },
            })
            .chain([Write::Tokens {
                epoch: Epoch::FIRST,
                counter: n_leases,
            }])
            .collect();
        store.commit(&writes).unwrap();
    }
    let http = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let server = Proc::spawn(
        Command::new(&*BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                &http.to_string(),
            ])
            .arg("--data-dir")
            .arg(dir.path())
            .stderr(Stdio::null()),
        "baton server",
    );
    let get = |path: &str| -> Option<String> {
        use std::io::Write as _;
        let mut s = TcpStream::connect(http).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let (mut not_ready, mut alive_while_loading) = (0, 0);
    eventually(Duration::from_secs(30), async || {
        let ready = get("/readyz");
        if ready
            .as_deref()
            .is_some_and(|r| r.starts_with("HTTP/1.1 503"))
        {
            not_ready += 1;
            if get("/healthz").is_some_and(|r| r.starts_with("HTTP/1.1 200")) {
                alive_while_loading += 1;
            }
        }
        ready.is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    let metrics = get("/metrics").unwrap();
    drop(server);
    println!("readyz: {not_ready} answers 503 while {n_leases} leases loaded ({alive_while_loading} with /healthz 200)");
    assert!(
        not_ready >= 1,
        "never saw the server not ready during recovery"
    );
    assert!(alive_while_loading >= 1);
    assert!(
        metrics.contains(&format!("baton_leases {n_leases}\n")),
        "the lease gauge is not set from recovery"
    );
}

#[tokio::test]
async fn restore_starts_above_every_token_the_resources_recorded() {
    use baton_fence::sqlite::SqliteFence;
    use baton_fence::FenceRequest;
    let dir = TempDir::new("floor");
    let files = TempDir::new("floor-files");
    let mut s = common::serve(dir.path(), &[]);
    grant(&s.url(), "doc").await;
    s.kill9();
    // Tokens from a history this directory does not know (another restore,
    // a clock set back): the resources saw epoch 900.
    let recorded = (900u64 << 40) | 7;
    let db = files.path().join("fence.db");
    let mut conn = rusqlite::Connection::open(&db).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    let token = baton_fence::FencingToken::of(recorded).unwrap();
    let req = FenceRequest::new("doc", token, "op-1", b"f", b"r").unwrap();
    SqliteFence::write(&mut conn, &req, |_| Ok::<(), baton_fence::FenceError>(())).unwrap();
    drop(conn);
    let pg = baton_testkit::PgDb::create("baton_restore_floor").await;
    let mut client = pg.connect().await;
    baton_fence::postgres::PgFence::migrate(&mut client)
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "SELECT baton.fence('doc', {}, 'op-2', '\\x01'::bytea)",
            recorded + 5
        ))
        .await
        .unwrap();

    let sqlite_url = format!("sqlite:{}", db.display());
    let out = cli(&[
        "admin",
        "restore",
        "--empty",
        "--json",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--floor-from",
        &sqlite_url,
        "--floor-from",
        &pg.url,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        json_u64(&text, "resources_floor"),
        Some(recorded + 5),
        "{text}"
    );
    assert!(json_u64(&text, "epoch").unwrap() >= 901, "{text}");
    s.restart();
    let after = grant(&s.url(), "doc").await.token.get();
    assert!(after > recorded + 5, "{after}");

    // A source that is neither is the operator's error.
    s.kill9();
    let out = cli(&[
        "admin",
        "restore",
        "--empty",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--floor-from",
        "mysql://x",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = cli(&[
        "admin",
        "restore",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--from or --empty is required: {out:?}"
    );
}

#[tokio::test]
async fn an_unreadable_identity_and_store_need_a_floor_and_then_restore() {
    let dir = TempDir::new("garbage-identity");
    let mut s = common::serve(dir.path(), &[]);
    let before = grant(&s.url(), "g").await.token.get();
    s.kill9();
    std::fs::write(dir.path().join("baton.identity"), "garbage").unwrap();
    std::fs::write(dir.path().join("baton.redb"), "junk").unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let out = cli(&["admin", "restore", "--empty", "--data-dir", data_dir]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--floor-from"),
        "{out:?}"
    );
    let min_epoch = ((before >> 40) + 1).to_string();
    let out = cli(&[
        "admin",
        "restore",
        "--empty",
        "--data-dir",
        data_dir,
        "--min-epoch",
        &min_epoch,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    s.restart();
    assert!(grant(&s.url(), "g").await.token.get() > before);
}
