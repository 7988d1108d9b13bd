//! The statement service's external effects in a chaos run: every worker
//! notifies a webhook and an email address; the run's dispatchers send
//! through a fault proxy to the test kit's webhook receiver (whose answers
//! it drops after the receiver applied) and to an aiosmtpd server that
//! resets 10 % of connections after DATA. At the end: what was delivered,
//! duplicated, lost, or left for an operator.

use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use baton_chaos::{DeliveryFigures, Effects, EffectsSpec};
use baton_faults::Proxy;
use baton_fence::outbox::Filter;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::store::{self, Location};

/// Percent of SMTP connections reset after DATA.
const SMTP_DROP_PCT: u32 = 10;

pub struct StatementsEffects {
    exe: PathBuf,
    database_url: String,
    accounts: String,
    blind: bool,
    hooks_url: String,
    receiver_addr: String,
    smtp_addr: String,
    mail_dir: PathBuf,
    proxy: Arc<Proxy>,
    _receiver: Child,
    _sink: Child,
    dropper: tokio::task::JoinHandle<()>,
}

impl Drop for StatementsEffects {
    fn drop(&mut self) {
        self.dropper.abort();
    }
}

/// Starts `cmd` and reads its first line, `listening on ADDR`.
async fn listening(mut cmd: Command, what: &str) -> anyhow::Result<(Child, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start the {what}"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| anyhow::anyhow!("the {what} did not start in 30 s"))??
        .unwrap_or_default();
    let addr = line
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow::anyhow!("the {what} did not start: it said {line:?}"))?
        .to_string();
    Ok((child, addr))
}

/// The SMTP server of a chaos run (aiosmtpd, resetting a seeded share of
/// connections after DATA): its process, address and mail directory.
async fn start_smtp(spec: &EffectsSpec) -> anyhow::Result<(Child, String, PathBuf)> {
    let python = std::env::var("BATON_CHAOS_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import aiosmtpd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if !has.is_ok_and(|s| s.success()) {
        anyhow::bail!(
            "the chaos run's SMTP server needs Python with aiosmtpd ({python} has none): \
             pip install aiosmtpd==1.4.6 into a virtualenv and set BATON_CHAOS_PYTHON to its python, \
             or run with --dispatchers 0"
        );
    }
    let smtp_dir = spec.dir.join("smtp");
    std::fs::create_dir_all(&smtp_dir)?;
    let script = smtp_dir.join("smtp_sink.py");
    std::fs::write(&script, baton_testkit::smtp::SCRIPT)?;
    let mail_dir = smtp_dir.join("mail");
    let mut sink = Command::new(&python);
    sink.arg(&script)
        .arg("--dir")
        .arg(&mail_dir)
        .args(["--drop-pct", &SMTP_DROP_PCT.to_string()])
        .args(["--seed", &spec.seed.to_string()])
        .stderr(Stdio::null());
    let (sink, smtp_addr) = listening(sink, "SMTP server").await?;
    Ok((sink, smtp_addr, mail_dir))
}

impl StatementsEffects {
    pub async fn start(exe: &Path, spec: &EffectsSpec, database_url: &str) -> anyhow::Result<Self> {
        let (sink, smtp_addr, mail_dir) = start_smtp(spec).await?;
        let schema = format!(
            "chaos_receiver_{:x}",
            spec.seed ^ u64::from(std::process::id())
        );
        let mut receiver = Command::new(exe);
        receiver
            .args([
                "webhook-receiver",
                "--database-url",
                database_url,
                "--schema",
                &schema,
            ])
            .stderr(Stdio::null());
        let (receiver, receiver_addr) = listening(receiver, "webhook receiver").await?;
        let proxy = Arc::new(Proxy::start(receiver_addr.parse()?).await?);
        // The webhook's answers are lost, at seeded moments, after the
        // receiver applied.
        let arm = proxy.clone();
        let mut rng = baton_client::rng::Rng::new(spec.seed ^ 0xde11_7e55);
        let dropper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if rng.below(3) == 0 {
                    arm.drop_next_response();
                }
            }
        });
        Ok(Self {
            exe: exe.to_path_buf(),
            database_url: database_url.to_string(),
            accounts: spec.accounts.clone(),
            blind: spec.blind,
            hooks_url: format!("http://{}/hooks", proxy.addr()),
            receiver_addr,
            smtp_addr,
            mail_dir,
            proxy,
            _receiver: receiver,
            _sink: sink,
            dropper,
        })
    }

    async fn rows(&self) -> anyhow::Result<Vec<baton_fence::outbox::Delivery>> {
        let mut db = store::open(&Location {
            db: PathBuf::new(),
            database_url: Some(self.database_url.clone()),
        })
        .await?;
        db.outbox()
            .list(&Filter {
                resource_prefix: format!("statement:{}", self.accounts),
                limit: 100_000,
                ..Filter::default()
            })
            .await
    }

    /// Emails that arrived more than once, by operation.
    fn duplicate_emails(&self) -> u64 {
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        for entry in std::fs::read_dir(&self.mail_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.path().extension().is_none_or(|e| e != "eml") {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if let Some(op) = text
                .lines()
                .find_map(|l| l.strip_prefix("X-Baton-Operation: "))
            {
                *seen.entry(op.to_string()).or_default() += 1;
            }
        }
        seen.values().filter(|n| **n > 1).count() as u64
    }
}

#[async_trait::async_trait(?Send)]
impl Effects for StatementsEffects {
    fn worker_args(&self) -> Vec<String> {
        vec![
            "--notify-webhook".into(),
            self.hooks_url.clone(),
            "--notify-email".into(),
            "customer@example.com".into(),
        ]
    }

    fn dispatcher_command(
        &self,
        name: &str,
        server_url: &str,
        ttl: Duration,
    ) -> tokio::process::Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(["dispatch", "--database-url", &self.database_url])
            .args(["--server", server_url, "--name", name])
            .args(["--ttl", &format!("{}ms", ttl.as_millis())])
            .args([
                "--poll",
                "100ms",
                "--send-timeout",
                "1s",
                "--max-attempts",
                "30",
            ])
            .args(["--backoff", "50ms", "--backoff-max", "2s"])
            .args(["--smtp", &self.smtp_addr]);
        if self.blind {
            cmd.arg("--blind-retries");
        }
        cmd
    }

    async fn unsettled(&self) -> anyhow::Result<u64> {
        let open = ["pending", "claimed", "sending", "accepted"];
        Ok(self
            .rows()
            .await?
            .iter()
            .filter(|d| open.contains(&d.state.as_str()))
            .count() as u64)
    }

    async fn figures(&self) -> anyhow::Result<DeliveryFigures> {
        let rows = self.rows().await?;
        let count = |s: &str| rows.iter().filter(|d| d.state == s).count() as u64;
        let settled: BTreeSet<&str> = rows
            .iter()
            .filter(|d| d.state == "delivered" || d.state == "needs_attention")
            .map(|d| d.operation.as_str())
            .collect();
        let db = store::open(&Location {
            db: PathBuf::new(),
            database_url: Some(self.database_url.clone()),
        })
        .await?;
        let published = db
            .publication_log(&format!("statement:{}", self.accounts))
            .await?;
        let lost = published
            .iter()
            .flat_map(|p| ["webhook", "email"].map(|kind| format!("{}/{kind}", p.operation)))
            .filter(|op| !settled.contains(op.as_str()))
            .count() as u64;
        let stats: serde_json::Value = reqwest::get(format!("http://{}/stats", self.receiver_addr))
            .await
            .context("the webhook receiver's stats")?
            .json()
            .await
            .context("the webhook receiver's stats")?;
        let webhook_duplicates = stats["duplicates"].as_u64().unwrap_or(0);
        let resets = std::fs::read_to_string(self.mail_dir.join("dropped.log"))
            .map(|t| t.lines().count() as u64)
            .unwrap_or(0);
        Ok(DeliveryFigures {
            deliveries: rows.len() as u64,
            delivered: count("delivered"),
            needs_attention: count("needs_attention"),
            failed: count("failed"),
            unsettled: count("pending") + count("claimed") + count("sending") + count("accepted"),
            duplicate_deliveries: webhook_duplicates + self.duplicate_emails(),
            lost_deliveries: lost,
            receiver_faults: BTreeMap::from([
                (
                    "webhook_responses_dropped".to_string(),
                    self.proxy.counts().dropped_responses,
                ),
                ("smtp_connections_reset_after_data".to_string(), resets),
            ]),
        })
    }
}
