//! The level structure: keytables on flash grouped in levels L1..Ln (the
//! memtable is L0), the in-DRAM level index over them, and point lookups.
//!
//! Within a level keytables are sorted and do not overlap. A `Version` is an
//! immutable snapshot of the levels; flush and compaction install new ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flash::{AlignedBuf, FlashStore, SegmentId};
use parking_lot::Mutex;

use crate::bloom::Bloom;
use crate::cache::BlockCache;
use crate::error::{Error, Result};
use crate::keytable::{Block, KeytableIndex};
use crate::types::{Entry, SeqNo};

/// Keeps a keytable segment in use while any keytable in it is alive; when
/// the last reference drops, the segment is queued for release.
pub struct SegmentRef {
    seg: SegmentId,
    release: Arc<Mutex<Vec<SegmentId>>>,
}

impl SegmentRef {
    /// A reference to `seg` that queues it on `release` when dropped.
    pub fn new(seg: SegmentId, release: Arc<Mutex<Vec<SegmentId>>>) -> Arc<SegmentRef> {
        Arc::new(SegmentRef { seg, release })
    }
    /// The segment.
    pub fn seg(&self) -> SegmentId {
        self.seg
    }
}

impl Drop for SegmentRef {
    fn drop(&mut self) {
        self.release.lock().push(self.seg);
    }
}

/// Shared read context: the flash store, the block cache and counters.
pub struct ReadCtx {
    /// The flash store.
    pub flash: Arc<FlashStore>,
    /// The keytable cache.
    pub cache: Arc<BlockCache>,
    /// Keytable block reads that missed the cache.
    pub block_reads: AtomicU64,
}

/// A keytable on flash with its index and filter in DRAM.
pub struct Keytable {
    /// Unique id (also the checksum seed of its blocks).
    pub id: u64,
    /// Segment holding it.
    pub seg: Arc<SegmentRef>,
    /// First page inside the segment.
    pub first_page: u32,
    /// Data pages.
    pub data_pages: u32,
    /// Index pages (after the data pages).
    pub index_pages: u32,
    /// Level index, filter and key range.
    pub index: KeytableIndex,
    /// Whether the Bloom filter is consulted (filters are dropped first when
    /// the DRAM budget is tight; see `DbInner::apply_dram_budget`).
    pub use_bloom: AtomicBool,
    /// Set when the keytable was copied elsewhere under the same id: its
    /// cached blocks now belong to the copy and stay cached.
    pub moved: AtomicBool,
    cache: Arc<BlockCache>,
}

impl Drop for Keytable {
    fn drop(&mut self) {
        if !self.moved.load(Ordering::Acquire) {
            self.cache
                .remove_keytable(self.id, self.index.blocks.len() as u32);
        }
    }
}

impl Keytable {
    /// Wraps a keytable's metadata.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        seg: Arc<SegmentRef>,
        first_page: u32,
        data_pages: u32,
        index_pages: u32,
        index: KeytableIndex,
        use_bloom: bool,
        cache: Arc<BlockCache>,
    ) -> Keytable {
        Keytable {
            id,
            seg,
            first_page,
            data_pages,
            index_pages,
            index,
            use_bloom: AtomicBool::new(use_bloom),
            moved: AtomicBool::new(false),
            cache,
        }
    }

    /// Bytes on flash.
    pub fn bytes(&self, page: usize) -> u64 {
        u64::from(self.data_pages + self.index_pages) * page as u64
    }

    /// Loads block `i`, from the cache or the device.
    pub fn block(&self, i: usize, ctx: &ReadCtx) -> Result<Arc<Block>> {
        if let Some(b) = ctx.cache.get(self.id, i as u32) {
            return Ok(b);
        }
        let h = &self.index.blocks[i];
        let page = ctx.flash.geometry().page_size as usize;
        let mut buf = AlignedBuf::new_zeroed(h.pages as usize * page);
        let offset = u64::from(self.first_page + h.page) * page as u64;
        ctx.flash.read(self.seg.seg(), offset, &mut buf)?;
        ctx.block_reads.fetch_add(1, Ordering::Relaxed);
        let b = Arc::new(Block::parse(buf.to_vec(), self.id)?);
        ctx.cache.insert(self.id, i as u32, b.clone());
        Ok(b)
    }

    /// Blocks `i..` to the end of the keytable's data, with one device read
    /// for those the cache lacks from the first missing one on: what a
    /// merge reads next, at sequential speed instead of one page-sized
    /// read per block. Blocks read here do not enter the cache (a merge's
    /// inputs are about to be replaced; its outputs warm the cache).
    pub fn blocks_from(&self, i: usize, ctx: &ReadCtx) -> Result<Vec<Arc<Block>>> {
        let blocks = &self.index.blocks;
        let Some(first) = blocks.get(i) else {
            return Ok(Vec::new());
        };
        if let Some(b) = ctx.cache.get(self.id, i as u32) {
            return Ok(vec![b]);
        }
        let page = ctx.flash.geometry().page_size as usize;
        let start = first.page;
        let pages = self.data_pages.checked_sub(start).ok_or_else(|| {
            Error::Corrupt(format!("keytable {}: block {i} past its data", self.id))
        })?;
        let mut buf = AlignedBuf::new_zeroed(pages as usize * page);
        let offset = u64::from(self.first_page + start) * page as u64;
        ctx.flash.read(self.seg.seg(), offset, &mut buf)?;
        ctx.block_reads.fetch_add(1, Ordering::Relaxed);
        blocks[i..]
            .iter()
            .map(|h| {
                let at = (h.page - start) as usize * page;
                let bytes = buf.get(at..at + h.pages as usize * page).ok_or_else(|| {
                    Error::Corrupt(format!("keytable {}: block past its data", self.id))
                })?;
                Ok(Arc::new(Block::parse(bytes.to_vec(), self.id)?))
            })
            .collect()
    }

    /// Block `i` as `source` allows: `None` when it is not cached and the
    /// device may not be read.
    pub(crate) fn block_from(
        &self,
        i: usize,
        ctx: &ReadCtx,
        source: Source,
    ) -> Result<Option<Arc<Block>>> {
        match source {
            Source::CacheOrDevice => self.block(i, ctx).map(Some),
            Source::CacheOnly => Ok(ctx.cache.get(self.id, i as u32)),
        }
    }

    /// The newest version of `key` at or below `seq` in this keytable,
    /// reading its blocks as `source` allows. `near` is where the last
    /// lookup in this keytable started (`None` for a lookup on its own):
    /// when `key` starts in the same block, neither the
    /// block index is searched nor the cache asked, and the block is
    /// searched from where that lookup ended. `near` becomes where this
    /// lookup started.
    fn probe(
        &self,
        key: &[u8],
        hash: u64,
        seq: SeqNo,
        ctx: &ReadCtx,
        source: Source,
        near: &mut Option<Near>,
    ) -> Result<Probe> {
        let first = match near {
            // The block in hand is searched from where the last lookup
            // ended, which costs less than asking the filter.
            Some(n) if self.index.is_block_of(n.block_index, key) => n.block_index,
            _ => {
                *near = None;
                if self.use_bloom.load(Ordering::Relaxed) && !self.index.bloom.may_contain(hash) {
                    return Ok(Probe::Found(None));
                }
                let Some(i) = self.index.find_block(key) else {
                    return Ok(Probe::Found(None));
                };
                i
            }
        };
        let mut bi = first;
        loop {
            let (block, i) = match near {
                Some(n) if n.block_index == bi => {
                    n.at = n.block.seek_from(key, seq, n.at);
                    (n.block.clone(), n.at)
                }
                _ => {
                    let Some(block) = self.block_from(bi, ctx, source)? else {
                        return Ok(Probe::NeedsRead);
                    };
                    let at = block.seek(key, seq);
                    if bi == first {
                        *near = Some(Near {
                            block_index: bi,
                            block: block.clone(),
                            at,
                        });
                    }
                    (block, at)
                }
            };
            if i < block.len() {
                return Ok(Probe::Found(
                    (block.key(i) == key).then(|| block.entry_sharing(i)),
                ));
            }
            bi += 1;
            match self.index.blocks.get(bi) {
                Some(next) if next.first_key.as_ref() == key => continue,
                _ => return Ok(Probe::Found(None)),
            }
        }
    }
}

/// Where a lookup in a keytable started: the block, and the entry its
/// search in that block ended at.
struct Near {
    block_index: usize,
    block: Arc<Block>,
    at: usize,
}

/// Where the last lookup that reached each level went in it (the keytable,
/// and the block and entry its search started from): a multi-get of
/// neighbouring keys (a block read's chunks, a file's data) in ascending
/// order looks each next key up from there, without
/// searching the level's keytables or a keytable's block index again
/// ([`Version::probe_near`]). Valid for one [`Version`]; any key order is
/// answered correctly, ascending order is only faster.
#[derive(Default)]
pub struct Finger {
    levels: Vec<LevelFinger>,
}

/// A [`Finger`]'s place in one level.
#[derive(Default)]
struct LevelFinger {
    /// The index in the level of the keytable the last lookup was in.
    keytable: usize,
    /// That keytable's id: `near` belongs to it (in another version the
    /// same index may name another keytable).
    keytable_id: u64,
    /// Where the last lookup in that keytable started.
    near: Option<Near>,
}

/// Where a lookup may take keytable blocks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The cache, else the device.
    CacheOrDevice,
    /// The cache only: a lookup that must not wait for the device.
    CacheOnly,
}

/// Outcome of a lookup.
#[derive(Debug)]
pub enum Probe {
    /// The newest entry at or below the sequence number, if any.
    Found(Option<Entry>),
    /// A block it needs is not cached ([`Source::CacheOnly`] only).
    NeedsRead,
}

/// An immutable set of levels: first the flushed runs, newest first, then
/// L1..Ln. Every level is newer than the levels after it, so a lookup
/// stops at the first level holding the key.
#[derive(Clone, Default)]
pub struct Version {
    /// Keytables per level, sorted by smallest key, non-overlapping.
    pub levels: Vec<Vec<Arc<Keytable>>>,
    /// How many of the first levels are flushed runs: each a memtable
    /// written as it was, never merged with L1 at flush time (with random
    /// keys that merge rewrote all of L1 per flush); compaction merges
    /// them all into L1 at once. `levels[runs]` is L1.
    pub runs: usize,
    /// Writes and deletes in the flushed runs: entries that may hide a
    /// version below, whose value their merge into L1 releases. GC
    /// relocations hide nothing and are not counted (see `lowspace.rs`).
    /// After a restart, every entry of the runs (the manifest does not
    /// say).
    pub run_writes: u64,
}

impl Version {
    /// The newest version of `key` at or below `seq` in the levels, found
    /// from where `finger` says the last lookup (in this version) was, and
    /// leaving it where this one is.
    pub fn get_near(
        &self,
        key: &[u8],
        seq: SeqNo,
        ctx: &ReadCtx,
        finger: &mut Finger,
    ) -> Result<Option<Entry>> {
        match self.probe_near(key, seq, ctx, Source::CacheOrDevice, finger)? {
            Probe::Found(e) => Ok(e),
            // A lookup that may read the device never stops for a block.
            Probe::NeedsRead => Err(Error::Corrupt(
                "keytable lookup stopped for a block it may read".into(),
            )),
        }
    }

    /// [`Version::get_near`], reading keytable blocks as `source` allows.
    pub fn probe_near(
        &self,
        key: &[u8],
        seq: SeqNo,
        ctx: &ReadCtx,
        source: Source,
        finger: &mut Finger,
    ) -> Result<Probe> {
        let hash = Bloom::hash(key);
        finger
            .levels
            .resize_with(self.levels.len(), Default::default);
        for (level, f) in self.levels.iter().zip(&mut finger.levels) {
            // The first keytable whose largest key is not below `key`:
            // from the last one when `key` is not before it.
            let from = if f.keytable > 0
                && level
                    .get(f.keytable - 1)
                    .is_none_or(|kt| kt.index.largest.as_ref() >= key)
            {
                0
            } else {
                f.keytable
            };
            f.keytable = match level.get(from) {
                Some(kt) if kt.index.largest.as_ref() >= key => from,
                _ => {
                    from + level[from.min(level.len())..]
                        .partition_point(|kt| kt.index.largest.as_ref() < key)
                }
            };
            if let Some(kt) = level.get(f.keytable) {
                if f.keytable_id != kt.id {
                    f.near = None;
                    f.keytable_id = kt.id;
                }
                if kt.index.smallest.as_ref() <= key {
                    match kt.probe(key, hash, seq, ctx, source, &mut f.near)? {
                        Probe::Found(None) => {}
                        found => return Ok(found),
                    }
                }
            }
        }
        Ok(Probe::Found(None))
    }

    /// Keytable bytes in level `i` (a run below [`Self::runs`]).
    pub fn level_bytes(&self, i: usize, page: usize) -> u64 {
        self.levels
            .get(i)
            .map_or(0, |l| l.iter().map(|kt| kt.bytes(page)).sum())
    }

    /// Indices of keytables in level `i` overlapping `[lo, hi]`.
    pub fn overlapping(&self, i: usize, lo: &[u8], hi: &[u8]) -> std::ops::Range<usize> {
        let Some(level) = self.levels.get(i) else {
            return 0..0;
        };
        let start = level.partition_point(|kt| kt.index.largest.as_ref() < lo);
        let end = level.partition_point(|kt| kt.index.smallest.as_ref() <= hi);
        start..end.max(start)
    }

    /// All keytables.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Keytable>> {
        self.levels.iter().flatten()
    }
}
