//! Value reclustering: rewrites the small values of a key range into the
//! log in key order, so that a range read of those keys afterwards reads a
//! few long runs of the device instead of one page per value.
//!
//! Values land in the log in the order they were written (or relocated by
//! GC). Keys written in random order (YCSB's hashed load, a file system's
//! chunks, a block volume's random writes) leave a range's values spread
//! over the whole log, and a range read of n small values then costs n
//! device reads. Reclustering reads a range in key order and re-appends
//! each value that is still the latest version through GC's relocation: the
//! same sequence number, under the maintenance lock, so reads and snapshots
//! see nothing change; the old copies become garbage that GC reclaims.
//!
//! It is optional work: it writes only into space ordinary writes may use,
//! stops while less than a quarter of the device is free, and leaves
//! values that already lie in runs of neighbouring keys (a sequential
//! load, an earlier rewrite of an overlapping range), so running it twice
//! rewrites nothing the second time.

use crate::db::{Db, DbInner};
use crate::error::Result;
use crate::gc::Liveness;
use crate::stats::Counters;
use crate::types::{Entry, SeqNo};
use crate::vlog::Reserve;

/// Live keys examined per step; the maintenance lock is held for one step
/// and released between steps, so flushes and writers' stalls wait at most
/// one step.
const STEP_KEYS: usize = 256;
/// Records larger than this stay where they are: a range read reads each of
/// them with a device read of its own anyway.
const MAX_RECORD: u32 = 16 << 10;
/// Two values whose records are at most this far apart in one segment are
/// next to each other for a range read: the gap a merged device read reads
/// through.
const NEAR: u64 = flash::MAX_READ_GAP;
/// Neighbouring keys whose records follow each other closely in the log
/// this many times in a row are a run a range read reads at once: left as
/// they are.
const LONG_RUN: usize = 8;
/// A step rewrites nothing unless at least this many of its values lie
/// outside such runs.
const MIN_REWRITE: usize = 8;

/// Reclustering stops while fewer than this fraction of the device's
/// segments are free. The rewrite is optional, and the copies it leaves
/// behind count as live until compaction drops them (as an overwrite's
/// do), so it must never bring the device near the low-space mode where
/// writers are slowed down for GC.
const MIN_FREE_FRACTION: f64 = 0.25;

/// What a [`Db::recluster`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclusterStats {
    /// Live keys examined.
    pub keys: u64,
    /// Values rewritten in key order.
    pub rewritten: u64,
    /// Bytes of records rewritten.
    pub bytes: u64,
    /// Whether it stopped before the end of the range because less than a
    /// quarter of the device was free.
    pub stopped_for_space: bool,
}

impl Db {
    /// Rewrites the small values of the live keys in `[start, end)` (empty
    /// `end`: to the last key) in key order, where they are scattered (see
    /// the module doc). Reads, writes and snapshots go on meanwhile and see
    /// the same data. Flushes the memtable when what it re-inserted fills it.
    pub fn recluster(&self, start: &[u8], end: &[u8]) -> Result<ReclusterStats> {
        self.recluster_at_most(start, end, u64::MAX)
    }

    /// [`Db::recluster`] of at most about `max_keys` live keys from `start`
    /// (a step's worth more at most): bounded work for a range known only
    /// by its ends, such as the span of a multi-get's sorted keys, which
    /// may be sparse in a much larger key space.
    pub fn recluster_at_most(
        &self,
        start: &[u8],
        end: &[u8],
        max_keys: u64,
    ) -> Result<ReclusterStats> {
        let mut stats = ReclusterStats::default();
        let mut cursor = start.to_vec();
        while stats.keys < max_keys {
            let step = self.inner.recluster_step(&cursor, end, &mut stats)?;
            // What it re-inserted fills the memtable: flush it here rather
            // than let the memtable outgrow its limit while this holds the
            // maintenance lock step after step.
            if self.inner.memtable_full() {
                self.inner.flush_now()?;
            }
            match step {
                Some(next) => cursor = next,
                None => return Ok(stats),
            }
        }
        Ok(stats)
    }
}

impl DbInner {
    /// One step from `from`: the key to go on from, or `None` at the end of
    /// the range or when there is no room for it (see [`MIN_FREE_FRACTION`]).
    fn recluster_step(
        &self,
        from: &[u8],
        end: &[u8],
        stats: &mut ReclusterStats,
    ) -> Result<Option<Vec<u8>>> {
        let _st = self.maint.lock();
        if !self.room_to_recluster() {
            stats.stopped_for_space = true;
            return Ok(None);
        }
        let (sv, seq) = self.read_view(None);
        let found =
            self.visible_entries(&sv, from, end, STEP_KEYS, seq, usize::MAX, false, None)?;
        drop(sv);
        stats.keys += found.len() as u64;
        let small: Vec<&Entry> = found.iter().filter(|e| e.ptr.len <= MAX_RECORD).collect();
        let scattered = outside_long_runs(&small);
        if scattered.len() >= MIN_REWRITE {
            match self.rewrite_in_order(&scattered, stats) {
                Ok(()) => {}
                Err(e) if e.is_no_space() => {
                    stats.stopped_for_space = true;
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        if found.len() < STEP_KEYS {
            return Ok(None);
        }
        let mut next = found.last().map_or_else(Vec::new, |e| e.key.to_vec());
        next.push(0);
        Ok(Some(next))
    }

    /// Whether at least [`MIN_FREE_FRACTION`] of the segments are free.
    fn room_to_recluster(&self) -> bool {
        let total = f64::from(self.flash.geometry().segment_count);
        !self.space_low() && f64::from(self.flash.free_segments()) >= MIN_FREE_FRACTION * total
    }

    /// Re-appends the values of `entries` (in key order) that are still the
    /// latest version where they are, keeping their sequence numbers.
    /// Called under the maintenance lock, so no flush moves a newer version
    /// below the memtable between the check and the re-insert (GC's rule).
    fn rewrite_in_order(&self, entries: &[&Entry], stats: &mut ReclusterStats) -> Result<()> {
        let snapshots: Vec<SeqNo> = self.snapshot_seqs();
        let reqs: Vec<_> = entries.iter().map(|e| (e.ptr, &e.key[..])).collect();
        // Under the maintenance lock no GC pass or checkpoint releases a
        // segment the view points into: a failed read is a fault.
        let values = self.vlog.read_values(&reqs)?;
        for (e, (value, _)) in entries.iter().zip(values) {
            if !matches!(
                self.liveness(&e.key, e.seq, e.ptr, &snapshots)?,
                Liveness::Latest
            ) {
                continue;
            }
            self.relocate(&e.key, &value, e.seq, Reserve::User)?;
            stats.rewritten += 1;
            stats.bytes += u64::from(e.ptr.len);
            Counters::add(&self.counters.recluster_bytes, u64::from(e.ptr.len));
        }
        Ok(())
    }
}

/// The entries of `entries` (in key order) that are not part of a run of
/// at least [`LONG_RUN`] neighbouring keys whose records follow each other
/// closely in the log: what a range read of them reads one device read at
/// a time. Runs already in key order (an earlier rewrite of an overlapping
/// range, a sequential load) are left where they are.
fn outside_long_runs<'a>(entries: &[&'a Entry]) -> Vec<&'a Entry> {
    let mut out = Vec::new();
    let mut run_start = 0;
    for i in 1..=entries.len() {
        if i < entries.len() && near(entries[i - 1], entries[i]) {
            continue;
        }
        if i - run_start < LONG_RUN {
            out.extend_from_slice(&entries[run_start..i]);
        }
        run_start = i;
    }
    out
}

/// Whether `b`'s record follows `a`'s closely in the same segment.
fn near(a: &Entry, b: &Entry) -> bool {
    let (a, b) = (a.ptr, b.ptr);
    a.seg == b.seg
        && a.gen == b.gen
        && b.offset >= a.offset.saturating_add(a.len)
        && u64::from(b.offset - (a.offset + a.len)) <= NEAR
}

#[cfg(test)]
mod tests {
    use super::{outside_long_runs, LONG_RUN};
    use crate::test_support::put_at;
    use crate::types::Entry;

    /// Entries whose records are 100 bytes long at these offsets.
    fn at(offsets: &[u32]) -> Vec<Entry> {
        offsets
            .iter()
            .enumerate()
            .map(|(i, &o)| {
                let mut e = put_at(format!("k{i:03}").as_bytes(), 1, o);
                e.ptr.len = 100;
                e
            })
            .collect()
    }

    fn outside(entries: &[Entry]) -> Vec<u32> {
        let refs: Vec<&Entry> = entries.iter().collect();
        outside_long_runs(&refs)
            .iter()
            .map(|e| e.ptr.offset)
            .collect()
    }

    #[test]
    fn long_runs_stay_and_the_rest_is_rewritten() {
        let run: Vec<u32> = (0..LONG_RUN as u32).map(|i| 50_000 + i * 100).collect();
        let mut offsets = vec![900_000, 10_000];
        offsets.extend(&run);
        offsets.extend([700_000, 300_000, 300_100]);
        assert_eq!(
            outside(&at(&offsets)),
            vec![900_000, 10_000, 700_000, 300_000, 300_100]
        );
        assert!(outside(&at(&run)).is_empty(), "all in one run");
        // One short of a run: all rewritten.
        let short = &run[..LONG_RUN - 1];
        assert_eq!(outside(&at(short)), short.to_vec());
        // Records out of log order are not a run, however close.
        let backwards: Vec<u32> = run.iter().rev().copied().collect();
        assert_eq!(outside(&at(&backwards)).len(), LONG_RUN);
        assert!(outside(&[]).is_empty());
    }
}
