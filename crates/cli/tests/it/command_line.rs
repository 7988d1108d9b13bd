//! The command line as a newcomer meets it: values it cannot honour are
//! refused naming the rule, an argument that is not UTF-8 is a usage
//! error, errors name the likely cause and the address once, and `--json`
//! has one pinned shape per command.

use std::collections::BTreeSet;
use std::process::Output;

use baton_client::Client;
use baton_systest as common;
use common::{cli, TempDir};
use serde_json::Value;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    baton_testkit::json::object(&text).unwrap_or_else(|| panic!("no JSON object in {text:?}"))
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// `baton admin restore --empty` into a fresh directory, above the tokens
/// the fence-kit database at `url` recorded.
fn restore_empty_above(tag: &str, url: &str) -> Output {
    let dir = TempDir::new(tag);
    let data = dir.path().join("baton-data");
    cli(&[
        "admin",
        "restore",
        "--empty",
        "--data-dir",
        data.to_str().unwrap(),
        "--floor-from",
        url,
    ])
}

fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

/// Zero, sub-millisecond and overlong durations, in client and server
/// flags alike: exit 2 with one error naming the rule and the limit, and
/// nothing sent (the server address is a closed port).
#[test]
fn durations_that_cannot_be_honoured_are_refused_by_every_flag() {
    let nowhere = "127.0.0.1:1";
    for (args, says) in [
        (
            vec!["acquire", "x", "--ttl", "2305843009213693982s"],
            "365 days (31536000000 ms)",
        ),
        (vec!["acquire", "x", "--ttl", "0s"], "at least 1ms"),
        (
            vec!["acquire", "x", "--ttl", "500us"],
            "whole number of milliseconds",
        ),
        (vec!["acquire", "x", "--wait", "9000h"], "365 days"),
        (vec!["hold", "x", "--ttl", "0ms"], "at least 1ms"),
        (vec!["status", "x", "--timeout", "0s"], "at least 1ms"),
        (vec!["bench", "--ttl", "0s"], "at least 1ms"),
        (vec!["serve", "--default-ttl", "0s"], "at least 1ms"),
        (
            vec!["serve", "--ttl-max", "2305843009213693982s"],
            "365 days",
        ),
        (vec!["serve", "--idle-timeout", "0s"], "at least 1ms"),
        (
            vec!["serve", "--handshake-timeout", "1500us"],
            "whole number of milliseconds",
        ),
    ] {
        let mut all = args.clone();
        if args[0] != "serve" {
            all.extend(["--server", nowhere]);
        }
        let out = cli(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} must name the rule: {err}");
        assert_eq!(err.matches("error:").count(), 1, "one error: {err}");
    }
    // Through the environment and a config file, the same parser.
    let out = std::process::Command::new(&*common::BIN)
        .args(["serve", "--data-dir", "/nonexistent/never-created"])
        .env("BATON_DEFAULT_TTL", "0s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("at least 1ms"));
}

#[test]
fn the_load_generator_refuses_a_mode_event_or_count_it_cannot_run() {
    // Refused while parsing, before any connection (nothing listens there).
    for (args, says) in [
        (
            vec!["--modes", "distinc"],
            "possible values: distinct, shared, both",
        ),
        (
            vec!["--event", "backups"],
            "possible values: backup, session-end, none",
        ),
        (vec!["--clients", "16,0"], "from 1 to 4096"),
        (vec!["--clients", ""], "from 1 to 4096"),
        (vec!["--duration", "0s"], "at least 1ms"),
    ] {
        let mut all = vec!["bench"];
        all.extend(&args);
        all.extend(["--server", "127.0.0.1:1"]);
        let out = cli(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} must name the rule: {err}");
    }
}

#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    for json in [false, true] {
        let mut cmd = std::process::Command::new(&*common::BIN);
        cmd.arg("status")
            .arg(std::ffi::OsStr::from_bytes(b"\xff\xfe"))
            .args(["--server", "127.0.0.1:1"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("invalid UTF-8"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        if json {
            assert_eq!(json_of(&out)["exit_code"], 2);
        }
    }
}

fn json_of(out: &Output) -> Value {
    json(out)
}

/// A client pointed at the HTTP port, or at a port that never answers:
/// one sentence with the likely cause and the address once, not the
/// transport's text; both definite (nothing was sent).
#[tokio::test]
async fn errors_name_the_likely_cause_and_the_address_once() {
    let dir = TempDir::new("cli-errors");
    let s = common::serve(dir.path(), &[]);
    let http = s.http.to_string();
    let out = cli(&["status", "x", "--server", &http]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("HTTP port") && err.contains("--listen"),
        "{err}"
    );
    assert_eq!(err.matches(&http).count(), 1, "the address once: {err}");
    assert!(
        !err.contains("transport error") && !err.contains("h2"),
        "{err}"
    );

    // Accepts connections, never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let out = cli(&["status", "x", "--server", &addr, "--dial-timeout", "300ms"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer within the dial timeout of 300 ms")
            && err.contains("nothing was sent"),
        "{err}"
    );
    assert_eq!(err.matches(&addr).count(), 1, "the address once: {err}");
    assert!(!err.contains("Timeout expired"), "{err}");
    drop(silent);
}

/// A PostgreSQL failure says the server's message and SQLSTATE and which
/// URL, with its password hidden; never just "db error".
#[tokio::test]
async fn a_postgresql_failure_names_the_message_sqlstate_and_url() {
    let cfg: tokio_postgres::Config = baton_testkit::pg_admin_url().parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres");
    let url =
        format!("host={host} port={port} user={user} dbname=baton_no_such_db password=hunter2");
    let out = restore_empty_above("cli-pg-error", &url);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("database \"baton_no_such_db\" does not exist")
            && err.contains("SQLSTATE 3D000"),
        "{err}"
    );
    assert!(
        err.contains("password=***") && !err.contains("hunter2"),
        "{err}"
    );
    assert!(!err.contains("db error"), "{err}");
}

/// Every command's `--json` shape, pinned: the same keys for one name and
/// several, for a grant and a refusal; usage errors as JSON too.
/// One `acquire` mixes shapes (`--shared-on`, `--permits-on` beside the
/// command's own shape), all or nothing; `run` gives the command every
/// slot; a per-name shape for a name the command does not hold, or two
/// for one name, exits 2 and sends nothing.
#[tokio::test]
async fn one_command_mixes_shapes_by_name() {
    let dir = TempDir::new("cli-mixed");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--server", &url, "--json"]);
        cli(&all)
    };
    let mixed = [
        "--shared-on",
        "m:doc",
        "--permits-on",
        "m:jobs=2",
        "--ttl",
        "30s",
    ];
    let first = run(&[&["acquire", "m:db", "m:doc", "m:jobs"], &mixed[..]].concat());
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let slots: Vec<Value> = json(&first)["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["slot"].clone())
        .collect();
    assert_eq!(slots, [Value::Null, Value::from(0), Value::from(0)]);
    let second = run(&[&["acquire", "m:doc", "m:jobs"], &mixed[..]].concat());
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    // The semaphore is full: the reader of the same request is not granted.
    let third = run(&[&["acquire", "m:doc", "m:jobs"], &mixed[..]].concat());
    assert_eq!(third.status.code(), Some(3), "{}", stderr(&third));
    assert_eq!(json(&third)["blocked_by"]["n_holders"], 2);
    let mut c = Client::connect(&url).await.unwrap();
    assert_eq!(c.status("m:doc").await.unwrap().slots.len(), 2);
    let env = cli(&[
        "run",
        "m:doc",
        "m:other",
        "--shared-on",
        "m:doc",
        "--server",
        &url,
        "--",
        "sh",
        "-c",
        "printf '%s|%s' \"$BATON_PERMIT_SLOTS\" \"$BATON_PERMIT_SLOT\"",
    ]);
    assert_eq!(env.status.code(), Some(0), "{}", stderr(&env));
    assert_eq!(String::from_utf8_lossy(&env.stdout), "m:doc=2|");
    for bad in [
        &["acquire", "m:x", "--shared-on", "m:y"][..],
        &[
            "acquire",
            "m:x",
            "--shared-on",
            "m:x",
            "--permits-on",
            "m:x=2",
        ],
        &["acquire", "m:x", "--permits-on", "m:x"],
        &["acquire", "m:x", "--permits-on", "m:x=4097"],
        &["hold", "m:x", "--shared-on", "m:y"],
    ] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("m:"), "{bad:?}: names it");
    }
    assert!(c.status("m:x").await.unwrap().holder_token.is_none());
}

#[tokio::test]
async fn json_shapes_are_one_per_command() {
    let dir = TempDir::new("cli-json");
    let s = common::serve(dir.path(), &[]);
    let url = s.url();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--server", &url, "--json"]);
        cli(&all)
    };
    let acquire_keys = set(&[
        "acquired",
        "reason",
        "after_wait",
        "leases",
        "blocked_by",
        "blockers",
    ]);
    let lease_keys = set(&[
        "resource",
        "acquisition_id",
        "token",
        "ttl_ms",
        "valid_for_ms",
    ]);

    let one = run(&["acquire", "j:1", "--ttl", "30s"]);
    assert_eq!(one.status.code(), Some(0));
    let one = json(&one);
    let two = json(&run(&["acquire", "j:2", "j:3"]));
    let held = run(&["acquire", "j:1"]);
    assert_eq!(held.status.code(), Some(3));
    let held = json(&held);
    let timed_out = json(&run(&["acquire", "j:1", "--wait", "100ms"]));
    for v in [&one, &two, &held, &timed_out] {
        assert_eq!(keys(v), acquire_keys, "{v}");
    }
    assert_eq!(one["acquired"], true);
    assert_eq!(one["reason"], Value::Null);
    assert_eq!(one["leases"].as_array().unwrap().len(), 1);
    assert_eq!(two["leases"].as_array().unwrap().len(), 2);
    for l in one["leases"]
        .as_array()
        .unwrap()
        .iter()
        .chain(two["leases"].as_array().unwrap())
    {
        assert_eq!(keys(l), lease_keys, "{l}");
    }
    assert_eq!(held["acquired"], false);
    assert_eq!(held["reason"], "held");
    assert_eq!(
        keys(&held["blocked_by"]),
        set(&[
            "resource",
            "holder_token",
            "holder",
            "held_s",
            "held_since_recovery",
            "remaining_ms",
            "session_bound",
            "n_holders",
            "n_waiters_ahead",
            "readable",
        ])
    );
    assert_eq!(
        held["blocked_by"]["holder_token"],
        one["leases"][0]["token"]
    );
    assert_eq!(timed_out["reason"], "timed_out");
    for refused in [&held, &timed_out] {
        let blockers = refused["blockers"].as_array().unwrap();
        assert_eq!(blockers.len(), 1, "{refused}");
        assert_eq!(
            keys(&blockers[0]),
            set(&[
                "resource",
                "readable",
                "holders",
                "n_holders",
                "n_waiters_ahead"
            ])
        );
        assert_eq!(
            keys(&blockers[0]["holders"][0]),
            set(&[
                "token",
                "holder",
                "held_s",
                "held_since_recovery",
                "remaining_ms",
                "session_bound"
            ])
        );
        assert_eq!(
            blockers[0]["holders"][0]["token"],
            one["leases"][0]["token"]
        );
    }
    assert_eq!(one["blockers"], serde_json::json!([]));

    let id = one["leases"][0]["acquisition_id"]
        .as_str()
        .unwrap()
        .to_string();
    let renew_keys = set(&["renewed", "token", "remaining_ms", "valid_for_ms", "reason"]);
    let renewed = json(&run(&["renew", "j:1", "--acquisition", &id]));
    let not_owner = json(&run(&["renew", "j:2", "--acquisition", &id]));
    assert_eq!(
        (keys(&renewed), keys(&not_owner)),
        (renew_keys.clone(), renew_keys)
    );
    assert_eq!(
        (&renewed["renewed"], &not_owner["reason"]),
        (&Value::Bool(true), &Value::from("not_owner"))
    );

    let status = json(&run(&["status", "j:1"]));
    assert_eq!(
        keys(&status),
        set(&[
            "resource",
            "held",
            "holder_token",
            "remaining_ms",
            "ttl_ms",
            "n_waiters",
            "holder"
        ])
    );
    let list = json(&run(&["list", "--prefix", "j:"]));
    assert_eq!(keys(&list), set(&["entries"]));
    assert_eq!(keys(&list["entries"][0]), keys(&status));

    let release_keys = set(&["released", "token", "reason"]);
    let released = json(&run(&["release", "j:1", "--acquisition", &id]));
    let again = json(&run(&["release", "j:1", "--acquisition", &id]));
    assert_eq!(
        (keys(&released), keys(&again)),
        (release_keys.clone(), release_keys)
    );
    assert_eq!(again["reason"], "not_held");

    let fenced = json(&run(&["fence", "j:2"]));
    assert_eq!(keys(&fenced), set(&["resource", "token", "revoked_token"]));

    let error_keys = set(&["error", "exit_code"]);
    for (args, code) in [
        (vec!["acquire", "j::bad"], 2),
        (vec!["acquire"], 2),
        (vec!["acquire", "x", "--ttl", "30"], 2),
        (vec!["renew", "j:1", "--acquisition", "xyz"], 2),
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let v = json(&out);
        assert_eq!(keys(&v), error_keys, "{args:?}: {v}");
        assert_eq!(v["exit_code"], code);
        assert!(!v["error"].as_str().unwrap().is_empty());
    }
    let unreachable = cli(&["status", "x", "--server", "127.0.0.1:1", "--json"]);
    assert_eq!(keys(&json(&unreachable)), error_keys);
}

/// `baton completions SHELL` prints a script that bash loads and that
/// completes commands and flags from the definitions; `baton man` writes
/// a page per visible command.
#[test]
fn completions_complete_from_the_definitions_and_man_pages_cover_every_command() {
    let dir = TempDir::new("docs");
    let out = cli(&["completions", "bash"]);
    assert!(out.status.success(), "{out:?}");
    let script = dir.path().join("baton.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let complete = |words: &str, cword: usize| {
        let probe = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={cword}; _baton baton \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &probe])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(complete("baton ac", 1).lines().any(|l| l == "acquire"));
    assert!(complete("baton acquire --t", 2).contains("--ttl"));
    for (shell, marker) in [("zsh", "#compdef baton"), ("fish", "complete -c baton")] {
        let out = cli(&["completions", shell]);
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(marker),
            "{shell}"
        );
    }
    let out = cli(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));

    let man = dir.path().join("man");
    let out = cli(&["man", "--dir", man.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page = |name: &str| std::fs::read_to_string(man.join(format!("{name}.1"))).unwrap();
    assert!(page("baton").starts_with(".ie"), "roff");
    assert!(page("baton").contains(".TH baton 1"));
    assert!(page("baton-acquire").contains("\\-\\-ttl"));
    assert!(page("baton-serve").contains("\\-\\-otlp\\-endpoint"));
    assert!(page("baton-cluster-status").contains(".TH baton-cluster-status"));
    assert!(
        !man.join("baton-exec-child.1").exists(),
        "no page for the internal command"
    );
}
