//! A single server's disk: its write-ahead log as bytes, written with the
//! store's own record format (`baton_store::image`) and replayed with the
//! store's own reader. A commit is written to the page cache first and is
//! durable only when its sync completes; a crash keeps what was durable,
//! and of an unsynced commit nothing, a prefix (a torn write), or all of it.

use baton_client::rng::Rng;
use baton_core::Write;
use baton_store::{image, Stored};

use crate::shared::empty_store;

/// The log's generation in the simulator (one log, never rotated).
const GENERATION: u64 = 1;

/// What a crash did to the unsynced tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tear {
    /// No unsynced commit.
    Clean,
    /// The unsynced commit was lost whole.
    Lost,
    /// A prefix of it reached the disk (the reader must drop it).
    Torn,
    /// It reached the disk whole, though never acknowledged.
    Kept,
}

/// The disk of one server.
pub struct Disk {
    /// Bytes that survive any crash.
    durable: Vec<u8>,
    /// Commits written but not yet synced, oldest first: (seq, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
    /// The state the log starts from (the image a restore wrote).
    base: Stored,
}

impl Disk {
    pub fn new() -> Self {
        Self {
            durable: Vec::new(),
            unsynced: Vec::new(),
            base: empty_store(),
        }
    }

    /// Writes commit `seq` (not durable until [`Disk::synced`]).
    pub fn write(&mut self, seq: u64, writes: &[Write]) {
        let record = image::frame(GENERATION, &image::encode(writes));
        self.unsynced.push((seq, record));
    }

    /// Commit `seq`'s sync completed: it and every earlier one are durable.
    pub fn synced(&mut self, seq: u64) {
        while let Some((s, _)) = self.unsynced.first() {
            if *s > seq {
                break;
            }
            let (_, bytes) = self.unsynced.remove(0);
            self.durable.extend_from_slice(&bytes);
        }
    }

    /// A crash: unsynced commits are lost, except that the first may have
    /// reached the disk whole or in part.
    pub fn crash(&mut self, rng: &mut Rng) -> Tear {
        let unsynced = std::mem::take(&mut self.unsynced);
        let Some((_, first)) = unsynced.into_iter().next() else {
            return Tear::Clean;
        };
        match rng.below(3) {
            0 => Tear::Lost,
            1 => {
                let keep = rng.below(first.len() as u64) as usize;
                self.durable.extend_from_slice(&first[..keep]);
                // Whatever a torn sector holds past the cut.
                self.durable
                    .extend((0..rng.below(16)).map(|_| rng.below(256) as u8));
                Tear::Torn
            }
            _ => {
                self.durable.extend_from_slice(&first);
                Tear::Kept
            }
        }
    }

    /// What a restart reads: the base, then every whole record, in order.
    /// A torn tail is cut off, as the real log's open does.
    pub fn load(&mut self) -> Stored {
        let (stored, end) = self.read();
        self.durable.truncate(end);
        stored
    }

    /// What a backup reads now: every durable commit.
    pub fn backup(&self) -> Stored {
        self.read().0
    }

    /// The base with every whole durable record applied, and where the
    /// last whole record ends.
    fn read(&self) -> (Stored, usize) {
        let (writes, end) = image::replay(&self.durable, 0, GENERATION)
            .expect("a record that passed its checksum decodes");
        let mut stored = self.base.clone();
        image::apply(&mut stored, &writes);
        (stored, end)
    }

    /// A restore: the directory now holds `image` and an empty log.
    pub fn restore(&mut self, image: Stored) {
        self.durable.clear();
        self.unsynced.clear();
        self.base = image;
    }
}
