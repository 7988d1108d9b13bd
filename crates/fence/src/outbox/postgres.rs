//! The outbox on PostgreSQL: the `baton.outbox_*` functions of migration 8.

use tokio_postgres::{GenericClient, Row};

use super::{
    hex, Delivery, DeliveryEvent, DeliveryState, Filter, Intent, Report, Resolution, Step,
    StepOutcome,
};
use crate::{FenceError, FencingToken, ResourceName};

/// The outbox's columns as text, times in UTC on the database's clock.
const COLUMNS: &str =
    "id, operation, resource, token, receiver_kind, recipient, payload_digest, state,
    attempts, claim_token, claimed_by, evidence,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(send_started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    resolved_by, to_char(resolved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    resolution, resolution_reason";

fn delivery(r: &Row) -> Result<Delivery, FenceError> {
    let digest: Vec<u8> = r.try_get(6)?;
    Ok(Delivery {
        id: r.try_get(0)?,
        operation: r.try_get(1)?,
        resource: r.try_get(2)?,
        token: r.try_get(3)?,
        receiver_kind: r.try_get(4)?,
        recipient: r.try_get(5)?,
        payload_sha256: hex(&digest),
        state: r.try_get(7)?,
        attempts: r.try_get(8)?,
        claim_token: r.try_get(9)?,
        claimed_by: r.try_get(10)?,
        evidence: r.try_get(11)?,
        created_at: r.try_get(12)?,
        send_started_at: r.try_get(13)?,
        next_attempt_at: r.try_get(14)?,
        resolved_by: r.try_get(15)?,
        resolved_at: r.try_get(16)?,
        resolution: r.try_get(17)?,
        resolution_reason: r.try_get(18)?,
    })
}

fn step(r: &Row) -> Result<Step, FenceError> {
    let label: String = r.try_get(0)?;
    let state: Option<String> = r.try_get(2)?;
    Ok(Step {
        outcome: StepOutcome::parse(&label)
            .ok_or_else(|| FenceError::Corrupt(format!("outbox outcome {label:?}")))?,
        id: r.try_get(1)?,
        state: state
            .map(|s| {
                DeliveryState::parse(&s)
                    .ok_or_else(|| FenceError::Corrupt(format!("outbox state {s:?}")))
            })
            .transpose()?,
        claim_token: r.try_get(3)?,
        attempts: r.try_get(4)?,
        detail: r.try_get(5)?,
    })
}

/// The outbox on PostgreSQL. Every call takes any client: pass the
/// transaction of the fenced write to [`PgOutbox::enqueue`].
pub struct PgOutbox;

impl PgOutbox {
    /// Records `intent`, fenced: only while `token` is `resource`'s
    /// generation, so call it in the transaction whose fence or publish
    /// applied. A replay of the same intent is [`StepOutcome::Exists`]; the
    /// same operation id with another intent is [`StepOutcome::Conflict`].
    pub async fn enqueue(
        client: &impl GenericClient,
        resource: &ResourceName,
        token: FencingToken,
        intent: &Intent,
    ) -> Result<Step, FenceError> {
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_enqueue($1, $2, $3, $4, $5, $6)",
                &[
                    &resource.as_str(),
                    &token.bigint(),
                    &intent.operation,
                    &intent.kind.as_str(),
                    &intent.recipient,
                    &intent.payload,
                ],
            )
            .await?;
        step(&row)
    }

    /// Takes delivery `id` for one send with `token` (above every earlier claim's).
    pub async fn claim(
        client: &impl GenericClient,
        id: i64,
        token: FencingToken,
        claimed_by: &str,
    ) -> Result<Step, FenceError> {
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_claim($1, $2, $3)",
                &[&id, &token.bigint(), &claimed_by],
            )
            .await?;
        step(&row)
    }

    /// Marks the send as begun, just before sending. Anything but
    /// [`StepOutcome::Sending`] means: do not send.
    pub async fn begin_send(
        client: &impl GenericClient,
        id: i64,
        token: FencingToken,
    ) -> Result<Step, FenceError> {
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_begin_send($1, $2)",
                &[&id, &token.bigint()],
            )
            .await?;
        step(&row)
    }

    /// Records what became of the send, with the claim's token; a newer
    /// claim's row refuses it ([`StepOutcome::Stale`]).
    pub async fn record(
        client: &impl GenericClient,
        id: i64,
        token: FencingToken,
        report: Report,
        evidence: &str,
    ) -> Result<Step, FenceError> {
        let after_ms = report.after_ms() as i64;
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_record($1, $2, $3, $4, $5)",
                &[&id, &token.bigint(), &report.label(), &evidence, &after_ms],
            )
            .await?;
        let step = step(&row)?;
        crate::metrics::outbox_recorded(report, &step);
        Ok(step)
    }

    /// A receiver's confirmation (a callback) for the delivery whose
    /// operation id is `operation`; ignored for a final delivery.
    pub async fn confirm(
        client: &impl GenericClient,
        operation: &str,
        delivered: bool,
        evidence: &str,
    ) -> Result<Step, FenceError> {
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_confirm($1, $2, $3)",
                &[&operation, &delivered, &evidence],
            )
            .await?;
        step(&row)
    }

    /// Cancels `resource`'s deliveries that were not sent; returns how many.
    /// Call it in the transaction that cancels the work.
    pub async fn cancel(
        client: &impl GenericClient,
        resource: &ResourceName,
        actor: &str,
    ) -> Result<u64, FenceError> {
        let n: i64 = client
            .query_one(
                "SELECT baton.outbox_cancel($1, $2)",
                &[&resource.as_str(), &actor],
            )
            .await?
            .try_get(0)?;
        Ok(n as u64)
    }

    /// An operator's decision on a delivery that needs attention or failed.
    pub async fn resolve(
        client: &impl GenericClient,
        id: i64,
        resolution: Resolution,
        actor: &str,
        reason: &str,
    ) -> Result<Step, FenceError> {
        let row = client
            .query_one(
                "SELECT * FROM baton.outbox_resolve($1, $2, $3, $4)",
                &[&id, &resolution.label(), &actor, &reason],
            )
            .await?;
        step(&row)
    }

    /// Deliveries a dispatcher should look at, oldest due first: pending
    /// and due, or in flight (claimed, sending, accepted) past their time,
    /// whose dispatcher may have died. Contention is the claimant's lease.
    pub async fn due(client: &impl GenericClient, limit: u32) -> Result<Vec<Delivery>, FenceError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM baton.outbox
             WHERE state IN ('pending', 'claimed', 'sending', 'accepted') AND next_attempt_at <= now()
             ORDER BY next_attempt_at, id LIMIT $1"
        );
        let limit = Filter {
            limit,
            ..Filter::default()
        }
        .limit();
        client
            .query(&sql, &[&limit])
            .await?
            .iter()
            .map(delivery)
            .collect()
    }

    /// Deliveries by state and resource prefix, oldest first.
    pub async fn list(
        client: &impl GenericClient,
        filter: &Filter,
    ) -> Result<Vec<Delivery>, FenceError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM baton.outbox
             WHERE ($1::text IS NULL OR state = $1) AND left(resource, length($2)) = $2
             ORDER BY id LIMIT $3"
        );
        let state = filter.state.map(|s| s.as_str());
        client
            .query(&sql, &[&state, &filter.resource_prefix, &filter.limit()])
            .await?
            .iter()
            .map(delivery)
            .collect()
    }

    /// One delivery.
    pub async fn get(client: &impl GenericClient, id: i64) -> Result<Option<Delivery>, FenceError> {
        let sql = format!("SELECT {COLUMNS} FROM baton.outbox WHERE id = $1");
        client
            .query_opt(&sql, &[&id])
            .await?
            .as_ref()
            .map(delivery)
            .transpose()
    }

    /// The payload of a delivery.
    pub async fn payload(
        client: &impl GenericClient,
        id: i64,
    ) -> Result<Option<Vec<u8>>, FenceError> {
        Ok(client
            .query_opt("SELECT payload FROM baton.outbox WHERE id = $1", &[&id])
            .await?
            .map(|r| r.try_get(0))
            .transpose()?)
    }

    /// The history of a delivery, oldest first.
    pub async fn events(
        client: &impl GenericClient,
        id: i64,
    ) -> Result<Vec<DeliveryEvent>, FenceError> {
        client
            .query(
                "SELECT to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), token, actor, event, detail
                 FROM baton.outbox_events WHERE outbox_id = $1 ORDER BY id",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(DeliveryEvent {
                    at: r.try_get(0)?,
                    token: r.try_get(1)?,
                    actor: r.try_get(2)?,
                    event: r.try_get(3)?,
                    detail: r.try_get(4)?,
                })
            })
            .collect()
    }
}
