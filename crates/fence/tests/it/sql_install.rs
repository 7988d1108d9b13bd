//! The one psql command that installs or upgrades the fence kit,
//! `psql -v ON_ERROR_STOP=1 -f crates/fence/sql/install.sql`, run as a
//! user runs it: twice on one database, over every earlier version
//! installed file by file, before and after `PgFence::migrate`, and over
//! a newer version, which it refuses naming both.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use baton_fence::postgres::{PgFence, FUNCTIONS, MIGRATIONS};
use baton_testkit::PgDb;

fn sql_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sql")
}

fn psql(db: &PgDb, file: &Path) -> Output {
    let bin = baton_testkit::pg_cluster::pg_bin_dir()
        .map(|d| d.join("psql"))
        .unwrap_or_else(|_| PathBuf::from("psql"));
    Command::new(bin)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &db.url, "-f"])
        .arg(file)
        .output()
        .expect("run psql")
}

fn installed(db: &PgDb, file: &Path) {
    let out = psql(db, file);
    assert!(
        out.status.success(),
        "psql -f {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One fenced write through the installed functions: `applied`.
async fn fence_works(db: &PgDb, token: i64) {
    let client = db.connect().await;
    let row = client
        .query_one(
            "SELECT outcome FROM baton.fence('install:1', $1, $2, '\\x01'::bytea)",
            &[&token, &format!("op-{token}")],
        )
        .await
        .expect("baton.fence answers");
    assert_eq!(row.get::<_, String>(0), "applied");
    // Readers of another resource: below the writer's token stale, at or
    // above it applied; then the writer below a recorded reader is stale.
    let resource = format!("install:shared:{token}");
    let writes = [
        ("baton.fence", token, "applied"),
        ("baton.fence_shared", token - 1, "stale"),
        ("baton.fence_shared", token + 1, "applied"),
        ("baton.fence_shared", token, "applied"),
        ("baton.fence", token, "stale"),
    ];
    for (step, (function, reader, want)) in writes.into_iter().enumerate() {
        let row = client
            .query_one(
                &format!("SELECT outcome FROM {function}($1, $2, $3, '\\x01'::bytea)"),
                &[&resource, &reader, &format!("step-{step}")],
            )
            .await
            .expect("baton.fence_shared answers");
        assert_eq!(
            row.get::<_, String>(0),
            want,
            "reader {reader} after writer {token}"
        );
    }
}

async fn version(db: &PgDb) -> i32 {
    let client = db.connect().await;
    client
        .query_one("SELECT max(version) FROM baton.schema_migrations", &[])
        .await
        .unwrap()
        .get(0)
}

#[test]
fn the_install_names_every_migration_and_function_in_order() {
    let text = std::fs::read_to_string(sql_dir().join("install.sql")).unwrap();
    let included: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("\\ir "))
        .collect();
    let mut want: Vec<String> = Vec::new();
    let mut migrations: Vec<String> = std::fs::read_dir(sql_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    migrations.sort();
    assert_eq!(migrations.len(), MIGRATIONS.len());
    want.extend(migrations);
    want.extend(FUNCTIONS.iter().map(|(f, _)| format!("functions/{f}")));
    assert_eq!(included, want);
    assert!(
        text.contains(&format!("> {} AS baton_newer", MIGRATIONS.len())),
        "the newer-version check names this version"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_twice_changes_nothing_and_the_functions_work() {
    let db = PgDb::create("fence_install_twice").await;
    let install = sql_dir().join("install.sql");
    installed(&db, &install);
    fence_works(&db, 1_099_511_627_800).await;
    installed(&db, &install);
    installed(&db, &install);
    fence_works(&db, 1_099_511_627_801).await;
    assert_eq!(version(&db).await, MIGRATIONS.len() as i32);
}

/// Every earlier release installed by hand (its migrations with psql, in
/// order), then upgraded with the one command: the same functions as a
/// fresh install, and a working fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_upgrades_every_earlier_version() {
    let mut migrations: Vec<PathBuf> = std::fs::read_dir(sql_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    migrations.sort();
    for from in 1..MIGRATIONS.len() {
        let db = PgDb::create(&format!("fence_install_from_{from}")).await;
        for file in &migrations[..from] {
            installed(&db, file);
        }
        installed(&db, &sql_dir().join("install.sql"));
        assert_eq!(version(&db).await, MIGRATIONS.len() as i32, "from {from}");
        fence_works(&db, 1_099_511_627_900 + from as i64).await;
    }
}

/// psql after migrate, migrate after psql: each takes the other's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_and_migrate_take_each_others_installs() {
    let install = sql_dir().join("install.sql");
    let db = PgDb::create("fence_install_after_migrate").await;
    PgFence::migrate(&mut db.connect().await).await.unwrap();
    installed(&db, &install);
    fence_works(&db, 1_099_511_628_000).await;
    let db = PgDb::create("fence_migrate_after_install").await;
    installed(&db, &install);
    PgFence::migrate(&mut db.connect().await).await.unwrap();
    fence_works(&db, 1_099_511_628_001).await;
}

/// A database at a newer version is refused by both, naming both
/// versions, and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_database_is_refused_naming_both_versions() {
    let db = PgDb::create("fence_install_newer").await;
    installed(&db, &sql_dir().join("install.sql"));
    let newer = MIGRATIONS.len() as i32 + 90;
    db.connect()
        .await
        .execute(
            "INSERT INTO baton.schema_migrations (version) VALUES ($1)",
            &[&newer],
        )
        .await
        .unwrap();
    let out = psql(&db, &sql_dir().join("install.sql"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a newer database was accepted: {err}"
    );
    let both = format!(
        "at version {newer}, newer than this install (version {})",
        MIGRATIONS.len()
    );
    assert!(err.contains(&both), "{err}");
    let e = PgFence::migrate(&mut db.connect().await).await.unwrap_err();
    assert!(e.to_string().contains(&both), "{e}");
    assert_eq!(version(&db).await, newer, "left as it was");
    fence_works(&db, 1_099_511_628_100).await;
}
