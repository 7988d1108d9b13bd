//! The write-ahead log in front of the redb file.
//!
//! A commit is one record appended to a preallocated file and made
//! durable: the file never grows, so only data blocks are written, not the
//! file system's metadata. Where the file system allows it, the log is
//! written with `O_DIRECT | O_DSYNC`: an append rewrites the 4 KiB blocks
//! from the one holding the log's end, and is durable when the write
//! returns, without the page cache and a separate `fdatasync` (measured
//! on the reference machine: about 80 µs and 32 µs of CPU per append
//! against 95 µs and 45 µs). Elsewhere (tmpfs, some network file
//! systems) it is one `pwrite` and one `fdatasync`. (A redb commit writes about
//! seven pages and costs, on the reference machine, about 3.5 times the
//! CPU and the latency of this.) There are two such logs: commits go to the
//! *active* one; when it is full, the other (whose writes are all in redb
//! by then) is started again under a new generation and becomes the
//! active one, and the full one is folded into redb in the background
//! (see `redb_store/fold.rs`). At open, both are replayed, the older
//! generation first.
//!
//! Layout: a 64-byte header (magic, format, the store id the log belongs
//! to, the generation), then records `generation u64 | length u32 |
//! checksum u64 | payload`, the checksum being the first 8 bytes of
//! SHA-256 of the generation, length and payload. Reading stops at the
//! first record that does not check out (a torn tail, or the zeros or old
//! generation beyond the end), so a record is either wholly replayed or not
//! at all. Replaying a log over a redb file that already holds it changes
//! nothing: each key ends at its last write in the log either way.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write as _};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use baton_core::{
    AcquisitionDigest, Change, Epoch, FencingToken, Holder, HolderChange, LeaseRecord,
    NumberedChange, ResourceName, SessionRecord, Write,
};
use sha2::{Digest, Sha256};

use crate::{StoreError, StoreId};

/// The two logs' files: the first is the one every store had before there
/// were two.
const FILE_NAMES: [&str; 2] = ["baton.wal", "baton.wal2"];
const MAGIC: &[u8; 8] = b"BATONWAL";
const FORMAT: u32 = 1;
const HEADER_LEN_BYTES: u64 = 64;
const RECORD_HEADER_LEN_BYTES: usize = 20;
/// The preallocated size of each of the two logs: when one is full the
/// other takes the commits while it is folded into redb.
pub const LEN_BYTES_DEFAULT: u64 = 16 << 20;
/// Direct writes are whole, aligned blocks of this size (a multiple of
/// every logical block size in use).
const BLOCK_LEN_BYTES: usize = 4096;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// An open log, positioned after its last valid record.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    store_id: StoreId,
    generation: u64,
    /// Where the next record goes.
    end: u64,
    len_bytes: u64,
    /// Direct, synchronous writes, if the file system takes them.
    direct: Option<Direct>,
}

/// The log opened with `O_DIRECT | O_DSYNC`, and the block it ends in.
struct Direct {
    file: File,
    /// The bytes of the block holding the log's end, from the block's
    /// start up to the end (what the disk holds there).
    tail: Vec<u8>,
    /// Room for one aligned window of blocks (over-allocated by a block,
    /// so that an aligned window always fits).
    scratch: Vec<u8>,
}

impl Direct {
    /// Opens `path` for direct writes; `None` where the file system does
    /// not take them, or the log is not made of whole blocks.
    fn open(path: &Path, len_bytes: u64, tail: &[u8]) -> Option<Self> {
        if !len_bytes.is_multiple_of(BLOCK_LEN_BYTES as u64) {
            return None;
        }
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(path)
            .ok()?;
        Some(Self {
            file,
            tail: tail.to_vec(),
            scratch: Vec::new(),
        })
    }

    /// Writes `record` at `end` (the tail block's content before it, zeros
    /// after it up to the block boundary) and returns once it is durable.
    fn append(&mut self, end: u64, record: &[u8]) -> std::io::Result<()> {
        let start = end - self.tail.len() as u64;
        debug_assert!(start.is_multiple_of(BLOCK_LEN_BYTES as u64));
        let used = self.tail.len() + record.len();
        let len = used.next_multiple_of(BLOCK_LEN_BYTES);
        if self.scratch.len() < len + BLOCK_LEN_BYTES {
            self.scratch = vec![0u8; len + BLOCK_LEN_BYTES];
        }
        let offset = self.scratch.as_ptr().align_offset(BLOCK_LEN_BYTES);
        let window = &mut self.scratch[offset..offset + len];
        window[..self.tail.len()].copy_from_slice(&self.tail);
        window[self.tail.len()..used].copy_from_slice(record);
        window[used..].fill(0);
        self.file.write_all_at(window, start)?;
        let last_block = used / BLOCK_LEN_BYTES * BLOCK_LEN_BYTES;
        self.tail.clear();
        self.tail.extend_from_slice(&window[last_block..used]);
        Ok(())
    }
}

fn checksum(generation: u64, payload: &[u8]) -> u64 {
    let mut h = Sha256::new();
    h.update(generation.to_le_bytes());
    h.update((payload.len() as u32).to_le_bytes());
    h.update(payload);
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

impl Wal {
    /// The first log of `data_dir`.
    #[cfg(test)]
    pub(crate) fn path_in(data_dir: &Path) -> PathBuf {
        Self::path_of(data_dir, 0)
    }

    /// Log `slot` (0 or 1) of `data_dir`.
    pub(crate) fn path_of(data_dir: &Path, slot: usize) -> PathBuf {
        data_dir.join(FILE_NAMES[slot])
    }

    /// Opens log `slot` of `data_dir` and returns it with the writes of its
    /// valid records, in order. A log of another store is refused.
    pub(crate) fn open(
        data_dir: &Path,
        slot: usize,
        store_id: StoreId,
        len_bytes: u64,
    ) -> Result<(Self, Vec<Write>), StoreError> {
        let path = Self::path_of(data_dir, slot);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(&path))?;
        let corrupt = |what: &str| StoreError::Corrupt(format!("{}: {what}", path.display()));
        if bytes.len() < HEADER_LEN_BYTES as usize || &bytes[..8] != MAGIC {
            return Err(corrupt("not a Baton write-ahead log"));
        }
        let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if format != FORMAT {
            return Err(corrupt(&format!(
                "log format {format}, this build reads {FORMAT}"
            )));
        }
        let owner = StoreId(bytes[16..32].try_into().expect("16 bytes"));
        if owner != store_id {
            return Err(corrupt(&format!(
                "the log belongs to store {owner}, not to this directory's store {store_id}; \
                 it is not replayed (a restore that stopped half way leaves this: run it again)"
            )));
        }
        let generation = u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes"));
        let (writes, at) = replay(&bytes, HEADER_LEN_BYTES as usize, generation)
            .map_err(|e| corrupt(&e.to_string()))?;
        let len_bytes = (bytes.len() as u64).max(len_bytes);
        let tail_start = at / BLOCK_LEN_BYTES * BLOCK_LEN_BYTES;
        let direct = Direct::open(&path, len_bytes, &bytes[tail_start..at]);
        let wal = Self {
            file,
            path,
            store_id,
            generation,
            end: at as u64,
            len_bytes,
            direct,
        };
        Ok((wal, writes))
    }

    /// A new, empty log `slot` for `store_id` in place of any other, under
    /// `generation`: zero-filled to its full size and synced, directory
    /// included.
    pub(crate) fn create(
        data_dir: &Path,
        slot: usize,
        store_id: StoreId,
        len_bytes: u64,
        generation: u64,
    ) -> Result<Self, StoreError> {
        let path = Self::path_of(data_dir, slot);
        let tmp = data_dir.join(format!("{}.new", FILE_NAMES[slot]));
        {
            let mut file = File::create(&tmp).map_err(io(&tmp))?;
            let zeros = vec![0u8; 1 << 20];
            let mut left = len_bytes;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                file.write_all(&zeros[..n]).map_err(io(&tmp))?;
                left -= n as u64;
            }
            file.write_all_at(&header(store_id, generation), 0)
                .map_err(io(&tmp))?;
            file.sync_all().map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(io(data_dir))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        let direct = Direct::open(&path, len_bytes, &header(store_id, generation));
        Ok(Self {
            file,
            path,
            store_id,
            generation,
            end: HEADER_LEN_BYTES,
            len_bytes,
            direct,
        })
    }

    /// The generation its records carry: the higher of two logs is the
    /// newer.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether it holds no record.
    pub(crate) fn is_empty(&self) -> bool {
        self.end == HEADER_LEN_BYTES
    }

    /// Whether a record of `payload_len` bytes still fits.
    pub(crate) fn fits(&self, payload_len: usize) -> bool {
        self.end + (RECORD_HEADER_LEN_BYTES + payload_len) as u64 <= self.len_bytes
    }

    /// Whether appends are direct, synchronous writes.
    #[cfg(test)]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Appends one record and makes it durable (one direct synchronous
    /// write, or one write and one fdatasync).
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<(), StoreError> {
        debug_assert!(self.fits(payload.len()));
        let record = frame(self.generation, payload);
        self.write_durably(self.end, &record)?;
        self.end += record.len() as u64;
        Ok(())
    }

    /// Writes `bytes` at `at` and returns once they are durable: directly
    /// where the file system takes it (the tail block then holds what
    /// precedes `at` in its block), else through the page cache and
    /// `fdatasync`.
    fn write_durably(&mut self, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        if let Some(direct) = self.direct.as_mut() {
            match direct.append(at, bytes) {
                Ok(()) => return Ok(()),
                // The file system refused a direct write (nothing was
                // written): from here on, write through the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct = None,
                Err(e) => return Err(io(&self.path)(e)),
            }
        }
        self.file.write_all_at(bytes, at).map_err(io(&self.path))?;
        self.file.sync_data().map_err(io(&self.path))
    }

    /// Starts the log again, empty, under `generation` (above both logs'
    /// current ones; after its writes were folded into redb): every older
    /// record stops counting.
    pub(crate) fn restart(&mut self, generation: u64) -> Result<(), StoreError> {
        assert!(generation > self.generation, "generations only rise");
        // Nothing precedes the header in its block: a direct write of it
        // zeros the rest of the first block.
        if let Some(direct) = self.direct.as_mut() {
            direct.tail.clear();
        }
        self.write_durably(0, &header(self.store_id, generation))?;
        self.generation = generation;
        self.end = HEADER_LEN_BYTES;
        Ok(())
    }
}

fn header(store_id: StoreId, generation: u64) -> [u8; HEADER_LEN_BYTES as usize] {
    let mut h = [0u8; HEADER_LEN_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    h[16..32].copy_from_slice(&store_id.0);
    h[32..40].copy_from_slice(&generation.to_le_bytes());
    h
}

/// One record of `generation` holding `payload`, as it is written.
pub fn frame(generation: u64, payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(RECORD_HEADER_LEN_BYTES + payload.len());
    record.extend_from_slice(&generation.to_le_bytes());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&checksum(generation, payload).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// The writes of every whole, valid record of `generation` from `at` on,
/// in order, and where the first that is not one starts (a torn tail, the
/// zeros beyond the end, an older generation).
pub fn replay(
    bytes: &[u8],
    mut at: usize,
    generation: u64,
) -> Result<(Vec<Write>, usize), Undecodable> {
    let mut writes = Vec::new();
    while let Some(payload) = record_at(bytes, at, generation) {
        decode(payload, &mut writes)?;
        at += RECORD_HEADER_LEN_BYTES + payload.len();
    }
    Ok((writes, at))
}

/// The payload of the record at `at`, if a whole valid one of
/// `generation` is there.
fn record_at(bytes: &[u8], at: usize, generation: u64) -> Option<&[u8]> {
    let head = bytes.get(at..at + RECORD_HEADER_LEN_BYTES)?;
    let g = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    let sum = u64::from_le_bytes(head[12..20].try_into().expect("8 bytes"));
    if g != generation || len == 0 {
        return None;
    }
    let start = at + RECORD_HEADER_LEN_BYTES;
    let payload = bytes.get(start..start.checked_add(len)?)?;
    (checksum(generation, payload) == sum).then_some(payload)
}

mod codec;
mod pending;

use codec::decode;
pub use codec::Undecodable;
pub(crate) use codec::{decode_changes, encode, encode_change};
pub(crate) use pending::Pending;

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::AcquisitionId;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("baton-wal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn put(n: u64) -> Vec<Write> {
        vec![
            Write::PutLease {
                resource: ResourceName::parse(&format!("r{n}")).unwrap(),
                record: LeaseRecord {
                    acquisition_digest: AcquisitionId::from_bytes([n as u8; 16]).digest(),
                    token: FencingToken::new(Epoch::FIRST, n).unwrap(),
                    ttl_ms: 5_000,
                    session: n
                        .is_multiple_of(2)
                        .then(|| AcquisitionId::from_bytes([9; 16]).digest()),
                    holder: n
                        .is_multiple_of(3)
                        .then(|| baton_core::Holder::parse(&format!("job {n}")).unwrap()),
                    shape: baton_core::Shape::Exclusive,
                },
            },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: n,
            },
        ]
    }

    /// Opens `d`'s log, with direct writes only if `direct`.
    fn open_as(d: &Path, id: StoreId, direct: bool) -> (Wal, Vec<Write>) {
        let (mut wal, writes) = Wal::open(d, 0, id, 1 << 16).unwrap();
        if !direct {
            wal.direct = None;
        }
        (wal, writes)
    }

    #[test]
    fn records_replay_in_order_and_a_torn_tail_is_dropped() {
        for direct in [true, false] {
            torn_tail(direct);
        }
    }

    #[test]
    fn direct_and_buffered_appends_across_blocks_replay_the_same() {
        // Records of many sizes, some larger than a block, so appends start
        // and end anywhere in a block; the log is reopened now and then.
        let mut expected = Vec::new();
        let mut files = Vec::new();
        for direct in [true, false] {
            let d = dir(if direct {
                "blocks-direct"
            } else {
                "blocks-buffered"
            });
            let id = StoreId([5; 16]);
            drop(Wal::create(&d, 0, id, 1 << 16, 1).unwrap());
            let (mut wal, _) = open_as(&d, id, direct);
            assert_eq!(wal.is_direct(), direct);
            let mut all = Vec::new();
            let mut biggest = 0;
            for n in 1..=40u64 {
                let count = if n % 13 == 0 { 70 } else { n * 7 % 23 + 1 };
                let writes: Vec<Write> = (0..count).flat_map(|k| put(n * 100 + k)).collect();
                let payload = encode(&writes);
                biggest = biggest.max(payload.len());
                wal.append(&payload).unwrap();
                all.extend(writes);
                if n % 9 == 0 {
                    drop(wal);
                    let (again, replayed) = open_as(&d, id, direct);
                    assert_eq!(replayed, all, "direct={direct}, after {n} appends");
                    wal = again;
                }
            }
            assert!(biggest > BLOCK_LEN_BYTES, "a record spans blocks");
            let end = wal.end as usize;
            drop(wal);
            let (_, replayed) = Wal::open(&d, 0, id, 1 << 16).unwrap();
            assert_eq!(replayed, all);
            expected.push(all);
            files.push(std::fs::read(Wal::path_in(&d)).unwrap()[..end].to_vec());
            std::fs::remove_dir_all(&d).unwrap();
        }
        assert_eq!(expected[0], expected[1]);
        assert_eq!(files[0], files[1], "both ways write the same log bytes");
    }

    fn torn_tail(direct: bool) {
        let d = dir(if direct {
            "torn-direct"
        } else {
            "torn-buffered"
        });
        let id = StoreId([3; 16]);
        drop(Wal::create(&d, 0, id, 1 << 16, 1).unwrap());
        let (mut wal, _) = open_as(&d, id, direct);
        for n in 1..=3 {
            wal.append(&encode(&put(n))).unwrap();
        }
        let end = wal.end;
        drop(wal);
        let (_, writes) = Wal::open(&d, 0, id, 1 << 16).unwrap();
        assert_eq!(writes, [put(1), put(2), put(3)].concat());
        // Tear the last record: only the first two come back.
        let f = OpenOptions::new()
            .write(true)
            .open(Wal::path_in(&d))
            .unwrap();
        f.write_all_at(&[0xff], end - 3).unwrap();
        let (mut wal, writes) = open_as(&d, id, direct);
        assert_eq!(writes, [put(1), put(2)].concat());
        // A restart forgets every record; appends after it replay alone.
        wal.restart(2).unwrap();
        wal.append(&encode(&put(7))).unwrap();
        drop(wal);
        let (_, writes) = Wal::open(&d, 0, id, 1 << 16).unwrap();
        assert_eq!(writes, put(7));
        // Another store's log is refused, not replayed.
        assert!(matches!(
            Wal::open(&d, 0, StoreId([4; 16]), 1 << 16),
            Err(StoreError::Corrupt(_))
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
