//! The L0 memtable: a lock-free ordered map from `(key, seq)` to a value
//! pointer. Values themselves stay in the value log's page buffers (or on the
//! device once written), so the memtable holds keys and pointers only.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;

use crate::types::{entry_order, Entry, Kind, SeqNo, ValuePtr};

/// Per-entry DRAM overhead charged on top of the key bytes.
const ENTRY_OVERHEAD: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
struct IKey(Bytes, SeqNo);

impl Ord for IKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        entry_order(&self.0, self.1, &o.0, o.1)
    }
}
impl PartialOrd for IKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// An L0 memtable.
#[derive(Default)]
pub struct Memtable {
    map: SkipMap<IKey, (Kind, ValuePtr)>,
    bytes: AtomicUsize,
    log_bytes: AtomicU64,
}

impl Memtable {
    /// An empty memtable.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts one version. Equal `(key, seq)` pairs (a GC relocation of a
    /// version already here) replace the older pointer.
    pub fn insert(&self, key: Bytes, seq: SeqNo, kind: Kind, ptr: ValuePtr) {
        self.bytes
            .fetch_add(key.len() + ENTRY_OVERHEAD, Ordering::Relaxed);
        self.log_bytes
            .fetch_add(u64::from(ptr.len), Ordering::Relaxed);
        self.map.insert(IKey(key, seq), (kind, ptr));
    }

    /// The newest version of `key` with sequence at most `seq`.
    pub fn get(&self, key: &[u8], seq: SeqNo) -> Option<Entry> {
        let start = IKey(Bytes::copy_from_slice(key), seq);
        let e = self.map.range(start..).next()?;
        (e.key().0.as_ref() == key).then(|| Entry {
            key: e.key().0.clone(),
            seq: e.key().1,
            kind: e.value().0,
            ptr: e.value().1,
        })
    }

    /// All entries ordered at or after `(from, SeqNo::MAX)`, in order.
    pub fn iter_from(&self, from: &[u8]) -> impl Iterator<Item = Entry> + '_ {
        let start = IKey(Bytes::copy_from_slice(from), SeqNo::MAX);
        self.map
            .range((Bound::Included(start), Bound::Unbounded))
            .map(|e| Entry {
                key: e.key().0.clone(),
                seq: e.key().1,
                kind: e.value().0,
                ptr: e.value().1,
            })
    }

    /// The largest key held.
    pub fn last_key(&self) -> Option<Bytes> {
        self.map.back().map(|e| e.key().0.clone())
    }

    /// Charged DRAM (keys plus per-entry overhead).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Value-log bytes of the records inserted (bounds replay after a crash).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes.load(Ordering::Relaxed)
    }

    /// Number of versions held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
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
        m.insert(Bytes::from_static(b"a"), 1, Kind::Put, p(1));
        m.insert(Bytes::from_static(b"a"), 5, Kind::Delete, p(5));
        m.insert(Bytes::from_static(b"b"), 3, Kind::Put, p(3));
        assert_eq!(m.get(b"a", 10).map(|e| e.kind), Some(Kind::Delete));
        assert_eq!(m.get(b"a", 4).map(|e| e.ptr.offset), Some(1));
        assert!(m.get(b"a", 0).is_none());
        assert!(m.get(b"c", 10).is_none());
        let keys: Vec<_> = m.iter_from(b"a").map(|e| (e.key, e.seq)).collect();
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[0].1, 5);
    }
}
