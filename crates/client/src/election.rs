//! Fenced leader election on one lease, after etcd's
//! `concurrency.Election`: candidates campaign by waiting in line for the
//! election's resource on a session, the leader is its holder (its
//! campaign value is the lease's holder description), and observers
//! follow the resource with a watch.
//!
//! What etcd's election does not give: the leadership carries a fencing
//! token, above every earlier leader's. A deposed leader (paused,
//! partitioned, its session expired) may still believe it leads and write
//! late; a resource that checks the token (the fence kit) refuses it.
//!
//! ```no_run
//! # async fn f() -> Result<(), baton_client::ClientError> {
//! use std::time::Duration;
//! let client = baton_client::Client::connect("http://127.0.0.1:7700").await?;
//! let election = client.election("scheduler")?;
//! let leading = election
//!     .campaign("scheduler-1 @ host-a", Duration::from_secs(10), Duration::from_secs(60))
//!     .await?
//!     .expect("elected within the minute");
//! // Lead, writing `leading.token()` with every effect; stop when
//! // `leading.keeper().cancellation()` fires.
//! leading.resign().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use baton_core::{FencingToken, Holder, ResourceName};

use crate::worker::{Keeper, KeeperConfig};
use crate::{Acquired, Client, ClientError, Lease, Session, Watch, WatchKind};

/// One election: a resource name whose holder is the leader.
#[derive(Clone, Debug)]
pub struct Election {
    client: Client,
    name: String,
}

/// The leader as others see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leadership's fencing token: above every earlier leader's.
    pub token: FencingToken,
    /// Its campaign value, if it gave one.
    pub value: Option<String>,
}

/// This candidate's leadership: a lease on the election's resource, tied
/// to a session of its own and followed by a keeper.
pub struct Leadership {
    session: Session,
    keeper: Keeper,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("token", &self.token())
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The election named `name` (a resource name: the same rules).
    pub fn election(&self, name: &str) -> Result<Election, ClientError> {
        let name = ResourceName::parse(name)
            .map_err(|e| ClientError::Invalid(format!("election name: {e}")))?;
        Ok(Election {
            client: self.clone(),
            name: name.to_string(),
        })
    }
}

impl Election {
    /// The election's resource name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns with `value` (at most 256 bytes, no control characters:
    /// it is the lease's holder description) on a new session of `ttl`:
    /// waits in line, first come first served, until this candidate
    /// leads (`Some`), or `wait` runs out (`None`, nothing held). The
    /// leadership lasts while the session does: a candidate that stops
    /// heartbeating (killed, paused, cut off) is deposed one TTL later and
    /// the next in line leads, with a higher token.
    pub async fn campaign(
        &self,
        value: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Leadership>, ClientError> {
        let holder = Holder::parse(value)
            .map_err(|e| ClientError::Invalid(format!("campaign value: {e}")))?;
        let session = self
            .client
            .clone()
            .with_holder(holder)
            .open_session(ttl)
            .await?;
        let lease = match session.acquire(&self.name, wait).await {
            Ok(Acquired::Granted(lease)) => lease,
            Ok(Acquired::NotAcquired(_)) => {
                let _ = session.close().await;
                return Ok(None);
            }
            Err(e) => {
                session.abandon();
                return Err(e);
            }
        };
        let keeper = Keeper::start(session.clone(), lease, KeeperConfig::default());
        Ok(Some(Leadership { session, keeper }))
    }

    /// The current leader, if any (its token and value).
    pub async fn leader(&self) -> Result<Option<Leader>, ClientError> {
        let status = self.client.clone().status(&self.name).await?;
        Ok(status.holder_token.map(|token| Leader {
            token,
            value: status.holder,
        }))
    }

    /// Follows the leader: the current one, then every change, in order
    /// and with no gap (a watch of the election's resource, which resumes
    /// by itself across restarts and failovers).
    pub async fn observe(&self) -> Result<Observer, ClientError> {
        let watch = self.client.watch(&self.name).await?;
        let current = leader_in(&self.name, &watch.holders);
        Ok(Observer {
            name: self.name.clone(),
            seq: watch.seq,
            current,
            watch,
        })
    }
}

impl Leadership {
    /// The leadership's token: write it with every effect.
    pub fn token(&self) -> FencingToken {
        self.keeper.lease().token
    }

    /// The lease behind it.
    pub fn lease(&self) -> &Lease {
        self.keeper.lease()
    }

    /// The keeper that follows the lease: its cancellation fires when
    /// leadership is lost or about to be (fenced, the session ended, or no
    /// heartbeat acknowledged before the safe-until).
    pub fn keeper(&self) -> &Keeper {
        &self.keeper
    }

    /// The session the leadership is tied to.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session and the keeper, to follow the leadership by hand.
    pub fn into_parts(self) -> (Session, Keeper) {
        (self.session, self.keeper)
    }

    /// Gives leadership up: closes the session (releasing the lease), so
    /// the next candidate in line leads at once.
    pub async fn resign(self) -> Result<(), ClientError> {
        self.session.close().await.map(|_| ())
    }
}

/// The leader among a snapshot's holders.
fn leader_in(name: &str, holders: &[crate::WatchHolder]) -> Option<Leader> {
    holders.iter().find(|h| h.resource == name).map(|h| Leader {
        token: h.token,
        value: h.holder.clone(),
    })
}

/// A change of leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderChange {
    /// The watch's sequence number of the change.
    pub seq: u64,
    /// What happened to the resource; `None` for a leader read from a new
    /// snapshot (the observer was away longer than the server keeps
    /// changes: what happened in between is not known).
    pub kind: Option<WatchKind>,
    /// The new leader (a grant or hand-off), or `None`: the leadership is
    /// vacant (released, expired, fenced) until the next grant.
    pub leader: Option<Leader>,
    /// For a vacancy: the token of the leadership that ended.
    pub ended: Option<FencingToken>,
}

/// An election followed from a watch.
pub struct Observer {
    name: String,
    seq: u64,
    current: Option<Leader>,
    watch: Watch,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.name)
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The leader as of the last change returned (or of the snapshot).
    pub fn current(&self) -> Option<&Leader> {
        self.current.as_ref()
    }

    /// The snapshot's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Never resume: the stream's end is an error (see [`Watch::once`]).
    pub fn once(mut self) -> Self {
        self.watch = self.watch.once();
        self
    }

    /// The next change of leader. The observer resumes by itself across a
    /// restart or a failover (see [`crate::Watch::next`]); after a new
    /// snapshot it returns the leader found there (`kind` `None`), if that
    /// is not the one it had.
    pub async fn next(&mut self) -> Result<LeaderChange, ClientError> {
        loop {
            let event = match self.watch.next().await? {
                crate::WatchUpdate::Changed(event) => event,
                crate::WatchUpdate::Resnapshot { seq, holders } => {
                    self.seq = seq;
                    let leader = leader_in(&self.name, &holders);
                    if leader == self.current {
                        continue;
                    }
                    self.current = leader.clone();
                    return Ok(LeaderChange {
                        seq,
                        kind: None,
                        ended: None,
                        leader,
                    });
                }
            };
            // The watch is of a prefix: names that only start with ours
            // are other resources.
            if event.resource != self.name {
                continue;
            }
            let change = match event.kind {
                WatchKind::Granted | WatchKind::HandedOff => LeaderChange {
                    seq: event.seq,
                    kind: Some(event.kind),
                    leader: Some(Leader {
                        token: event.token,
                        value: event.holder,
                    }),
                    ended: None,
                },
                WatchKind::Released | WatchKind::Expired => LeaderChange {
                    seq: event.seq,
                    kind: Some(event.kind),
                    leader: None,
                    ended: Some(event.token),
                },
                WatchKind::Fenced => LeaderChange {
                    seq: event.seq,
                    kind: Some(event.kind),
                    leader: None,
                    ended: event.revoked,
                },
            };
            self.current = change.leader.clone();
            return Ok(change);
        }
    }
}
