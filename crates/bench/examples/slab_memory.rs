//! What the representation the performance issue proposes for ten million
//! leases would cost a lease, measured before building it into the table:
//! each lease's 48 bytes in a slab under a 4-byte id, its name's text in an
//! arena (8-byte aligned, as a free list by size would keep it), the ids
//! ordered by name in sorted chunks (a two-level sorted list: a chunk holds
//! at most 1,024 ids, and a full last chunk is followed by a new one rather
//! than split), and the deadlines as (deadline, id) in sorted chunks the
//! same way. Beside it, the table's layout before its deadlines moved to
//! sorted chunks: a B-tree from the shared name to a boxed 48-byte state,
//! and a B-tree of (deadline, name).
//!
//! Each run builds one layout in one order and reports the resident growth
//! a lease and the mean time of a million lookups by name; run the layouts
//! in turn (alternating) to compare them:
//!
//! ```sh
//! cargo run --release -p baton-bench --example slab_memory -- 10000000 slab in-order
//! cargo run --release -p baton-bench --example slab_memory -- 10000000 btree in-order
//! cargo run --release -p baton-bench --example slab_memory -- 10000000 slab shuffled
//! ```
//!
//! It is a lower bound for the slab: no holes (nothing is removed), and
//! none of the table's other state.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::time::Instant;

use baton_core::ResourceName;

mod common;
use common::resident_kib;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TTL_MS: u64 = 3_600_000;
/// Most ids (or deadlines) in one sorted chunk.
const CHUNK_LEN_MAX: usize = 1024;
/// 4,681 slots of 56 bytes are just under 256 KiB: a page of 4,096 slots
/// (224 KiB) is rounded up to the allocator's next size, 8 bytes a lease.
const SLAB_PAGE_SLOTS: usize = 4681;
const ARENA_PAGE_BYTES: usize = 1 << 20;
/// Names are stored from 8-byte boundaries; an arena address counts those.
const ARENA_UNIT_BYTES: usize = 8;
const LOOKUPS: usize = 1_000_000;
/// Odd and not a multiple of 5: a permutation of any power of ten.
const LOOKUP_STRIDE: usize = 2_654_435_761;

fn name_text(k: usize) -> String {
    format!("fill:a1b2c3d4e5f6:{k:08}")
}

/// A lease's 48 bytes, as the table's `Lease` holds them.
type LeaseBytes = [u64; 6];

/// A slab slot: the lease and where its name is.
struct Slot {
    lease: LeaseBytes,
    name_at: u32,
    name_len: u16,
}

/// Names, each from an 8-byte boundary, in pages that never move.
#[derive(Default)]
struct Arena {
    pages: Vec<Vec<u8>>,
}

impl Arena {
    const PAGE_UNITS: usize = ARENA_PAGE_BYTES / ARENA_UNIT_BYTES;

    fn push(&mut self, text: &[u8]) -> u32 {
        let padded = text.len().div_ceil(ARENA_UNIT_BYTES) * ARENA_UNIT_BYTES;
        if self
            .pages
            .last()
            .is_none_or(|p| p.len() + padded > ARENA_PAGE_BYTES)
        {
            self.pages.push(Vec::with_capacity(ARENA_PAGE_BYTES));
        }
        let page_no = self.pages.len() - 1;
        let page = self.pages.last_mut().expect("pushed above");
        let unit = page.len() / ARENA_UNIT_BYTES;
        page.extend_from_slice(text);
        page.resize(page.len() + padded - text.len(), 0);
        u32::try_from(page_no * Self::PAGE_UNITS + unit).expect("under 32 GiB of names")
    }

    fn get(&self, at: u32, len: u16) -> &[u8] {
        let (page, unit) = (
            at as usize / Self::PAGE_UNITS,
            at as usize % Self::PAGE_UNITS,
        );
        let from = unit * ARENA_UNIT_BYTES;
        &self.pages[page][from..from + usize::from(len)]
    }
}

/// Sorted chunks: a two-level sorted list, with each chunk's last key
/// kept beside the chunks (its fence), so that finding the chunk reads
/// the fences, not the entries.
struct Chunks<T, K> {
    chunks: Vec<Vec<T>>,
    lasts: Vec<K>,
}

impl<T: Copy, K: Ord> Chunks<T, K> {
    fn new() -> Self {
        Self {
            chunks: Vec::new(),
            lasts: Vec::new(),
        }
    }

    /// The chunk that holds `key`'s place: the first whose last key is not
    /// below it, or the last chunk.
    fn chunk_of(&self, key: &K) -> usize {
        let c = self.lasts.partition_point(|l| l < key);
        c.min(self.chunks.len().saturating_sub(1))
    }

    fn insert(
        &mut self,
        (value, key): (T, K),
        cmp: impl Fn(&T, &T) -> Ordering,
        key_of: impl Fn(&T) -> K,
    ) {
        if self.chunks.is_empty() {
            let mut first = Vec::with_capacity(CHUNK_LEN_MAX);
            first.push(value);
            self.chunks.push(first);
            self.lasts.push(key);
            return;
        }
        let c = self.chunk_of(&key);
        let last_chunk = c + 1 == self.chunks.len();
        let chunk = &mut self.chunks[c];
        let at = chunk.partition_point(|e| cmp(e, &value) == Ordering::Less);
        if chunk.len() < CHUNK_LEN_MAX {
            chunk.insert(at, value);
        } else if last_chunk && at == chunk.len() {
            // The right edge (names and deadlines in order): a new chunk,
            // and the full one stays full.
            let mut next = Vec::with_capacity(CHUNK_LEN_MAX);
            next.push(value);
            self.chunks.push(next);
            self.lasts.push(key);
            return;
        } else {
            let mut right = Vec::with_capacity(CHUNK_LEN_MAX);
            right.extend_from_slice(&chunk[CHUNK_LEN_MAX / 2..]);
            chunk.truncate(CHUNK_LEN_MAX / 2);
            if at <= CHUNK_LEN_MAX / 2 {
                chunk.insert(at, value);
            } else {
                right.insert(at - CHUNK_LEN_MAX / 2, value);
            }
            let right_last = key_of(right.last().expect("half a chunk"));
            self.chunks.insert(c + 1, right);
            self.lasts.insert(c + 1, right_last);
        }
        let last = key_of(self.chunks[c].last().expect("not empty"));
        self.lasts[c] = last;
    }

    fn find(&self, key: &K, cmp: impl Fn(&T) -> Ordering) -> Option<T> {
        if self.chunks.is_empty() {
            return None;
        }
        let chunk = &self.chunks[self.chunk_of(key)];
        let at = chunk.binary_search_by(&cmp).ok()?;
        Some(chunk[at])
    }

    fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }
}

/// The proposed layout.
struct Slab {
    pages: Vec<Vec<Slot>>,
    names: Arena,
    by_name: Chunks<u32, Box<[u8]>>,
    /// (deadline ms high and low halves, id): 12 bytes.
    by_deadline: Chunks<[u32; 3], [u32; 3]>,
}

impl Slab {
    fn new() -> Self {
        Self {
            pages: Vec::new(),
            names: Arena::default(),
            by_name: Chunks::new(),
            by_deadline: Chunks::new(),
        }
    }

    fn slot(&self, id: u32) -> &Slot {
        let id = id as usize;
        &self.pages[id / SLAB_PAGE_SLOTS][id % SLAB_PAGE_SLOTS]
    }

    fn name(&self, id: u32) -> &[u8] {
        let s = self.slot(id);
        self.names.get(s.name_at, s.name_len)
    }

    fn insert(&mut self, name: &str, lease: LeaseBytes, deadline_ms: u64) {
        let name_at = self.names.push(name.as_bytes());
        if self.pages.last().is_none_or(|p| p.len() == SLAB_PAGE_SLOTS) {
            self.pages.push(Vec::with_capacity(SLAB_PAGE_SLOTS));
        }
        let page_no = self.pages.len() - 1;
        let page = self.pages.last_mut().expect("pushed above");
        let id = u32::try_from(page_no * SLAB_PAGE_SLOTS + page.len()).expect("under 4G leases");
        page.push(Slot {
            lease,
            name_at,
            name_len: u16::try_from(name.len()).expect("names are short"),
        });
        let (pages, names) = (&self.pages, &self.names);
        let name_of = |id: u32| {
            let s = &pages[id as usize / SLAB_PAGE_SLOTS][id as usize % SLAB_PAGE_SLOTS];
            names.get(s.name_at, s.name_len)
        };
        self.by_name.insert(
            (id, name.as_bytes().into()),
            |a, b| name_of(*a).cmp(name_of(*b)),
            |id| name_of(*id).into(),
        );
        let key = [(deadline_ms >> 32) as u32, deadline_ms as u32, id];
        self.by_deadline.insert((key, key), Ord::cmp, |k| *k);
    }

    fn get(&self, name: &str) -> Option<&LeaseBytes> {
        let id = (self.by_name).find(&name.as_bytes().into(), |id| {
            self.name(*id).cmp(name.as_bytes())
        })?;
        Some(&self.slot(id).lease)
    }
}

/// The table's layout before its deadlines moved to sorted chunks.
struct Trees {
    resources: BTreeMap<ResourceName, Box<LeaseBytes>>,
    expiries: BTreeSet<(u64, ResourceName)>,
}

impl Trees {
    fn insert(&mut self, name: &str, lease: LeaseBytes, deadline_ms: u64) {
        let name = ResourceName::parse(name).expect("a valid name");
        self.expiries.insert((deadline_ms, name.clone()));
        self.resources.insert(name, Box::new(lease));
    }
}

enum Layout {
    Slab(Slab),
    Trees(Trees),
}

impl Layout {
    fn insert(&mut self, name: &str, lease: LeaseBytes, deadline_ms: u64) {
        match self {
            Self::Slab(s) => s.insert(name, lease, deadline_ms),
            Self::Trees(t) => t.insert(name, lease, deadline_ms),
        }
    }

    fn get(&self, name: &str) -> Option<&LeaseBytes> {
        match self {
            Self::Slab(s) => s.get(name),
            Self::Trees(t) => t.resources.get(name).map(|b| &**b),
        }
    }

    fn len(&self) -> (usize, usize) {
        match self {
            Self::Slab(s) => (s.by_name.len(), s.by_deadline.len()),
            Self::Trees(t) => (t.resources.len(), t.expiries.len()),
        }
    }
}

/// The k-th of `n` in a fixed shuffled order: k times a prime that does not
/// divide `n`, modulo `n`.
fn shuffled(k: usize, n: usize) -> usize {
    const STRIDE: usize = 1_000_003;
    assert!(!n.is_multiple_of(STRIDE), "pick another stride for {n}");
    (k * STRIDE) % n
}

fn main() {
    let usage = "usage: slab_memory N_LEASES slab|btree in-order|shuffled";
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).expect(usage);
    let mut layout = match args.get(2).map(String::as_str) {
        Some("slab") => Layout::Slab(Slab::new()),
        Some("btree") => Layout::Trees(Trees {
            resources: BTreeMap::new(),
            expiries: BTreeSet::new(),
        }),
        _ => panic!("{usage}"),
    };
    let order: fn(usize, usize) -> usize = match args.get(3).map(String::as_str) {
        Some("in-order") => |k: usize, _n: usize| k,
        Some("shuffled") => shuffled,
        _ => panic!("{usage}"),
    };
    let (before_kib, started) = (resident_kib(), Instant::now());
    for k in 0..n {
        let k = order(k, n);
        // Leases granted in name order get deadlines in the same order; a
        // shuffled fill's deadlines are in the order of its grants.
        let lease = [k as u64; 6];
        layout.insert(&name_text(k), lease, TTL_MS + (k / 256) as u64);
    }
    let fill_s = started.elapsed().as_secs_f64();
    let grown_kib = resident_kib().saturating_sub(before_kib);
    assert_eq!(layout.len(), (n, n), "every lease and deadline kept");
    // Another order than a shuffled fill's, so that lookups do not follow
    // the order of its grants.
    let names: Vec<String> = (0..LOOKUPS)
        .map(|k| name_text(k.wrapping_mul(LOOKUP_STRIDE) % n))
        .collect();
    let started = Instant::now();
    let found = names
        .iter()
        .filter(|t| black_box(layout.get(t)).is_some())
        .count();
    let lookup_ns = started.elapsed().as_secs_f64() * 1e9 / LOOKUPS as f64;
    assert_eq!(found, LOOKUPS, "every name found");
    println!(
        "{} {}: {n} leases in {fill_s:.1} s, {} MiB, {:.0} bytes a lease; \
         a lookup by name {lookup_ns:.0} ns",
        args[2],
        args[3],
        grown_kib / 1024,
        grown_kib as f64 * 1024.0 / n.max(1) as f64,
    );
}
