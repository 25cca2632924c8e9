//! [`FlashStore`]: the append-only segment store on a [`Device`].
//!
//! Device layout:
//! ```text
//! page 0                      superblock (see superblock.rs)
//! page_size                   checkpoint slot A   (slot_bytes)
//! page_size + slot_bytes      checkpoint slot B   (slot_bytes)
//! data_offset                 segment 0, 1, ... segment_count-1 (segment_bytes each)
//! ```
//! with `data_offset = page_size + 2 * slot_bytes` and `slot_bytes` a multiple
//! of the page size. Checkpoints alternate between the slots: a new one is
//! written (trim, write, sync) into the slot *not* holding the newest valid
//! checkpoint, so a crash at any point leaves that newest one intact.
//!
//! Segment life cycle: `Free --allocate/claim--> Used --release--> PendingFree
//! --next completed checkpoint--> Free`. A released segment stays unerased
//! until a checkpoint that no longer references it is durable. Some Free
//! segments are kept *backed* (their blocks allocated on the host file
//! system) so that deletes and GC find room when other files fill the host
//! (see backing.rs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use parking_lot::Mutex;

use crate::checkpoint::{self, HEADER_LEN};
use crate::device::{AlignedBuf, Device};
use crate::error::{FlashError, Result};
use crate::latency::{DeviceLatency, DeviceLatencySnapshot, DeviceOp};
use crate::readqueue::DirectRead;
use crate::stats::FlashStats;
use crate::superblock::Superblock;
use crate::{SegmentId, IO_ALIGN, READ_ALIGN};

/// Minimum default size of one checkpoint slot.
const MIN_DEFAULT_SLOT_BYTES: u64 = 2 << 20;
/// Default slot room per segment, on top of `DEFAULT_SLOT_HEADROOM`.
const DEFAULT_SLOT_BYTES_PER_SEGMENT: u64 = 64;
/// Default slot room for the user blob.
const DEFAULT_SLOT_HEADROOM: u64 = 1 << 20;

/// Parameters of [`FlashStore::format`].
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// Pages per segment (default 8192: 64 MiB at 8 KiB pages).
    pub pages_per_segment: u32,
    /// Size of each of the two checkpoint slots, rounded up to whole pages.
    /// Default: `max(2 MiB, 64 B * segments + 1 MiB)`.
    pub meta_slot_bytes: Option<u64>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            pages_per_segment: 8192,
            meta_slot_bytes: None,
        }
    }
}

/// Allocation state of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Erasable and allocatable.
    Free,
    /// Allocated to the user.
    Used,
    /// Released; becomes Free once the next checkpoint completes.
    PendingFree,
}

/// Public view of one segment-table entry.
#[derive(Clone, Copy, Debug)]
pub struct SegmentInfo {
    /// Allocation state.
    pub state: SegmentState,
    /// User-defined kind given at allocation (meaningless while Free).
    pub kind: u8,
    /// Number of times the segment was allocated (erased for reuse).
    pub erase_count: u32,
}

/// Shape of a formatted store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Page size in bytes.
    pub page_size: u32,
    /// Pages per segment.
    pub pages_per_segment: u32,
    /// Number of data segments.
    pub segment_count: u32,
}

impl Geometry {
    /// Bytes per segment.
    pub fn segment_bytes(&self) -> u64 {
        u64::from(self.page_size) * u64::from(self.pages_per_segment)
    }
}

/// In-memory state of a segment; `Allocating` is the window in which
/// `allocate` erases a segment outside the table lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    Free,
    Allocating,
    /// Free, being backed by `replenish` outside the table lock.
    Backing,
    Used,
    PendingFree,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub(crate) state: EntryState,
    pub(crate) kind: u8,
    pub(crate) erase_count: u32,
    /// Free and known to have its blocks allocated on the host (see
    /// backing.rs); meaningless in other states.
    pub(crate) backed: bool,
}

impl Entry {
    /// View exposed to users: an allocating segment is already reserved (Used).
    fn info(&self) -> SegmentInfo {
        let state = match self.state {
            EntryState::Free | EntryState::Backing => SegmentState::Free,
            EntryState::Allocating | EntryState::Used => SegmentState::Used,
            EntryState::PendingFree => SegmentState::PendingFree,
        };
        SegmentInfo {
            state,
            kind: self.kind,
            erase_count: self.erase_count,
        }
    }

    /// View persisted by a checkpoint: an allocating segment is not yet handed
    /// out (its erase count is bumped only when the erase succeeds), so Free.
    fn checkpoint_info(&self) -> SegmentInfo {
        match self.state {
            EntryState::Allocating => SegmentInfo {
                state: SegmentState::Free,
                ..self.info()
            },
            _ => self.info(),
        }
    }
}

/// The newest durable checkpoint.
#[derive(Clone, Copy, Debug)]
struct Newest {
    /// Slot index (0 = A, 1 = B) holding it.
    slot: u64,
    sequence: u64,
}

/// The append-only segment store. `Send + Sync`; all methods take `&self`.
///
/// Lock order: `newest` before `table`. Device I/O is never done under
/// `table`; `newest` is held for a whole checkpoint (serializing checkpoints).
pub struct FlashStore {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) geo: Geometry,
    /// Bytes per checkpoint slot; a multiple of the page size.
    slot_bytes: u64,
    /// Byte offset of segment 0.
    data_offset: u64,
    /// Random id of this format; checkpoints carrying another id are invalid.
    format_id: u64,
    pub(crate) table: Mutex<Vec<Entry>>,
    /// How many Free segments to keep backed, and whether the host is full.
    pub(crate) backing: crate::backing::Backing,
    newest: Mutex<Newest>,
    checkpoints: AtomicU64,
    /// Why a device sync failed, once one has: set for good (see
    /// [`FlashStore::sync`]).
    sync_failure: std::sync::OnceLock<String>,
    /// How long each kind of device operation took ([`FlashStore::latency`]).
    latency: Arc<DeviceLatency>,
}

fn round_up(n: u64, to: u64) -> Option<u64> {
    n.checked_next_multiple_of(to)
}

impl FlashStore {
    /// Formats `dev`: erases it, writes an empty checkpoint (empty user blob,
    /// every segment Free) and the superblock, and syncs. Any previous content
    /// becomes unreadable.
    pub fn format(dev: Arc<dyn Device>, opts: &FormatOptions) -> Result<FlashStore> {
        let page_size = dev.page_size();
        let ps = u64::from(page_size);
        if page_size == 0 || !(page_size as usize).is_multiple_of(IO_ALIGN) {
            return Err(FlashError::InvalidArgument(format!(
                "device page size {page_size} is not a multiple of {IO_ALIGN}"
            )));
        }
        if opts.pages_per_segment == 0 {
            return Err(FlashError::InvalidArgument("zero pages per segment".into()));
        }
        let capacity = dev.capacity();
        let segment_bytes = ps * u64::from(opts.pages_per_segment);
        let slot_request = opts.meta_slot_bytes.unwrap_or_else(|| {
            let estimate = capacity / segment_bytes;
            MIN_DEFAULT_SLOT_BYTES.max(
                estimate
                    .saturating_mul(DEFAULT_SLOT_BYTES_PER_SEGMENT)
                    .saturating_add(DEFAULT_SLOT_HEADROOM),
            )
        });
        let too_small = || {
            FlashError::InvalidArgument(format!(
                "device of {capacity} bytes is too small for the requested layout"
            ))
        };
        let slot_bytes = round_up(slot_request, ps)
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                FlashError::InvalidArgument(format!("invalid metadata slot size {slot_request}"))
            })?;
        let data_offset = slot_bytes
            .checked_mul(2)
            .and_then(|s| s.checked_add(ps))
            .ok_or_else(too_small)?;
        let segments = capacity.checked_sub(data_offset).ok_or_else(too_small)? / segment_bytes;
        let segment_count = u32::try_from(segments).unwrap_or(u32::MAX);
        if segment_count == 0 {
            return Err(too_small());
        }
        let needed = checkpoint::encoded_len(segment_count as usize, 0);
        if needed as u64 > slot_bytes {
            return Err(FlashError::MetadataFull {
                needed,
                capacity: slot_bytes as usize,
            });
        }
        let store = FlashStore {
            geo: Geometry {
                page_size,
                pages_per_segment: opts.pages_per_segment,
                segment_count,
            },
            slot_bytes,
            data_offset,
            format_id: rand::random(),
            table: Mutex::new(vec![
                Entry {
                    state: EntryState::Free,
                    kind: 0,
                    erase_count: 0,
                    backed: false,
                };
                segment_count as usize
            ]),
            backing: Default::default(),
            newest: Mutex::new(Newest {
                slot: 0,
                sequence: 1,
            }),
            checkpoints: AtomicU64::new(0),
            sync_failure: std::sync::OnceLock::new(),
            latency: Arc::default(),
            dev,
        };
        // Erase everything (old superblock and checkpoints included), write the
        // first checkpoint, make it durable, and only then the superblock: a
        // crash in between leaves no superblock that points at a missing checkpoint.
        store.dev.trim(0, capacity / ps * ps)?;
        // Both checkpoint slots keep their blocks for good (`write_slot`
        // prepares, never punches), so checkpoints find room on a full host.
        store.dev.prepare(store.slot_offset(0), 2 * slot_bytes)?;
        let table: Vec<SegmentInfo> = store
            .table
            .lock()
            .iter()
            .map(Entry::checkpoint_info)
            .collect();
        store.write_slot(0, &checkpoint::encode(store.format_id, 1, &table, &[]))?;
        store.dev.sync()?;
        let sb = Superblock {
            page_size,
            pages_per_segment: opts.pages_per_segment,
            segment_count,
            slot_bytes,
            data_offset,
            format_id: store.format_id,
        };
        let mut page = AlignedBuf::new_zeroed(page_size as usize);
        let encoded = sb.encode();
        page[..encoded.len()].copy_from_slice(&encoded);
        store.dev.write_at(0, &page)?;
        store.dev.sync()?;
        store.checkpoints.store(1, Ordering::Relaxed);
        Ok(store)
    }

    /// True when the device starts with the superblock magic (it may still be
    /// corrupt; [`FlashStore::open`] checks everything).
    pub fn is_formatted(dev: &dyn Device) -> Result<bool> {
        if dev.capacity() < IO_ALIGN as u64 {
            return Ok(false);
        }
        let mut buf = AlignedBuf::new_zeroed(IO_ALIGN);
        dev.read_at(0, &mut buf)?;
        Ok(Superblock::has_magic(&buf))
    }

    /// Opens a formatted device: validates the superblock, reads both
    /// checkpoint slots and adopts the valid one with the highest sequence (a
    /// torn or corrupt slot is ignored if the other is valid). Returns the
    /// store and that checkpoint's user blob.
    pub fn open(dev: Arc<dyn Device>) -> Result<(FlashStore, Vec<u8>)> {
        if dev.capacity() < IO_ALIGN as u64 {
            return Err(FlashError::BadSuperblock(
                "device smaller than one I/O block".into(),
            ));
        }
        let mut first = AlignedBuf::new_zeroed(IO_ALIGN);
        dev.read_at(0, &mut first)?;
        let sb = Superblock::decode(&first)?;
        Self::validate_layout(&sb, dev.as_ref())?;
        let mut store = FlashStore {
            geo: Geometry {
                page_size: sb.page_size,
                pages_per_segment: sb.pages_per_segment,
                segment_count: sb.segment_count,
            },
            slot_bytes: sb.slot_bytes,
            data_offset: sb.data_offset,
            format_id: sb.format_id,
            table: Mutex::new(Vec::new()),
            backing: Default::default(),
            newest: Mutex::new(Newest {
                slot: 0,
                sequence: 0,
            }),
            checkpoints: AtomicU64::new(0),
            sync_failure: std::sync::OnceLock::new(),
            latency: Arc::default(),
            dev,
        };
        let a = store.read_slot(0)?;
        let b = store.read_slot(1)?;
        let (slot, (sequence, table, user)) = match (a, b) {
            (Ok(a), Ok(b)) if b.0 > a.0 => (1, b),
            (Ok(a), _) => (0, a),
            (Err(_), Ok(b)) => (1, b),
            (Err(ea), Err(eb)) => {
                return Err(FlashError::Corrupt(format!(
                    "no valid checkpoint: slot A: {ea}; slot B: {eb}"
                )));
            }
        };
        let entries = table
            .into_iter()
            .map(|s| Entry {
                state: if s.state == SegmentState::Used {
                    EntryState::Used
                } else {
                    EntryState::Free
                },
                kind: s.kind,
                erase_count: s.erase_count,
                // Unknown until `keep_backed` backs them again.
                backed: false,
            })
            .collect();
        store.table = Mutex::new(entries);
        store.newest = Mutex::new(Newest { slot, sequence });
        Ok((store, user))
    }

    /// Checks that a checksummed superblock describes a layout that fits `dev`.
    fn validate_layout(sb: &Superblock, dev: &dyn Device) -> Result<()> {
        let bad = |m: String| Err(FlashError::BadSuperblock(m));
        let ps = u64::from(sb.page_size);
        if sb.page_size != dev.page_size() {
            return bad(format!(
                "page size {} but device has {}",
                sb.page_size,
                dev.page_size()
            ));
        }
        if sb.pages_per_segment == 0 || sb.segment_count == 0 {
            return bad("zero pages per segment or zero segments".into());
        }
        if sb.slot_bytes == 0
            || !sb.slot_bytes.is_multiple_of(ps)
            || (sb.slot_bytes as usize) < HEADER_LEN
        {
            return bad(format!(
                "slot size {} is not a positive multiple of the page size",
                sb.slot_bytes
            ));
        }
        let expected_offset = sb.slot_bytes.checked_mul(2).and_then(|s| s.checked_add(ps));
        if expected_offset != Some(sb.data_offset) {
            return bad(format!(
                "data offset {} inconsistent with slot size {}",
                sb.data_offset, sb.slot_bytes
            ));
        }
        let end = (ps * u64::from(sb.pages_per_segment))
            .checked_mul(u64::from(sb.segment_count))
            .and_then(|d| d.checked_add(sb.data_offset));
        match end {
            Some(end) if end <= dev.capacity() => Ok(()),
            _ => bad(format!("layout exceeds device capacity {}", dev.capacity())),
        }
    }

    /// Byte offset of checkpoint slot `slot` (0 or 1).
    fn slot_offset(&self, slot: u64) -> u64 {
        u64::from(self.geo.page_size) + slot * self.slot_bytes
    }

    /// Reads and decodes one slot. The outer error is an I/O failure (fatal);
    /// the inner one says why the slot holds no valid checkpoint.
    #[allow(clippy::type_complexity)]
    fn read_slot(&self, slot: u64) -> Result<Result<(u64, Vec<SegmentInfo>, Vec<u8>)>> {
        let offset = self.slot_offset(slot);
        let mut head = AlignedBuf::new_zeroed(IO_ALIGN);
        self.dev.read_at(offset, &mut head)?;
        let max_body = self.slot_bytes as usize - HEADER_LEN;
        let header = match checkpoint::decode_header(&head, self.format_id, max_body) {
            Ok(h) => h,
            Err(e) if is_corruption(&e) => return Ok(Err(e)),
            Err(e) => return Err(e),
        };
        // HEADER_LEN + body_len <= slot_bytes, a multiple of IO_ALIGN, so this stays in the slot.
        let mut whole = AlignedBuf::new_zeroed(HEADER_LEN + header.body_len);
        self.dev.read_at(offset, &mut whole)?;
        match checkpoint::decode_body(&header, &whole[HEADER_LEN..], self.geo.segment_count) {
            Ok((table, user)) => Ok(Ok((header.sequence, table, user))),
            Err(e) if is_corruption(&e) => Ok(Err(e)),
            Err(e) => Err(e),
        }
    }

    /// Erases slot `slot` and writes `bytes` (padded to whole pages) into
    /// it. Not synced. The slot keeps its blocks ([`Device::prepare`]), so
    /// a checkpoint finds room even on a full host file system.
    fn write_slot(&self, slot: u64, bytes: &[u8]) -> Result<()> {
        let offset = self.slot_offset(slot);
        self.device_op(DeviceOp::Prepare, || {
            self.dev.prepare(offset, self.slot_bytes)
        })?;
        let padded =
            round_up(bytes.len() as u64, u64::from(self.geo.page_size)).unwrap_or(self.slot_bytes);
        let mut buf = AlignedBuf::new_zeroed(padded as usize);
        buf[..bytes.len()].copy_from_slice(bytes);
        self.device_op(DeviceOp::Write, || self.dev.write_at(offset, &buf))
    }

    /// The store's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The underlying device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    fn check_segment(&self, seg: SegmentId) -> Result<()> {
        if seg < self.geo.segment_count {
            Ok(())
        } else {
            Err(FlashError::InvalidSegment(seg))
        }
    }

    /// Device byte offset of segment `seg` (must be valid).
    pub(crate) fn segment_offset(&self, seg: SegmentId) -> u64 {
        self.data_offset + u64::from(seg) * self.geo.segment_bytes()
    }

    /// Recovery: marks a segment that the last checkpoint shows Free as Used
    /// *without* erasing it (it was allocated and written after that
    /// checkpoint), bumping its erase count exactly as `allocate` did. Returns
    /// the new erase count.
    pub fn claim(&self, seg: SegmentId, kind: u8) -> Result<u32> {
        self.check_segment(seg)?;
        let mut table = self.table.lock();
        let entry = &mut table[seg as usize];
        if entry.state != EntryState::Free {
            return Err(FlashError::InvalidArgument(format!(
                "claim of segment {seg} which is {:?}, not Free",
                entry.info().state
            )));
        }
        *entry = Entry {
            state: EntryState::Used,
            kind,
            erase_count: entry.erase_count.saturating_add(1),
            backed: false,
        };
        Ok(entry.erase_count)
    }

    /// Writes whole pages at page index `page` of Used segment `seg`.
    /// Pages must be written at most once between erases (append-only).
    pub fn write(&self, seg: SegmentId, page: u32, data: &[u8]) -> Result<()> {
        let at = self.write_offset(seg, page, data.len())?;
        self.device_op(DeviceOp::Write, || self.dev.write_at(at, data))
    }

    /// Writes each `(seg, page, data)` as [`Self::write`] does, in parallel
    /// where the device can; on error, how many writes, counted from the
    /// first, completed before the first that failed, with its error
    /// (later ones may be on the device too).
    pub fn write_many(
        &self,
        writes: &[(SegmentId, u32, &[u8])],
    ) -> std::result::Result<(), (usize, FlashError)> {
        let mut at = Vec::with_capacity(writes.len());
        for (i, &(seg, page, data)) in writes.iter().enumerate() {
            at.push((
                self.write_offset(seg, page, data.len())
                    .map_err(|e| (i, e))?,
                data,
            ));
        }
        self.device_op(DeviceOp::Write, || self.dev.write_many(&at))
    }

    /// Validates a write of `len` bytes at `page` of `seg`; returns the
    /// device offset.
    fn write_offset(&self, seg: SegmentId, page: u32, len: usize) -> Result<u64> {
        self.check_segment(seg)?;
        let ps = self.geo.page_size as usize;
        if !len.is_multiple_of(ps) {
            return Err(FlashError::Misaligned(format!(
                "write of {len} bytes is not whole {ps}-byte pages"
            )));
        }
        let pages = (len / ps) as u64;
        if u64::from(page) + pages > u64::from(self.geo.pages_per_segment) {
            return Err(FlashError::OutOfRange(format!(
                "write of {pages} pages at page {page} exceeds segment of {} pages",
                self.geo.pages_per_segment
            )));
        }
        let state = self.table.lock()[seg as usize].state;
        if state != EntryState::Used {
            return Err(FlashError::InvalidArgument(format!(
                "write to segment {seg} which is {state:?}, not Used"
            )));
        }
        Ok(self.segment_offset(seg) + u64::from(page) * ps as u64)
    }

    /// Validates a read of `len` bytes at byte `offset` of `seg`; returns the device offset.
    fn read_offset(&self, seg: SegmentId, offset: u64, len: usize) -> Result<u64> {
        self.check_segment(seg)?;
        if !offset.is_multiple_of(READ_ALIGN as u64) || !len.is_multiple_of(READ_ALIGN) {
            return Err(FlashError::Misaligned(format!(
                "read at {offset} of {len} bytes is not {READ_ALIGN}-byte aligned"
            )));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.geo.segment_bytes() => Ok(self.segment_offset(seg) + offset),
            _ => Err(FlashError::OutOfRange(format!(
                "read at {offset} of {len} bytes exceeds segment of {} bytes",
                self.geo.segment_bytes()
            ))),
        }
    }

    /// Reads `buf.len()` bytes at byte `offset` of segment `seg` (any state:
    /// recovery reads segments the checkpoint shows Free). Offset and length
    /// must be multiples of [`IO_ALIGN`].
    pub fn read(&self, seg: SegmentId, offset: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.read_offset(seg, offset, buf.len())?;
        self.device_op(DeviceOp::Read, || self.dev.read_at(at, buf))
    }

    /// A [`FlashStore::read`] of `len` bytes at byte `offset` of segment
    /// `seg` to be run on a [`crate::ReadQueue`]; `None` when the device
    /// cannot read that range that way (then use [`FlashStore::read`]).
    pub fn direct_read(
        &self,
        seg: SegmentId,
        offset: u64,
        len: usize,
    ) -> Result<Option<DirectRead>> {
        let at = self.read_offset(seg, offset, len)?;
        Ok(self.dev.read_fd(at, len).map(|fd| {
            DirectRead::new(Arc::clone(&self.dev), fd, at, len)
                .timed_into(Arc::clone(&self.latency))
        }))
    }

    /// Reads each `(segment, offset, len)` of `extents` into a buffer of its
    /// own that is not zeroed first, all in flight together
    /// ([`crate::read_now`]): each buffer's first `len` bytes are the
    /// extent's. `Ok(None)` when this device or thread cannot (no io_uring,
    /// an extent direct I/O cannot read as laid out) or the batch failed:
    /// the caller then reads with [`FlashStore::read_many`], which also
    /// reports a real error as such.
    pub fn read_now(&self, extents: &[(SegmentId, u64, usize)]) -> Result<Option<Vec<Bytes>>> {
        let mut reads = Vec::with_capacity(extents.len());
        for &(seg, offset, len) in extents {
            match self.direct_read(seg, offset, len)? {
                Some(read) => reads.push(read),
                None => return Ok(None),
            }
        }
        match self.device_op(DeviceOp::Read, || crate::read_now(&mut reads)) {
            Some(Ok(())) => Ok(Some(
                reads.into_iter().map(DirectRead::into_bytes).collect(),
            )),
            Some(Err(_)) | None => Ok(None),
        }
    }

    /// Several [`FlashStore::read`]s, issued in parallel when the device can.
    pub fn read_many(&self, reqs: &mut [(SegmentId, u64, &mut [u8])]) -> Result<()> {
        let mut dev_reqs = Vec::with_capacity(reqs.len());
        for (seg, offset, buf) in reqs.iter_mut() {
            let at = self.read_offset(*seg, *offset, buf.len())?;
            dev_reqs.push((at, &mut **buf));
        }
        self.device_op(DeviceOp::Read, || self.dev.read_many(&mut dev_reqs))
    }

    /// Makes all completed writes durable.
    ///
    /// A failed sync is sticky: after it, the kernel may have dropped the
    /// dirty pages it could not write (and marked them clean), so a later
    /// sync could succeed without them. Every later sync, and every
    /// checkpoint, fails with [`FlashError::SyncFailed`] until the store is
    /// reopened, which finds what is really durable. A power loss (emulated
    /// devices) is reported as such and stops the device anyway.
    pub fn sync(&self) -> Result<()> {
        self.check_synced()?;
        self.device_op(DeviceOp::Sync, || self.dev.sync())
            .map_err(|e| self.note_sync_failure(e))
    }

    /// `Err(SyncFailed)` once a device sync has failed.
    fn check_synced(&self) -> Result<()> {
        match self.sync_failure.get() {
            Some(why) => Err(FlashError::SyncFailed(why.clone())),
            None => Ok(()),
        }
    }

    /// Records a failed device sync for good (the first failure's text is
    /// kept); the error to return.
    fn note_sync_failure(&self, e: FlashError) -> FlashError {
        if matches!(e, FlashError::PowerLoss) {
            return e;
        }
        FlashError::SyncFailed(self.sync_failure.get_or_init(|| e.to_string()).clone())
    }

    /// Why a device sync failed, if one has (then nothing more is made
    /// durable until the store is reopened).
    pub fn sync_failure(&self) -> Option<&str> {
        self.sync_failure.get().map(String::as_str)
    }

    /// How long each kind of device operation took since the store was
    /// opened (see [`crate::DeviceLatency`]).
    pub fn latency(&self) -> DeviceLatencySnapshot {
        self.latency.snapshot()
    }

    /// Runs one device operation `f`: its time is charged to the calling
    /// thread ([`crate::iotime`]) and recorded as `op` in [`Self::latency`].
    pub(crate) fn device_op<T>(&self, op: DeviceOp, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let took = start.elapsed();
        crate::iotime::charge(took);
        self.latency.record(op, took);
        out
    }

    /// Releases a Used segment: it becomes PendingFree, and Free (erased) only
    /// after the next checkpoint completes, because the newest durable
    /// checkpoint may still reference its content.
    pub fn release(&self, seg: SegmentId) -> Result<()> {
        self.check_segment(seg)?;
        let mut table = self.table.lock();
        let entry = &mut table[seg as usize];
        if entry.state != EntryState::Used {
            return Err(FlashError::InvalidArgument(format!(
                "release of segment {seg} which is {:?}, not Used",
                entry.info().state
            )));
        }
        entry.state = EntryState::PendingFree;
        Ok(())
    }

    /// Atomically persists the segment table (PendingFree recorded as Free)
    /// and `user` into the slot not holding the newest checkpoint (trim it,
    /// write, sync), then erases the segments that were PendingFree and marks
    /// them Free. A crash at any point leaves the previous or the new
    /// checkpoint readable. On error nothing is freed.
    pub fn checkpoint(&self, user: &[u8]) -> Result<()> {
        let mut newest = self.newest.lock();
        let (table, pending): (Vec<SegmentInfo>, Vec<SegmentId>) = {
            let table = self.table.lock();
            let pending = (0..table.len())
                .filter(|&i| table[i].state == EntryState::PendingFree)
                .map(|i| i as SegmentId)
                .collect();
            (table.iter().map(Entry::checkpoint_info).collect(), pending)
        };
        let needed = checkpoint::encoded_len(table.len(), user.len());
        if needed as u64 > self.slot_bytes {
            return Err(FlashError::MetadataFull {
                needed,
                capacity: self.slot_bytes as usize,
            });
        }
        let target = 1 - newest.slot;
        let sequence = newest.sequence + 1;
        self.check_synced()?;
        self.write_slot(
            target,
            &checkpoint::encode(self.format_id, sequence, &table, user),
        )?;
        self.device_op(DeviceOp::Sync, || self.dev.sync())
            .map_err(|e| self.note_sync_failure(e))?;
        *newest = Newest {
            slot: target,
            sequence,
        };
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        // The new checkpoint is durable and references none of `pending`. Erase
        // each before marking it Free, so the erase cannot hit a reallocated
        // segment; holding `newest` keeps a concurrent checkpoint from doing the same.
        for seg in pending {
            self.free_released(seg)?;
        }
        Ok(())
    }

    /// State of one segment.
    pub fn segment_info(&self, seg: SegmentId) -> Result<SegmentInfo> {
        self.check_segment(seg)?;
        Ok(self.table.lock()[seg as usize].info())
    }

    /// States of all segments, indexed by segment id.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.table.lock().iter().map(Entry::info).collect()
    }

    /// Number of Free segments that can be written: all of them, or only
    /// the backed ones while the host file system is full
    /// ([`FlashStore::host_full`]). Cheaper than [`FlashStore::stats`].
    pub fn free_segments(&self) -> u32 {
        self.usable_free(&self.table.lock())
    }

    /// Number of PendingFree segments: released, free at the next
    /// checkpoint (cheaper than [`FlashStore::stats`]).
    pub fn pending_free_segments(&self) -> u32 {
        self.table
            .lock()
            .iter()
            .filter(|e| e.state == EntryState::PendingFree)
            .count() as u32
    }

    /// Statistics: segment states, wear and device counters.
    pub fn stats(&self) -> FlashStats {
        let mut stats = FlashStats {
            segments_total: self.geo.segment_count,
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            device: self.dev.counters(),
            ..FlashStats::default()
        };
        let mut erase_sum = 0u64;
        for info in self.segments() {
            match info.state {
                SegmentState::Free => stats.segments_free += 1,
                SegmentState::Used => stats.segments_used += 1,
                SegmentState::PendingFree => stats.segments_pending_free += 1,
            }
            stats.erase_count_max = stats.erase_count_max.max(info.erase_count);
            erase_sum += u64::from(info.erase_count);
        }
        stats.erase_count_avg = erase_sum as f64 / f64::from(self.geo.segment_count.max(1));
        stats.segments_backed = self.backed_free(&self.table.lock());
        stats.host_full = self.host_full();
        stats
    }
}

/// True for errors that mean "this on-disk structure is invalid" (as opposed
/// to an I/O failure, which must be reported rather than treated as a bad slot).
fn is_corruption(e: &FlashError) -> bool {
    matches!(
        e,
        FlashError::Corrupt(_) | FlashError::ChecksumMismatch { .. }
    )
}

impl std::fmt::Debug for FlashStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashStore")
            .field("geometry", &self.geo)
            .field("slot_bytes", &self.slot_bytes)
            .field("data_offset", &self.data_offset)
            .field("device", &self.dev)
            .finish()
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
