//! The outbox: external effects that no token can guard.
//!
//! An email gateway or a third party's API cannot check a fencing token.
//! For those, the fenced write that causes the effect also records a
//! delivery intent ([`Intent`]) in the same transaction, so a stale owner's
//! intent is refused together with its write; a dispatcher sends it later.
//! Each send is claimed with a fencing token (the Rust kit's users take a
//! Baton lease on the row), so a stale dispatcher's outcome cannot
//! overwrite a newer one. What is safe after a send whose outcome is not
//! known depends on the receiver ([`ReceiverKind`]): an idempotent,
//! queryable receiver is asked, or sent the same key again; any other goes
//! to [`DeliveryState::NeedsAttention`] for an operator, never to a second
//! send on its own.
//!
//! PostgreSQL: the functions of `sql/008_outbox.sql` (`baton.outbox_*`),
//! callable from any language; [`postgres::PgOutbox`] calls them. SQLite:
//! the same rules in Rust, [`sqlite::SqliteOutbox`].

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use crate::types::text;
use crate::InputError;

/// Longest outbox operation id (the idempotency key), in bytes.
pub const OUTBOX_OPERATION_LEN_BYTES_MAX: usize = 256;
/// Longest recipient (an address, a URL), in bytes.
pub const RECIPIENT_LEN_BYTES_MAX: usize = 2_048;
/// Largest payload, in bytes.
pub const PAYLOAD_LEN_BYTES_MAX: usize = 1_048_576;
/// Longest retry delay a dispatcher may ask for, in milliseconds (a day).
pub const RETRY_AFTER_MS_MAX: u64 = 86_400_000;

/// What a receiver promises, which decides what is safe after a send whose
/// outcome is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiverKind {
    /// Honours an idempotency key and answers a status query for it: a
    /// send may be repeated with the same key, and its status asked.
    Idempotent,
    /// Neither (SMTP): an unknown outcome needs an operator.
    Unrepeatable,
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting for a dispatcher (due at its next attempt time).
    Pending,
    /// Taken by a dispatcher; nothing sent yet.
    Claimed,
    /// A send began; until its outcome is recorded it may or may not have arrived.
    Sending,
    /// The receiver took it and will confirm (callback or status query).
    Accepted,
    /// It arrived.
    Delivered,
    /// The receiver refused it for good, or the attempts ran out.
    Failed,
    /// Its outcome cannot be known and it cannot be safely repeated: an operator decides.
    NeedsAttention,
    /// Cancelled before it was sent.
    Cancelled,
    /// An operator decided it is not to be sent.
    Abandoned,
}

impl ReceiverKind {
    /// The stored label.
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiverKind::Idempotent => "idempotent",
            ReceiverKind::Unrepeatable => "unrepeatable",
        }
    }

    /// Reads a label.
    pub fn parse(label: &str) -> Option<Self> {
        [Self::Idempotent, Self::Unrepeatable]
            .into_iter()
            .find(|k| k.as_str() == label)
    }
}

impl DeliveryState {
    /// Every state, in the order of a delivery's life.
    pub const ALL: [DeliveryState; 9] = [
        Self::Pending,
        Self::Claimed,
        Self::Sending,
        Self::Accepted,
        Self::Delivered,
        Self::Failed,
        Self::NeedsAttention,
        Self::Cancelled,
        Self::Abandoned,
    ];

    /// The stored label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Claimed => "claimed",
            Self::Sending => "sending",
            Self::Accepted => "accepted",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
            Self::NeedsAttention => "needs_attention",
            Self::Cancelled => "cancelled",
            Self::Abandoned => "abandoned",
        }
    }

    /// Reads a label.
    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == label)
    }

    /// No dispatcher moves a delivery out of a final state (an operator may
    /// resolve `needs_attention` and `failed`).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Delivered
                | Self::Failed
                | Self::NeedsAttention
                | Self::Cancelled
                | Self::Abandoned
        )
    }
}

impl std::fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for ReceiverKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A delivery intent, checked: an operation id that is the receiver's
/// idempotency key (stable across every attempt), the receiver's kind, a
/// recipient and the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    /// The stable operation id; one row per id.
    pub operation: String,
    /// What the receiver promises.
    pub kind: ReceiverKind,
    /// Where it goes (an address, a URL).
    pub recipient: String,
    /// What is sent.
    pub payload: Vec<u8>,
}

impl Intent {
    /// Checks the sizes and characters; nothing is written when it fails.
    pub fn new(
        operation: &str,
        kind: ReceiverKind,
        recipient: &str,
        payload: Vec<u8>,
    ) -> Result<Self, InputError> {
        let operation = text(
            "outbox operation id",
            operation,
            OUTBOX_OPERATION_LEN_BYTES_MAX,
        )?;
        let recipient = text("recipient", recipient, RECIPIENT_LEN_BYTES_MAX)?;
        if payload.len() > PAYLOAD_LEN_BYTES_MAX {
            return Err(InputError::TooLong {
                field: "payload",
                len_bytes: payload.len(),
                len_bytes_max: PAYLOAD_LEN_BYTES_MAX,
            });
        }
        Ok(Self {
            operation,
            kind,
            recipient,
            payload,
        })
    }
}

/// What became of one send, recorded with the claim's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// It arrived (the receiver said so, or its status query did).
    Delivered,
    /// The receiver took it and will confirm; ask again after this long.
    Accepted {
        /// When to query its status if no confirmation came.
        check_after_ms: u64,
    },
    /// It did not arrive and may be sent again: back to pending, due after this long.
    Retry {
        /// The backoff before the next attempt.
        after_ms: u64,
    },
    /// Refused for good, or out of attempts.
    Failed,
    /// Its outcome is unknown and it cannot be safely repeated.
    NeedsAttention,
    /// A cancellation came first; nothing was sent.
    Cancelled,
}

impl Report {
    /// The label `baton.outbox_record` takes.
    pub fn label(self) -> &'static str {
        match self {
            Report::Delivered => "delivered",
            Report::Accepted { .. } => "accepted",
            Report::Retry { .. } => "retry",
            Report::Failed => "failed",
            Report::NeedsAttention => "needs_attention",
            Report::Cancelled => "cancelled",
        }
    }

    fn after_ms(self) -> u64 {
        match self {
            Report::Accepted { check_after_ms } => check_after_ms,
            Report::Retry { after_ms } => after_ms,
            _ => 0,
        }
        .min(RETRY_AFTER_MS_MAX)
    }

    fn state(self) -> DeliveryState {
        match self {
            Report::Delivered => DeliveryState::Delivered,
            Report::Accepted { .. } => DeliveryState::Accepted,
            Report::Retry { .. } => DeliveryState::Pending,
            Report::Failed => DeliveryState::Failed,
            Report::NeedsAttention => DeliveryState::NeedsAttention,
            Report::Cancelled => DeliveryState::Cancelled,
        }
    }
}

/// An operator's decision on a delivery that needs attention or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It arrived (the operator checked).
    Delivered,
    /// Send it again, as a new attempt.
    Resend,
    /// Do not send it.
    Abandon,
}

impl Resolution {
    /// The label `baton.outbox_resolve` takes.
    pub fn label(self) -> &'static str {
        match self {
            Resolution::Delivered => "delivered",
            Resolution::Resend => "resend",
            Resolution::Abandon => "abandon",
        }
    }

    fn state(self) -> DeliveryState {
        match self {
            Resolution::Delivered => DeliveryState::Delivered,
            Resolution::Resend => DeliveryState::Pending,
            Resolution::Abandon => DeliveryState::Abandoned,
        }
    }
}

/// What an outbox call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// The intent was recorded.
    Enqueued,
    /// The same intent was already recorded (a replay).
    Exists,
    /// The operation id was recorded with a different intent.
    Conflict,
    /// No such row, or (enqueue) no fenced write for the resource.
    Missing,
    /// The token is not the one in force: refused, nothing changed.
    Stale,
    /// The resource or the delivery was cancelled.
    Cancelled,
    /// The delivery is final: nothing changed.
    Final,
    /// A pending delivery whose next attempt is not due yet.
    NotDue,
    /// Claimed for one send.
    Claimed,
    /// The send may begin.
    Sending,
    /// The outcome was recorded.
    Recorded,
    /// A receiver's confirmation settled the delivery.
    Confirmed,
    /// A receiver's confirmation came for a final delivery: nothing changed.
    Ignored,
    /// An operator's resolution was recorded.
    Resolved,
    /// Only deliveries that need attention or failed are resolved.
    NotResolvable,
}

impl StepOutcome {
    /// The label the SQL functions return.
    pub fn label(self) -> &'static str {
        match self {
            Self::Enqueued => "enqueued",
            Self::Exists => "exists",
            Self::Conflict => "conflict",
            Self::Missing => "missing",
            Self::Stale => "stale",
            Self::Cancelled => "cancelled",
            Self::Final => "final",
            Self::NotDue => "not_due",
            Self::Claimed => "claimed",
            Self::Sending => "sending",
            Self::Recorded => "recorded",
            Self::Confirmed => "confirmed",
            Self::Ignored => "ignored",
            Self::Resolved => "resolved",
            Self::NotResolvable => "not_resolvable",
        }
    }

    /// Reads a label.
    pub fn parse(label: &str) -> Option<Self> {
        [
            Self::Enqueued,
            Self::Exists,
            Self::Conflict,
            Self::Missing,
            Self::Stale,
            Self::Cancelled,
            Self::Final,
            Self::NotDue,
            Self::Claimed,
            Self::Sending,
            Self::Recorded,
            Self::Confirmed,
            Self::Ignored,
            Self::Resolved,
            Self::NotResolvable,
        ]
        .into_iter()
        .find(|o| o.label() == label)
    }
}

/// The answer of every outbox call: what it did and the row as it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the call did.
    pub outcome: StepOutcome,
    /// The row, when there is one.
    pub id: Option<i64>,
    /// Its state after the call.
    pub state: Option<DeliveryState>,
    /// The token of its latest claim (0: never claimed).
    pub claim_token: Option<i64>,
    /// Sends begun so far.
    pub attempts: Option<i32>,
    /// For a claim: the state the row was in (`sending` or `accepted`: an
    /// earlier send's outcome is unknown). Otherwise why, when refused.
    pub detail: Option<String>,
}

impl Step {
    /// For a claim: the state the row was in before it.
    pub fn previous(&self) -> Option<DeliveryState> {
        self.detail.as_deref().and_then(DeliveryState::parse)
    }
}

/// One delivery, as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Delivery {
    /// The row's id.
    pub id: i64,
    /// The operation id (the idempotency key).
    pub operation: String,
    /// The resource whose fenced write recorded it.
    pub resource: String,
    /// That write's token.
    pub token: i64,
    /// What the receiver promises.
    pub receiver_kind: String,
    /// Where it goes.
    pub recipient: String,
    /// SHA-256 of the payload, hex.
    pub payload_sha256: String,
    /// Its state.
    pub state: String,
    /// Sends begun.
    pub attempts: i32,
    /// The latest claim's token (0: never claimed).
    pub claim_token: i64,
    /// The latest claimant.
    pub claimed_by: Option<String>,
    /// The latest outcome's evidence (the receiver's answer, the error).
    pub evidence: Option<String>,
    /// When it was recorded (UTC, the database's clock).
    pub created_at: String,
    /// When the latest send began.
    pub send_started_at: Option<String>,
    /// When it is due (pending) or to be checked (accepted).
    pub next_attempt_at: String,
    /// Who resolved it, when and how, and why.
    pub resolved_by: Option<String>,
    /// When it was resolved.
    pub resolved_at: Option<String>,
    /// delivered, resend or abandon.
    pub resolution: Option<String>,
    /// The operator's reason.
    pub resolution_reason: Option<String>,
}

/// One step in a delivery's history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeliveryEvent {
    /// When (UTC, the database's clock).
    pub at: String,
    /// The claim's token, if the step had one.
    pub token: Option<i64>,
    /// Who (a dispatcher, an operator).
    pub actor: Option<String>,
    /// What: enqueued, claimed, sending, delivered, refused_stale_outcome, ...
    pub event: String,
    /// The evidence.
    pub detail: Option<String>,
}

/// Filters for a listing of deliveries.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this state.
    pub state: Option<DeliveryState>,
    /// Only resources starting with this.
    pub resource_prefix: String,
    /// At most this many, oldest first (0: 1000).
    pub limit: u32,
}

impl Filter {
    fn limit(&self) -> i64 {
        if self.limit == 0 {
            1000
        } else {
            i64::from(self.limit.min(100_000))
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for s in DeliveryState::ALL {
            assert_eq!(DeliveryState::parse(s.as_str()), Some(s));
        }
        for k in [ReceiverKind::Idempotent, ReceiverKind::Unrepeatable] {
            assert_eq!(ReceiverKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(DeliveryState::parse("sent"), None);
    }

    #[test]
    fn intents_name_the_rule_they_break() {
        let e = Intent::new("", ReceiverKind::Idempotent, "x", vec![]).unwrap_err();
        assert_eq!(e.to_string(), "outbox operation id is empty");
        let e = Intent::new("op", ReceiverKind::Idempotent, "a\nb", vec![]).unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
        let big = vec![0; PAYLOAD_LEN_BYTES_MAX + 1];
        let e = Intent::new("op", ReceiverKind::Unrepeatable, "x", big).unwrap_err();
        assert!(e.to_string().contains("the limit is 1048576"), "{e}");
    }
}
