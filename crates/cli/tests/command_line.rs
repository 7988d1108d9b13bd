//! The command line as a newcomer meets it: values it cannot honour are
//! refused naming the rule, an argument that is not UTF-8 is a usage
//! error, errors name the likely cause and the address once, and `--json`
//! has one pinned shape per command.

use std::collections::BTreeSet;
use std::process::Output;

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
    let acquire_keys = set(&["acquired", "reason", "after_wait", "leases", "blocked_by"]);
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
        set(&["resource", "holder_token"])
    );
    assert_eq!(
        held["blocked_by"]["holder_token"],
        one["leases"][0]["token"]
    );
    assert_eq!(timed_out["reason"], "timed_out");

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

/// The SQL block of the fence-kit chapter (docs/fence-kit.md), as written,
/// in a fresh database with the kit installed; then `admin restore
/// --floor-from` that database, as the README's restore example does. Its
/// sample tokens are real Baton tokens (epoch 1), so the restore takes the
/// database as a floor.
#[tokio::test]
async fn the_fence_kit_chapter_and_the_restore_example_run_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let chapter = std::fs::read_to_string(root.join("docs/fence-kit.md")).unwrap();
    let start = chapter.find("```sql").expect("a SQL block") + "```sql".len();
    let sql = &chapter[start..start + chapter[start..].find("```").unwrap()];
    let db = baton_testkit::PgDb::create("docs_fence_kit").await;
    let client = db.connect().await;
    for (_, migration) in baton_fence::postgres::MIGRATIONS {
        client.batch_execute(migration).await.unwrap();
    }
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{}", baton_fence::postgres::describe_error(&e)));
    let highest: i64 = client
        .query_one("SELECT max(generation) FROM baton.resources", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        highest >> 40,
        1,
        "the sample tokens are epoch-1 Baton tokens"
    );

    let out = restore_empty_above("docs-restore", &db.url);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(
        text.contains(&format!("resources recorded up to token {highest}")),
        "{text}"
    );
}

/// The README and the manuals in docs/, one after the other.
fn docs_text() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut text = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut manuals: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    manuals.sort();
    for m in manuals {
        text.push_str(&std::fs::read_to_string(m).unwrap());
    }
    text
}

/// The shell script of a documented block that starts with `first_line`,
/// with `-d app` pointed at the test's database.
fn readme_script(first_line: &str, db: &str) -> String {
    let readme = docs_text();
    let start = readme.find(first_line).expect("the script is in the docs");
    let end = start + readme[start..].find("```").unwrap();
    readme[start..end].replace("-d app", &format!("-d {db}"))
}

/// A database with the fence kit's schema, a connection to it, and its
/// port as psql reads it: the documented scripts name host and user, and
/// the run's private cluster is not on 5432.
async fn fence_kit_db(tag: &str) -> (baton_testkit::PgDb, tokio_postgres::Client, String) {
    let db = baton_testkit::PgDb::create(tag).await;
    let client = db.connect().await;
    for (_, migration) in baton_fence::postgres::MIGRATIONS {
        client.batch_execute(migration).await.unwrap();
    }
    let port = db
        .url
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .unwrap_or("5432")
        .to_string();
    (db, client, port)
}

/// The README's scripts for `run` and for the election recipe, run with
/// psql against the fence kit's schema: a current token publishes, a
/// deposed leader's older token gets `stale` and the script fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_run_and_election_scripts_run_as_written() {
    let (db, client, port) = fence_kit_db("readme_scripts").await;
    let dir = TempDir::new("readme-scripts");
    let sh = |script: &str, env: &[(&str, &str)]| {
        let path = dir.path().join("script.sh");
        std::fs::write(&path, script).unwrap();
        std::process::Command::new("sh")
            .arg(&path)
            .env("PGPORT", &port)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let t1 = ((1u64 << 40) | 7).to_string();
    let t2 = ((1u64 << 40) | 9).to_string();

    let run_script = readme_script("#!/bin/sh\n# Run by: baton run", &db.name);
    let env = |token: &str| {
        [
            ("BATON_FENCING_TOKEN", token.to_string()),
            (
                "BATON_RESOURCE",
                "statement:account-42:2026-09-13".to_string(),
            ),
        ]
    };
    let e2 = env(&t2);
    let e2: Vec<(&str, &str)> = e2.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = sh(&run_script, &e2);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "publish: applied\n");
    let e1 = env(&t1);
    let e1: Vec<(&str, &str)> = e1.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = sh(&run_script, &e1);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "publish: stale\n");

    // lead.sh loops while leading, writing again and again under its
    // token: at least five writes by the first leader, then a hand-over to
    // a newer token that writes five more, and the first, still looping,
    // is refused at its next write (stale) and exits.
    let lead = readme_script("#!/bin/sh\n# lead.sh", &db.name);
    let path = dir.path().join("lead.sh");
    std::fs::write(&path, &lead).unwrap();
    let leader = |token: &str| {
        baton_testkit::process::Proc::spawn_merged(
            std::process::Command::new("sh")
                .arg(&path)
                .env("PGPORT", &port)
                .env("PLAN_EVERY_S", "0.05")
                .env("BATON_FENCING_TOKEN", token),
            "lead.sh",
        )
    };
    let written = async |token: &str, n: i64| {
        let token: i64 = token.parse().unwrap();
        baton_testkit::eventually(std::time::Duration::from_secs(20), async || {
            client
                .query_opt(
                    "SELECT 1 FROM baton.resources WHERE resource = 'scheduler:plan' AND generation = $1 AND seq >= $2",
                    &[&token, &n],
                )
                .await
                .unwrap()
                .is_some()
        })
        .await;
    };
    let mut first = leader(&t1);
    written(&t1, 5).await;
    let second = leader(&t2);
    written(&t2, 5).await;
    first.wait_for("deposed: stale");
    assert_eq!(first.wait().code(), Some(1), "the deposed leader stops");
    drop(second);
}

/// The README's nightly job, as three hosts would run it from the same
/// crontab line at the same minute: three `baton run --wait` processes.
/// The job runs once; the two others, given the lease in turn, find the
/// night recorded and skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_nightly_job_runs_once_on_three_hosts() {
    let (db, _client, port) = fence_kit_db("readme_nightly").await;
    let dir = TempDir::new("readme-nightly");
    let s = common::serve(&dir.path().join("data"), &[]);
    let once = dir.path().join("nightly-once");
    std::fs::write(&once, readme_script("#!/bin/sh\n# nightly-once", &db.name)).unwrap();
    let runs = dir.path().join("runs");
    let report = dir.path().join("nightly-report");
    std::fs::write(
        &report,
        format!("#!/bin/sh\necho ran >> {}\nsleep 0.3\n", runs.display()),
    )
    .unwrap();
    for f in [&once, &report] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let readme = docs_text();
    let line = readme
        .lines()
        .find(|l| l.starts_with("0 2 * * * baton run "))
        .expect("the crontab line is in the README");
    let args: Vec<String> = line
        .trim_start_matches("0 2 * * * baton ")
        .split_whitespace()
        .map(|a| match a {
            "baton-1:7700,baton-2:7700" => s.url(),
            "/usr/local/bin/nightly-once" => once.display().to_string(),
            other => other.to_string(),
        })
        .collect();
    let hosts: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&*common::BIN)
                .args(&args)
                .env("PGPORT", &port)
                .env("NIGHTLY_REPORT", &report)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = hosts
        .into_iter()
        .map(|h| h.wait_with_output().unwrap())
        .collect();
    for out in &outs {
        assert!(out.status.success(), "{out:?}");
    }
    let said: Vec<String> = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .collect();
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(ran.lines().count(), 1, "one run a night: {said:?}");
    assert_eq!(
        said.iter().filter(|l| l.ends_with(": done")).count(),
        1,
        "{said:?}"
    );
    assert_eq!(
        said.iter()
            .filter(|l| l.ends_with(": already done"))
            .count(),
        2,
        "{said:?}"
    );
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
