//! A real SMTP server for tests: `smtp_sink.py` on aiosmtpd (from PyPI,
//! installed by `scripts/test` into `target/s3-venv`; `BATON_TEST_PYTHON`
//! names another interpreter that has it). Each message it takes becomes a
//! file, so a test counts what arrived; [`SmtpSink::drop_next`] makes the
//! next message arrive and the connection reset before the reply.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::process::Proc;

/// The sink's script, for programs that start it themselves.
pub const SCRIPT: &str = include_str!("../smtp_sink.py");

/// The Python that has aiosmtpd.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("BATON_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/s3-venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test (it installs aiosmtpd from PyPI into target/s3-venv) or set BATON_TEST_PYTHON",
        p.display()
    );
    p
}

/// A running sink, killed when dropped.
pub struct SmtpSink {
    _proc: Proc,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Where messages land.
    pub dir: PathBuf,
}

impl SmtpSink {
    /// Starts a sink writing to `dir`.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// With extra arguments (`--drop-pct`, `--seed`).
    pub fn start_with(dir: &Path, extra: &[&str]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let script = dir.join("smtp_sink.py");
        std::fs::write(&script, SCRIPT).unwrap();
        let (proc, addr) = Proc::listening(
            Command::new(python())
                .arg(&script)
                .arg("--dir")
                .arg(dir.join("mail"))
                .args(extra)
                .stderr(Stdio::inherit()),
            "SMTP sink (is aiosmtpd installed?)",
        );
        Self {
            _proc: proc,
            addr,
            dir: dir.join("mail"),
        }
    }

    /// The messages that arrived, oldest first.
    pub fn messages(&self) -> Vec<String> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.retain(|p| p.extension().is_some_and(|e| e == "eml"));
        names.sort();
        names
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }

    /// The next message arrives, and its connection is reset before the reply.
    pub fn drop_next(&self) {
        std::fs::write(self.dir.join("drop-next"), b"").unwrap();
    }
}
