//! The value log: the append-only stream of records that holds every value
//! and doubles as the write-ahead log (no second copy of the data is written).
//!
//! Records are appended into a page-aligned chunk buffer; a full chunk is
//! sealed and written to the open segment as one device I/O. A sync seals the
//! partial chunk after padding its last page, so no flash page is ever
//! programmed twice; writers waiting for durability share one device sync
//! (group commit). When a record does not fit in the open segment, a `LINK`
//! record naming the next segment ends it and the next segment starts with a
//! `SEGMENT_HEADER` record; recovery follows these links.
//!
//! A large value (see [`is_aligned_value`]) starts on a [`VALUE_ALIGN`]
//! boundary (a `PAD` record fills the gap before its record), and reads
//! fetch only a value's bytes, checked against the value checksum in its
//! pointer: an 8 KiB GET is one 8 KiB device read.
//!
//! Invariants:
//! - Bytes of a segment below its `written` mark are on the device; bytes at
//!   or above it are in `pending` chunks or the current buffer, in order.
//! - `durable_lsn <= written_lsn <= appended_lsn`.
//! - A batch never spans segments, so it is all-or-nothing after a crash.
//! - While the log is stalled (a chunk write found the host file system
//!   full), nothing is appended: the chunks already sealed wait in memory,
//!   reads are served from them, and the write-behind thread retries until
//!   they are all written, which ends the stall.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use flash::{
    AlignedBuf, DirectRead, FlashStore, Purpose, SegmentId, MAX_MERGED_READ, MAX_READ_GAP,
    READ_ALIGN,
};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::{Error, Result};
use crate::record::{self, HEADER_LEN, LINK_RECORD_LEN};
use crate::types::{SeqNo, ValueBytes, ValuePtr};

/// Flash segment kind tag for value-log segments.
pub const SEGMENT_KIND_LOG: u8 = 1;

/// Values shorter than this are never aligned (see [`is_aligned_value`]).
pub const ALIGN_VALUES_FROM: usize = 4096;
/// Values at least this long are aligned whatever their length.
pub const ALIGN_ANY_VALUE_FROM: usize = 16 * VALUE_ALIGN;
/// A value under [`ALIGN_ANY_VALUE_FROM`] whose last sector holds at most
/// this many bytes is not aligned.
const SHORT_TAIL: usize = 64;
/// Alignment of large values in a segment: the device's read granularity.
pub const VALUE_ALIGN: usize = READ_ALIGN;

/// Whether a value of `len` bytes starts on a [`VALUE_ALIGN`] boundary.
///
/// Aligned, a value is read alone by one device read of exactly its
/// sectors, which can land straight in a client's memory (`MGETSHM`); the
/// pad before its record costs up to a sector of log. Values of at least
/// [`ALIGN_ANY_VALUE_FROM`] bytes are aligned (the pad is at most a
/// sixteenth of them), and values of at least [`ALIGN_VALUES_FROM`] bytes
/// unless their last sector holds at most [`SHORT_TAIL`] bytes. Such a
/// value, unaligned, still spans no more sectors than aligned unless it
/// starts in the last `SHORT_TAIL` bytes of one (one start in eight at
/// worst), so the pad would buy it little but the landing, at up to an
/// eighth of its size: the cluster's values of whole blocks carry a
/// 10-byte version header, and a block adapter's 4 KiB chunk (4,106
/// bytes) took 4,608 bytes of log aligned and takes 4,146 unaligned:
/// sequential block reads and writes move a tenth fewer bytes, and the
/// reads ran about a third faster on a disk-bound machine
/// (`bench/RESULTS.md`, session 48).
pub fn is_aligned_value(len: usize) -> bool {
    let short_tail = (1..=SHORT_TAIL).contains(&(len % VALUE_ALIGN));
    len >= ALIGN_ANY_VALUE_FROM || (len >= ALIGN_VALUES_FROM && !short_tail)
}

/// Accounting for one value-log segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegMeta {
    /// Epoch the segment's records are seeded with.
    pub epoch: u64,
    /// Erase count of the segment when it was opened.
    pub gen: u32,
    /// Bytes of PUT records still referenced by the tree.
    pub live_bytes: u64,
    /// Bytes appended to the segment (records and padding).
    pub written_bytes: u64,
    /// True once the log has moved past this segment.
    pub sealed: bool,
}

impl SegMeta {
    /// Fraction of the appended bytes that PUT records still referenced
    /// hold (what GC would have to relocate to reclaim the segment).
    pub fn live_fraction(&self) -> f64 {
        self.live_bytes as f64 / self.written_bytes.max(1) as f64
    }
}

/// A position in the log: a record boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogPosition {
    /// Segment.
    pub seg: SegmentId,
    /// Byte offset inside the segment.
    pub offset: u32,
    /// Epoch of the segment.
    pub epoch: u64,
}

/// How much of the free-segment reserve an append may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// Ordinary writes: never touch the reserve.
    User,
    /// Delete-only batches: may use part of it (they free space).
    Delete,
    /// GC relocation: may use all of it but one segment.
    Internal,
    /// GC relocation when the flush that completes GC needs no segment of
    /// its own (the keytable segment has room for it): may use the last.
    InternalLast,
    /// GC relocation that leaves this many segments free (a deep pass,
    /// `gc.rs`, leaves what merges need).
    LeaveFree(u32),
}

/// One record to append.
pub struct LogRecord<'a> {
    /// `record::KIND_PUT` or `record::KIND_DELETE`.
    pub kind: u8,
    /// Extra flags (`FLAG_RELOCATED`); batch flags are set by the log.
    pub flags: u8,
    /// Key.
    pub key: &'a [u8],
    /// Value (empty for deletes).
    pub value: ValueBytes<'a>,
    /// Keep this sequence number (GC relocation) instead of taking a new one.
    pub seq: Option<SeqNo>,
}

struct Chunk {
    seg: SegmentId,
    epoch: u64,
    offset: u64,
    data: AlignedBuf,
    len: usize,
    end_lsn: u64,
}

struct Inner {
    seg: SegmentId,
    gen: u32,
    epoch: u64,
    /// Current chunk buffer and the segment offset where it starts.
    buf: AlignedBuf,
    buf_offset: u64,
    buf_len: usize,
    /// Usable bytes of `buf` (less than its size near the segment's end).
    buf_cap: usize,
    /// Sealed chunks not yet confirmed written, oldest first.
    pending: VecDeque<Arc<Chunk>>,
    appended_lsn: u64,
    last_seq: SeqNo,
    next_epoch: u64,
    /// Set while chunk writes fail for want of host space (see the module doc).
    stalled: Option<String>,
}

struct SyncState {
    durable_lsn: u64,
    written_lsn: u64,
    syncing: bool,
}

/// The value log.
pub struct ValueLog {
    flash: Arc<FlashStore>,
    page: usize,
    seg_bytes: u64,
    chunk_bytes: usize,
    reserved_segments: u32,
    // Lock order: `io` (one chunk writer at a time), then `inner` (the
    // append state), then `sync` (durability marks). A thread holding a
    // later lock never takes an earlier one.
    inner: Mutex<Inner>,
    io: Mutex<()>,
    sync: Mutex<SyncState>,
    synced: Condvar,
    segs: RwLock<BTreeMap<SegmentId, SegMeta>>,
    /// Written chunk buffers kept for reuse.
    free_bufs: Mutex<Vec<AlignedBuf>>,
    /// Every segment with a smaller epoch is entirely on the device, so
    /// reads of it skip the in-memory chunks (and their lock).
    on_device_below: AtomicU64,
    /// Set when a chunk is sealed; the write-behind thread waits on it.
    flusher_work: Mutex<bool>,
    /// Why the log refuses every append for good, once a device write or
    /// sync failed (see [`Self::failure`]).
    failed: std::sync::OnceLock<String>,
    flusher_cv: Condvar,
}

/// Sealed log chunks allowed to wait for the write-behind thread before
/// writers start writing them themselves (the engine's `write_behind`; 32
/// MiB with the default 1 MiB chunks). The log thread has one chunk write
/// in flight; with eight, a writer filling the log at small-value speed
/// waited on that write about a twentieth of its time (`bench/RESULTS.md`,
/// session 29).
pub(crate) const MAX_BACKLOG: usize = 32;

/// Sealed chunks one write of the backlog puts on the device at once (in
/// parallel where the device can). One chunk at a time left the disk
/// waiting on each write's latency while writers filled the backlog and
/// then waited for it: an in-process fill of 4 KiB values ran 1.2x faster
/// with groups of 4 and 1.4x with 8 (`bench/RESULTS.md`, session 45).
const WRITE_GROUP: usize = 8;

/// Chunk buffers kept for reuse at most: one per chunk the backlog can
/// hold, so a burst that fills it and drains again leaves buffers for the
/// next one instead of freeing them. Memory given back is faulted in (and
/// cleared) again on the next burst: with 8 kept, a node overwriting a
/// block volume took a fault for one chunk in twenty-five, a third of its
/// page faults (session 36 in `bench/RESULTS.md`). Keeping them does not
/// raise the peak: the backlog held them all at once anyway.
const FREE_BUFS: usize = MAX_BACKLOG + 1;

/// Room an aligned value's `PAD` record may take before its record.
const MAX_ALIGN_PAD: usize = 2 * VALUE_ALIGN + HEADER_LEN;

/// How a value read proceeds without waiting (see [`ValueLog::start_read`]).
pub enum ValueStart {
    /// The value, read already.
    Ready(Bytes),
    /// Run this device read, then [`ValueLog::finish_read`].
    Device(PendingValue, DirectRead),
    /// Only a read that may wait gets it ([`ValueLog::read_value`]).
    Blocking,
}

/// A value whose device read is running: where in the read it lies.
#[derive(Debug)]
pub struct PendingValue {
    /// The value's pointer (for the checksum and a retry after GC).
    pub ptr: ValuePtr,
    /// Bytes of the read before the value.
    skip: usize,
    /// The value's length.
    len: usize,
}

impl PendingValue {
    /// The value's length.
    pub fn value_len(&self) -> usize {
        self.len
    }

    /// Bytes of the read before the value.
    pub fn skip(&self) -> usize {
        self.skip
    }
}

/// Largest record the log accepts (must fit in one segment with its framing
/// and alignment pad).
pub fn max_record_len(seg_bytes: u64, page: usize) -> usize {
    (seg_bytes as usize).saturating_sub(4 * page + LINK_RECORD_LEN + MAX_ALIGN_PAD)
}

impl ValueLog {
    /// Starts a log in a fresh segment with epoch `epoch`. `segs` holds the
    /// accounting of older log segments (from the manifest and recovery).
    pub fn open(
        flash: Arc<FlashStore>,
        segs: BTreeMap<SegmentId, SegMeta>,
        epoch: u64,
        last_seq: SeqNo,
        chunk_bytes: usize,
        reserved_segments: u32,
    ) -> Result<ValueLog> {
        let geo = flash.geometry();
        let page = geo.page_size as usize;
        let chunk_bytes = chunk_bytes.max(page) / page * page;
        let log = ValueLog {
            flash,
            page,
            seg_bytes: geo.segment_bytes(),
            chunk_bytes,
            reserved_segments,
            inner: Mutex::new(Inner {
                seg: 0,
                gen: 0,
                epoch,
                buf: AlignedBuf::new_zeroed(chunk_bytes),
                buf_offset: 0,
                buf_len: 0,
                buf_cap: chunk_bytes,
                pending: VecDeque::new(),
                appended_lsn: 0,
                last_seq,
                next_epoch: epoch,
                stalled: None,
            }),
            io: Mutex::new(()),
            sync: Mutex::new(SyncState {
                durable_lsn: 0,
                written_lsn: 0,
                syncing: false,
            }),
            synced: Condvar::new(),
            segs: RwLock::new(segs),
            free_bufs: Mutex::new(Vec::new()),
            on_device_below: AtomicU64::new(0),
            flusher_work: Mutex::new(false),
            flusher_cv: Condvar::new(),
            failed: std::sync::OnceLock::new(),
        };
        {
            let mut inner = log.inner.lock();
            // On a full host the store still opens, for reads: the log's
            // first writes then wait for room (see `write_pending`).
            let (seg, gen) = log.flash.allocate_sparse(SEGMENT_KIND_LOG)?;
            log.start_segment(&mut inner, seg, gen);
        }
        Ok(log)
    }

    fn allocate(&self, reserve: Reserve) -> Result<(SegmentId, u32)> {
        let keep = match reserve {
            // Plus one: the flush of what user writes appended may need a
            // keytable segment, and must not take it from the reserve that
            // deletes and GC need once user writes have stopped.
            Reserve::User => self.reserved_segments + 1,
            // Deletes make room, but leave GC a log and a keytable segment.
            Reserve::Delete => 1 + self.reserved_segments / 2,
            // Leave the last segment for the flush that completes GC.
            Reserve::Internal => 1,
            Reserve::InternalLast => 0,
            Reserve::LeaveFree(n) => n,
        };
        // While the host file system is full, the segments it still backs
        // are for the work that makes room (deletes, GC), not for new data.
        let purpose = if reserve == Reserve::User {
            Purpose::NewData
        } else {
            Purpose::MakesRoom
        };
        // `NoSpace`, or `HostFull` while the host is full.
        Ok(self.flash.allocate_for(purpose, SEGMENT_KIND_LOG, keep)?)
    }

    /// Opens `seg` as the current segment and writes its header record.
    fn start_segment(&self, inner: &mut Inner, seg: SegmentId, gen: u32) {
        let epoch = inner.next_epoch;
        inner.next_epoch += 1;
        inner.seg = seg;
        inner.gen = gen;
        inner.epoch = epoch;
        inner.buf_offset = 0;
        inner.buf_len = 0;
        inner.buf_cap = self.chunk_bytes;
        self.segs.write().insert(
            seg,
            SegMeta {
                epoch,
                gen,
                ..SegMeta::default()
            },
        );
        let v = record::link_value(seg, epoch);
        self.put_record(
            inner,
            record::KIND_SEGMENT_HEADER,
            0,
            0,
            &[],
            ValueBytes::whole(&v),
        );
        self.note_written(inner, 0);
        self.refresh_on_device(inner);
    }

    fn refresh_on_device(&self, inner: &Inner) {
        let oldest = inner.pending.front().map_or(inner.epoch, |c| c.epoch);
        self.on_device_below.store(oldest, Ordering::Release);
    }

    /// The position where the next record will go.
    fn position(inner: &Inner) -> LogPosition {
        LogPosition {
            seg: inner.seg,
            offset: (inner.buf_offset + inner.buf_len as u64) as u32,
            epoch: inner.epoch,
        }
    }

    fn usable_end(&self) -> u64 {
        self.seg_bytes - self.page as u64
    }

    /// Appends raw record bytes at the current position (skipping a short page
    /// tail first); returns the record's offset and its value's checksum.
    /// Seals full chunks.
    fn put_record(
        &self,
        inner: &mut Inner,
        kind: u8,
        flags: u8,
        seq: SeqNo,
        key: &[u8],
        value: ValueBytes<'_>,
    ) -> (u64, u32) {
        self.skip_short_page_tail(inner);
        let offset = inner.buf_offset + inner.buf_len as u64;
        let epoch = inner.epoch;
        let len = HEADER_LEN + key.len() + value.len();
        let vcrc = self.put_encoded(inner, len, |dst| {
            record::encode_into(dst, epoch, kind, flags, seq, key, value)
        });
        (offset, vcrc)
    }

    /// Skips a page tail too short for a record header: no record starts there.
    fn skip_short_page_tail(&self, inner: &mut Inner) {
        let in_page = (inner.buf_offset as usize + inner.buf_len) % self.page;
        if self.page - in_page < HEADER_LEN {
            self.skip_bytes(inner, self.page - in_page);
        }
    }

    /// Appends `len` bytes that `encode` writes: straight into the chunk
    /// buffer when they fit, else through a temporary buffer that
    /// [`Self::put_bytes`] spreads over the chunks.
    fn put_encoded<R>(
        &self,
        inner: &mut Inner,
        len: usize,
        encode: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let at = inner.buf_len;
        if len <= inner.buf_cap - at {
            let r = encode(&mut inner.buf[at..at + len]);
            self.advance(inner, len);
            r
        } else {
            let mut tmp = vec![0u8; len];
            let r = encode(&mut tmp);
            self.put_bytes(inner, &tmp);
            r
        }
    }

    /// Counts `n` bytes just placed in the chunk buffer as appended and
    /// seals the chunk if it is full.
    fn advance(&self, inner: &mut Inner, n: usize) {
        inner.buf_len += n;
        inner.appended_lsn += n as u64;
        if inner.buf_len == inner.buf_cap {
            self.seal_chunk(inner);
        }
    }

    /// Records in the current segment's accounting what was appended to it
    /// (every record and pad so far) and `live` more bytes of PUT records:
    /// once per batch, not per record.
    fn note_written(&self, inner: &Inner, live: u64) {
        if let Some(m) = self.segs.write().get_mut(&inner.seg) {
            m.written_bytes = inner.buf_offset + inner.buf_len as u64;
            m.live_bytes += live;
        }
    }

    /// Before a PUT whose value [`is_aligned_value`], appends a `PAD`
    /// record so that the value starts on a [`VALUE_ALIGN`] boundary: a
    /// read of the value alone is then exactly its own sectors (8 KiB for
    /// an 8 KiB value, where the whole record would be 8.5 KiB; many disks
    /// serve the larger request markedly slower). Costs less than
    /// `VALUE_ALIGN` bytes per record on average.
    fn align_value(&self, inner: &mut Inner, key_len: usize, value_len: usize) {
        if !is_aligned_value(value_len) {
            return;
        }
        let page = self.page as u64;
        let align = VALUE_ALIGN as u64;
        // Where a record starts now (as in `put_record`).
        self.skip_short_page_tail(inner);
        let pos = inner.buf_offset + inner.buf_len as u64;
        let head = (HEADER_LEN + key_len) as u64;
        let mut gap = (pos + head).next_multiple_of(align) - (pos + head);
        // The gap must hold a PAD record, and the record after it must not
        // start in a page tail too short for a header (it would move).
        while gap != 0 && (gap < HEADER_LEN as u64 || page - (pos + gap) % page < HEADER_LEN as u64)
        {
            gap += align;
        }
        if gap == 0 {
            return;
        }
        // At most two alignment steps: the first gap is below `align`, one
        // step makes room for the PAD header, one more leaves a page tail.
        debug_assert!(gap as usize <= MAX_ALIGN_PAD);
        self.put_pad(inner, gap as usize);
    }

    /// Appends a `PAD` record of `len` bytes (at least `HEADER_LEN`) at the
    /// current position.
    fn put_pad(&self, inner: &mut Inner, len: usize) {
        let epoch = inner.epoch;
        self.put_encoded(inner, len, |dst| record::encode_pad_into(dst, epoch));
    }

    fn put_bytes(&self, inner: &mut Inner, mut b: &[u8]) {
        while !b.is_empty() {
            let room = inner.buf_cap - inner.buf_len;
            let n = room.min(b.len());
            let at = inner.buf_len;
            inner.buf[at..at + n].copy_from_slice(&b[..n]);
            b = &b[n..];
            self.advance(inner, n);
        }
    }

    fn skip_bytes(&self, inner: &mut Inner, n: usize) {
        let at = inner.buf_len;
        inner.buf[at..at + n].fill(0);
        self.advance(inner, n);
    }

    /// Pads the current page (PAD record or zero tail) and seals the chunk.
    fn seal_partial(&self, inner: &mut Inner) {
        let in_page = inner.buf_len % self.page;
        if in_page != 0 {
            let rest = self.page - in_page;
            if rest >= HEADER_LEN {
                self.put_pad(inner, rest);
                self.note_written(inner, 0);
            } else {
                self.skip_bytes(inner, rest);
            }
        }
        if inner.buf_len > 0 {
            self.seal_chunk(inner);
        }
    }

    /// Moves the (page-aligned) current buffer to `pending`.
    fn seal_chunk(&self, inner: &mut Inner) {
        let len = inner.buf_len.div_ceil(self.page) * self.page;
        let at = inner.buf_len;
        inner.buf[at..len].fill(0);
        let rest = (self.seg_bytes - (inner.buf_offset + len as u64)) as usize;
        inner.buf_cap = self.chunk_bytes.min(rest).max(self.page);
        let fresh = self
            .free_bufs
            .lock()
            .pop()
            .unwrap_or_else(|| AlignedBuf::new_zeroed(self.chunk_bytes));
        let data = std::mem::replace(&mut inner.buf, fresh);
        inner.pending.push_back(Arc::new(Chunk {
            seg: inner.seg,
            epoch: inner.epoch,
            offset: inner.buf_offset,
            data,
            len,
            end_lsn: inner.appended_lsn,
        }));
        inner.buf_offset += len as u64;
        inner.buf_len = 0;
        let mut work = self.flusher_work.lock();
        *work = true;
        self.flusher_cv.notify_one();
    }

    /// Ends the current segment with a LINK and opens a new one.
    fn switch_segment(&self, inner: &mut Inner, reserve: Reserve) -> Result<()> {
        let (seg, gen) = self.allocate(reserve)?;
        let v = record::link_value(seg, inner.next_epoch);
        self.put_record(inner, record::KIND_LINK, 0, 0, &[], ValueBytes::whole(&v));
        self.note_written(inner, 0);
        self.seal_partial(inner);
        if let Some(m) = self.segs.write().get_mut(&inner.seg) {
            m.sealed = true;
        }
        self.start_segment(inner, seg, gen);
        Ok(())
    }

    /// Appends `recs` as one atomic batch and calls `apply(i, seq, ptr)` for
    /// each record while still holding the log lock, so the memtable sees
    /// records in log order. Returns the LSN to wait for under `sync`.
    pub fn append(
        &self,
        recs: &[LogRecord<'_>],
        reserve: Reserve,
        mut apply: impl FnMut(usize, SeqNo, ValuePtr),
    ) -> Result<u64> {
        if let Some(why) = self.failure() {
            return Err(Error::DeviceFailed(why));
        }
        let mut inner = self.inner.lock();
        if let Some(why) = &inner.stalled {
            return Err(Error::HostFull(why.clone()));
        }
        // Room the batch needs: its records and their alignment pads plus,
        // at every page boundary it crosses, a page tail too short for a
        // header that gets skipped.
        let raw: u64 = recs
            .iter()
            .map(|r| {
                let pad = if r.kind == record::KIND_PUT && is_aligned_value(r.value.len()) {
                    MAX_ALIGN_PAD
                } else {
                    0
                };
                (HEADER_LEN + r.key.len() + r.value.len() + pad) as u64
            })
            .sum();
        let skips = raw / (self.page - HEADER_LEN) as u64 + 1;
        let total = raw + skips * HEADER_LEN as u64;
        let pos = inner.buf_offset + inner.buf_len as u64;
        if pos + total > self.usable_end() {
            let fresh = self.usable_end() - self.page as u64; // after the header page
            if total > fresh {
                return Err(Error::InvalidOptions(format!(
                    "batch of {total} bytes does not fit in one {} byte segment",
                    self.seg_bytes
                )));
            }
            self.switch_segment(&mut inner, reserve)?;
        }
        let n = recs.len();
        let mut live = 0;
        for (i, r) in recs.iter().enumerate() {
            let seq = match r.seq {
                Some(s) => s,
                None => {
                    inner.last_seq += 1;
                    inner.last_seq
                }
            };
            let mut flags = r.flags;
            if i + 1 < n {
                flags |= record::FLAG_BATCH_CONTINUES;
            }
            let len = HEADER_LEN + r.key.len() + r.value.len();
            if r.kind == record::KIND_PUT {
                self.align_value(&mut inner, r.key.len(), r.value.len());
            }
            let (offset, value_crc) =
                self.put_record(&mut inner, r.kind, flags, seq, r.key, r.value);
            let ptr = ValuePtr {
                seg: inner.seg,
                gen: inner.gen,
                offset: offset as u32,
                len: len as u32,
                value_crc,
            };
            if r.kind == record::KIND_PUT {
                live += len as u64;
            }
            apply(i, seq, ptr);
        }
        // A batch never spans segments: one update of its accounting.
        self.note_written(&inner, live);
        Ok(inner.appended_lsn)
    }

    /// Runs `f` under the log lock with the current position and last
    /// sequence number: nothing is appended while it runs.
    pub fn with_position<T>(&self, f: impl FnOnce(LogPosition, SeqNo) -> T) -> T {
        let inner = self.inner.lock();
        f(Self::position(&inner), inner.last_seq)
    }

    /// The LSN of everything appended so far.
    pub fn appended_lsn(&self) -> u64 {
        self.inner.lock().appended_lsn
    }

    /// Writes the sealed chunks, [`WRITE_GROUP`] at a time (in parallel
    /// where the device can), retiring them in log order: the written mark
    /// moves only past chunks that are on the device, and after a crash
    /// recovery stops at the first chunk that is not (a later one of its
    /// group that is was never acknowledged as durable, and its records
    /// stay unread). With `block == false` it returns at once if another
    /// thread is writing (that thread drains the queue).
    pub fn write_pending(&self, block: bool) -> Result<()> {
        let _io = if block {
            // Waiting for the write-behind thread's device write is device time.
            flash::iotime::timed(|| self.io.lock())
        } else {
            match self.io.try_lock() {
                Some(g) => g,
                None => return Ok(()),
            }
        };
        loop {
            let group: Vec<Arc<Chunk>> = {
                let mut inner = self.inner.lock();
                if inner.pending.is_empty() {
                    if inner.stalled.take().is_some() {
                        tracing::info!("value log: host space available again, writes resume");
                    }
                    return Ok(());
                }
                inner.pending.iter().take(WRITE_GROUP).cloned().collect()
            };
            let writes: Vec<(SegmentId, u32, &[u8])> = group
                .iter()
                .map(|c| {
                    (
                        c.seg,
                        (c.offset / self.page as u64) as u32,
                        &c.data[..c.len],
                    )
                })
                .collect();
            let (done, failed) = match self.flash.write_many(&writes) {
                Ok(()) => (group.len(), None),
                Err((done, e)) => (done, Some(e)),
            };
            drop(writes);
            for chunk in group.into_iter().take(done) {
                self.written(chunk);
            }
            if let Some(e) = failed {
                let mut inner = self.inner.lock();
                if e.is_host_full() {
                    // Retryable: the chunk stays pending and appends stop
                    // until the write-behind thread gets it written.
                    let msg = e.to_string();
                    if inner.stalled.is_none() {
                        tracing::warn!(
                            error = %msg,
                            "value log: host file system full, writes refused until space is freed"
                        );
                    }
                    inner.stalled = Some(msg.clone());
                    return Err(Error::HostFull(msg));
                }
                drop(inner);
                if matches!(e, flash::FlashError::PowerLoss) {
                    return Err(e.into());
                }
                let why = format!("value log write failed: {e}");
                self.fail(&why);
                return Err(Error::DeviceFailed(why));
            }
        }
    }

    /// Retires `chunk`, the oldest pending one, now on the device (called
    /// by the holder of the I/O lock, in log order).
    fn written(&self, chunk: Arc<Chunk>) {
        {
            let mut inner = self.inner.lock();
            debug_assert!(chunk.end_lsn <= inner.appended_lsn, "written past appended");
            let front = inner.pending.pop_front();
            debug_assert!(
                front.is_some_and(|f| Arc::ptr_eq(&f, &chunk)),
                "retired a chunk that was not the oldest pending"
            );
            self.refresh_on_device(&inner);
        }
        {
            let mut s = self.sync.lock();
            s.written_lsn = s.written_lsn.max(chunk.end_lsn);
        }
        if let Ok(c) = Arc::try_unwrap(chunk) {
            let mut free = self.free_bufs.lock();
            if free.len() < FREE_BUFS && c.data.len() == self.chunk_bytes {
                free.push(c.data);
            }
        }
    }

    /// Waits until a chunk is sealed (or `timeout`); for the write-behind thread.
    pub fn wait_for_chunks(&self, timeout: std::time::Duration) {
        let mut work = self.flusher_work.lock();
        if !*work {
            self.flusher_cv.wait_for(&mut work, timeout);
        }
        *work = false;
    }

    /// Wakes the write-behind thread (at shutdown).
    pub fn wake_writer(&self) {
        let mut work = self.flusher_work.lock();
        *work = true;
        self.flusher_cv.notify_all();
    }

    /// Refuses every later append for good (until the store is reopened):
    /// a device write or sync failed, so what follows could be acknowledged
    /// without being durable.
    fn fail(&self, why: &str) {
        if self.failed.set(why.to_string()).is_ok() {
            tracing::error!(error = %why, "value log: the device failed; no further write is acknowledged until the store is reopened");
        }
    }

    /// Why the log refuses every write until the store is reopened (a
    /// device write or sync failed), if it does.
    /// That is also the case once any sync of the store failed (a
    /// checkpoint's, say).
    pub fn failure(&self) -> Option<String> {
        self.failed.get().cloned().or_else(|| {
            self.flash
                .sync_failure()
                .map(|why| flash::FlashError::SyncFailed(why.to_string()).to_string())
        })
    }

    /// Why appends are refused for want of host space, if they are.
    pub fn stalled(&self) -> Option<String> {
        self.inner.lock().stalled.clone()
    }

    /// Number of sealed chunks waiting to be written.
    pub fn backlog(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Chunk buffers kept for reuse now.
    #[cfg(test)]
    pub(crate) fn free_buffers(&self) -> usize {
        self.free_bufs.lock().len()
    }

    /// Makes everything appended up to `lsn` durable; concurrent callers
    /// share one device sync.
    pub fn sync_to(&self, lsn: u64) -> Result<()> {
        loop {
            let mut s = self.sync.lock();
            if s.durable_lsn >= lsn {
                return Ok(());
            }
            if s.syncing {
                // Waiting for another writer's device sync is device time.
                flash::iotime::timed(|| self.synced.wait(&mut s));
                continue;
            }
            s.syncing = true;
            drop(s);
            let result = self.seal_and_sync();
            if let Err(Error::DeviceFailed(why)) = &result {
                // Before waking the waiters: none of them may see the
                // failure as "not synced yet" and try again.
                self.fail(why);
            }
            let mut s = self.sync.lock();
            s.syncing = false;
            if let Ok(t) = result {
                s.durable_lsn = s.durable_lsn.max(t);
                debug_assert!(s.durable_lsn <= s.written_lsn, "durable past written");
            }
            self.synced.notify_all();
            drop(s);
            result?;
        }
    }

    fn seal_and_sync(&self) -> Result<u64> {
        let target = {
            let mut inner = self.inner.lock();
            if inner.buf_len > 0 && !self.is_durable_upto(inner.appended_lsn) {
                self.seal_partial(&mut inner);
            }
            inner.appended_lsn
        };
        self.write_pending(true)?;
        self.flash.sync()?;
        Ok(target)
    }

    fn is_durable_upto(&self, lsn: u64) -> bool {
        self.sync.lock().durable_lsn >= lsn
    }

    /// Syncs everything appended so far.
    pub fn sync_all(&self) -> Result<()> {
        let lsn = self.appended_lsn();
        self.sync_to(lsn)
    }

    /// Reads and verifies the value of the PUT record at `ptr` (whose key is
    /// `key`), returning it and whether the device was read. Only the value
    /// bytes are read; the checksum in `ptr` verifies them.
    pub fn read_value(&self, ptr: ValuePtr, key: &[u8]) -> Result<(Bytes, bool)> {
        let epoch = self.epoch_of(ptr)?;
        let (start, end) = self.extent_of(ptr, key)?;
        if start == end {
            return Ok((Self::verified(Bytes::new(), ptr)?, false));
        }
        let (raw, from_device) = self.read_range(ptr.seg, epoch, start, end)?;
        Ok((Self::verified(raw, ptr)?, from_device))
    }

    /// Reads several values (pointer and key each); those on the device are
    /// read in parallel (one batch of device reads). Returns each value and
    /// whether the device was read, in request order.
    pub fn read_values(&self, reqs: &[(ValuePtr, &[u8])]) -> Result<Vec<(Bytes, bool)>> {
        let mut out: Vec<Option<(Bytes, bool)>> = vec![None; reqs.len()];
        let mut device: Vec<(usize, u64, u64)> = Vec::new(); // (i, start, end)
        let mut recent = Vec::new(); // (i, start, end): segments still partly in memory
        for (i, (ptr, key)) in reqs.iter().enumerate() {
            let epoch = self.epoch_of(*ptr)?;
            let (start, end) = self.extent_of(*ptr, key)?;
            if start == end {
                out[i] = Some((Self::verified(Bytes::new(), *ptr)?, false));
            } else if epoch < self.on_device_below.load(Ordering::Acquire) {
                device.push((i, start, end));
            } else {
                recent.push((i, start, end));
            }
        }
        if !recent.is_empty() {
            // A value of a recent segment that ends before the segment's
            // in-memory tail is already on the device: batch it too.
            let mut from_memory = Vec::new();
            {
                let inner = self.inner.lock();
                for (i, start, end) in recent {
                    let seg = reqs[i].0.seg;
                    if end <= Self::memory_tail_start(&inner, seg) {
                        device.push((i, start, end));
                    } else {
                        from_memory.push(i);
                    }
                }
            }
            for i in from_memory {
                let (ptr, key) = reqs[i];
                out[i] = Some(self.read_value(ptr, key)?);
            }
        }
        if device.len() == 1 {
            let (i, _, _) = device[0];
            let (ptr, key) = reqs[i];
            out[i] = Some(self.read_value(ptr, key)?);
        } else if !device.is_empty() {
            // Values next to each other on the device (a record's fields
            // written together, a range read in write order) share one read,
            // through the few bytes of headers and pads between them.
            let align = READ_ALIGN as u64;
            device.sort_by_key(|&(i, s, _)| (reqs[i].0.seg, s));
            let mut extents: Vec<(SegmentId, u64, u64, Vec<usize>)> = Vec::new(); // seg, a, z, members
            for (d, &(i, s, e)) in device.iter().enumerate() {
                let seg = reqs[i].0.seg;
                let (a, z) = (s / align * align, e.div_ceil(align) * align);
                match extents.last_mut() {
                    Some((xs, xa, xz, members))
                        if *xs == seg
                            && a <= *xz + MAX_READ_GAP
                            && z.max(*xz) - *xa <= MAX_MERGED_READ =>
                    {
                        *xz = z.max(*xz);
                        members.push(d);
                    }
                    _ => extents.push((seg, a, z, vec![d])),
                }
            }
            let shapes: Vec<(SegmentId, u64, usize)> = extents
                .iter()
                .map(|(seg, a, z, _)| (*seg, *a, (z - a) as usize))
                .collect();
            // Into buffers not zeroed first where the device allows it.
            let bufs = match self.flash.read_now(&shapes)? {
                Some(bufs) => bufs,
                None => self.read_zeroed(&shapes)?,
            };
            for ((_, a, _, members), buf) in extents.iter().zip(bufs) {
                // Values are slices of the read buffer: no copy.
                for &d in members {
                    let (i, s, e) = device[d];
                    let raw = buf.slice((s - a) as usize..(e - a) as usize);
                    out[i] = Some((Self::verified(raw, reqs[i].0)?, true));
                }
            }
        }
        Ok(out.into_iter().map(|v| v.unwrap_or_default()).collect())
    }

    /// Reads each `(segment, offset, len)` into a zeroed buffer of its own
    /// with [`FlashStore::read_many`] (the path for devices and threads
    /// that [`FlashStore::read_now`] cannot serve).
    fn read_zeroed(&self, shapes: &[(SegmentId, u64, usize)]) -> Result<Vec<Bytes>> {
        let mut bufs: Vec<AlignedBuf> = shapes
            .iter()
            .map(|&(_, _, len)| AlignedBuf::new_zeroed(len))
            .collect();
        {
            let mut batch: Vec<(SegmentId, u64, &mut [u8])> = shapes
                .iter()
                .zip(bufs.iter_mut())
                // Exactly the extent: the buffer itself is rounded up to 4 KiB.
                .map(|(&(seg, a, len), b)| (seg, a, &mut b[..len]))
                .collect();
            self.flash.read_many(&mut batch)?;
        }
        Ok(bufs.into_iter().map(Bytes::from_owner).collect())
    }

    /// Starts the read of the value of the PUT record at `ptr` (whose key
    /// is `key`) without waiting: the value itself when it is empty, a
    /// device read to run (then [`ValueLog::finish_read`]) when it is wholly
    /// on the device and the device can read it directly, else
    /// [`ValueStart::Blocking`]: use [`ValueLog::read_value`].
    pub fn start_read(&self, ptr: ValuePtr, key: &[u8]) -> Result<ValueStart> {
        let epoch = self.epoch_of(ptr)?;
        let (start, end) = self.extent_of(ptr, key)?;
        if start == end {
            return Ok(ValueStart::Ready(Self::verified(Bytes::new(), ptr)?));
        }
        let on_device = epoch < self.on_device_below.load(Ordering::Acquire)
            || end <= Self::memory_tail_start(&self.inner.lock(), ptr.seg);
        if !on_device {
            return Ok(ValueStart::Blocking);
        }
        let align = READ_ALIGN as u64;
        let (a, z) = (start / align * align, end.div_ceil(align) * align);
        Ok(
            match self.flash.direct_read(ptr.seg, a, (z - a) as usize)? {
                Some(read) => ValueStart::Device(
                    PendingValue {
                        ptr,
                        skip: (start - a) as usize,
                        len: (end - start) as usize,
                    },
                    read,
                ),
                None => ValueStart::Blocking,
            },
        )
    }

    /// The value that `read`, started by [`ValueLog::start_read`] for
    /// `pending` and completed successfully, brought in, checked against
    /// its checksum (a mismatch also when GC reclaimed the segment
    /// meanwhile: see [`ValueLog::is_reclaimed`]).
    pub fn finish_read(pending: PendingValue, read: DirectRead) -> Result<Bytes> {
        let PendingValue { ptr, skip, len } = pending;
        // A slice of the read buffer, not a copy.
        let raw = read.into_bytes().slice(skip..skip + len);
        Self::verified(raw, ptr)
    }

    /// Where the part of segment `seg` still held in memory (sealed chunks
    /// waiting to be written, then the open buffer) begins; everything
    /// before it is on the device. `u64::MAX` when none of it is in memory.
    fn memory_tail_start(inner: &Inner, seg: SegmentId) -> u64 {
        inner
            .pending
            .iter()
            .filter(|c| c.seg == seg)
            .map(|c| c.offset)
            .chain((inner.seg == seg).then_some(inner.buf_offset))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Where the value of the record at `ptr` with key `key` lies; an
    /// error if the pointer cannot hold such a key or ends past the segment.
    fn extent_of(&self, ptr: ValuePtr, key: &[u8]) -> Result<(u64, u64)> {
        match ptr.value_extent(key.len()) {
            Some((start, end)) if end <= self.seg_bytes => Ok((start, end)),
            _ => Err(Error::Corrupt(format!(
                "value pointer {ptr:?} does not fit its key and segment"
            ))),
        }
    }

    /// Checks value bytes read for `ptr` against its checksum.
    fn verified(raw: Bytes, ptr: ValuePtr) -> Result<Bytes> {
        let got = record::value_crc(&raw);
        if got != ptr.value_crc {
            return Err(Error::ChecksumMismatch {
                what: "value",
                expected: ptr.value_crc,
                got,
            });
        }
        Ok(raw)
    }

    fn epoch_of(&self, ptr: ValuePtr) -> Result<u64> {
        match self.segs.read().get(&ptr.seg) {
            Some(m) if m.gen == ptr.gen => Ok(m.epoch),
            _ => Err(Error::Corrupt(format!(
                "dangling value pointer {ptr:?}: segment was reclaimed"
            ))),
        }
    }

    /// Returns exactly the bytes `[start, end)` (within the segment, see
    /// [`Self::extent_of`]) of segment `seg` (of log epoch `epoch`) and
    /// whether the device was read: from the in-memory chunks if they still
    /// hold them, else one device read.
    fn read_range(
        &self,
        seg: SegmentId,
        epoch: u64,
        start: u64,
        end: u64,
    ) -> Result<(Bytes, bool)> {
        if epoch < self.on_device_below.load(Ordering::Acquire) {
            return Ok((self.read_device(seg, start, end)?, true));
        }
        {
            let inner = self.inner.lock();
            let in_memory = inner.seg == seg || inner.pending.iter().any(|c| c.seg == seg);
            if !in_memory {
                drop(inner);
                return Ok((self.read_device(seg, start, end)?, true));
            }
            let mut out = vec![0u8; (end - start) as usize];
            let mut covered_from = end; // memory covers [covered_from, end)
            let pieces = inner
                .pending
                .iter()
                .map(|c| (c.seg, c.offset, &c.data[..c.len]))
                .chain(std::iter::once((
                    inner.seg,
                    inner.buf_offset,
                    &inner.buf[..inner.buf_len],
                )));
            for (piece_seg, off, data) in pieces {
                if piece_seg != seg {
                    continue;
                }
                let (s, e) = (off.max(start), (off + data.len() as u64).min(end));
                if s < e {
                    out[(s - start) as usize..(e - start) as usize]
                        .copy_from_slice(&data[(s - off) as usize..(e - off) as usize]);
                    covered_from = covered_from.min(s);
                }
            }
            if covered_from == start {
                return Ok((out.into(), false));
            }
            if covered_from < end {
                // The head is on the device, the tail still in memory.
                drop(inner);
                let head = self.read_device(seg, start, covered_from)?;
                out[..(covered_from - start) as usize].copy_from_slice(&head);
                return Ok((out.into(), true));
            }
        }
        Ok((self.read_device(seg, start, end)?, true))
    }

    /// Reads `[start, end)` of a segment with one device read, widened to
    /// the device's read granularity.
    pub fn read_device(&self, seg: SegmentId, start: u64, end: u64) -> Result<Bytes> {
        let align = READ_ALIGN as u64;
        let a = start / align * align;
        let b = end.div_ceil(align) * align;
        let mut buf = AlignedBuf::new_zeroed((b - a) as usize);
        self.flash.read(seg, a, &mut buf[..(b - a) as usize])?;
        // A slice of the read buffer, not a copy.
        Ok(Bytes::from_owner(buf).slice((start - a) as usize..(end - a) as usize))
    }

    /// Accounting of every log segment.
    pub fn segments(&self) -> BTreeMap<SegmentId, SegMeta> {
        self.segs.read().clone()
    }

    /// Live value bytes in all segments.
    pub fn live_bytes(&self) -> u64 {
        self.segs.read().values().map(|m| m.live_bytes).sum()
    }

    /// The largest live fraction of a sealed segment (1 when none is
    /// sealed): about what a segment written full of live records holds,
    /// its alignment padding and end aside.
    pub fn densest_live_fraction(&self) -> f64 {
        self.segs
            .read()
            .values()
            .filter(|m| m.sealed)
            .map(SegMeta::live_fraction)
            .reduce(f64::max)
            .unwrap_or(1.0)
    }

    /// Whether a sealed segment is less than `max_live` live: one that GC
    /// would clean to give space back.
    pub fn has_reclaimable(&self, max_live: f64) -> bool {
        self.segs
            .read()
            .values()
            .any(|m| m.sealed && m.live_fraction() < max_live)
    }

    /// The current (open) segment.
    pub fn current_segment(&self) -> SegmentId {
        self.inner.lock().seg
    }

    /// Subtracts dropped value bytes from a segment's live count, if the
    /// pointer still refers to the segment's current life.
    pub fn release_value(&self, ptr: ValuePtr) {
        if let Some(m) = self.segs.write().get_mut(&ptr.seg) {
            if m.gen == ptr.gen {
                m.live_bytes = m.live_bytes.saturating_sub(u64::from(ptr.len));
            }
        }
    }

    /// Holds back the write-behind while the guard lives, so sealed chunks
    /// stay in memory (tests of what a crash loses).
    #[cfg(test)]
    pub(crate) fn hold_writes(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.io.lock()
    }

    /// True if GC has released `ptr`'s segment (or it was reused since):
    /// a read through `ptr` that failed may have raced that release.
    pub fn is_reclaimed(&self, ptr: ValuePtr) -> bool {
        self.segs
            .read()
            .get(&ptr.seg)
            .is_none_or(|m| m.gen != ptr.gen)
    }

    /// Forgets a reclaimed segment.
    pub fn remove_segment(&self, seg: SegmentId) {
        self.segs.write().remove(&seg);
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> usize {
        self.page
    }
}

#[cfg(test)]
mod tests {
    use super::is_aligned_value;

    #[test]
    fn which_values_are_aligned() {
        let aligned = [4096, 4096 + 65, 5000, 4608, 8192, 8192 + 10, 65_546];
        let packed = [
            0,
            100,
            4095,
            4096 + 10,
            4096 + 64,
            4608 + 1,
            8191 - 511 + 64,
        ];
        for len in aligned {
            assert!(is_aligned_value(len), "{len} bytes should be aligned");
        }
        for len in packed {
            assert!(!is_aligned_value(len), "{len} bytes should not be aligned");
        }
    }
}
