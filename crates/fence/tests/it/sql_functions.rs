//! The fence kit's SQL functions as they are now: `sql/functions/*.sql`
//! hold the definition in force of every `baton.*` function, and are what
//! the migrations leave behind. Migrate applies them after the migrations
//! on every install and upgrade, so they are the rule, not a copy of it.
//!
//! To write them again after a migration changes a function:
//! `BATON_FENCE_WRITE_FUNCTIONS=1 cargo test -p baton-fence --test it sql_functions`.

use std::collections::BTreeMap;
use std::path::Path;

use baton_fence::postgres::{PgFence, FUNCTIONS, MIGRATIONS};
use baton_testkit::PgDb;

/// Every function of schema `baton`, by name, as the server prints it.
async fn functions_in_force(client: &tokio_postgres::Client) -> BTreeMap<String, String> {
    baton_testkit::pg_functions_in_force(client, "baton").await
}

const HEADER: &str = "-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_files_are_what_the_migrations_leave_in_force() {
    let db = PgDb::create("fence_functions").await;
    let client = db.connect().await;
    // The migrations alone, as an installation before these files had.
    for (_, sql) in MIGRATIONS {
        client.batch_execute(sql).await.unwrap();
    }
    let migrated = functions_in_force(&client).await;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql/functions");
    if std::env::var_os("BATON_FENCE_WRITE_FUNCTIONS").is_some() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, defs) in &migrated {
            std::fs::write(dir.join(format!("{name}.sql")), format!("{HEADER}\n{defs}")).unwrap();
        }
        eprintln!("wrote {} files to {}", migrated.len(), dir.display());
    }
    // One file per function, each listed in FUNCTIONS.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let expected: Vec<String> = migrated.keys().map(|n| format!("{n}.sql")).collect();
    assert_eq!(
        files, expected,
        "sql/functions/ has one file per baton function"
    );
    let listed: Vec<String> = FUNCTIONS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(listed, expected, "postgres::FUNCTIONS lists every file");
    // Applying the files changes nothing: they are the definitions in force.
    for (_, sql) in FUNCTIONS {
        client.batch_execute(sql).await.unwrap();
    }
    assert_eq!(functions_in_force(&client).await, migrated);
    for (file, sql) in FUNCTIONS {
        let name = file.trim_end_matches(".sql");
        assert!(
            sql.contains(migrated[name].as_str()),
            "{file} is not the definition in force: write the files again (see the module docs)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_every_earlier_version_ends_with_the_same_functions() {
    let fresh = PgDb::create("fence_functions_fresh").await;
    let mut client = fresh.connect().await;
    PgFence::migrate(&mut client).await.unwrap();
    let want = functions_in_force(&client).await;
    for installed in 1..MIGRATIONS.len() {
        let db = PgDb::create(&format!("fence_functions_from_{installed}")).await;
        let mut client = db.connect().await;
        for (_, sql) in &MIGRATIONS[..installed] {
            client.batch_execute(sql).await.unwrap();
        }
        PgFence::migrate(&mut client).await.unwrap();
        assert_eq!(
            functions_in_force(&client).await,
            want,
            "an installation of migrations 1..={installed}, upgraded"
        );
        // And again: migrate is idempotent.
        PgFence::migrate(&mut client).await.unwrap();
        assert_eq!(functions_in_force(&client).await, want);
    }
}
