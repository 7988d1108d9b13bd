//! A sorted map in chunks: the table's resources and its lease deadlines.
//!
//! Ten million leases' names and deadlines are mostly added in order (a
//! fill's names come in order, a grant's deadline is its clock plus its
//! TTL and most TTLs are alike), and std's B-tree splits a full node in
//! halves wherever the new entry goes, so a tree filled in order keeps its
//! nodes half full: about 35 bytes a 16-byte entry. Here the entries sit
//! in sorted chunks of at most [`CHUNK_LEN`] (a two-level sorted list),
//! the resources' 16-byte entries (a name and a boxed state) as much as
//! the deadlines'. A full last chunk is followed by a new one when the
//! entry goes after it (the right edge: the full chunk stays full); a
//! full chunk passes an entry on to a neighbour with room; only when
//! neither has room does it split, the last chunk where the entry goes
//! (it stays nearly full), any other in halves. A chunk below a quarter
//! full after a removal is merged into a neighbour that has room.
//!
//! Each chunk's last key is kept beside the chunks (its fence), so that
//! finding a key's chunk reads the fences, not the chunks; a search looks
//! at the ends first, where keys in order come and go. A chunk is a ring,
//! so that an entry added or removed at either end moves nothing (expiry
//! takes names from the front, short deadlines land in front of long
//! ones). The deadlines that come due leave from the front in one piece
//! ([`SortedChunks::split_below`]): whole chunks moved, one cut.
//!
//! No well-kept crate has the right edge and the cut (the two-level
//! B-trees on crates.io split in halves, like std's); this is a few
//! hundred lines, checked against std's `BTreeMap` by the property test
//! below.

use std::{borrow::Borrow, cmp::Ordering, collections::VecDeque, ops::Bound};

mod builder;

pub(super) use builder::Builder;

/// Most entries in a chunk: 512 16-byte entries are 8 KiB, so an entry put
/// inside a chunk moves at most 4 KiB (the nearer end's side).
pub(super) const CHUNK_LEN: usize = 512;

/// A sorted map from `K` to `V` (a set when `V` is `()`) in chunks of at
/// most `CAP` entries.
#[derive(Debug)]
pub(super) struct SortedChunks<K, V = (), const CAP: usize = CHUNK_LEN> {
    /// Sorted by key, non-empty, each at most `CAP` long.
    chunks: VecDeque<VecDeque<(K, V)>>,
    /// The last key of each chunk.
    fences: VecDeque<K>,
}

/// Where an entry is: its chunk, and its index in the chunk. Good until
/// the next insert or removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Place {
    chunk: usize,
    at: usize,
}

impl<K, V, const CAP: usize> Default for SortedChunks<K, V, CAP> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            fences: VecDeque::new(),
        }
    }
}

impl<K: Ord + Clone, V, const CAP: usize> SortedChunks<K, V, CAP> {
    /// The map of `entries`, in any order (a key given twice keeps its
    /// first entry).
    #[cfg(test)]
    pub(super) fn from_unsorted(entries: Vec<(K, V)>) -> Self {
        let mut builder = Builder::default();
        for entry in entries {
            builder.push(entry);
        }
        builder.finish()
    }

    /// Appends `chunk` (sorted, above every entry) as the last chunk.
    fn push_last_chunk(&mut self, chunk: Vec<(K, V)>) {
        let last = &chunk.last().expect("not empty").0;
        self.fences.push_back(last.clone());
        self.chunks.push_back(chunk.into());
    }

    /// How many entries (the table counts its leases itself).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.chunks.iter().map(VecDeque::len).sum()
    }

    /// The entry of the least key.
    pub(super) fn first(&self) -> Option<&(K, V)> {
        self.chunks.front()?.front()
    }

    /// The chunk where `key` is or would go: the first whose last key is
    /// not below it, or the last chunk; and where in it. `None` when empty.
    ///
    /// The ends are looked at before the binary searches: keys come in
    /// order to the right edge (a fill's names, most deadlines) and leave
    /// in order from the front (expiry), where the searches would compare
    /// twenty long names and the ends compare one or two.
    fn search<Q>(&self, key: &Q) -> Option<(usize, Result<usize, usize>)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let last = self.chunks.len().checked_sub(1)?;
        match self.fences[last].borrow().cmp(key) {
            Ordering::Less => return Some((last, Err(self.chunks[last].len()))),
            Ordering::Equal => return Some((last, Ok(self.chunks[last].len() - 1))),
            Ordering::Greater => {}
        }
        // From here the key is below the last fence: its chunk's fence is
        // not below it.
        let c = if last == 0 || self.fences[0].borrow() >= key {
            0
        } else {
            self.fences.partition_point(|fence| fence.borrow() < key)
        };
        let chunk = &self.chunks[c];
        let found = match chunk[0].0.borrow().cmp(key) {
            Ordering::Equal => Ok(0),
            Ordering::Greater => Err(0),
            Ordering::Less => chunk.binary_search_by(|(k, _)| k.borrow().cmp(key)),
        };
        Some((c, found))
    }

    /// Where `key`'s entry is, if it is there.
    pub(super) fn find<Q>(&self, key: &Q) -> Option<Place>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self.search(key)? {
            (chunk, Ok(at)) => Some(Place { chunk, at }),
            (_, Err(_)) => None,
        }
    }

    /// The value under `key`.
    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let p = self.find(key)?;
        Some(&self.chunks[p.chunk][p.at].1)
    }

    /// The value under `key`, to change.
    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let p = self.find(key)?;
        Some(self.at_mut(p).1)
    }

    /// The entry at `place` (from [`Self::find`], with nothing added or
    /// removed since), its value to change.
    pub(super) fn at_mut(&mut self, place: Place) -> (&K, &mut V) {
        let (k, v) = &mut self.chunks[place.chunk][place.at];
        (k, v)
    }

    /// Adds `key` with `value` unless `key` is there already (then
    /// nothing changes, and false).
    pub(super) fn insert(&mut self, key: K, value: V) -> bool {
        match self.search(&key) {
            None => {
                self.push_chunk((key, value));
                true
            }
            Some((_, Ok(_))) => false,
            Some((c, Err(at))) => {
                self.insert_new(c, at, (key, value));
                true
            }
        }
    }

    /// The value under `key`, added with `make` if it was not there.
    pub(super) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let p = match self.search(&key) {
            None => self.push_chunk((key, make())),
            Some((chunk, Ok(at))) => Place { chunk, at },
            Some((c, Err(at))) => self.insert_new(c, at, (key, make())),
        };
        self.at_mut(p).1
    }

    /// Puts `entry` (whose key is not there) at `at` in chunk `c`, as
    /// [`Self::search`] found them; where it went.
    fn insert_new(&mut self, c: usize, at: usize, entry: (K, V)) -> Place {
        let last = c + 1 == self.chunks.len();
        let chunk = &mut self.chunks[c];
        if chunk.len() < CAP {
            chunk.insert(at, entry);
            // The fence moves only when the entry went last.
            if at + 1 == chunk.len() {
                self.fences[c] = chunk[at].0.clone();
            }
            return Place { chunk: c, at };
        }
        if at == CAP && last {
            // The right edge: the full chunk stays full.
            return self.push_chunk(entry);
        }
        // A chunk but the last is found by its fence, not below the key:
        // `at < CAP` from here on.
        let has_room = |i: usize| self.chunks.get(i).is_some_and(|o| o.len() < CAP);
        let (next_has_room, before_has_room) = (has_room(c + 1), c > 0 && has_room(c - 1));
        let chunk = &mut self.chunks[c];
        let place = if next_has_room {
            // A full chunk passes its last entry on to a neighbour with
            // room rather than splitting: entries added nearly in order
            // (deadlines of one millisecond come in their names' order,
            // not their grants') keep the chunks behind the edge full.
            let moved = chunk.pop_back().expect("a full chunk");
            chunk.insert(at, entry);
            self.chunks[c + 1].push_front(moved);
            Place { chunk: c, at }
        } else if before_has_room {
            // Or its first to the one before (the entry itself, if it
            // goes first).
            let place = if at == 0 {
                self.chunks[c - 1].push_back(entry);
                Place {
                    chunk: c - 1,
                    at: self.chunks[c - 1].len() - 1,
                }
            } else {
                let moved = chunk.pop_front().expect("a full chunk");
                chunk.insert(at - 1, entry);
                self.chunks[c - 1].push_back(moved);
                Place {
                    chunk: c,
                    at: at - 1,
                }
            };
            self.refence(c - 1);
            place
        } else {
            self.split(c, at, entry, last)
        };
        self.refence(c);
        place
    }

    /// Splits the full chunk `c` and puts `entry` at `at` in it: the last
    /// chunk is cut where the entry goes (it stays nearly full), any other
    /// in halves. Where it went; chunk `c`'s fence is the caller's.
    fn split(&mut self, c: usize, at: usize, entry: (K, V), last: bool) -> Place {
        let chunk = &mut self.chunks[c];
        let cut = if last { at.max(CAP / 2) } else { CAP / 2 };
        let mut right = VecDeque::with_capacity(CAP);
        right.extend(chunk.drain(cut..));
        let place = if at <= cut {
            chunk.insert(at, entry);
            Place { chunk: c, at }
        } else {
            right.insert(at - cut, entry);
            Place {
                chunk: c + 1,
                at: at - cut,
            }
        };
        let right_last = right.back().expect("half a chunk").0.clone();
        self.chunks.insert(c + 1, right);
        self.fences.insert(c + 1, right_last);
        place
    }

    /// Sets chunk `c`'s fence to its last key.
    fn refence(&mut self, c: usize) {
        self.fences[c] = self.chunks[c].back().expect("not empty").0.clone();
    }

    /// Appends a chunk of `entry` alone (above every entry). It grows as
    /// it fills (a chunk of one, made and emptied by each cycle of a
    /// small table, stays small).
    fn push_chunk(&mut self, entry: (K, V)) -> Place {
        self.fences.push_back(entry.0.clone());
        self.chunks.push_back(VecDeque::from([entry]));
        Place {
            chunk: self.chunks.len() - 1,
            at: 0,
        }
    }

    /// Takes out `key`'s value, if it is there.
    pub(super) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let p = self.find(key)?;
        Some(self.remove_at(p).1)
    }

    /// Takes out the entry at `place` (from [`Self::find`], with nothing
    /// added or removed since).
    pub(super) fn remove_at(&mut self, place: Place) -> (K, V) {
        let chunk = &mut self.chunks[place.chunk];
        let entry = chunk.remove(place.at).expect("an entry's place");
        let was_last = place.at == chunk.len();
        self.settle(place.chunk, was_last);
        entry
    }

    /// After chunk `c` shrank (by its last entry, if `last_removed`): its
    /// fence follows its last key, an empty chunk goes, and one below a
    /// quarter full is merged into a neighbour that has room for it.
    fn settle(&mut self, c: usize, last_removed: bool) {
        let n = self.chunks[c].len();
        if n == 0 {
            self.chunks.remove(c);
            self.fences.remove(c);
            return;
        }
        if last_removed {
            self.refence(c);
        }
        if n >= CAP / 4 {
            return;
        }
        let fits = |i: usize| self.chunks.get(i).is_some_and(|o| o.len() + n <= CAP);
        if fits(c + 1) {
            // Into the next one, in front: the fence is the next one's.
            let mut next = std::mem::take(&mut self.chunks[c + 1]);
            let mut merged = std::mem::take(&mut self.chunks[c]);
            merged.append(&mut next);
            self.chunks[c + 1] = merged;
            self.chunks.remove(c);
            self.fences.remove(c);
        } else if c > 0 && fits(c - 1) {
            let mut this = self.chunks.remove(c).expect("chunk c");
            self.fences.remove(c);
            self.chunks[c - 1].append(&mut this);
            self.refence(c - 1);
        }
    }

    /// Takes out every entry whose key is below `bound`, in order, in one
    /// piece: the chunks wholly below it are moved, and one is cut.
    pub(super) fn split_below(&mut self, bound: &K) -> Due<(K, V)> {
        let whole = self.fences.partition_point(|last| last < bound);
        let mut due: VecDeque<_> = (self.chunks.drain(..whole))
            .map(|chunk| Vec::from(chunk).into_iter())
            .collect();
        self.fences.drain(..whole);
        if let Some(first) = self.chunks.front_mut() {
            let at = first.partition_point(|(k, _)| k < bound);
            if at > 0 {
                due.push_back(first.drain(..at).collect::<Vec<_>>().into_iter());
                self.settle(0, false);
            }
        }
        Due::new(due)
    }

    /// The entries from `lower` on, in order.
    pub(super) fn range_from<Q>(&self, lower: Bound<&Q>) -> impl Iterator<Item = &(K, V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        // Below the bound: a key that comes before the first entry shown.
        let below = |k: &K| match lower {
            Bound::Included(q) => k.borrow() < q,
            Bound::Excluded(q) => k.borrow() <= q,
            Bound::Unbounded => false,
        };
        let c = self.fences.partition_point(|last| below(last));
        let first = (self.chunks.get(c))
            .map(|chunk| chunk.range(chunk.partition_point(|(k, _)| below(k))..));
        let rest = self.chunks.range((c + 1).min(self.chunks.len())..);
        first.into_iter().flatten().chain(rest.flatten())
    }

    /// Every entry, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(K, V)> {
        self.chunks.iter().flatten()
    }

    /// Every chunk is sorted, non-empty, at most `CAP` long, above the one
    /// before it, with its fence.
    #[cfg(test)]
    pub(super) fn check(&self) {
        assert_eq!(self.chunks.len(), self.fences.len());
        let mut before: Option<&K> = None;
        for (chunk, fence) in self.chunks.iter().zip(&self.fences) {
            assert!(!chunk.is_empty() && chunk.len() <= CAP, "chunk size");
            assert!(
                chunk
                    .iter()
                    .zip(chunk.iter().skip(1))
                    .all(|(a, b)| a.0 < b.0),
                "sorted chunk"
            );
            assert!(before.is_none_or(|b| b < &chunk[0].0), "chunks in order");
            assert!(chunk.back().map(|(k, _)| k) == Some(fence), "fence");
            before = chunk.back().map(|(k, _)| k);
        }
    }
}

/// Entries taken out of a [`SortedChunks`] in one piece, in order.
#[derive(Debug)]
pub(super) struct Due<T> {
    chunks: VecDeque<std::vec::IntoIter<T>>,
    len: usize,
}

impl<T> Due<T> {
    fn new(chunks: VecDeque<std::vec::IntoIter<T>>) -> Self {
        let len = chunks.iter().map(ExactSizeIterator::len).sum();
        Self { chunks, len }
    }

    /// How many are left (O(1)).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The entries left, in order.
    pub(super) fn iter(&self) -> DueIter<'_, T> {
        DueIter {
            chunks: self.chunks.iter(),
            chunk: [].iter(),
            left: self.len,
        }
    }

    /// Takes out the least entry left.
    pub(super) fn pop_first(&mut self) -> Option<T> {
        loop {
            let front = self.chunks.front_mut()?;
            if let Some(entry) = front.next() {
                self.len -= 1;
                return Some(entry);
            }
            self.chunks.pop_front();
        }
    }
}

/// The entries left in a [`Due`], in order.
pub(super) struct DueIter<'a, T> {
    chunks: std::collections::vec_deque::Iter<'a, std::vec::IntoIter<T>>,
    chunk: std::slice::Iter<'a, T>,
    left: usize,
}

impl<'a, T> Iterator for DueIter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        loop {
            if let Some(entry) = self.chunk.next() {
                self.left -= 1;
                return Some(entry);
            }
            self.chunk = self.chunks.next()?.as_slice().iter();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<T> ExactSizeIterator for DueIter<'_, T> {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, u32),
        /// Adds the key if missing, then adds one to its value.
        Bump(u16),
        Remove(u16),
        /// Finds the key, then takes its entry out by its place.
        RemoveAt(u16),
        SplitBelow(u16),
        RangeFrom(u8, u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // In order (the right edge), then anywhere.
            (0u16..400, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u16..400, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u16..400).prop_map(Op::Bump),
            (0u16..400).prop_map(Op::Remove),
            (0u16..400).prop_map(Op::RemoveAt),
            (0u16..400).prop_map(Op::SplitBelow),
            (0u8..3, 0u16..400).prop_map(|(b, k)| Op::RangeFrom(b, k)),
        ]
    }

    proptest! {
        /// Every operation does what std's `BTreeMap` does, and the chunks
        /// keep their shape.
        #[test]
        fn sorted_chunks_behave_as_a_btree_map(
            // Up to 38 chunks of 8 and a tail: a tail of one or two is put in
            // one at a time, a longer one merged.
            front in proptest::collection::btree_set(0u16..400, 0..300),
            tail in proptest::collection::vec(0u16..400, 0..20),
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            // Built from a sorted front and a tail, as a restart's are;
            // a key given twice keeps its first entry.
            let mut start: Vec<u16> = front.into_iter().collect();
            start.extend(tail);
            let start: Vec<(u16, u32)> = (start.into_iter().enumerate())
                .map(|(i, k)| (k, i as u32))
                .collect();
            let mut chunks = SortedChunks::<u16, u32, 8>::from_unsorted(start.clone());
            let mut model = BTreeMap::new();
            for (k, v) in start {
                model.entry(k).or_insert(v);
            }
            chunks.check();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        let absent = !model.contains_key(&k);
                        model.entry(k).or_insert(v);
                        prop_assert_eq!(chunks.insert(k, v), absent);
                    }
                    Op::Bump(k) => {
                        *model.entry(k).or_default() += 1;
                        *chunks.get_or_insert_with(k, || 0) += 1;
                    }
                    Op::Remove(k) => prop_assert_eq!(chunks.remove(&k), model.remove(&k)),
                    Op::RemoveAt(k) => {
                        let place = chunks.find(&k);
                        prop_assert_eq!(place.is_some(), model.contains_key(&k));
                        if let Some(place) = place {
                            prop_assert_eq!(*chunks.at_mut(place).0, k);
                            prop_assert_eq!(chunks.remove_at(place), model.remove_entry(&k).expect("there"));
                        }
                    }
                    Op::SplitBelow(k) => {
                        let later = model.split_off(&k);
                        let expected: Vec<(u16, u32)> = std::mem::replace(&mut model, later).into_iter().collect();
                        let mut due = chunks.split_below(&k);
                        prop_assert_eq!(due.len(), expected.len());
                        prop_assert_eq!(due.iter().copied().collect::<Vec<_>>(), expected.clone());
                        let popped: Vec<(u16, u32)> = std::iter::from_fn(|| due.pop_first()).collect();
                        prop_assert_eq!(popped, expected);
                    }
                    Op::RangeFrom(b, k) => {
                        let lower = match b {
                            0 => Bound::Included(&k),
                            1 => Bound::Excluded(&k),
                            _ => Bound::Unbounded,
                        };
                        let got: Vec<(u16, u32)> = chunks.range_from(lower).copied().collect();
                        let expected: Vec<(u16, u32)> =
                            model.range((lower, Bound::Unbounded)).map(|(k, v)| (*k, *v)).collect();
                        prop_assert_eq!(got, expected);
                    }
                }
                chunks.check();
                prop_assert_eq!(chunks.len(), model.len());
                prop_assert_eq!(chunks.first().copied(), model.first_key_value().map(|(k, v)| (*k, *v)));
                prop_assert!(chunks.iter().map(|(k, v)| (k, v)).eq(model.iter()));
                for k in [0, 7, 100, 399] {
                    prop_assert_eq!(chunks.get(&k), model.get(&k));
                }
            }
        }
    }

    /// A set of `entries`, with chunks of 8.
    fn set(entries: impl IntoIterator<Item = u32>) -> SortedChunks<u32, (), 8> {
        SortedChunks::from_unsorted(entries.into_iter().map(|v| (v, ())).collect())
    }

    fn keys(chunk: &VecDeque<(u32, ())>) -> Vec<u32> {
        chunk.iter().map(|(k, ())| *k).collect()
    }

    #[test]
    fn entries_added_in_order_fill_their_chunks() {
        let mut set = set([]);
        for v in 0..80 {
            assert!(set.insert(v, ()));
        }
        set.check();
        assert_eq!(set.chunks.len(), 10, "full chunks, none split in halves");
        assert!(set.chunks.iter().all(|c| c.len() == 8));

        // Nearly in order: each three reversed.
        let mut set = self::set([]);
        for v in 0..81 {
            assert!(set.insert(v / 3 * 3 + 2 - v % 3, ()));
        }
        set.check();
        let lens: Vec<usize> = set.chunks.iter().map(VecDeque::len).collect();
        assert!(
            lens[..lens.len() - 1].iter().all(|n| *n >= 7),
            "chunks nearly full: {lens:?}"
        );
    }

    #[test]
    fn a_chunk_emptied_below_a_quarter_joins_a_neighbour() {
        let mut set = set(0..24);
        for v in (0..4).chain(8..15) {
            assert!(set.remove(&v).is_some());
        }
        set.check();
        assert_eq!(set.chunks.len(), 2, "the middle chunk's last entry merged");
        assert_eq!(keys(&set.chunks[0]), [4, 5, 6, 7, 15]);

        let mut set = self::set(0..24);
        for v in (16..20).chain(9..16) {
            assert!(set.remove(&v).is_some());
        }
        set.check();
        assert_eq!(set.chunks.len(), 2, "the middle chunk's first entry merged");
        assert_eq!(keys(&set.chunks[1]), [8, 20, 21, 22, 23]);
    }
}
