//! The outbox's rules, one suite against SQLite and a real PostgreSQL
//! server: a fenced enqueue, claims with tokens, a stale dispatcher's late
//! outcome refused, retries, callbacks, cancellation and resolution.

use baton_fence::outbox::postgres::PgOutbox;
use baton_fence::outbox::sqlite::SqliteOutbox;
use baton_fence::outbox::{
    DeliveryEvent, DeliveryState, Intent, ReceiverKind, Report, Resolution, Step, StepOutcome,
};
use baton_fence::postgres::PgFence;
use baton_fence::sqlite::SqliteFence;
use baton_fence::{resource_name, FenceError, FenceRequest, FencingToken, Policy};
use baton_testkit::{unique, PgDb};
use rusqlite::{Connection, TransactionBehavior};
use tokio_postgres::Client;

fn t(n: u64) -> FencingToken {
    FencingToken::of(n).unwrap()
}

fn intent(op: &str, kind: ReceiverKind, payload: &str) -> Intent {
    Intent::new(op, kind, "ops@example.com", payload.as_bytes().to_vec()).unwrap()
}

#[allow(async_fn_in_trait)]
trait Backend {
    /// A fenced publish at `token`, and `intent` in its transaction.
    async fn publish(&mut self, resource: &str, token: u64, intent: &Intent) -> Step;
    async fn enqueue(&mut self, resource: &str, token: u64, intent: &Intent) -> Step;
    async fn claim(&mut self, id: i64, token: u64) -> Step;
    async fn begin(&mut self, id: i64, token: u64) -> Step;
    async fn record(&mut self, id: i64, token: u64, report: Report, evidence: &str) -> Step;
    async fn confirm(&mut self, op: &str, delivered: bool) -> Step;
    async fn cancel(&mut self, resource: &str) -> u64;
    async fn resolve(&mut self, id: i64, r: Resolution, reason: &str) -> Result<Step, String>;
    async fn events(&mut self, id: i64) -> Vec<DeliveryEvent>;
    async fn fence_cancel(&mut self, resource: &str, at: u64);
}

fn publish_req(resource: &str, token: u64) -> FenceRequest {
    FenceRequest::new(
        resource,
        FencingToken::of(token).unwrap(),
        &format!("publish-{token}"),
        b"digest",
        b"key",
    )
    .unwrap()
}

struct Sqlite(Connection);

impl Backend for Sqlite {
    async fn publish(&mut self, resource: &str, token: u64, intent: &Intent) -> Step {
        let mut step = None;
        let key = resource_name(resource).unwrap();
        SqliteFence::publish_with(&mut self.0, &publish_req(resource, token), |tx| {
            step = Some(SqliteOutbox::enqueue(tx, &key, t(token), intent)?);
            Ok::<(), FenceError>(())
        })
        .unwrap();
        step.expect("the publish applied")
    }
    async fn enqueue(&mut self, resource: &str, token: u64, intent: &Intent) -> Step {
        let tx = self
            .0
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let step = SqliteOutbox::enqueue(&tx, &resource_name(resource).unwrap(), t(token), intent)
            .unwrap();
        tx.commit().unwrap();
        step
    }
    async fn claim(&mut self, id: i64, token: u64) -> Step {
        SqliteOutbox::claim(&mut self.0, id, t(token), &format!("d{token}")).unwrap()
    }
    async fn begin(&mut self, id: i64, token: u64) -> Step {
        SqliteOutbox::begin_send(&mut self.0, id, t(token)).unwrap()
    }
    async fn record(&mut self, id: i64, token: u64, report: Report, evidence: &str) -> Step {
        SqliteOutbox::record(&mut self.0, id, t(token), report, evidence).unwrap()
    }
    async fn confirm(&mut self, op: &str, delivered: bool) -> Step {
        SqliteOutbox::confirm(&mut self.0, op, delivered, "callback").unwrap()
    }
    async fn cancel(&mut self, resource: &str) -> u64 {
        let tx = self.0.transaction().unwrap();
        let n = SqliteOutbox::cancel(&tx, &resource_name(resource).unwrap(), "operator").unwrap();
        tx.commit().unwrap();
        n
    }
    async fn resolve(&mut self, id: i64, r: Resolution, reason: &str) -> Result<Step, String> {
        SqliteOutbox::resolve(&mut self.0, id, r, "alice", reason).map_err(|e| e.to_string())
    }
    async fn events(&mut self, id: i64) -> Vec<DeliveryEvent> {
        SqliteOutbox::events(&self.0, id).unwrap()
    }
    async fn fence_cancel(&mut self, resource: &str, at: u64) {
        SqliteFence::cancel(
            &mut self.0,
            &resource_name(resource).unwrap(),
            Policy::OnePerGeneration,
            t(at),
        )
        .unwrap();
    }
}

struct Pg(Client);

impl Backend for Pg {
    async fn publish(&mut self, resource: &str, token: u64, intent: &Intent) -> Step {
        let key = resource_name(resource).unwrap();
        let prepared = PgFence::prepare(&self.0).await.unwrap();
        let tx = self.0.transaction().await.unwrap();
        let outcome = PgFence::publish(&tx, &prepared, &publish_req(resource, token))
            .await
            .unwrap();
        assert!(outcome.is_applied(), "{outcome:?}");
        let step = PgOutbox::enqueue(&tx, &key, t(token), intent)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        step
    }
    async fn enqueue(&mut self, resource: &str, token: u64, intent: &Intent) -> Step {
        PgOutbox::enqueue(&self.0, &resource_name(resource).unwrap(), t(token), intent)
            .await
            .unwrap()
    }
    async fn claim(&mut self, id: i64, token: u64) -> Step {
        PgOutbox::claim(&self.0, id, t(token), &format!("d{token}"))
            .await
            .unwrap()
    }
    async fn begin(&mut self, id: i64, token: u64) -> Step {
        PgOutbox::begin_send(&self.0, id, t(token)).await.unwrap()
    }
    async fn record(&mut self, id: i64, token: u64, report: Report, evidence: &str) -> Step {
        PgOutbox::record(&self.0, id, t(token), report, evidence)
            .await
            .unwrap()
    }
    async fn confirm(&mut self, op: &str, delivered: bool) -> Step {
        PgOutbox::confirm(&self.0, op, delivered, "callback")
            .await
            .unwrap()
    }
    async fn cancel(&mut self, resource: &str) -> u64 {
        PgOutbox::cancel(&self.0, &resource_name(resource).unwrap(), "operator")
            .await
            .unwrap()
    }
    async fn resolve(&mut self, id: i64, r: Resolution, reason: &str) -> Result<Step, String> {
        PgOutbox::resolve(&self.0, id, r, "alice", reason)
            .await
            .map_err(|e| e.to_string())
    }
    async fn events(&mut self, id: i64) -> Vec<DeliveryEvent> {
        PgOutbox::events(&self.0, id).await.unwrap()
    }
    async fn fence_cancel(&mut self, resource: &str, at: u64) {
        PgFence::cancel(
            &self.0,
            &resource_name(resource).unwrap(),
            Policy::OnePerGeneration,
            t(at),
        )
        .await
        .unwrap();
    }
}

/// A file of its own for each test, in a directory removed with it.
fn sqlite() -> (Sqlite, baton_testkit::TempDir) {
    let dir = baton_testkit::TempDir::new(&unique("baton_outbox"));
    let conn = Connection::open(dir.path().join("outbox.sqlite")).unwrap();
    SqliteFence::migrate(&conn).unwrap();
    (Sqlite(conn), dir)
}

async fn pg(db: &PgDb) -> Pg {
    let mut client = db.connect().await;
    PgFence::migrate(&mut client).await.unwrap();
    Pg(client)
}

fn state(step: &Step) -> DeliveryState {
    step.state.expect("a row")
}

/// The intent is fenced: none without a write at its token, a replay is
/// the same row, the same id with another payload is a conflict.
async fn enqueue_is_fenced(b: &mut impl Backend) {
    let i = intent("deliver-1", ReceiverKind::Idempotent, "hello");
    assert_eq!(
        b.enqueue("acct:1", 5, &i).await.outcome,
        StepOutcome::Missing
    );
    let first = b.publish("acct:1", 5, &i).await;
    assert_eq!(first.outcome, StepOutcome::Enqueued);
    assert_eq!(state(&first), DeliveryState::Pending);
    let again = b.enqueue("acct:1", 5, &i).await;
    assert_eq!((again.outcome, again.id), (StepOutcome::Exists, first.id));
    let other = intent("deliver-1", ReceiverKind::Idempotent, "changed");
    assert_eq!(
        b.enqueue("acct:1", 5, &other).await.outcome,
        StepOutcome::Conflict
    );
    // A stale owner (token 4) cannot add an intent.
    let stale = intent("deliver-stale", ReceiverKind::Idempotent, "x");
    assert_eq!(
        b.enqueue("acct:1", 4, &stale).await.outcome,
        StepOutcome::Stale
    );
    b.fence_cancel("acct:1", 6).await;
    let late = intent("deliver-late", ReceiverKind::Idempotent, "x");
    assert_eq!(
        b.enqueue("acct:1", 5, &late).await.outcome,
        StepOutcome::Cancelled
    );
}

/// Claims take tokens above every earlier claim's; a stale dispatcher's
/// outcome is refused and said in the history.
async fn claims_fence_outcomes(b: &mut impl Backend) {
    let i = intent("deliver-2", ReceiverKind::Unrepeatable, "mail");
    let id = b.publish("acct:2", 1, &i).await.id.unwrap();
    let c = b.claim(id, 10).await;
    assert_eq!(
        (c.outcome, c.previous()),
        (StepOutcome::Claimed, Some(DeliveryState::Pending))
    );
    assert_eq!(b.claim(id, 10).await.outcome, StepOutcome::Stale);
    assert_eq!(b.claim(id, 9).await.outcome, StepOutcome::Stale);
    assert_eq!(b.begin(id, 9).await.outcome, StepOutcome::Stale);
    let s = b.begin(id, 10).await;
    assert_eq!((s.outcome, s.attempts), (StepOutcome::Sending, Some(1)));
    // Dispatcher 10 pauses; 11 takes over and learns the send is in doubt.
    let c = b.claim(id, 11).await;
    assert_eq!(
        (c.outcome, c.previous()),
        (StepOutcome::Claimed, Some(DeliveryState::Sending))
    );
    assert_eq!(state(&c), DeliveryState::Sending);
    let r = b
        .record(id, 11, Report::NeedsAttention, "unknown after DATA")
        .await;
    assert_eq!(
        (r.outcome, state(&r)),
        (StepOutcome::Recorded, DeliveryState::NeedsAttention)
    );
    // 10 wakes up and says "delivered": refused, nothing changes.
    let late = b.record(id, 10, Report::Delivered, "250 ok").await;
    assert_eq!(
        (late.outcome, state(&late)),
        (StepOutcome::Stale, DeliveryState::NeedsAttention)
    );
    assert_eq!(b.claim(id, 12).await.outcome, StepOutcome::Final);
    let events: Vec<String> = b.events(id).await.into_iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        [
            "enqueued",
            "claimed",
            "sending",
            "claimed",
            "needs_attention",
            "refused_stale_outcome"
        ]
    );
}

/// A retry waits for its backoff on the database's clock.
async fn retries_wait(b: &mut impl Backend) {
    let id = b
        .publish(
            "acct:3",
            1,
            &intent("deliver-3", ReceiverKind::Idempotent, "x"),
        )
        .await
        .id
        .unwrap();
    b.claim(id, 1).await;
    b.begin(id, 1).await;
    let r = b
        .record(id, 1, Report::Retry { after_ms: 60_000 }, "503")
        .await;
    assert_eq!(state(&r), DeliveryState::Pending);
    assert_eq!(b.claim(id, 2).await.outcome, StepOutcome::NotDue);
    let id2 = b
        .publish(
            "acct:4",
            1,
            &intent("deliver-4", ReceiverKind::Idempotent, "x"),
        )
        .await
        .id
        .unwrap();
    b.claim(id2, 1).await;
    b.begin(id2, 1).await;
    b.record(id2, 1, Report::Retry { after_ms: 0 }, "503").await;
    let c = b.claim(id2, 2).await;
    assert_eq!(
        (c.outcome, c.previous()),
        (StepOutcome::Claimed, Some(DeliveryState::Pending))
    );
    assert_eq!(b.begin(id2, 2).await.attempts, Some(2));
}

/// Cancellation: what was not sent is cancelled, a claimed row is not sent,
/// a send that began is left to finish.
async fn cancel_stops_unsent(b: &mut impl Backend) {
    let a = b
        .publish(
            "acct:5",
            1,
            &intent("deliver-5a", ReceiverKind::Idempotent, "x"),
        )
        .await
        .id
        .unwrap();
    let m = b
        .enqueue(
            "acct:5",
            1,
            &intent("deliver-5b", ReceiverKind::Unrepeatable, "x"),
        )
        .await
        .id
        .unwrap();
    let s = b
        .enqueue(
            "acct:5",
            1,
            &intent("deliver-5c", ReceiverKind::Unrepeatable, "x"),
        )
        .await
        .id
        .unwrap();
    b.claim(m, 3).await;
    b.claim(s, 3).await;
    b.begin(s, 3).await;
    assert_eq!(b.cancel("acct:5").await, 2);
    assert_eq!(b.claim(a, 4).await.outcome, StepOutcome::Final);
    let not_sent = b.begin(m, 3).await;
    assert_eq!(
        (not_sent.outcome, state(&not_sent)),
        (StepOutcome::Cancelled, DeliveryState::Cancelled)
    );
    let r = b.record(s, 3, Report::Delivered, "250").await;
    assert_eq!(state(&r), DeliveryState::Delivered);
    assert!(b
        .events(s)
        .await
        .iter()
        .any(|e| e.event == "cancel_too_late"));
}

/// A callback settles a row that is not final, and changes nothing after.
async fn callbacks_settle_once(b: &mut impl Backend) {
    let id = b
        .publish(
            "acct:6",
            1,
            &intent("deliver-6", ReceiverKind::Idempotent, "x"),
        )
        .await
        .id
        .unwrap();
    assert_eq!(
        b.confirm("deliver-6", true).await.outcome,
        StepOutcome::Ignored,
        "never sent"
    );
    b.claim(id, 1).await;
    b.begin(id, 1).await;
    b.record(
        id,
        1,
        Report::Accepted {
            check_after_ms: 60_000,
        },
        "202",
    )
    .await;
    let c = b.confirm("deliver-6", true).await;
    assert_eq!(
        (c.outcome, state(&c)),
        (StepOutcome::Confirmed, DeliveryState::Delivered)
    );
    let late = b.confirm("deliver-6", false).await;
    assert_eq!(
        (late.outcome, state(&late)),
        (StepOutcome::Ignored, DeliveryState::Delivered)
    );
    assert_eq!(
        b.confirm("no-such-op", true).await.outcome,
        StepOutcome::Missing
    );
}

/// An operator resolves a delivery that needs attention, naming who and why.
async fn operators_resolve(b: &mut impl Backend) {
    let id = b
        .publish(
            "acct:7",
            1,
            &intent("deliver-7", ReceiverKind::Unrepeatable, "x"),
        )
        .await
        .id
        .unwrap();
    let early = b.resolve(id, Resolution::Resend, "checked").await.unwrap();
    assert_eq!(early.outcome, StepOutcome::NotResolvable);
    b.claim(id, 1).await;
    b.begin(id, 1).await;
    b.record(id, 1, Report::NeedsAttention, "dropped after DATA")
        .await;
    let e = b.resolve(id, Resolution::Resend, " ").await.unwrap_err();
    assert!(e.contains("why"), "{e}");
    let r = b
        .resolve(id, Resolution::Resend, "the mailbox shows nothing")
        .await
        .unwrap();
    assert_eq!(
        (r.outcome, state(&r)),
        (StepOutcome::Resolved, DeliveryState::Pending)
    );
    let c = b.claim(id, 2).await;
    assert_eq!(c.outcome, StepOutcome::Claimed);
    let events = b.events(id).await;
    let resolved = events
        .iter()
        .find(|e| e.event == "resolved_resend")
        .unwrap();
    assert_eq!(
        (resolved.actor.as_deref(), resolved.detail.as_deref()),
        (Some("alice"), Some("the mailbox shows nothing"))
    );
}

macro_rules! both {
    ($($name:ident),*) => {
        mod on_sqlite {
            $(#[tokio::test] async fn $name() {
                let (mut kit, _file) = super::sqlite();
                super::$name(&mut kit).await;
            })*
        }
        mod on_postgres {
            $(#[tokio::test] async fn $name() {
                let db = baton_testkit::PgDb::create(stringify!($name)).await;
                super::$name(&mut super::pg(&db).await).await;
            })*
        }
    };
}

both!(
    enqueue_is_fenced,
    claims_fence_outcomes,
    retries_wait,
    cancel_stops_unsent,
    callbacks_settle_once,
    operators_resolve
);
