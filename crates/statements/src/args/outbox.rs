//! The outbox's flags: `statements dispatch` and `statements deliveries`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use baton_client::flags::parse_positive_duration;
use clap::Subcommand;

use super::Paths;

#[derive(Subcommand)]
pub enum DeliveriesCommand {
    /// The deliveries, oldest first, with their state and evidence.
    List {
        #[command(flatten)]
        paths: Paths,
        /// Only this state: pending, claimed, sending, accepted, delivered,
        /// failed, needs_attention, cancelled, abandoned.
        #[arg(long, value_parser = parse_delivery_state)]
        state: Option<baton_fence::outbox::DeliveryState>,
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One delivery with its history (every claim, send and outcome).
    Show {
        #[command(flatten)]
        paths: Paths,
        id: i64,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// An operator's decision on a delivery that needs attention or
    /// failed, recorded with who, when and why.
    #[command(group(clap::ArgGroup::new("decision").required(true).multiple(false)))]
    Resolve {
        #[command(flatten)]
        paths: Paths,
        id: i64,
        /// It arrived (you checked with the recipient or the provider).
        #[arg(long, group = "decision")]
        delivered: bool,
        /// Send it again. For a receiver that cannot deduplicate (email),
        /// this may deliver a second copy: you are asked to confirm.
        #[arg(long, group = "decision")]
        resend: bool,
        /// Do not send it.
        #[arg(long, group = "decision")]
        abandon: bool,
        /// Why (kept with the decision).
        #[arg(long)]
        reason: String,
        /// Who decides (default: $USER).
        #[arg(long)]
        by: Option<String>,
        /// Do not ask before a resend that may duplicate.
        #[arg(long)]
        yes: bool,
    },
}

fn parse_delivery_state(s: &str) -> anyhow::Result<baton_fence::outbox::DeliveryState> {
    baton_fence::outbox::DeliveryState::parse(s).ok_or_else(|| {
        let all: Vec<&str> = baton_fence::outbox::DeliveryState::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        anyhow::anyhow!("{s:?} is not a delivery state; one of {}", all.join(", "))
    })
}

/// `statements dispatch`.
#[derive(clap::Args)]
pub struct DispatchArgs {
    #[command(flatten)]
    pub paths: Paths,
    /// The Baton server whose leases claim each delivery.
    #[arg(long, default_value = "http://127.0.0.1:7700")]
    pub server: String,
    /// The dispatcher's name, in its events and the deliveries' history.
    #[arg(long, default_value = "dispatcher")]
    pub name: String,
    /// The lease on a delivery while it is sent.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub ttl: Duration,
    /// Time between polls for due deliveries.
    #[arg(long, default_value = "200ms", value_parser = parse_positive_duration)]
    pub poll: Duration,
    /// One pass over the due deliveries, then exit.
    #[arg(long)]
    pub once: bool,
    /// The SMTP relay for email deliveries, HOST:PORT (plain SMTP).
    #[arg(long, value_name = "HOST:PORT")]
    pub smtp: Option<String>,
    /// The sender of email deliveries.
    #[arg(long, default_value = "statements@localhost")]
    pub smtp_from: String,
    /// How long a send may take before its outcome counts as unknown.
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub send_timeout: Duration,
    /// Sends per delivery before it fails (1 to 100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_attempts: u32,
    /// The first retry's backoff ceiling; it doubles per attempt (full jitter).
    #[arg(long, default_value = "500ms", value_parser = parse_positive_duration)]
    pub backoff: Duration,
    /// The largest backoff ceiling.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    pub backoff_max: Duration,
    /// How long an accepted webhook delivery waits for its callback before
    /// its status is asked.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    pub confirm_wait: Duration,
    /// Serve the receivers' confirmations at http://ADDR/callback.
    #[arg(long, value_name = "ADDR")]
    pub callback_listen: Option<std::net::SocketAddr>,
    /// Serve the dispatcher's metrics (the outbox's recorded outcomes,
    /// `baton_outbox_records_total`) for Prometheus at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// A file holding the bearer token every callback must present
    /// (`Authorization: Bearer TOKEN`); required with --callback-listen.
    #[arg(long, value_name = "PATH")]
    pub callback_token_file: Option<PathBuf>,
    /// Drill: abort right after a send, before recording its outcome.
    #[arg(long, hide = true)]
    pub crash_after_send: bool,
    /// Drill: SIGSTOP right after a send, before recording its outcome.
    #[arg(long, hide = true)]
    pub pause_after_send: bool,
    /// NEGATIVE CONTROL ONLY: no idempotency keys, and unknown outcomes
    /// retried for every receiver. Exists to prove the checks see duplicates.
    #[arg(long, hide = true)]
    pub blind_retries: bool,
}

impl TryFrom<DispatchArgs> for crate::dispatch::DispatchConfig {
    type Error = anyhow::Error;

    fn try_from(a: DispatchArgs) -> anyhow::Result<Self> {
        let callback_token = match &a.callback_token_file {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--callback-token-file {}", path.display()))?;
                let token = text.trim().to_string();
                if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    anyhow::bail!(
                        "--callback-token-file {}: the token must be at least 16 characters, with no spaces or control characters",
                        path.display()
                    );
                }
                Some(token)
            }
        };
        Ok(Self {
            target: a.paths.target(),
            server: a.server,
            name: a.name,
            ttl: a.ttl,
            poll: a.poll,
            once: a.once,
            smtp: a.smtp,
            smtp_from: a.smtp_from,
            send_timeout: a.send_timeout,
            max_attempts: a.max_attempts,
            backoff_base: a.backoff,
            backoff_max: a.backoff_max.max(a.backoff),
            confirm_wait: a.confirm_wait,
            callback_listen: a.callback_listen,
            callback_token,
            drills: crate::dispatch::Drills {
                crash_after_send: a.crash_after_send,
                pause_after_send: a.pause_after_send,
                blind_retries: a.blind_retries,
            },
        })
    }
}
