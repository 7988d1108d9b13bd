//! PostgreSQL backend: the rule runs in the database as `baton.fence`
//! (in force: `sql/functions/fence_full.sql`, behind `fence.sql`), so a fenced write is one statement inside the
//! caller's transaction and services in any language share it.

use tokio_postgres::{Client, GenericClient, Row, Statement, Transaction};
use tracing::Instrument;

use crate::error::{check_prune_age, stored_token as token};
use crate::rule::{Recreate, ResourceState};
use crate::{
    metrics, FenceError, FenceRequest, FencingToken, Outcome, Policy, Publication, ResourceName,
    Sequence,
};

mod sql;
pub use sql::{FUNCTIONS, MIGRATIONS};
mod wire;
use wire::*;
pub use wire::{describe_error, redact_url};

/// Statements prepared once per connection, for hot paths.
pub struct Prepared {
    fence: Statement,
    fence_shared: Statement,
    fence_or_abort: Statement,
    publish: Statement,
}

/// The fence kit on PostgreSQL: the rule runs in the database (`baton.fence`).
pub struct PgFence;

impl PgFence {
    /// Installs or upgrades the `baton` schema. Safe to run concurrently:
    /// migrations serialize on a transaction-level advisory lock.
    pub async fn migrate(client: &mut Client) -> Result<(), FenceError> {
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('baton.fence.migrate'))",
            &[],
        )
        .await?;
        let installed = tx
            .query_one(
                "SELECT to_regclass('baton.schema_migrations') IS NOT NULL",
                &[],
            )
            .await?
            .try_get::<_, bool>(0)?;
        let mut done: Vec<i32> = Vec::new();
        if installed {
            for row in tx
                .query("SELECT version FROM baton.schema_migrations", &[])
                .await?
            {
                done.push(row.try_get(0)?);
            }
        }
        let supported = MIGRATIONS.len() as i32;
        if let Some(installed) = done.iter().copied().max().filter(|v| *v > supported) {
            return Err(FenceError::NewerSchema {
                installed,
                supported,
            });
        }
        for (version, sql) in MIGRATIONS {
            if !done.contains(&version) {
                tx.batch_execute(sql).await?;
            }
        }
        // The definitions in force, every time: what the migrations left,
        // readable in one place (see `FUNCTIONS`).
        for (_, sql) in FUNCTIONS {
            tx.batch_execute(sql).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The highest token this database has recorded for any resource
    /// (generations, tombstone floors, cancellations, operation records), or
    /// `None` if it recorded none. A lease-service restore starts its new
    /// epoch above it (`baton admin restore --floor-from`).
    pub async fn highest_token(
        client: &impl GenericClient,
    ) -> Result<Option<FencingToken>, FenceError> {
        let row = client
            .query_one(
                "SELECT greatest(
                    (SELECT max(greatest(generation, coalesce(cancelled_at, 0), coalesce(published_token, 0)))
                       FROM baton.resources),
                    (SELECT max(token) FROM baton.operations))",
                &[],
            )
            .await?;
        row.try_get::<_, Option<i64>>(0)?.map(token).transpose()
    }

    /// Prepares the hot statements once per connection.
    pub async fn prepare(client: &impl GenericClient) -> Result<Prepared, FenceError> {
        Ok(Prepared {
            fence: client.prepare(FENCE_SQL).await?,
            fence_shared: client.prepare(FENCE_SHARED_SQL).await?,
            fence_or_abort: client.prepare(FENCE_OR_ABORT_SQL).await?,
            publish: client.prepare(PUBLISH_SQL).await?,
        })
    }

    /// Judges `req` in the caller's transaction (`client` should be a
    /// [`Transaction`]): on [`Outcome::Applied`] the generation advanced and
    /// the operation was recorded, and the row stays locked until commit, so
    /// the caller's effect that follows is atomic with the check. A
    /// [`crate::Side::Shared`] request is judged by `baton.fence_shared`.
    pub async fn fence(
        client: &impl GenericClient,
        req: &FenceRequest,
    ) -> Result<Outcome, FenceError> {
        let statement = client
            .prepare(match req.side {
                crate::Side::Exclusive => FENCE_SQL,
                crate::Side::Shared => FENCE_SHARED_SQL,
            })
            .await?;
        Self::fence_prepared(client, &statement, req).await
    }

    async fn fence_prepared(
        client: &impl GenericClient,
        statement: &Statement,
        req: &FenceRequest,
    ) -> Result<Outcome, FenceError> {
        let args = FenceArgs::new(req);
        let judging = metrics::Judging::start(req);
        let (exclusive, shared);
        let params: &[Param<'_>] = match req.side {
            crate::Side::Exclusive => {
                exclusive = args.params();
                &exclusive
            }
            crate::Side::Shared => {
                shared = args.shared_params();
                &shared
            }
        };
        let row = client
            .query_one(statement, params)
            .instrument(judging.span().clone())
            .await?;
        outcome(req, &row, judging)
    }

    /// Opens a transaction, judges `req`, runs `effect` only if it applied,
    /// and commits. If `effect` fails the transaction rolls back: no
    /// operation record without its effect.
    pub async fn write<E>(
        client: &mut Client,
        req: &FenceRequest,
        effect: impl AsyncFnOnce(&Transaction<'_>) -> Result<(), E>,
    ) -> Result<Outcome, E>
    where
        E: From<FenceError>,
    {
        let tx = client.transaction().await.map_err(FenceError::from)?;
        let outcome = Self::fence(&tx, req).await?;
        if outcome.is_applied() {
            effect(&tx).await?;
        }
        tx.commit().await.map_err(FenceError::from)?;
        Ok(outcome)
    }

    /// [`PgFence::write`] in two round trips: `BEGIN`, the fence and the
    /// caller's `effect` statement are sent together (pipelined on the
    /// connection), then `COMMIT`. A fence that does not apply aborts the
    /// transaction (SQLSTATE BF001, `baton.fence_or_abort`), so the effect
    /// never commits; its outcome is returned all the same. If the effect
    /// fails the transaction rolls back and its error is returned: no
    /// operation record without its effect. `client` must not be inside a
    /// transaction, and nothing else may use it meanwhile.
    pub async fn write_pipelined(
        client: &Client,
        prepared: &Prepared,
        req: &FenceRequest,
        effect: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Outcome, FenceError> {
        req.exclusive_only(
            "be pipelined (the pipelined write aborts on refusal; use PgFence::write)",
        )?;
        let args = FenceArgs::new(req);
        let fence_params = args.params();
        let judging = metrics::Judging::start(req);
        let (begun, fenced, effected) = async {
            tokio::join!(
                client.batch_execute("BEGIN"),
                client.query_one(&prepared.fence_or_abort, &fence_params),
                client.execute(effect, params),
            )
        }
        .instrument(judging.span().clone())
        .await;
        let finish = |commit: bool| async move {
            client
                .batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
                .await
        };
        if let Err(e) = begun {
            // A BEGIN that failed leaves no transaction; the two statements
            // ran on their own and are undone if they can be.
            let _ = finish(false).await;
            return Err(e.into());
        }
        let row = match fenced {
            Ok(row) => row,
            Err(e) => {
                finish(false).await?;
                let refused = e.as_db_error().filter(|d| d.code().code() == NOT_APPLIED);
                return match refused {
                    Some(db) => {
                        let fields =
                            Fields::from_error(db.detail().unwrap_or_default(), db.hint())?;
                        outcome_of(req, fields, judging)
                    }
                    None => Err(e.into()),
                };
            }
        };
        if let Err(e) = effected {
            finish(false).await?;
            return Err(e.into());
        }
        finish(true).await?;
        outcome(req, &row, judging)
    }

    /// A fenced move of the publication pointer to `req.result` (an object
    /// key) with its operation record: one statement, one round trip.
    pub async fn publish(
        client: &impl GenericClient,
        prepared: &Prepared,
        req: &FenceRequest,
    ) -> Result<Outcome, FenceError> {
        req.exclusive_only("publish")?;
        let object_key =
            std::str::from_utf8(&req.result).map_err(|_| crate::InputError::ControlCharacter {
                field: "object key",
                at_byte: 0,
            })?;
        let judging = metrics::Judging::start(req);
        let row = client
            .query_one(
                &prepared.publish,
                &[
                    &req.resource.as_str(),
                    &req.token.bigint(),
                    &req.operation.as_str(),
                    &req.fingerprint.as_bytes(),
                    &object_key,
                ],
            )
            .instrument(judging.span().clone())
            .await?;
        outcome(req, &row, judging)
    }

    /// [`PgFence::fence`] with a prepared statement.
    pub async fn fence_with(
        client: &impl GenericClient,
        prepared: &Prepared,
        req: &FenceRequest,
    ) -> Result<Outcome, FenceError> {
        let statement = match req.side {
            crate::Side::Exclusive => &prepared.fence,
            crate::Side::Shared => &prepared.fence_shared,
        };
        Self::fence_prepared(client, statement, req).await
    }

    /// The publication pointer of `resource`, if it has one.
    pub async fn publication(
        client: &impl GenericClient,
        resource: &ResourceName,
    ) -> Result<Option<Publication>, FenceError> {
        let row = client
            .query_opt(
                "SELECT published_key, published_token, published_operation FROM baton.resources
                 WHERE resource = $1 AND published_key IS NOT NULL",
                &[&resource.as_str()],
            )
            .await?;
        row.map(|r| {
            Ok(Publication {
                object_key: r.try_get(0)?,
                token: token(r.try_get(1)?)?,
                operation: r.try_get(2)?,
            })
        })
        .transpose()
    }

    /// What `resource` has recorded, if it has a row.
    pub async fn state(
        client: &impl GenericClient,
        resource: &ResourceName,
    ) -> Result<Option<ResourceState>, FenceError> {
        let row = client
            .query_opt(
                "SELECT policy, generation, seq, last_operation, cancelled_at, deleted, incarnation,
                        exclusive_token
                 FROM baton.resources WHERE resource = $1",
                &[&resource.as_str()],
            )
            .await?;
        let Some(r) = row else { return Ok(None) };
        let policy: i16 = r.try_get(0)?;
        Ok(Some(ResourceState {
            policy: Policy::from_code(policy)
                .ok_or_else(|| FenceError::Corrupt(format!("policy code {policy}")))?,
            generation: token(r.try_get(1)?)?,
            seq: seq(r.try_get(2)?)?,
            last_operation: r.try_get(3)?,
            cancelled_at: r.try_get::<_, Option<i64>>(4)?.map(token).transpose()?,
            deleted: r.try_get(5)?,
            incarnation: r.try_get(6)?,
            exclusive: crate::ExclusiveFloor::from_code(r.try_get(7)?)?,
        }))
    }

    /// A fenced deletion: judged like a write, then the row is a tombstone
    /// that keeps its generation floor.
    pub async fn delete(
        client: &impl GenericClient,
        req: &FenceRequest,
    ) -> Result<Outcome, FenceError> {
        req.exclusive_only("delete")?;
        let judging = metrics::Judging::start(req);
        let row = client
            .query_one(
                "SELECT outcome, token, current_token, current_seq, detail, result FROM baton.delete_impl($1, $2, $3, $4)",
                &[&req.resource.as_str(), &req.token.bigint(), &req.operation.as_str(), &req.fingerprint.as_bytes()],
            )
            .instrument(judging.span().clone())
            .await?;
        outcome(req, &row, judging)
    }

    /// Durable cancellation: every token at or below `at` is refused from now on.
    pub async fn cancel(
        client: &impl GenericClient,
        resource: &ResourceName,
        policy: Policy,
        at: FencingToken,
    ) -> Result<FencingToken, FenceError> {
        let row = client
            .query_one(
                "SELECT baton.cancel_impl($1, $2, $3)",
                &[&resource.as_str(), &at.bigint(), &policy.code()],
            )
            .await?;
        tracing::info!(%resource, at = %at, "resource cancelled");
        token(row.try_get(0)?)
    }

    /// Opens a new incarnation of a deleted resource at `token` (above its floor).
    pub async fn recreate(
        client: &impl GenericClient,
        resource: &ResourceName,
        token_: FencingToken,
    ) -> Result<Recreate, FenceError> {
        let label: String = client
            .query_one(
                "SELECT baton.recreate_impl($1, $2)",
                &[&resource.as_str(), &token_.bigint()],
            )
            .await?
            .try_get(0)?;
        match label.as_str() {
            "recreated" => {
                let state = Self::state(client, resource)
                    .await?
                    .ok_or_else(|| FenceError::Corrupt("recreated row vanished".into()))?;
                Ok(Recreate::Recreated {
                    incarnation: state.incarnation,
                    token: token_,
                })
            }
            "stale" => {
                let state = Self::state(client, resource)
                    .await?
                    .ok_or_else(|| FenceError::Corrupt("row vanished".into()))?;
                Ok(Recreate::Stale {
                    presented: token_,
                    floor: state.generation,
                })
            }
            _ => Ok(Recreate::NotDeleted),
        }
    }

    /// Deletes operation records older than `min_age_s` (at least an hour).
    pub async fn prune_operations(
        client: &impl GenericClient,
        min_age_s: u64,
    ) -> Result<u64, FenceError> {
        check_prune_age(min_age_s)?;
        let n: i64 = client
            .query_one(
                "SELECT baton.prune_operations_impl(make_interval(secs => $1))",
                &[&(min_age_s as f64)],
            )
            .await?
            .try_get(0)?;
        Ok(n as u64)
    }
}
