use super::*;

#[test]
fn paths_that_escape_the_prefix_are_refused() {
    for bad in [
        "", "/abs", "a/../b", "a//b", "./a", "a/..", "a\\b", "a/\u{0}",
    ] {
        assert!(relative_path(bad).is_err(), "{bad:?}");
    }
    relative_path("statements/account-42/2026-09-13").unwrap();
    assert!(ObjectKit::key("s/a", FencingToken::of(1).unwrap(), "p/df").is_err());
    assert_eq!(
        ObjectKit::key("s/a", FencingToken::of(108).unwrap(), "pdf").unwrap(),
        "s/a/generation-108.pdf"
    );
}

#[test]
fn manifest_round_trips() {
    let m = Manifest {
        sha256_hex: sha256_hex(b"x"),
        size_bytes: 1,
        input_snapshot: "snap-1".into(),
        generator_version: "gen 2".into(),
        operation: "op".into(),
        resource: "statement:a:b".into(),
        token: 108,
    };
    assert_eq!(Manifest::parse(&m.render()), Ok(m));
    assert!(Manifest::parse("nope").is_err());
}
