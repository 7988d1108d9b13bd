//! Fenced leader election against a real server: `baton elect`
//! candidates as processes, the leader SIGKILLed, observers (the Rust
//! `Observer` and `baton observe`) see every hand-over with rising tokens
//! and no gap, and a deposed leader's late write is refused by the fence
//! kit.

use std::process::{Command, Stdio};
use std::time::Duration;

use baton_client::{Client, WatchKind};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{FenceRequest, FencingToken, Outcome};
use baton_systest as common;
use common::{json_str, json_u64, Proc, TempDir, BIN};

/// A `baton elect NAME --value VALUE --ttl 2s --json` process.
fn candidate(url: &str, value: &str) -> Proc {
    Proc::spawn(
        Command::new(&*BIN)
            .args([
                "elect", "e:sched", "--value", value, "--ttl", "2s", "--json",
            ])
            .args(["--server", url])
            .stderr(Stdio::null()),
        "candidate",
    )
}

/// The candidate's first line: its leadership, printed once elected.
fn leadership(candidate: &mut Proc) -> (String, u64) {
    let (_, line) = candidate.next_line();
    (
        json_str(&line, "value").unwrap_or_else(|| panic!("{line:?}")),
        json_u64(&line, "token").unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_hand_over_in_order_and_a_deposed_leader_is_fenced() {
    let dir = TempDir::new("election");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let client = Client::connect(&url).await.unwrap();
    let election = client.election("e:sched").unwrap();
    let mut observer = election.observe().await.unwrap();
    assert_eq!(observer.current(), None);
    let mut cli_observer = Proc::spawn(
        Command::new(&*BIN).args(["observe", "e:sched", "--json", "--server", &url]),
        "baton observe",
    );
    // Its first line (no leader yet) says its watch is registered: only
    // then may the first candidate join, or `observe` would start from
    // "current: c1" instead of seeing the grant.
    let (_, first) = cli_observer.next_line();
    assert_eq!(
        (json_str(&first, "kind"), json_u64(&first, "token")),
        (Some("current".into()), None),
        "{first}"
    );

    // Candidates join one after another, so the line is c1, c2, c3.
    let mut candidates = Vec::new();
    for (i, value) in ["c1", "c2", "c3"].into_iter().enumerate() {
        candidates.push(candidate(&url, value));
        common::eventually(Duration::from_secs(10), async || {
            let st = Client::connect(&url)
                .await
                .unwrap()
                .status("e:sched")
                .await
                .unwrap();
            st.holder_token.is_some() && st.n_waiters as usize == i
        })
        .await;
    }
    let mut changes = Vec::new();
    let mut leaders = Vec::new();
    for (i, child) in candidates.iter_mut().enumerate() {
        let (value, token) = leadership(child);
        assert_eq!(value, format!("c{}", i + 1));
        leaders.push(token);
        assert_eq!(
            election
                .leader()
                .await
                .unwrap()
                .map(|l| (l.token.get(), l.value)),
            Some((token, Some(value.clone())))
        );
        // The leader dies without a word; its session expires one TTL
        // later and the next in line leads.
        child.kill9();
        while changes.len() < 2 * (i + 1) {
            let c = tokio::time::timeout(Duration::from_secs(10), observer.next())
                .await
                .expect("a change within 10 s")
                .expect("the watch goes on");
            changes.push(c);
        }
    }
    // Every change, in order, with no gap: granted c1, expired, handed
    // off to c2, expired, handed off to c3, expired; tokens rise.
    let kinds: Vec<Option<WatchKind>> = changes.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            WatchKind::Granted,
            WatchKind::Expired,
            WatchKind::HandedOff,
            WatchKind::Expired,
            WatchKind::HandedOff,
            WatchKind::Expired,
        ]
        .map(Some)
    );
    for pair in changes.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1, "no gap: {changes:?}");
    }
    let elected: Vec<(u64, Option<String>)> = changes
        .iter()
        .filter_map(|c| c.leader.as_ref())
        .map(|l| (l.token.get(), l.value.clone()))
        .collect();
    assert_eq!(
        elected,
        vec![
            (leaders[0], Some("c1".into())),
            (leaders[1], Some("c2".into())),
            (leaders[2], Some("c3".into())),
        ]
    );
    assert!(leaders.windows(2).all(|w| w[0] < w[1]), "{leaders:?}");
    let ended: Vec<u64> = changes
        .iter()
        .filter_map(|c| c.ended.map(|t| t.get()))
        .collect();
    assert_eq!(
        ended, leaders,
        "each vacancy names the leadership that ended"
    );

    // `baton observe` printed the same story, one JSON line each.
    let mut printed = vec![(
        json_str(&first, "kind").unwrap(),
        json_u64(&first, "token"),
        json_str(&first, "value"),
    )];
    for _ in 1..7 {
        let (_, line) = cli_observer.next_line();
        printed.push((
            json_str(&line, "kind").unwrap(),
            json_u64(&line, "token"),
            json_str(&line, "value"),
        ));
    }
    drop(cli_observer);
    assert_eq!(printed[0], ("current".into(), None, None));
    assert_eq!(
        printed[1],
        ("granted".into(), Some(leaders[0]), Some("c1".into()))
    );
    assert_eq!(
        printed[5],
        ("handed_off".into(), Some(leaders[2]), Some("c3".into()))
    );

    // The fence kit at the resource: the second leader publishes; the
    // first, deposed but unaware (paused, say), writes late and is refused.
    let mut db = rusqlite::Connection::open(dir.path().join("app.sqlite")).unwrap();
    SqliteFence::migrate(&db).unwrap();
    let publish = |token: u64, key: &str| {
        let op = format!("op-{token}");
        FenceRequest::new(
            "e:sched:report",
            FencingToken::of(token).unwrap(),
            &op,
            key.as_bytes(),
            key.as_bytes(),
        )
        .unwrap()
    };
    let applied = SqliteFence::publish(&mut db, &publish(leaders[1], "report-by-c2")).unwrap();
    assert!(matches!(applied, Outcome::Applied { .. }), "{applied:?}");
    let late = SqliteFence::publish(&mut db, &publish(leaders[0], "report-by-c1")).unwrap();
    match late {
        Outcome::Stale { presented, current } => {
            assert_eq!(presented.get(), leaders[0]);
            assert_eq!(current.get(), leaders[1]);
        }
        other => panic!("the deposed leader's write must be refused, got {other:?}"),
    }
    let req = publish(leaders[1], "report-by-c2");
    let publication = SqliteFence::publication(&db, &req.resource).unwrap();
    eprintln!("leaders {leaders:?}; the deposed leader's late write was refused; publication {publication:?}");
}

#[test]
fn an_election_refuses_bad_input_before_it_campaigns() {
    let dir = TempDir::new("election-bad");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let bad_value = common::cli(&["elect", "e:x", "--value", "a\nb", "--server", &url]);
    assert_eq!(bad_value.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_value.stderr).contains("control character"));
    let bad_name = common::cli(&["elect", " e:x", "--server", &url]);
    assert_eq!(bad_name.status.code(), Some(2), "{bad_name:?}");
    assert!(String::from_utf8_lossy(&bad_name.stderr).contains("whitespace"));
    // Not elected within --wait: exit 3; with a command, 125 and the
    // command never runs.
    let mut leader = candidate(&url, "first");
    leadership(&mut leader);
    let out = common::cli(&["elect", "e:sched", "--wait", "1s", "--server", &url]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let marker = dir.path().join("ran");
    let out = common::cli(&[
        "elect",
        "e:sched",
        "--wait",
        "1s",
        "--server",
        &url,
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(!marker.exists());
    drop(leader);
}
