//! Background work: memtable flush into a flushed run, the merge of runs
//! into L1, keytable-only compaction between levels (values never move),
//! releasing dead segments and checkpoints.
//! Every function here runs with `DbInner::maint` held, so at most one
//! flush, compaction or GC pass runs at a time.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::db::{DbInner, MaintState, SuperVersion};
use crate::error::{Error, Result};
use crate::iter::{EntryIter, LevelIter, MergeIter};
use crate::keytable::BuiltKeytable;
use crate::manifest::{Counters as PersistedCounters, KeytableMeta, Manifest};
use crate::memtable::Memtable;
use crate::runbuilder::RunBuilder;
use crate::shape;
use crate::stats::Counters;
use crate::types::SeqNo;
use crate::version::{Keytable, SegmentRef, Version};
use crate::vlog::LogPosition;

/// How often background maintenance repeats its out-of-space warning.
const NO_SPACE_WARN_EVERY: Duration = Duration::from_secs(10);

/// Flushed runs that are merged into L1 together (see
/// [`Version::runs`]): a flush writes the memtable as a run of its own
/// instead of rewriting all of L1 (with random keys a flush used to write
/// about six times the memtable's keytable bytes, most of a small-value
/// fill's keytable writes), and L1 is rewritten once per this many
/// flushes. A merge writes L1 and the runs, so more runs per merge cost
/// less per run: with L1 sized from the bottom (`shape.rs`), eight halved
/// a small-value fill's keytable writes against four; a point read then
/// probes up to [`MAX_RUNS`] runs' Bloom filters before the levels.
const RUNS_TO_MERGE: usize = 8;
/// Flushed runs at which a due flush waits for their merge.
const MAX_RUNS: usize = 2 * RUNS_TO_MERGE;
/// How far over its size limit (`shape::targets`) L1 may grow before a due
/// flush waits for compaction: merging the runs into L1 costs L1's size,
/// and when writes outran compaction L1 grew with every merge, each cost
/// more than the last and the backlog fed itself. Writers wait meanwhile
/// through the flush debt (`DbInner::throttle`).
const L1_BACKLOG: u64 = 3;

/// Notices when writes stop, for the merge of the runs they left
/// (background loop only).
struct Quiet {
    /// Last sequence number seen, and since when.
    seq: SeqNo,
    since: std::time::Instant,
    /// Whether the runs were merged since writes stopped.
    merged: bool,
}

impl Quiet {
    fn new(seq: SeqNo) -> Self {
        Quiet {
            seq,
            since: std::time::Instant::now(),
            merged: false,
        }
    }

    /// Whether writes have stopped for `after` and the leftover runs are
    /// not merged yet; once per quiet period (a merge is then assumed done).
    fn merge_due(&mut self, db: &DbInner, after: Option<Duration>) -> bool {
        let seq = db.visible_seq.load(Ordering::Acquire);
        if seq != self.seq {
            *self = Quiet::new(seq);
            return false;
        }
        let due = !self.merged && after.is_some_and(|a| self.since.elapsed() >= a);
        if due {
            self.merged = true;
        }
        due
    }
}

/// A merge's output keytables and the pointers of the values it dropped.
type BuiltRun = (Vec<Arc<Keytable>>, Vec<crate::types::ValuePtr>);

/// Flash segment kind tag for keytable segments.
pub const SEGMENT_KIND_KEYTABLE: u8 = 2;

/// Memtable entries from which a flush is due whenever space is low (see
/// [`DbInner::flush_releases`]).
const LOW_SPACE_FLUSH_ENTRIES: usize = 256;

/// Free segments each kind of keytable write must leave, so that when the
/// device is nearly full the work that makes room (GC and the flush that
/// completes it) always finds a segment: compaction and defragmentation stop
/// first, then ordinary flushes, and GC's own flush may use the last one.
pub(crate) mod kt_reserve {
    /// Compaction and keytable defragmentation (optional work).
    pub const OPTIONAL: u32 = 2;
    /// Memtable flush.
    pub const FLUSH: u32 = 1;
    /// The flush that completes a GC pass.
    pub const GC_FLUSH: u32 = 0;
}

/// A compaction's build, which is optional work: `None` when space is
/// short (it leaves room for GC and tries again later).
fn optional(built: Result<BuiltRun>) -> Result<Option<BuiltRun>> {
    match built {
        Ok(built) => Ok(Some(built)),
        Err(Error::NoSpace) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a keytable build may do between two keytables it writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Between {
    /// Nothing: the build runs through.
    Nothing,
    /// Flush the memtable when it is full ([`DbInner::flush_if_due`]).
    FlushWhenDue,
}

impl DbInner {
    pub(crate) fn background_loop(&self) {
        let mut last_warning: Option<std::time::Instant> = None;
        let mut quiet = Quiet::new(self.visible_seq.load(Ordering::Acquire));
        while !self.signal.stopping() {
            self.signal.wait_for_work(Duration::from_millis(100));
            if self.signal.stopping() {
                break;
            }
            let mut round = self.maintenance();
            if round.is_ok() && quiet.merge_due(self, self.opts.idle_merge_after) {
                round = self.merge_leftover_runs();
            }
            // Scans found the memtable in many sorted runs: merge them
            // here, where no writer waits (see `memruns`), until it is
            // frozen for a flush.
            let mem = self.sv.read().mem.clone();
            if mem.wants_tidying() {
                mem.tidy_runs(|| Arc::ptr_eq(&self.sv.read().mem, &mem));
            }
            if let Err(e) = round {
                if !e.is_no_space() {
                    tracing::error!(error = %e, "background maintenance failed");
                    *self.bg_error.lock() = Some(e.to_string());
                    self.signal.flushed();
                    return;
                }
                // Out of space is retried; say so now and then, not per round.
                if last_warning.is_none_or(|t| t.elapsed() >= NO_SPACE_WARN_EVERY) {
                    tracing::warn!(error = %e, "maintenance: out of space, retrying");
                    last_warning = Some(std::time::Instant::now());
                }
                std::thread::sleep(match e {
                    Error::HostFull(_) => crate::db::HOST_FULL_RETRY,
                    _ => Duration::from_millis(50),
                });
            }
        }
    }

    /// Merges the flushed runs into L1 if there are any (background
    /// maintenance does when writes have stopped: see
    /// [`crate::Options::idle_merge_after`]). Leaves them when space is low
    /// (compaction then moves them down as room allows).
    pub(crate) fn merge_leftover_runs(&self) -> Result<()> {
        let mut st = self.maint.lock();
        if self.space_low() {
            return Ok(());
        }
        self.merge_all_runs(&mut st)
    }

    /// Merges the flushed runs, if any, into L1 (or a new L1 on top).
    fn merge_all_runs(&self, st: &mut MaintState) -> Result<()> {
        let version = self.sv.read().version.clone();
        if version.runs > 0 {
            self.merge_runs(st, &version, Between::Nothing)?;
        }
        Ok(())
    }

    /// Flushes, compacts and collects garbage until nothing is due.
    pub(crate) fn maintenance(&self) -> Result<()> {
        if self.flash.host_full() {
            // Has the host room again? (Backing a segment ends it.)
            let _ = self.flash.replenish();
        }
        let mut st = self.maint.lock();
        if self.boot_checkpoint.lock().is_some() {
            // Opening could not write its checkpoint (host full): first of all.
            self.flush_locked(&mut st, kt_reserve::FLUSH)?;
        }
        let space_wanted = self.signal.take_space_wanted();
        for _ in 0..1000 {
            let mut did = false;
            let space_low = self.space_low();
            let flush_due =
                self.memtable_full() || (space_low && self.flush_releases(space_wanted));
            // Short of space the flush comes first: it releases what GC freed.
            if flush_due && !space_low && self.l1_backlogged() && self.compact_one(&mut st)? {
                continue;
            }
            if flush_due {
                self.flush_locked(&mut st, kt_reserve::FLUSH)?;
                did = true;
            }
            if self.gc_locked(&mut st, false)? > 0 {
                did = true;
            }
            if self.compact_one(&mut st)? {
                did = true;
            }
            if self.defragment_keytables(&mut st)? {
                did = true;
            }
            if !did {
                break;
            }
        }
        if !self.release_queue.lock().is_empty() {
            self.checkpoint(&mut st)?;
        }
        Ok(())
    }

    /// Whether a flush before the memtable is full is worth it when space
    /// is low, for what the flush and the merge it brings release: the
    /// memtable holds writes or deletes worth a merge (`lowspace.rs`), and
    /// a writer was refused for want of space or it holds at least
    /// [`LOW_SPACE_FLUSH_ENTRIES`] (a trim's or a delete run's
    /// tombstones). Not for a few small writes nobody waits behind: an
    /// adapter renewing its lease every 5 s on a full node made each
    /// renewal a flush and a merge of L1, 26 MB/s of keytable writes on an
    /// idle device. Not for GC's relocations, which hide nothing, and not
    /// for a memtable without writes (the runs' writes alone may be worth
    /// a merge that cannot run yet: flushing nothing again and again wrote
    /// a checkpoint each time).
    fn flush_releases(&self, space_wanted: bool) -> bool {
        let (entries, writes) = {
            let mem = &self.sv.read().mem;
            (mem.len(), mem.writes())
        };
        writes > 0
            && (space_wanted || entries >= LOW_SPACE_FLUSH_ENTRIES)
            && self.low_space_merge_due(true)
    }

    /// Whether flushing is ahead of compaction: [`MAX_RUNS`] flushed runs,
    /// or L1 more than [`L1_BACKLOG`] times its size limit.
    fn l1_backlogged(&self) -> bool {
        let version = self.sv.read().version.clone();
        if version.runs >= MAX_RUNS {
            return true;
        }
        let sizes = self.sorted_level_sizes(&version);
        let limit = shape::targets(&sizes, self.opts.l1_bytes)
            .first()
            .copied()
            .flatten();
        limit.is_some_and(|t| sizes[0] > t.saturating_mul(L1_BACKLOG))
    }

    /// Bytes of each sorted level (below the flushed runs), L1 first.
    fn sorted_level_sizes(&self, version: &Version) -> Vec<u64> {
        (version.runs..version.levels.len())
            .map(|i| version.level_bytes(i, self.page))
            .collect()
    }

    pub(crate) fn space_low(&self) -> bool {
        let free = self.flash.free_segments();
        self.free_hint.store(free, Ordering::Relaxed);
        self.low_on_free(free)
    }

    pub(crate) fn flush_now(&self) -> Result<()> {
        let mut st = self.maint.lock();
        self.flush_locked(&mut st, kt_reserve::FLUSH)
    }

    /// Flushes the memtable and merges every flushed run into L1, so that
    /// what the writes so far overwrote or deleted is released for GC.
    pub(crate) fn flush_into_l1(&self) -> Result<()> {
        let mut st = self.maint.lock();
        self.flush_locked(&mut st, kt_reserve::FLUSH)?;
        self.merge_all_runs(&mut st)
    }

    /// Flushes the memtable if it is full, from inside a merge (see
    /// [`Between::FlushWhenDue`]): writers would otherwise be held back for
    /// the whole merge, seconds with a large L1. Not when space is low (the
    /// maintenance loop orders the work then), and a flush that finds no
    /// room is left to that loop too; the merge's keytable reserve is kept.
    fn flush_if_due(&self, st: &mut MaintState) -> Result<()> {
        if !self.memtable_full() || self.space_low() {
            return Ok(());
        }
        let keep_free = st.kt.keep_free;
        let flushed = self.flush_locked(st, kt_reserve::FLUSH);
        st.kt.keep_free = keep_free;
        match flushed {
            Ok(()) => {
                Counters::add(&self.counters.flushes_during_merges, 1);
                Ok(())
            }
            Err(e) if e.is_no_space() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Freezes the memtable, writes it as a new flushed run (see
    /// [`Version::runs`]), installs it and checkpoints.
    ///
    /// If an earlier flush failed after freezing (out of space, say), its
    /// frozen memtable is still the read path's `imm`: this flush writes
    /// that one and leaves the active memtable for the next. Freezing again
    /// would replace `imm` and hide its entries from reads until a restart.
    pub(crate) fn flush_locked(&self, st: &mut MaintState, keep_free: u32) -> Result<()> {
        st.kt.keep_free = keep_free;
        let (pos, seq) = match st.imm_replay {
            Some(frozen) if self.sv.read().imm.is_some() => frozen,
            _ => self.freeze_memtable(st),
        };
        // Values the new keytables point to must be durable before a
        // checkpoint references those keytables.
        self.vlog.sync_all()?;
        let (imm, version) = {
            let sv = self.sv.read();
            (sv.imm.clone(), sv.version.clone())
        };
        let mut levels = version.levels.clone();
        let mut runs = version.runs;
        let mut run_writes = version.run_writes;
        let mut released = Vec::new();
        if let Some(imm) = imm.filter(|m| !m.is_empty()) {
            run_writes += imm.writes() as u64;
            let sources: Vec<EntryIter<'_>> = vec![Box::new(imm.iter_from(&[]).map(Ok))];
            let bottom = levels.iter().all(|l| l.is_empty());
            let (out, dropped) =
                self.build_run(st, MergeIter::new(sources), bottom, Between::Nothing)?;
            if !out.is_empty() {
                levels.insert(0, out);
                runs += 1;
            }
            released = dropped;
        }
        let next = Version {
            levels,
            runs,
            run_writes: if runs > 0 { run_writes } else { 0 },
        };
        self.install(next, true);
        for ptr in released {
            self.vlog.release_value(ptr);
        }
        st.replay = pos;
        st.flushed_seq = seq;
        st.imm_replay = None;
        st.gc.flushed();
        Counters::add(&self.counters.flushes, 1);
        self.checkpoint(st)?;
        // The checkpoint records this run's log: writes may go on.
        if self.boot_checkpoint.lock().take().is_some() {
            tracing::info!("the checkpoint after open is written; writes accepted");
        }
        self.signal.flushed();
        Ok(())
    }

    /// Makes the active memtable the frozen `imm` (with a fresh active one)
    /// and returns the log position and sequence number it covers up to.
    pub(crate) fn freeze_memtable(&self, st: &mut MaintState) -> (LogPosition, SeqNo) {
        let (pos, seq) = self.vlog.with_position(|pos, seq| {
            let mut sv = self.sv.write();
            let next = SuperVersion {
                mem: Arc::new(Memtable::sized_like(&sv.mem)),
                imm: Some(sv.mem.clone()),
                version: sv.version.clone(),
            };
            *sv = Arc::new(next);
            (pos, seq)
        });
        st.imm_replay = Some((pos, seq));
        (pos, seq)
    }

    /// Merges the flushed runs into L1 once there are [`RUNS_TO_MERGE`] of
    /// them, else compacts one keytable of the first level over its size
    /// limit (`shape::targets`) into the next level. Short of space the
    /// runs are merged as soon as the writes among them are worth it
    /// (`lowspace.rs`; runs of GC relocations release nothing) or GC's
    /// deep passes wait for a keytable segment (the merge opens one), else
    /// only at [`MAX_RUNS`]. Returns whether it did anything.
    pub(crate) fn compact_one(&self, st: &mut MaintState) -> Result<bool> {
        let version = self.sv.read().version.clone();
        let space_low = self.space_low();
        if !space_low {
            st.forced_compactions = 0;
        }
        let runs = version.runs;
        let merge_due = if space_low {
            runs >= MAX_RUNS
                || (runs > 0 && (self.low_space_merge_due(false) || self.deep_pass_blocked(st)))
        } else {
            runs >= RUNS_TO_MERGE
        };
        if merge_due {
            if self.merge_runs(st, &version, Between::FlushWhenDue)? {
                return Ok(true);
            }
            // No room for the whole merge: move the oldest run down a
            // keytable at a time instead (it is newer than L1).
            return self.compact_keytable(st, &version, runs - 1);
        }
        let sizes = self.sorted_level_sizes(&version);
        let mut pick = sizes
            .iter()
            .zip(shape::targets(&sizes, self.opts.l1_bytes))
            .position(|(&size, limit)| size > 0 && limit.is_some_and(|t| size > t))
            .map(|i| runs + i);
        // Short of space, push everything toward the last level so deletes
        // and overwrites meet the versions they hide and their values are
        // released for GC (at most one full pass per low-space episode).
        if pick.is_none() && space_low && st.forced_compactions < self.total_keytables(&version) {
            pick = (runs..version.levels.len().saturating_sub(1))
                .find(|&i| !version.levels[i].is_empty());
            if pick.is_some() {
                st.forced_compactions += 1;
            }
        }
        match pick {
            Some(li) => self.compact_keytable(st, &version, li),
            None => Ok(false),
        }
    }

    /// Merges every flushed run and L1 into a new L1, or, when the sorted
    /// levels need one more (`shape::wants_new_level`), the runs alone into
    /// a new L1 above the others. `Ok(false)` when there is no room for it.
    ///
    /// With [`Between::FlushWhenDue`] a memtable that fills while the merge
    /// runs is flushed between two of its keytables, as a new run on top of
    /// the current version; the merge then installs its L1 below those runs.
    fn merge_runs(&self, st: &mut MaintState, version: &Version, between: Between) -> Result<bool> {
        let runs = version.runs;
        st.kt.keep_free = kt_reserve::OPTIONAL;
        let sizes = self.sorted_level_sizes(version);
        let new_level = shape::wants_new_level(&sizes, self.opts.l1_bytes, self.opts.level_ratio);
        let inputs = if new_level {
            runs
        } else {
            (runs + 1).min(version.levels.len())
        };
        self.merge_in_fresh_segment(st, &version.levels[..inputs]);
        let bottom = version.levels.len() <= inputs;
        let sources: Vec<EntryIter<'_>> = version.levels[..inputs]
            .iter()
            .map(|l| Box::new(LevelIter::for_merge(l.clone(), &self.ctx)) as EntryIter<'_>)
            .collect();
        let built = self.build_run(st, MergeIter::new(sources), bottom, between);
        let Some((out, released)) = optional(built)? else {
            return Ok(false);
        };
        // Runs flushed during the merge sit on top of the levels it read.
        let now = self.sv.read().version.clone();
        let flushed = now
            .runs
            .checked_sub(version.runs)
            .expect("only flushes change the version while maintenance holds its lock");
        debug_assert_eq!(now.levels.len(), version.levels.len() + flushed);
        debug_assert!(now.levels[flushed..]
            .iter()
            .zip(&version.levels)
            .all(|(a, b)| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.id == y.id)));
        let mut levels = now.levels[..flushed].to_vec();
        levels.push(out);
        levels.extend(version.levels.iter().skip(inputs).cloned());
        while levels.last().is_some_and(|l| l.is_empty()) {
            levels.pop();
        }
        // Runs flushed during the merge may hold writes; the merged ones
        // are gone.
        let next = Version {
            levels,
            runs: flushed,
            run_writes: now.run_writes.saturating_sub(version.run_writes),
        };
        self.install_compaction(st, next, released)?;
        Ok(true)
    }

    /// Short of space, a merge whose output will not fit the keytable
    /// segment being filled starts a new one, when one can be opened: its
    /// output beginning in the old segment's last pages kept that segment
    /// partly live after the merge, and each such segment was one free
    /// segment fewer for GC (`lowspace.rs`). The old segment is released
    /// once the merge has replaced what it holds.
    fn merge_in_fresh_segment(&self, st: &mut MaintState, inputs: &[Vec<Arc<Keytable>>]) {
        let pages: u64 = inputs
            .iter()
            .flatten()
            .map(|kt| u64::from(kt.data_pages + kt.index_pages))
            .sum();
        let room = st.kt.room_pages(self.flash.geometry().pages_per_segment);
        if self.space_low()
            && u64::from(room) < pages
            && self.flash.free_segments() > kt_reserve::OPTIONAL
        {
            st.kt.start_new_segment();
        }
    }

    /// Merges one keytable of level `li` into the level below (round robin
    /// over the level's key range). A flushed run left empty goes away.
    fn compact_keytable(&self, st: &mut MaintState, version: &Version, li: usize) -> Result<bool> {
        let mut runs = version.runs;
        st.kt.keep_free = kt_reserve::OPTIONAL;
        if st.compact_cursor.len() <= li {
            st.compact_cursor.resize(li + 1, Bytes::new());
        }
        let level = &version.levels[li];
        let cursor = &st.compact_cursor[li];
        let ki = level
            .iter()
            .position(|kt| kt.index.smallest.as_ref() > cursor.as_ref())
            .unwrap_or(0);
        let kt = level[ki].clone();
        let range = version.overlapping(li + 1, &kt.index.smallest, &kt.index.largest);
        let mut levels = version.levels.clone();
        if levels.len() <= li + 1 {
            levels.push(Vec::new());
        }
        let old: Vec<Arc<Keytable>> = levels[li + 1][range.clone()].to_vec();
        let sources: Vec<EntryIter<'_>> = vec![
            Box::new(LevelIter::for_merge(vec![kt.clone()], &self.ctx)),
            Box::new(LevelIter::for_merge(old, &self.ctx)),
        ];
        let bottom = levels.iter().skip(li + 2).all(|l| l.is_empty());
        let built = self.build_run(st, MergeIter::new(sources), bottom, Between::Nothing);
        let Some((out, released)) = optional(built)? else {
            return Ok(false);
        };
        levels[li].remove(ki);
        levels[li + 1].splice(range, out);
        if li < runs && levels[li].is_empty() {
            levels.remove(li);
            runs -= 1;
        }
        while levels.last().is_some_and(|l| l.is_empty()) && levels.len() > 1 {
            levels.pop();
        }
        st.compact_cursor[li] = kt.index.largest.clone();
        let next = Version {
            levels,
            runs,
            run_writes: if runs > 0 { version.run_writes } else { 0 },
        };
        self.install_compaction(st, next, released)?;
        Ok(true)
    }

    /// Installs a compaction's result, releases the values it dropped and
    /// checkpoints.
    fn install_compaction(
        &self,
        st: &mut MaintState,
        version: Version,
        released: Vec<crate::types::ValuePtr>,
    ) -> Result<()> {
        self.install(version, false);
        for ptr in released {
            self.vlog.release_value(ptr);
        }
        Counters::add(&self.counters.compactions, 1);
        self.checkpoint(st)
    }

    /// Makes `version` current (dropping the frozen memtable when
    /// `flushed`) and re-splits the DRAM budget over it.
    fn install(&self, version: Version, flushed: bool) {
        debug_assert!(
            version.runs <= version.levels.len()
                && version.levels[..version.runs].iter().all(|l| !l.is_empty())
        );
        debug_assert!(version.runs > 0 || version.run_writes == 0);
        {
            let mut sv = self.sv.write();
            let next = SuperVersion {
                mem: sv.mem.clone(),
                imm: if flushed { None } else { sv.imm.clone() },
                version: Arc::new(version),
            };
            *sv = Arc::new(next);
        }
        self.apply_dram_budget();
    }

    /// Splits the DRAM budget in PinK's order: the level index always stays;
    /// the keytable cache gets what it needs of the rest (up to its own
    /// limit); Bloom filters get what remains, upper levels first.
    pub(crate) fn apply_dram_budget(&self) {
        let version = self.sv.read().version.clone();
        let index: usize = version.all().map(|kt| kt.index.index_dram_bytes()).sum();
        let tables: usize = version
            .all()
            .map(|kt| kt.data_pages as usize * self.page)
            .sum();
        let rest = self.opts.dram_budget.saturating_sub(index);
        let cache = self.opts.cache_bytes.min(rest);
        self.ctx.cache.set_budget(cache);
        let mut blooms = rest - cache.min(tables);
        for kt in version.all() {
            let need = kt.index.bloom.bytes();
            let keep = need <= blooms;
            if keep {
                blooms -= need;
            }
            kt.use_bloom.store(keep, Ordering::Relaxed);
        }
    }

    fn total_keytables(&self, v: &Version) -> usize {
        v.levels.iter().map(|l| l.len()).sum()
    }

    /// Merges sorted entries into new keytables, dropping versions no reader
    /// can see ([`RunBuilder`]). Returns the keytables and the pointers
    /// of dropped values, whose bytes the caller releases once the result
    /// is installed. `between` says what may run between two keytables
    /// written.
    fn build_run(
        &self,
        st: &mut MaintState,
        entries: MergeIter<'_>,
        bottom: bool,
        between: Between,
    ) -> Result<BuiltRun> {
        let mut run = RunBuilder::new(self.oldest_snapshot(), bottom, self.opts.keytable_bytes);
        let mut out = Vec::new();
        for e in entries {
            let built = run.push(e?, || {
                st.kt.builder(self.page, self.opts.bloom_bits_per_key)
            })?;
            if let Some(b) = built {
                out.push(self.write_keytable(st, b)?);
                self.after_write(st, between)?;
            }
        }
        let (last, dropped) = run.finish()?;
        if let Some(b) = last {
            out.push(self.write_keytable(st, b)?);
        }
        Ok((out, dropped))
    }

    /// What `between` asks for after a keytable was written.
    fn after_write(&self, st: &mut MaintState, between: Between) -> Result<()> {
        match between {
            Between::Nothing => Ok(()),
            Between::FlushWhenDue => self.flush_if_due(st),
        }
    }

    /// Appends whole keytable pages to the current keytable segment (one
    /// device write), opening a new segment when they do not fit.
    fn place_pages(&self, st: &mut MaintState, bytes: &[u8]) -> Result<(Arc<SegmentRef>, u32)> {
        let placed = st
            .kt
            .place(&self.flash, &self.release_queue, self.page, bytes)?;
        Counters::add(&self.counters.compaction_bytes_written, bytes.len() as u64);
        Ok(placed)
    }

    /// Writes a built keytable, warms the cache with its blocks and keeps
    /// its buffer for the next build.
    fn write_keytable(&self, st: &mut MaintState, built: BuiltKeytable) -> Result<Arc<Keytable>> {
        let (seg, first_page) = self.place_pages(st, &built.bytes)?;
        st.kt.recycle(built.bytes);
        for (i, b) in built.blocks.into_iter().enumerate() {
            self.ctx.cache.insert(built.id, i as u32, b);
        }
        Ok(Arc::new(Keytable::new(
            built.id,
            seg,
            first_page,
            built.data_pages,
            built.index_pages,
            built.index,
            true,
            self.ctx.cache.clone(),
        )))
    }

    /// Keytable segments hold keytables of every level; as compaction
    /// replaces them, a segment can be left with a few live keytables. The
    /// live keytables of a segment less than half used are copied unchanged
    /// (same id, same checksums) into the current keytable segment, and the
    /// old segment is released. Returns whether it moved anything.
    pub(crate) fn defragment_keytables(&self, st: &mut MaintState) -> Result<bool> {
        let version = self.sv.read().version.clone();
        let seg_pages = self.flash.geometry().pages_per_segment;
        let current = st.kt.current_segment();
        let mut used: std::collections::BTreeMap<flash::SegmentId, u32> = Default::default();
        for kt in version.all() {
            *used.entry(kt.seg.seg()).or_default() += kt.data_pages + kt.index_pages;
        }
        st.kt.keep_free = kt_reserve::OPTIONAL;
        let Some((&victim, _)) = used
            .iter()
            .filter(|(s, &p)| Some(**s) != current && p * 2 < seg_pages)
            .min_by_key(|(_, &p)| p)
        else {
            return Ok(false);
        };
        let mut levels = version.levels.clone();
        let mut moved = Vec::new();
        for level in levels.iter_mut() {
            for slot in level.iter_mut() {
                if slot.seg.seg() != victim {
                    continue;
                }
                let pages = slot.data_pages + slot.index_pages;
                let mut buf = flash::AlignedBuf::new_zeroed(pages as usize * self.page);
                let at = u64::from(slot.first_page) * self.page as u64;
                self.flash.read(victim, at, &mut buf)?;
                let (seg, first_page) =
                    match self.place_pages(st, &buf[..pages as usize * self.page]) {
                        Ok(p) => p,
                        Err(Error::NoSpace) => return Ok(false),
                        Err(e) => return Err(e),
                    };
                let copy = Arc::new(Keytable::new(
                    slot.id,
                    seg,
                    first_page,
                    slot.data_pages,
                    slot.index_pages,
                    slot.index.clone(),
                    slot.use_bloom.load(Ordering::Relaxed),
                    self.ctx.cache.clone(),
                ));
                moved.push(std::mem::replace(slot, copy));
            }
        }
        let next = Version {
            levels,
            runs: version.runs,
            run_writes: version.run_writes,
        };
        self.install(next, false);
        for old in &moved {
            old.moved.store(true, Ordering::Release);
        }
        drop(moved);
        self.checkpoint(st)?;
        Ok(true)
    }

    /// Persists the manifest in a flash checkpoint after releasing segments
    /// that no current structure references.
    pub(crate) fn checkpoint(&self, st: &mut MaintState) -> Result<()> {
        let released: Vec<_> = self.release_queue.lock().drain(..).collect();
        for seg in released {
            if st.kt.current_segment() == Some(seg) {
                continue;
            }
            self.flash.release(seg)?;
        }
        for seg in st.gc.take_ready() {
            self.vlog.remove_segment(seg);
            self.flash.release(seg)?;
            Counters::add(&self.counters.gc_segments_reclaimed, 1);
        }
        let manifest = self.manifest(st);
        self.flash.sync()?;
        self.flash.checkpoint(&manifest.encode())?;
        Counters::add(&self.counters.checkpoints, 1);
        Ok(())
    }

    /// The manifest describing the current state. The list of log segments
    /// is read before `FlashStore::checkpoint` snapshots the segment table,
    /// so a log segment allocated in between is Used there but not listed
    /// here; recovery accepts such a segment when a listed one links to it.
    pub(crate) fn manifest(&self, st: &MaintState) -> Manifest {
        let version = self.sv.read().version.clone();
        let levels = version
            .levels
            .iter()
            .map(|l| {
                l.iter()
                    .map(|kt| KeytableMeta {
                        id: kt.id,
                        seg: kt.seg.seg(),
                        first_page: kt.first_page,
                        data_pages: kt.data_pages,
                        index_pages: kt.index_pages,
                        smallest: kt.index.smallest.clone(),
                        largest: kt.index.largest.clone(),
                    })
                    .collect()
            })
            .collect();
        let device_now = self.flash.stats().device.bytes_written;
        Manifest {
            boot: st.boot,
            last_seq: st.flushed_seq,
            next_keytable_id: st.kt.next_id,
            replay: st.replay,
            log_segments: self.vlog.segments().into_iter().collect(),
            levels,
            runs: version.runs as u32,
            keytable_segment: st.kt.current_segment(),
            counters: PersistedCounters {
                user_bytes: self.user_bytes_base + Counters::get(&self.counters.user_bytes),
                device_bytes: self.device_bytes_base + device_now,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::{nand_device, small_db};
    use crate::{Db, Options};

    fn key(i: u32) -> Vec<u8> {
        format!("key{i:06}").into_bytes()
    }

    fn value(i: u32, round: u32) -> Vec<u8> {
        format!("value {i} of round {round} ")
            .repeat(4)
            .into_bytes()
    }

    /// Writes keys from `first` on (as round `round`) until the memtable is
    /// full; returns the key after the last written.
    fn fill_memtable(db: &Db, first: u32, round: u32) -> u32 {
        let mut i = first;
        while !db.inner.memtable_full() {
            db.put(&key(i), &value(i, round)).expect("put");
            i += 1;
        }
        i
    }

    /// A memtable that fills while the runs are merged into L1 is flushed
    /// between two of the merge's keytables; the merge installs its L1
    /// below that new run, which still shadows what it overwrote.
    #[test]
    fn a_memtable_that_fills_during_a_merge_is_flushed_on_top_of_it() {
        let dev = nand_device();
        let opts = Options::small_for_tests();
        let db = Db::open(dev.clone(), opts.clone()).expect("open");
        let mut next = 0;
        let mut rounds = Vec::new();
        for round in 0..super::RUNS_TO_MERGE as u32 {
            let end = fill_memtable(&db, next, round);
            rounds.push((next, end, round));
            next = end;
            db.inner.flush_now().expect("flush");
        }
        assert_eq!(db.stats().flushed_runs, super::RUNS_TO_MERGE);
        // The next memtable overwrites the first round's keys and is full
        // before the merge starts.
        let overwrite = 100;
        let end = fill_memtable(&db, 0, overwrite);
        assert!(end < next, "the overwrites stay within the first rounds");
        let merged = {
            let mut st = db.inner.maint.lock();
            db.inner.compact_one(&mut st).expect("merge")
        };
        assert!(merged);
        let s = db.stats();
        assert_eq!(s.flushes_during_merges, 1, "{s:?}");
        assert_eq!(s.flushed_runs, 1, "the flush left one run above L1");
        assert!(
            s.keytables_per_level[1] > 1,
            "the merge wrote several keytables"
        );
        let check = |db: &Db| {
            for i in 0..next {
                let round = rounds
                    .iter()
                    .find(|(a, b, _)| (*a..*b).contains(&i))
                    .map(|r| r.2)
                    .expect("a round wrote it");
                let want = if i < end {
                    value(i, overwrite)
                } else {
                    value(i, round)
                };
                let got = db.get(&key(i)).expect("get").map(|v| v.to_vec());
                assert_eq!(got, Some(want), "key {i}");
            }
            let scanned = db.scan(&[], &[], usize::MAX).expect("scan");
            assert_eq!(scanned.len(), next as usize);
        };
        check(&db);
        // As the manifest has it after a power cut.
        db.sync().expect("sync");
        dev.cut_power_now();
        drop(db);
        dev.power_cycle(7);
        let db = Db::open(dev, opts).expect("reopen");
        assert_eq!(db.stats().flushed_runs, 1);
        check(&db);
    }

    #[test]
    fn a_merge_without_writes_flushes_nothing() {
        let db = small_db();
        for round in 0..super::RUNS_TO_MERGE as u32 {
            fill_memtable(&db, round * 1000, round);
            db.inner.flush_now().expect("flush");
        }
        let mut st = db.inner.maint.lock();
        assert!(db.inner.compact_one(&mut st).expect("merge"));
        drop(st);
        let s = db.stats();
        assert_eq!((s.flushes_during_merges, s.flushed_runs), (0, 0), "{s:?}");
    }
}
