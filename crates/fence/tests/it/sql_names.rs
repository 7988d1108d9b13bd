//! The name rule in every kit: the fence kit's SQL `check_name`, its Rust
//! (SQLite, objects) entry `resource_name`, and the Python client refuse
//! the same invisible and formatting characters as the lease service
//! (`baton_core::invisible`): their tables are checked against the core's
//! here, and the SQL function against a real PostgreSQL.

use baton_core::invisible::invisible_ranges;
use baton_fence::resource_name;
use baton_testkit::PgDb;

fn workspace(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap()
}

/// The core's ranges as a PostgreSQL regular-expression class.
fn sql_class() -> String {
    let esc = |cp: u32| match cp {
        0..=0xFFFF => format!("\\u{cp:04X}"),
        _ => format!("\\U{cp:08X}"),
    };
    let ranges = invisible_ranges();
    let body: String = ranges
        .iter()
        .map(|&(s, e)| match s == e {
            true => esc(s),
            false => format!("{}-{}", esc(s), esc(e)),
        })
        .collect();
    format!("[{body}]")
}

#[test]
fn the_sql_python_and_go_tables_are_the_cores() {
    let class = sql_class();
    for file in [
        "crates/fence/sql/functions/check_name.sql",
        "crates/fence/sql/009_invisible_names.sql",
    ] {
        assert!(
            workspace(file).contains(&format!("substring(v_canonical from '{class}')")),
            "{file} does not refuse exactly the core's invisible characters: {class}"
        );
    }
    let python: String = invisible_ranges()
        .iter()
        .map(|(s, e)| format!("    (0x{s:04X}, 0x{e:04X}),\n"))
        .collect();
    let rules = workspace("clients/python/src/baton/rules.py");
    assert!(
        rules.contains(&format!("= (\n{python})")),
        "clients/python/src/baton/rules.py INVISIBLE_RANGES is not the core's:\n{python}"
    );
    let go: String = invisible_ranges()
        .iter()
        .map(|(s, e)| format!("\t{{0x{s:04X}, 0x{e:04X}}},\n"))
        .collect();
    assert!(
        workspace("clients/go/rules.go").contains(&format!("= [][2]rune{{\n{go}}}")),
        "clients/go/rules.go invisibleRanges is not the core's:\n{go}"
    );
}

#[test]
fn the_rust_kit_refuses_them_naming_the_rule() {
    for name in ["rtl:\u{202E}gnp.exe", "zw:a\u{200B}b"] {
        let e = resource_name(name).unwrap_err().to_string();
        assert!(e.contains("invisible or formatting character U+"), "{e}");
    }
    assert!(resource_name("zw:ab").is_ok());
}

#[tokio::test]
async fn check_name_refuses_them_naming_the_rule() {
    let db = PgDb::create("sql_names").await;
    let mut client = db.connect().await;
    baton_fence::postgres::PgFence::migrate(&mut client)
        .await
        .unwrap();
    for (name, cp) in [
        ("rtl:\u{202E}gnp.exe", "202E"),
        ("zw:a\u{200B}b", "200B"),
        ("tag:\u{E0041}", "E0041"),
    ] {
        let e = client
            .execute("SELECT baton.check_name($1)", &[&name])
            .await
            .unwrap_err();
        let text = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(
            text.contains(&format!("invisible or formatting character U+{cp}")),
            "{name:?}: {text}"
        );
    }
    for fine in ["zw:ab", "日本:ß", "a b"] {
        client
            .execute("SELECT baton.check_name($1)", &[&fine])
            .await
            .unwrap_or_else(|e| panic!("{fine:?}: {e}"));
    }
}
