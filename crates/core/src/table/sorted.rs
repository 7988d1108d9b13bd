//! A sorted set in chunks: the lease deadlines.
//!
//! The deadlines of ten million leases are mostly added in order (a grant's
//! deadline is its clock plus its TTL, and most TTLs are alike), and std's
//! B-tree splits a full node in halves wherever the new entry goes, so a
//! set filled in order keeps its nodes half full: about 35 bytes a 16-byte
//! entry. Here the entries sit in sorted chunks of at most [`CHUNK_LEN`]
//! (a two-level sorted list). A full last chunk is followed by a new one
//! when the entry goes after it (the right edge: the full chunk stays
//! full); a full chunk passes an entry on to a neighbour with room; only
//! when neither has room does it split, the last chunk where the entry
//! goes (it stays nearly full), any other in halves. A chunk below a
//! quarter full after a removal is merged into a neighbour that has room.
//!
//! Each chunk's last entry is kept beside the chunks (its fence), so that
//! finding an entry's chunk reads the fences, not the chunks. The
//! deadlines that come due leave from the front in one piece
//! ([`SortedChunks::split_below`]): whole chunks moved, one cut.
//!
//! No well-kept crate has the right edge and the cut (the two-level
//! B-trees on crates.io split in halves, like std's); this is under 300
//! lines, checked against std's `BTreeSet` by the property test below.

use std::collections::VecDeque;

/// Most entries in a chunk: 512 deadlines are 8 KiB, so an entry put in
/// the middle of a chunk moves 4 KiB on average.
pub(super) const CHUNK_LEN: usize = 512;

/// A sorted set of `T` in chunks of at most `CAP` entries.
#[derive(Debug)]
pub(super) struct SortedChunks<T, const CAP: usize = CHUNK_LEN> {
    /// Sorted, non-empty, each at most `CAP` long.
    chunks: VecDeque<Vec<T>>,
    /// The last entry of each chunk.
    fences: VecDeque<T>,
}

impl<T, const CAP: usize> Default for SortedChunks<T, CAP> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            fences: VecDeque::new(),
        }
    }
}

impl<T: Ord + Clone, const CAP: usize> SortedChunks<T, CAP> {
    /// The set of `entries`, in any order (duplicates kept once).
    ///
    /// A restart's deadlines come nearly sorted (in name order, each no
    /// earlier than the one before, but for the few written since the log
    /// was last folded): the sorted front is taken as it is and only the
    /// rest is sorted and merged in. (Sorting all of it in place fell back
    /// to a quicksort of ten million names, 0.4 s of a restart; a stable
    /// sort takes a scratch buffer of half of them.)
    pub(super) fn from_unsorted(mut entries: Vec<T>) -> Self {
        let front_len = (entries.windows(2))
            .position(|w| w[0] >= w[1])
            .map_or(entries.len(), |i| i + 1);
        let mut rest = entries.split_off(front_len);
        rest.sort_unstable();
        let mut set = Self::default();
        let (mut front, mut rest) = (entries.into_iter().peekable(), rest.into_iter().peekable());
        let mut chunk = Vec::with_capacity(CAP);
        loop {
            // An entry of the rest goes first only when below the front's,
            // so a duplicate is always a rest entry after its equal.
            let (next, from_rest) = match (front.peek(), rest.peek()) {
                (Some(f), Some(r)) if r < f => (rest.next(), true),
                (Some(_), _) => (front.next(), false),
                (None, _) => (rest.next(), true),
            };
            let Some(entry) = next else {
                break;
            };
            if from_rest && chunk.last().or(set.fences.back()) == Some(&entry) {
                continue;
            }
            chunk.push(entry);
            if chunk.len() == CAP {
                set.push_last_chunk(std::mem::replace(&mut chunk, Vec::with_capacity(CAP)));
            }
        }
        if !chunk.is_empty() {
            set.push_last_chunk(chunk);
        }
        set
    }

    /// Appends `chunk` (sorted, above every entry) as the last chunk.
    fn push_last_chunk(&mut self, chunk: Vec<T>) {
        self.fences
            .push_back(chunk.last().expect("not empty").clone());
        self.chunks.push_back(chunk);
    }

    /// How many entries (the table counts its leases itself).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// The least entry.
    pub(super) fn first(&self) -> Option<&T> {
        self.chunks.front()?.first()
    }

    /// The chunk where `entry` is or would go: the first whose last entry
    /// is not below it, or the last chunk. `None` when empty.
    fn chunk_of(&self, entry: &T) -> Option<usize> {
        let c = self.fences.partition_point(|last| last < entry);
        (!self.chunks.is_empty()).then(|| c.min(self.chunks.len() - 1))
    }

    /// Adds `entry`; false if it was there already.
    pub(super) fn insert(&mut self, entry: T) -> bool {
        let Some(c) = self.chunk_of(&entry) else {
            self.push_chunk(entry);
            return true;
        };
        let at = match self.chunks[c].binary_search(&entry) {
            Ok(_) => return false,
            Err(at) => at,
        };
        let last = c + 1 == self.chunks.len();
        let chunk = &mut self.chunks[c];
        if chunk.len() < CAP {
            chunk.insert(at, entry);
            // The fence moves only when the entry went last.
            if at + 1 == chunk.len() {
                self.fences[c] = self.chunks[c][at].clone();
            }
            return true;
        }
        if at == CAP && last {
            // The right edge: the full chunk stays full.
            self.push_chunk(entry);
            return true;
        }
        let has_room = |i: usize| self.chunks.get(i).is_some_and(|o| o.len() < CAP);
        let (next_has_room, before_has_room) = (has_room(c + 1), c > 0 && has_room(c - 1));
        let chunk = &mut self.chunks[c];
        if next_has_room {
            // A full chunk passes its last entry on to a neighbour with
            // room rather than splitting: entries added nearly in order
            // (deadlines of one millisecond come in their names' order,
            // not their grants') keep the chunks behind the edge full.
            let moved = chunk.pop().expect("a full chunk");
            chunk.insert(at, entry);
            self.chunks[c + 1].insert(0, moved);
        } else if before_has_room {
            // Or its first to the one before (the entry itself, if it
            // goes first).
            if at == 0 {
                self.chunks[c - 1].push(entry);
            } else {
                let moved = chunk.remove(0);
                chunk.insert(at - 1, entry);
                self.chunks[c - 1].push(moved);
            }
            let before = &self.chunks[c - 1];
            self.fences[c - 1] = before.last().expect("not empty").clone();
        } else {
            // The last chunk is cut where the entry goes (it stays nearly
            // full), any other in halves.
            let cut = if last { at.max(CAP / 2) } else { CAP / 2 };
            let mut right = Vec::with_capacity(CAP);
            right.extend(chunk.drain(cut..));
            if at <= cut {
                chunk.insert(at, entry);
            } else {
                right.insert(at - cut, entry);
            }
            let right_last = right.last().expect("half a chunk").clone();
            self.chunks.insert(c + 1, right);
            self.fences.insert(c + 1, right_last);
        }
        self.fences[c] = self.chunks[c].last().expect("not empty").clone();
        true
    }

    fn push_chunk(&mut self, entry: T) {
        let mut chunk = Vec::with_capacity(CAP);
        self.fences.push_back(entry.clone());
        chunk.push(entry);
        self.chunks.push_back(chunk);
    }

    /// Removes `entry`; false if it was not there.
    pub(super) fn remove(&mut self, entry: &T) -> bool {
        let Some(c) = self.chunk_of(entry) else {
            return false;
        };
        let chunk = &mut self.chunks[c];
        let Ok(at) = chunk.binary_search(entry) else {
            return false;
        };
        chunk.remove(at);
        let was_last = at == chunk.len();
        self.settle(c, was_last);
        true
    }

    /// After chunk `c` shrank (by its last entry, if `last_removed`): its
    /// fence follows its last entry, an empty chunk goes, and one below a
    /// quarter full is merged into a neighbour that has room for it.
    fn settle(&mut self, c: usize, last_removed: bool) {
        let n = self.chunks[c].len();
        if n == 0 {
            self.chunks.remove(c);
            self.fences.remove(c);
            return;
        }
        if last_removed {
            self.fences[c] = self.chunks[c].last().expect("not empty").clone();
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
            self.fences[c - 1] = self.chunks[c - 1].last().expect("not empty").clone();
        }
    }

    /// Takes out every entry below `bound`, in order, in one piece: the
    /// chunks wholly below it are moved, and one is cut.
    pub(super) fn split_below(&mut self, bound: &T) -> Due<T> {
        let whole = self.fences.partition_point(|last| last < bound);
        let mut due: VecDeque<_> = self.chunks.drain(..whole).map(Vec::into_iter).collect();
        self.fences.drain(..whole);
        if let Some(first) = self.chunks.front_mut() {
            let at = first.partition_point(|e| e < bound);
            if at > 0 {
                due.push_back(first.drain(..at).collect::<Vec<_>>().into_iter());
                self.settle(0, false);
            }
        }
        Due::new(due)
    }

    /// Every entry, in order.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Every chunk is sorted, non-empty, at most `CAP` long, above the one
    /// before it, with its fence.
    #[cfg(test)]
    pub(super) fn check(&self) {
        assert_eq!(self.chunks.len(), self.fences.len());
        let mut before: Option<&T> = None;
        for (chunk, fence) in self.chunks.iter().zip(&self.fences) {
            assert!(!chunk.is_empty() && chunk.len() <= CAP, "chunk size");
            assert!(chunk.windows(2).all(|w| w[0] < w[1]), "sorted chunk");
            assert!(before.is_none_or(|b| b < &chunk[0]), "chunks in order");
            assert!(chunk.last() == Some(fence), "fence");
            before = chunk.last();
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
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16),
        Remove(u16),
        SplitBelow(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // In order (the right edge), then anywhere.
            (0u16..400).prop_map(Op::Insert),
            (0u16..400).prop_map(Op::Insert),
            (0u16..400).prop_map(Op::Remove),
            (0u16..400).prop_map(Op::SplitBelow),
        ]
    }

    proptest! {
        /// Every operation does what std's `BTreeSet` does, and the chunks
        /// keep their shape.
        #[test]
        fn sorted_chunks_behave_as_a_btree_set(
            front in proptest::collection::vec(0u16..400, 0..60),
            tail in proptest::collection::vec(0u16..400, 0..20),
            ops in proptest::collection::vec(op(), 0..300),
        ) {
            // Built from a sorted front and a tail, as a restart's are.
            let mut start = front;
            start.sort_unstable();
            start.extend(tail);
            let mut chunks = SortedChunks::<u16, 8>::from_unsorted(start.clone());
            let mut model: BTreeSet<u16> = start.into_iter().collect();
            chunks.check();
            for op in ops {
                match op {
                    Op::Insert(v) => prop_assert_eq!(chunks.insert(v), model.insert(v)),
                    Op::Remove(v) => prop_assert_eq!(chunks.remove(&v), model.remove(&v)),
                    Op::SplitBelow(v) => {
                        let later = model.split_off(&v);
                        let expected: Vec<u16> = std::mem::replace(&mut model, later).into_iter().collect();
                        let mut due = chunks.split_below(&v);
                        prop_assert_eq!(due.len(), expected.len());
                        prop_assert_eq!(due.iter().copied().collect::<Vec<_>>(), expected.clone());
                        let popped: Vec<u16> = std::iter::from_fn(|| due.pop_first()).collect();
                        prop_assert_eq!(popped, expected);
                    }
                }
                chunks.check();
                prop_assert_eq!(chunks.len(), model.len());
                prop_assert_eq!(chunks.first(), model.first());
                prop_assert!(chunks.iter().eq(model.iter()));
            }
        }
    }

    #[test]
    fn entries_added_in_order_fill_their_chunks() {
        let mut set = SortedChunks::<u32, 8>::default();
        for v in 0..80 {
            assert!(set.insert(v));
        }
        set.check();
        assert_eq!(set.chunks.len(), 10, "full chunks, none split in halves");
        assert!(set.chunks.iter().all(|c| c.len() == 8));

        // Nearly in order: each three reversed.
        let mut set = SortedChunks::<u32, 8>::default();
        for v in 0..81 {
            assert!(set.insert(v / 3 * 3 + 2 - v % 3));
        }
        set.check();
        let lens: Vec<usize> = set.chunks.iter().map(Vec::len).collect();
        assert!(
            lens[..lens.len() - 1].iter().all(|n| *n >= 7),
            "chunks nearly full: {lens:?}"
        );
    }

    #[test]
    fn a_chunk_emptied_below_a_quarter_joins_a_neighbour() {
        let mut set = SortedChunks::<u32, 8>::from_unsorted((0..24).collect());
        for v in (0..4).chain(8..15) {
            assert!(set.remove(&v));
        }
        set.check();
        assert_eq!(set.chunks.len(), 2, "the middle chunk's last entry merged");
        assert_eq!(set.chunks[0], [4, 5, 6, 7, 15]);

        let mut set = SortedChunks::<u32, 8>::from_unsorted((0..24).collect());
        for v in (16..20).chain(9..16) {
            assert!(set.remove(&v));
        }
        set.check();
        assert_eq!(set.chunks.len(), 2, "the middle chunk's first entry merged");
        assert_eq!(set.chunks[1], [8, 20, 21, 22, 23]);
    }
}
