//! Who answers lease requests on this server: the engine of the current
//! leadership term, or nobody (a follower, which names the leader).
//!
//! A single server is a leader forever (term 0, no deadline). In a cluster
//! the election task (`cluster.rs`) seats and unseats terms, and moves the
//! term's deadline forward on each successful leadership renewal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use baton_store_pg::election::Timing;
use tonic::Status;

use crate::engine::EngineHandle;

pub use baton_proto::LEADER_METADATA;

/// One leadership term's engine and answer deadline.
#[derive(Clone)]
pub struct Term {
    pub engine: EngineHandle,
    pub number: u64,
    /// Milliseconds since the seat's origin; `u64::MAX` for a single server.
    deadline_ms: Arc<AtomicU64>,
}

#[derive(Clone)]
pub enum Role {
    Leader(Term),
    /// Not leading; the leader's advertised address if one is known, or
    /// why this server cannot tell (its store is unreachable).
    Follower {
        leader: Option<String>,
        trouble: Option<String>,
    },
}

/// What the election task last read about the cluster (for `ClusterStatus`).
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub cluster: String,
    pub term: u64,
    pub leader_node: Option<String>,
    pub leader: Option<String>,
    pub members: Vec<(String, String, u64)>,
}

pub struct Seat {
    origin: Instant,
    role: RwLock<Role>,
    /// This process's node id (random per start).
    pub node: String,
    /// `None` for a single server.
    view: Option<RwLock<ClusterView>>,
}

impl Seat {
    /// A single server: answers nothing until [`Seat::lead`] seats its
    /// engine (term 0, no deadline), then leads for good.
    pub fn single() -> Self {
        Self {
            origin: Instant::now(),
            node: random_node(),
            view: None,
            role: RwLock::new(Role::Follower {
                leader: None,
                trouble: None,
            }),
        }
    }

    /// A cluster member that does not lead yet.
    pub fn follower(node: String, cluster: String) -> Self {
        Self {
            origin: Instant::now(),
            node,
            view: Some(RwLock::new(ClusterView {
                cluster,
                ..ClusterView::default()
            })),
            role: RwLock::new(Role::Follower {
                leader: None,
                trouble: None,
            }),
        }
    }

    /// The cluster as last read; `None` for a single server.
    pub fn view(&self) -> Option<ClusterView> {
        self.view
            .as_ref()
            .map(|v| v.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    pub fn set_view(&self, update: impl FnOnce(&mut ClusterView)) {
        if let Some(v) = &self.view {
            update(&mut v.write().unwrap_or_else(|p| p.into_inner()));
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(*self.read(), Role::Leader(_))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Role> {
        self.role.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    pub fn role(&self) -> Role {
        self.read().clone()
    }

    fn set(&self, role: Role) {
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = role;
    }

    /// Seats the engine of `number`, answering until `deadline_ms`.
    pub fn lead(&self, engine: EngineHandle, number: u64, deadline_ms: u64) {
        self.set(Role::Leader(Term {
            engine,
            number,
            deadline_ms: Arc::new(AtomicU64::new(deadline_ms)),
        }));
    }

    /// Moves the current term's deadline (never backwards).
    pub fn extend(&self, number: u64, deadline_ms: u64) {
        if let Role::Leader(t) = &*self.read() {
            if t.number == number {
                t.deadline_ms.fetch_max(deadline_ms, Ordering::AcqRel);
            }
        }
    }

    /// Stops answering: every later request hears "not the leader".
    pub fn follow(&self, leader: Option<String>) {
        self.set(Role::Follower {
            leader,
            trouble: None,
        });
    }

    /// Stops answering (if leading) because of `cause` (the store cannot be
    /// reached, or lost commits): callers hear it.
    pub fn trouble(&self, cause: String) {
        let mut role = self.role.write().unwrap_or_else(|p| p.into_inner());
        *role = Role::Follower {
            leader: None,
            trouble: Some(cause),
        };
    }

    /// The term to send a request to, or the answer a follower gives.
    pub fn term(&self) -> Result<Term, Status> {
        match self.role() {
            Role::Leader(t)
                if Timing::answers(self.now_ms(), t.deadline_ms.load(Ordering::Acquire)) =>
            {
                Ok(t)
            }
            Role::Leader(_) => Err(not_leader(None, None)),
            Role::Follower { leader, trouble } => Err(not_leader(leader, trouble)),
        }
    }

    /// Whether an answer computed by `term` may still go out: the term is
    /// still seated and its deadline has not passed. Renewals are answered
    /// from memory, so a leader that was paused past its deadline must not
    /// confirm anything it computed.
    pub fn confirm(&self, term: &Term) -> Result<(), Status> {
        // No clone on this per-answer path: compare under the read lock.
        let seated = matches!(&*self.read(), Role::Leader(t) if t.number == term.number);
        if seated && Timing::answers(self.now_ms(), term.deadline_ms.load(Ordering::Acquire)) {
            Ok(())
        } else {
            Err(Status::unavailable(
                "this server's leadership ended before the answer could be confirmed; \
                 the request may or may not have taken effect",
            ))
        }
    }
}

/// UNAVAILABLE, definite: nothing was done; `baton-leader` names the leader
/// (empty while none is known).
pub fn not_leader(leader: Option<String>, trouble: Option<String>) -> Status {
    let message = match (&leader, trouble) {
        (Some(l), _) => format!("this server is not the leader; the leader is {l}"),
        (None, Some(cause)) => format!("this server cannot serve: {cause}; nothing was done"),
        (None, None) => "this server is not the leader and no leader is known yet (an election is under way); nothing was done, retry shortly".to_string(),
    };
    let mut status = Status::unavailable(message);
    if let Ok(value) = leader.unwrap_or_default().parse() {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

fn random_node() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
