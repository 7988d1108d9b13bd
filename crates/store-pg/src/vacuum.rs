//! The leader's own vacuum of the tables its commits churn.
//!
//! A grant inserts a row of `baton_server.leases` and its release deletes
//! it, so under load the table gains thousands of dead rows a second over
//! a few live ones, and every commit's lookup of a resource walks the dead
//! index entries of its name until a vacuum removes them. Autovacuum
//! visits a database once per `autovacuum_naptime` (a minute by default):
//! with 64 session clients on one member, the leader's commits grew from
//! 1.9 to 4.2 ms in 80 s and fell back only when autovacuum came
//! (docs/performance.md, "The cluster's trims and dead rows"). So while
//! it leads, a server vacuums those tables itself, at most once a second,
//! each when its dead rows outnumber its live ones (and number at least
//! 1,000): a small table whose whole index is cheap to clean, never a
//! big one autovacuum's own threshold already serves. A role that does
//! not own the tables cannot vacuum them: the server says so once and
//! leaves them to autovacuum.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::{db_message, PgTarget};

/// The churned tables.
const TABLES: &str = "'baton_server.leases'::regclass, 'baton_server.sessions'::regclass";
/// How often the dead rows are counted.
const EVERY: Duration = Duration::from_secs(1);
/// Fewer dead rows than this are left to autovacuum.
const DEAD_MIN: i64 = 1_000;

/// The running vacuum; stopped when dropped (the term is over).
pub(crate) struct Vacuum(JoinHandle<()>);

impl Vacuum {
    /// Starts on the current runtime, on a connection of its own.
    pub(crate) fn start(target: PgTarget) -> Self {
        Self(tokio::spawn(run(target)))
    }
}

impl Drop for Vacuum {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run(target: PgTarget) {
    let client = match crate::connect(&target).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "the leader's vacuum could not connect; leaving baton_server.leases to autovacuum");
            return;
        }
    };
    let not_owned = client
        .query(
            &format!(
                "SELECT oid::regclass::text FROM pg_class \
                 WHERE oid IN ({TABLES}) AND NOT pg_has_role(relowner, 'USAGE')"
            ),
            &[],
        )
        .await;
    match not_owned {
        Ok(rows) if rows.is_empty() => {}
        Ok(rows) => {
            let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            tracing::warn!(
                tables = names.join(", "),
                "the store's role does not own these tables, so the leader cannot vacuum them; autovacuum alone removes their dead rows (see docs/operations.md)"
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %db_message(&e), "the leader's vacuum could not read the tables' owners");
            return;
        }
    }
    let due = format!(
        "SELECT relid::regclass::text FROM pg_stat_user_tables \
         WHERE relid IN ({TABLES}) AND n_dead_tup >= greatest({DEAD_MIN}, n_live_tup)"
    );
    let mut ticks = tokio::time::interval(EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let tables = match client.query(due.as_str(), &[]).await {
            Ok(rows) => rows
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>(),
            Err(e) if client.is_closed() => {
                tracing::warn!(error = %db_message(&e), "the leader's vacuum lost its connection; the next term starts another");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %db_message(&e), "the leader's vacuum could not count dead rows");
                continue;
            }
        };
        for table in tables {
            // SKIP_LOCKED: a vacuum already running on it (autovacuum's)
            // is left to finish.
            if let Err(e) = client
                .batch_execute(&format!("VACUUM (SKIP_LOCKED) {table}"))
                .await
            {
                tracing::warn!(table, error = %db_message(&e), "the leader's vacuum failed");
            } else {
                tracing::debug!(table, "vacuumed");
            }
        }
    }
}
