//! Watchers of holder changes under a prefix.
//!
//! The engine takes a watcher's snapshot inside a step and registers the
//! watcher through the committer, in step order: registration runs after
//! every earlier step's commit and before any later step's events, so the
//! snapshot and the events that follow it have no gap and no overlap.
//! Events are published by the committer after their step's commit, so a
//! watcher never sees a grant that is not durable (a release or an expiry
//! is written lazily, as for every client: a crash can undo it, and the
//! watch then ends with the restart).
//!
//! Each watcher has a bounded queue; one that falls behind by more than
//! [`WATCH_QUEUE_LEN`] events is cut off (its stream ends with
//! `RESOURCE_EXHAUSTED`), never buffered without bound. When the engine
//! stops (a restart, the end of a leader's term) every watcher's queue
//! closes and its stream ends with `UNAVAILABLE`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use baton_core::{FencingToken, Holder, HolderChange, LeaseStatus};

pub use crate::history::{holder_changes, Change};
use tokio::sync::mpsc;

/// Events a watcher may fall behind by before it is cut off.
pub const WATCH_QUEUE_LEN: usize = 4_096;

/// A change of holder, numbered in the order the engine committed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// Increases by one per event of any prefix: events of other prefixes
    /// take the numbers in between.
    pub seq: u64,
    pub kind: HolderChange,
    pub resource: String,
    /// A shared holder's or a permit's slot.
    pub slot: Option<u32>,
    /// The lease's token; for a fence, the fence's.
    pub token: FencingToken,
    /// For a fence: the token of the lease it revoked, if any.
    pub revoked: Option<FencingToken>,
    /// The description of the holder the change concerns (the new holder
    /// of a grant, the one that lost the lease otherwise).
    pub holder: Option<Holder>,
}

/// What a new watcher gets: the holders at `seq`, then every later event.
pub struct WatchStart {
    pub seq: u64,
    pub holders: Vec<LeaseStatus>,
    pub events: mpsc::Receiver<WatchEvent>,
    /// Set when the watcher was cut off for falling behind.
    pub cut_off: Arc<AtomicBool>,
}

struct Watcher {
    tx: mpsc::Sender<WatchEvent>,
    cut_off: Arc<AtomicBool>,
}

impl Watcher {
    /// Hands `event` over; `false` once the watcher is gone or cut off.
    fn offer(&self, event: &WatchEvent) -> bool {
        match self.tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.cut_off.store(true, Ordering::Release);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

/// The watchers, grouped by prefix: an event is matched once per distinct
/// prefix, not once per watcher (a thousand watchers of one prefix cost
/// one comparison).
#[derive(Default)]
struct Watchers {
    /// The last sequence number published.
    seq: u64,
    groups: Vec<(String, Vec<Watcher>)>,
}

impl Watchers {
    fn len(&self) -> usize {
        self.groups.iter().map(|(_, g)| g.len()).sum()
    }

    /// Drops the watchers whose streams went away (rare: on registration).
    fn sweep(&mut self) {
        for (_, group) in &mut self.groups {
            group.retain(|w| !w.tx.is_closed());
        }
        self.groups.retain(|(_, g)| !g.is_empty());
    }
}

/// Every watcher of one engine. Published to by the committer only.
#[derive(Default)]
pub struct Hub {
    watchers: Mutex<Watchers>,
    /// Watchers registered plus those whose registration is queued: steps
    /// skip the event copy when 0.
    n_watchers: AtomicUsize,
}

impl Hub {
    /// Whether any watcher is registered or on its way (read in every step).
    pub fn is_watched(&self) -> bool {
        self.n_watchers.load(Ordering::Acquire) > 0
    }

    /// Counts a watcher whose registration is queued behind earlier steps.
    pub fn expect(&self) {
        self.n_watchers.fetch_add(1, Ordering::AcqRel);
    }

    /// Registers a watcher of `prefix` whose snapshot is `holders`; runs in
    /// the committer, in step order. The snapshot's sequence number is the
    /// last one published.
    pub fn register(&self, prefix: String, holders: Vec<LeaseStatus>) -> WatchStart {
        let (tx, events) = mpsc::channel(WATCH_QUEUE_LEN);
        let cut_off = Arc::new(AtomicBool::new(false));
        let watcher = Watcher {
            tx,
            cut_off: cut_off.clone(),
        };
        let mut state = self.lock();
        let before = state.len();
        state.sweep();
        self.n_watchers
            .fetch_sub(before - state.len(), Ordering::AcqRel);
        match state.groups.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, group)) => group.push(watcher),
            None => state.groups.push((prefix, vec![watcher])),
        }
        WatchStart {
            seq: state.seq,
            holders,
            events,
            cut_off,
        }
    }

    /// Numbers a step's holder changes and hands each to the watchers of
    /// its prefix; drops any that fell behind (cut off) or went away.
    pub fn publish(&self, events: Vec<Change>) {
        let mut state = self.lock();
        let before = state.len();
        let Watchers { seq, groups } = &mut *state;
        for change in events {
            *seq += 1;
            let event = WatchEvent {
                seq: *seq,
                kind: change.kind,
                resource: change.resource,
                slot: change.slot,
                token: change.token,
                revoked: change.revoked,
                holder: change.holder,
            };
            for (prefix, group) in groups.iter_mut() {
                if event.resource.starts_with(prefix.as_str()) {
                    group.retain(|w| w.offer(&event));
                }
            }
        }
        groups.retain(|(_, g)| !g.is_empty());
        self.n_watchers
            .fetch_sub(before - state.len(), Ordering::AcqRel);
    }

    /// Ends every watch: the engine stopped.
    pub fn close(&self) {
        self.lock().groups.clear();
        self.n_watchers.store(0, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u64) -> FencingToken {
        FencingToken::from_u64((1 << 40) | n).unwrap()
    }

    fn granted(resource: &str, n: u64) -> Change {
        Change {
            kind: HolderChange::Granted,
            resource: resource.to_string(),
            token: token(n),
            revoked: None,
            holder: None,
            slot: None,
        }
    }

    #[test]
    fn a_watcher_gets_its_prefix_in_order_numbered_after_its_snapshot() {
        let hub = Hub::default();
        hub.publish(vec![granted("a:1", 1)]);
        hub.expect();
        assert!(hub.is_watched(), "counted before it is registered");
        let mut w = hub.register("a:".into(), Vec::new());
        assert_eq!(w.seq, 1);
        hub.publish(vec![granted("b:1", 2), granted("a:2", 3)]);
        let e = w.events.try_recv().unwrap();
        assert_eq!((e.seq, e.resource.as_str()), (3, "a:2"));
        assert!(w.events.try_recv().is_err(), "b:1 is not under a:");
    }

    #[test]
    fn a_watcher_that_falls_behind_is_cut_off_and_one_that_left_is_dropped() {
        let hub = Hub::default();
        hub.expect();
        let slow = hub.register(String::new(), Vec::new());
        hub.expect();
        let gone = hub.register(String::new(), Vec::new());
        drop(gone);
        let events = (0..=WATCH_QUEUE_LEN as u64)
            .map(|n| granted("r", n + 1))
            .collect();
        hub.publish(events);
        assert!(slow.cut_off.load(Ordering::Acquire));
        assert!(!hub.is_watched(), "both gone: no copies for later steps");
        hub.expect();
        let _kept = hub.register(String::new(), Vec::new());
        hub.close();
        assert!(!hub.is_watched());
    }
}
