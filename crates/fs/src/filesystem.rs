//! The file system's core: inodes through the cache, metadata changes as
//! atomic transactions, inode numbers, write-back of dirty inodes, and
//! crash recovery at open. The operations live in `namespace.rs`
//! (directories), `attrs.rs` (attributes, xattrs) and `data.rs` (file
//! contents); `fuse.rs` serves them to the kernel. Everything here works on
//! any [`Store`], so it is tested against the in-memory model.
//!
//! Locks, in order: a file's data stripe (`data_lock`: exclusive for a
//! truncation or fallocate, shared for writes) → the chunk stripes of a
//! write's chunks (`chunk_locks`, ascending, one read-modify-write of a
//! chunk at a time) → `ns` (held by every change of metadata, store and
//! cache, for its whole read-modify-write) → `cache` and `inos` (short,
//! never across store I/O). Writes to different chunks of one file run in
//! parallel.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use client::Store;
use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cache::{DentryCache, InodeCache};
use crate::error::{posix, FsError, Result};
use crate::inode::Inode;
use crate::layout::Keys;
use crate::registry::FsRecord;
use crate::writebehind::{write_ops, Change, Permit, WriteBehind};

/// How long the background reclaimer lets unlinked files gather after the
/// first, and most it reclaims in one go.
const RECLAIM_GATHER: std::time::Duration = std::time::Duration::from_millis(5);
const RECLAIM_BATCH: usize = 1024;

/// Inode numbers reserved from the counter at a time.
const INO_BATCH: u64 = 1024;
/// Stripes of the per-file data locks.
const DATA_STRIPES: usize = 64;
/// Stripes of the per-chunk locks of writes.
const CHUNK_STRIPES: usize = 1024;

/// The stripe of chunk `c` of `ino` among the chunk locks: consecutive
/// chunks of a file take consecutive stripes (so a write of up to
/// [`CHUNK_STRIPES`] chunks never takes one twice), files start apart.
fn chunk_stripe(ino: u64, c: u64) -> usize {
    (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(c) % CHUNK_STRIPES as u64) as usize
}

/// What a write holds (see [`FileSystem::write_locks`]).
pub(crate) struct WriteLocks<'a> {
    _file: RwLockReadGuard<'a, ()>,
    _chunks: Vec<MutexGuard<'a, ()>>,
}

/// A mounted (or model-tested) file system.
pub struct FileSystem {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) keys: Keys,
    pub(crate) chunk: u64,
    /// Chunk counts of files that may have holes (`blocks.rs`).
    pub(crate) held: crate::blocks::HeldChunks,
    pub(crate) ns: Mutex<()>,
    pub(crate) cache: Mutex<InodeCache>,
    pub(crate) dentries: Mutex<DentryCache>,
    /// Next free inode number and the end of the reserved batch.
    inos: Mutex<(u64, u64)>,
    /// References per inode: open handles, and the kernel's lookups (FUSE
    /// `nlookup`, dropped by FORGET). An unlinked file's data stays until
    /// the last is gone, so a write-back the kernel sends after close still
    /// finds its inode.
    pins: Mutex<HashMap<u64, u64>>,
    /// Per file opened and still referenced, the losses of acknowledged
    /// writes its `fsync` was told of (sampled when it was first opened):
    /// like a Linux file's writeback error, each loss is reported once to
    /// each file, so the file whose data was lost hears of it even if
    /// another file's `fsync` came first.
    losses_seen: Mutex<HashMap<u64, Arc<client::WriterLosses>>>,
    /// Per-file data locks, striped (see the module doc).
    data_locks: Vec<RwLock<()>>,
    /// Per-chunk locks of writes, striped.
    chunk_locks: Vec<Mutex<()>>,
    /// Unlinked inodes for the background reclaimer, once started.
    reclaim_queue: Mutex<Option<crossbeam_channel::Sender<u64>>>,
    capacity: Mutex<Option<(std::time::Instant, Option<client::Capacity>)>>,
    /// Cleared when this mount may no longer write (its lease is lost).
    fence: Mutex<Option<client::lease::Fence>>,
    /// Metadata write-behind, once started (else changes are written
    /// before they return).
    write_behind: Mutex<Option<Arc<WriteBehind>>>,
}

/// A metadata change: inodes read and changed, other keys written, all
/// committed as one atomic batch. Only built while holding `ns`.
pub(crate) struct Txn<'a> {
    fs: &'a FileSystem,
    inodes: BTreeMap<u64, Inode>,
    removed: Vec<u64>,
    ops: Change,
}

impl<'a> Txn<'a> {
    /// Inode `ino` as this change sees it (ENOENT if absent).
    pub(crate) fn get(&mut self, ino: u64) -> Result<&mut Inode> {
        if !self.inodes.contains_key(&ino) {
            let i = self.fs.inode(ino)?;
            self.inodes.insert(ino, i);
        }
        self.inodes
            .get_mut(&ino)
            .ok_or_else(|| FsError::Corrupt("transaction lost an inode".into()))
    }

    /// A copy of inode `ino` as this change sees it.
    pub(crate) fn read(&mut self, ino: u64) -> Result<Inode> {
        Ok(self.get(ino)?.clone())
    }

    /// Adds a new inode.
    pub(crate) fn create(&mut self, inode: Inode) {
        self.inodes.insert(inode.ino, inode);
    }

    /// Deletes inode `ino` (its record; the caller deletes the rest).
    pub(crate) fn remove(&mut self, ino: u64) {
        self.inodes.remove(&ino);
        self.removed.push(ino);
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((key, Some(value)));
    }

    pub(crate) fn delete(&mut self, key: Vec<u8>) {
        self.ops.push((key, None));
    }

    /// Writes the change as one atomic batch, then the cache. Every inode
    /// touched is written whole (with the size it has here), so its growth
    /// mark is cleared in the same batch.
    pub(crate) fn commit(self) -> Result<()> {
        self.fs.writable()?;
        let keys = &self.fs.keys;
        let mut ops = self.ops;
        let growing: Vec<u64> = {
            let cache = self.fs.cache.lock();
            self.inodes
                .keys()
                .chain(&self.removed)
                .filter(|i| cache.get(**i).is_some_and(|c| c.growing))
                .copied()
                .collect()
        };
        for i in self.inodes.values() {
            ops.push((keys.inode(i.ino), Some(i.encode())));
        }
        for &ino in &self.removed {
            ops.push((keys.inode(ino), None));
        }
        for &ino in &growing {
            ops.push((keys.growing(ino), None));
        }
        let queue = self.fs.write_behind.lock().clone();
        let result = match queue {
            // Acknowledged from the caches; written in order behind.
            Some(wb) => {
                wb.push(ops);
                Ok(())
            }
            None => self.fs.store.write_atomic_durable(&write_ops(&ops)),
        };
        let mut cache = self.fs.cache.lock();
        match result {
            Ok(()) => {
                for (_, i) in self.inodes {
                    cache.stored(i);
                }
                for ino in self.removed {
                    cache.remove(ino);
                }
                Ok(())
            }
            Err(e) => {
                self.fs.dentries.lock().clear();
                // The store may hold the change or not: forget what the
                // cache knows unless it holds unwritten changes.
                for ino in self.inodes.keys().chain(&self.removed) {
                    if cache.get(*ino).is_some_and(|c| !c.dirty) {
                        cache.remove(*ino);
                    }
                }
                Err(e.into())
            }
        }
    }
}

/// Items listed per store call by [`for_each_page`].
const PAGE: usize = 1000;

/// Reads a range from `start` a page at a time: `fetch(from, PAGE)` is the
/// store's range call (bounded by its own end), `key` an item's key; each
/// page goes to `visit` before the next is read.
pub(crate) fn for_each_page<T, K: AsRef<[u8]>>(
    start: &[u8],
    fetch: impl Fn(&[u8], usize) -> client::Result<Vec<T>>,
    key: impl Fn(&T) -> &K,
    mut visit: impl FnMut(Vec<T>) -> Result<()>,
) -> Result<()> {
    for_each_page_while(start, fetch, key, |page| visit(page).map(|()| true))
}

/// [`for_each_page`] that stops reading once `visit` answers false.
pub(crate) fn for_each_page_while<T, K: AsRef<[u8]>>(
    start: &[u8],
    fetch: impl Fn(&[u8], usize) -> client::Result<Vec<T>>,
    key: impl Fn(&T) -> &K,
    mut visit: impl FnMut(Vec<T>) -> Result<bool>,
) -> Result<()> {
    let mut from = start.to_vec();
    loop {
        let page = fetch(&from, PAGE)?;
        let full = page.len() == PAGE;
        if let Some(last) = page.last() {
            from = key(last).as_ref().to_vec();
            from.push(0);
        }
        if !visit(page)? || !full {
            return Ok(());
        }
    }
}

impl FileSystem {
    /// Opens the file system `record` in `store` and repairs what a crash
    /// of its last mount left: data past a file's recorded size is
    /// dropped, and unlinked files' data reclaimed.
    pub fn open(store: Arc<dyn Store>, record: &FsRecord) -> Result<FileSystem> {
        let fs = FileSystem {
            store,
            keys: Keys::new(record.id),
            chunk: u64::from(record.chunk_size),
            held: Default::default(),
            ns: Mutex::new(()),
            cache: Mutex::new(InodeCache::default()),
            dentries: Mutex::new(DentryCache::default()),
            inos: Mutex::new((0, 0)),
            pins: Mutex::new(HashMap::new()),
            losses_seen: Mutex::new(HashMap::new()),
            data_locks: (0..DATA_STRIPES).map(|_| RwLock::new(())).collect(),
            chunk_locks: (0..CHUNK_STRIPES).map(|_| Mutex::new(())).collect(),
            reclaim_queue: Mutex::new(None),
            capacity: Mutex::new(None),
            fence: Mutex::new(None),
            write_behind: Mutex::new(None),
        };
        fs.recover()?;
        Ok(fs)
    }

    /// The cluster's space for user data, if known (asked at most once a
    /// second: `df` should not fan out to every node each time, and should
    /// not show a filling disk as it was seconds ago either).
    pub fn capacity(&self) -> Option<client::Capacity> {
        let mut cached = self.capacity.lock();
        if let Some((at, c)) = *cached {
            if at.elapsed() < std::time::Duration::from_secs(1) {
                return c;
            }
        }
        let c = self.store.capacity().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the cluster's capacity");
            None
        });
        *cached = Some((std::time::Instant::now(), c));
        c
    }

    /// Acknowledges metadata changes once the caches hold them and writes
    /// them behind, in order, in batches (see `writebehind.rs`), on a
    /// thread that [`FileSystem::stop_write_behind`] drains and stops.
    pub fn start_write_behind(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let wb = WriteBehind::new();
        *self.write_behind.lock() = Some(wb.clone());
        let fs = self.clone();
        std::thread::Builder::new()
            .name("fs-write-behind".into())
            .spawn(move || wb.run(&*fs.store.clone(), || fs.write_permit()))
    }

    /// Writes what is queued and stops the write-behind thread; later
    /// changes are written before they return.
    pub fn stop_write_behind(&self) {
        if let Some(wb) = self.write_behind.lock().take() {
            wb.stop();
        }
    }

    /// Returns once every metadata change acknowledged so far is in the
    /// store (before reading metadata from it, and for fsync).
    pub(crate) fn settle(&self) -> Result<()> {
        self.wait_for_queue(WriteBehind::settle)
    }

    /// [`Self::settle`] when a queued change touches one of `keys`: before
    /// reading them from the store.
    pub(crate) fn settle_keys(&self, keys: &[&[u8]]) -> Result<()> {
        self.wait_for_queue(|wb| wb.settle_keys(keys))
    }

    /// [`Self::settle`] when a queued change touches a key in `[start,
    /// end)`: before listing them from the store.
    pub(crate) fn settle_range(&self, start: &[u8], end: &[u8]) -> Result<()> {
        self.wait_for_queue(|wb| wb.settle_range(start, end))
    }

    /// Runs `wait` on the write-behind queue, if there is one (without
    /// holding the slot's lock while it waits).
    fn wait_for_queue(&self, wait: impl FnOnce(&WriteBehind) -> Result<()>) -> Result<()> {
        let queue = self.write_behind.lock().clone();
        queue.map_or(Ok(()), |wb| wait(&wb))
    }

    /// Makes changes depend on `fence` (the mount lease's): while it does
    /// not hold they fail with EROFS.
    pub fn fence_with(&self, fence: client::lease::Fence) {
        *self.fence.lock() = Some(fence);
    }

    /// Whether the write-behind may write queued changes now: while a
    /// lease renewal is only late they wait (they were acknowledged, and
    /// dropping them would leave the store behind the caches the mount
    /// goes on serving); once the lease is taken over, never.
    pub(crate) fn write_permit(&self) -> Permit {
        match &*self.fence.lock() {
            Some(f) if f.revoked() => Permit::Never,
            Some(f) if !f.holds() => Permit::Wait,
            _ => Permit::Write,
        }
    }

    /// EROFS unless this mount may write.
    pub(crate) fn writable(&self) -> Result<()> {
        match &*self.fence.lock() {
            Some(f) if !f.holds() => posix(libc::EROFS),
            _ => Ok(()),
        }
    }

    /// Bytes per data chunk.
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// Starts a metadata change.
    pub(crate) fn begin(&self) -> (MutexGuard<'_, ()>, Txn<'_>) {
        (
            self.ns.lock(),
            Txn {
                fs: self,
                inodes: BTreeMap::new(),
                removed: Vec::new(),
                ops: Vec::new(),
            },
        )
    }

    /// Inode `ino` (ENOENT if it does not exist).
    pub fn inode(&self, ino: u64) -> Result<Inode> {
        if let Some(c) = self.cache.lock().get(ino) {
            return Ok(c.inode.clone());
        }
        match self.inodes(&[ino])?.pop().flatten() {
            Some(inode) => Ok(inode),
            None => posix(libc::ENOENT),
        }
    }

    /// Inodes `inos`, in order (`None` for one that does not exist): those
    /// the cache lacks in one multi-get (a listing's attributes for
    /// READDIRPLUS, rather than a point read per entry).
    pub fn inodes(&self, inos: &[u64]) -> Result<Vec<Option<Inode>>> {
        let mut out: Vec<Option<Inode>> = {
            let cache = self.cache.lock();
            inos.iter()
                .map(|&i| cache.get(i).map(|c| c.inode.clone()))
                .collect()
        };
        let missing: Vec<usize> = (0..inos.len()).filter(|&i| out[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(out);
        }
        let keys: Vec<Vec<u8>> = missing.iter().map(|&i| self.keys.inode(inos[i])).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        self.settle_keys(&refs)?;
        let values = self.store.mget(&refs)?;
        let mut cache = self.cache.lock();
        for (&i, value) in missing.iter().zip(values) {
            let Some(bytes) = value else { continue };
            // A change that raced this read is newer: keep it.
            if let Some(c) = cache.get(inos[i]) {
                out[i] = Some(c.inode.clone());
                continue;
            }
            let inode = Inode::decode(inos[i], &bytes)?;
            // Not knowing of a growth mark is safe: a write writes it
            // again, and the next open drops data past the stored size.
            cache.stored(inode.clone());
            out[i] = Some(inode);
        }
        Ok(out)
    }

    /// A fresh inode number (hold `ns`).
    pub(crate) fn alloc_ino(&self) -> Result<u64> {
        let mut inos = self.inos.lock();
        if inos.0 == inos.1 {
            let key = self.keys.counter();
            let next = match self.store.get(&key)? {
                Some(v) => std::str::from_utf8(&v)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
                    .ok_or_else(|| FsError::Corrupt("inode counter".into()))?,
                None => crate::inode::ROOT + 1,
            };
            let limit = next + INO_BATCH;
            // Durable before any inode numbered from the range is: the
            // write-behind's batches are, and a node that lost the counter
            // after taking them would hand the numbers out again.
            let limit_text = limit.to_string();
            self.store
                .write_atomic_durable(&[(&key[..], Some(limit_text.as_bytes()))])?;
            *inos = (next, limit);
        }
        let ino = inos.0;
        inos.0 += 1;
        Ok(ino)
    }

    /// The lock that keeps every write of `ino` out (a truncation or an
    /// fallocate changes which chunks exist).
    pub(crate) fn data_lock(&self, ino: u64) -> RwLockWriteGuard<'_, ()> {
        self.data_locks[(ino % DATA_STRIPES as u64) as usize].write()
    }

    /// The locks a write of chunks `first..=last` of `ino` holds: the
    /// file's data stripe shared, then the chunks' stripes in ascending
    /// order, so writes to other chunks of the file run at the same time.
    pub(crate) fn write_locks(&self, ino: u64, first: u64, last: u64) -> WriteLocks<'_> {
        let file = self.data_locks[(ino % DATA_STRIPES as u64) as usize].read();
        // A write of more chunks than there are stripes takes them all.
        let mut stripes: Vec<usize> = if last - first >= CHUNK_STRIPES as u64 {
            (0..CHUNK_STRIPES).collect()
        } else {
            (first..=last).map(|c| chunk_stripe(ino, c)).collect()
        };
        stripes.sort_unstable();
        stripes.dedup();
        let chunks = stripes
            .into_iter()
            .map(|i| self.chunk_locks[i].lock())
            .collect();
        WriteLocks {
            _file: file,
            _chunks: chunks,
        }
    }

    /// Writes `ino` back if it changed since stored (size and times after
    /// writes).
    pub fn flush_inode(&self, ino: u64) -> Result<()> {
        if !self.cache.lock().get(ino).is_some_and(|c| c.dirty) {
            return Ok(());
        }
        let (_ns, mut txn) = self.begin();
        txn.get(ino)?;
        txn.commit()
    }

    /// Writes back every changed inode.
    pub fn flush_all(&self) -> Result<()> {
        let dirty = self.cache.lock().dirty();
        for ino in dirty {
            match self.flush_inode(ino) {
                Err(FsError::Posix(_)) => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// Makes everything written so far durable: inodes written back, then
    /// the cluster synced.
    pub fn sync_all(&self) -> Result<()> {
        self.flush_all()?;
        self.settle()?;
        Ok(self.store.sync()?)
    }

    /// Makes `ino`'s data and attributes durable on its replicas. Fails
    /// once for each loss of acknowledged writes (a node that restarted
    /// without a clean stop) since the file was opened.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.flush_inode(ino)?;
        self.settle()?;
        let losses = self.losses_seen.lock().get(&ino).cloned();
        let losses = losses.unwrap_or_else(|| Arc::new(self.writer_losses()));
        Ok(losses.sync(|c| self.store.sync_with(c))?)
    }

    /// `ino` was opened (or created open).
    pub fn opened(&self, ino: u64) {
        self.pin(ino, 1);
        if !self.losses_seen.lock().contains_key(&ino) {
            let now = Arc::new(self.writer_losses());
            self.losses_seen.lock().entry(ino).or_insert(now);
        }
    }

    /// A writer told of every loss so far (the store is not asked under
    /// the map's lock).
    fn writer_losses(&self) -> client::WriterLosses {
        client::WriterLosses::new(self.store.loss_cursor())
    }

    /// `n` more references to `ino` (the kernel looked it up).
    pub fn pin(&self, ino: u64, n: u64) {
        *self.pins.lock().entry(ino).or_insert(0) += n;
    }

    /// `n` references to `ino` fewer; reclaims it when that was the last
    /// of an unlinked file.
    pub fn unpin(&self, ino: u64, n: u64) -> Result<()> {
        let last = {
            let mut pins = self.pins.lock();
            match pins.get_mut(&ino) {
                Some(p) if *p > n => {
                    *p -= n;
                    false
                }
                Some(_) => {
                    pins.remove(&ino);
                    self.losses_seen.lock().remove(&ino);
                    true
                }
                None => false,
            }
        };
        if last && self.inode(ino).is_ok_and(|i| i.nlink == 0) {
            self.reclaim_later(ino)?;
        }
        Ok(())
    }

    /// A handle of `ino` was released: its changes are written back, and
    /// an unlinked file without references left is reclaimed.
    pub fn released(&self, ino: u64) -> Result<()> {
        self.flush_inode(ino)?;
        self.unpin(ino, 1)
    }

    /// The kernel let go of everything (unmounted): drops every reference
    /// and reclaims the unlinked files.
    pub fn unmounted(&self) -> Result<usize> {
        self.pins.lock().clear();
        self.losses_seen.lock().clear();
        self.reclaim_orphans()
    }

    pub(crate) fn is_open(&self, ino: u64) -> bool {
        self.pins.lock().contains_key(&ino)
    }

    /// Every key in `[start, end)`, listed page by page.
    pub(crate) fn list_keys(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.settle_range(start, end)?;
        let mut out = Vec::new();
        for_each_page(
            start,
            |from, n| self.store.range_keys(from, end, n),
            |k| k,
            |page| {
                out.extend(page.into_iter().map(|k| k.to_vec()));
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Deletes every key in `[start, end)` once the queue holds no change
    /// to them ([`Store::delete_range`]: page by page, bounded whatever the
    /// range holds).
    pub(crate) fn delete_listed(&self, start: &[u8], end: &[u8]) -> Result<()> {
        self.settle_range(start, end)?;
        Ok(self.store.delete_range(start, end, PAGE)?)
    }

    /// Every live pair in `[start, end)`, read page by page.
    pub(crate) fn list_pairs(&self, start: &[u8], end: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.settle_range(start, end)?;
        let mut out = Vec::new();
        for_each_page(
            start,
            |from, n| self.store.range(from, end, n),
            |(k, _)| k,
            |page| {
                out.extend(page.into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())));
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Deletes an unlinked inode: its data first, then (atomically) its
    /// record, xattrs and reclaim mark. A crash in between leaves the mark,
    /// so the next open finishes the job.
    pub fn reclaim(&self, ino: u64) -> Result<()> {
        self.reclaim_all(&[ino])
    }

    /// [`Self::reclaim`] for each of `inos`, which were unlinked before the
    /// call: one wait for the write-behind queue for all of them (each
    /// wait makes the queue write at once, so a wait per file of an
    /// `rm -r` cost a metadata batch per file). Returns the first error,
    /// after trying every file.
    pub fn reclaim_all(&self, inos: &[u64]) -> Result<()> {
        self.writable()?;
        // The unlinks must be in the store before the data goes.
        self.settle()?;
        // An unlink and the kernel's last forget of a file both ask.
        let mut inos = inos.to_vec();
        inos.sort_unstable();
        inos.dedup();
        let mut outcome = Ok(());
        for ino in inos {
            if !self.is_open(ino) {
                if let Err(e) = self.reclaim_settled(ino) {
                    outcome = outcome.and(Err(e));
                }
            }
        }
        outcome
    }

    /// [`Self::reclaim`] once its unlink is in the store.
    fn reclaim_settled(&self, ino: u64) -> Result<()> {
        let known = match self.inode(ino) {
            Ok(i) if i.nlink > 0 => return Ok(()),
            Ok(i) => Some(i),
            // Reclaimed already (its mark goes last, with the inode), or
            // an inode lost with its mark still there: then list what is
            // left of it.
            Err(FsError::Posix(_)) if self.store.get(&self.keys.orphan(ino))?.is_none() => {
                return Ok(())
            }
            Err(FsError::Posix(_)) => None,
            Err(e) => return Err(e),
        };
        // No chunk lies past the size (see data.rs), so a small file's
        // chunks are known without listing; a large or unknown one is
        // listed (a sparse file would leave many needless tombstones).
        match &known {
            Some(i) if i.size.div_ceil(self.chunk) <= 64 => {
                let chunks: Vec<Vec<u8>> = (0..i.size.div_ceil(self.chunk))
                    .map(|c| self.keys.chunk(ino, c))
                    .collect();
                self.delete_keys(&chunks)?;
            }
            _ => {
                let (start, end) = self.keys.chunks_from(ino, 0);
                self.delete_listed(&start, &end)?;
            }
        }
        self.held.forget(ino);
        let (_ns, mut txn) = self.begin();
        match txn.get(ino) {
            Ok(i) if i.nlink > 0 => return Ok(()),
            Ok(_) => txn.remove(ino),
            Err(FsError::Posix(_)) => {}
            Err(e) => return Err(e),
        }
        if known.is_none_or(|i| i.flags & crate::inode::HAS_XATTRS != 0) {
            let (xs, xe) = self.keys.xattrs(ino);
            for k in self.list_keys(&xs, &xe)? {
                txn.delete(k);
            }
        }
        txn.delete(self.keys.orphan(ino));
        txn.commit()
    }

    /// Reclaims `ino` in the background if the reclaimer runs, else now.
    pub(crate) fn reclaim_later(&self, ino: u64) -> Result<()> {
        if let Some(q) = &*self.reclaim_queue.lock() {
            if q.send(ino).is_ok() {
                return Ok(());
            }
        }
        self.reclaim(ino)
    }

    /// Starts a thread that reclaims unlinked files' data off the request
    /// path. [`FileSystem::stop_reclaimer`] drains and stops it. (A crash
    /// before it is done leaves the reclaim marks: the next open finishes.)
    pub fn start_reclaimer(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        *self.reclaim_queue.lock() = Some(tx);
        let fs = self.clone();
        std::thread::Builder::new()
            .name("fs-reclaim".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Unlinks come in bursts (`rm -r`, a build's clean):
                    // reclaim what arrives together in one go.
                    // (A sleep, not a receive per file: waking for each
                    // one cost more than reclaiming it.)
                    std::thread::sleep(RECLAIM_GATHER);
                    let mut inos = vec![first];
                    inos.extend(rx.try_iter().take(RECLAIM_BATCH));
                    if let Err(e) = fs.reclaim_all(&inos) {
                        tracing::warn!(files = inos.len(), error = %e, "cannot reclaim unlinked files now; the next mount will");
                    }
                }
            })
    }

    /// Stops queueing to the reclaimer; it exits once the queue is empty.
    pub fn stop_reclaimer(&self) {
        self.reclaim_queue.lock().take();
    }

    /// Deletes `keys`, a page at a time.
    pub(crate) fn delete_keys(&self, keys: &[Vec<u8>]) -> Result<()> {
        for page in keys.chunks(1000) {
            let ops: Vec<(&[u8], Option<&[u8]>)> = page.iter().map(|k| (&k[..], None)).collect();
            self.store.write(&ops)?;
        }
        Ok(())
    }

    /// Reclaims every unlinked inode that is not open.
    pub fn reclaim_orphans(&self) -> Result<usize> {
        let (s, e) = self.keys.all_of(b'O');
        let mut n = 0;
        for (k, _) in self.list_pairs(&s, &e)? {
            if let Some(ino) = self.keys.ino_of(&k) {
                if !self.is_open(ino) {
                    self.reclaim(ino)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    fn recover(&self) -> Result<()> {
        let (s, e) = self.keys.all_of(b'G');
        for (k, _) in self.list_pairs(&s, &e)? {
            let Some(ino) = self.keys.ino_of(&k) else {
                continue;
            };
            match self.inode(ino) {
                Ok(i) => self.drop_data_past(ino, i.size)?,
                Err(FsError::Posix(_)) => {}
                Err(err) => return Err(err),
            }
            self.store.delete(&k)?;
            if let Some(c) = self.cache.lock().get_mut(ino) {
                c.growing = false;
            }
        }
        self.reclaim_orphans()?;
        Ok(())
    }
}
