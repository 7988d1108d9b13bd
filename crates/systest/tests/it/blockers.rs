//! Why an acquire was refused, against a real `baton serve` with an auth
//! file: a refused try-once request, a wait that ran out and a partly
//! blocked multi-acquire each name every blocker with its holder, how long
//! it has held it, its TTL left (or its session) and the line ahead; a
//! caller without `read` gets the tokens and counts only; after a
//! `kill -9`, a recovered lease says it is held since the restart.

use std::time::Duration;

use baton_client::{Acquired, AcquiredAll, Blocker, Client, ConnectOptions, NotAcquired};
use baton_systest as common;
use baton_testkit::pki::token_sha256;
use common::{Server, TempDir, BIN};

const OWNER: &str = "owner-token-41d0";
const PEER: &str = "peer-token-9c2a";
const BLIND: &str = "blind-token-77e5";

fn serve(dir: &std::path::Path) -> Server {
    let auth = dir.join("auth.toml");
    let principal = |name: &str, token: &str, perms: &str| {
        format!(
            "[[principal]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\nrules = {{ \"\" = [{perms}] }}\n",
            token_sha256(token)
        )
    };
    let text = [
        principal("owner", OWNER, "\"read\", \"lease\""),
        principal("peer", PEER, "\"read\", \"lease\""),
        principal("blind", BLIND, "\"lease\""),
    ]
    .join("\n");
    std::fs::write(&auth, text).unwrap();
    Server::start(
        &BIN,
        &dir.join("data"),
        &["--auth-file", auth.to_str().unwrap()],
    )
}

async fn client(url: &str, token: &str, holder: &str) -> Client {
    Client::connect_with(url, ConnectOptions::default().token(token).unwrap())
        .await
        .unwrap()
        .with_rpc_timeout(Duration::from_secs(5))
        .with_holder(baton_client::baton_core::Holder::parse(holder).unwrap())
}

async fn refused(c: &mut Client, names: &[&str], wait: Duration) -> NotAcquired {
    match c
        .acquire_all(names, Some(Duration::from_secs(30)), wait)
        .await
        .unwrap()
    {
        AcquiredAll::NotAcquired(n) => n,
        other => panic!("{names:?} granted: {other:?}"),
    }
}

fn names(blockers: &[Blocker]) -> Vec<&str> {
    blockers.iter().map(|b| b.resource.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_each_blocker_in_full_only_to_a_reader() {
    let dir = TempDir::new("blockers");
    let mut s = serve(dir.path());
    let url = s.url();
    let mut owner = client(&url, OWNER, "owner 1 @ host-a").await;
    let Acquired::Granted(a) = owner
        .acquire("job:a", Some(Duration::from_secs(30)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let session = owner.open_session(Duration::from_secs(30)).await.unwrap();
    assert!(matches!(
        session.acquire("job:b", Duration::ZERO).await.unwrap(),
        Acquired::Granted(_)
    ));
    let waiting = {
        let url = url.clone();
        tokio::spawn(async move {
            let mut c = client(&url, PEER, "peer waiting").await;
            c.acquire(
                "job:a",
                Some(Duration::from_secs(30)),
                Duration::from_secs(20),
            )
            .await
        })
    };
    common::eventually(Duration::from_secs(10), async || {
        owner.status("job:a").await.unwrap().n_waiters == 1
    })
    .await;

    // A reader: every blocker in request order, in full.
    let mut peer = client(&url, PEER, "peer 2").await;
    let n = refused(&mut peer, &["job:free", "job:a", "job:b"], Duration::ZERO).await;
    assert!(!n.timed_out);
    assert_eq!(
        (n.resource.as_deref(), n.holder_token),
        (Some("job:a"), Some(a.token))
    );
    assert_eq!(names(&n.blockers), ["job:a", "job:b"]);
    let (ba, bb) = (&n.blockers[0], &n.blockers[1]);
    assert!(ba.readable && bb.readable);
    assert_eq!((ba.n_holders, ba.n_waiters_ahead), (1, 1));
    let ha = &ba.holders[0];
    assert_eq!(ha.token, a.token);
    assert_eq!(ha.holder.as_deref(), Some("owner 1 @ host-a"));
    assert!(ha.held_for.unwrap() < Duration::from_secs(20));
    assert!(!ha.held_since_recovery && !ha.session_bound);
    let left = ha.remaining.unwrap();
    assert!(
        left > Duration::from_secs(20) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    let hb = &bb.holders[0];
    assert_eq!(hb.holder.as_deref(), Some("owner 1 @ host-a"));
    assert!(hb.session_bound && hb.remaining.is_none(), "{hb:?}");

    // A wait that runs out: behind the first waiter, one ahead.
    let n = refused(&mut peer, &["job:a"], Duration::from_millis(300)).await;
    assert!(n.timed_out);
    assert_eq!(names(&n.blockers), ["job:a"]);
    assert_eq!(n.blockers[0].n_waiters_ahead, 1);
    assert_eq!(n.blockers[0].holders[0].token, a.token);

    // Without `read`: the tokens and the counts, nothing else.
    let mut blind = client(&url, BLIND, "blind 3").await;
    let n = refused(&mut blind, &["job:a", "job:b"], Duration::ZERO).await;
    for b in &n.blockers {
        assert!(!b.readable, "{b:?}");
        assert_eq!(b.n_holders, 1);
        let h = &b.holders[0];
        assert!(
            h.holder.is_none() && h.held_for.is_none() && h.remaining.is_none() && !h.session_bound,
            "{h:?}"
        );
    }
    assert_eq!(n.blockers[0].holders[0].token, a.token);
    assert_eq!(n.blockers[0].n_waiters_ahead, 1);
    let n = refused(&mut blind, &["job:b"], Duration::from_millis(200)).await;
    assert!(n.timed_out && !n.blockers[0].readable);
    assert!(n.blockers[0].holders[0].holder.is_none());

    // On a session stream, the same answer.
    let on_session = peer.open_session(Duration::from_secs(30)).await.unwrap();
    let Acquired::NotAcquired(n) = on_session.acquire("job:a", Duration::ZERO).await.unwrap()
    else {
        panic!("held")
    };
    assert_eq!(
        n.blockers[0].holders[0].holder.as_deref(),
        Some("owner 1 @ host-a")
    );
    drop(on_session);

    // After a kill -9 the lease is held since the restart, and says so.
    waiting.abort();
    s.restart();
    let mut peer = client(&url, PEER, "peer 4").await;
    let n = refused(&mut peer, &["job:a"], Duration::ZERO).await;
    let h = &n.blockers[0].holders[0];
    assert_eq!(h.token, a.token);
    assert!(h.held_since_recovery, "{h:?}");
    assert_eq!(h.holder.as_deref(), Some("owner 1 @ host-a"));
    drop(session);
}
