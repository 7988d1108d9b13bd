//! Extracts every Rust block that the docs mark `rust` for the docs
//! harness (scripts/docs-test) into one module per block, named by where
//! the block starts: `FILE:LINE` of its opening fence. A block is a whole
//! program (its own `main`), exactly as a reader would paste it.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec!["README.md".to_string(), "CONTRIBUTING.md".to_string()];
    let mut manuals: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    manuals.sort();
    files.extend(manuals);
    let mut modules = String::new();
    let mut table = String::from("const BLOCKS: &[(&str, Block)] = &[\n");
    for file in &files {
        let path = root.join(file);
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).expect("a doc file");
        for (n, (line, body)) in rust_blocks(&text).into_iter().enumerate() {
            let module = format!("{}_{n}", file.replace(['/', '.', '-'], "_"));
            writeln!(
                modules,
                "/// {file}:{line}\n#[allow(clippy::all)]\nmod {module} {{\n{body}\n\
                 pub(super) fn block_main() -> Result<(), super::BlockFailed> {{ super::Outcome::into_result(main()) }}\n}}"
            )
            .unwrap();
            writeln!(table, "    (\"{file}:{line}\", {module}::block_main),").unwrap();
        }
    }
    table.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("blocks.rs");
    std::fs::write(out, modules + &table).unwrap();
}

/// The blocks whose marker line says `rust`: the opening fence's line
/// number (from 1) and the code.
fn rust_blocks(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("```rust") {
            let start = i;
            let mut body = String::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                body.push_str(lines[i]);
                body.push('\n');
                i += 1;
            }
            let marker = start.checked_sub(1).map(|m| lines[m]).unwrap_or("");
            let marked = marker.starts_with("<!-- docs-test:")
                && marker
                    .trim_end_matches("-->")
                    .split(';')
                    .any(|c| c.trim().trim_start_matches("<!-- docs-test:").trim() == "rust");
            if marked {
                out.push((start + 1, body));
            }
        }
        i += 1;
    }
    out
}
