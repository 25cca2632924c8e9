//! What maintenance does when free segments run short
//! ([`DbInner::space_low`]): which merges of the flushed runs, and which
//! flushes before the memtable is full, pay for the keytable bytes they
//! write with the value bytes they may release; when they do not, GC's
//! deep pass (`deeppass.rs`) makes the room.
//!
//! Short of space a writer waits for room that only garbage gives back,
//! and garbage is found when an overwrite or a delete meets the version it
//! hides: when the flushed run holding it is merged into L1, a merge that
//! rewrites L1. With small values at scale L1 is large (a 6 GiB block
//! volume of 4 KiB chunks is ~1.6 M keys), and merging it for the few
//! thousand writes that arrive between two GC passes wrote more keytable
//! bytes than those writes could release.

use std::sync::Arc;

use crate::db::DbInner;
use crate::version::Version;

impl DbInner {
    /// Whether merging the flushed runs into L1, with `pending` writes and
    /// deletes among them (or about to be flushed into them), may release
    /// at least as many value bytes as it writes keytable bytes: each
    /// pending entry is taken to hide one version of the average live
    /// size, and the merge to write the runs and L1 once more.
    pub(crate) fn merge_pays(&self, version: &Version, pending: u64) -> bool {
        if pending == 0 {
            return false;
        }
        let (entries, bytes) = self.keytable_totals(version, version.runs + 1);
        let live = self.vlog.live_bytes();
        u128::from(pending) * u128::from(live) >= u128::from(entries) * u128::from(bytes)
    }

    /// Entries and bytes of the keytables of the first `levels` levels.
    pub(crate) fn keytable_totals(&self, version: &Version, levels: usize) -> (u64, u64) {
        version
            .levels
            .iter()
            .take(levels)
            .flatten()
            .fold((0u64, 0u64), |(entries, bytes), kt| {
                (entries + kt.index.entries, bytes + kt.bytes(self.page))
            })
    }

    /// Short of space, whether the writes and deletes pending in the runs
    /// (and, with `with_memtables`, the memtables) are worth a merge: it
    /// pays ([`Self::merge_pays`]), or no segment is left that the deep
    /// pass could clean instead (then only a merge may still find room).
    pub(crate) fn low_space_merge_due(&self, with_memtables: bool) -> bool {
        let (version, pending) = self.pending_writes(with_memtables);
        pending > 0
            && (self.merge_pays(&version, pending)
                || !self.vlog.has_reclaimable(self.deep_pass_live()))
    }

    /// The current version and the writes and deletes not yet merged into
    /// L1: in its runs and, with `with_memtables`, in the memtables.
    pub(crate) fn pending_writes(&self, with_memtables: bool) -> (Arc<Version>, u64) {
        let sv = self.sv.read();
        let mut pending = sv.version.run_writes;
        if with_memtables {
            let imm = sv.imm.as_ref().map_or(0, |m| m.writes());
            pending += (sv.mem.writes() + imm) as u64;
        }
        (sv.version.clone(), pending)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::small_db;

    /// A merge pays when the writes waiting for it may release as many
    /// value bytes as it rewrites keytable bytes: with 4 KiB values a
    /// single pending write never pays for an L1 of several keytable
    /// pages, one per key always does, and GC relocations are no writes.
    #[test]
    fn a_merge_pays_for_enough_pending_writes_and_never_for_relocations() {
        let db = small_db();
        let keys = 1000u64;
        for k in 0..keys {
            db.put(format!("key{k:05}").as_bytes(), &[7u8; 4096])
                .expect("put");
        }
        db.inner.flush_into_l1().expect("flush into L1");
        let inner = &db.inner;
        let (version, pending) = inner.pending_writes(true);
        assert_eq!((version.runs, pending), (0, 0));
        assert!(!inner.merge_pays(&version, 0));
        assert!(!inner.merge_pays(&version, 1), "one write, a whole L1");
        assert!(inner.merge_pays(&version, keys), "every key overwritten");

        db.put(b"key00001", &[8u8; 4096]).expect("overwrite");
        assert_eq!(inner.pending_writes(true).1, 1);
        let e = inner
            .lookup(b"key00002", crate::types::SeqNo::MAX)
            .expect("lookup")
            .expect("entry");
        let value = [7u8; 4096];
        inner
            .relocate(b"key00002", &value, e.seq, crate::vlog::Reserve::Internal)
            .expect("relocate");
        assert_eq!(inner.pending_writes(true).1, 1, "a relocation is no write");
        inner.flush_now().expect("flush");
        let (version, pending) = inner.pending_writes(true);
        assert_eq!((version.runs, version.run_writes, pending), (1, 1, 1));
    }
}
