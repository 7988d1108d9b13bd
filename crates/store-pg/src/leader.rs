//! The leadership lease: one row in `baton_server.leader`.
//!
//! A takeover locks the row `FOR UPDATE`, so it waits for a leader commit in
//! flight (which holds it `FOR KEY SHARE`), and bumps the term, so every
//! later commit of the old leader is refused. A renewal only bumps `beats`
//! and takes no lock that a commit waits for.

use tokio_postgres::{Client, GenericClient};

use crate::PgError;

/// The leadership row as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRow {
    /// The current term; only goes up.
    pub term: u64,
    /// The leader's node id; `None` when nobody leads (never led, or stepped down).
    pub holder: Option<String>,
    /// The address the leader gave for clients.
    pub advertise: Option<String>,
    /// Renewals in this term.
    pub beats: u64,
}

/// A server of the cluster as the members table saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id (random per process start).
    pub node: String,
    /// Its advertised address.
    pub advertise: String,
    /// Milliseconds since its last report, on the database's clock.
    pub seen_ms_ago: u64,
}

fn row(r: &tokio_postgres::Row) -> LeaderRow {
    LeaderRow {
        term: r.get::<_, i64>(0) as u64,
        holder: r.get(1),
        advertise: r.get(2),
        beats: r.get::<_, i64>(3) as u64,
    }
}

/// Reads the leadership row.
pub async fn read(client: &impl GenericClient) -> Result<LeaderRow, PgError> {
    let r = client
        .query_one(
            "SELECT term, holder, advertise, beats FROM baton_server.leader WHERE id = 1",
            &[],
        )
        .await?;
    Ok(row(&r))
}

/// The committed token position, as one integer (`epoch << 40 | counter`,
/// the last token issued).
pub async fn position(client: &impl GenericClient) -> Result<u64, PgError> {
    let r = client
        .query_one(
            "SELECT (epoch << 40) | counter FROM baton_server.meta WHERE id = 1",
            &[],
        )
        .await?;
    Ok(r.get::<_, i64>(0) as u64)
}

/// A won takeover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The new term.
    pub term: u64,
    /// The token position the previous leaders left, read under the lock
    /// (no commit of theirs can follow).
    pub position: u64,
}

/// Takes leadership if the row is still exactly `seen`; `None` if it
/// changed meanwhile.
pub async fn take_over(
    client: &mut Client,
    seen: &LeaderRow,
    node: &str,
    advertise: &str,
) -> Result<Option<Takeover>, PgError> {
    let txn = client.transaction().await?;
    let r = txn
        .query_one(
            "SELECT term, holder, advertise, beats FROM baton_server.leader WHERE id = 1 FOR UPDATE",
            &[],
        )
        .await?;
    let now = row(&r);
    if now.term != seen.term || now.holder != seen.holder || now.beats != seen.beats {
        return Ok(None);
    }
    let term: i64 = txn
        .query_one(
            "UPDATE baton_server.leader SET term = term + 1, holder = $1, advertise = $2, beats = 0 \
             WHERE id = 1 RETURNING term",
            &[&node, &advertise],
        )
        .await?
        .get(0);
    let position = position(&txn).await?;
    txn.commit().await?;
    Ok(Some(Takeover {
        term: term as u64,
        position,
    }))
}

/// Renews leadership of `term`; false if the term is over.
pub async fn renew(client: &Client, term: u64, node: &str) -> Result<bool, PgError> {
    let n = client
        .execute(
            "UPDATE baton_server.leader SET beats = beats + 1 WHERE id = 1 AND term = $1 AND holder = $2",
            &[&(term as i64), &node],
        )
        .await?;
    Ok(n == 1)
}

/// Steps down from `term` so that a follower may take over at once. Call
/// only after this server stopped answering for the term.
pub async fn step_down(client: &Client, term: u64, node: &str) -> Result<bool, PgError> {
    let n = client
        .execute(
            "UPDATE baton_server.leader SET holder = NULL, advertise = NULL, beats = beats + 1 \
             WHERE id = 1 AND term = $1 AND holder = $2",
            &[&(term as i64), &node],
        )
        .await?;
    Ok(n == 1)
}

/// Records that `node` is alive, and forgets members unseen for a day.
pub async fn report(client: &Client, node: &str, advertise: &str) -> Result<(), PgError> {
    client
        .execute(
            "WITH gone AS (DELETE FROM baton_server.members WHERE seen_at < now() - interval '1 day') \
             INSERT INTO baton_server.members (node, advertise, seen_at) VALUES ($1, $2, now()) \
             ON CONFLICT (node) DO UPDATE SET advertise = excluded.advertise, seen_at = excluded.seen_at",
            &[&node, &advertise],
        )
        .await?;
    Ok(())
}

/// Every member seen in the last hour, most recently seen first.
pub async fn members(client: &Client) -> Result<Vec<Member>, PgError> {
    let rows = client
        .query(
            "SELECT node, advertise, (extract(epoch FROM now() - seen_at) * 1000)::bigint \
             FROM baton_server.members WHERE seen_at > now() - interval '1 hour' ORDER BY seen_at DESC, node",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Member {
            node: r.get(0),
            advertise: r.get(1),
            seen_ms_ago: r.get::<_, i64>(2).max(0) as u64,
        })
        .collect())
}
