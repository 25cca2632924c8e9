//! A memtable's point index: the newest version of every key the memtable
//! holds, found by hashing the key instead of searching the sorted runs.
//!
//! A point lookup in a skiplist of a million entries (the memtable's
//! ordered structure when the index was added) visited some forty nodes,
//! most of them a cache miss; on a node serving GETs of recently written
//! keys that search was a tenth of the CPU time per GET. The index answers
//! with one or two misses, and answers "not in this memtable" just
//! as fast (the common case for a read of older data).
//!
//! Contract (what [`crate::memtable::Memtable::get`] relies on):
//! - [`MemIndex::note`] is called for every version inserted into the
//!   memtable, after the insert into its sorted runs and before the
//!   version's sequence number is published to readers (the writer's
//!   callback does both).
//! - The index then holds, for every key, the version with the highest
//!   sequence number noted; of equal ones, the last noted (a GC relocation
//!   replaces the pointer of the same version, as the sorted runs do).
//! - A reader at sequence number `seq` that finds no key in the index knows
//!   that no version of it at or below `seq` is in the memtable; one that
//!   finds a version at or below `seq` has the newest visible one; one that
//!   finds a newer version (written after its snapshot) must search the
//!   sorted runs for an older one.

use hashbrown::hash_table::Entry as Slot;
use hashbrown::HashTable;
use parking_lot::RwLock;
use xxhash_rust::xxh3::xxh3_64;

use crate::types::{Entry, SeqNo};

/// Independent tables, so that writers and readers of different keys do
/// not meet on one lock.
const SHARDS: usize = 16;

/// What the index knows of a key at a sequence number (see the module doc).
#[derive(Debug)]
pub enum Known {
    /// No version of the key is in the memtable.
    Absent,
    /// The newest version at or below the sequence number asked.
    Newest(Entry),
    /// The newest version is later than the sequence number asked: the
    /// memtable's sorted runs must be searched.
    Later,
}

/// The point index of one memtable.
pub struct MemIndex {
    shards: Box<[RwLock<HashTable<Entry>>]>,
}

impl Default for MemIndex {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

/// The shard of a key's hash. Bits from the middle of the hash: the table
/// itself uses the low bits for the bucket and the top seven as a tag, and
/// a shard's keys must not all agree on either.
fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

/// The tables of an emptied index, kept for another one
/// ([`MemIndex::into_spare`]).
pub struct SpareTables(Box<[RwLock<HashTable<Entry>>]>);

impl MemIndex {
    /// An empty index with room for about `keys` keys, so that a memtable
    /// that fills like the one before it never regrows (and rehashes) its
    /// tables.
    pub fn with_capacity(keys: usize) -> Self {
        Self::reusing(None, keys)
    }

    /// [`Self::with_capacity`] in the memory of `spare` when given: tables
    /// that already have the room keep their pages, which fresh tables
    /// would fault in one by one as keys land in them (on a sequential
    /// write of 4 KiB blocks, 6 % of a node's CPU).
    pub fn reusing(spare: Option<SpareTables>, keys: usize) -> Self {
        let per_shard = keys.div_ceil(SHARDS);
        let shards = match spare {
            Some(SpareTables(shards)) => {
                for shard in shards.iter() {
                    let mut table = shard.write();
                    debug_assert!(table.is_empty(), "a spare table holds keys");
                    table.reserve(per_shard, |e| xxh3_64(&e.key));
                }
                shards
            }
            None => (0..SHARDS)
                .map(|_| RwLock::new(HashTable::with_capacity(per_shard)))
                .collect(),
        };
        Self { shards }
    }

    /// Drops every entry, keeping the tables' memory for another index.
    pub fn into_spare(self) -> SpareTables {
        for shard in self.shards.iter() {
            shard.write().clear();
        }
        SpareTables(self.shards)
    }

    /// Keys the tables have room for without growing.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.read().capacity()).sum()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Records a version inserted into the memtable. Returns true if the key
    /// is new to the index (its DRAM is then charged by the caller).
    pub fn note(&self, e: Entry) -> bool {
        let hash = xxh3_64(&e.key);
        let mut table = self.shards[shard_of(hash)].write();
        match table.entry(hash, |x| x.key == e.key, |x| xxh3_64(&x.key)) {
            Slot::Occupied(mut slot) => {
                if e.seq >= slot.get().seq {
                    *slot.get_mut() = e;
                }
                false
            }
            Slot::Vacant(slot) => {
                slot.insert(e);
                true
            }
        }
    }

    /// What the index knows of `key` at sequence number `seq`.
    pub fn known(&self, key: &[u8], seq: SeqNo) -> Known {
        let hash = xxh3_64(key);
        let table = self.shards[shard_of(hash)].read();
        match table.find(hash, |x| x.key.as_ref() == key) {
            None => Known::Absent,
            Some(e) if e.seq <= seq => Known::Newest(e.clone()),
            Some(_) => Known::Later,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::put_at;

    fn offset(k: Known) -> Option<u32> {
        match k {
            Known::Newest(e) => Some(e.ptr.offset),
            _ => None,
        }
    }

    #[test]
    fn newest_version_answers_and_later_ones_defer_to_the_runs() {
        let ix = MemIndex::default();
        assert!(ix.note(put_at(b"a", 5, 50)));
        assert!(
            !ix.note(put_at(b"a", 3, 30)),
            "an older version is not news"
        );
        assert_eq!(offset(ix.known(b"a", 9)), Some(50));
        assert_eq!(offset(ix.known(b"a", 5)), Some(50));
        assert!(matches!(ix.known(b"a", 4), Known::Later));
        assert!(matches!(ix.known(b"b", 9), Known::Absent));
        // A relocation of the same version replaces its pointer.
        ix.note(put_at(b"a", 5, 51));
        assert_eq!(offset(ix.known(b"a", 5)), Some(51));
    }
}
