//! [`FileDevice`]: a [`Device`] on a regular file or a raw block device.
//!
//! I/O goes through `pread`/`pwrite` on one shared descriptor, so many threads
//! can have I/Os in flight. The descriptor is opened with O_DIRECT when the
//! file system allows it; then every transfer uses an [`IO_ALIGN`]-aligned
//! buffer (a bounce copy when the caller's is not aligned). Large writes are
//! split into stripes written in parallel by a small [`IoPool`], and
//! adjacent writes of one [`Device::write_many`] go out joined (`joined`).
//! Batched reads ([`Device::read_many`]) go through the calling thread's
//! io_uring ring (see `uring`), or the pool where io_uring is unavailable.
//!
//! A regular file is created sparse. TRIM punches holes in it unless told to
//! keep the blocks ([`FileDevice::set_punch_holes`]); `prepare` (an erase
//! before reuse) allocates the range's blocks instead, so that writes into
//! a prepared range never find the host file system full; and
//! [`FileDevice::preallocate`] allocates every block up front and keeps them,
//! so that no later write has to allocate.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::device::{check_page_range, check_read, is_io_aligned, AlignedBuf, Device};
use crate::error::{FlashError, Result};
use crate::iopool::IoPool;
use crate::joined;
use crate::stats::{pages_touched, AtomicCounters, DeviceCounters};
use crate::{IO_ALIGN, READ_ALIGN};

/// Preferred stripe: the unit in which large writes are split across the pool.
const STRIPE_BYTES: usize = 1024 * 1024;
/// Number of I/O threads per device.
const IO_THREADS: usize = 32;
/// Zeros written per call while filling holes (see [`FileDevice::preallocate`]).
const FILL_CHUNK: usize = 8 << 20;
/// Part of the free space [`FileDevice::fitting_capacity`] leaves to the
/// file system: one part in this many ...
pub const HOST_MARGIN_FRACTION: u64 = 32;
/// ... and at least this many bytes.
pub const HOST_MARGIN_MIN: u64 = 2 << 20;
/// `BLKDISCARD` = `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// A [`Device`] on a regular file or a raw block device.
pub struct FileDevice {
    /// Shared descriptor; holds the exclusive `flock` for the device's lifetime.
    file: Arc<File>,
    /// A second, read-only descriptor of the same file for io_uring reads.
    /// A read in flight keeps its file open until it completes, even after
    /// the process died (the kernel tears a ring down asynchronously), and
    /// that must not keep `file`'s lock from a node restarted at once.
    ring_file: File,
    path: PathBuf,
    /// Bytes; a multiple of `page_size`.
    capacity: u64,
    page_size: u32,
    /// Opened with O_DIRECT: every transfer must use an aligned buffer.
    direct: bool,
    block_device: bool,
    /// Stripe size: a nonzero multiple of `page_size`.
    stripe: usize,
    /// Whether direct reads of 512-byte granularity work here.
    sub_block_reads: AtomicBool,
    /// Whether TRIM on a regular file punches holes (see [`FileDevice::set_punch_holes`]).
    punch_holes: AtomicBool,
    pool: IoPool,
    counters: AtomicCounters,
}

impl FileDevice {
    /// Opens (and for a regular file with `create_capacity`, creates or grows
    /// to that size, sparsely) the device at `path` with the given page size,
    /// and takes an exclusive advisory lock on it.
    ///
    /// `page_size` must be a nonzero multiple of [`IO_ALIGN`]. The capacity is
    /// the file (or block device) size rounded down to whole pages.
    pub fn open(
        path: &Path,
        create_capacity: Option<u64>,
        page_size: u32,
    ) -> Result<Arc<FileDevice>> {
        Self::open_inner(path, create_capacity, page_size, true)
    }

    /// [`FileDevice::open`]; `try_direct == false` forces buffered I/O (the fallback path).
    fn open_inner(
        path: &Path,
        create_capacity: Option<u64>,
        page_size: u32,
        try_direct: bool,
    ) -> Result<Arc<FileDevice>> {
        if page_size == 0 || !(page_size as usize).is_multiple_of(IO_ALIGN) {
            return Err(FlashError::InvalidArgument(format!(
                "page size {page_size} is not a nonzero multiple of {IO_ALIGN}"
            )));
        }
        let create = create_capacity.is_some();
        let (mut file, mut direct) = match open_file(path, create, try_direct) {
            Ok(f) => (f, try_direct),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open_file(path, create, false)?, false)
            }
            Err(e) => return Err(e.into()),
        };
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let size = if block_device {
            file.seek(SeekFrom::End(0))?
        } else {
            let len = meta.len();
            match create_capacity {
                Some(cap) if len < cap => {
                    file.set_len(cap)?;
                    cap
                }
                _ => len,
            }
        };
        if direct && size >= IO_ALIGN as u64 && !probe_direct_read(&file)? {
            // The file system accepted O_DIRECT at open but rejects aligned I/O.
            file = open_file(path, false, false)?;
            direct = false;
        }
        lock_exclusive(&file, path)?;
        let ring_file = open_reader(path, direct)?;
        let ps = u64::from(page_size);
        let stripe = (STRIPE_BYTES / page_size as usize).max(1) * page_size as usize;
        Ok(Arc::new(FileDevice {
            file: Arc::new(file),
            ring_file,
            path: path.to_path_buf(),
            capacity: size / ps * ps,
            page_size,
            direct,
            block_device,
            stripe,
            sub_block_reads: AtomicBool::new(true),
            punch_holes: AtomicBool::new(true),
            pool: IoPool::new("flash-io", IO_THREADS)?,
            counters: AtomicCounters::default(),
        }))
    }

    /// The capacity a new device file at `path` may have so that its file
    /// system can hold all of it: `requested`, or less when the file system
    /// (of `path`'s directory) has less free space than that, keeping back
    /// `HOST_MARGIN_FRACTION` of the free space (at least
    /// `HOST_MARGIN_MIN`) for the file system and other files. A sparse
    /// device larger than its file system would run into a full file
    /// system before it is full itself; a device that fits reports a full
    /// device instead, where deletes and GC make room. `None` when `path`
    /// already exists (its size stands) or the free space cannot be read.
    /// Returns the capacity and the free space seen.
    pub fn fitting_capacity(path: &Path, requested: u64) -> Option<(u64, u64)> {
        if path.exists() {
            return None;
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
        let free = File::open(dir)
            .ok()
            .and_then(|d| free_bytes(d.as_raw_fd()).ok())?;
        let margin = (free / HOST_MARGIN_FRACTION).max(HOST_MARGIN_MIN);
        Some((requested.min(free.saturating_sub(margin)), free))
    }

    /// True when I/O bypasses the page cache (opened with O_DIRECT).
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    /// Path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether TRIM on a regular file punches holes (the default), giving
    /// the blocks back to the file system, or leaves them allocated with
    /// their old content (which TRIM allows). Punching a hole makes ext4
    /// wait for all direct I/O in flight on the file, and a later write
    /// into the hole allocates blocks again, which `fdatasync` then has to
    /// commit (about 1.8× slower for synced writes on the machine
    /// measured). A node that owns its device file for good is faster
    /// keeping them. Block devices always get `BLKDISCARD`.
    pub fn set_punch_holes(&self, punch: bool) {
        self.punch_holes.store(punch, Ordering::Relaxed);
    }

    /// Makes a regular device file fully allocated and keeps it so: TRIM
    /// stops punching holes ([`Self::set_punch_holes`]) and every hole is
    /// filled with zeros, so no later write has to allocate (on ext4 a
    /// direct write that allocates takes the inode lock exclusively, and a
    /// synced one also commits the allocation). Data already written is not
    /// touched: only holes, which read as zeros anyway, are filled, so this
    /// is safe on a store in use. Refuses, writing nothing, when the file
    /// system lacks the space. Returns the bytes written (0 for a block
    /// device or a file without holes). Call it before the device is used.
    pub fn preallocate(&self) -> Result<u64> {
        self.set_punch_holes(false);
        self.fill_holes()
    }

    /// Writes zeros into every hole of a regular device file (see
    /// [`Self::preallocate`]); the bytes written.
    fn fill_holes(&self) -> Result<u64> {
        if self.block_device {
            return Ok(0);
        }
        let holes = self.holes()?;
        let needed: u64 = holes.iter().map(|(start, end)| end - start).sum();
        let free = free_bytes(self.file.as_raw_fd())?;
        if needed > free {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "filling the device file's holes needs {needed} bytes, \
                     its file system has {free} free"
                ),
            )
            .into());
        }
        let zeros = AlignedBuf::new_zeroed(FILL_CHUNK);
        for &(start, end) in &holes {
            let mut off = start;
            while off < end {
                let n = (end - off).min(FILL_CHUNK as u64) as usize;
                Self::write_from(&self.file, self.direct, off, &zeros[..n])?;
                off += n as u64;
            }
        }
        if needed > 0 {
            self.file.sync_data()?;
        }
        Ok(needed)
    }

    /// The holes of the device file below its capacity, as `[start, end)`.
    fn holes(&self) -> Result<Vec<(u64, u64)>> {
        let fd = self.file.as_raw_fd();
        let end = self.capacity;
        let mut holes = Vec::new();
        let mut at = 0u64;
        while at < end {
            let Some(hole) = seek(fd, at, libc::SEEK_HOLE)?.filter(|&h| h < end) else {
                break;
            };
            let data = seek(fd, hole, libc::SEEK_DATA)?.map_or(end, |d| d.min(end));
            holes.push((hole, data));
            at = data;
        }
        Ok(holes)
    }

    /// Reads into `buf`, through an aligned bounce buffer if direct I/O needs one.
    fn read_into(file: &File, direct: bool, offset: u64, buf: &mut [u8]) -> Result<()> {
        if direct && !is_io_aligned(buf.as_ptr()) {
            let mut bounce = AlignedBuf::new_zeroed(buf.len());
            file.read_exact_at(&mut bounce[..buf.len()], offset)?;
            buf.copy_from_slice(&bounce[..buf.len()]);
        } else {
            file.read_exact_at(buf, offset)?;
        }
        Ok(())
    }

    /// `[offset, offset + len)` widened to whole [`IO_ALIGN`] blocks, the
    /// end capped at the block holding the device's last byte.
    fn widened(&self, offset: u64, len: usize) -> (u64, u64) {
        let a = IO_ALIGN as u64;
        let end = (offset + len as u64).div_ceil(a) * a;
        (offset / a * a, end.min(self.capacity.div_ceil(a) * a))
    }

    /// Reads through a bounce buffer widened to whole 4 KiB blocks.
    fn read_widened(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (start, end) = self.widened(offset, buf.len());
        let mut bounce = AlignedBuf::new_zeroed((end - start) as usize);
        self.file
            .read_exact_at(&mut bounce[..(end - start) as usize], start)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&bounce[at..at + buf.len()]);
        Ok(())
    }

    /// Writes each `(offset, parts)` on the I/O pool, all at once, straight
    /// from the callers' buffers (no copy): the parts back to back from
    /// `offset`, one `pwrite` for a single part, one `pwritev` for several
    /// (which must then be aligned for direct I/O: see
    /// [`joined::plan_runs`]). Waits for every one and returns their
    /// results in order (`Err` only when a job could not run). The jobs
    /// never wait for the pool themselves.
    fn write_on_pool<'a>(
        &self,
        writes: impl Iterator<Item = (u64, Vec<&'a [u8]>)>,
    ) -> Result<Vec<Result<()>>> {
        let jobs = writes.map(|(at, parts)| {
            let file = Arc::clone(&self.file);
            let direct = self.direct;
            let borrowed: Vec<BorrowedSlice> = parts
                .iter()
                .map(|p| BorrowedSlice(p.as_ptr(), p.len()))
                .collect();
            move || {
                // SAFETY: `run_all` below waits for every job (also one that
                // panics) before `write_on_pool` returns, so each slice,
                // borrowed for `'a`, outlives its use here, and nothing
                // writes to it meanwhile (it is borrowed shared).
                let parts: Vec<&[u8]> = borrowed.iter().map(|b| unsafe { b.as_slice() }).collect();
                Ok(match parts.as_slice() {
                    [data] => Self::write_from(&file, direct, at, data),
                    _ => joined::write_all_vectored_at(&file, at, &parts).map_err(FlashError::from),
                })
            }
        });
        self.pool.run_all(jobs)
    }

    /// Writes `data`, through an aligned bounce buffer if direct I/O needs one.
    fn write_from(file: &File, direct: bool, offset: u64, data: &[u8]) -> Result<()> {
        if direct && !is_io_aligned(data.as_ptr()) {
            let bounce = AlignedBuf::copy_from(data);
            file.write_all_at(&bounce[..data.len()], offset)?;
        } else {
            file.write_all_at(data, offset)?;
        }
        Ok(())
    }
}

/// A shared slice handed to an I/O worker for the duration of a call that
/// waits for the worker (see `IoPool::run_all`).
struct BorrowedSlice(*const u8, usize);

// SAFETY: the pointee is only read, and only while the lending call waits.
unsafe impl Send for BorrowedSlice {}

impl BorrowedSlice {
    /// SAFETY: the caller guarantees the lent slice is still alive and not
    /// mutated.
    unsafe fn as_slice(&self) -> &[u8] {
        std::slice::from_raw_parts(self.0, self.1)
    }
}

/// `lseek(fd, from, whence)` for `SEEK_HOLE`/`SEEK_DATA`: the offset found,
/// or `None` past the last data (`ENXIO`).
fn seek(fd: i32, from: u64, whence: i32) -> Result<Option<u64>> {
    let from =
        i64::try_from(from).map_err(|_| FlashError::OutOfRange(format!("seek to {from}")))?;
    // SAFETY: plain syscall on a valid descriptor; no memory is passed.
    let at = unsafe { libc::lseek(fd, from, whence) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err.into())
    }
}

/// Bytes an unprivileged writer may still allocate on `fd`'s file system.
fn free_bytes(fd: i32) -> Result<u64> {
    // SAFETY: `fstatvfs` fills the zeroed struct it is given; the pointer is
    // valid for the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a valid descriptor and a valid out-pointer.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // The field types are narrower than u64 on some targets.
    #[allow(clippy::useless_conversion)]
    let (blocks, size) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    Ok(blocks.saturating_mul(size))
}

/// Opens `path` read-only (the descriptor io_uring reads use), with
/// O_DIRECT when the main descriptor has it.
fn open_reader(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

/// Opens `path` read-write, optionally creating it and requesting O_DIRECT.
fn open_file(path: &Path, create: bool, direct: bool) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(create);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

/// Tries one aligned direct read at offset 0; `Ok(false)` when the file system rejects it.
fn probe_direct_read(file: &File) -> Result<bool> {
    let mut buf = AlignedBuf::new_zeroed(IO_ALIGN);
    match file.read_exact_at(&mut buf, 0) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Takes `flock(LOCK_EX | LOCK_NB)`; held until the descriptor is closed.
fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    // SAFETY: `file` owns a valid open descriptor for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(FlashError::Io(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!("device is in use by another process: {}", path.display()),
        )));
    }
    Err(err.into())
}

impl Device for FileDevice {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn page_size(&self) -> u32 {
        self.page_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_read(self.capacity, offset, buf.len())?;
        let whole_blocks =
            offset.is_multiple_of(IO_ALIGN as u64) && buf.len().is_multiple_of(IO_ALIGN);
        if !self.direct || whole_blocks || self.sub_block_reads.load(Ordering::Relaxed) {
            match Self::read_into(&self.file, self.direct, offset, buf) {
                Err(FlashError::Io(e))
                    if !whole_blocks && e.raw_os_error() == Some(libc::EINVAL) =>
                {
                    // The file system wants 4 KiB-aligned direct reads.
                    self.sub_block_reads.store(false, Ordering::Relaxed);
                    self.read_widened(offset, buf)?;
                }
                other => other?,
            }
        } else {
            self.read_widened(offset, buf)?;
        }
        let len = buf.len() as u64;
        self.counters
            .record_read(pages_touched(offset, len, self.page_size), len);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        check_page_range(self.capacity, self.page_size, offset, data.len() as u64)?;
        if data.len() >= 2 * self.stripe {
            // Consecutive stripes are written in parallel.
            let stripes = data
                .chunks(self.stripe)
                .enumerate()
                .map(|(i, chunk)| (offset + (i * self.stripe) as u64, vec![chunk]));
            self.write_on_pool(stripes)?
                .into_iter()
                .collect::<Result<()>>()?;
        } else {
            Self::write_from(&self.file, self.direct, offset, data)?;
        }
        let len = data.len() as u64;
        self.counters
            .record_write(len / u64::from(self.page_size), len);
        Ok(())
    }

    /// The writes in parallel on the I/O pool, adjacent ones joined into
    /// one `pwritev` of up to 4 MiB (see `joined`), none split into stripes
    /// (a job of the pool never waits for the pool). A failed joined write
    /// counts as failed from its first write.
    fn write_many(&self, writes: &[(u64, &[u8])]) -> std::result::Result<(), (usize, FlashError)> {
        if writes.len() < 2 {
            return writes.first().map_or(Ok(()), |(offset, data)| {
                self.write_at(*offset, data).map_err(|e| (0, e))
            });
        }
        for (i, (offset, data)) in writes.iter().enumerate() {
            check_page_range(self.capacity, self.page_size, *offset, data.len() as u64)
                .map_err(|e| (i, e))?;
        }
        let runs = joined::plan_runs(writes, self.direct);
        let jobs = runs.iter().map(|run| {
            let parts = writes[run.clone()].iter().map(|&(_, data)| data).collect();
            (writes[run.start].0, parts)
        });
        let results = self.write_on_pool(jobs).map_err(|e| (0, e))?;
        for (run, r) in runs.into_iter().zip(results) {
            r.map_err(|e| (run.start, e))?;
            for (_, data) in &writes[run] {
                let len = data.len() as u64;
                self.counters
                    .record_write(len / u64::from(self.page_size), len);
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.file.sync_data()?;
        self.counters.record_sync();
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        check_page_range(self.capacity, self.page_size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        if self.block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads a `[u64; 2]` (start, length) from the pointer,
            // which stays valid for the call. Discard is best effort: errors ignored.
            let _ = unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) };
        } else if self.punch_holes.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if let Err(err) = self.fallocate("trim", mode, offset, len)? {
                if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                    return Err(err.into());
                }
            }
        }
        self.counters.record_trim(len / u64::from(self.page_size));
        Ok(())
    }

    fn allocates_on_write(&self) -> bool {
        !self.block_device
    }

    fn prepare(&self, offset: u64, len: u64) -> Result<()> {
        check_page_range(self.capacity, self.page_size, offset, len)?;
        if len == 0 || self.block_device {
            return self.trim(offset, len);
        }
        // Mode 0 allocates what is not allocated yet and leaves what is
        // (content included): the old content of a reused range stays,
        // which an erase allows.
        if let Err(err) = self.fallocate("prepare", 0, offset, len)? {
            if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
                // No way to reserve blocks on this file system: erase as
                // before; a write may then still find the host full.
                return self.trim(offset, len);
            }
            return Err(err.into());
        }
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        self.counters.snapshot()
    }

    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (offset, buf) in reqs.iter() {
            check_read(self.capacity, *offset, buf.len())?;
        }
        if reqs.len() < 2 {
            for (offset, buf) in reqs.iter_mut() {
                self.read_at(*offset, buf)?;
            }
            return Ok(());
        }
        if crate::uring::available() {
            match self.read_many_uring(reqs) {
                Some(Ok(())) => return Ok(()),
                Some(Err(FlashError::Io(e)))
                    if e.raw_os_error() == Some(libc::EINVAL)
                        && self.direct
                        && self.sub_block_reads.load(Ordering::Relaxed) =>
                {
                    // The file system wants 4 KiB-aligned direct reads: the
                    // pool path below widens them.
                    self.sub_block_reads.store(false, Ordering::Relaxed);
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        self.read_many_pooled(reqs)
    }

    fn read_fd(&self, offset: u64, len: usize) -> Option<std::os::fd::RawFd> {
        check_read(self.capacity, offset, len).ok()?;
        let whole_blocks = offset.is_multiple_of(IO_ALIGN as u64) && len.is_multiple_of(IO_ALIGN);
        let readable = !self.direct || whole_blocks || self.sub_block_reads.load(Ordering::Relaxed);
        readable.then(|| self.ring_file.as_raw_fd())
    }

    fn note_read(&self, offset: u64, len: usize) {
        let len = len as u64;
        self.counters
            .record_read(pages_touched(offset, len, self.page_size), len);
    }
}

impl FileDevice {
    /// `fallocate(2)` with `mode` over `len` bytes at `offset` (`what`
    /// names the operation in an error): `Err` for a range no `off_t`
    /// holds, `Ok(Err)` for the system call's own failure.
    fn fallocate(
        &self,
        what: &str,
        mode: libc::c_int,
        offset: u64,
        len: u64,
    ) -> Result<std::io::Result<()>> {
        let (Ok(off), Ok(l)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(FlashError::OutOfRange(format!(
                "{what} at {offset} of {len} bytes"
            )));
        };
        // SAFETY: plain syscall on a valid descriptor; no memory is passed.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, l) };
        Ok(if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        })
    }

    /// [`Device::read_many`] through this thread's io_uring ring: reads go
    /// straight into the caller's buffers when direct I/O allows it, else
    /// through 4 KiB-aligned bounce buffers. `None` if io_uring is unavailable.
    fn read_many_uring(&self, reqs: &mut [(u64, &mut [u8])]) -> Option<Result<()>> {
        let align = if !self.direct {
            1
        } else if self.sub_block_reads.load(Ordering::Relaxed) {
            READ_ALIGN as u64
        } else {
            IO_ALIGN as u64
        };
        // Requests the kernel cannot read into directly: (index, start of
        // the widened range, bounce buffer).
        let mut bounced: Vec<(usize, u64, AlignedBuf)> = Vec::new();
        for (i, (offset, buf)) in reqs.iter().enumerate() {
            let fits = !self.direct
                || (is_io_aligned(buf.as_ptr())
                    && offset.is_multiple_of(align)
                    && (buf.len() as u64).is_multiple_of(align));
            if !fits {
                let (start, end) = self.widened(*offset, buf.len());
                bounced.push((i, start, AlignedBuf::new_zeroed((end - start) as usize)));
            }
        }
        let fd = self.ring_file.as_raw_fd();
        let outcome = if bounced.is_empty() {
            crate::uring::read_batch(fd, reqs)?
        } else {
            let mut next_bounce = bounced.iter_mut().peekable();
            let mut targets: Vec<(u64, &mut [u8])> = Vec::with_capacity(reqs.len());
            for (i, (offset, buf)) in reqs.iter_mut().enumerate() {
                match next_bounce.next_if(|(j, _, _)| *j == i) {
                    Some((_, start, bounce)) => targets.push((*start, &mut bounce[..])),
                    None => targets.push((*offset, &mut **buf)),
                }
            }
            crate::uring::read_batch(fd, &mut targets)?
        };
        if let Err(e) = outcome {
            return Some(Err(e.into()));
        }
        for (i, start, bounce) in &bounced {
            let (offset, buf) = &mut reqs[*i];
            let at = (*offset - start) as usize;
            let len = buf.len();
            buf.copy_from_slice(&bounce[at..at + len]);
        }
        for (offset, buf) in reqs.iter() {
            let len = buf.len() as u64;
            self.counters
                .record_read(pages_touched(*offset, len, self.page_size), len);
        }
        Some(Ok(()))
    }

    /// [`Device::read_many`] on the I/O thread pool, one job per read.
    fn read_many_pooled(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        // Each job reads into its own aligned buffer (widened to whole 4 KiB
        // blocks where the file system wants them); results are copied back
        // in order.
        let widen = self.direct && !self.sub_block_reads.load(Ordering::Relaxed);
        let jobs = reqs.iter().map(|(offset, buf)| {
            let file = Arc::clone(&self.file);
            let direct = self.direct;
            let (start, end) = if widen {
                self.widened(*offset, buf.len())
            } else {
                (*offset, offset + buf.len() as u64)
            };
            move || {
                let len = (end - start) as usize;
                let mut tmp = AlignedBuf::new_zeroed(len);
                Self::read_into(&file, direct, start, &mut tmp[..len])?;
                Ok((start, tmp))
            }
        });
        let results = self.pool.run_all(jobs)?;
        for ((offset, buf), (start, tmp)) in reqs.iter_mut().zip(results) {
            let len = buf.len();
            let at = (*offset - start) as usize;
            buf.copy_from_slice(&tmp[at..at + len]);
            self.counters.record_read(
                pages_touched(*offset, len as u64, self.page_size),
                len as u64,
            );
        }
        Ok(())
    }
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .field("page_size", &self.page_size)
            .field("direct", &self.direct)
            .field("block_device", &self.block_device)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: u32 = 4096;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn open_temp(cap: u64) -> (tempfile::TempDir, Arc<FileDevice>) {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::open(&dir.path().join("dev"), Some(cap), PS).unwrap();
        (dir, dev)
    }

    /// Bytes the file system has allocated to the device file.
    fn allocated_bytes(dev: &FileDevice) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dev.path())
            .map(|m| m.blocks() * 512)
            .unwrap()
    }

    #[test]
    fn write_read_roundtrip() {
        let (_dir, dev) = open_temp(1 << 20);
        assert_eq!(dev.capacity(), 1 << 20);
        eprintln!("temp dir direct_io = {}", dev.direct_io());
        let data = pattern(3 * PS as usize, 1);
        dev.write_at(8192, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(8192, &mut back).unwrap();
        assert_eq!(back, data);
        // An aligned buffer takes the direct path.
        let mut aligned = AlignedBuf::new_zeroed(PS as usize);
        dev.read_at(8192 + 4096, &mut aligned).unwrap();
        assert_eq!(&aligned[..], &data[4096..8192]);
        let c = dev.counters();
        assert_eq!(
            (c.write_ops, c.pages_written, c.bytes_written),
            (1, 3, data.len() as u64)
        );
        assert_eq!((c.read_ops, c.pages_read), (2, 4));
    }

    /// Several writes at once land where they belong (the pool writes them
    /// in parallel); one out of range is refused before any is written,
    /// with its index.
    #[test]
    fn write_many_lands_every_write() {
        let (_dir, dev) = open_temp(1 << 20);
        let parts: Vec<Vec<u8>> = (0..6).map(|i| pattern(2 * PS as usize, i as u8)).collect();
        let writes: Vec<(u64, &[u8])> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| ((5 - i as u64) * 2 * u64::from(PS), &p[..]))
            .collect();
        dev.write_many(&writes).unwrap();
        for (at, data) in &writes {
            let mut back = vec![0u8; data.len()];
            dev.read_at(*at, &mut back).unwrap();
            assert_eq!(&back, data, "write at {at}");
        }
        let c = dev.counters();
        assert_eq!((c.write_ops, c.bytes_written), (6, 12 * u64::from(PS)));

        let other = pattern(PS as usize, 9);
        let bad: Vec<(u64, &[u8])> = vec![(0, &other), (PS.into(), &other), (1 << 20, &other)];
        match dev.write_many(&bad) {
            Err((2, FlashError::OutOfRange(_))) => {}
            other => panic!("expected the third write refused: {other:?}"),
        }
        let mut back = vec![0u8; PS as usize];
        dev.read_at(0, &mut back).unwrap();
        assert_eq!(back, parts[5][..PS as usize], "nothing written");
    }

    /// Adjacent aligned writes (the value log's chunks) go out joined
    /// (`joined::plan_runs`) and land as if written one by one: mixed with
    /// an unaligned buffer and a gap, every byte where it belongs, every
    /// write counted.
    #[test]
    fn adjacent_writes_land_joined() {
        let (_dir, dev) = open_temp(8 << 20);
        let chunk = 256 * PS as usize;
        let bufs: Vec<AlignedBuf> = (0..6)
            .map(|i| AlignedBuf::copy_from(&pattern(chunk, 20 + i as u8)))
            .collect();
        let unaligned = pattern(PS as usize + 1, 40);
        let mut writes: Vec<(u64, &[u8])> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| ((i * chunk) as u64, &b[..chunk]))
            .collect();
        writes.insert(3, (3 * chunk as u64 - u64::from(PS), &unaligned[1..]));
        writes[2].1 = &bufs[2][..chunk - PS as usize]; // ends where the unaligned one starts
        writes.push((7 << 20, &bufs[0][..PS as usize])); // after a gap
        dev.write_many(&writes).unwrap();
        for (at, data) in &writes {
            let mut back = vec![0u8; data.len()];
            dev.read_at(*at, &mut back).unwrap();
            assert!(&back == data, "write at {at} read back differently");
        }
        let c = dev.counters();
        let bytes: u64 = writes.iter().map(|(_, d)| d.len() as u64).sum();
        assert_eq!((c.write_ops, c.bytes_written), (writes.len() as u64, bytes));
    }

    #[test]
    fn sub_block_reads_return_the_right_bytes() {
        let (_dir, dev) = open_temp(1 << 20);
        let data = pattern(4 * PS as usize, 5);
        dev.write_at(0, &data).unwrap();
        for (off, len) in [
            (512usize, 512usize),
            (1536, 8704),
            (4096 + 512, 3072),
            (7680, 1024),
        ] {
            let mut buf = AlignedBuf::new_zeroed(len);
            dev.read_at(off as u64, &mut buf[..len]).unwrap();
            assert_eq!(&buf[..len], &data[off..off + len], "read at {off} of {len}");
        }
        let mut odd = vec![0u8; 100];
        assert!(
            dev.read_at(512, &mut odd).is_err(),
            "lengths stay 512-byte granular"
        );
    }

    #[test]
    fn rejects_bad_arguments() {
        let (_dir, dev) = open_temp(64 * 1024);
        let mut buf = vec![0u8; 4096];
        assert!(matches!(
            dev.read_at(100, &mut buf),
            Err(FlashError::Misaligned(_))
        ));
        assert!(matches!(
            dev.read_at(64 * 1024, &mut buf),
            Err(FlashError::OutOfRange(_))
        ));
        assert!(matches!(
            dev.write_at(0, &buf[..100]),
            Err(FlashError::Misaligned(_))
        ));
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            FileDevice::open(&d.path().join("x"), Some(1 << 20), 1000),
            Err(FlashError::InvalidArgument(_))
        ));
    }

    #[test]
    fn parallel_striped_write_and_read_many() {
        let (_dir, dev) = open_temp(8 << 20);
        let data = pattern((5 << 20) + 3 * PS as usize, 7); // not a whole number of stripes
        dev.write_at(PS as u64, &data).unwrap();
        assert_eq!(dev.counters().write_ops, 1);
        let mut back = vec![0u8; data.len()];
        dev.read_at(PS as u64, &mut back).unwrap();
        assert!(back == data, "striped write read back differently");

        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 8192];
        let mut c = vec![0u8; 4096];
        let mut reqs: Vec<(u64, &mut [u8])> =
            vec![(PS as u64, &mut a), (1 << 20, &mut b), (5 << 20, &mut c)];
        dev.read_many(&mut reqs).unwrap();
        assert_eq!(a, data[..4096]);
        assert_eq!(b, data[(1 << 20) - 4096..(1 << 20) + 4096]);
        assert_eq!(c, data[(5 << 20) - 4096..5 << 20]);
    }

    /// Both read_many paths (io_uring and the thread pool) return the same
    /// bytes for aligned and unaligned caller buffers at 512-byte offsets,
    /// with sub-block direct reads on and off.
    #[test]
    fn read_many_paths_agree() {
        let (_dir, dev) = open_temp(8 << 20);
        let data = pattern(8 << 20, 9);
        dev.write_at(0, &data).unwrap();
        let shapes: Vec<(u64, usize)> = (0..40u64)
            .map(|i| ((i * 7919 % 16_000) * 512, 512 * (1 + (i as usize * 5) % 20)))
            .collect();
        for sub_block in [true, false] {
            dev.sub_block_reads.store(sub_block, Ordering::Relaxed);
            for pooled in [false, true] {
                // Odd-numbered buffers start one byte into an aligned allocation.
                let mut bufs: Vec<AlignedBuf> = shapes
                    .iter()
                    .map(|(_, len)| AlignedBuf::new_zeroed(len + IO_ALIGN))
                    .collect();
                let mut reqs: Vec<(u64, &mut [u8])> = shapes
                    .iter()
                    .zip(bufs.iter_mut())
                    .enumerate()
                    .map(|(i, ((off, len), b))| (*off, &mut b[i % 2..i % 2 + len]))
                    .collect();
                if pooled {
                    dev.read_many_pooled(&mut reqs).unwrap();
                } else {
                    dev.read_many(&mut reqs).unwrap();
                }
                for ((off, len), (_, got)) in shapes.iter().zip(&reqs) {
                    let off = *off as usize;
                    assert_eq!(
                        &got[..],
                        &data[off..off + len],
                        "sub_block={sub_block} pooled={pooled}"
                    );
                }
            }
        }
    }

    #[test]
    fn read_many_reports_out_of_range() {
        let (_dir, dev) = open_temp(1 << 20);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        let mut reqs: Vec<(u64, &mut [u8])> = vec![(0, &mut a), (1 << 20, &mut b)];
        assert!(matches!(
            dev.read_many(&mut reqs),
            Err(FlashError::OutOfRange(_))
        ));
    }

    #[test]
    fn trim_zeroes_range() {
        let (_dir, dev) = open_temp(1 << 20);
        dev.write_at(0, &pattern(4 * PS as usize, 3)).unwrap();
        dev.trim(PS as u64, 2 * PS as u64).unwrap();
        let mut back = vec![0u8; 4 * PS as usize];
        dev.read_at(0, &mut back).unwrap();
        let p = PS as usize;
        assert_eq!(back[..p], pattern(p, 3)[..]);
        // Punch-hole is supported on common local file systems (the range reads zero);
        // on file systems without it the old content may remain, which trim allows.
        let hole = &back[p..3 * p];
        assert!(hole.iter().all(|&x| x == 0) || hole == &pattern(4 * p, 3)[p..3 * p]);
        assert_ne!(back[3 * p..], vec![0u8; p][..]);
        assert_eq!(dev.counters().pages_trimmed, 2);
    }

    #[test]
    fn fill_holes_allocates_every_block_and_keeps_data() {
        let (_dir, dev) = open_temp(4 << 20);
        let p = PS as usize;
        dev.write_at(3 * PS as u64, &pattern(2 * p, 9)).unwrap();
        let before = allocated_bytes(&dev);
        let filled = dev.fill_holes().unwrap();
        if before >= 4 << 20 {
            return; // this file system does not make sparse files
        }
        assert_eq!(
            filled,
            (4 << 20) - 2 * PS as u64,
            "every hole, and only the holes"
        );
        assert!(allocated_bytes(&dev) >= 4 << 20, "all blocks allocated");
        let mut back = vec![0u8; 6 * p];
        dev.read_at(0, &mut back).unwrap();
        assert_eq!(back[3 * p..5 * p], pattern(2 * p, 9)[..], "data untouched");
        assert!(back[..3 * p].iter().chain(&back[5 * p..]).all(|&b| b == 0));
        assert_eq!(dev.fill_holes().unwrap(), 0, "nothing left to fill");
    }

    #[test]
    fn fill_holes_refuses_when_the_file_system_lacks_the_space() {
        let (dir, dev) = open_temp(1 << 20);
        let free = free_bytes(dev.file.as_raw_fd()).unwrap();
        drop(dev);
        let cap = (free + (1 << 30)) / u64::from(PS) * u64::from(PS);
        let dev = FileDevice::open(&dir.path().join("dev"), Some(cap), PS).unwrap();
        match dev.fill_holes() {
            Err(FlashError::HostFull(e)) => {
                assert_eq!(e.kind(), std::io::ErrorKind::StorageFull, "{e}");
                assert!(e.to_string().contains("free"), "{e}");
            }
            other => panic!("expected a clear out-of-space error, got {other:?}"),
        }
    }

    #[test]
    fn trim_keeps_blocks_when_told_not_to_punch() {
        let (_dir, dev) = open_temp(1 << 20);
        dev.set_punch_holes(false);
        let p = PS as usize;
        dev.write_at(0, &pattern(4 * p, 5)).unwrap();
        let before = allocated_bytes(&dev);
        dev.trim(PS as u64, 2 * PS as u64).unwrap();
        assert_eq!(allocated_bytes(&dev), before, "no blocks were given back");
        let mut back = vec![0u8; 4 * p];
        dev.read_at(0, &mut back).unwrap();
        assert_eq!(
            back,
            pattern(4 * p, 5),
            "content stays (TRIM allows either)"
        );
        assert_eq!(dev.counters().pages_trimmed, 2, "the trim is still counted");
    }

    #[test]
    fn second_open_fails_while_locked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let dev = FileDevice::open(&path, Some(1 << 20), PS).unwrap();
        match FileDevice::open(&path, None, PS) {
            Err(FlashError::Io(e)) => assert!(e.to_string().contains("in use"), "{e}"),
            other => panic!("expected lock error, got {other:?}"),
        }
        drop(dev);
        let again = FileDevice::open(&path, None, PS).unwrap();
        assert_eq!(again.capacity(), 1 << 20);
    }

    #[test]
    fn tmpfs_works_with_or_without_direct_io() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("skipping: /dev/shm not available");
            return;
        }
        let Ok(dir) = tempfile::tempdir_in(shm) else {
            eprintln!("skipping: cannot create a directory in /dev/shm");
            return;
        };
        let dev = FileDevice::open(&dir.path().join("dev"), Some(1 << 20), PS).unwrap();
        eprintln!("tmpfs direct_io = {}", dev.direct_io());
        let data = pattern(2 * PS as usize, 9);
        dev.write_at(0, &data[PS as usize / 2..][..PS as usize])
            .unwrap(); // unaligned source
        let mut back = vec![0u8; PS as usize + 1];
        dev.read_at(0, &mut back[1..]).unwrap(); // unaligned destination
        assert_eq!(back[1..], data[PS as usize / 2..][..PS as usize]);
        dev.sync().unwrap();
    }

    #[test]
    fn buffered_fallback_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let dev =
            FileDevice::open_inner(&dir.path().join("dev"), Some(1 << 20), PS, false).unwrap();
        assert!(!dev.direct_io());
        let data = pattern(PS as usize + 1, 2);
        dev.write_at(PS as u64, &data[1..]).unwrap();
        let mut back = vec![0u8; PS as usize];
        dev.read_at(PS as u64, &mut back).unwrap();
        assert_eq!(back, data[1..]);
    }

    #[test]
    fn unaligned_caller_buffers_roundtrip() {
        let (_dir, dev) = open_temp(1 << 20);
        let data = pattern(PS as usize + 1, 5);
        dev.write_at(0, &data[1..]).unwrap();
        let mut back = vec![0u8; PS as usize + 1];
        dev.read_at(0, &mut back[1..]).unwrap();
        assert_eq!(back[1..], data[1..]);
    }
}
