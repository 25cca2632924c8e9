//! Opening a store: format a blank device, load the manifest from the newest
//! valid checkpoint, rebuild the level index from the keytables, then replay
//! the value-log tail from the checkpoint's position. The tail is followed
//! through `LINK` records and cut at the first record that fails its
//! checksum (a torn or lost page): nothing after a cut is ever served, and a
//! batch is applied only if all its records made it. The recovered memtable
//! is flushed and a checkpoint with a new boot number is written, so opening
//! always works without a repair step.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use bytes::Bytes;
use flash::{AlignedBuf, Device, FlashStore, FormatOptions, SegmentId, SegmentState};
use parking_lot::{Mutex, RwLock};

use crate::cache::BlockCache;
use crate::db::{DbInner, MaintState, SuperVersion};
use crate::error::{Error, Result};
use crate::keytable::KeytableIndex;
use crate::ktwriter::KeytableWriter;
use crate::manifest::Manifest;
use crate::memtable::Memtable;
use crate::options::Options;
use crate::record::{self, FLAG_BATCH_CONTINUES, HEADER_LEN};
use crate::segreader::SegmentReader;
use crate::signal::MaintSignal;
use crate::stats::Counters;
use crate::types::{Kind, SeqNo, ValuePtr};
use crate::version::{Keytable, ReadCtx, SegmentRef, Version};
use crate::vlog::{max_record_len, LogPosition, SegMeta, ValueLog};

fn format_options(device: &dyn Device, opts: &Options) -> FormatOptions {
    let page = u64::from(device.page_size());
    let pages = opts.format_segment_pages.unwrap_or_else(|| {
        // 128 MiB segments (room for 64 MiB values), smaller on small
        // devices so there are at least 16 segments.
        let per = device.capacity() / page / 16;
        let mut p = (128u64 << 20) / page;
        while p > per && p > 16 {
            p /= 2;
        }
        p as u32
    });
    FormatOptions {
        pages_per_segment: pages,
        meta_slot_bytes: None,
    }
}

/// Free segments kept backed by the host file system: the reserve that
/// deletes and GC may use (`reserved_segments`), one for the flush of what
/// user writes appended, and two for the compactions that turn deletes
/// into garbage GC can reclaim (fewer left deletes waiting for room that
/// compactions had taken, in `a_host_filled_by_other_files_...`).
fn backed_reserve(opts: &Options) -> u32 {
    opts.reserved_segments + 3
}

fn validate(opts: &mut Options, seg_bytes: u64, page: usize) -> Result<()> {
    if opts.max_key_size == 0 || opts.max_key_size > 8 * 1024 {
        return Err(Error::InvalidOptions(
            "max_key_size must be 1..=8192".into(),
        ));
    }
    if opts.keytable_bytes as u64 * 2 > seg_bytes {
        opts.keytable_bytes = (seg_bytes / 2) as usize;
    }
    let fit = max_record_len(seg_bytes, page).saturating_sub(opts.max_key_size + HEADER_LEN);
    if fit == 0 {
        return Err(Error::InvalidOptions(format!(
            "segments of {seg_bytes} bytes are too small"
        )));
    }
    opts.max_value_size = opts.max_value_size.min(fit);
    opts.log_chunk_bytes = opts.log_chunk_bytes.clamp(page, (seg_bytes / 4) as usize);
    Ok(())
}

/// Opens or formats the store on `device`.
pub(crate) fn open(device: Arc<dyn Device>, mut opts: Options) -> Result<DbInner> {
    let (flash, blob) = if FlashStore::is_formatted(&*device)? {
        FlashStore::open(device)?
    } else {
        let fo = format_options(&*device, &opts);
        (FlashStore::format(device, &fo)?, Vec::new())
    };
    let flash = Arc::new(flash);
    let geo = flash.geometry();
    let page = geo.page_size as usize;
    validate(&mut opts, geo.segment_bytes(), page)?;
    let manifest = if blob.is_empty() {
        Manifest::default()
    } else {
        Manifest::decode(&blob)?
    };
    let boot = manifest.boot + 1;
    let cache = Arc::new(BlockCache::new(opts.cache_bytes));
    let release_queue = Arc::new(Mutex::new(Vec::new()));
    let ctx = ReadCtx {
        flash: flash.clone(),
        cache: cache.clone(),
        block_reads: AtomicU64::new(0),
    };

    // Keytables and their segments.
    let mut seg_refs: HashMap<SegmentId, Arc<SegmentRef>> = HashMap::new();
    let mut seg_ref = |seg: SegmentId| {
        seg_refs
            .entry(seg)
            .or_insert_with(|| SegmentRef::new(seg, release_queue.clone()))
            .clone()
    };
    let mut levels = Vec::new();
    for metas in &manifest.levels {
        let mut level = Vec::new();
        for m in metas {
            let mut buf = AlignedBuf::new_zeroed(m.index_pages as usize * page);
            let at = u64::from(m.first_page + m.data_pages) * page as u64;
            flash.read(m.seg, at, &mut buf)?;
            let index = KeytableIndex::decode(&buf, m.id)?;
            level.push(Arc::new(Keytable::new(
                m.id,
                seg_ref(m.seg),
                m.first_page,
                m.data_pages,
                m.index_pages,
                index,
                true,
                cache.clone(),
            )));
        }
        levels.push(level);
    }
    // The keytable segment being filled at the checkpoint is not appended to
    // again; it is released once none of its keytables is alive.
    if let Some(seg) = manifest.keytable_segment {
        drop(seg_ref(seg));
    }
    warm_cache(
        &flash,
        &cache,
        &levels,
        page,
        opts.cache_bytes.min(opts.dram_budget),
    )?;
    let kt_segments: HashSet<SegmentId> = seg_refs.keys().copied().collect();
    drop(seg_refs);

    // Replay the log tail.
    let mut segs: BTreeMap<SegmentId, SegMeta> = manifest.log_segments.iter().copied().collect();
    let counted_upto: HashMap<SegmentId, u64> =
        segs.iter().map(|(s, m)| (*s, m.written_bytes)).collect();
    let mem = Memtable::new();
    let mut last_seq = manifest.last_seq;
    if manifest.replay.epoch != 0 {
        let (max_seq, end_epoch) = replay(&flash, manifest.replay, &mut segs, &counted_upto, &mem)?;
        last_seq = last_seq.max(max_seq);
        // Segments the manifest lists after the one where the log ended held
        // only records appended after the replay position and lost at the
        // crash (had any been synced, the log up to them would have been
        // too, and replay would have reached them). Nothing refers to them:
        // they are released below with the other unreferenced segments.
        segs.retain(|_, m| m.epoch <= end_epoch);
    }
    for m in segs.values_mut() {
        m.sealed = true;
        // The manifest counted live bytes of records that the crash may
        // have lost from a segment's tail; live never exceeds written.
        m.live_bytes = m.live_bytes.min(m.written_bytes);
    }
    let log_segments: HashSet<SegmentId> = segs.keys().copied().collect();

    // Release segments nothing references (written after the checkpoint by
    // a run that crashed before linking or recording them).
    for (i, info) in flash.segments().iter().enumerate() {
        let seg = i as SegmentId;
        if info.state == SegmentState::Used
            && !log_segments.contains(&seg)
            && !kt_segments.contains(&seg)
        {
            flash.release(seg)?;
        }
    }

    // Keep the segments that deletes, GC and flushes may need backed by the
    // host file system (see flash's `keep_backed`): when other files fill
    // it, they still have room. Only after every written segment is
    // claimed, since backing erases.
    match flash.keep_backed(backed_reserve(&opts)) {
        Ok(()) => {}
        Err(e) if e.is_host_full() => {
            tracing::warn!(error = %e, "open: the host file system has no room for the reserve segments");
        }
        Err(e) => return Err(e.into()),
    }
    let vlog = ValueLog::open(
        flash.clone(),
        segs,
        boot << 32,
        last_seq,
        opts.log_chunk_bytes,
        opts.reserved_segments,
    )?;
    let device_now = flash.stats().device.bytes_written;
    let inner = DbInner {
        page,
        flash: flash.clone(),
        vlog,
        ctx,
        sv: RwLock::new(Arc::new(SuperVersion {
            mem: Arc::new(mem),
            imm: None,
            version: Arc::new({
                let runs = manifest.runs as usize;
                let run_writes = levels
                    .iter()
                    .take(runs)
                    .flatten()
                    .map(|kt| kt.index.entries)
                    .sum();
                Version {
                    levels,
                    runs,
                    run_writes,
                }
            }),
        })),
        visible_seq: AtomicU64::new(last_seq),
        snapshots: Mutex::new(BTreeMap::new()),
        maint: Mutex::new(MaintState {
            boot,
            kt: KeytableWriter::new(manifest.next_keytable_id.max(1)),
            replay: manifest.replay,
            flushed_seq: manifest.last_seq,
            imm_replay: None,
            gc: Default::default(),
            compact_cursor: Vec::new(),
            forced_compactions: 0,
        }),
        device_bytes_base: manifest.counters.device_bytes.saturating_sub(device_now),
        user_bytes_base: manifest.counters.user_bytes,
        release_queue,
        counters: Counters::default(),
        signal: MaintSignal::new(),
        bg_error: Mutex::new(None),
        boot_checkpoint: Mutex::new(None),
        free_hint: AtomicU32::new(u32::MAX),
        opts,
    };
    inner.apply_dram_budget();
    // Persist the recovered tail in keytables and the new boot number. On a
    // full host file system the store still opens, for reads: maintenance
    // retries this, and writes wait for it.
    match inner.flush_now() {
        Ok(()) => {}
        Err(Error::HostFull(why)) => {
            tracing::warn!(error = %why, "open: cannot write the first checkpoint yet; reads only until there is room");
            *inner.boot_checkpoint.lock() = Some(why);
        }
        Err(e) => return Err(e),
    }
    Ok(inner)
}

/// Loads every keytable block into the cache when they all fit (the paper's
/// fully cached keytables): one large read per keytable at open instead of
/// a device read on the first GET that touches each block.
fn warm_cache(
    flash: &FlashStore,
    cache: &BlockCache,
    levels: &[Vec<Arc<Keytable>>],
    page: usize,
    budget: usize,
) -> Result<()> {
    let total: usize = levels
        .iter()
        .flatten()
        .map(|kt| kt.data_pages as usize * page)
        .sum();
    if total == 0 || total > budget / 2 {
        return Ok(());
    }
    for kt in levels.iter().flatten() {
        let len = kt.data_pages as usize * page;
        let mut buf = AlignedBuf::new_zeroed(len);
        flash.read(
            kt.seg.seg(),
            u64::from(kt.first_page) * page as u64,
            &mut buf[..len],
        )?;
        for (i, h) in kt.index.blocks.iter().enumerate() {
            let (s, e) = (h.page as usize * page, (h.page + h.pages) as usize * page);
            // A corrupt block is left out: the GETs that need it report the
            // checksum error; the rest of the store stays readable.
            match crate::keytable::Block::parse(buf[s..e].to_vec(), kt.id) {
                Ok(block) => cache.insert(kt.id, i as u32, Arc::new(block)),
                Err(err) => {
                    tracing::warn!(keytable = kt.id, block = i, %err, "not caching a corrupt keytable block")
                }
            }
        }
    }
    Ok(())
}

/// Scans the log from `start`, inserting complete batches into `mem`.
/// Returns the largest sequence number seen and the epoch of the segment
/// where the log ends.
fn replay(
    flash: &Arc<FlashStore>,
    start: LogPosition,
    segs: &mut BTreeMap<SegmentId, SegMeta>,
    counted_upto: &HashMap<SegmentId, u64>,
    mem: &Memtable,
) -> Result<(SeqNo, u64)> {
    let seg_bytes = flash.geometry().segment_bytes();
    let page = flash.geometry().page_size as u64;
    // A reader needs a ValueLog only for `read_device`; use a scratch one
    // that never appends.
    let reader_log = ScratchReader {
        flash: flash.clone(),
    };
    let mut pos = start;
    let Some(mut meta) = segs.get(&pos.seg).copied() else {
        return Err(Error::Corrupt(format!(
            "replay segment {} is not a log segment in the manifest",
            pos.seg
        )));
    };
    // What a segment holds from the replay position on is what replay finds
    // there: the manifest counted bytes appended when it was written, and
    // those not yet synced may have been lost (GC must not scan them).
    if let Some(m) = segs.get_mut(&pos.seg) {
        m.written_bytes = u64::from(pos.offset);
    }
    let mut max_seq = 0;
    let mut batch: Vec<(Bytes, SeqNo, Kind, ValuePtr, crate::tag::Tagging)> = Vec::new();
    let mut off = u64::from(pos.offset);
    'segments: loop {
        let mut reader = reader_log.reader(pos.seg);
        loop {
            if page - off % page < HEADER_LEN as u64 {
                off += page - off % page;
            }
            if off + HEADER_LEN as u64 > seg_bytes {
                break 'segments;
            }
            let Some(h) = record::Header::parse(reader.window(off, HEADER_LEN)?) else {
                break 'segments;
            };
            let len = h.record_len() as u64;
            if off + len > seg_bytes {
                break 'segments;
            }
            let bytes = reader.window(off, len as usize)?;
            let Ok(rec) = record::decode(bytes, pos.epoch) else {
                break 'segments;
            };
            match rec.header.kind {
                record::KIND_PUT | record::KIND_DELETE => {
                    let kind = if rec.header.kind == record::KIND_PUT {
                        Kind::Put
                    } else {
                        Kind::Delete
                    };
                    let ptr = ValuePtr {
                        seg: pos.seg,
                        gen: meta.gen,
                        offset: off as u32,
                        len: len as u32,
                        value_crc: record::value_crc(rec.value),
                    };
                    let tag = if kind == Kind::Put {
                        crate::tag::Tagging::of(rec.value)
                    } else {
                        crate::tag::Tagging::Unknown
                    };
                    batch.push((
                        Bytes::copy_from_slice(rec.key),
                        rec.header.seq,
                        kind,
                        ptr,
                        tag,
                    ));
                    if rec.header.flags & FLAG_BATCH_CONTINUES == 0 {
                        for (key, seq, kind, ptr, tag) in batch.drain(..) {
                            let already = counted_upto
                                .get(&ptr.seg)
                                .is_some_and(|&c| u64::from(ptr.offset) < c);
                            if kind == Kind::Put && !already {
                                if let Some(m) = segs.get_mut(&ptr.seg) {
                                    m.live_bytes += u64::from(ptr.len);
                                }
                            }
                            max_seq = max_seq.max(seq);
                            mem.insert(&key, seq, kind, ptr, tag);
                        }
                        if let Some(m) = segs.get_mut(&pos.seg) {
                            m.written_bytes = off + len;
                        }
                    }
                }
                record::KIND_LINK => {
                    let Some((next, next_epoch)) = record::parse_link_value(rec.value) else {
                        break 'segments;
                    };
                    batch.clear(); // batches never span segments
                    if let Some(m) = segs.get_mut(&pos.seg) {
                        m.written_bytes = off + len;
                        m.sealed = true;
                    }
                    let Some(next_meta) = follow_link(flash, &reader_log, next, next_epoch, segs)?
                    else {
                        break 'segments;
                    };
                    meta = next_meta;
                    pos = LogPosition {
                        seg: next,
                        offset: 0,
                        epoch: next_epoch,
                    };
                    off = 0;
                    continue 'segments;
                }
                _ => {}
            }
            off += len;
        }
    }
    Ok((max_seq, pos.epoch))
}

/// Validates the segment a LINK names; claims it if the checkpoint shows it
/// free. `None` if its header never reached the device (end of log): a
/// segment the manifest lists is checked too, since the manifest may have
/// been written after the writer switched to it but before its first page
/// was synced. On return the segment counts its header as written.
fn follow_link(
    flash: &Arc<FlashStore>,
    reader_log: &ScratchReader,
    next: SegmentId,
    next_epoch: u64,
    segs: &mut BTreeMap<SegmentId, SegMeta>,
) -> Result<Option<SegMeta>> {
    // What the segment is once its header checks out: the manifest's entry;
    // for a segment the checkpoint shows Free (allocated after it), nothing
    // yet: it is claimed below; and for one the checkpoint shows Used as a
    // log segment though its manifest does not list it, a new entry. That
    // one was allocated while the checkpoint was taken: the manifest's list
    // of log segments was read a moment before the segment table, and a
    // writer switched segments in between. Its erase count already counts
    // that allocation.
    let known = match segs.get(&next) {
        Some(m) if m.epoch != next_epoch => return Ok(None),
        Some(m) => Some(*m),
        None => match flash.segment_info(next) {
            Ok(info) if info.state == SegmentState::Free => None,
            Ok(info)
                if info.state == SegmentState::Used
                    && info.kind == crate::vlog::SEGMENT_KIND_LOG =>
            {
                Some(SegMeta {
                    epoch: next_epoch,
                    gen: info.erase_count,
                    ..SegMeta::default()
                })
            }
            _ => return Ok(None),
        },
    };
    let mut reader = reader_log.reader(next);
    let Some(h) = record::Header::parse(reader.window(0, HEADER_LEN)?) else {
        return Ok(None);
    };
    let bytes = reader.window(0, h.record_len())?;
    let ok = match record::decode(bytes, next_epoch) {
        Ok(r) => {
            r.header.kind == record::KIND_SEGMENT_HEADER
                && record::parse_link_value(r.value) == Some((next, next_epoch))
        }
        Err(_) => false,
    };
    if !ok {
        return Ok(None);
    }
    let base = match known {
        Some(m) => m,
        None => SegMeta {
            epoch: next_epoch,
            gen: flash.claim(next, crate::vlog::SEGMENT_KIND_LOG)?,
            ..SegMeta::default()
        },
    };
    let meta = SegMeta {
        written_bytes: h.record_len() as u64,
        ..base
    };
    segs.insert(next, meta);
    Ok(Some(meta))
}

/// Reads segments for replay without a running value log.
struct ScratchReader {
    flash: Arc<FlashStore>,
}

impl ScratchReader {
    fn reader(&self, seg: SegmentId) -> SegmentReader<'_> {
        SegmentReader::new(&self.flash, seg)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flash::{NandDevice, SegmentId};

    use crate::test_support::nand_device as device;
    use crate::{Db, Durability, Options};

    /// Test options with a memtable large enough that nothing is flushed
    /// unless a test asks: what these tests write stays in the log tail.
    fn opts(durability: Durability) -> Options {
        Options {
            durability,
            memtable_bytes: 1 << 20,
            memtable_log_bytes: 4 << 20,
            ..Options::small_for_tests()
        }
    }

    fn key(i: u32) -> Vec<u8> {
        format!("key{i:04}").into_bytes()
    }

    fn value(i: u32, version: u8) -> Vec<u8> {
        vec![version.wrapping_add(i as u8); 3000]
    }

    fn power_cut(dev: &Arc<NandDevice>, db: Db) -> Db {
        dev.cut_power_now();
        drop(db);
        dev.power_cycle(7);
        Db::open(dev.clone(), opts(Durability::Sync)).expect("reopen")
    }

    /// Puts keys `n, n + 1, ...` until the log switches to a new segment;
    /// returns the next key number.
    fn fill_until_the_log_switches(db: &Db, mut n: u32) -> u32 {
        let first = db.inner.vlog.current_segment();
        while db.inner.vlog.current_segment() == first {
            db.put(&key(n), &value(n, 1)).expect("put");
            n += 1;
        }
        n
    }

    /// Writes a checkpoint now, as flush, compaction and GC do.
    fn checkpoint_now(db: &Db) {
        let mut st = db.inner.maint.lock();
        db.inner.checkpoint(&mut st).expect("checkpoint");
    }

    /// The current log segment and its epoch.
    fn current_segment(db: &Db) -> (SegmentId, u64) {
        let seg = db.inner.vlog.current_segment();
        (seg, db.inner.vlog.segments()[&seg].epoch)
    }

    /// After recovery, `seg` (of log epoch `epoch`) is no longer a log
    /// segment and no segment counts more live bytes than it holds.
    fn assert_dropped_from_the_log(db: &Db, (seg, epoch): (SegmentId, u64)) {
        let segs = db.inner.vlog.segments();
        assert!(
            segs.get(&seg).is_none_or(|m| m.epoch != epoch),
            "segment {seg}, past the end of the log, is still a log segment"
        );
        for (seg, m) in &segs {
            assert!(m.live_bytes <= m.written_bytes, "segment {seg}: {m:?}");
        }
    }

    /// Overwrites keys `0..n` (making their old segments garbage), flushes
    /// and runs GC, which must only scan records the log holds. Returns the
    /// segments cleaned.
    fn overwrite_and_gc(db: &Db, n: u32) -> usize {
        for i in 0..n {
            db.put(&key(i), &value(i, 2)).expect("put");
        }
        db.flush().expect("flush");
        db.gc().expect("gc scans only what the log holds")
    }

    /// A checkpoint reads the value log's segment list a moment before the
    /// flash store snapshots its segment table. When the writer switches to
    /// a new log segment in between, the checkpoint shows that segment Used
    /// but the manifest does not list it; replay must still follow the link
    /// into it, or every synced write there is lost.
    #[test]
    fn replay_follows_a_link_into_a_segment_allocated_during_a_checkpoint() {
        let dev = device();
        let db = Db::open(dev.clone(), opts(Durability::Sync)).expect("open");
        let mut n = 0;
        db.put(&key(n), &value(n, 1)).expect("put");
        n += 1;
        let manifest = {
            let st = db.inner.maint.lock();
            db.inner.manifest(&st)
        };
        n = fill_until_the_log_switches(&db, n);
        // The checkpoint the race produces: the new segment is in the table,
        // not in the manifest.
        db.inner.flash.sync().expect("sync");
        db.inner
            .flash
            .checkpoint(&manifest.encode())
            .expect("checkpoint");
        for _ in 0..3 {
            db.put(&key(n), &value(n, 1)).expect("put");
            n += 1;
        }
        let db = power_cut(&dev, db);
        for i in 0..n {
            let got = db.get(&key(i)).expect("get");
            assert_eq!(got.as_deref(), Some(&value(i, 1)[..]), "key {i} lost");
        }
    }

    /// A manifest lists every log segment open when it was written, also one
    /// the writer had just switched to. When the power cut loses the log
    /// before that segment, replay never reaches it and nothing refers to
    /// it: open must release it, not keep it for GC to scan (its erased
    /// pages stopped the engine with a corruption error).
    #[test]
    fn a_listed_log_segment_beyond_the_end_of_the_log_is_released() {
        let dev = device();
        let db = Db::open(dev.clone(), opts(Durability::None)).expect("open");
        db.put(&key(0), &value(0, 1)).expect("put");
        db.sync().expect("sync");
        // From here the log stays in memory: the switch to a new segment,
        // then a checkpoint that lists it.
        let held = db.inner.vlog.hold_writes();
        let n = fill_until_the_log_switches(&db, 1);
        let lost = current_segment(&db);
        checkpoint_now(&db);
        dev.cut_power_now();
        drop(held);
        let db = power_cut(&dev, db);
        assert_dropped_from_the_log(&db, lost);
        overwrite_and_gc(&db, n);
    }

    /// The LINK to a new log segment and that segment's first page are
    /// written as separate chunks: the LINK can be durable while the first
    /// page is not, and a manifest written in between lists the new
    /// segment. Replay must check that segment's header like any other's;
    /// without it the log ends before the segment, which is released.
    #[test]
    fn a_listed_segment_whose_first_page_was_lost_ends_the_log() {
        let dev = device();
        let db = Db::open(dev.clone(), opts(Durability::None)).expect("open");
        let held = db.inner.vlog.hold_writes();
        let n = fill_until_the_log_switches(&db, 0);
        let lost = current_segment(&db);
        drop(held);
        // Everything up to the LINK is written and synced; the new
        // segment's page (its header and the last put) is still in memory.
        db.inner.vlog.write_pending(true).expect("write");
        db.inner.flash.sync().expect("sync");
        checkpoint_now(&db);
        let db = power_cut(&dev, db);
        assert_dropped_from_the_log(&db, lost);
        for i in 0..n - 1 {
            let got = db.get(&key(i)).expect("get");
            assert_eq!(got.as_deref(), Some(&value(i, 1)[..]), "key {i}");
        }
        overwrite_and_gc(&db, n);
    }

    /// A manifest counts the bytes appended to the current log segment,
    /// synced or not. After a power cut the segment holds only what replay
    /// finds; value GC must scan that much, not the manifest's count, or it
    /// reads erased pages as records and stops the engine with a
    /// corruption error.
    #[test]
    fn gc_after_a_power_cut_scans_only_what_replay_found() {
        let dev = device();
        let db = Db::open(dev.clone(), opts(Durability::None)).expect("open");
        for i in 0..8 {
            db.put(&key(i), &value(i, 1)).expect("put");
        }
        db.sync().expect("sync");
        // Appended, not synced: lost at the cut below.
        for i in 8..11 {
            db.put(&key(i), &value(i, 1)).expect("put");
        }
        let seg = db.inner.vlog.current_segment();
        let counted = db.inner.vlog.segments()[&seg].written_bytes;
        checkpoint_now(&db);
        let db = power_cut(&dev, db);
        let found = db.inner.vlog.segments()[&seg].written_bytes;
        assert!(
            found < counted,
            "replay found {found} bytes, the manifest counted {counted}"
        );
        for i in 8..11 {
            assert_eq!(db.get(&key(i)).expect("get"), None, "unsynced key {i}");
        }
        assert!(overwrite_and_gc(&db, 8) > 0, "the old segment was cleaned");
        db.flush().expect("flush");
        for i in 0..8 {
            let got = db.get(&key(i)).expect("get");
            assert_eq!(got.as_deref(), Some(&value(i, 2)[..]), "key {i}");
        }
    }
}
