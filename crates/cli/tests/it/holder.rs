//! Holder descriptions against a real server: given by `acquire`, `hold`
//! and the Rust client, shown by `status`, `list` and watch, kept across a
//! restart, and refused with the rule when they break it.

use std::time::Duration;

use baton_client::{baton_core::Holder, Acquired, Client, WatchKind};
use baton_proto::v1::{self, leases_client::LeasesClient};
use baton_systest as common;
use common::{cli, json_str, Server, TempDir};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status_holder(s: &Server, name: &str) -> Option<String> {
    let out = cli(&["status", name, "--json", "--server", &s.url()]);
    assert!(out.status.success(), "{out:?}");
    json_str(&stdout(&out), "holder")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_is_shown_by_status_list_and_watch_and_survives_a_restart() {
    let dir = TempDir::new("holder-shown");
    let mut s = common::serve(dir.path(), &[]);
    let url = s.url();
    let mut watch = Client::connect(&url)
        .await
        .unwrap()
        .watch("h:")
        .await
        .unwrap();

    // Given on the command line, and the command line's default.
    let given = cli(&[
        "acquire",
        "h:given",
        "--ttl",
        "60s",
        "--holder",
        "report-worker 7 (nightly)",
        "--server",
        &url,
    ]);
    assert!(given.status.success(), "{given:?}");
    let default = cli(&["acquire", "h:default", "--ttl", "60s", "--server", &url]);
    assert!(default.status.success(), "{default:?}");
    assert_eq!(
        status_holder(&s, "h:given").as_deref(),
        Some("report-worker 7 (nightly)")
    );
    let dflt = status_holder(&s, "h:default").expect("the default holder");
    let (user_host, pid) = dflt.split_once(" pid ").expect("USER@HOST pid N");
    assert!(user_host.contains('@'), "{dflt}");
    assert!(pid.parse::<u32>().is_ok(), "{dflt}");
    let text = stdout(&cli(&["status", "h:given", "--server", &url]));
    assert!(
        text.contains("holder=\"report-worker 7 (nightly)\""),
        "{text}"
    );
    // The acquisition id is never shown to others.
    assert!(!text.contains("acquisition"), "{text}");

    // `hold` (a session) and the Rust client.
    let hold = common::Proc::spawn(
        std::process::Command::new(&*common::BIN)
            .args([
                "hold",
                "h:held",
                "--ttl",
                "5s",
                "--holder",
                "holder of h:held",
            ])
            .args(["--server", &url]),
        "baton hold",
    );
    common::eventually(Duration::from_secs(10), async || {
        status_holder(&s, "h:held").as_deref() == Some("holder of h:held")
    })
    .await;
    let mut client = Client::connect(&url)
        .await
        .unwrap()
        .with_holder(Holder::parse("rust ✓ worker").unwrap());
    let Acquired::Granted(lease) = client
        .acquire("h:rust", Some(Duration::from_secs(60)), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let list = stdout(&cli(&[
        "list", "--prefix", "h:", "--json", "--server", &url,
    ]));
    let entries: serde_json::Value = serde_json::from_str(&list).unwrap();
    let holders: Vec<(String, Option<String>)> = entries["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["resource"].as_str().unwrap().to_string(),
                e["holder"].as_str().map(str::to_string),
            )
        })
        .collect();
    assert_eq!(
        holders,
        vec![
            ("h:default".into(), Some(dflt.clone())),
            ("h:given".into(), Some("report-worker 7 (nightly)".into())),
            ("h:held".into(), Some("holder of h:held".into())),
            ("h:rust".into(), Some("rust ✓ worker".into())),
        ]
    );

    // Watch: the grants carry the new holder, the release the old one.
    client
        .release("h:rust", &lease.acquisition_id)
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let e = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .changed()
            .expect("the watch goes on");
        seen.push((e.kind, e.resource, e.holder));
    }
    assert_eq!(
        seen,
        vec![
            (
                WatchKind::Granted,
                "h:given".into(),
                Some("report-worker 7 (nightly)".into())
            ),
            (WatchKind::Granted, "h:default".into(), Some(dflt.clone())),
            (
                WatchKind::Granted,
                "h:held".into(),
                Some("holder of h:held".into())
            ),
            (
                WatchKind::Granted,
                "h:rust".into(),
                Some("rust ✓ worker".into())
            ),
            (
                WatchKind::Released,
                "h:rust".into(),
                Some("rust ✓ worker".into())
            ),
        ]
    );
    drop(hold);

    // Durable: after SIGKILL and a restart, every lease keeps its holder
    // (the session's too, held for its TTL from the restart).
    s.restart();
    assert_eq!(
        status_holder(&s, "h:given").as_deref(),
        Some("report-worker 7 (nightly)")
    );
    assert_eq!(status_holder(&s, "h:default"), Some(dflt));
    assert_eq!(
        status_holder(&s, "h:held").as_deref(),
        Some("holder of h:held")
    );
    let fresh = Client::connect(&s.url()).await.unwrap();
    let watch = fresh.watch("h:").await.unwrap();
    let snapshot: Vec<_> = watch
        .holders
        .iter()
        .map(|h| (h.resource.as_str(), h.holder.as_deref()))
        .collect();
    assert_eq!(
        snapshot[1],
        ("h:given", Some("report-worker 7 (nightly)")),
        "{snapshot:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_breaks_the_rules_is_refused_naming_the_rule() {
    let dir = TempDir::new("holder-refused");
    let s = common::serve(dir.path(), &[]);
    let mut raw = LeasesClient::connect(s.url()).await.unwrap();
    for (holder, rule) in [
        ("job\u{7}7".to_string(), "control character U+0007"),
        ("x".repeat(257), "257 bytes long; the limit is 256 bytes"),
        // Multibyte: 86 × 3 = 258 bytes in 86 characters.
        ("✓".repeat(86), "258 bytes long"),
    ] {
        let out = raw
            .acquire(v1::AcquireRequest {
                resources: vec!["h:bad".into()],
                ttl_ms: Some(5_000),
                wait_ms: 0,
                holder: Some(holder),
                request_id: Vec::new(),
                first_sent_ms_ago: None,
                shapes: Vec::new(),
            })
            .await;
        let status = out.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("holder"), "{}", status.message());
        assert!(status.message().contains(rule), "{}", status.message());
    }
    // Nothing was granted; an empty description is no description.
    let ok = raw
        .acquire(v1::AcquireRequest {
            resources: vec!["h:bad".into()],
            ttl_ms: Some(5_000),
            wait_ms: 0,
            holder: Some(String::new()),
            request_id: Vec::new(),
            first_sent_ms_ago: None,
            shapes: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        ok.outcome,
        Some(v1::acquire_response::Outcome::Granted(_))
    ));
    let st = raw
        .status(v1::StatusRequest {
            resource: "h:bad".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.holder, "");
    // The command line refuses before sending, exit 2, naming the rule.
    let out = cli(&["acquire", "h:cli", "--holder", "a\tb", "--server", &s.url()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("control character U+0009"), "{err}");
}
