//! The PostgreSQL dialect of the store (schema `statements`, next to the
//! fence kit's schema `baton`).

use baton_fence::objects::{ObjectKit, Rejection};
use baton_fence::outbox::postgres::PgOutbox;
use baton_fence::outbox::Intent;
use baton_fence::postgres::{PgFence, Prepared};
use baton_fence::{FenceRequest, FencingToken, Outcome, Policy, Publication, ResourceName};

#[cfg(feature = "chaos")]
use super::LoggedPublication;
use super::{check_enqueued, err, Input, Job, JobState, Outbox, Result, Store};

const POSTGRES_SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS statements;
CREATE TABLE IF NOT EXISTS statements.accounts (
    account       text NOT NULL,
    date          text NOT NULL,
    version       bigint NOT NULL,
    balance_cents bigint NOT NULL,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS statements.jobs (
    account text NOT NULL,
    date    text NOT NULL,
    state   text NOT NULL CHECK (state IN ('pending', 'generating', 'published', 'needs_attention', 'cancelled')),
    token   bigint,
    detail  text,
    PRIMARY KEY (account, date)
);
CREATE TABLE IF NOT EXISTS statements.worker_outcomes (
    id      bigserial PRIMARY KEY,
    worker  text NOT NULL,
    account text NOT NULL,
    date    text NOT NULL,
    token   bigint NOT NULL,
    outcome text NOT NULL,
    detail  text NOT NULL
);
";

/// The publication log, as in the SQLite dialect: a trigger on the fence
/// kit's pointer columns appends every move in the moving transaction.
const POSTGRES_LOG: &str = "
CREATE TABLE IF NOT EXISTS statements.publication_log (
    id         bigserial PRIMARY KEY,
    resource   text NOT NULL,
    token      bigint NOT NULL,
    operation  text NOT NULL,
    object_key text NOT NULL
);
CREATE OR REPLACE FUNCTION statements.log_publication() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.published_operation IS NOT NULL THEN
        INSERT INTO statements.publication_log (resource, token, operation, object_key)
        VALUES (NEW.resource, NEW.published_token, NEW.published_operation, NEW.published_key);
    END IF;
    RETURN NULL;
END $$;
-- Created once: CREATE OR REPLACE TRIGGER would lock baton.resources on
-- every open and wait behind any publish in flight (a paused worker's).
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'publication_log' AND tgrelid = 'baton.resources'::regclass) THEN
        CREATE TRIGGER publication_log
        AFTER INSERT OR UPDATE OF published_key, published_token, published_operation ON baton.resources
        FOR EACH ROW EXECUTE FUNCTION statements.log_publication();
    END IF;
END $$;
";

/// A PostgreSQL connection with the fence kit's statements prepared.
pub struct PgDb {
    client: tokio_postgres::Client,
    prepared: Prepared,
}

impl PgDb {
    pub async fn open(url: &str) -> Result<Self> {
        let mut client = baton_pgconn::connect(url).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to {}: {e}",
                baton_fence::postgres::redact_url(url)
            )
        })?;
        PgFence::migrate(&mut client).await.map_err(err)?;
        // One migrating worker at a time: concurrent CREATE ... IF NOT
        // EXISTS can collide in the catalog.
        let tx = client.transaction().await.map_err(err)?;
        tx.batch_execute("SELECT pg_advisory_xact_lock(7243017001)")
            .await
            .map_err(err)?;
        tx.batch_execute(POSTGRES_SCHEMA).await.map_err(err)?;
        tx.batch_execute(POSTGRES_LOG).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        let prepared = PgFence::prepare(&client).await.map_err(err)?;
        Ok(Self { client, prepared })
    }

    /// A database that holds the service's schema already, for reading:
    /// nothing is created or migrated.
    pub async fn open_existing(url: &str) -> Result<Self> {
        let shown = baton_fence::postgres::redact_url(url);
        let client = baton_pgconn::connect(url)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {shown}: {e}"))?;
        let row = client
            .query_one("SELECT to_regclass('statements.jobs') IS NOT NULL AND to_regclass('baton.resources') IS NOT NULL", &[])
            .await
            .map_err(err)?;
        if !row.get::<_, bool>(0) {
            return Err(crate::NoSuchJob(format!(
                "{shown} has no statements schema: nothing to read (`statements seed` and the worker create it)"
            ))
            .into());
        }
        let prepared = PgFence::prepare(&client).await.map_err(err)?;
        Ok(Self { client, prepared })
    }
}

#[async_trait::async_trait(?Send)]
impl Store for PgDb {
    async fn seed(&self, account: &str, date: &str, balance_cents: i64) -> Result<i64> {
        let client = &self.client;
        {
            client
                    .execute(
                        "INSERT INTO statements.accounts AS a (account, date, version, balance_cents) VALUES ($1, $2, 1, $3)
                         ON CONFLICT (account, date) DO UPDATE SET version = a.version + 1, balance_cents = excluded.balance_cents",
                        &[&account, &date, &balance_cents],
                    )
                    .await
                    .map_err(err)?;
            client
                    .execute(
                        "INSERT INTO statements.jobs (account, date, state) VALUES ($1, $2, 'pending') ON CONFLICT DO NOTHING",
                        &[&account, &date],
                    )
                    .await
                    .map_err(err)?;
        }
        Ok(self.input(account, date).await?.map_or(0, |i| i.version))
    }

    async fn input(&self, account: &str, date: &str) -> Result<Option<Input>> {
        let client = &self.client;
        Ok(client
                .query_opt("SELECT version, balance_cents FROM statements.accounts WHERE account = $1 AND date = $2", &[&account, &date])
                .await
                .map_err(err)?
                .map(|r| Input { version: r.get(0), balance_cents: r.get(1) }))
    }

    async fn job(&self, account: &str, date: &str) -> Result<Option<Job>> {
        let client = &self.client;
        Ok(client
                .query_opt("SELECT account, date, state, token, detail FROM statements.jobs WHERE account = $1 AND date = $2", &[&account, &date])
                .await
                .map_err(err)?
                .map(|r| {
                    let state: String = r.get(2);
                    Ok::<Job, anyhow::Error>(Job { account: r.get(0), date: r.get(1), state: JobState::parse(&state)?, token: r.get(3), detail: r.get(4) })
                })
                .transpose()?)
    }

    async fn open_jobs(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let client = &self.client;
        Ok(client
                .query("SELECT account, date FROM statements.jobs WHERE state IN ('pending', 'generating') AND left(account, length($1)) = $1 ORDER BY account, date", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
    }

    #[cfg(feature = "chaos")]
    async fn job_states(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let client = &self.client;
        Ok(client
                .query("SELECT state, count(*) FROM statements.jobs WHERE left(account, length($1)) = $1 GROUP BY state ORDER BY state", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
    }

    #[cfg(feature = "chaos")]
    async fn publication_log(&self, prefix: &str) -> Result<Vec<LoggedPublication>> {
        let client = &self.client;
        let row = |resource, token, operation| LoggedPublication {
            resource,
            token,
            operation,
        };
        Ok(client
                .query("SELECT resource, token, operation FROM statements.publication_log WHERE left(resource, length($1)) = $1 ORDER BY id", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| row(r.get(0), r.get(1), r.get(2)))
                .collect())
    }

    #[cfg(feature = "chaos")]
    async fn pointers(&self, prefix: &str) -> Result<Vec<(String, i64)>> {
        let client = &self.client;
        Ok(client
                .query("SELECT resource, published_token FROM baton.resources WHERE published_token IS NOT NULL AND left(resource, length($1)) = $1", &[&prefix])
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
    }

    async fn publish_unfenced(
        &self,
        resource: &str,
        token: FencingToken,
        operation: &str,
        object_key: &str,
        intents: &[Intent],
    ) -> Result<()> {
        let token = token.bigint();
        for i in intents {
            self.client
                .execute(
                    "INSERT INTO baton.outbox (operation, resource, token, receiver_kind, recipient, payload, payload_digest)
                     VALUES ($1, $2, $3, $4, $5, $6, sha256($6)) ON CONFLICT (operation) DO NOTHING",
                    &[&i.operation, &resource, &token, &i.kind.as_str(), &i.recipient, &i.payload],
                )
                .await
                .map_err(err)?;
        }
        let client = &self.client;
        {
            client
                    .execute(
                        "INSERT INTO baton.resources (resource, policy, generation, published_key, published_token, published_operation)
                         VALUES ($1, 1, 1, $4, $2, $3)
                         ON CONFLICT (resource) DO UPDATE SET published_key = excluded.published_key,
                             published_token = excluded.published_token, published_operation = excluded.published_operation",
                        &[&resource, &token, &operation, &object_key],
                    )
                    .await
                    .map_err(err)?;
        }
        Ok(())
    }

    async fn set_state(
        &self,
        account: &str,
        date: &str,
        state: JobState,
        token: FencingToken,
        detail: &str,
    ) -> Result<bool> {
        let token = token.bigint();
        let client = &self.client;
        let state = state.as_str();
        let n = client
            .execute(
                "UPDATE statements.jobs SET state = $3, token = $4, detail = $5
                     WHERE account = $1 AND date = $2 AND state NOT IN ('cancelled', 'published')",
                &[&account, &date, &state, &token, &detail],
            )
            .await
            .map_err(err)?;
        Ok(n == 1)
    }

    async fn cancel_job(
        &mut self,
        account: &str,
        date: &str,
        resource: &ResourceName,
    ) -> Result<bool> {
        let tx = self.client.transaction().await.map_err(err)?;
        let n = tx
            .execute(
                "UPDATE statements.jobs SET state = 'cancelled', detail = 'cancelled by operator' WHERE account = $1 AND date = $2",
                &[&account, &date],
            )
            .await
            .map_err(err)?;
        PgOutbox::cancel(&tx, resource, "statements cancel")
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(n == 1)
    }

    async fn record_outcome(
        &self,
        worker: &str,
        account: &str,
        date: &str,
        token: FencingToken,
        outcome: &str,
        detail: &str,
    ) -> Result<()> {
        let token = token.bigint();
        let client = &self.client;
        {
            client
                    .execute(
                        "INSERT INTO statements.worker_outcomes (worker, account, date, token, outcome, detail) VALUES ($1, $2, $3, $4, $5, $6)",
                        &[&worker, &account, &date, &token, &outcome, &detail],
                    )
                    .await
                    .map_err(err)?;
        }
        Ok(())
    }

    async fn outcomes(
        &self,
        account: &str,
        date: &str,
    ) -> Result<Vec<(String, i64, String, String)>> {
        let client = &self.client;
        Ok(client
                .query(
                    "SELECT worker, token, outcome, detail FROM statements.worker_outcomes WHERE account = $1 AND date = $2 ORDER BY id",
                    &[&account, &date],
                )
                .await
                .map_err(err)?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect())
    }

    async fn publication(&self, key: &ResourceName) -> Result<Option<Publication>> {
        let client = &self.client;
        PgFence::publication(client, key).await.map_err(err)
    }

    async fn fence_state(&self, key: &ResourceName) -> Result<Option<baton_fence::ResourceState>> {
        let client = &self.client;
        PgFence::state(client, key).await.map_err(err)
    }

    async fn publish(
        &mut self,
        kit: &ObjectKit,
        req: &FenceRequest,
        intents: &[Intent],
    ) -> Result<std::result::Result<Outcome, Rejection>> {
        if intents.is_empty() {
            // One statement, committed on its own: one round trip.
            return kit
                .publish_postgres(&self.client, &self.prepared, req)
                .await
                .map_err(err);
        }
        let tx = self.client.transaction().await.map_err(err)?;
        let outcome = kit
            .publish_postgres(&tx, &self.prepared, req)
            .await
            .map_err(err)?;
        if matches!(&outcome, Ok(o) if o.is_applied()) {
            for intent in intents {
                let step = PgOutbox::enqueue(&tx, &req.resource, req.token, intent)
                    .await
                    .map_err(err)?;
                check_enqueued(&step).map_err(err)?;
            }
        }
        tx.commit().await.map_err(err)?;
        Ok(outcome)
    }

    async fn fence_cancel(&mut self, key: &ResourceName, at: FencingToken) -> Result<()> {
        let tx = self.client.transaction().await.map_err(err)?;
        PgFence::cancel(&tx, key, Policy::OnePerGeneration, at)
            .await
            .map_err(err)?;
        PgOutbox::cancel(&tx, key, "statements cancel")
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    fn outbox(&mut self) -> Outbox<'_> {
        Outbox::Postgres(&self.client)
    }
}
