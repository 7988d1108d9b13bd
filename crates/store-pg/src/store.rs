//! [`PgLeaseStore`]: the lease store of one leadership term.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use baton_core::{
    AcquisitionDigest, Epoch, FencingToken, Holder, LeaseRecord, ResourceName, SessionDigest,
    SessionRecord, Shape, Write,
};
use baton_store::{CommitDone, History, LeaseStore, StoreError, Stored};
use tokio::runtime::Handle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::{db_message, PgError};

/// SQLSTATE raised by `commit_batch` when the term is over.
const TERM_OVER: &str = "BA001";

/// Commits sent and not yet answered, at most. Two keep PostgreSQL busy:
/// the next call is queued on the connection while one runs.
pub const COMMITS_IN_FLIGHT_MAX: usize = 2;

/// The lease store of the leader of `term`. Every commit is one call of
/// `baton_server.commit_batch`, refused once another server took over,
/// and refused unless the commit before it in the term committed.
///
/// The engine calls it from its own thread; the calls run on the runtime
/// whose handle it keeps. A commit is sent while the one before it is in
/// flight ([`COMMITS_IN_FLIGHT_MAX`]): its statement runs as soon as the
/// earlier one's transaction ends, instead of a round trip later.
pub struct PgLeaseStore {
    client: Arc<Client>,
    runtime: Handle,
    term: u64,
    commit: Statement,
    commit_timeout: Duration,
    /// Commits started in this term.
    commits: u64,
    /// Set once a commit failed: every later one is refused.
    poisoned: Arc<AtomicBool>,
    /// The calls in flight, in the order sent.
    sequencer: tokio::sync::mpsc::UnboundedSender<InFlight>,
    /// Stopped with the store (the term's end).
    _vacuum: crate::vacuum::Vacuum,
}

impl PgLeaseStore {
    /// Opens a connection of its own for the leader of `term`, and one for
    /// its vacuum. A commit that has no answer within `commit_timeout` is
    /// reported as failed with an unknown outcome.
    pub async fn open(
        config: &crate::PgTarget,
        term: u64,
        commit_timeout: Duration,
    ) -> Result<Self, PgError> {
        let client = crate::connect(config).await?;
        let commit = client
            .prepare("SELECT baton_server.commit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)")
            .await?;
        let poisoned = Arc::new(AtomicBool::new(false));
        let (sequencer, calls) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(sequence(calls, term, commit_timeout, poisoned.clone()));
        Ok(Self {
            client: Arc::new(client),
            runtime: Handle::current(),
            term,
            commit,
            commit_timeout,
            commits: 0,
            poisoned,
            sequencer,
            _vacuum: crate::vacuum::Vacuum::start(config.clone()),
        })
    }

    async fn load_async(&self) -> Result<Stored, StoreError> {
        let storage = |e: tokio_postgres::Error| StoreError::Storage(db_message(&e));
        let meta = self
            .client
            .query_one(
                "SELECT epoch, counter FROM baton_server.meta WHERE id = 1",
                &[],
            )
            .await
            .map_err(storage)?;
        let epoch: i64 = meta.get(0);
        let counter: i64 = meta.get(1);
        let epoch = u32::try_from(epoch)
            .ok()
            .and_then(|e| Epoch::new(e).ok())
            .ok_or_else(|| StoreError::Corrupt(format!("stored epoch {epoch} is out of range")))?;
        let counter = u64::try_from(counter)
            .map_err(|_| StoreError::Corrupt(format!("stored counter {counter} is negative")))?;
        let rows = self
            .client
            .query(
                "SELECT resource, digest, token, ttl_ms, session, holder, permits FROM baton_server.leases",
                &[],
            )
            .await
            .map_err(storage)?;
        let leases = rows.iter().map(lease_row).collect::<Result<Vec<_>, _>>()?;
        let rows = self
            .client
            .query(
                "SELECT digest, ttl_ms, opener FROM baton_server.sessions",
                &[],
            )
            .await
            .map_err(storage)?;
        let mut sessions = Vec::with_capacity(rows.len());
        for r in rows {
            let digest = digest16(r.get(0))
                .ok_or_else(|| StoreError::Corrupt("a session digest is not 16 bytes".into()))?;
            let ttl_ms = u64::try_from(r.get::<_, i64>(1)).map_err(|_| {
                StoreError::Corrupt(format!(
                    "a session's ttl_ms {} is negative",
                    r.get::<_, i64>(1)
                ))
            })?;
            sessions.push(SessionRecord {
                digest,
                ttl_ms,
                opener: r.get(2),
            });
        }
        Ok(Stored {
            epoch,
            counter,
            leases,
            sessions,
        })
    }

    /// The leases that ended in the last two minutes, by the database's
    /// clock (`sql/004_ended.sql`).
    async fn ended_async(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT digest FROM baton_server.ended \
                 WHERE ended_at >= now() - interval '120 seconds'",
                &[],
            )
            .await
            .map_err(|e| StoreError::Storage(db_message(&e)))?;
        rows.into_iter()
            .map(|r| {
                digest16(r.get(0))
                    .ok_or_else(|| StoreError::Corrupt("an ended digest is not 16 bytes".into()))
            })
            .collect()
    }

    /// The last `n_max` kept changes and the last number
    /// (`sql/006_changes.sql`).
    async fn history_async(&self, n_max: usize) -> Result<History, StoreError> {
        let storage = |e: tokio_postgres::Error| StoreError::Storage(db_message(&e));
        let seq: i64 = self
            .client
            .query_one("SELECT seq FROM baton_server.meta WHERE id = 1", &[])
            .await
            .map_err(storage)?
            .get(0);
        let rows = self
            .client
            .query(
                "SELECT body FROM (SELECT seq, body FROM baton_server.changes \
                 ORDER BY seq DESC LIMIT $1) AS latest ORDER BY seq",
                &[&i64::try_from(n_max).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(storage)?;
        let mut changes = Vec::with_capacity(rows.len());
        for r in rows {
            let body: &[u8] = r.get(0);
            let decoded = baton_store::image::decode_changes(body)
                .map_err(|e| StoreError::Corrupt(format!("a kept change: {e}")))?;
            changes.extend(decoded);
        }
        Ok(History {
            seq: u64::try_from(seq).unwrap_or(0),
            changes,
        })
    }

    /// Sends the call for `writes` now, on this store's connection after
    /// every call started before, and hands it to the sequencer, which
    /// reports outcomes in the same order.
    fn send_commit(&mut self, writes: &[Write], done: CommitDone) {
        if self.poisoned.load(Ordering::Acquire) {
            return done(Err(StoreError::PreviousIo));
        }
        self.commits += 1;
        let batch = Batch::of(writes, self.term as i64, self.commits as i64);
        let (client, statement) = (self.client.clone(), self.commit.clone());
        let mut call: Call = Box::pin(async move {
            let params = batch.params();
            client.execute(&statement, &params).await
        });
        // The first poll encodes the call and queues it on the connection
        // (tokio-postgres sends before it first waits): calls go out in
        // the order they start, and PostgreSQL runs them in that order.
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(outcome) = call.as_mut().poll(&mut cx) {
            call = Box::pin(std::future::ready(outcome));
        }
        let deadline = tokio::time::Instant::now() + self.commit_timeout;
        let _ = self.sequencer.send(InFlight {
            call,
            deadline,
            done: Answer(Some(done)),
        });
    }
}

/// A commit's `done`, called once: with the outcome, or, if the call is
/// dropped unanswered (its task ended with the runtime), with an unknown
/// outcome, so that the committer never waits for it.
struct Answer(Option<CommitDone>);

impl Answer {
    fn send(mut self, outcome: Result<(), StoreError>) {
        if let Some(done) = self.0.take() {
            done(outcome);
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(StoreError::Storage(
                "the commit's call was dropped before its answer (the runtime stopped), outcome unknown"
                    .into(),
            )));
        }
    }
}

/// A commit's call to `commit_batch`, sent and awaiting its answer.
type Call = Pin<Box<dyn Future<Output = Result<u64, tokio_postgres::Error>> + Send>>;

/// A commit sent and not yet answered.
struct InFlight {
    call: Call,
    deadline: tokio::time::Instant,
    done: Answer,
}

/// Awaits the calls in the order they were sent and reports each outcome.
/// After a failure every later call fails too: the database refuses a
/// commit whose predecessor did not commit (`p_commit`, BA003), and that
/// refusal is what its caller hears.
async fn sequence(
    mut calls: tokio::sync::mpsc::UnboundedReceiver<InFlight>,
    term: u64,
    commit_timeout: Duration,
    poisoned: Arc<AtomicBool>,
) {
    while let Some(InFlight {
        call,
        deadline,
        done,
    }) = calls.recv().await
    {
        let outcome = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.code().is_some_and(|c| c.code() == TERM_OVER) => {
                Err(StoreError::Deposed {
                    term,
                    why: db_message(&e),
                })
            }
            Ok(Err(e)) => Err(StoreError::Storage(format!(
                "commit to PostgreSQL failed, outcome unknown: {}",
                db_message(&e)
            ))),
            Err(_) => Err(StoreError::Storage(format!(
                "commit to PostgreSQL had no answer within {} ms, outcome unknown",
                commit_timeout.as_millis()
            ))),
        };
        if outcome.is_err() {
            poisoned.store(true, Ordering::Release);
        }
        done.send(outcome);
    }
}

/// One row of `baton_server.leases` as a lease; a row that does not read
/// is corruption, named with its resource.
fn lease_row(r: &tokio_postgres::Row) -> Result<(ResourceName, LeaseRecord), StoreError> {
    let name: String = r.get(0);
    let corrupt = |what: String| StoreError::Corrupt(format!("lease {name:?}: {what}"));
    let resource = ResourceName::parse_stored(&name).map_err(|e| corrupt(e.to_string()))?;
    let digest: Vec<u8> = r.get(1);
    let digest: [u8; 16] = digest
        .try_into()
        .map_err(|_| corrupt("digest is not 16 bytes".into()))?;
    let token = u64::try_from(r.get::<_, i64>(2))
        .map_err(|_| corrupt(format!("token {} is negative", r.get::<_, i64>(2))))
        .and_then(|t| FencingToken::from_u64(t).map_err(|e| corrupt(e.to_string())))?;
    let ttl_ms = u64::try_from(r.get::<_, i64>(3))
        .map_err(|_| corrupt(format!("ttl_ms {} is negative", r.get::<_, i64>(3))))?;
    let session = match r.get::<_, Option<Vec<u8>>>(4) {
        Some(d) => Some(digest16(d).ok_or_else(|| corrupt("session is not 16 bytes".into()))?),
        None => None,
    };
    let holder = match r.get::<_, Option<&str>>(5) {
        Some(text) => Some(Holder::parse_existing(text).map_err(|e| corrupt(e.to_string()))?),
        None => None,
    };
    // A holder's name is a shared holder's, or a permit's with its N.
    let shape = match (resource.split_slot(), r.get::<_, Option<i32>>(6)) {
        (None, None) => Shape::Exclusive,
        (Some(_), None) => Shape::Shared,
        (Some(_), Some(n)) => Shape::Permits(
            u32::try_from(n).map_err(|_| corrupt(format!("permits {n} is negative")))?,
        ),
        (None, Some(n)) => return Err(corrupt(format!("permits {n} on an exclusive lease"))),
    };
    Ok((
        resource,
        LeaseRecord {
            acquisition_digest: AcquisitionDigest::from_bytes(digest),
            token,
            ttl_ms,
            session,
            holder,
            shape,
        },
    ))
}

/// One commit's writes as the parameters of `commit_batch` (one
/// statement): the last write of each resource and of each session wins.
#[derive(Default)]
struct Batch {
    term: i64,
    /// This commit's number in the term, from 1.
    commit: i64,
    epoch: Option<i64>,
    counter: Option<i64>,
    put_resources: Vec<String>,
    put_digests: Vec<Vec<u8>>,
    put_tokens: Vec<i64>,
    put_ttls: Vec<i64>,
    put_sessions: Vec<Option<Vec<u8>>>,
    put_holders: Vec<Option<String>>,
    put_permits: Vec<Option<i32>>,
    deletes: Vec<String>,
    session_digests: Vec<Vec<u8>>,
    session_ttls: Vec<i64>,
    session_openers: Vec<Option<String>>,
    session_deletes: Vec<Vec<u8>>,
    ended: Vec<Vec<u8>>,
    /// In number order (as the pipeline numbered them).
    change_seqs: Vec<i64>,
    changes: Vec<Vec<u8>>,
}

impl Batch {
    fn of(writes: &[Write], term: i64, commit: i64) -> Self {
        let mut last: BTreeMap<&str, Option<&LeaseRecord>> = BTreeMap::new();
        let mut last_sessions: BTreeMap<&SessionDigest, Option<&SessionRecord>> = BTreeMap::new();
        let mut b = Batch {
            term,
            commit,
            ..Batch::default()
        };
        for w in writes {
            match w {
                Write::PutLease { resource, record } => {
                    last.insert(resource.as_str(), Some(record));
                }
                Write::DeleteLease { resource } => {
                    last.insert(resource.as_str(), None);
                }
                Write::PutSession { record } => {
                    last_sessions.insert(&record.digest, Some(record));
                }
                Write::DeleteSession { digest } => {
                    last_sessions.insert(digest, None);
                }
                Write::Tokens { epoch, counter } => {
                    b.epoch = Some(i64::from(epoch.get()));
                    b.counter = Some(*counter as i64);
                }
                Write::LeaseEnded { digest } => b.ended.push(digest.as_bytes().to_vec()),
                Write::Changed(change) => {
                    b.change_seqs.push(change.seq as i64);
                    b.changes.push(baton_store::image::encode_change(change));
                }
            }
        }
        for (resource, record) in last {
            match record {
                Some(r) => {
                    b.put_resources.push(resource.to_string());
                    b.put_digests.push(r.acquisition_digest.as_bytes().to_vec());
                    b.put_tokens.push(r.token.bigint());
                    b.put_ttls.push(r.ttl_ms as i64);
                    b.put_sessions
                        .push(r.session.as_ref().map(|d| d.as_bytes().to_vec()));
                    b.put_holders
                        .push(r.holder.as_ref().map(|h| h.as_str().to_string()));
                    b.put_permits.push(match r.shape {
                        Shape::Permits(n) => Some(n as i32),
                        Shape::Exclusive | Shape::Shared => None,
                    });
                }
                None => b.deletes.push(resource.to_string()),
            }
        }
        for (digest, record) in last_sessions {
            match record {
                Some(record) => {
                    b.session_digests.push(digest.as_bytes().to_vec());
                    b.session_ttls.push(record.ttl_ms as i64);
                    b.session_openers.push(record.opener.clone());
                }
                None => b.session_deletes.push(digest.as_bytes().to_vec()),
            }
        }
        b
    }

    /// In the order of `commit_batch`'s parameters.
    fn params(&self) -> [&(dyn ToSql + Sync); 19] {
        [
            &self.term,
            &self.commit,
            &self.epoch,
            &self.counter,
            &self.put_resources,
            &self.put_digests,
            &self.put_tokens,
            &self.put_ttls,
            &self.put_sessions,
            &self.put_holders,
            &self.put_permits,
            &self.deletes,
            &self.session_digests,
            &self.session_ttls,
            &self.session_openers,
            &self.session_deletes,
            &self.ended,
            &self.change_seqs,
            &self.changes,
        ]
    }
}

impl LeaseStore for PgLeaseStore {
    fn load(&self) -> Result<Stored, StoreError> {
        self.runtime.block_on(self.load_async())
    }

    fn ended(&self) -> Result<Vec<AcquisitionDigest>, StoreError> {
        self.runtime.block_on(self.ended_async())
    }

    fn history(&self, n_max: usize) -> Result<History, StoreError> {
        self.runtime.block_on(self.history_async(n_max))
    }

    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send_commit(
            writes,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        rx.recv().unwrap_or(Err(StoreError::PreviousIo))
    }

    fn commits_in_flight_max(&self) -> usize {
        COMMITS_IN_FLIGHT_MAX
    }

    fn start_commit(&mut self, writes: &[Write], done: CommitDone) {
        self.send_commit(writes, done);
    }
}

fn digest16(bytes: Vec<u8>) -> Option<AcquisitionDigest> {
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(AcquisitionDigest::from_bytes)
}
