//! Watchers of holder changes under a prefix, and the latest changes for
//! a watcher that resumes.
//!
//! Every change is numbered by the pipeline when its writes are handed to
//! the committer and published here by the committer once they are
//! durable (`baton_core::pipeline`), so a watcher never sees a change a
//! crash could take back, and the numbers are the store's commit order:
//! they keep rising across restarts and leaders (the store keeps the last
//! one and the latest changes, `LeaseStore::history`).
//!
//! The engine takes a new watcher's snapshot inside a step (after handing
//! every pending write over) and registers the watcher through the
//! committer, in step order: registration runs after every earlier step's
//! commit and before any later step's events, so the snapshot and the
//! events that follow it have no gap and no overlap. A watcher that
//! resumes after a number gets, instead of a snapshot, the kept changes
//! after it, then the live ones, the same way. The server keeps the last
//! `--watch-history` changes ([`History`]); a number older than those, or
//! one above the last change, is refused ([`Refused`]).
//!
//! A live change reaches every watcher of its prefix as one shared
//! [`Published`]: one allocation per change whatever the number of
//! watchers, and one wire encoding, made by the first watcher's stream
//! that sends it and reused by the others.
//!
//! Each watcher has a bounded queue; one that falls behind by more than
//! [`WATCH_QUEUE_LEN`] events is cut off (its stream ends with
//! `RESOURCE_EXHAUSTED`), never buffered without bound. When the engine
//! stops (a restart, the end of a leader's term) every watcher's queue
//! closes and its stream ends with `UNAVAILABLE`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use baton_core::{LeaseStatus, NumberedChange};

use tokio::sync::mpsc;

/// Events a watcher may fall behind by before it is cut off.
pub const WATCH_QUEUE_LEN: usize = 4_096;

/// The changes a server keeps for resuming watchers, unless set
/// (`baton serve --watch-history`).
pub const WATCH_HISTORY_LEN_DEFAULT: usize = 100_000;

/// A change of holder, numbered in the order the store committed it.
pub type WatchEvent = NumberedChange;

/// A live change as its watchers share it.
pub struct Published {
    pub event: WatchEvent,
    /// Its encoding for the wire, made once (see [`Published::encoded`]).
    encoded: OnceLock<bytes::Bytes>,
}

impl Published {
    fn new(event: WatchEvent) -> Arc<Self> {
        Arc::new(Self {
            event,
            encoded: OnceLock::new(),
        })
    }

    /// The change as `encode` writes it for the wire, encoded by the first
    /// caller only: every watcher sends the same bytes.
    pub fn encoded(&self, encode: impl FnOnce(&WatchEvent) -> bytes::Bytes) -> &bytes::Bytes {
        self.encoded.get_or_init(|| encode(&self.event))
    }
}

/// What a new watcher gets: the holders at `seq` (or, resuming, the kept
/// changes after `seq`), then every later event.
pub struct WatchStart {
    pub seq: u64,
    pub begin: Begin,
    pub events: mpsc::Receiver<Arc<Published>>,
    /// Set when the watcher was cut off for falling behind.
    pub cut_off: Arc<AtomicBool>,
}

/// How a watch begins.
pub enum Begin {
    /// A new watch: the holders now.
    Snapshot(Vec<LeaseStatus>),
    /// A resumed one: the kept changes of its prefix after its number.
    Replay(Vec<WatchEvent>),
}

/// Why a watch could not resume from a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Older than the kept changes: `oldest` is the oldest number a watch
    /// may resume from.
    TooOld { after: u64, oldest: u64 },
    /// Above the last change: not a number of this cluster's.
    Future { after: u64, last: u64 },
}

/// The latest changes, for resuming watchers: contiguous, ending at the
/// last change.
struct History {
    /// At most this many are kept.
    len_max: usize,
    changes: VecDeque<WatchEvent>,
}

struct Watcher {
    tx: mpsc::Sender<Arc<Published>>,
    cut_off: Arc<AtomicBool>,
}

impl Watcher {
    /// Hands `event` over; `false` once the watcher is gone or cut off.
    fn offer(&self, event: &Arc<Published>) -> bool {
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
struct Watchers {
    /// The last sequence number published.
    seq: u64,
    history: History,
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
pub struct Hub {
    watchers: Mutex<Watchers>,
    /// Watchers registered plus those whose registration is queued: steps
    /// skip the event copy when 0.
    n_watchers: AtomicUsize,
}

impl Hub {
    /// A hub whose last change was `seq`, keeping at most `len_max`
    /// changes for resuming watchers, the latest of `kept` among them
    /// (those that end at `seq`: a store's history with a hole at its end
    /// is not kept).
    pub fn new(seq: u64, kept: Vec<WatchEvent>, len_max: usize) -> Self {
        let reaches = kept.last().is_some_and(|c| c.seq == seq);
        let mut changes: VecDeque<WatchEvent> = if reaches {
            kept.into()
        } else {
            VecDeque::new()
        };
        let excess = changes.len().saturating_sub(len_max);
        changes.drain(..excess);
        Self {
            watchers: Mutex::new(Watchers {
                seq,
                history: History { len_max, changes },
                groups: Vec::new(),
            }),
            n_watchers: AtomicUsize::new(0),
        }
    }

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
        self.start(prefix, |_| Ok(Begin::Snapshot(holders)))
            .expect("a snapshot is never refused")
    }

    /// Registers a watcher of `prefix` that saw every change up to
    /// `after`: it gets the kept changes of its prefix after it, then the
    /// live ones. Runs in the committer, in step order.
    pub fn resume(&self, prefix: String, after: u64) -> Result<WatchStart, Refused> {
        let wanted = prefix.clone();
        self.start(prefix, |state| {
            if after > state.seq {
                return Err(Refused::Future {
                    after,
                    last: state.seq,
                });
            }
            let changes = &state.history.changes;
            let oldest = changes.front().map_or(state.seq, |c| c.seq - 1);
            if after < oldest {
                return Err(Refused::TooOld { after, oldest });
            }
            let skip = changes.partition_point(|c| c.seq <= after);
            let replay = changes
                .range(skip..)
                .filter(|c| c.change.resource.starts_with(wanted.as_str()))
                .cloned()
                .collect();
            Ok(Begin::Replay(replay))
        })
    }

    /// Registers a watcher of `prefix` that begins as `begin` says, judged
    /// under the same lock as the publications.
    fn start(
        &self,
        prefix: String,
        begin: impl FnOnce(&Watchers) -> Result<Begin, Refused>,
    ) -> Result<WatchStart, Refused> {
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
        let begin = match begin(&state) {
            Ok(begin) => begin,
            Err(refused) => {
                // Counted by `expect`, never registered.
                self.n_watchers.fetch_sub(1, Ordering::AcqRel);
                return Err(refused);
            }
        };
        match state.groups.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, group)) => group.push(watcher),
            None => state.groups.push((prefix, vec![watcher])),
        }
        Ok(WatchStart {
            seq: state.seq,
            begin,
            events,
            cut_off,
        })
    }

    /// Keeps a commit's numbered changes and hands each to the watchers of
    /// its prefix; drops any that fell behind (cut off) or went away.
    pub fn publish(&self, events: &[WatchEvent]) {
        let mut state = self.lock();
        let before = state.len();
        let Watchers {
            seq,
            history,
            groups,
        } = &mut *state;
        for event in events {
            *seq = event.seq;
            if history.len_max > 0 {
                if history.changes.len() == history.len_max {
                    history.changes.pop_front();
                }
                history.changes.push_back(event.clone());
            }
            let mut shared: Option<Arc<Published>> = None;
            for (prefix, group) in groups.iter_mut() {
                if event.change.resource.starts_with(prefix.as_str()) {
                    let shared = shared.get_or_insert_with(|| Published::new(event.clone()));
                    group.retain(|w| w.offer(shared));
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
    use baton_core::{Change, FencingToken, HolderChange};

    fn token(n: u64) -> FencingToken {
        FencingToken::from_u64((1 << 40) | n).unwrap()
    }

    fn granted(seq: u64, resource: &str) -> WatchEvent {
        WatchEvent {
            seq,
            change: Change {
                kind: HolderChange::Granted,
                resource: resource.to_string(),
                token: token(seq),
                revoked: None,
                holder: None,
                slot: None,
            },
        }
    }

    fn hub() -> Hub {
        Hub::new(0, Vec::new(), 8)
    }

    #[test]
    fn a_watcher_gets_its_prefix_in_order_numbered_after_its_snapshot() {
        let hub = hub();
        hub.publish(&[granted(1, "a:1")]);
        hub.expect();
        assert!(hub.is_watched(), "counted before it is registered");
        let mut w = hub.register("a:".into(), Vec::new());
        assert_eq!(w.seq, 1);
        hub.publish(&[granted(2, "b:1"), granted(3, "a:2")]);
        let e = w.events.try_recv().unwrap();
        assert_eq!((e.event.seq, e.event.change.resource.as_str()), (3, "a:2"));
        assert!(w.events.try_recv().is_err(), "b:1 is not under a:");
    }

    #[test]
    fn watchers_of_a_change_share_one_copy_and_one_encoding() {
        let hub = hub();
        let mut ws: Vec<_> = ["", "a:", "a:", "b:"]
            .into_iter()
            .map(|p| {
                hub.expect();
                hub.register(p.into(), Vec::new())
            })
            .collect();
        hub.publish(&[granted(1, "a:1")]);
        let got: Vec<_> = ws[..3]
            .iter_mut()
            .map(|w| w.events.try_recv().unwrap())
            .collect();
        assert!(ws[3].events.try_recv().is_err(), "a:1 is not under b:");
        assert!(got.iter().all(|p| Arc::ptr_eq(p, &got[0])), "one copy");
        let mut n_encoded = 0;
        for p in &got {
            p.encoded(|_| {
                n_encoded += 1;
                bytes::Bytes::from_static(b"x")
            });
        }
        assert_eq!(n_encoded, 1, "encoded by the first sender only");
    }

    #[test]
    fn a_resumed_watcher_gets_the_kept_changes_after_its_number_then_the_live_ones() {
        let hub = hub();
        let batch: Vec<_> = (1..=10)
            .map(|n| granted(n, ["a:x", "b:x"][n as usize % 2]))
            .collect();
        hub.publish(&batch);
        hub.expect();
        let mut w = hub.resume("a:".into(), 5).unwrap();
        let Begin::Replay(replay) = &w.begin else {
            panic!("a resume replays")
        };
        let seqs: Vec<_> = replay.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [6, 8, 10], "after 5, under a: only");
        hub.publish(&[granted(11, "a:y")]);
        assert_eq!(
            w.events.try_recv().unwrap().event.seq,
            11,
            "then live, no gap"
        );
        hub.expect();
        let caught_up = hub.resume("a:".into(), 11).unwrap();
        assert!(matches!(&caught_up.begin, Begin::Replay(r) if r.is_empty()));
        // Eight kept: 4 to 11, so 3 is the oldest number to resume from.
        hub.expect();
        assert!(hub.resume(String::new(), 3).is_ok());
        hub.expect();
        assert_eq!(
            hub.resume(String::new(), 2).err(),
            Some(Refused::TooOld {
                after: 2,
                oldest: 3
            })
        );
        hub.expect();
        assert_eq!(
            hub.resume(String::new(), 12).err(),
            Some(Refused::Future {
                after: 12,
                last: 11
            })
        );
        assert_eq!(
            hub.n_watchers.load(Ordering::Acquire),
            2,
            "the two kept: the one dropped was swept, the refused never counted"
        );
    }

    #[test]
    fn a_restarted_hub_resumes_from_its_stores_changes_only_if_they_reach_its_last() {
        let kept: Vec<_> = (5..=9).map(|n| granted(n, "r")).collect();
        let hub = Hub::new(9, kept.clone(), 3);
        hub.expect();
        assert_eq!(
            hub.resume(String::new(), 5).err(),
            Some(Refused::TooOld {
                after: 5,
                oldest: 6
            }),
            "the last three are kept"
        );
        let broken = Hub::new(10, kept, 3);
        broken.expect();
        assert_eq!(
            broken.resume(String::new(), 9).err(),
            Some(Refused::TooOld {
                after: 9,
                oldest: 10
            }),
            "a history that does not reach the last number is not kept"
        );
    }

    #[test]
    fn a_watcher_that_falls_behind_is_cut_off_and_one_that_left_is_dropped() {
        let hub = hub();
        hub.expect();
        let slow = hub.register(String::new(), Vec::new());
        hub.expect();
        let gone = hub.register(String::new(), Vec::new());
        drop(gone);
        let events: Vec<_> = (0..=WATCH_QUEUE_LEN as u64)
            .map(|n| granted(n + 1, "r"))
            .collect();
        hub.publish(&events);
        assert!(slow.cut_off.load(Ordering::Acquire));
        assert!(!hub.is_watched(), "both gone: no copies for later steps");
        hub.expect();
        let _kept = hub.register(String::new(), Vec::new());
        hub.close();
        assert!(!hub.is_watched());
    }
}
