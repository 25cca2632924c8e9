//! The L0 memtable: a lock-free ordered map from `(key, seq)` to a value
//! pointer. Values themselves stay in the value log's page buffers (or on the
//! device once written), so the memtable holds keys and pointers only.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;

use crate::tag::Tagging;
#[cfg(doc)]
use crate::types::entry_order;
use crate::types::{Entry, Kind, SeqNo, ValuePtr};

/// Per-entry DRAM overhead charged on top of the key bytes.
const ENTRY_OVERHEAD: usize = 64;

/// Bytes of a key kept inline in its skiplist entry as [`KeyHead`]. Keys
/// often share a long prefix (a table or volume name, then a number), so
/// the head covers 32 bytes: the adapters' chunk and metadata keys and the
/// usual `user1234…` keys fit whole, and a search then never leaves the
/// node it is on to compare key bytes.
const HEAD_LEN: usize = 32;

/// A key's first [`HEAD_LEN`] bytes, zero-padded, as big-endian words:
/// comparing heads orders keys like comparing their first 32 bytes.
type KeyHead = [u64; HEAD_LEN / 8];

fn head_of(key: &[u8]) -> KeyHead {
    let mut b = [0u8; HEAD_LEN];
    let n = key.len().min(HEAD_LEN);
    b[..n].copy_from_slice(&key[..n]);
    let mut head = [0u64; HEAD_LEN / 8];
    for (word, bytes) in head.iter_mut().zip(b.chunks_exact(8)) {
        *word = u64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
    }
    head
}

/// A memtable entry's key: `(user key, seq)` ordered by [`entry_order`].
///
/// The key's head is kept beside the key's `Bytes`, so a skiplist search
/// compares two integers on the node it already loaded and reads the key's
/// heap bytes only when the heads tie. Without it every visited node cost a
/// second cache miss, and inserts were a quarter of a node's CPU time.
///
/// Equal heads mean the keys agree on their first 32 bytes, except that a
/// shorter key is zero-padded. If either key is at most 32 bytes long, the
/// shorter key is then a prefix of the longer (or they are equal), so the
/// lengths decide; otherwise the tails decide.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IKey {
    head: KeyHead,
    key: Bytes,
    seq: SeqNo,
}

impl IKey {
    fn new(key: Bytes, seq: SeqNo) -> Self {
        Self {
            head: head_of(&key),
            key,
            seq,
        }
    }
}

impl Ord for IKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        let by_key = self.head.cmp(&o.head).then_with(|| {
            let (a, b) = (&self.key, &o.key);
            if a.len().min(b.len()) <= HEAD_LEN {
                a.len().cmp(&b.len())
            } else {
                a[HEAD_LEN..].cmp(&b[HEAD_LEN..])
            }
        });
        by_key.then(o.seq.cmp(&self.seq))
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
    map: SkipMap<IKey, (Kind, ValuePtr, Tagging)>,
    bytes: AtomicUsize,
    log_bytes: AtomicU64,
}

impl Memtable {
    /// An empty memtable.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts one version with its value's tag. Equal `(key, seq)` pairs (a
    /// GC relocation of a version already here) replace the older pointer.
    pub fn insert(&self, key: Bytes, seq: SeqNo, kind: Kind, ptr: ValuePtr, tag: Tagging) {
        self.bytes
            .fetch_add(key.len() + ENTRY_OVERHEAD, Ordering::Relaxed);
        self.log_bytes
            .fetch_add(u64::from(ptr.len), Ordering::Relaxed);
        self.map.insert(IKey::new(key, seq), (kind, ptr, tag));
    }

    /// The newest version of `key` with sequence at most `seq`.
    pub fn get(&self, key: &[u8], seq: SeqNo) -> Option<Entry> {
        let start = IKey::new(Bytes::copy_from_slice(key), seq);
        let e = self.map.range(start..).next()?;
        (e.key().key.as_ref() == key).then(|| Entry {
            key: e.key().key.clone(),
            seq: e.key().seq,
            kind: e.value().0,
            ptr: e.value().1,
            tag: e.value().2,
        })
    }

    /// All entries ordered at or after `(from, SeqNo::MAX)`, in order.
    pub fn iter_from(&self, from: &[u8]) -> impl Iterator<Item = Entry> + '_ {
        let start = IKey::new(Bytes::copy_from_slice(from), SeqNo::MAX);
        self.map
            .range((Bound::Included(start), Bound::Unbounded))
            .map(|e| Entry {
                key: e.key().key.clone(),
                seq: e.key().seq,
                kind: e.value().0,
                ptr: e.value().1,
                tag: e.value().2,
            })
    }

    /// The largest key held.
    pub fn last_key(&self) -> Option<Bytes> {
        self.map.back().map(|e| e.key().key.clone())
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
    use crate::types::entry_order;
    use proptest::prelude::Just;

    #[test]
    fn newest_visible_version_wins() {
        let m = Memtable::new();
        let p = |o| ValuePtr {
            offset: o,
            ..Default::default()
        };
        m.insert(
            Bytes::from_static(b"a"),
            1,
            Kind::Put,
            p(1),
            Tagging::Untagged,
        );
        m.insert(
            Bytes::from_static(b"a"),
            5,
            Kind::Delete,
            p(5),
            Tagging::Unknown,
        );
        m.insert(
            Bytes::from_static(b"b"),
            3,
            Kind::Put,
            p(3),
            Tagging::Tagged([7; 9]),
        );
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

    proptest::proptest! {
        /// The head shortcut orders entries exactly as `entry_order` does:
        /// keys around the 32-byte head, prefixes of each other, with
        /// zero bytes (which pad short heads) and equal heads.
        #[test]
        fn key_order_is_entry_order(
            a in proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..40),
            b_tail in proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..40),
            cut in 0usize..40,
            sa in 0u64..3,
            sb in 0u64..3,
        ) {
            // b shares a prefix of a (often its whole head), then differs.
            let mut b = a[..cut.min(a.len())].to_vec();
            b.extend_from_slice(&b_tail);
            let (ka, kb) = (IKey::new(Bytes::from(a.clone()), sa), IKey::new(Bytes::from(b.clone()), sb));
            proptest::prop_assert_eq!(ka.cmp(&kb), entry_order(&a, sa, &b, sb));
            proptest::prop_assert_eq!(kb.cmp(&ka), entry_order(&b, sb, &a, sa));
        }
    }
}
