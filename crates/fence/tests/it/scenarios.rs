//! The seed's scenarios, run against SQLite and a real PostgreSQL server with
//! one test suite. Each test owns its SQLite file or PostgreSQL database.

use baton_fence::postgres::{PgFence, Prepared, MIGRATIONS};
use baton_fence::sqlite::SqliteFence;
use baton_fence::{
    resource_name, ExclusiveFloor, FenceError, FenceRequest, FencingToken, InputError, Outcome,
    Policy, Recreate, ResourceName, ResourceState, Side,
};
use baton_testkit::{unique, PgDb};
use rusqlite::Connection;
use tokio_postgres::Client;

fn t(n: u64) -> FencingToken {
    FencingToken::of(n).unwrap()
}

fn key(s: &str) -> ResourceName {
    resource_name(s).unwrap()
}

/// The statement publication of the seed: resource, token, operation, payload.
fn req(resource: &str, token: u64, op: &str, payload: &str) -> FenceRequest {
    FenceRequest::new(
        resource,
        FencingToken::of(token).unwrap(),
        op,
        payload.as_bytes(),
        format!("statements/{resource}/generation-{token}.pdf").as_bytes(),
    )
    .unwrap()
}

/// What every backend must offer the suite.
#[allow(async_fn_in_trait)]
trait Backend {
    /// A fenced write whose effect appends (resource, token, operation) to a log table.
    async fn write(&mut self, req: &FenceRequest) -> Outcome;
    /// The same with an effect that fails: the transaction must roll back.
    async fn write_failing(&mut self, req: &FenceRequest) -> Result<Outcome, FenceError>;
    async fn publish(&mut self, req: &FenceRequest) -> Outcome;
    async fn publication(&mut self, resource: &str) -> Option<(String, i64)>;
    async fn cancel(&mut self, resource: &str, at: u64);
    async fn delete(&mut self, req: &FenceRequest) -> Outcome;
    async fn recreate(&mut self, resource: &str, token: u64) -> Recreate;
    async fn state(&mut self, resource: &str) -> Option<ResourceState>;
    async fn log(&mut self) -> Vec<(String, i64, String)>;
}

// ---- SQLite ----------------------------------------------------------------

struct Sqlite {
    conn: Connection,
    path: std::path::PathBuf,
}

impl Sqlite {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("{}.sqlite", unique("baton_fence")));
        let conn = Self::open(&path);
        SqliteFence::migrate(&conn).unwrap();
        conn.execute_batch("CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT, token INTEGER, operation TEXT)").unwrap();
        Self { conn, path }
    }

    fn open(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

fn sqlite_effect(tx: &rusqlite::Transaction<'_>, req: &FenceRequest) -> Result<(), FenceError> {
    tx.execute(
        "INSERT INTO effects (resource, token, operation) VALUES (?1, ?2, ?3)",
        rusqlite::params![
            req.resource.as_str(),
            req.token.bigint(),
            req.operation.as_str()
        ],
    )?;
    Ok(())
}

impl Backend for Sqlite {
    async fn write(&mut self, req: &FenceRequest) -> Outcome {
        SqliteFence::write(&mut self.conn, req, |tx| sqlite_effect(tx, req)).unwrap()
    }

    async fn write_failing(&mut self, req: &FenceRequest) -> Result<Outcome, FenceError> {
        SqliteFence::write(&mut self.conn, req, |tx| {
            sqlite_effect(tx, req)?;
            Err(FenceError::Corrupt("effect failed".into()))
        })
    }

    async fn publish(&mut self, req: &FenceRequest) -> Outcome {
        SqliteFence::publish(&mut self.conn, req).unwrap()
    }

    async fn publication(&mut self, resource: &str) -> Option<(String, i64)> {
        SqliteFence::publication(&self.conn, &key(resource))
            .unwrap()
            .map(|p| (p.object_key, p.token.bigint()))
    }

    async fn cancel(&mut self, resource: &str, at: u64) {
        SqliteFence::cancel(
            &mut self.conn,
            &key(resource),
            Policy::OnePerGeneration,
            t(at),
        )
        .unwrap();
    }

    async fn delete(&mut self, req: &FenceRequest) -> Outcome {
        SqliteFence::delete(&mut self.conn, req).unwrap()
    }

    async fn recreate(&mut self, resource: &str, token: u64) -> Recreate {
        SqliteFence::recreate(&mut self.conn, &key(resource), t(token)).unwrap()
    }

    async fn state(&mut self, resource: &str) -> Option<ResourceState> {
        SqliteFence::state(&self.conn, &key(resource)).unwrap()
    }

    async fn log(&mut self) -> Vec<(String, i64, String)> {
        let mut stmt = self
            .conn
            .prepare("SELECT resource, token, operation FROM effects ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }
}

// ---- PostgreSQL --------------------------------------------------------------

struct Pg {
    client: Client,
    prepared: Prepared,
    _db: PgDb,
}

impl Pg {
    async fn new() -> Self {
        let db = PgDb::create("baton_fence_test").await;
        let mut client = db.connect().await;
        PgFence::migrate(&mut client).await.unwrap();
        client
            .batch_execute("CREATE TABLE effects (id bigserial PRIMARY KEY, resource text, token bigint, operation text)")
            .await
            .unwrap();
        let prepared = PgFence::prepare(&client).await.unwrap();
        Self {
            client,
            prepared,
            _db: db,
        }
    }
}

async fn pg_effect(
    tx: &tokio_postgres::Transaction<'_>,
    req: &FenceRequest,
) -> Result<(), FenceError> {
    tx.execute(
        "INSERT INTO effects (resource, token, operation) VALUES ($1, $2, $3)",
        &[
            &req.resource.as_str(),
            &req.token.bigint(),
            &req.operation.as_str(),
        ],
    )
    .await?;
    Ok(())
}

impl Backend for Pg {
    async fn write(&mut self, req: &FenceRequest) -> Outcome {
        PgFence::write(&mut self.client, req, async |tx| pg_effect(tx, req).await)
            .await
            .unwrap()
    }

    async fn write_failing(&mut self, req: &FenceRequest) -> Result<Outcome, FenceError> {
        PgFence::write(&mut self.client, req, async |tx| {
            pg_effect(tx, req).await?;
            Err(FenceError::Corrupt("effect failed".into()))
        })
        .await
    }

    async fn publish(&mut self, req: &FenceRequest) -> Outcome {
        PgFence::publish(&self.client, &self.prepared, req)
            .await
            .unwrap()
    }

    async fn publication(&mut self, resource: &str) -> Option<(String, i64)> {
        PgFence::publication(&self.client, &key(resource))
            .await
            .unwrap()
            .map(|p| (p.object_key, p.token.bigint()))
    }

    async fn cancel(&mut self, resource: &str, at: u64) {
        PgFence::cancel(
            &self.client,
            &key(resource),
            Policy::OnePerGeneration,
            t(at),
        )
        .await
        .unwrap();
    }

    async fn delete(&mut self, req: &FenceRequest) -> Outcome {
        PgFence::delete(&self.client, req).await.unwrap()
    }

    async fn recreate(&mut self, resource: &str, token: u64) -> Recreate {
        PgFence::recreate(&self.client, &key(resource), t(token))
            .await
            .unwrap()
    }

    async fn state(&mut self, resource: &str) -> Option<ResourceState> {
        PgFence::state(&self.client, &key(resource)).await.unwrap()
    }

    async fn log(&mut self) -> Vec<(String, i64, String)> {
        let rows = self
            .client
            .query(
                "SELECT resource, token, operation FROM effects ORDER BY id",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }
}

// ---- The suite -----------------------------------------------------------------

const STATEMENT: &str = "statement:account-42:2026-09-13";

async fn alice_is_stale_after_bob_published(b: &mut impl Backend) {
    assert_eq!(
        b.publish(&req(STATEMENT, 108, "bob-publish", "bob")).await,
        Outcome::Applied {
            token: t(108),
            created: true
        }
    );
    let alice = b
        .publish(&req(STATEMENT, 107, "alice-publish", "alice"))
        .await;
    assert_eq!(
        alice,
        Outcome::Stale {
            presented: t(107),
            current: t(108)
        }
    );
    let (object, token) = b.publication(STATEMENT).await.unwrap();
    assert_eq!(
        (object.as_str(), token),
        (
            "statements/statement:account-42:2026-09-13/generation-108.pdf",
            108
        )
    );
}

async fn lost_response_retry_returns_the_saved_result_then_conflict(b: &mut impl Backend) {
    let bob = req(STATEMENT, 108, "bob-publish", "bob");
    assert!(b.write(&bob).await.is_applied());
    // The response was lost; Bob retries with the same operation id and payload.
    let retry = b.write(&bob).await;
    assert_eq!(
        retry,
        Outcome::Replayed {
            token: t(108),
            result: bob.result.clone()
        }
    );
    assert_eq!(b.log().await.len(), 1, "a replay applies nothing");
    let changed = req(STATEMENT, 108, "bob-publish", "bob, different payload");
    assert!(matches!(b.write(&changed).await, Outcome::Conflict { token, .. } if token == t(108)));
    assert_eq!(
        b.write(&req(STATEMENT, 108, "bob-second", "x")).await,
        Outcome::GenerationUsed {
            token: t(108),
            by_operation: "bob-publish".into()
        }
    );
    assert_eq!(b.log().await.len(), 1);
}

async fn deletion_then_recreation_rejects_an_old_request(b: &mut impl Backend) {
    let r = "account:42";
    assert!(b.write(&req(r, 10, "create", "v1")).await.is_applied());
    assert!(b
        .delete(&req(r, 11, "delete", "tombstone"))
        .await
        .is_applied());
    assert_eq!(
        b.write(&req(r, 12, "late-update", "v2")).await,
        Outcome::Deleted {
            presented: t(12),
            floor: t(11)
        }
    );
    assert_eq!(
        b.recreate(r, 11).await,
        Recreate::Stale {
            presented: t(11),
            floor: t(11)
        }
    );
    assert_eq!(
        b.recreate(r, 20).await,
        Recreate::Recreated {
            incarnation: 2,
            token: t(20)
        }
    );
    // The recreating owner's first write with the same token is the
    // generation's one operation; a second one is not.
    assert!(b
        .write(&req(r, 20, "first-of-incarnation-2", "v2b"))
        .await
        .is_applied());
    assert!(matches!(
        b.write(&req(r, 20, "second-of-incarnation-2", "v2c")).await,
        Outcome::GenerationUsed { .. }
    ));
    // A request from before the deletion, delayed in the network, arrives now.
    assert_eq!(
        b.write(&req(r, 11, "delayed", "old")).await,
        Outcome::Stale {
            presented: t(11),
            current: t(20)
        }
    );
    assert!(b
        .write(&req(r, 21, "new-incarnation", "v3"))
        .await
        .is_applied());
    let s = b.state(r).await.unwrap();
    assert_eq!((s.generation, s.incarnation, s.deleted), (t(21), 2, false));
}

async fn cancellation_rejects_a_later_publish_from_an_older_token(b: &mut impl Backend) {
    assert!(b
        .publish(&req(STATEMENT, 5, "gen-5", "a"))
        .await
        .is_applied());
    b.cancel(STATEMENT, 7).await;
    // The worker holding token 6 never saw the cancel signal.
    assert_eq!(
        b.publish(&req(STATEMENT, 6, "gen-6", "b")).await,
        Outcome::Cancelled {
            presented: t(6),
            cancelled_at: t(7)
        }
    );
    assert_eq!(
        b.publish(&req(STATEMENT, 7, "gen-7", "c")).await,
        Outcome::Cancelled {
            presented: t(7),
            cancelled_at: t(7)
        }
    );
    assert_eq!(
        b.publication(STATEMENT).await.unwrap().1,
        5,
        "the pointer did not move"
    );
    assert!(
        b.publish(&req(STATEMENT, 8, "gen-8", "d"))
            .await
            .is_applied(),
        "an owner acquired after the cancel may proceed"
    );
    // Cancelling a resource that was never written creates it cancelled.
    b.cancel("never-written", 3).await;
    assert!(matches!(
        b.write(&req("never-written", 2, "w", "x")).await,
        Outcome::Cancelled { .. }
    ));
}

async fn first_creation_missing_and_policies(b: &mut impl Backend) {
    let missing = req("new", 1, "m", "x").must_exist();
    assert_eq!(b.write(&missing).await, Outcome::Missing);
    assert!(b.state("new").await.is_none(), "missing creates nothing");
    let ordered = |token, seq, op: &str| {
        req("ordered", token, op, op)
            .with_policy(Policy::Ordered)
            .with_seq(seq)
            .unwrap()
    };
    assert!(b.write(&ordered(3, 1, "m1")).await.is_applied());
    assert!(b.write(&ordered(3, 3, "m3")).await.is_applied());
    assert!(
        matches!(
            b.write(&ordered(3, 2, "m2")).await,
            Outcome::OutOfOrder { .. }
        ),
        "an earlier mutation arriving late is refused"
    );
    let session = |token, op: &str| req("session", token, op, op).with_policy(Policy::Session);
    assert!(b.write(&session(4, "s1")).await.is_applied());
    assert!(
        b.write(&session(4, "s2")).await.is_applied(),
        "session: any write with the current token"
    );
    assert!(matches!(
        b.write(&session(3, "s3")).await,
        Outcome::Stale { .. }
    ));
}

async fn a_failed_effect_leaves_no_record(b: &mut impl Backend) {
    let r = req("failing", 9, "op-9", "x");
    assert!(b.write_failing(&r).await.is_err());
    assert!(
        b.state("failing").await.is_none(),
        "no resource row without the effect"
    );
    assert!(b.log().await.is_empty(), "no effect");
    assert_eq!(
        b.write(&r).await,
        Outcome::Applied {
            token: t(9),
            created: true
        },
        "the retry applies: nothing was recorded"
    );
}

/// PostgreSQL through the pipelined generic path (`PgFence::write_pipelined`):
/// every scenario of the suite, with BEGIN, fence and effect in one round trip.
struct PgPipelined(Pg);

impl PgPipelined {
    async fn new() -> Self {
        Self(Pg::new().await)
    }

    async fn pipelined(&mut self, req: &FenceRequest, sql: &str) -> Result<Outcome, FenceError> {
        let effect = self.0.client.prepare(sql).await?;
        PgFence::write_pipelined(
            &self.0.client,
            &self.0.prepared,
            req,
            &effect,
            &[
                &req.resource.as_str(),
                &req.token.bigint(),
                &req.operation.as_str(),
            ],
        )
        .await
    }
}

impl Backend for PgPipelined {
    async fn write(&mut self, req: &FenceRequest) -> Outcome {
        if req.side == Side::Shared {
            // A pipelined write refuses the shared side (see
            // `a_shared_request_cannot_publish_delete_or_pipeline`).
            return self.0.write(req).await;
        }
        self.pipelined(
            req,
            "INSERT INTO effects (resource, token, operation) VALUES ($1, $2, $3)",
        )
        .await
        .unwrap()
    }

    async fn write_failing(&mut self, req: &FenceRequest) -> Result<Outcome, FenceError> {
        // Fails at run time (division by zero) in the effect statement.
        self.pipelined(
            req,
            "INSERT INTO effects (resource, token, operation) VALUES ($1, $2 / 0, $3)",
        )
        .await
    }

    async fn publish(&mut self, req: &FenceRequest) -> Outcome {
        self.0.publish(req).await
    }

    async fn publication(&mut self, resource: &str) -> Option<(String, i64)> {
        self.0.publication(resource).await
    }

    async fn cancel(&mut self, resource: &str, at: u64) {
        self.0.cancel(resource, at).await
    }

    async fn delete(&mut self, req: &FenceRequest) -> Outcome {
        self.0.delete(req).await
    }

    async fn recreate(&mut self, resource: &str, token: u64) -> Recreate {
        self.0.recreate(resource, token).await
    }

    async fn state(&mut self, resource: &str) -> Option<ResourceState> {
        self.0.state(resource).await
    }

    async fn log(&mut self) -> Vec<(String, i64, String)> {
        self.0.log().await
    }
}

/// Readers (shared leases) and writers (exclusive) of one resource, with
/// the tokens Baton hands out: a reader's write is refused only after a
/// writer with a higher token wrote; readers never refuse each other; a
/// writer below a recorded reader's token is stale.
async fn readers_and_writers_of_one_resource(b: &mut impl Backend) {
    const R: &str = "report:q3";
    let write = |token: u64, op: &str| req(R, token, op, op);
    let read = |token: u64, op: &str| req(R, token, op, op).shared();
    let stale = |presented: u64, current: u64| Outcome::Stale {
        presented: t(presented),
        current: t(current),
    };
    let applied = |token: u64| Outcome::Applied {
        token: t(token),
        created: false,
    };
    assert!(b.write(&write(10, "w10")).await.is_applied());
    // Two readers granted after writer 10, in any order, and one reader twice.
    assert_eq!(b.write(&read(12, "r12")).await, applied(12));
    assert_eq!(b.write(&read(11, "r11")).await, applied(11));
    assert_eq!(b.write(&read(11, "r11-again")).await, applied(11));
    assert_eq!(
        b.write(&read(11, "r11")).await,
        Outcome::Replayed {
            token: t(11),
            result: format!("statements/{R}/generation-11.pdf").into_bytes()
        }
    );
    let state = b.state(R).await.unwrap();
    assert_eq!(
        (state.generation, state.exclusive),
        (t(12), ExclusiveFloor::Below(t(10)))
    );
    // Writer 10 resumes after readers 11 and 12 were granted: its lease
    // had ended, and what they read must not change under them.
    assert_eq!(b.write(&write(10, "w10-late")).await, stale(10, 12));
    // Writer 13 writes; reader 12, granted before it, is now stale.
    assert_eq!(b.write(&write(13, "w13")).await, applied(13));
    assert_eq!(
        b.state(R).await.unwrap().exclusive,
        ExclusiveFloor::Generation
    );
    assert_eq!(b.write(&read(12, "r12-late")).await, stale(12, 13));
    // Readers after writer 13, the later one first.
    assert_eq!(b.write(&read(15, "r15")).await, applied(15));
    assert_eq!(b.write(&read(14, "r14")).await, applied(14));
    assert_eq!(b.write(&read(12, "r12-later")).await, stale(12, 13));
    // Cancellation refuses readers too.
    b.cancel(R, 16).await;
    assert_eq!(
        b.write(&read(16, "r16")).await,
        Outcome::Cancelled {
            presented: t(16),
            cancelled_at: t(16)
        }
    );
    assert_eq!(b.write(&read(17, "r17")).await, applied(17));

    // A resource a reader writes first: no writer recorded yet.
    const S: &str = "report:q4";
    assert_eq!(
        b.write(&req(S, 5, "r5", "r5").shared()).await,
        Outcome::Applied {
            token: t(5),
            created: true
        }
    );
    assert_eq!(b.state(S).await.unwrap().exclusive, ExclusiveFloor::None);
    assert_eq!(b.write(&req(S, 4, "r4", "r4").shared()).await, applied(4));
    assert_eq!(b.write(&req(S, 3, "w3", "w3")).await, stale(3, 5));
    assert_eq!(b.write(&req(S, 6, "w6", "w6")).await, applied(6));
    assert_eq!(
        b.write(&req(S, 5, "r5-late", "r5").shared()).await,
        stale(5, 6)
    );
    // A writer whose token a reader's write recorded: no exclusive write
    // was made with it, so it is a new generation, not one already used.
    assert_eq!(b.write(&req(S, 7, "r7", "r7").shared()).await, applied(7));
    assert_eq!(b.write(&req(S, 7, "w7", "w7")).await, applied(7));

    let effects: Vec<String> = b.log().await.into_iter().map(|(_, _, op)| op).collect();
    assert_eq!(
        effects,
        [
            "w10",
            "r12",
            "r11",
            "r11-again",
            "w13",
            "r15",
            "r14",
            "r17",
            "r5",
            "r4",
            "w6",
            "r7",
            "w7"
        ],
        "every applied write's effect, and only those"
    );
}

#[tokio::test]
async fn a_shared_request_cannot_publish_delete_or_pipeline() {
    let refused = |e: FenceError| matches!(e, FenceError::Input(InputError::SharedCannot { .. }));
    let shared = req(STATEMENT, 7, "op", "x").shared();
    let mut sqlite = Sqlite::new();
    assert!(refused(
        SqliteFence::publish(&mut sqlite.conn, &shared).unwrap_err()
    ));
    assert!(refused(
        SqliteFence::delete(&mut sqlite.conn, &shared).unwrap_err()
    ));
    let pg = PgPipelined::new().await;
    assert!(refused(
        PgFence::publish(&pg.0.client, &pg.0.prepared, &shared)
            .await
            .unwrap_err()
    ));
    assert!(refused(
        PgFence::delete(&pg.0.client, &shared).await.unwrap_err()
    ));
    let effect = pg.0.client.prepare("SELECT 1").await.unwrap();
    let pipelined = PgFence::write_pipelined(&pg.0.client, &pg.0.prepared, &shared, &effect, &[]);
    assert!(refused(pipelined.await.unwrap_err()));
    assert!(PgFence::state(&pg.0.client, &key(STATEMENT))
        .await
        .unwrap()
        .is_none());
    assert!(SqliteFence::state(&sqlite.conn, &key(STATEMENT))
        .unwrap()
        .is_none());
}

macro_rules! suite {
    ($($name:ident),*) => {
        mod sqlite_backend {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(&mut Sqlite::new()).await; })*
        }
        mod postgres_backend {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(&mut Pg::new().await).await; })*
        }
        mod postgres_pipelined {
            use super::*;
            $(#[tokio::test] async fn $name() { super::$name(&mut PgPipelined::new().await).await; })*
        }
    };
}

suite!(
    alice_is_stale_after_bob_published,
    lost_response_retry_returns_the_saved_result_then_conflict,
    deletion_then_recreation_rejects_an_old_request,
    cancellation_rejects_a_later_publish_from_an_older_token,
    first_creation_missing_and_policies,
    a_failed_effect_leaves_no_record,
    readers_and_writers_of_one_resource
);

#[test]
fn bad_input_is_refused_naming_the_rule() {
    use baton_fence::{FenceError, FencingToken, InputError};
    // Another issuer's integer token is checked as it becomes a token; the
    // error converts to the kit's own, naming the rule.
    for bad in [1 << 63, 0] {
        let err = FenceError::from(FencingToken::of(bad).unwrap_err());
        assert!(
            matches!(err, FenceError::Input(InputError::Token(_))),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("token {bad} is out of range: tokens are 1 to 9223372036854775807 (a BIGINT)")
        );
    }
    let one = FencingToken::of(1).unwrap();
    assert_eq!(
        FenceRequest::new("", one, "op", b"f", b"").unwrap_err(),
        InputError::ResourceName(baton_core::NameError::Empty)
    );
    let long = "r".repeat(513);
    let err = FenceRequest::new(&long, one, "op", b"f", b"").unwrap_err();
    assert_eq!(
        err,
        InputError::ResourceName(baton_core::NameError::TooLong {
            len_bytes: 513,
            len_bytes_max: 512
        })
    );
    assert!(err.to_string().contains("513") && err.to_string().contains("512"));
    // The lease service's rules, and its canonical spelling only.
    assert!(FenceRequest::new("a::b", one, "op", b"f", b"").is_err());
    assert!(FenceRequest::new(" r", one, "op", b"f", b"").is_err());
    let err = FenceRequest::new("cafe\u{301}", one, "op", b"f", b"").unwrap_err();
    assert_eq!(
        err,
        InputError::NotCanonical {
            given: "cafe\u{301}".into(),
            canonical: "caf\u{e9}".into()
        }
    );
    assert!(err.to_string().contains("caf\u{e9}"), "{err}");
    assert!(FenceRequest::new("r", one, &"o".repeat(129), b"f", b"").is_err());
    assert!(FenceRequest::new("r", one, "a\nb", b"f", b"").is_err());
    assert_eq!(
        FenceRequest::new("r", one, "op", b"", b"").unwrap_err(),
        InputError::Empty {
            field: "fingerprint"
        }
    );
    assert!(FenceRequest::new("r", one, "op", &[0; 65], b"").is_err());
    assert!(FenceRequest::new("r", one, "op", b"f", &[0; 4097]).is_err());
}

#[tokio::test]
async fn postgres_sql_functions_refuse_bad_input_and_write_nothing() {
    let mut pg = Pg::new().await;
    // The migration is recorded and can run again.
    PgFence::migrate(&mut pg.client).await.unwrap();
    let versions: Vec<i32> = pg
        .client
        .query("SELECT version FROM baton.schema_migrations", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        (1..=MIGRATIONS.len() as i32).collect::<Vec<i32>>()
    );
    let cases = [
        (
            "SELECT * FROM baton.fence('', 1, 'op', '\\x01'::bytea)",
            "resource name is empty",
        ),
        (
            "SELECT * FROM baton.fence(NULL, 1, 'op', '\\x01'::bytea)",
            "resource name is empty",
        ),
        (
            "SELECT * FROM baton.fence('a::b', 1, 'op', '\\x01'::bytea)",
            "empty ':'-separated segment",
        ),
        (
            "SELECT * FROM baton.fence(' a', 1, 'op', '\\x01'::bytea)",
            "leading or trailing whitespace",
        ),
        (
            "SELECT * FROM baton.fence(E'a\\tb', 1, 'op', '\\x01'::bytea)",
            "control character U+0009",
        ),
        (
            "SELECT * FROM baton.publish('cafe' || chr(769), 1, 'op', '\\x01'::bytea, 'k')",
            "write it as 'caf\u{e9}'",
        ),
        (
            "SELECT * FROM baton.fence('r', 1, 'op', '\\x01'::bytea, NULL)",
            "result is NULL",
        ),
        (
            "SELECT * FROM baton.fence('r', 1, 'op', '\\x01'::bytea, ''::bytea, 0, NULL)",
            "policy NULL is unknown",
        ),
        ("SELECT baton.cancel(NULL, 5)", "resource name is empty"),
        ("SELECT baton.cancel('', 5)", "resource name is empty"),
        (
            "SELECT baton.cancel('r', NULL)",
            "token NULL is out of range",
        ),
        (
            "SELECT baton.cancel('r', 5, 'nine')",
            "policy 'nine' is unknown",
        ),
        ("SELECT baton.recreate(NULL, 5)", "resource name is empty"),
        ("SELECT baton.recreate('r', 0)", "token 0 is out of range"),
        ("SELECT baton.prune_operations(NULL)", "never pruned"),
        (
            "SELECT * FROM baton.fence('r', 0, 'op', '\\x01'::bytea)",
            "token 0 is out of range",
        ),
        (
            "SELECT * FROM baton.fence('r', 1, '', '\\x01'::bytea)",
            "operation id is 0 bytes",
        ),
        (
            "SELECT * FROM baton.fence('r', 1, 'op', ''::bytea)",
            "fingerprint is 0 bytes",
        ),
        (
            "SELECT * FROM baton.fence('r', 1, 'op', '\\x01'::bytea, ''::bytea, -1)",
            "sequence -1 is out of range",
        ),
        (
            "SELECT baton.prune_operations(interval '10 seconds')",
            "never pruned",
        ),
        (
            "SELECT * FROM baton.fence_shared(NULL, 1, 'op', '\\x01'::bytea)",
            "resource name is empty",
        ),
        (
            "SELECT * FROM baton.fence_shared('r', 0, 'op', '\\x01'::bytea)",
            "token 0 is out of range",
        ),
        (
            "SELECT * FROM baton.fence_shared('r', 1, 'op', ''::bytea)",
            "fingerprint is 0 bytes",
        ),
        (
            "SELECT * FROM baton.fence_shared('r', 1, 'op', '\\x01'::bytea, NULL)",
            "result is NULL",
        ),
        (
            "SELECT * FROM baton.fence_shared('r', 1, 'op', '\\x01'::bytea, ''::bytea, 'nine')",
            "policy 'nine' is unknown",
        ),
        (
            "SELECT * FROM baton.fence_shared('r', 1, 'op', '\\x01'::bytea, ''::bytea, 'session', NULL)",
            "must_exist must be true or false",
        ),
        (
            "SELECT * FROM baton.fence_shared('cafe' || chr(769), 1, 'op', '\\x01'::bytea)",
            "write it as 'caf\u{e9}'",
        ),
    ];
    for (sql, rule) in cases {
        let err = pg.client.batch_execute(sql).await.unwrap_err();
        let db = err.as_db_error().expect("a database error");
        assert_eq!(db.code().code(), "22023", "{sql}");
        assert!(
            db.message().contains(rule),
            "{sql}: {:?} should mention {rule:?}",
            db.message()
        );
    }
    let n: i64 = pg
        .client
        .query_one("SELECT count(*) FROM baton.resources", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[tokio::test]
async fn policy_mismatch_and_pruning() {
    let mut pg = Pg::new().await;
    let mut lite = Sqlite::new();
    assert!(pg.write(&req("p", 1, "a", "x")).await.is_applied());
    assert!(lite.write(&req("p", 1, "a", "x")).await.is_applied());
    let session = req("p", 2, "b", "x").with_policy(Policy::Session);
    assert!(PgFence::fence(&pg.client, &session).await.is_err());
    assert!(matches!(
        SqliteFence::write(&mut lite.conn, &session, |_| Ok::<(), FenceError>(())),
        Err(FenceError::PolicyMismatch(_))
    ));
    assert!(matches!(
        PgFence::prune_operations(&pg.client, 60).await,
        Err(FenceError::PruneTooYoung { min_age_s: 60, .. })
    ));
    assert!(matches!(
        SqliteFence::prune_operations(&lite.conn, 60),
        Err(FenceError::PruneTooYoung { .. })
    ));
    // Young records stay; records two days old go.
    assert_eq!(
        PgFence::prune_operations(&pg.client, 86_400).await.unwrap(),
        0
    );
    assert_eq!(
        SqliteFence::prune_operations(&lite.conn, 86_400).unwrap(),
        0
    );
    pg.client
        .batch_execute("UPDATE baton.operations SET recorded_at = now() - interval '2 days'")
        .await
        .unwrap();
    lite.conn
        .execute_batch("UPDATE baton_operations SET recorded_at_unix_s = unixepoch() - 172800")
        .unwrap();
    assert_eq!(
        PgFence::prune_operations(&pg.client, 86_400).await.unwrap(),
        1
    );
    assert_eq!(
        SqliteFence::prune_operations(&lite.conn, 86_400).unwrap(),
        1
    );
    // After pruning, a very late retry is judged afresh and still cannot apply twice.
    assert!(matches!(
        pg.write(&req("p", 1, "a", "x")).await,
        Outcome::GenerationUsed { .. }
    ));
    assert!(matches!(
        lite.write(&req("p", 1, "a", "x")).await,
        Outcome::GenerationUsed { .. }
    ));
}

/// Session 1 holds an operation id in an open transaction; session 2 reuses
/// it with a higher token and blocks on the row. Once session 1 commits,
/// session 2 must hear `replayed` (same payload) or `conflict` (another
/// payload), never a unique-key error, through both SQL entry points and
/// whether or not the resource row existed before.
#[tokio::test]
async fn concurrent_reuse_of_an_operation_id_is_replayed_or_a_conflict() {
    let pg = Pg::new().await;
    let second = pg._db.connect().await;
    let cases = [
        ("publish", true, "\\x01", "replayed"),
        ("publish", false, "\\x02", "conflict"),
        ("fence", true, "\\x01", "replayed"),
        ("fence", false, "\\x02", "conflict"),
        ("publish", true, "\\x01", "replayed"),
    ];
    for (i, (function, row_exists, fingerprint, expected)) in cases.into_iter().enumerate() {
        let resource = format!("job:{i}");
        if row_exists {
            pg.client
                .batch_execute(&format!(
                    "SELECT baton.fence('{resource}', 10, 'init', '\\x09'::bytea)"
                ))
                .await
                .unwrap();
        }
        let call = |token: u64, fp: &str| {
            match function {
            "publish" => format!("SELECT outcome FROM baton.publish('{resource}', {token}, 'job-7', '{fp}'::bytea, 'k{token}')"),
            _ => format!("SELECT outcome FROM baton.fence('{resource}', {token}, 'job-7', '{fp}'::bytea)"),
        }
        };
        pg.client.batch_execute("BEGIN").await.unwrap();
        let first: String = pg
            .client
            .query_one(&call(50, "\\x01"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(first, "applied");
        let pid: i32 = second
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let sql = call(51, fingerprint);
        let blocked = async { second.query_one(&sql, &[]).await };
        let commit = async {
            baton_testkit::until(async || {
                pg.client
                    .query_one(
                        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                        &[&pid],
                    )
                    .await
                    .ok()
                    .and_then(|r| r.get::<_, Option<bool>>(0))
                    .unwrap_or(false)
            })
            .await;
            pg.client.batch_execute("COMMIT").await.unwrap();
        };
        let (outcome, ()) = tokio::join!(blocked, commit);
        let outcome: String = outcome
            .unwrap_or_else(|e| panic!("case {i} ({function}): {e:?}"))
            .get(0);
        assert_eq!(
            outcome, expected,
            "case {i} ({function}, row existed: {row_exists})"
        );
        let (generation, n_ops): (i64, i64) = {
            let r = pg
                .client
                .query_one(
                    "SELECT generation, (SELECT count(*) FROM baton.operations WHERE resource = $1 AND operation = 'job-7')
                     FROM baton.resources WHERE resource = $1",
                    &[&resource],
                )
                .await
                .unwrap();
            (r.get(0), r.get(1))
        };
        assert_eq!((generation, n_ops), (50, 1), "case {i}");
    }
}

#[tokio::test]
async fn sqlite_writers_reusing_an_operation_id_get_replayed() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("fence-reuse")));
    let mut conns: Vec<Connection> = (0..4).map(|_| Connection::open(&path).unwrap()).collect();
    for c in &conns {
        c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    }
    SqliteFence::migrate(&conns[0]).unwrap();
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, conn)| {
                s.spawn(move || {
                    let r = req("job", 50 + i as u64, "job-7", "same");
                    SqliteFence::write(conn, &r, |_| Ok::<(), FenceError>(())).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let applied = outcomes.iter().filter(|o| o.is_applied()).count();
    let replayed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Replayed { .. }))
        .count();
    assert_eq!((applied, replayed), (1, 3), "{outcomes:?}");
    drop(conns);
    let _ = std::fs::remove_file(&path);
}

/// An installation of migration 1 alone, with data, is upgraded in place.
#[tokio::test]
async fn migration_2_upgrades_an_installed_migration_1_in_place() {
    let db = PgDb::create("baton_fence_upgrade").await;
    let mut client = db.connect().await;
    client
        .batch_execute(baton_fence::postgres::MIGRATIONS[0].1)
        .await
        .unwrap();
    client
        .batch_execute("SELECT baton.fence('cafe' || chr(769), 19, 'old', '\\x01'::bytea)")
        .await
        .unwrap();
    PgFence::migrate(&mut client).await.unwrap();
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM baton.schema_migrations ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        (1..=MIGRATIONS.len() as i32).collect::<Vec<i32>>()
    );
    let err = client
        .batch_execute("SELECT baton.fence('cafe' || chr(769), 20, 'new', '\\x01'::bytea)")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().unwrap().code().code(), "22023");
    let n: i64 = client
        .query_one("SELECT count(*) FROM baton.resources", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "the row written before the upgrade stays");
}

/// Every SQL block of the fence kit's chapter runs as written against a
/// freshly migrated database, and ends as the chapter says: Bob's token is
/// recorded, Alice's older one changed nothing, the ordered writes applied.
#[tokio::test]
async fn the_documented_sql_runs_as_written() {
    // The chapter's tokens are Baton's: epoch 1, counters 107 to 110.
    const EPOCH_1: i64 = 1 << 40;
    let pg = Pg::new().await;
    let doc = include_str!("../../../../docs/fence-kit.md");
    let blocks: Vec<&str> = doc
        .split("```sql\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(!blocks.is_empty(), "the chapter has SQL");
    for block in &blocks {
        pg.client
            .batch_execute(block)
            .await
            .unwrap_or_else(|e| panic!("{block}\n{e:?}"));
    }
    let row = pg
        .client
        .query_one(
            "SELECT generation_token FROM statement_publications WHERE account_id = 'account-42'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i64>(0),
        EPOCH_1 + 108,
        "Alice's stale call wrote nothing"
    );
    let stale: String = pg
        .client
        .query_one(
            "SELECT outcome FROM baton.fence('statement:account-42:2026-09-13', 1099511627883, 'publish-gen-1099511627883', '\\x01'::bytea)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, "stale");
    let (seq, generation): (i64, i64) = {
        let r = pg
            .client
            .query_one(
                "SELECT seq, generation FROM baton.resources WHERE resource = 'ledger:account-42'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((seq, generation), (2, EPOCH_1 + 110));
}

/// The documented pipelined fence in plain SQL: a refused fence aborts the
/// transaction (SQLSTATE BF001), so an effect sent in the same batch never
/// commits; an applied one commits with it.
#[tokio::test]
async fn fence_or_abort_in_one_batch_commits_the_effect_only_when_applied() {
    let pg = Pg::new().await;
    let batch = |token: u64| {
        format!(
            "BEGIN;
             SELECT * FROM baton.fence_or_abort('batch:r', {token}, 'op-{token}', '\\x01'::bytea);
             INSERT INTO effects (resource, token, operation) VALUES ('batch:r', {token}, 'op-{token}');
             COMMIT;"
        )
    };
    pg.client.batch_execute(&batch(10)).await.unwrap();
    let err = pg.client.batch_execute(&batch(9)).await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("BF001"), "{err:?}");
    let detail = err
        .as_db_error()
        .and_then(|d| d.detail())
        .unwrap_or_default();
    assert!(detail.starts_with("stale,9,10,"), "{detail}");
    pg.client.batch_execute("ROLLBACK").await.unwrap();
    let tokens: Vec<i64> = pg
        .client
        .query("SELECT token FROM effects ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tokens, vec![10], "the stale effect did not commit");
}

/// Migration 6 turns the documented SQL wrappers into PL/pgSQL ones in
/// place: an installation of 1-5 with a published generation keeps it,
/// replays it with the saved result, and refuses the stale token after it.
#[tokio::test]
async fn migration_6_upgrades_an_installed_migration_5_in_place() {
    let db = PgDb::create("baton_fence_upgrade6").await;
    let mut client = db.connect().await;
    for (_, sql) in &baton_fence::postgres::MIGRATIONS[..5] {
        client.batch_execute(sql).await.unwrap();
    }
    let publish = |token: i64, op: &str| {
        format!("SELECT outcome, result FROM baton.publish('report:q3', {token}, '{op}', '\\x01'::bytea, 'reports/q3/{token}.pdf')")
    };
    let first = client.query_one(&publish(5, "pub-5"), &[]).await.unwrap();
    assert_eq!(first.get::<_, String>(0), "applied");
    PgFence::migrate(&mut client).await.unwrap();
    let languages: Vec<(String, String)> = client
        .query(
            "SELECT p.proname::text, l.lanname::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'baton' AND p.proname IN
               ('fence', 'fence_or_abort', 'publish', 'delete', 'delete_impl', 'cancel', 'recreate', 'prune_operations')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(languages.len(), 8, "{languages:?}");
    assert!(
        languages.iter().all(|(_, l)| l == "plpgsql"),
        "{languages:?}"
    );
    let replay = client.query_one(&publish(5, "pub-5"), &[]).await.unwrap();
    assert_eq!(replay.get::<_, String>(0), "replayed");
    assert_eq!(replay.get::<_, Vec<u8>>(1), b"reports/q3/5.pdf");
    let next = client.query_one(&publish(6, "pub-6"), &[]).await.unwrap();
    assert_eq!(next.get::<_, String>(0), "applied");
    let stale = client.query_one(&publish(5, "pub-5b"), &[]).await.unwrap();
    assert_eq!(stale.get::<_, String>(0), "stale");
    let named: i64 = client
        .query_one(
            "SELECT baton.cancel(resource => 'report:q3', at_token => 7, policy => 'one_per_generation')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(named >= 7, "{named}");
}

/// Every call of `calls` on `client`, as its outcome or its error's
/// SQLSTATE and message.
async fn judged(client: &Client, calls: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for call in calls {
        out.push(match client.query_one(call.as_str(), &[]).await {
            Ok(row) => format!("{call} -> {}", row.get::<_, String>(0)),
            Err(e) => {
                let db = e.as_db_error().expect("a database error");
                format!("{call} -> {} {}", db.code().code(), db.message())
            }
        });
    }
    out
}

/// Migration 7 judges printable ASCII names inline on the fast paths. It
/// must judge every name as migration 6 did: the same calls on an install
/// of 1-6 and of 1-7 give the same outcomes and the same errors, for
/// valid names (ASCII and not), names that break each rule, NULL, and rows
/// whose bad names were stored before names were checked (as migration 1
/// allowed), which reach the fast path.
#[tokio::test]
async fn migration_7_judges_every_name_as_migration_6() {
    let names: Vec<String> = [
        "report:q3",
        "a b",
        "é:ü",
        " lead",
        "trail ",
        ":a",
        "a:",
        "a::b",
        "tab\there",
        "e\u{301}",
        "",
    ]
    .iter()
    .map(|n| format!("'{}'", n.replace('\'', "''")))
    .chain(["NULL::text".to_string(), format!("'{}'", "x".repeat(513))])
    .collect();
    // Rows with bad names, as a first-version install could hold them.
    let legacy = [" lead", "trail ", "a::b", "e\u{301}"];
    let mut calls = Vec::new();
    for name in &names {
        for token in [1, 2] {
            calls.push(format!(
                "SELECT outcome FROM baton.publish({name}, {token}, 'pub-{token}', '\\x01'::bytea, 'k/{token}')"
            ));
        }
        for token in [3, 4] {
            calls.push(format!(
                "SELECT outcome FROM baton.fence({name}, {token}, 'fence-{token}', '\\x01'::bytea)"
            ));
        }
    }
    let mut results = Vec::new();
    for (tag, installed) in [("baton_fence_names6", 6), ("baton_fence_names7", 7)] {
        let db = PgDb::create(tag).await;
        let client = db.connect().await;
        for (_, sql) in &baton_fence::postgres::MIGRATIONS[..installed] {
            client.batch_execute(sql).await.unwrap();
        }
        for name in legacy {
            client
                .execute(
                    "INSERT INTO baton.resources (resource, policy, generation) VALUES ($1, 1, 1)",
                    &[&name],
                )
                .await
                .unwrap();
        }
        let mut legacy_calls = calls.clone();
        for name in legacy {
            legacy_calls.push(format!(
                "SELECT outcome FROM baton.publish('{name}', 5, 'legacy', '\\x01'::bytea, 'k/5')"
            ));
            legacy_calls.push(format!(
                "SELECT outcome FROM baton.fence('{name}', 6, 'legacy', '\\x01'::bytea)"
            ));
        }
        results.push(judged(&client, &legacy_calls).await);
    }
    assert_eq!(results[0], results[1]);
    let all = results[1].join("\n");
    // The matrix means something: valid names apply, each bad one is
    // refused naming its rule, stored bad names included.
    let outcome = |name: &str, what: &str| {
        let token = if what == "pub" { 2 } else { 4 };
        results[1]
            .iter()
            .find(|r| r.contains(&format!("({name}, {token}, '{what}-{token}'")))
            .unwrap_or_else(|| panic!("no call for {name}"))
            .rsplit(" -> ")
            .next()
            .unwrap()
            .to_string()
    };
    for name in ["'report:q3'", "'a b'", "'é:ü'"] {
        assert_eq!(outcome(name, "pub"), "applied", "{all}");
        assert_eq!(outcome(name, "fence"), "applied", "{all}");
    }
    for rule in [
        "leading or trailing whitespace",
        "empty ':'-separated segment",
        "control character",
        "canonical form",
        "limit is 512 bytes",
        "resource name is empty",
    ] {
        assert!(all.contains(rule), "no refusal names {rule:?}:\n{all}");
    }
    let legacy: Vec<&String> = results[1]
        .iter()
        .filter(|r| r.contains("'legacy'"))
        .collect();
    assert_eq!(legacy.len(), 8);
    assert!(
        legacy.iter().all(|r| r.contains("-> 22023 resource name")),
        "{legacy:#?}"
    );
}
