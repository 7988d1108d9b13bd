//! A [`SortedChunks`] built from entries as they come (a restart's).

use super::{SortedChunks, CHUNK_LEN};

/// Builds a [`SortedChunks`] from entries as they come, without holding
/// them all beside it (a restart's ten million names and deadlines).
///
/// A restart's names come in order and its deadlines nearly so (in name
/// order, each no earlier than the one before, but for the few written
/// since the log was last folded): an entry above every one before it is
/// put straight into a full chunk, any other set aside, and those are put
/// in at the end: one at a time when they are few (fewer than one for 16
/// chunks: each may split a chunk, which moves the list of chunks), else
/// sorted and merged, the chunks taken apart one at a time. (Sorting all
/// of them in place fell back to a quicksort of ten million names, 0.4 s
/// of a restart; collecting them first held two 160 MB vectors that the
/// allocator kept after the restart.)
#[derive(Debug)]
pub(in crate::table) struct Builder<K, V, const CAP: usize = CHUNK_LEN> {
    map: SortedChunks<K, V, CAP>,
    /// The chunk being filled, above every full one.
    chunk: Vec<(K, V)>,
    /// The entries that came at or below one before them.
    rest: Vec<(K, V)>,
}

impl<K, V, const CAP: usize> Default for Builder<K, V, CAP> {
    fn default() -> Self {
        Self {
            map: SortedChunks::default(),
            chunk: Vec::new(),
            rest: Vec::new(),
        }
    }
}

impl<K: Ord + Clone, V, const CAP: usize> Builder<K, V, CAP> {
    /// Adds `entry` (a key given twice keeps its first entry).
    pub(in crate::table) fn push(&mut self, entry: (K, V)) {
        let last = self.chunk.last().map(|(k, _)| k).or(self.map.fences.back());
        if last.is_some_and(|last| *last >= entry.0) {
            self.rest.push(entry);
            return;
        }
        if self.chunk.capacity() == 0 {
            self.chunk.reserve_exact(CAP);
        }
        self.chunk.push(entry);
        if self.chunk.len() == CAP {
            self.map.push_last_chunk(std::mem::take(&mut self.chunk));
        }
    }

    /// The map of every entry pushed.
    pub(in crate::table) fn finish(mut self) -> SortedChunks<K, V, CAP> {
        if !self.chunk.is_empty() {
            self.map.push_last_chunk(std::mem::take(&mut self.chunk));
        }
        if self.rest.len() <= self.map.chunks.len() / 16 {
            // A few (a restart's deadlines written since the last fold):
            // each put in, a chunk split at most, rather than every entry
            // moved. A repeated key's later entry changes nothing.
            for (key, value) in self.rest {
                self.map.insert(key, value);
            }
            return self.map;
        }
        self.rest.sort_by(|a, b| a.0.cmp(&b.0));
        let mut front = (self.map.chunks.into_iter().flatten()).peekable();
        let mut rest = self.rest.into_iter().peekable();
        let mut merged = Self::default();
        loop {
            // An entry set aside goes first only when below the chunks',
            // so a repeated key's entry set aside comes after its equal
            // and is dropped.
            let next = match (front.peek(), rest.peek()) {
                (Some(f), Some(r)) if r.0 < f.0 => rest.next(),
                (Some(_), _) => front.next(),
                (None, _) => rest.next(),
            };
            let Some(entry) = next else {
                break;
            };
            merged.push(entry);
        }
        // What the merge set aside are repeated keys (the sort is stable:
        // a key's first entry is kept).
        merged.rest.clear();
        merged.finish()
    }
}
