//! The embedded store keeps the contract every `LeaseStore` keeps
//! (`baton_testkit::store_contract`), reopened from its directory.

use baton_store::RedbStore;

#[test]
fn the_redb_store_keeps_the_store_contract() {
    let dir = tempfile_dir("contract");
    baton_testkit::store_contract::check(|| RedbStore::open(&dir).expect("open the store"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("baton-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}
