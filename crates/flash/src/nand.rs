//! [`NandDevice`]: an emulated NAND flash device in memory, with power-loss
//! injection for crash testing.
//!
//! Model: each page is either erased (reads as 0xFF) or programmed. Every page
//! has a *current* image (what reads return) and a *durable* image (what
//! survives a power cut). A page write changes only the current image and
//! marks the page dirty; `sync` makes every dirty page durable; `trim` erases
//! both images at once. A power cut freezes the device; `power_cycle` then
//! decides per dirty page (by [`LossMode`]) whether the write survived, and
//! restores power. All randomness comes from seeded RNGs, so a test run is
//! reproducible.
//!
//! A host-space limit emulates a sparse device file on a host file system
//! that fills up: pages holding data (in either image) count as allocated,
//! a trim gives them back, and a write that would allocate past the limit
//! fails with `HostFull` (`ENOSPC`) before programming anything. `prepare`
//! erases pages but keeps them allocated, as `fallocate` does on a file
//! (unless told the host cannot: [`NandDevice::set_fallocate`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::device::{check_page_range, check_read, Device};
use crate::error::{FlashError, Result};
use crate::stats::{pages_touched, AtomicCounters, DeviceCounters};
use crate::{DEFAULT_PAGE_SIZE, IO_ALIGN};

/// Number of independently locked shards of the page map.
const SHARDS: u64 = 16;
/// Value of every byte of an erased page.
const ERASED: u8 = 0xFF;
/// Seed of the torn-write RNG before the first `power_cycle`.
const INITIAL_TEAR_SEED: u64 = 0x5EED_7EA2;

/// What happens to page writes that were not yet synced when power is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossMode {
    /// Every unsynced page write is lost.
    AllUnsynced,
    /// Each unsynced page write is lost with probability 1/2 (seeded).
    RandomUnsynced,
}

/// Geometry, timing and failure behaviour of a [`NandDevice`].
#[derive(Clone, Debug)]
pub struct NandConfig {
    /// Page size in bytes; a nonzero multiple of [`IO_ALIGN`].
    pub page_size: u32,
    /// Capacity in bytes; rounded down to whole pages.
    pub capacity: u64,
    /// Number of channels; page `p` belongs to channel `p % channels`.
    pub channels: u32,
    /// Time to read one page (per page touched).
    pub read_latency: Duration,
    /// Time to program one page.
    pub write_latency: Duration,
    /// Time of one trim (erase) call.
    pub erase_latency: Duration,
    /// Reject writes to pages programmed since their last trim.
    pub strict_append: bool,
    /// Fate of unsynced writes at a power cut.
    pub loss: LossMode,
}

impl Default for NandConfig {
    fn default() -> Self {
        NandConfig {
            page_size: DEFAULT_PAGE_SIZE,
            capacity: 64 << 20,
            channels: 8,
            read_latency: Duration::ZERO,
            write_latency: Duration::ZERO,
            erase_latency: Duration::ZERO,
            strict_append: true,
            loss: LossMode::AllUnsynced,
        }
    }
}

/// Current and durable image of one page; `None` means erased.
#[derive(Default)]
struct PageSlot {
    current: Option<Arc<[u8]>>,
    durable: Option<Arc<[u8]>>,
}

/// One shard of the page map.
///
/// Invariants: a page absent from `pages` is erased in both images and not
/// allocated (a page in it is allocated, erased or not); a page is
/// in `dirty` iff its current image was written after its durable image was
/// last set (by sync, trim, tear or power cycle) and no failed sync dropped
/// that write; it is in `forgotten` iff a failed sync dropped it. `dirty`
/// and `forgotten` are disjoint.
#[derive(Default)]
struct Shard {
    pages: BTreeMap<u64, PageSlot>,
    dirty: BTreeSet<u64>,
    /// Pages whose unsynced write a failed sync dropped, as Linux does after
    /// a failed `fsync` (the pages are marked clean, not written): reads
    /// still see the write, no later sync makes it durable, and a power cut
    /// loses it.
    forgotten: BTreeSet<u64>,
}

/// Emulated NAND flash in memory. See the module documentation for the model.
pub struct NandDevice {
    cfg: NandConfig,
    /// `cfg.capacity / cfg.page_size`.
    page_count: u64,
    /// Page `p` lives in `shards[p % SHARDS]`.
    shards: Vec<Mutex<Shard>>,
    /// Held while sleeping an operation's latency on that channel.
    channels: Vec<Mutex<()>>,
    /// True while powered. Operations hold the read lock while they check it
    /// and change pages, so a power cut (write lock) never splits an operation's
    /// page update.
    powered: RwLock<bool>,
    /// Pages that may still be written before the next write is torn.
    cut_after: Mutex<Option<u64>>,
    /// Chooses torn-write lengths; reseeded by `power_cycle`.
    tear_rng: Mutex<StdRng>,
    page_writes: AtomicU64,
    counters: AtomicCounters,
    /// Allocated pages a write may bring the device to (`u64::MAX`: no limit).
    host_pages: AtomicU64,
    /// Syncs still to fail (see [`NandDevice::fail_syncs`]).
    failing_syncs: AtomicU64,
    /// Whether `prepare` keeps pages allocated (see [`NandDevice::set_fallocate`]).
    fallocate: AtomicBool,
}

impl NandDevice {
    /// Creates an erased device.
    ///
    /// # Panics
    /// If the configuration is invalid (see [`NandDevice::try_new`]).
    pub fn new(cfg: NandConfig) -> Arc<NandDevice> {
        match Self::try_new(cfg) {
            Ok(dev) => dev,
            Err(e) => panic!("invalid NandConfig: {e}"),
        }
    }

    /// Creates an erased device, or `InvalidArgument` if `page_size` is not a
    /// nonzero multiple of [`IO_ALIGN`], `channels` is zero or the capacity
    /// holds no page.
    pub fn try_new(cfg: NandConfig) -> Result<Arc<NandDevice>> {
        if cfg.page_size == 0 || !(cfg.page_size as usize).is_multiple_of(IO_ALIGN) {
            return Err(FlashError::InvalidArgument(format!(
                "page size {} is not a nonzero multiple of {IO_ALIGN}",
                cfg.page_size
            )));
        }
        if cfg.channels == 0 {
            return Err(FlashError::InvalidArgument("zero channels".into()));
        }
        let page_count = cfg.capacity / u64::from(cfg.page_size);
        if page_count == 0 {
            return Err(FlashError::InvalidArgument(format!(
                "capacity {} holds no {}-byte page",
                cfg.capacity, cfg.page_size
            )));
        }
        Ok(Arc::new(NandDevice {
            page_count,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            channels: (0..cfg.channels).map(|_| Mutex::new(())).collect(),
            powered: RwLock::new(true),
            cut_after: Mutex::new(None),
            tear_rng: Mutex::new(StdRng::seed_from_u64(INITIAL_TEAR_SEED)),
            page_writes: AtomicU64::new(0),
            counters: AtomicCounters::default(),
            host_pages: AtomicU64::new(u64::MAX),
            failing_syncs: AtomicU64::new(0),
            fallocate: AtomicBool::new(true),
            cfg,
        }))
    }

    /// Arms a power cut: after `n` more pages are written successfully, the
    /// next page write is torn (a random-length prefix of its bytes lands
    /// durably, the rest stays erased), that write returns `PowerLoss`, and so
    /// does every operation until [`NandDevice::power_cycle`]. `None` disarms.
    pub fn cut_power_after_page_writes(&self, n: Option<u64>) {
        *self.cut_after.lock() = n;
    }

    /// Cuts power immediately; every operation fails with `PowerLoss` until
    /// [`NandDevice::power_cycle`].
    pub fn cut_power_now(&self) {
        *self.powered.write() = false;
    }

    /// Restores power after a cut (cutting it first if it is on). Unsynced page
    /// writes are lost per [`LossMode`] (lost pages revert to their durable
    /// image, i.e. read back erased after a program-once write), decided in page
    /// order by an RNG seeded with `seed`. Also disarms any pending cut.
    pub fn power_cycle(&self, seed: u64) {
        let mut powered = self.powered.write();
        let mut rng = StdRng::seed_from_u64(seed);
        for shard in &self.shards {
            // Shards are visited in a fixed order and pages in ascending order,
            // so the decisions are a pure function of `seed` and the dirty set.
            let mut shard = shard.lock();
            for page in std::mem::take(&mut shard.forgotten) {
                if let Some(slot) = shard.pages.get_mut(&page) {
                    // An erased page stays allocated: a power cut does not
                    // give a file's blocks back.
                    slot.current = slot.durable.clone();
                }
            }
            let dirty = std::mem::take(&mut shard.dirty);
            for page in dirty {
                let lose = match self.cfg.loss {
                    LossMode::AllUnsynced => true,
                    LossMode::RandomUnsynced => rng.gen_bool(0.5),
                };
                if let Some(slot) = shard.pages.get_mut(&page) {
                    if lose {
                        slot.current = slot.durable.clone();
                    } else {
                        slot.durable = slot.current.clone();
                    }
                }
            }
        }
        *self.tear_rng.lock() = StdRng::seed_from_u64(seed ^ INITIAL_TEAR_SEED);
        *self.cut_after.lock() = None;
        *powered = true;
    }

    /// Limits the device to `bytes` of allocated pages, like a sparse
    /// device file on a host file system with that much room (`None`: no
    /// limit). Pages with data in either image are allocated; a trim frees
    /// them. A write that would allocate past the limit fails with
    /// [`FlashError::HostFull`] and changes nothing. Concurrent writes may
    /// overshoot the limit by what they write at once.
    pub fn set_host_space(&self, bytes: Option<u64>) {
        let pages = bytes.map_or(u64::MAX, |b| b / u64::from(self.cfg.page_size));
        self.host_pages.store(pages, Ordering::Relaxed);
    }

    /// Whether [`Device::prepare`] keeps the pages it erases allocated, as
    /// `fallocate` does on a file (the default), or gives them back like a
    /// trim, as on a host file system that cannot reserve blocks: then a
    /// write into a prepared segment may still find the host full.
    pub fn set_fallocate(&self, supported: bool) {
        self.fallocate.store(supported, Ordering::Relaxed);
    }

    /// Makes the next `n` syncs fail with an I/O error (`EIO`), the way a
    /// failing disk makes `fsync` fail: each drops the unsynced page writes
    /// without making them durable (reads still see them; a power cut loses
    /// them even after a later sync succeeds).
    pub fn fail_syncs(&self, n: u64) {
        self.failing_syncs.store(n, Ordering::SeqCst);
    }

    /// Bytes of allocated pages (see [`NandDevice::set_host_space`]).
    pub fn host_space_used(&self) -> u64 {
        let pages: usize = self.shards.iter().map(|s| s.lock().pages.len()).sum();
        pages as u64 * u64::from(self.cfg.page_size)
    }

    /// `HostFull` if writing pages `first..first + n` would allocate past
    /// the host-space limit.
    fn check_host_space(&self, first: u64, n: u64) -> Result<()> {
        let limit = self.host_pages.load(Ordering::Relaxed);
        if limit == u64::MAX {
            return Ok(());
        }
        let fresh = (first..first + n)
            .filter(|p| !self.shard(*p).lock().pages.contains_key(p))
            .count() as u64;
        let used = self.host_space_used() / u64::from(self.cfg.page_size);
        if fresh > 0 && used + fresh > limit {
            return Err(FlashError::HostFull(std::io::Error::from_raw_os_error(
                libc::ENOSPC,
            )));
        }
        Ok(())
    }

    /// True while the device has power.
    pub fn is_powered(&self) -> bool {
        *self.powered.read()
    }

    /// Flips bit `bit` of the byte at `offset` in both the current and the
    /// durable image (emulates media corruption). An erased page becomes a
    /// programmed page of 0xFF bytes with that bit flipped.
    ///
    /// # Panics
    /// If `offset` is beyond the capacity or `bit >= 8` (test-only misuse).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        assert!(
            offset < self.capacity() && bit < 8,
            "flip_bit({offset}, {bit}) out of range"
        );
        let ps = u64::from(self.cfg.page_size);
        let (page, at) = (offset / ps, (offset % ps) as usize);
        let flip = |img: &Option<Arc<[u8]>>| -> Arc<[u8]> {
            let mut bytes = match img {
                Some(b) => b.to_vec(),
                None => vec![ERASED; ps as usize],
            };
            bytes[at] ^= 1 << bit;
            Arc::from(bytes)
        };
        let mut shard = self.shard(page).lock();
        let slot = shard.pages.entry(page).or_default();
        let same = match (&slot.current, &slot.durable) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if same {
            let flipped = flip(&slot.current);
            slot.current = Some(flipped.clone());
            slot.durable = Some(flipped);
        } else {
            slot.current = Some(flip(&slot.current));
            slot.durable = Some(flip(&slot.durable));
        }
    }

    /// Pages written successfully since creation (torn writes excluded).
    pub fn page_write_count(&self) -> u64 {
        self.page_writes.load(Ordering::Relaxed)
    }

    fn shard(&self, page: u64) -> &Mutex<Shard> {
        &self.shards[(page % SHARDS) as usize]
    }

    /// Sleeps `latency` holding the channel of `page`, so operations on one
    /// channel serialize while different channels overlap.
    fn delay(&self, page: u64, latency: Duration) {
        if latency.is_zero() {
            return;
        }
        let _channel = self.channels[(page % u64::from(self.cfg.channels)) as usize].lock();
        std::thread::sleep(latency);
    }

    /// The pages `first..end` an erase of `len` bytes at `offset` covers,
    /// once checked, after the erase's latency.
    fn erase_span(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        check_page_range(self.capacity(), self.cfg.page_size, offset, len)?;
        let ps = u64::from(self.cfg.page_size);
        let (first, end) = (offset / ps, (offset + len) / ps);
        if len > 0 {
            self.delay(first, self.cfg.erase_latency);
        }
        Ok((first, end))
    }

    /// Fails with `PowerLoss` unless powered; returns the guard to hold.
    fn power_on(&self) -> Result<parking_lot::RwLockReadGuard<'_, bool>> {
        let powered = self.powered.read();
        if *powered {
            Ok(powered)
        } else {
            Err(FlashError::PowerLoss)
        }
    }

    /// Programs one page. Returns `Ok(true)` if the write was torn by an armed
    /// power cut (the caller must then cut power: the guard is released here).
    fn program_page(&self, page: u64, data: &[u8]) -> Result<bool> {
        let _powered = self.power_on()?;
        let mut shard = self.shard(page).lock();
        let programmed = shard.pages.get(&page).is_some_and(|s| s.current.is_some());
        if self.cfg.strict_append && programmed {
            return Err(FlashError::Overwrite { page });
        }
        let tear = {
            let mut cut = self.cut_after.lock();
            match *cut {
                Some(0) => {
                    *cut = None;
                    true
                }
                Some(n) => {
                    *cut = Some(n - 1);
                    false
                }
                None => false,
            }
        };
        let slot = shard.pages.entry(page).or_default();
        if tear {
            let keep = self.tear_rng.lock().gen_range(1..data.len());
            let mut torn = vec![ERASED; data.len()];
            torn[..keep].copy_from_slice(&data[..keep]);
            let torn: Arc<[u8]> = Arc::from(torn);
            // A torn page is what the cell physically holds: durable as is.
            slot.current = Some(torn.clone());
            slot.durable = Some(torn);
            shard.dirty.remove(&page);
            return Ok(true);
        }
        slot.current = Some(Arc::from(data));
        shard.forgotten.remove(&page);
        shard.dirty.insert(page);
        self.page_writes.fetch_add(1, Ordering::Relaxed);
        Ok(false)
    }
}

impl Device for NandDevice {
    fn capacity(&self) -> u64 {
        self.page_count * u64::from(self.cfg.page_size)
    }

    fn page_size(&self) -> u32 {
        self.cfg.page_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_read(self.capacity(), offset, buf.len())?;
        let ps = u64::from(self.cfg.page_size);
        let len = buf.len() as u64;
        let pages = pages_touched(offset, len, self.cfg.page_size);
        let first = offset / ps;
        for page in first..first + pages {
            self.delay(page, self.cfg.read_latency);
        }
        let _powered = self.power_on()?;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (page, at) = (pos / ps, (pos % ps) as usize);
            let n = (ps as usize - at).min(buf.len() - done);
            let dst = &mut buf[done..done + n];
            let shard = self.shard(page).lock();
            match shard.pages.get(&page).and_then(|s| s.current.as_ref()) {
                Some(content) => dst.copy_from_slice(&content[at..at + n]),
                None => dst.fill(ERASED),
            }
            done += n;
        }
        self.counters.record_read(pages, len);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_page_range(
            self.capacity(),
            self.cfg.page_size,
            offset,
            data.len() as u64,
        )?;
        let ps = self.cfg.page_size as usize;
        let first = offset / ps as u64;
        {
            let _powered = self.power_on()?;
            self.check_host_space(first, (data.len() / ps) as u64)?;
        }
        if self.cfg.strict_append {
            // Reject before programming anything, so a bad call changes nothing.
            let _powered = self.power_on()?;
            for page in first..first + (data.len() / ps) as u64 {
                let shard = self.shard(page).lock();
                if shard.pages.get(&page).is_some_and(|s| s.current.is_some()) {
                    return Err(FlashError::Overwrite { page });
                }
            }
        }
        for (i, chunk) in data.chunks(ps).enumerate() {
            let page = first + i as u64;
            self.delay(page, self.cfg.write_latency);
            if self.program_page(page, chunk)? {
                self.cut_power_now();
                return Err(FlashError::PowerLoss);
            }
        }
        self.counters
            .record_write((data.len() / ps) as u64, data.len() as u64);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let _powered = self.power_on()?;
        let fail = self
            .failing_syncs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            for shard in &self.shards {
                let mut shard = shard.lock();
                let dropped = std::mem::take(&mut shard.dirty);
                shard.forgotten.extend(dropped);
            }
            return Err(FlashError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        for shard in &self.shards {
            let mut shard = shard.lock();
            let dirty = std::mem::take(&mut shard.dirty);
            for page in dirty {
                if let Some(slot) = shard.pages.get_mut(&page) {
                    slot.durable = slot.current.clone();
                }
            }
        }
        self.counters.record_sync();
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let (first, end) = self.erase_span(offset, len)?;
        let _powered = self.power_on()?;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let doomed: Vec<u64> = shard.pages.range(first..end).map(|(&p, _)| p).collect();
            for page in doomed {
                shard.pages.remove(&page);
                shard.dirty.remove(&page);
                shard.forgotten.remove(&page);
            }
        }
        self.counters.record_trim(end - first);
        Ok(())
    }

    fn allocates_on_write(&self) -> bool {
        // It models a sparse file on a host (see `set_host_space`).
        true
    }

    fn prepare(&self, offset: u64, len: u64) -> Result<()> {
        if !self.fallocate.load(Ordering::Relaxed) {
            return self.trim(offset, len);
        }
        let (first, end) = self.erase_span(offset, len)?;
        let _powered = self.power_on()?;
        // All or nothing: the model allocates only when everything fits.
        self.check_host_space(first, end - first)?;
        for page in first..end {
            let mut shard = self.shard(page).lock();
            shard.pages.insert(page, PageSlot::default());
            shard.dirty.remove(&page);
            shard.forgotten.remove(&page);
        }
        self.counters.record_trim(end - first);
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }
}

impl std::fmt::Debug for NandDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NandDevice")
            .field("config", &self.cfg)
            .field("powered", &self.is_powered())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 4096;

    fn small(loss: LossMode) -> Arc<NandDevice> {
        NandDevice::new(NandConfig {
            page_size: PS as u32,
            capacity: 256 * PS as u64,
            loss,
            ..Default::default()
        })
    }

    fn read_page(dev: &NandDevice, page: u64) -> Vec<u8> {
        let mut buf = vec![0u8; PS];
        dev.read_at(page * PS as u64, &mut buf).unwrap();
        buf
    }

    #[test]
    fn a_failed_sync_drops_unsynced_pages_for_good() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(0, &[1u8; PS]).unwrap();
        dev.sync().unwrap();
        dev.write_at(PS as u64, &[2u8; PS]).unwrap();
        dev.fail_syncs(1);
        assert!(matches!(dev.sync(), Err(FlashError::Io(_))));
        // Reads still see the dropped write; a later sync succeeds...
        assert_eq!(read_page(&dev, 1), vec![2u8; PS]);
        dev.write_at(2 * PS as u64, &[3u8; PS]).unwrap();
        dev.sync().unwrap();
        // ...but the power cut shows the dropped write never reached the cells.
        dev.cut_power_now();
        dev.power_cycle(1);
        assert_eq!(read_page(&dev, 0), vec![1u8; PS]);
        assert_eq!(read_page(&dev, 1), vec![ERASED; PS]);
        assert_eq!(read_page(&dev, 2), vec![3u8; PS]);
    }

    #[test]
    fn default_config_matches_spec() {
        let c = NandConfig::default();
        assert_eq!((c.page_size, c.capacity, c.channels), (8192, 64 << 20, 8));
        assert!(c.strict_append);
        assert_eq!(c.loss, LossMode::AllUnsynced);
        assert!(NandDevice::try_new(NandConfig {
            page_size: 1000,
            ..c.clone()
        })
        .is_err());
        assert!(NandDevice::try_new(NandConfig {
            channels: 0,
            ..c.clone()
        })
        .is_err());
        assert!(NandDevice::try_new(NandConfig { capacity: 100, ..c }).is_err());
    }

    #[test]
    fn erased_pages_read_ff() {
        let dev = small(LossMode::AllUnsynced);
        assert!(read_page(&dev, 7).iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn strict_append_rejects_overwrite_until_trim() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(PS as u64, &[1u8; PS]).unwrap();
        match dev.write_at(0, &[2u8; 2 * PS]) {
            Err(FlashError::Overwrite { page }) => assert_eq!(page, 1),
            other => panic!("expected overwrite, got {other:?}"),
        }
        // The rejected call programmed nothing, not even page 0.
        assert!(read_page(&dev, 0).iter().all(|&b| b == 0xFF));
        dev.trim(PS as u64, PS as u64).unwrap();
        assert!(read_page(&dev, 1).iter().all(|&b| b == 0xFF));
        dev.write_at(PS as u64, &[3u8; PS]).unwrap();
        assert_eq!(read_page(&dev, 1), vec![3u8; PS]);
    }

    #[test]
    fn overwrite_allowed_when_not_strict() {
        let dev = NandDevice::new(NandConfig {
            page_size: PS as u32,
            capacity: 8 * PS as u64,
            strict_append: false,
            ..Default::default()
        });
        dev.write_at(0, &[1u8; PS]).unwrap();
        dev.write_at(0, &[2u8; PS]).unwrap();
        assert_eq!(read_page(&dev, 0), vec![2u8; PS]);
    }

    #[test]
    fn power_cut_loses_unsynced_keeps_synced() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(0, &[1u8; PS]).unwrap();
        dev.sync().unwrap();
        dev.write_at(PS as u64, &[2u8; PS]).unwrap();
        dev.cut_power_now();
        assert!(!dev.is_powered());
        let mut buf = vec![0u8; PS];
        assert!(matches!(
            dev.read_at(0, &mut buf),
            Err(FlashError::PowerLoss)
        ));
        assert!(matches!(
            dev.write_at(2 * PS as u64, &buf),
            Err(FlashError::PowerLoss)
        ));
        assert!(matches!(dev.sync(), Err(FlashError::PowerLoss)));
        dev.power_cycle(1);
        assert!(dev.is_powered());
        assert_eq!(read_page(&dev, 0), vec![1u8; PS]);
        assert!(read_page(&dev, 1).iter().all(|&b| b == 0xFF));
        // The lost page is erased again, so it can be programmed.
        dev.write_at(PS as u64, &[4u8; PS]).unwrap();
    }

    #[test]
    fn torn_write_leaves_partial_page_and_stops_device() {
        let dev = small(LossMode::AllUnsynced);
        dev.cut_power_after_page_writes(Some(1));
        let before = dev.page_write_count();
        let res = dev.write_at(2 * PS as u64, &[0u8; 3 * PS]);
        assert!(matches!(res, Err(FlashError::PowerLoss)));
        assert!(!dev.is_powered());
        assert_eq!(dev.page_write_count(), before + 1);
        dev.power_cycle(9);
        // Page 2 landed but was unsynced: lost. Page 3 is torn (durable). Page 4 never written.
        assert!(read_page(&dev, 2).iter().all(|&b| b == 0xFF));
        let torn = read_page(&dev, 3);
        let prefix = torn.iter().take_while(|&&b| b == 0).count();
        assert!(prefix > 0 && prefix < PS, "torn prefix {prefix}");
        assert!(torn[prefix..].iter().all(|&b| b == 0xFF));
        assert!(read_page(&dev, 4).iter().all(|&b| b == 0xFF));
        assert!(matches!(
            dev.write_at(3 * PS as u64, &[0u8; PS]),
            Err(FlashError::Overwrite { page: 3 })
        ));
    }

    #[test]
    fn cut_after_zero_tears_the_next_write() {
        let dev = small(LossMode::AllUnsynced);
        dev.cut_power_after_page_writes(Some(0));
        assert!(matches!(
            dev.write_at(0, &[0u8; PS]),
            Err(FlashError::PowerLoss)
        ));
        dev.power_cycle(0);
        dev.cut_power_after_page_writes(Some(5));
        dev.cut_power_after_page_writes(None);
        dev.write_at(PS as u64, &[0u8; 8 * PS]).unwrap();
        assert!(dev.is_powered());
    }

    fn random_loss_survivors(seed: u64) -> Vec<u64> {
        let dev = small(LossMode::RandomUnsynced);
        dev.write_at(0, &[7u8; 64 * PS]).unwrap();
        dev.cut_power_now();
        dev.power_cycle(seed);
        (0..64).filter(|&p| read_page(&dev, p)[0] == 7).collect()
    }

    #[test]
    fn random_unsynced_is_partial_and_deterministic() {
        let a = random_loss_survivors(42);
        assert!(!a.is_empty() && a.len() < 64, "kept {} of 64", a.len());
        assert_eq!(a, random_loss_survivors(42));
        let b = random_loss_survivors(43);
        assert!(!b.is_empty() && b.len() < 64);
    }

    #[test]
    fn flip_bit_is_durable() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(0, &[0u8; PS]).unwrap();
        dev.sync().unwrap();
        dev.flip_bit(10, 3);
        assert_eq!(read_page(&dev, 0)[10], 8);
        dev.power_cycle(0);
        let page = read_page(&dev, 0);
        assert_eq!(page[10], 8);
        assert_eq!(page.iter().filter(|&&b| b != 0).count(), 1);
    }

    #[test]
    fn counters_track_operations() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(0, &[1u8; 2 * PS]).unwrap();
        let mut buf = vec![0u8; PS];
        dev.read_at(PS as u64, &mut buf).unwrap();
        dev.sync().unwrap();
        dev.trim(0, 4 * PS as u64).unwrap();
        let c = dev.counters();
        assert_eq!(
            (c.write_ops, c.pages_written, c.bytes_written),
            (1, 2, 2 * PS as u64)
        );
        assert_eq!((c.read_ops, c.pages_read, c.bytes_read), (1, 1, PS as u64));
        assert_eq!((c.syncs, c.trims, c.pages_trimmed), (1, 1, 4));
        let mut reqs_a = vec![0u8; PS];
        let mut reqs_b = vec![0u8; 2 * PS];
        dev.read_many(&mut [(0, &mut reqs_a[..]), (PS as u64, &mut reqs_b[..])])
            .unwrap();
        assert_eq!(dev.counters().read_ops, 3);
        assert!(reqs_b.iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn latency_with_channels_works_across_threads() {
        let dev = NandDevice::new(NandConfig {
            page_size: PS as u32,
            capacity: 64 * PS as u64,
            channels: 4,
            read_latency: Duration::from_micros(50),
            write_latency: Duration::from_micros(100),
            erase_latency: Duration::from_micros(200),
            ..Default::default()
        });
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let dev = &dev;
                s.spawn(move || {
                    let off = u64::from(t) * 8 * PS as u64;
                    dev.write_at(off, &vec![t; 8 * PS]).unwrap();
                    let mut buf = vec![0u8; 8 * PS];
                    dev.read_at(off, &mut buf).unwrap();
                    assert!(buf.iter().all(|&b| b == t));
                    dev.trim(off, 8 * PS as u64).unwrap();
                });
            }
        });
        assert_eq!(dev.counters().pages_written, 32);
        assert!(read_page(&dev, 0).iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn host_space_limit_fails_writes_with_host_full_until_a_trim_frees_pages() {
        let dev = small(LossMode::AllUnsynced);
        dev.write_at(0, &vec![1u8; 2 * PS]).unwrap();
        assert_eq!(dev.host_space_used(), 2 * PS as u64);
        dev.set_host_space(Some(3 * PS as u64));
        match dev.write_at(4 * PS as u64, &vec![2u8; 2 * PS]) {
            Err(e) => assert!(e.is_host_full(), "{e}"),
            Ok(()) => panic!("a write past the host space must fail"),
        }
        assert!(
            read_page(&dev, 4).iter().all(|&b| b == 0xFF),
            "the failed write programmed nothing"
        );
        dev.write_at(4 * PS as u64, &vec![3u8; PS]).unwrap();
        assert!(dev.write_at(5 * PS as u64, &vec![3u8; PS]).is_err());
        dev.trim(0, 2 * PS as u64).unwrap();
        assert_eq!(dev.host_space_used(), PS as u64);
        dev.write_at(5 * PS as u64, &vec![4u8; 2 * PS]).unwrap();
        dev.set_host_space(None);
        dev.write_at(8 * PS as u64, &vec![5u8; 4 * PS]).unwrap();
        assert_eq!(read_page(&dev, 8)[0], 5);
    }
}
