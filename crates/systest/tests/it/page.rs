//! The operator page in a real browser: headless Chromium, driven through
//! chromedriver (WebDriver), loads the page of a real `baton serve` with
//! leases, a waiter and a fence, and the test reads what is rendered: the
//! rows, a resource's history after a hand-off, the live update after a
//! new grant, a fence from the page, and, with an auth file, the refusal
//! without a token and the rows a restricted principal may see.
//! Screenshots go under the target directory.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them): the test fails, naming
//! them, when they are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_client::baton_core::Holder;
use baton_client::{Acquired, Client};
use baton_systest as common;
use baton_testkit::pg_cluster::free_port;
use baton_testkit::pki::token_sha256;
use common::{Proc, Server, TempDir, BIN};
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long the page may take to show a change (it polls every second).
const SHOWN_WITHIN: Duration = Duration::from_secs(15);

/// A chromedriver process, killed when dropped.
struct Driver {
    _proc: Proc,
    port: u16,
}

fn driver() -> Driver {
    for bin in [CHROMEDRIVER, CHROMIUM] {
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: install Debian's `chromium` and `chromium-driver` (.ci/run does)"
        );
    }
    let port = free_port();
    let proc = Proc::spawn(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stderr(Stdio::null()),
        "chromedriver",
    );
    Driver { _proc: proc, port }
}

/// A headless Chromium session; the flags keep it off every network but
/// loopback (see scripts/test).
async fn browser(driver: &Driver, profile: &Path) -> Browser {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1300,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let url = format!("http://127.0.0.1:{}", driver.port);
    let mut last = None;
    // chromedriver takes a moment to listen.
    for _ in 0..100 {
        match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(b) => return b,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no chromedriver session at {url}: {last:?}");
}

/// Runs `script` (a function body) in the page and returns its value.
async fn eval(b: &Browser, script: &str) -> Value {
    b.execute(script, vec![]).await.expect("run a script")
}

/// The page's lease rows, as `resource|token|holder|remaining|waiters`.
async fn rows(b: &Browser) -> Vec<String> {
    let v = eval(
        b,
        "return [...document.querySelectorAll('#leases tbody tr')].map(tr => [...tr.cells].map(c => c.textContent).join('|'));",
    )
    .await;
    serde_json::from_value(v).unwrap()
}

/// The kinds shown in the history panel, newest first.
async fn history_kinds(b: &Browser) -> Vec<String> {
    let v = eval(
        b,
        "return [...document.querySelectorAll('#history li')].map(li => li.dataset.kind || li.textContent);",
    )
    .await;
    serde_json::from_value(v).unwrap()
}

/// Waits until `check` holds on what the page shows, or fails with the
/// last thing it showed.
async fn shown<T: std::fmt::Debug>(
    what: &str,
    mut read: impl AsyncFnMut() -> T,
    check: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + SHOWN_WITHIN;
    loop {
        let seen = read().await;
        if check(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the page did not show {what} within {SHOWN_WITHIN:?}; it shows {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn screenshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

async fn save_screenshot(b: &Browser, name: &str) {
    let png = b.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(screenshot_path(name), png).unwrap();
}

fn granted(a: Acquired) -> baton_client::Lease {
    match a {
        Acquired::Granted(l) => l,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_leases_history_live_changes_and_fences() {
    let dir = TempDir::new("page");
    let s = common::serve(dir.path(), &[]);
    let ttl = Duration::from_secs(60);
    let mut alice = Client::connect(&s.url())
        .await
        .unwrap()
        .with_holder(Holder::parse("alice@batch-1").unwrap());
    let a1 = granted(
        alice
            .acquire("jobs:1", Some(ttl), Duration::ZERO)
            .await
            .unwrap(),
    );
    granted(
        alice
            .acquire("jobs:2", Some(ttl), Duration::ZERO)
            .await
            .unwrap(),
    );
    // Bob waits in line for jobs:1.
    let url = s.url();
    let bob = tokio::spawn(async move {
        let mut bob = Client::connect(&url)
            .await
            .unwrap()
            .with_holder(Holder::parse("bob@batch-2").unwrap());
        granted(
            bob.acquire("jobs:1", Some(ttl), Duration::from_secs(60))
                .await
                .unwrap(),
        )
    });
    let driver = driver();
    let b = browser(&driver, &dir.path().join("profile")).await;
    b.goto(&format!("http://{}/", s.http)).await.unwrap();

    let seen = shown(
        "jobs:1 with Bob waiting",
        async || rows(&b).await,
        |r| {
            r.iter()
                .any(|row| row.starts_with("jobs:1|") && row.ends_with("|1"))
        },
    )
    .await;
    assert!(seen.iter().any(|r| r.contains("alice@batch-1")), "{seen:?}");
    assert!(
        seen.iter()
            .any(|r| r.starts_with(&format!("jobs:1|{}|", a1.token.get()))),
        "the holder's token: {seen:?}"
    );

    // jobs:1's history after Alice releases and Bob takes over.
    b.find(Locator::Css("#leases tbody tr[data-resource='jobs:1']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    alice.release("jobs:1", &a1.acquisition_id).await.unwrap();
    let bob_lease = bob.await.unwrap();
    let kinds = shown(
        "the hand-off",
        async || history_kinds(&b).await,
        |k| k.first().map(String::as_str) == Some("handed_off"),
    )
    .await;
    assert_eq!(kinds, ["handed_off", "released", "granted"], "newest first");
    let text = eval(
        &b,
        "return document.querySelector('#history ol').textContent",
    )
    .await;
    let text = text.as_str().unwrap();
    assert!(text.contains(&bob_lease.token.get().to_string()), "{text}");
    assert!(
        text.contains("bob@batch-2") && text.contains("ago"),
        "{text}"
    );
    let note = eval(
        &b,
        "return document.getElementById('history-note').textContent",
    )
    .await;
    assert!(note.as_str().unwrap().contains("lost on restart"), "{note}");

    // A new grant shows up without a reload.
    granted(
        alice
            .acquire("jobs:3", Some(ttl), Duration::ZERO)
            .await
            .unwrap(),
    );
    shown(
        "the new grant",
        async || rows(&b).await,
        |r| r.iter().any(|row| row.starts_with("jobs:3|")),
    )
    .await;
    save_screenshot(&b, "operator-page.png").await;

    // A fence from the page: confirmed in the dialog, then shown.
    b.find(Locator::Id("fence"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let question = b.get_alert_text().await.unwrap();
    assert!(
        question.contains("Fence jobs:1?") && question.contains("refused"),
        "the dialog names the consequence: {question}"
    );
    b.accept_alert().await.unwrap();
    let result = shown(
        "the fence's outcome",
        async || {
            eval(
                &b,
                "return document.getElementById('fence-result').textContent",
            )
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
        },
        |t| t.starts_with("Fenced"),
    )
    .await;
    assert!(
        result.contains(&format!(
            "revoked the holder's token {}",
            bob_lease.token.get()
        )),
        "{result}"
    );
    shown(
        "the fence in the history",
        async || history_kinds(&b).await,
        |k| k.first().map(String::as_str) == Some("fenced"),
    )
    .await;
    let status = common::cli(&["status", "jobs:1", "--server", &s.url()]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("free"), "the server agrees: {status}");
    let _ = b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_name_or_holder_never_spills_over_the_history_panel() {
    let dir = TempDir::new("page_long");
    let s = common::serve(dir.path(), &[]);
    let name = format!("long:{}", "n".repeat(480));
    let holder = format!("worker-{}", "h".repeat(240));
    let mut c = Client::connect(&s.url())
        .await
        .unwrap()
        .with_holder(Holder::parse(&holder).unwrap());
    granted(
        c.acquire(&name, Some(Duration::from_secs(60)), Duration::ZERO)
            .await
            .unwrap(),
    );
    let driver = driver();
    let b = browser(&driver, &dir.path().join("profile")).await;
    b.set_window_size(1280, 900).await.unwrap();
    b.goto(&format!("http://{}/", s.http)).await.unwrap();
    shown(
        "the long lease",
        async || rows(&b).await,
        |r| r.iter().any(|row| row.starts_with("long:")),
    )
    .await;
    b.find(Locator::Css("#leases tbody tr"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let v = eval(
        &b,
        "const r = (id) => document.getElementById(id).getBoundingClientRect();
         const cells = document.querySelectorAll('#leases tbody tr td');
         return { table: r('leases').right, panel: r('leases-panel').right,
                  history: r('history').left, history_right: r('history').right,
                  list: document.querySelector('#history ol').scrollWidth,
                  list_box: document.querySelector('#history ol').clientWidth,
                  name: cells[0].title, holder: cells[2].title };",
    )
    .await;
    let f = |k: &str| v[k].as_f64().unwrap();
    assert!(
        f("table") <= f("panel") + 1.0,
        "the table stays in its panel: {v}"
    );
    assert!(
        f("table") <= f("history"),
        "the table never reaches the history panel: {v}"
    );
    assert!(
        f("list") <= f("list_box") + 1.0,
        "the history's long holder wraps: {v}"
    );
    assert_eq!(v["name"], name.as_str(), "the whole name on hover");
    assert_eq!(v["holder"], holder.as_str(), "the whole holder on hover");
    save_screenshot(&b, "page-long-values").await;
    let _ = b.close().await;
}

const OPS: &str = "ops-token-5d1e";
const BILLING: &str = "billing-token-93aa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_the_page_needs_a_token_and_shows_only_what_it_may_read() {
    let dir = TempDir::new("page-auth");
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            r#"
[[principal]]
name = "ops"
token_sha256 = "{}"
rules = {{ "" = ["read", "lease", "fence"] }}

[[principal]]
name = "billing"
token_sha256 = "{}"
rules = {{ "billing:" = ["read"] }}
"#,
            token_sha256(OPS),
            token_sha256(BILLING)
        ),
    )
    .unwrap();
    let s = Server::start(
        &BIN,
        &dir.path().join("data"),
        &["--auth-file", auth.to_str().unwrap()],
    );
    let mut ops = Client::connect_with(
        &s.url(),
        baton_client::ConnectOptions::default().token(OPS).unwrap(),
    )
    .await
    .unwrap();
    let ttl = Duration::from_secs(60);
    for name in ["billing:7", "payroll:1"] {
        granted(ops.acquire(name, Some(ttl), Duration::ZERO).await.unwrap());
    }
    let driver = driver();
    let b = browser(&driver, &dir.path().join("profile")).await;
    b.goto(&format!("http://{}/", s.http)).await.unwrap();

    let visible = shown(
        "the token form",
        async || eval(&b, "return !document.getElementById('auth').hidden").await,
        |v| v == &json!(true),
    )
    .await;
    assert_eq!(visible, json!(true));
    assert!(rows(&b).await.is_empty(), "nothing without a token");

    b.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(BILLING)
        .await
        .unwrap();
    b.find(Locator::Css("#auth-form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let seen = shown("billing's rows", async || rows(&b).await, |r| !r.is_empty()).await;
    assert_eq!(seen.len(), 1, "only billing:, not payroll: {seen:?}");
    assert!(seen[0].starts_with("billing:7|"), "{seen:?}");
    let figures = eval(&b, "return document.getElementById('figures').textContent").await;
    assert!(
        figures
            .as_str()
            .unwrap()
            .contains("need read on every name"),
        "server-wide figures are not shown to a principal limited to a prefix: {figures}"
    );
    save_screenshot(&b, "operator-page-auth.png").await;
    let _ = b.close().await;
}
