//! The L0 memtable: the versions written since the last flush, as
//! `(key, seq)` to a value pointer. Values themselves stay in the value
//! log's page buffers (or on the device once written), so the memtable
//! holds keys and pointers only. Point lookups go through a hash index of
//! each key's newest version ([`crate::memindex`]); sorted runs
//! ([`crate::memruns`]) serve ordered scans, flushes and reads of older
//! versions.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use crate::memindex::{Known, MemIndex, SpareTables};
use crate::memruns::{SortedRuns, SpareRuns};
use crate::tag::Tagging;
use crate::types::{Entry, Kind, SeqNo, ValuePtr};

/// Per-entry DRAM overhead charged on top of the key bytes.
const ENTRY_OVERHEAD: usize = 64;
/// DRAM charged for each key's slot in the point index (an [`Entry`] in a
/// hash table at its usual fill).
const INDEX_OVERHEAD: usize = 96;

/// Bytes of the chunks a memtable copies its keys into.
const KEY_CHUNK: usize = 64 << 10;
/// Keys longer than this get an allocation of their own.
const KEY_ALONE: usize = KEY_CHUNK / 16;

/// Where a memtable keeps its keys for the point index (and the sorted
/// runs' keys longer than their items hold): copied back to back into
/// shared chunks, so that a key costs no allocation of its own (a key
/// copied into a `Bytes` of its own allocated twice: once for the copy,
/// once more when it was first shared). A chunk is freed when the memtable
/// and every entry handed out from it are gone.
#[derive(Default)]
struct KeyArena {
    chunk: Mutex<BytesMut>,
}

impl KeyArena {
    fn copy(&self, key: &[u8]) -> Bytes {
        if key.len() > KEY_ALONE {
            return Bytes::copy_from_slice(key);
        }
        let mut chunk = self.chunk.lock();
        if chunk.capacity() - chunk.len() < key.len() {
            *chunk = BytesMut::with_capacity(KEY_CHUNK);
        }
        chunk.extend_from_slice(key);
        chunk.split().freeze()
    }
}

/// Memory a dropped memtable leaves to the next one: its point index's
/// tables and its sorted runs' vectors, emptied. A memtable's structures
/// grow to tens of megabytes; taken fresh from the allocator each time,
/// their pages were faulted in (and zeroed by the kernel) again for every
/// memtable. Shared by the memtables of one database, holding at most one
/// memtable's worth.
#[derive(Default)]
struct Leftovers {
    index: Mutex<Option<SpareTables>>,
    runs: Mutex<SpareRuns>,
}

/// An L0 memtable.
#[derive(Default)]
pub struct Memtable {
    runs: SortedRuns,
    index: MemIndex,
    keys: KeyArena,
    bytes: AtomicUsize,
    log_bytes: AtomicU64,
    /// Versions inserted by GC relocation (see [`Self::writes`]).
    relocated: AtomicUsize,
    leftovers: Arc<Leftovers>,
}

impl Drop for Memtable {
    fn drop(&mut self) {
        let index = std::mem::take(&mut self.index).into_spare();
        *self.leftovers.index.lock() = Some(index);
        *self.leftovers.runs.lock() = std::mem::take(&mut self.runs).into_spares();
    }
}

impl Memtable {
    /// An empty memtable.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty memtable with its point index sized for as many keys as
    /// `full` holds (the next memtable usually fills like the last), in
    /// the memory the memtable before `full` left when it was dropped.
    pub fn sized_like(full: &Memtable) -> Self {
        let leftovers = full.leftovers.clone();
        let index = leftovers.index.lock().take();
        let runs = std::mem::take(&mut *leftovers.runs.lock());
        Self {
            runs: SortedRuns::with_spares(runs),
            index: MemIndex::reusing(index, full.index.len()),
            keys: KeyArena::default(),
            bytes: AtomicUsize::new(0),
            log_bytes: AtomicU64::new(0),
            relocated: AtomicUsize::new(0),
            leftovers,
        }
    }

    /// Inserts one version with its value's tag. Equal `(key, seq)` pairs (a
    /// GC relocation of a version already here) replace the older pointer.
    /// Called before `seq` is published to readers (see [`crate::memindex`]).
    pub fn insert(&self, key: &[u8], seq: SeqNo, kind: Kind, ptr: ValuePtr, tag: Tagging) {
        let entry = Entry {
            key: self.keys.copy(key),
            seq,
            kind,
            ptr,
            tag,
        };
        let key_len = entry.key.len();
        self.runs.insert(&entry);
        let new_key = self.index.note(entry);
        let charge = key_len + ENTRY_OVERHEAD + if new_key { INDEX_OVERHEAD } else { 0 };
        self.bytes.fetch_add(charge, Ordering::Relaxed);
        self.log_bytes
            .fetch_add(u64::from(ptr.len), Ordering::Relaxed);
    }

    /// The newest version of `key` with sequence at most `seq`.
    pub fn get(&self, key: &[u8], seq: SeqNo) -> Option<Entry> {
        match self.index.known(key, seq) {
            Known::Absent => None,
            Known::Newest(e) => Some(e),
            Known::Later => self.search(key, seq),
        }
    }

    /// [`Self::get`] by searching the sorted runs.
    fn search(&self, key: &[u8], seq: SeqNo) -> Option<Entry> {
        self.runs.search(key, seq)
    }

    /// All entries ordered at or after `(from, SeqNo::MAX)`, in order, as
    /// of the call (later inserts are not seen).
    pub fn iter_from(&self, from: &[u8]) -> impl Iterator<Item = Entry> + '_ {
        self.runs.snapshot().iter_from(from)
    }

    /// Sorted runs its versions are in (the unsorted tail not counted).
    pub(crate) fn runs(&self) -> usize {
        self.runs.runs()
    }

    /// Whether scans found its versions in many sorted runs (see
    /// [`crate::memruns`]).
    pub(crate) fn wants_tidying(&self) -> bool {
        self.runs.wants_tidying()
    }

    /// Merges its sorted runs of similar length, off the writers' path,
    /// while `worth_it` holds; returns how many merges it made.
    pub(crate) fn tidy_runs(&self, worth_it: impl Fn() -> bool) -> usize {
        self.runs.tidy(worth_it)
    }

    /// Charged DRAM (keys plus per-entry overhead).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Value-log bytes of the records inserted (bounds replay after a crash).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes.load(Ordering::Relaxed)
    }

    /// Number of versions inserted (a GC relocation of a version held
    /// counts again).
    pub fn len(&self) -> usize {
        self.runs.inserted()
    }

    /// True if nothing was inserted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts the version just inserted as a GC relocation: the same
    /// version at a new place, which hides nothing a merge could release.
    pub fn note_relocated(&self) {
        self.relocated.fetch_add(1, Ordering::Relaxed);
    }

    /// Versions inserted that were not GC relocations: writes and deletes,
    /// whose merge with the levels below may release the values they hide.
    /// Replayed relocations count as writes (replay does not tell them
    /// apart), which only errs toward merging.
    pub fn writes(&self) -> usize {
        self.len()
            .saturating_sub(self.relocated.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_visible_version_wins() {
        let m = Memtable::new();
        let p = |o| ValuePtr {
            offset: o,
            ..Default::default()
        };
        m.insert(b"a", 1, Kind::Put, p(1), Tagging::Untagged);
        m.insert(b"a", 5, Kind::Delete, p(5), Tagging::Unknown);
        m.insert(b"b", 3, Kind::Put, p(3), Tagging::Tagged([7; 9]));
        assert_eq!(m.get(b"a", 10).map(|e| e.kind), Some(Kind::Delete));
        assert_eq!(m.get(b"a", 4).map(|e| e.ptr.offset), Some(1));
        assert!(m.get(b"a", 0).is_none());
        assert!(m.get(b"c", 10).is_none());
        assert_eq!(
            m.get(b"b", 10).map(|e| e.tag),
            Some(Tagging::Tagged([7; 9]))
        );
        let keys: Vec<_> = m.iter_from(b"a").map(|e| (e.key, e.seq)).collect();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[0].1, 5);
    }

    /// A memtable sized like a full one reuses the memory of the memtable
    /// dropped before it: index tables with the room already there, run
    /// vectors for its merges; and none of the dropped versions.
    #[test]
    fn a_dropped_memtable_leaves_its_memory_to_the_next() {
        let p = |o| ValuePtr {
            offset: o,
            ..Default::default()
        };
        let first = Memtable::new();
        for i in 0..20_000u32 {
            first.insert(
                &i.to_be_bytes(),
                u64::from(i) + 1,
                Kind::Put,
                p(i),
                Tagging::Untagged,
            );
        }
        let room = first.index.capacity();
        let second = Memtable::sized_like(&first);
        assert_eq!(second.runs.spares(), 0, "nothing was dropped yet");
        drop(first);
        second.insert(b"x", 1, Kind::Put, p(1), Tagging::Untagged);
        let third = Memtable::sized_like(&second);
        assert!(third.index.capacity() >= room, "the tables' room is kept");
        assert!(third.runs.spares() > 0, "the runs' vectors are kept");
        assert!(third.get(&7u32.to_be_bytes(), u64::MAX).is_none());
        assert!(third.iter_from(b"").next().is_none());
        for i in 0..20_000u32 {
            third.insert(&i.to_be_bytes(), 9, Kind::Put, p(i), Tagging::Untagged);
        }
        assert_eq!(
            third.get(&7u32.to_be_bytes(), 9).map(|e| e.ptr.offset),
            Some(7)
        );
        assert_eq!(third.iter_from(b"").count(), 20_000);
    }

    /// The contract readers rely on (see `memindex.rs`): a reader at a
    /// published sequence number finds, for every key, exactly the newest
    /// version at or below it, while a writer goes on inserting newer ones
    /// (which the index holds before the runs' search must answer).
    #[test]
    fn readers_at_a_published_seq_see_every_version_up_to_it() {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        const KEYS: u64 = 2_000;
        const LAST: u64 = 40_000;
        let m = Arc::new(Memtable::new());
        let published = Arc::new(AtomicU64::new(0));
        let key = |i: u64| format!("key{i:05}").into_bytes();
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (m, published) = (m.clone(), published.clone());
                std::thread::spawn(move || {
                    let mut checked = 0u64;
                    let mut i = r;
                    loop {
                        let seen = published.load(Ordering::Acquire);
                        i = (i * 7 + 13) % KEYS;
                        // Versions of key i have seqs i+1, i+1+KEYS, ...
                        let want = (seen > i).then(|| i + 1 + (seen - i - 1) / KEYS * KEYS);
                        let got = m.get(&key(i), seen).map(|e| e.seq);
                        assert_eq!(got, want, "key {i} at seq {seen}");
                        checked += 1;
                        if seen == LAST {
                            return checked;
                        }
                    }
                })
            })
            .collect();
        for seq in 1..=LAST {
            let ptr = ValuePtr {
                offset: seq as u32,
                ..Default::default()
            };
            m.insert(
                &key((seq - 1) % KEYS),
                seq,
                Kind::Put,
                ptr,
                Tagging::Unknown,
            );
            published.store(seq, Ordering::Release);
        }
        for r in readers {
            assert!(r.join().expect("reader") > 0);
        }
    }

    proptest::proptest! {
        /// The point index answers every lookup exactly as the sorted runs'
        /// search does: random versions of a few keys, inserted in any
        /// order, some twice with a new pointer (GC relocations), read at
        /// every sequence number.
        #[test]
        fn index_answers_like_the_runs(
            ops in proptest::collection::vec((0u8..6, 1u64..40, proptest::bool::ANY, 0u32..1000), 1..80),
        ) {
            let m = Memtable::new();
            for &(k, seq, delete, offset) in &ops {
                let kind = if delete { Kind::Delete } else { Kind::Put };
                let ptr = ValuePtr { offset, ..Default::default() };
                m.insert(&[b'k', k], seq, kind, ptr, Tagging::Unknown);
            }
            for k in 0u8..7 {
                for seq in 0u64..42 {
                    let key = [b'k', k];
                    proptest::prop_assert_eq!(m.get(&key, seq), m.search(&key, seq));
                }
            }
        }
    }
}
