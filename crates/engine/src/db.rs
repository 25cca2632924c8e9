//! The database handle: the write path (value log + memtable), the read path
//! (memtable, then each level through the level index, Bloom filters and the
//! keytable cache, then one device read for the value), snapshots, batches
//! and statistics. Background work lives in `maint.rs`, `gc.rs`, recovery in
//! `recovery.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use flash::{Device, FlashStore, SegmentId};
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::iter::{EntryIter, LevelIter, MergeIter};
use crate::ktwriter::KeytableWriter;
use crate::memtable::Memtable;
use crate::options::{Durability, Options};
use crate::record::{FLAG_RELOCATED, KIND_DELETE, KIND_PUT};
use crate::signal::MaintSignal;
use crate::stats::{Counters, Stats};
use crate::types::{Entry, Kind, SeqNo, ValueBytes, ValuePtr};
use crate::version::{Finger, ReadCtx, Version};
use crate::vlog::{LogPosition, LogRecord, Reserve, ValueLog, MAX_BACKLOG as MAX_LOG_BACKLOG};

/// A walk for a caller that must not wait ([`DbInner::visible_entries`]
/// with `cached_only`) passes at most this many index entries per key
/// asked for, plus [`CACHED_WALK_SLACK`].
const CACHED_WALK_PER_KEY: usize = 4;
/// See [`CACHED_WALK_PER_KEY`].
const CACHED_WALK_SLACK: usize = 256;

/// Flush debt (see `flush_debt`) from which writers are slowed down.
const SLOW_DOWN_DEBT: f64 = 1.0;

/// Values a range scan reads from the device in one parallel batch.
const SCAN_READ_BATCH: usize = 256;
/// Times a read starts over after GC released a segment under it (each
/// retry finds the value where GC moved it; a second race needs another
/// whole GC round meanwhile).
const READ_RETRIES_AFTER_GC: usize = 8;

/// How often background threads retry writes that found the host file
/// system full.
pub(crate) const HOST_FULL_RETRY: Duration = Duration::from_millis(200);
/// How long a write out of space waits for GC to free a segment before it
/// fails with `NoSpace`.
const NOSPACE_WAIT: Duration = Duration::from_secs(5);
/// How long a writer refused for room waits at least, for the maintenance
/// round it woke (see `DbInner::maintenance_may_free`).
const FIRST_ROUND_WAIT: Duration = Duration::from_millis(100);

/// Whether a write may wait (for throttling, GC, device writes or syncs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It may block: the ordinary write path.
    Allowed,
    /// It must not: it gives up, writing nothing, where it would wait.
    Never,
}

/// One operation of an atomic write batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    /// Set `key` to `value`.
    Put(Bytes, Bytes),
    /// Set `key` to `head` followed by `body`, one value stored without
    /// first joining the two in memory (a short header before a body the
    /// caller received).
    PutParts {
        /// The key.
        key: Bytes,
        /// The value's first bytes.
        head: Bytes,
        /// The rest of the value.
        body: Bytes,
    },
    /// Delete `key`.
    Delete(Bytes),
}

/// The memtables and levels a reader sees, swapped atomically.
pub(crate) struct SuperVersion {
    pub(crate) mem: Arc<Memtable>,
    pub(crate) imm: Option<Arc<Memtable>>,
    pub(crate) version: Arc<Version>,
}

/// State owned by background work (serialized by `DbInner::maint`).
pub(crate) struct MaintState {
    pub(crate) boot: u64,
    /// Where new keytables are written (next id, current segment, reserve).
    pub(crate) kt: KeytableWriter,
    /// Log position and last sequence of the last flushed memtable.
    pub(crate) replay: LogPosition,
    pub(crate) flushed_seq: SeqNo,
    /// Position captured when `imm` was frozen.
    pub(crate) imm_replay: Option<(LogPosition, SeqNo)>,
    /// GC's victims between passes (`gc.rs`).
    pub(crate) gc: crate::gc::GcVictims,
    /// Per level, the key after which the next compaction starts.
    pub(crate) compact_cursor: Vec<Bytes>,
    /// Compactions forced by low space since space was last plentiful.
    pub(crate) forced_compactions: usize,
}

/// Lock order: `maint` (held through whole flush, compaction and GC
/// rounds), then the value log's locks (`vlog`: io, inner, sync; see
/// `vlog.rs`), then the superversion `sv` (taken inside the log lock, so the
/// memtable sees records in log order). Writers never take `maint`; they
/// wake maintenance instead.
pub(crate) struct DbInner {
    pub(crate) opts: Options,
    pub(crate) flash: Arc<FlashStore>,
    pub(crate) vlog: ValueLog,
    pub(crate) ctx: ReadCtx,
    pub(crate) sv: RwLock<Arc<SuperVersion>>,
    pub(crate) visible_seq: AtomicU64,
    pub(crate) snapshots: Mutex<BTreeMap<SeqNo, usize>>,
    pub(crate) maint: Mutex<MaintState>,
    pub(crate) release_queue: Arc<Mutex<Vec<SegmentId>>>,
    pub(crate) counters: Counters,
    pub(crate) page: usize,
    /// Wake-ups, flush notices and the stop flag between writers,
    /// maintenance and `close` (`signal.rs`).
    pub(crate) signal: MaintSignal,
    pub(crate) bg_error: Mutex<Option<String>>,
    /// Set when the checkpoint that opening writes (recording the new log
    /// and boot number) failed for want of host space: until maintenance
    /// writes it, writes are refused, since a crash would lose the way to
    /// this run's log.
    pub(crate) boot_checkpoint: Mutex<Option<String>>,
    /// Free segments as last seen by maintenance (cheap to read per write).
    pub(crate) free_hint: AtomicU32,
    /// Lifetime byte counters as of open (from the manifest), to which this
    /// run's counters add. Fixed after open, so stats never wait for the
    /// maintenance lock (held through whole flush/GC/compaction rounds).
    pub(crate) device_bytes_base: u64,
    pub(crate) user_bytes_base: u64,
}

/// A LightStore engine instance on one flash device.
pub struct Db {
    pub(crate) inner: Arc<DbInner>,
    threads: Vec<JoinHandle<()>>,
    /// Serializes conditional batches per key (see `conditional.rs`).
    pub(crate) key_locks: crate::conditional::KeyLocks,
}

/// A consistent read view at one sequence number. Compaction keeps every
/// version it needs while it lives.
pub struct Snapshot {
    seq: SeqNo,
    inner: Arc<DbInner>,
}

impl Snapshot {
    /// The sequence number this snapshot reads at.
    pub fn seq(&self) -> SeqNo {
        self.seq
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut s = self.inner.snapshots.lock();
        if let Some(n) = s.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                s.remove(&self.seq);
            }
        }
    }
}

impl Db {
    /// Opens (formatting if blank) the store on `device`. Opening always
    /// works after a crash: the log tail is scanned and cut at the first
    /// record that fails its checksum.
    pub fn open(device: Arc<dyn Device>, opts: Options) -> Result<Db> {
        let inner = Arc::new(crate::recovery::open(device, opts)?);
        let mut threads = Vec::new();
        if inner.opts.background {
            let bg = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("ls-maint".into())
                    .spawn(move || bg.background_loop())?,
            );
            let log = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("ls-log".into())
                    .spawn(move || log.log_writer_loop())?,
            );
        }
        if let Durability::Interval(every) = inner.opts.durability {
            let bg = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("ls-sync".into())
                    .spawn(move || bg.sync_loop(every))?,
            );
        }
        Ok(Db {
            inner,
            threads,
            key_locks: crate::conditional::KeyLocks::new(),
        })
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner
            .write(&[(KIND_PUT, key, ValueBytes::whole(value))])
    }

    /// Deletes `key` (no error if absent).
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.inner
            .write(&[(KIND_DELETE, key, ValueBytes::default())])
    }

    /// Applies all operations atomically: after a crash either all or none
    /// are visible.
    pub fn write_batch(&self, ops: &[BatchOp]) -> Result<()> {
        self.inner.write(&batch_records(ops))
    }

    /// Applies `ops` atomically like [`Db::write_batch`], but only if that
    /// needs no waiting: not under `sync` durability, not while writers are
    /// being slowed down for flushing or low space, not while the log's
    /// write-behind backlog is full, and not when the log is out of space.
    /// Returns `Ok(false)` with nothing written in those cases, so that a
    /// caller which must not block (a network thread) can hand the write to
    /// a thread that may wait. The only other wait is the log lock, held
    /// briefly by other appends. An error also means nothing was written.
    pub fn try_write_batch(&self, ops: &[BatchOp]) -> Result<bool> {
        self.inner.write_with(&batch_records(ops), Wait::Never)
    }

    /// The current value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.inner.get_at(key, None)
    }

    /// The value of `key` as of `snap`.
    pub fn get_at(&self, key: &[u8], snap: &Snapshot) -> Result<Option<Bytes>> {
        self.inner.get_at(key, Some(snap.seq))
    }

    /// Values of several keys, all at one sequence number.
    pub fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        let all = [keys.len()];
        let mut groups = self.inner.multi_get_at(keys, &all, usize::MAX, None)?;
        Ok(groups.pop().unwrap_or_default())
    }

    /// [`Db::multi_get`] that bounds the bytes it reads: `keys` come in
    /// consecutive groups of `group_lens` keys (which must add up to
    /// `keys.len()`), and in each group values are read in key order while
    /// the group's records stay within `max_bytes`, always at least the
    /// first value. Returns per group the answers to the prefix of its keys
    /// that fit; the caller asks for the rest later. (A record is a little
    /// larger than its value: the bound is on record bytes.)
    pub fn multi_get_bounded(
        &self,
        keys: &[&[u8]],
        group_lens: &[usize],
        max_bytes: usize,
    ) -> Result<Vec<Vec<Option<Bytes>>>> {
        if group_lens.iter().sum::<usize>() != keys.len() {
            return Err(Error::InvalidArgument(
                "multi_get_bounded: group lengths do not add up to the keys".into(),
            ));
        }
        self.inner.multi_get_at(keys, group_lens, max_bytes, None)
    }

    /// Up to `limit` pairs with `start <= key < end` (`end` empty = no bound),
    /// in key order, at one sequence number.
    pub fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.scan_at(start, end, limit, usize::MAX, None)
    }

    /// [`Db::scan`] that refuses, with [`Error::TooLarge`] and before
    /// reading any value, when the pairs' keys and records add up to more
    /// than `max_bytes`: for callers that must bound one reply's memory.
    pub fn scan_bounded(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner.scan_at(start, end, limit, max_bytes, None)
    }

    /// Like [`Db::scan`] but returns only the keys, reading no value from
    /// the device (index and keytable blocks only).
    pub fn scan_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        self.inner.scan_keys_at(start, end, limit, usize::MAX, None)
    }

    /// [`Db::scan_keys`] that fails with [`Error::TooLarge`] once the keys
    /// found add up to more than `max_bytes`.
    pub fn scan_keys_bounded(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>> {
        self.inner.scan_keys_at(start, end, limit, max_bytes, None)
    }

    /// Like [`Db::scan`], as of `snap`.
    pub fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        snap: &Snapshot,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.inner
            .scan_at(start, end, limit, usize::MAX, Some(snap.seq))
    }

    /// A read snapshot at the current sequence number.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.inner.snapshots.lock();
        let seq = self.inner.visible_seq.load(Ordering::Acquire);
        *s.entry(seq).or_insert(0) += 1;
        Snapshot {
            seq,
            inner: self.inner.clone(),
        }
    }

    /// Makes every acknowledged write durable now.
    pub fn sync(&self) -> Result<()> {
        self.inner.vlog.sync_all()
    }

    /// Runs flush, compaction and GC until no work is due (tests and tools;
    /// the background thread does this on its own).
    pub fn maintenance(&self) -> Result<()> {
        self.inner.maintenance()
    }

    /// Flushes the memtable to L1 now (merging the flushed runs into it).
    pub fn flush(&self) -> Result<()> {
        self.inner.flush_into_l1()
    }

    /// Runs one value-GC pass now, even below the automatic thresholds;
    /// returns the number of segments cleaned.
    pub fn gc(&self) -> Result<usize> {
        self.inner.gc_pass(true)
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Stops background threads, flushes the memtable and writes a final
    /// checkpoint, so the next open has no log to replay.
    ///
    /// On a full host file system ([`Error::HostFull`]) the flush is left to
    /// the next open's log replay. Under `sync` durability that loses
    /// nothing acknowledged (what waits in memory was refused); otherwise
    /// acknowledged writes still in memory are lost, and close says so.
    pub fn close(mut self) -> Result<()> {
        self.stop_threads();
        match self.inner.vlog.sync_all() {
            Err(Error::HostFull(why)) if self.inner.opts.durability == Durability::Sync => {
                tracing::warn!(error = %why, "close: host full, refused writes left unwritten");
                return Ok(());
            }
            Err(Error::HostFull(why)) => {
                return Err(Error::Stopped(format!(
                    "closed with the host file system full: writes acknowledged \
                     since the last sync are lost ({why})"
                )))
            }
            other => other?,
        }
        match self.inner.flush_now() {
            Err(Error::HostFull(why)) => {
                tracing::warn!(error = %why, "close: the final flush does not fit, the next open replays the log");
                Ok(())
            }
            other => other,
        }
    }

    fn stop_threads(&mut self) {
        self.inner.signal.stop();
        self.inner.vlog.wake_writer();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// The largest value the store accepts.
    pub fn max_value_size(&self) -> usize {
        self.inner.opts.max_value_size
    }

    /// The longest key the store accepts.
    pub fn max_key_size(&self) -> usize {
        self.inner.opts.max_key_size
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.stop_threads();
        let _ = self.inner.vlog.sync_all();
    }
}

/// A batch's operations as `(kind, key, value)` log records.
pub(crate) fn batch_records<'o>(
    ops: impl IntoIterator<Item = &'o BatchOp>,
) -> Vec<(u8, &'o [u8], ValueBytes<'o>)> {
    ops.into_iter()
        .map(|op| match op {
            BatchOp::Put(k, v) => (KIND_PUT, &k[..], ValueBytes::whole(v)),
            BatchOp::PutParts { key, head, body } => {
                (KIND_PUT, &key[..], ValueBytes { head, body })
            }
            BatchOp::Delete(k) => (KIND_DELETE, &k[..], ValueBytes::default()),
        })
        .collect()
}

impl DbInner {
    fn check_sizes(&self, key: &[u8], value: ValueBytes<'_>) -> Result<()> {
        if key.is_empty() || key.len() > self.opts.max_key_size {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.opts.max_key_size,
            });
        }
        if value.len() > self.opts.max_value_size {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.opts.max_value_size,
            });
        }
        Ok(())
    }

    pub(crate) fn write(&self, ops: &[(u8, &[u8], ValueBytes<'_>)]) -> Result<()> {
        self.write_with(ops, Wait::Allowed).map(|_| ())
    }

    /// Writes `ops` as one atomic batch. With [`Wait::Never`] it returns
    /// `Ok(false)`, having written nothing, where it would have to wait;
    /// once its records are appended it returns `Ok(true)`.
    pub(crate) fn write_with(
        &self,
        ops: &[(u8, &[u8], ValueBytes<'_>)],
        wait: Wait,
    ) -> Result<bool> {
        match self.append_ops(ops, wait, false)? {
            None => Ok(false),
            Some(lsn) => {
                self.wait_durable(lsn)?;
                Ok(true)
            }
        }
    }

    /// Waits until the log is durable up to `lsn` if the durability option
    /// promises that on return (`sync`); else returns at once.
    pub(crate) fn wait_durable(&self, lsn: u64) -> Result<()> {
        if self.opts.durability == Durability::Sync {
            self.vlog.sync_to(lsn)?;
        }
        Ok(())
    }

    /// The log position a caller must wait for (see [`Self::wait_durable`])
    /// so that everything visible now is as durable as promised.
    pub(crate) fn visible_lsn(&self) -> u64 {
        self.vlog.appended_lsn()
    }

    /// [`Self::write_with`] up to, not including, the wait for durability:
    /// `Some(lsn)` to pass to [`Self::wait_durable`] once the records are
    /// appended (and visible to readers), `None` where [`Wait::Never`]
    /// would have had to wait (nothing written).
    ///
    /// `delete_reserve` lets the batch write into the delete reserve
    /// whatever it holds (the caller checked that it adds little: see
    /// [`crate::conditional::Room`]); deletes alone always may.
    pub(crate) fn append_ops(
        &self,
        ops: &[(u8, &[u8], ValueBytes<'_>)],
        wait: Wait,
        delete_reserve: bool,
    ) -> Result<Option<u64>> {
        if ops.is_empty() {
            return Ok(Some(0));
        }
        // Before the background error the failure may also have caused:
        // the caller is told the device failed, not just "stopped".
        if let Some(why) = self.vlog.failure() {
            return Err(Error::DeviceFailed(why));
        }
        if let Some(e) = self.bg_error.lock().clone() {
            return Err(Error::Stopped(e));
        }
        if let Some(why) = self.boot_checkpoint.lock().clone() {
            return Err(Error::HostFull(why));
        }
        let mut user_bytes = 0u64;
        for (_, k, v) in ops {
            self.check_sizes(k, *v)?;
            user_bytes += (k.len() + v.len()) as u64;
        }
        match wait {
            Wait::Allowed => self.throttle()?,
            Wait::Never if self.write_would_wait(user_bytes) => return Ok(None),
            Wait::Never => {}
        }
        let recs: Vec<LogRecord<'_>> = ops
            .iter()
            .map(|(kind, k, v)| LogRecord {
                kind: *kind,
                flags: 0,
                key: k,
                value: *v,
                seq: None,
            })
            .collect();
        let n = ops.len();
        // Deletes free space, so they may use the segments held back for GC;
        // so do an upper layer's tombstones (`Options::tombstone_tag`).
        let is_tombstone = |v: &ValueBytes<'_>| {
            v.len() == 1 + crate::tag::TAG_LEN
                && crate::tag::tag_of_parts(*v)
                    .is_some_and(|tag| self.opts.tombstone_tag == Some(tag[0]))
        };
        let reserve = if delete_reserve
            || ops
                .iter()
                .all(|(kind, _, v)| *kind == KIND_DELETE || (*kind == KIND_PUT && is_tombstone(v)))
        {
            Reserve::Delete
        } else {
            Reserve::User
        };
        let append = || {
            // A deep GC pass counts on the room its victim fits in:
            // ordinary writes leave it that and a margin, or wait for the
            // pass (`deeppass.rs`).
            if reserve == Reserve::User
                && self.flash.free_segments() < self.signal.deep_pass_floor()
            {
                return Err(Error::NoSpace);
            }
            self.vlog.append(&recs, reserve, |i, seq, ptr| {
                let kind = if ops[i].0 == KIND_PUT {
                    Kind::Put
                } else {
                    Kind::Delete
                };
                let tag = if kind == Kind::Put {
                    crate::tag::Tagging::of_parts(ops[i].2)
                } else {
                    crate::tag::Tagging::Unknown
                };
                self.sv.read().mem.insert(ops[i].1, seq, kind, ptr, tag);
                if i + 1 == n {
                    self.visible_seq.fetch_max(seq, Ordering::AcqRel);
                }
            })
        };
        let lsn = match wait {
            Wait::Allowed => self.retry_while_gc_can_free(reserve == Reserve::Delete, append)?,
            Wait::Never => match append() {
                Err(Error::NoSpace) => return Ok(None),
                other => other?,
            },
        };
        Counters::add(&self.counters.user_bytes, user_bytes);
        if self.memtable_full() {
            self.wake();
        }
        if wait == Wait::Never {
            // Checked before the append: the backlog was not full, and
            // the durability needs no sync.
            return Ok(Some(lsn));
        }
        match self.write_behind() {
            // The records are appended, and under `interval` durability
            // that is the promise: the write-behind thread writes them
            // once the host has room again (appends stop meanwhile).
            Err(Error::HostFull(_)) if self.opts.durability != Durability::Sync => {}
            other => other?,
        }
        Ok(Some(lsn))
    }

    /// True if a write now would wait: for a device sync (`sync`
    /// durability), for its own chunk writes (no background threads), in
    /// [`Self::throttle`], or to help the write-behind thread because its
    /// `bytes` would fill the backlog of sealed chunks.
    fn write_would_wait(&self, bytes: u64) -> bool {
        let chunks = 1 + bytes as usize / self.opts.log_chunk_bytes.max(1);
        self.opts.durability == Durability::Sync
            || !self.opts.background
            || self.free_hint_low()
            || self.flush_debt() >= SLOW_DOWN_DEBT
            || self.vlog.backlog() + chunks >= MAX_LOG_BACKLOG
    }

    /// Re-inserts a live value found by GC, keeping its sequence number.
    pub(crate) fn relocate(
        &self,
        key: &[u8],
        value: &[u8],
        seq: SeqNo,
        reserve: Reserve,
    ) -> Result<()> {
        let rec = LogRecord {
            kind: KIND_PUT,
            flags: FLAG_RELOCATED,
            key,
            value: ValueBytes::whole(value),
            seq: Some(seq),
        };
        self.vlog.append(&[rec], reserve, |_, seq, ptr| {
            let mem = &self.sv.read().mem;
            mem.insert(key, seq, Kind::Put, ptr, crate::tag::Tagging::of(value));
            mem.note_relocated();
        })?;
        self.write_behind()
    }

    /// Sealed log chunks are written by the `ls-log` thread while writers go
    /// on appending; a writer helps (and so waits) only when the backlog is
    /// deep. Without background threads, writers write them inline.
    fn write_behind(&self) -> Result<()> {
        let backlog = self.vlog.backlog();
        if !self.opts.background {
            if backlog > 0 {
                self.vlog.write_pending(false)?;
            }
        } else if backlog >= MAX_LOG_BACKLOG {
            self.vlog.write_pending(true)?;
        }
        Ok(())
    }

    fn log_writer_loop(&self) {
        while !self.signal.stopping() {
            self.vlog.wait_for_chunks(Duration::from_millis(20));
            match self.vlog.write_pending(true) {
                Ok(()) => {}
                // The log logged it; retry until the host has room again.
                Err(Error::HostFull(_)) => std::thread::sleep(HOST_FULL_RETRY),
                Err(e) => {
                    tracing::error!(error = %e, "value log write failed");
                    *self.bg_error.lock() = Some(e.to_string());
                    return;
                }
            }
        }
    }

    pub(crate) fn memtable_full(&self) -> bool {
        let sv = self.sv.read();
        sv.mem.bytes() >= self.opts.memtable_bytes
            || sv.mem.log_bytes() >= self.opts.memtable_log_bytes
    }

    /// How far behind flushing is: the active memtable's fill (by keys or
    /// by log bytes), plus one half while a frozen one is still being
    /// written. [`SLOW_DOWN_DEBT`] is where writers start to be slowed down.
    fn flush_debt(&self) -> f64 {
        let sv = self.sv.read();
        let by_keys = sv.mem.bytes() as f64 / self.opts.memtable_bytes as f64;
        let by_log = sv.mem.log_bytes() as f64 / self.opts.memtable_log_bytes as f64;
        by_keys.max(by_log) + if sv.imm.is_some() { 0.5 } else { 0.0 }
    }

    /// Runs `append` and, while it fails for want of space and the log
    /// holds a segment that GC would clean, wakes GC and tries again, for
    /// at most [`NOSPACE_WAIT`]: a writer faster than GC waits for it
    /// rather than failing on a device that is not full of live data. It
    /// also waits while earlier deletes and overwrites have not met the
    /// versions they hide yet: while the memtables hold entries or flushed
    /// runs wait for their merge into L1, which maintenance runs first when
    /// space is low and which turns the values they dropped into garbage
    /// GC can clean. Until then the log counts those values as live, so no
    /// segment looks reclaimable: a block volume overwritten at device
    /// speed filled an 8 GiB node holding 2 GiB of live data and its
    /// writes failed with GC never run (each delete under `sync`
    /// durability also takes a page of the delete reserve, which deletes
    /// alone would exhaust). On a device full of live data maintenance
    /// flushes and merges within moments and writes then fail at once. Any
    /// write also waits while released segments wait for the checkpoint
    /// that frees them. On a full host file system only deletes wait (for
    /// the reserve; see [`Self::out_of_segments`]). A failed append changed
    /// nothing (it fails before writing a record).
    fn retry_while_gc_can_free<T>(
        &self,
        deletes: bool,
        mut append: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let started = std::time::Instant::now();
        let deadline = started + NOSPACE_WAIT;
        loop {
            let appended = append();
            if let Err(Error::NoSpace | Error::HostFull(_)) = &appended {
                self.signal.want_space();
            }
            match appended {
                Err(e)
                    if self.out_of_segments(&e, deletes)
                        && self.opts.background
                        && (self.vlog.has_reclaimable(self.low_space_gc_threshold())
                            || self.maintenance_may_free(started)
                            // GC's deep pass last found a segment to
                            // clean and the room to relocate it into.
                            || self.signal.deep_pass_possible()
                            || self.unmerged_writes_may_free()
                            || self.flash.pending_free_segments() > 0)
                        && std::time::Instant::now() < deadline
                        && !self.signal.stopping()
                        && self.bg_error.lock().is_none() =>
                {
                    self.wake();
                    std::thread::sleep(Duration::from_millis(2));
                    Counters::add(&self.counters.write_throttle_micros, 2_000);
                }
                other => return other,
            }
        }
    }

    /// True for an append that found too few free segments and may wait
    /// for maintenance to free some: the device's (`NoSpace`), or, for
    /// deletes while the host file system is full, the backed ones
    /// (`HostFull` from the allocation). Other writes on a full host fail
    /// at once: what GC frees goes to the reserve first. Never for a log
    /// stalled on a chunk write, which only host room ends.
    fn out_of_segments(&self, e: &Error, deletes: bool) -> bool {
        match e {
            Error::NoSpace => true,
            Error::HostFull(_) => {
                deletes && self.flash.host_full() && self.vlog.stalled().is_none()
            }
            _ => false,
        }
    }

    /// Whether deletes and overwrites may still release values for GC once
    /// maintenance flushes and merges what it holds (see
    /// [`Self::retry_while_gc_can_free`]).
    fn unmerged_writes_may_free(&self) -> bool {
        self.sv.read().imm.is_some() || self.pending_writes(true).1 > 0
    }

    /// Whether a maintenance round woken by a writer refused for room may
    /// still give room: during the first [`FIRST_ROUND_WAIT`] of its wait
    /// (the round it woke has not looked yet) and while a round runs. A
    /// writer used to fail at once when it checked between the round that
    /// merged and the GC pass that cleaned (an overwritten small data set
    /// failed so, with the machine's two cores busy).
    fn maintenance_may_free(&self, waiting_since: std::time::Instant) -> bool {
        waiting_since.elapsed() < FIRST_ROUND_WAIT || self.maint.is_locked()
    }

    /// Whether `free` segments is low, or the host file system is full
    /// (then only its backed segments can be written, and what GC frees
    /// gives it room back): writes then yield time to GC, maintenance
    /// flushes what deletes left in memory, and GC accepts smaller gains.
    pub(crate) fn low_on_free(&self, free: u32) -> bool {
        free <= self.opts.reserved_segments + 2 || self.flash.host_full()
    }

    /// [`Self::low_on_free`] for the free count maintenance last saw (cheap
    /// to read per write).
    fn free_hint_low(&self) -> bool {
        self.low_on_free(self.free_hint.load(Ordering::Relaxed))
    }

    /// The live fraction below which GC cleans a segment when space is low.
    pub(crate) fn low_space_gc_threshold(&self) -> f64 {
        self.opts.gc_live_threshold.max(0.75)
    }

    /// Smooth backpressure: when flushing falls behind (maintenance busy with
    /// a compaction, or a frozen memtable still being written), each write is
    /// delayed a little, more the further behind it is (up to 1.5 ms); only
    /// far past the limit do writers wait for the flush. Short of free space,
    /// writes also yield some time to GC.
    ///
    /// The wait for the flush is bounded by [`Options::max_write_stall`]:
    /// past it the write fails with [`Error::WriteStall`] (nothing written)
    /// rather than waiting for a flush that is not finishing.
    fn throttle(&self) -> Result<()> {
        if !self.opts.background {
            return Ok(());
        }
        if self.free_hint_low() {
            self.wake();
            std::thread::sleep(Duration::from_micros(500));
            Counters::add(&self.counters.write_throttle_micros, 500);
        }
        let debt = self.flush_debt();
        if debt < SLOW_DOWN_DEBT {
            return Ok(());
        }
        self.wake();
        if debt < 2.5 {
            let micros = ((debt - SLOW_DOWN_DEBT) * 1000.0) as u64;
            std::thread::sleep(Duration::from_micros(micros));
            Counters::add(&self.counters.write_throttle_micros, micros);
            return Ok(());
        }
        let deadline = std::time::Instant::now() + self.opts.max_write_stall;
        let mut w = self.signal.hold();
        while self.flush_debt() >= 2.5 && !self.signal.stopping() {
            if self.bg_error.lock().is_some() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::WriteStall(self.opts.max_write_stall));
            }
            self.signal.wait_flushed(&mut w, Duration::from_millis(10));
            Counters::add(&self.counters.write_throttle_micros, 10_000);
        }
        Ok(())
    }

    pub(crate) fn wake(&self) {
        self.signal.wake();
    }

    /// The structures a read searches and the sequence number it reads at:
    /// `at` (a registered snapshot's), or the latest visible one.
    ///
    /// The latest number is loaded *after* the structures. A flush or
    /// compaction drops a version only when a newer one at or below the
    /// visible number of its time hides it; loaded after the structures it
    /// installed, the read's number is at least that, so the version the
    /// read resolves to is never one it dropped. Loaded before, a flush in
    /// between could drop the only version at or below it, and the key
    /// would read as missing.
    pub(crate) fn read_view(&self, at: Option<SeqNo>) -> (Arc<SuperVersion>, SeqNo) {
        let sv = self.sv.read().clone();
        let seq = at.unwrap_or_else(|| self.visible_seq.load(Ordering::Acquire));
        (sv, seq)
    }

    /// Newest entry for `key` at or below `seq` across memtables and levels.
    pub(crate) fn lookup(&self, key: &[u8], seq: SeqNo) -> Result<Option<Entry>> {
        let sv = self.sv.read().clone();
        self.lookup_in(&sv, key, seq)
    }

    /// [`Self::lookup`] in the given structures.
    pub(crate) fn lookup_in(
        &self,
        sv: &SuperVersion,
        key: &[u8],
        seq: SeqNo,
    ) -> Result<Option<Entry>> {
        self.lookup_near(sv, key, seq, &mut Finger::default())
    }

    /// [`Self::lookup_in`] from where `finger` says the last lookup in
    /// `sv`'s levels was found (see [`Finger`]).
    pub(crate) fn lookup_near(
        &self,
        sv: &SuperVersion,
        key: &[u8],
        seq: SeqNo,
        finger: &mut Finger,
    ) -> Result<Option<Entry>> {
        if let Some(e) = sv.mem.get(key, seq) {
            return Ok(Some(e));
        }
        if let Some(imm) = &sv.imm {
            if let Some(e) = imm.get(key, seq) {
                return Ok(Some(e));
            }
        }
        sv.version.get_near(key, seq, &self.ctx, finger)
    }

    /// Whether a value read that failed should start over from the lookup:
    /// GC relocated a value and released its segment between the lookup
    /// that returned `ptrs` and the read of the value (which then found a
    /// trimmed or reused segment). The next lookup finds the relocated value.
    /// Any other failure, or one that keeps happening, is reported.
    fn read_raced_gc(&self, tries: &mut usize, mut ptrs: impl Iterator<Item = ValuePtr>) -> bool {
        *tries += 1;
        *tries <= READ_RETRIES_AFTER_GC && ptrs.any(|p| self.vlog.is_reclaimed(p))
    }

    /// The value of `key` at `at` (None: latest).
    pub(crate) fn get_at(&self, key: &[u8], at: Option<SeqNo>) -> Result<Option<Bytes>> {
        let before = self.ctx.block_reads.load(Ordering::Relaxed);
        let mut tries = 0;
        let result = loop {
            let (sv, seq) = self.read_view(at);
            match self.lookup_in(&sv, key, seq)? {
                Some(e) if e.kind == Kind::Put => match self.vlog.read_value(e.ptr, key) {
                    Ok((v, device)) => {
                        if device {
                            Counters::add(&self.counters.get_device_reads, 1);
                        }
                        break Some(v);
                    }
                    Err(_) if self.read_raced_gc(&mut tries, std::iter::once(e.ptr)) => continue,
                    Err(err) => return Err(err),
                },
                _ => break None,
            }
        };
        let block_reads = self.ctx.block_reads.load(Ordering::Relaxed) - before;
        Counters::add(&self.counters.get_device_reads, block_reads);
        Counters::add(&self.counters.gets, 1);
        Ok(result)
    }

    /// Looks all keys up, then reads their values in one parallel batch.
    ///
    /// Keys come in consecutive groups of `group_lens`; a group's values
    /// are read only while its record bytes stay within `max_bytes` (at
    /// least its first value), and it is answered up to that point. The
    /// cut is decided afresh on every attempt, from that attempt's lookups.
    pub(crate) fn multi_get_at(
        &self,
        keys: &[&[u8]],
        group_lens: &[usize],
        max_bytes: usize,
        at: Option<SeqNo>,
    ) -> Result<Vec<Vec<Option<Bytes>>>> {
        let before = self.ctx.block_reads.load(Ordering::Relaxed);
        let mut tries = 0;
        let (found, ends, values) = loop {
            let (sv, seq) = self.read_view(at);
            let mut found = Vec::new(); // (key index, entry)
            let mut ends = Vec::with_capacity(group_lens.len()); // answered up to
            let mut finger = Finger::default();
            let mut first = 0;
            for &len in group_lens {
                let mut used = 0usize;
                let mut end = first;
                while end < first + len {
                    if let Some(e) = self.lookup_near(&sv, keys[end], seq, &mut finger)? {
                        if e.kind == Kind::Put {
                            let size = e.ptr.len as usize;
                            if used > 0 && used.saturating_add(size) > max_bytes {
                                break;
                            }
                            used = used.saturating_add(size);
                            found.push((end, e));
                        }
                    }
                    end += 1;
                }
                ends.push((first, end));
                first += len;
            }
            let reqs: Vec<_> = found.iter().map(|(i, e)| (e.ptr, keys[*i])).collect();
            match self.vlog.read_values(&reqs) {
                Ok(values) => break (found, ends, values),
                Err(_) if self.read_raced_gc(&mut tries, reqs.iter().map(|r| r.0)) => continue,
                Err(err) => return Err(err),
            }
        };
        let mut out = vec![None; keys.len()];
        let mut device_reads = self.ctx.block_reads.load(Ordering::Relaxed) - before;
        for ((i, _), (v, from_device)) in found.iter().zip(values) {
            device_reads += u64::from(from_device);
            out[*i] = Some(v);
        }
        let answered: usize = ends.iter().map(|(first, end)| end - first).sum();
        Counters::add(&self.counters.get_device_reads, device_reads);
        Counters::add(&self.counters.gets, answered as u64);
        Ok(ends
            .into_iter()
            .map(|(first, end)| out[first..end].to_vec())
            .collect())
    }

    pub(crate) fn scan_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
        at: Option<SeqNo>,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        // Collect the visible entries first, then read their values in
        // parallel batches: a range of N values costs about N / queue depth
        // device reads' time, not N.
        let mut tries = 0;
        'scan: loop {
            let (sv, seq) = self.read_view(at);
            let found = self.visible_entries(&sv, start, end, limit, seq, max_bytes, true, None)?;
            let mut out = Vec::with_capacity(found.len());
            for chunk in found.chunks(SCAN_READ_BATCH) {
                let reqs: Vec<_> = chunk.iter().map(|e| (e.ptr, &e.key[..])).collect();
                let values = match self.vlog.read_values(&reqs) {
                    Ok(values) => values,
                    Err(_) if self.read_raced_gc(&mut tries, reqs.iter().map(|r| r.0)) => {
                        continue 'scan;
                    }
                    Err(err) => return Err(err),
                };
                out.extend(
                    chunk
                        .iter()
                        .zip(values)
                        .map(|(e, (v, _))| (e.key.clone(), v)),
                );
            }
            return Ok(out);
        }
    }

    /// Up to `limit` live keys in `[start, end)` as of `at` (None:
    /// latest), without reading any value.
    pub(crate) fn scan_keys_at(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
        at: Option<SeqNo>,
    ) -> Result<Vec<Bytes>> {
        let (sv, seq) = self.read_view(at);
        Ok(self
            .visible_entries(&sv, start, end, limit, seq, max_bytes, false, None)?
            .into_iter()
            .map(|e| e.key)
            .collect())
    }

    /// The newest version as of `seq` of up to `limit` live keys in
    /// `[start, end)` (empty `end`: unbounded), in key order.
    ///
    /// Fails with [`Error::TooLarge`] as soon as the keys found (and, with
    /// `with_values`, their records) add up to more than `max_bytes`.
    ///
    /// With `cached_only`, keytable blocks come from the cache alone, and
    /// the walk passes at most [`CACHED_WALK_PER_KEY`] index entries per
    /// key asked for plus [`CACHED_WALK_SLACK`] (older versions, deletions):
    /// at the first block the cache lacks or past that many entries,
    /// `cached_only` is set and the answer is incomplete (the caller drops
    /// it). A caller that must not wait gets a bounded amount of work.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn visible_entries(
        &self,
        sv: &SuperVersion,
        start: &[u8],
        end: &[u8],
        limit: usize,
        seq: SeqNo,
        max_bytes: usize,
        with_values: bool,
        cached_only: Option<&AtomicBool>,
    ) -> Result<Vec<Entry>> {
        let mut sources: Vec<EntryIter<'_>> = vec![Box::new(sv.mem.iter_from(start).map(Ok))];
        if let Some(imm) = &sv.imm {
            sources.push(Box::new(imm.iter_from(start).map(Ok)));
        }
        for level in &sv.version.levels {
            sources.push(match cached_only {
                Some(declined) => {
                    Box::new(LevelIter::cached(level.clone(), start, &self.ctx, declined))
                }
                None => Box::new(LevelIter::new(level.clone(), start, &self.ctx)),
            });
        }
        let walk_at_most = match cached_only {
            Some(_) => limit
                .saturating_mul(CACHED_WALK_PER_KEY)
                .saturating_add(CACHED_WALK_SLACK),
            None => usize::MAX,
        };
        let mut found = Vec::new();
        let mut bytes = 0usize;
        let mut last_key: Option<Bytes> = None;
        for (walked, e) in MergeIter::new(sources).enumerate() {
            if walked >= walk_at_most {
                if let Some(declined) = cached_only {
                    declined.store(true, Ordering::Relaxed);
                }
                break;
            }
            let e = e?;
            if !end.is_empty() && e.key.as_ref() >= end {
                break;
            }
            if found.len() >= limit {
                break;
            }
            if e.seq > seq || last_key.as_ref() == Some(&e.key) {
                continue;
            }
            last_key = Some(e.key.clone());
            if e.kind == Kind::Put {
                let value = if with_values { e.ptr.len as usize } else { 0 };
                bytes = bytes.saturating_add(e.key.len()).saturating_add(value);
                if bytes > max_bytes {
                    return Err(Error::TooLarge { max: max_bytes });
                }
                found.push(e);
            }
        }
        Ok(found)
    }

    /// Sequence numbers compaction must keep versions for, oldest first.
    pub(crate) fn oldest_snapshot(&self) -> SeqNo {
        let s = self.snapshots.lock();
        s.keys()
            .next()
            .copied()
            .unwrap_or_else(|| self.visible_seq.load(Ordering::Acquire))
    }

    pub(crate) fn snapshot_seqs(&self) -> Vec<SeqNo> {
        self.snapshots.lock().keys().copied().collect()
    }

    fn sync_loop(&self, every: Duration) {
        while !self.signal.stopping() {
            // Sleep in short steps: a long interval must not hold up close.
            let due = std::time::Instant::now() + every;
            while !self.signal.stopping() {
                let left = due.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
            match self.vlog.sync_all() {
                // The write-behind thread retries; the next round syncs.
                Ok(()) | Err(Error::HostFull(_)) => {}
                Err(e) => {
                    tracing::error!(error = %e, "interval sync failed");
                    *self.bg_error.lock() = Some(e.to_string());
                    return;
                }
            }
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let sv = self.sv.read().clone();
        let (user_base, device_base) = (self.user_bytes_base, self.device_bytes_base);
        let fstats = self.flash.stats();
        let user = user_base + Counters::get(&self.counters.user_bytes);
        let device = device_base + fstats.device.bytes_written;
        let gets = Counters::get(&self.counters.gets);
        let reads = Counters::get(&self.counters.get_device_reads);
        let segs = self.vlog.segments();
        let log_bytes: u64 = segs.values().map(|m| m.written_bytes).sum();
        let log_live: u64 = segs.values().map(|m| m.live_bytes).sum();
        let mut index = 0u64;
        let mut bloom = 0u64;
        for kt in sv.version.all() {
            index += kt.index.index_dram_bytes() as u64;
            if kt.use_bloom.load(Ordering::Relaxed) {
                bloom += kt.index.bloom.bytes() as u64;
            }
        }
        Stats {
            user_bytes_written: user,
            device_bytes_written: device,
            write_amplification: if user == 0 {
                0.0
            } else {
                device as f64 / user as f64
            },
            gets,
            get_device_reads: reads,
            device_reads_per_get: if gets == 0 {
                0.0
            } else {
                reads as f64 / gets as f64
            },
            dram_index_bytes: index,
            dram_cache_bytes: self.ctx.cache.used() as u64,
            dram_bloom_bytes: bloom,
            dram_memtable_bytes: (sv.mem.bytes() + sv.imm.as_ref().map_or(0, |m| m.bytes())) as u64,
            dram_budget_bytes: self.opts.dram_budget as u64,
            keytables_per_level: sv.version.levels.iter().map(|l| l.len()).collect(),
            flushed_runs: sv.version.runs,
            bytes_per_level: (0..sv.version.levels.len())
                .map(|i| sv.version.level_bytes(i, self.page))
                .collect(),
            memtable_entries: (sv.mem.len() + sv.imm.as_ref().map_or(0, |m| m.len())) as u64,
            memtable_runs: sv.mem.runs() as u64,
            flushes: Counters::get(&self.counters.flushes),
            flushes_during_merges: Counters::get(&self.counters.flushes_during_merges),
            compactions: Counters::get(&self.counters.compactions),
            compaction_bytes_written: Counters::get(&self.counters.compaction_bytes_written),
            gc_runs: Counters::get(&self.counters.gc_runs),
            gc_deep_passes: Counters::get(&self.counters.gc_deep_passes),
            gc_segments_reclaimed: Counters::get(&self.counters.gc_segments_reclaimed),
            gc_bytes_relocated: Counters::get(&self.counters.gc_bytes_relocated),
            recluster_bytes: Counters::get(&self.counters.recluster_bytes),
            gc_bytes_scanned: Counters::get(&self.counters.gc_bytes_scanned),
            log_bytes,
            log_live_bytes: log_live,
            garbage_ratio: if log_bytes == 0 {
                0.0
            } else {
                1.0 - log_live as f64 / log_bytes as f64
            },
            segments_total: fstats.segments_total,
            segments_free: fstats.segments_free,
            segments_backed: fstats.segments_backed,
            segment_bytes: self.flash.geometry().segment_bytes(),
            segments_log: segs.len() as u32,
            write_throttle_micros: Counters::get(&self.counters.write_throttle_micros),
            checkpoints: Counters::get(&self.counters.checkpoints),
            erase_count_max: fstats.erase_count_max,
            last_seq: self.visible_seq.load(Ordering::Acquire),
            host_full: self.vlog.stalled().is_some()
                || self.boot_checkpoint.lock().is_some()
                || fstats.host_full,
            device_failed: self.vlog.failure(),
            device_latency: self.flash.latency(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::small_db;

    /// Chunk buffers of a drained backlog are all kept for the next burst
    /// (memory given back is faulted in again), and no more than the
    /// backlog holds.
    #[test]
    fn a_drained_log_backlog_keeps_its_buffers() {
        let mut o = Options::small_for_tests();
        o.memtable_bytes = 1 << 20;
        o.memtable_log_bytes = 8 << 20;
        let db = Db::open(crate::test_support::nand_device(), o).expect("open");
        let value = vec![7u8; 8 << 10];
        let sealed = {
            let _held = db.inner.vlog.hold_writes();
            let mut i = 0u32;
            while db.inner.vlog.backlog() < MAX_LOG_BACKLOG - 4 {
                db.put(&i.to_be_bytes(), &value).expect("put");
                i += 1;
            }
            db.inner.vlog.backlog()
        };
        assert!(sealed > 8, "a burst deeper than the old pool: {sealed}");
        db.inner.vlog.write_pending(true).expect("drain");
        assert_eq!(db.inner.vlog.backlog(), 0);
        assert!(
            db.inner.vlog.free_buffers() >= sealed - 1,
            "{} buffers kept of {sealed}",
            db.inner.vlog.free_buffers()
        );
        assert!(db.inner.vlog.free_buffers() <= MAX_LOG_BACKLOG + 1);
    }

    /// Stats (INFO, /metrics) must not wait for background maintenance,
    /// which holds its lock through whole flush, GC and compaction rounds.
    #[test]
    fn stats_do_not_wait_for_the_maintenance_lock() {
        let db = Arc::new(small_db());
        db.put(b"k", b"v").expect("put");
        let held = db.inner.maint.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let db = db.clone();
            std::thread::spawn(move || {
                let _ = tx.send(db.stats());
            })
        };
        let stats = rx.recv_timeout(Duration::from_secs(5));
        drop(held);
        reader.join().expect("stats thread");
        let stats = stats.expect("stats waited for the maintenance lock");
        assert!(stats.user_bytes_written > 0);
    }

    /// A write waits for a flush that is far behind only up to
    /// `max_write_stall`, then fails with `WriteStall`, having written
    /// nothing; once the flush can run, writes go on.
    #[test]
    fn a_write_waits_for_a_stuck_flush_only_so_long() {
        let opts = Options {
            background: true,
            max_write_stall: Duration::from_millis(300),
            ..Options::small_for_tests()
        };
        let db = Db::open(crate::test_support::nand_device(), opts).expect("open");
        // Maintenance cannot run while the test holds its lock.
        let held = db.inner.maint.lock();
        let started = std::time::Instant::now();
        let mut stalled = None;
        for i in 0..10_000u32 {
            match db.put(format!("k{i:05}").as_bytes(), &[7u8; 200]) {
                Ok(()) => {}
                Err(e) => {
                    stalled = Some((i, e));
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "writes never stopped"
            );
        }
        let (i, e) = stalled.expect("a write stalled");
        assert!(matches!(e, Error::WriteStall(_)), "{e}");
        assert!(e.to_string().starts_with("BUSY"), "{e}");
        let key = format!("k{i:05}");
        assert_eq!(
            db.get(key.as_bytes()).unwrap(),
            None,
            "the stalled write wrote nothing"
        );
        drop(held);
        db.put(key.as_bytes(), b"later")
            .expect("writes go on once the flush runs");
    }

    /// A flush that failed after freezing the memtable (out of space, say)
    /// leaves it as `imm`; the next flush must write that one rather than
    /// freeze again, which would drop its entries from the read path.
    #[test]
    fn a_flush_after_a_failed_one_keeps_the_frozen_entries() {
        let db = small_db();
        db.put(b"frozen", b"1").expect("put");
        {
            // What a flush does before it can fail.
            let mut st = db.inner.maint.lock();
            db.inner.freeze_memtable(&mut st);
        }
        assert_eq!(db.get(b"frozen").unwrap().as_deref(), Some(&b"1"[..]));
        db.put(b"active", b"2").expect("put");
        db.flush().expect("flush");
        assert_eq!(db.get(b"frozen").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(db.get(b"active").unwrap().as_deref(), Some(&b"2"[..]));
        db.flush().expect("flush");
        let sv = db.inner.sv.read().clone();
        assert!(
            sv.imm.is_none() && sv.mem.is_empty(),
            "both memtables flushed"
        );
        assert_eq!(db.get(b"frozen").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(db.get(b"active").unwrap().as_deref(), Some(&b"2"[..]));
    }
}
