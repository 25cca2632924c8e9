//! Reads that complete while their caller does other work, for an event
//! loop (the node's network thread) that serves many clients on one thread.
//!
//! A [`ReadQueue`] owns an io_uring ring whose completions signal an
//! eventfd. The loop starts a read with [`ReadQueue::submit`] (one system
//! call, no wait), watches [`ReadQueue::event_fd`] with its own poller, and
//! collects finished reads with [`ReadQueue::reap`]. Compared with handing
//! each read to a thread that blocks in `pread`, a read then costs no thread
//! wake-ups and no context switches: on a small machine that is most of a
//! random read's CPU cost outside the device itself.
//!
//! What is read is a [`DirectRead`], made by
//! [`crate::FlashStore::direct_read`]: an aligned buffer, the device's
//! descriptor and byte offset, and a handle that keeps the device (and so
//! the descriptor) open until the read is finished.
//!
//! Invariant: from `submit` until `reap` returns it, the kernel may write
//! into the read's buffer, so the queue owns it; dropping the queue first
//! waits for every read in flight.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use io_uring::{opcode, types, IoUring, Probe};

use crate::device::{AlignedBuf, Device, UninitBuf};
use crate::error::{FlashError, Result};
use crate::latency::{DeviceLatency, DeviceOp};

/// Largest single device read that reads of neighbouring extents are
/// merged into (see [`DirectRead::covering`]).
pub const MAX_MERGED_READ: u64 = 256 * 1024;
/// Largest gap between two extents that a merged read reads through (the
/// header, key and alignment pad of the next record between two values):
/// cheaper than a second device read.
pub const MAX_READ_GAP: u64 = 4096;

/// Memory outside this process's heap that a read may land in instead of
/// a buffer of its own: a client's shared memory that the node maps (the
/// node's `MGETSHM`), so the value reaches the client with no copy.
///
/// # Safety
/// An implementor guarantees that `as_mut_ptr()..as_mut_ptr() + len()`
/// stays mapped and writable for as long as it lives. Its bytes are
/// volatile: another process may write them at any time, so whatever is
/// read from them is checked (the value checksum) and never trusted
/// beyond that.
pub unsafe trait LandingSpace: Send + Sync + 'static {
    /// The start of the memory.
    fn as_mut_ptr(&self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where in a [`LandingSpace`] a read lands.
#[derive(Clone)]
struct Landing {
    space: Arc<dyn LandingSpace>,
    at: usize,
}

/// Bytes a read left in a [`LandingSpace`], as the owner of a `Bytes`.
struct Landed {
    space: Arc<dyn LandingSpace>,
    at: usize,
    len: usize,
}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `at + len <= space.len()` (checked in `land_in`, and
        // `len` is at most the read's length); the space stays mapped while
        // `space` lives (the trait's contract).
        unsafe { std::slice::from_raw_parts(self.space.as_mut_ptr().add(self.at), self.len) }
    }
}

/// A device read ready to be issued on a [`ReadQueue`].
pub struct DirectRead {
    /// Keeps the device, and so `fd`, open while the read is in flight.
    dev: Arc<dyn Device>,
    fd: RawFd,
    /// Byte offset on the device.
    offset: u64,
    /// Bytes to read into the front of `buf`.
    len: usize,
    /// What was read: the buffer the kernel filled (allocated when the read
    /// starts, never zeroed first), or a slice of a covering read's (see
    /// [`DirectRead::fill_from`]: no copy). `None` until then.
    buf: Option<Bytes>,
    /// Where a [`ReadQueue`] records how long the read took, queued to
    /// reaped ([`DirectRead::timed_into`]).
    latency: Option<Arc<DeviceLatency>>,
    /// Where it lands instead of a buffer of its own
    /// ([`DirectRead::land_in`]).
    landing: Option<Landing>,
}

impl DirectRead {
    /// A read of `len` bytes at device byte `offset` on `fd`, which `dev`
    /// owns (see [`Device::read_fd`]).
    pub(crate) fn new(dev: Arc<dyn Device>, fd: RawFd, offset: u64, len: usize) -> DirectRead {
        DirectRead {
            dev,
            fd,
            offset,
            len,
            buf: None,
            latency: None,
            landing: None,
        }
    }

    /// Has the read land in `space` at byte `at` instead of a buffer of
    /// its own (on a [`ReadQueue`]; other ways of reading ignore it).
    /// `false`, and nothing changed, when it would not fit there or the
    /// place is not aligned for direct I/O.
    pub fn land_in(&mut self, space: Arc<dyn LandingSpace>, at: usize) -> bool {
        let fits = at
            .checked_add(self.len)
            .is_some_and(|end| end <= space.len());
        let aligned = (space.as_mut_ptr() as usize)
            .wrapping_add(at)
            .is_multiple_of(crate::READ_ALIGN);
        if !(fits && aligned) {
            return false;
        }
        self.landing = Some(Landing { space, at });
        true
    }

    /// Whether it lands in a [`LandingSpace`].
    pub fn lands(&self) -> bool {
        self.landing.is_some()
    }

    /// Has a [`ReadQueue`] record this read's latency, from when it is
    /// queued to when its completion is reaped, in `latency`.
    pub(crate) fn timed_into(mut self, latency: Arc<DeviceLatency>) -> DirectRead {
        self.latency = Some(latency);
        self
    }

    /// Bytes it reads.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it reads nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer; its first [`DirectRead::len`] bytes hold what was read
    /// once the queue reported the read complete and successful.
    pub fn into_bytes(self) -> Bytes {
        let len = self.len;
        self.buf
            .unwrap_or_else(|| Bytes::from_owner(AlignedBuf::new_zeroed(len)))
    }

    /// Device byte offset where it starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Device byte offset where it ends.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }

    /// Whether `other` reads the same device (so one read can cover both).
    pub fn same_device(&self, other: &DirectRead) -> bool {
        self.fd == other.fd && Arc::ptr_eq(&self.dev, &other.dev)
    }

    /// One read of the device bytes from the lowest start to the highest
    /// end of `reads` (gaps between them included), so that reads of
    /// neighbouring extents cost one device request; `None` when `reads`
    /// is empty or they are not all on one device. Their offsets and
    /// lengths are aligned for direct I/O, so the covering read is too.
    pub fn covering(reads: &[&DirectRead]) -> Option<DirectRead> {
        let first = reads.first()?;
        if !reads.iter().all(|r| r.same_device(first)) {
            return None;
        }
        let start = reads.iter().map(|r| r.offset).min()?;
        let end = reads.iter().map(|r| r.end()).max()?;
        let len = usize::try_from(end - start).ok()?;
        let mut cover = DirectRead::new(Arc::clone(&first.dev), first.fd, start, len);
        cover.latency = first.latency.clone();
        Some(cover)
    }

    /// Completes this read from `cover`, a covering read of it (see
    /// [`DirectRead::covering`]) that succeeded, as if it had run itself.
    ///
    /// # Panics
    /// If `cover` does not cover this read's extent (a caller's bug).
    pub fn fill_from(&mut self, cover: &DirectRead) {
        assert!(
            self.same_device(cover) && cover.offset <= self.offset && self.end() <= cover.end(),
            "{self:?} is not inside {cover:?}"
        );
        let at = (self.offset - cover.offset) as usize;
        // A cover that never ran read nothing (the queue fills every read
        // it finishes, even a failed one).
        self.buf = cover.buf.as_ref().map(|read| read.slice(at..at + self.len));
    }
}

/// Runs `reads` now, on this thread's io_uring ring (see `uring.rs`), all
/// in flight together, into buffers that are not zeroed first: the
/// blocking counterpart of a [`ReadQueue`], for callers on a thread that
/// may wait (a multi-get of many values, whose buffers' zeroing cost a
/// quarter of its CPU). `None` when io_uring is unavailable here (nothing
/// was read). On `Some(Ok(()))` every read holds its bytes
/// ([`DirectRead::into_bytes`]); on an error none does.
pub fn read_now(reads: &mut [DirectRead]) -> Option<Result<()>> {
    let mut dests: Vec<UninitBuf> = reads.iter().map(|r| UninitBuf::new(r.len)).collect();
    let targets: Vec<crate::uring::Target> = reads
        .iter()
        .zip(dests.iter_mut())
        .map(|(r, d)| crate::uring::Target {
            fd: r.fd,
            offset: r.offset,
            ptr: d.as_mut_ptr(),
            len: r.len,
        })
        .collect();
    // SAFETY: every target is a distinct allocation of at least `len`
    // bytes (`UninitBuf` rounds up), owned here and untouched until the
    // call returns, which it does only once the kernel is done with all.
    let outcome = unsafe { crate::uring::read_targets(&targets) }?;
    if let Err(e) = outcome {
        return Some(Err(FlashError::Io(e)));
    }
    for (read, dest) in reads.iter_mut().zip(dests) {
        // SAFETY: the batch succeeded: each read's `len` bytes were written.
        let filled = unsafe { dest.assume_init_prefix(read.len) };
        read.dev.note_read(read.offset, read.len);
        read.buf = Some(Bytes::from_owner(filled));
    }
    Some(Ok(()))
}

impl std::fmt::Debug for DirectRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectRead")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// A read the queue is running, and what the caller attached to it.
struct InFlight<T> {
    read: DirectRead,
    tag: T,
    /// Where the kernel writes what it reads (`None`: the read's landing
    /// space).
    dest: Option<UninitBuf>,
    /// When it was queued.
    queued: Instant,
}

/// A ring of device reads that complete asynchronously (see the module doc).
/// `T` is what the caller attaches to each read and gets back with it.
pub struct ReadQueue<T> {
    ring: IoUring,
    /// Signalled by the kernel whenever a completion is posted.
    event: OwnedFd,
    /// Reads in flight, indexed by their submission's user data.
    slots: Vec<Option<InFlight<T>>>,
    /// Free indices of `slots`.
    free: Vec<usize>,
    /// The most reads in flight (the completion queue holds twice that).
    depth: usize,
    /// Reads wait in the submission queue: pushed since the last flush, or
    /// refused by the kernel at the last one.
    unsubmitted: bool,
}

impl<T> ReadQueue<T> {
    /// A queue that keeps up to `depth` reads in flight. Fails where io_uring
    /// cannot be used (an old kernel, `kernel.io_uring_disabled`, a seccomp
    /// filter, `LIGHTSTORE_NO_URING` set); callers then read another way.
    pub fn new(depth: u32) -> Result<ReadQueue<T>> {
        if std::env::var_os("LIGHTSTORE_NO_URING").is_some() {
            return Err(io::Error::other("io_uring disabled by LIGHTSTORE_NO_URING").into());
        }
        let depth = depth.max(1);
        let ring = IoUring::builder()
            .setup_cqsize(depth.saturating_mul(2))
            .build(depth)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(io::Error::other("IORING_OP_READ not supported").into());
        }
        // SAFETY: plain syscall; no memory is passed.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` is a descriptor this function just opened and owns.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(event.as_raw_fd())?;
        Ok(ReadQueue {
            ring,
            event,
            slots: Vec::new(),
            free: Vec::new(),
            depth: depth as usize,
            unsubmitted: false,
        })
    }

    /// The eventfd that becomes readable when completions are waiting. It
    /// is non-blocking; [`ReadQueue::reap`] empties it.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.event.as_fd()
    }

    /// Reads in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Starts `read` and returns at once. Gives the read and its tag back
    /// unstarted when the queue is full.
    pub fn submit(&mut self, read: DirectRead, tag: T) -> std::result::Result<(), (DirectRead, T)> {
        self.push(read, tag)?;
        self.flush();
        Ok(())
    }

    /// Queues `read` without handing it to the kernel yet: a later
    /// [`ReadQueue::flush`] (or `submit`, or `reap`) starts every queued
    /// read with one system call. Gives the read and its tag back when the
    /// queue is full.
    pub fn push(&mut self, read: DirectRead, tag: T) -> std::result::Result<(), (DirectRead, T)> {
        let Ok(len) = u32::try_from(read.len) else {
            return Err((read, tag));
        };
        if self.in_flight() >= self.depth {
            return Err((read, tag));
        }
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        // A read that lands has no buffer of its own.
        let mut dest = None;
        let into = match &read.landing {
            // SAFETY: `at + len <= space.len()` (`DirectRead::land_in`).
            Some(l) => unsafe { l.space.as_mut_ptr().add(l.at) },
            None => dest.insert(UninitBuf::new(read.len)).as_mut_ptr(),
        };
        let entry = InFlight {
            dest,
            read,
            tag,
            queued: Instant::now(),
        };
        let sqe = opcode::Read::new(types::Fd(entry.read.fd), into, len)
            .offset(entry.read.offset)
            .build()
            .user_data(slot as u64);
        // SAFETY: the buffer (`dest`, a heap allocation that moving `entry`
        // does not move, or the landing space, which the read's `Arc`
        // keeps mapped) lives in `self.slots[slot]` until the completion
        // for `slot` is reaped, and `Drop` waits for every read in flight.
        let queued = unsafe { self.ring.submission().push(&sqe) }.is_ok();
        if !queued {
            self.free.push(slot);
            return Err((entry.read, entry.tag));
        }
        self.slots[slot] = Some(entry);
        // Once in the submission queue the read cannot be withdrawn.
        self.unsubmitted = true;
        Ok(())
    }

    /// Hands every queued read to the kernel. If the kernel refuses for now,
    /// they stay queued ([`ReadQueue::has_unsubmitted`]) for the next call.
    pub fn flush(&mut self) {
        if self.unsubmitted {
            self.unsubmitted = self.submit_queued().is_err();
        }
    }

    /// Hands what is queued to the kernel; transient refusals (interrupted,
    /// out of resources) are retried a few times.
    fn submit_queued(&mut self) -> io::Result<()> {
        let mut attempts = 0;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY))
                        && attempts < 100 =>
                {
                    attempts += 1;
                    std::thread::yield_now();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether some reads wait in the submission queue: pushed and not
    /// flushed yet, or refused by the kernel for now (then the caller should
    /// flush or reap again soon, even without a signal).
    pub fn has_unsubmitted(&self) -> bool {
        self.unsubmitted
    }

    /// Returns every finished read with its tag and outcome (`Ok` when the
    /// whole length was read), and clears the eventfd.
    pub fn reap(&mut self) -> Vec<(T, DirectRead, Result<()>)> {
        self.flush();
        let mut counter = [0u8; 8];
        // SAFETY: reads 8 bytes into a local buffer of 8 bytes. The result
        // is irrelevant: EAGAIN just means nothing was signalled.
        let _ = unsafe { libc::read(self.event.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
        let mut done = Vec::new();
        let finished: Vec<(usize, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data() as usize, cqe.result()))
            .collect();
        for (slot, res) in finished {
            let Some(mut entry) = self.slots.get_mut(slot).and_then(Option::take) else {
                continue; // not ours: cannot happen, nothing to give back
            };
            self.free.push(slot);
            let read = usize::try_from(res);
            let got = read.unwrap_or(0).min(entry.read.len);
            entry.read.buf = Some(match (entry.dest.take(), &entry.read.landing) {
                // SAFETY: the kernel reported that many bytes read into the
                // front of `dest` (none on an error), and is done with it.
                (Some(dest), _) => Bytes::from_owner(unsafe { dest.assume_init_prefix(got) }),
                (None, Some(l)) => Bytes::from_owner(Landed {
                    space: Arc::clone(&l.space),
                    at: l.at,
                    len: got,
                }),
                (None, None) => Bytes::new(),
            });
            if let Some(latency) = &entry.read.latency {
                latency.record(DeviceOp::Read, entry.queued.elapsed());
            }
            let outcome = match read {
                Ok(n) if n == entry.read.len => {
                    entry.read.dev.note_read(entry.read.offset, n);
                    Ok(())
                }
                Ok(n) => Err(FlashError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read: {n} of {} bytes", entry.read.len),
                ))),
                Err(_) => Err(FlashError::Io(io::Error::from_raw_os_error(-res))),
            };
            done.push((entry.tag, entry.read, outcome));
        }
        done
    }
}

impl<T> ReadQueue<T> {
    /// [`ReadQueue::reap`], first waiting up to `timeout` for a completion
    /// when none is ready: for callers without an event loop (tests, tools).
    pub fn reap_wait(&mut self, timeout: std::time::Duration) -> Vec<(T, DirectRead, Result<()>)> {
        let done = self.reap();
        if !done.is_empty() || self.in_flight() == 0 {
            return done;
        }
        let mut pfd = libc::pollfd {
            fd: self.event.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call. An error or
        // a timeout just means nothing is ready.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        self.reap()
    }
}

impl<T> Drop for ReadQueue<T> {
    fn drop(&mut self) {
        // The kernel may still write into buffers of reads in flight: wait
        // for them before the buffers are freed.
        let mut attempts = 0u32;
        while self.in_flight() > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => drop(self.reap()),
                Err(e) if attempts < 1_000_000 => {
                    attempts += 1;
                    if e.raw_os_error() != Some(libc::EINTR) {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    eprintln!("lightstore: io_uring wait failed with reads in flight: {e}");
                    std::process::abort();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileDevice, FlashStore, FormatOptions, NandConfig, NandDevice};

    const PS: u32 = 4096;
    const CAPACITY: u64 = PS as u64 * (1 + 2 * 8 + 8 * 16);

    fn opts() -> FormatOptions {
        FormatOptions {
            pages_per_segment: 16,
            meta_slot_bytes: Some(8 * u64::from(PS)),
        }
    }

    /// A formatted store on a temporary file whose first segment holds
    /// pages filled with their page number.
    fn file_store() -> (tempfile::TempDir, FlashStore, u32) {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::open(&dir.path().join("dev"), Some(CAPACITY), PS).unwrap();
        let store = FlashStore::format(dev, &opts()).unwrap();
        let (seg, _) = store.allocate(0).unwrap();
        let pages: Vec<u8> = (0..16u8).flat_map(|p| vec![p; PS as usize]).collect();
        store.write(seg, 0, &pages).unwrap();
        (dir, store, seg)
    }

    /// A direct read of `pages` pages of `seg` from page `page` on.
    fn pages_read(store: &FlashStore, seg: u32, page: u64, pages: usize) -> DirectRead {
        store
            .direct_read(seg, page * u64::from(PS), pages * PS as usize)
            .unwrap()
            .expect("a file device reads directly")
    }

    /// A formatted store on the emulated NAND (no descriptor to read
    /// directly) and a segment allocated in it.
    fn nand_store() -> (FlashStore, u32) {
        let dev = NandDevice::new(NandConfig {
            page_size: PS,
            capacity: CAPACITY,
            ..Default::default()
        });
        let store = FlashStore::format(dev, &opts()).unwrap();
        let (seg, _) = store.allocate(0).unwrap();
        (store, seg)
    }

    /// Waits (bounded) until `want` reads have completed and returns them.
    fn wait_reap<T>(q: &mut ReadQueue<T>, want: usize) -> Vec<(T, DirectRead, Result<()>)> {
        let mut out = Vec::new();
        for _ in 0..500 {
            out.extend(q.reap_wait(std::time::Duration::from_millis(10)));
            if out.len() >= want {
                return out;
            }
        }
        panic!("only {} of {want} reads completed", out.len());
    }

    /// Reads run on a queue are timed in their store's device latency,
    /// one sample each, a covering read once for all it covers.
    #[test]
    fn queued_reads_are_timed_in_the_stores_latency() {
        if !crate::io_uring_for_tests() {
            return; // nothing to test where io_uring is off
        }
        let (_dir, store, seg) = file_store();
        let reads = |store: &FlashStore| {
            store
                .latency()
                .of(crate::DeviceOp::Read)
                .map_or(0, |h| h.count)
        };
        let before = reads(&store);
        let read = |page: u64| {
            store
                .direct_read(seg, page * u64::from(PS), PS as usize)
                .unwrap()
                .expect("a file device reads directly")
        };
        let mut q: ReadQueue<u64> = ReadQueue::new(4).unwrap();
        for page in 0..3 {
            q.submit(read(page), page).unwrap();
        }
        for (_, _, outcome) in wait_reap(&mut q, 3) {
            outcome.unwrap();
        }
        assert_eq!(reads(&store), before + 3);
        let parts = [read(4), read(5)];
        let refs: Vec<&DirectRead> = parts.iter().collect();
        let cover = DirectRead::covering(&refs).expect("one device");
        q.submit(cover, 4).unwrap();
        wait_reap(&mut q, 1).pop().expect("one read").2.unwrap();
        assert_eq!(reads(&store), before + 4);
    }

    /// Memory a test hands reads to land in.
    struct Space(AlignedBuf);

    // SAFETY: the buffer lives as long as the value and is only written
    // by the kernel's reads into it.
    unsafe impl LandingSpace for Space {
        fn as_mut_ptr(&self) -> *mut u8 {
            self.0.as_ptr().cast_mut()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    /// A read told to land in a space puts its bytes there (no buffer of
    /// its own), a covering read too; a place that would not fit or is not
    /// aligned for direct I/O is refused.
    #[test]
    fn reads_land_in_the_space_they_are_given() {
        if !crate::io_uring_for_tests() {
            return; // nothing to test where io_uring is off
        }
        let (_dir, store, seg) = file_store();
        let read = |page: u64, pages: usize| pages_read(&store, seg, page, pages);
        let space = Arc::new(Space(AlignedBuf::new_zeroed(8 * PS as usize)));
        let dyn_space = || Arc::clone(&space) as Arc<dyn LandingSpace>;
        let mut one = read(7, 1);
        assert!(
            !one.land_in(dyn_space(), 7 * PS as usize + 512),
            "past the end"
        );
        assert!(!one.land_in(dyn_space(), 100), "not aligned");
        assert!(!one.lands());
        assert!(one.land_in(dyn_space(), 512));
        let parts = [read(2, 1), read(3, 2)];
        let refs: Vec<&DirectRead> = parts.iter().collect();
        let mut cover = DirectRead::covering(&refs).expect("one device");
        assert!(cover.land_in(dyn_space(), 4 * PS as usize));
        let mut q: ReadQueue<u8> = ReadQueue::new(2).unwrap();
        q.submit(one, 1).unwrap();
        q.submit(cover, 2).unwrap();
        let mut done = wait_reap(&mut q, 2);
        done.sort_by_key(|d| d.0);
        let landed = |at: usize, len: usize| space.0[at..at + len].to_vec();
        assert_eq!(landed(512, PS as usize), vec![7u8; PS as usize]);
        let want: Vec<u8> = [2u8, 3, 4]
            .iter()
            .flat_map(|&p| vec![p; PS as usize])
            .collect();
        assert_eq!(landed(4 * PS as usize, 3 * PS as usize), want);
        for (tag, read, outcome) in done {
            outcome.unwrap();
            let bytes = read.into_bytes();
            let at = if tag == 1 { 512 } else { 4 * PS as usize };
            assert_eq!(
                bytes.as_ptr(),
                space.0[at..].as_ptr(),
                "a view of the space"
            );
        }
    }

    /// Reads of neighbouring and overlapping extents served by one read
    /// covering them get the bytes each would have read itself.
    #[test]
    fn a_covering_read_fills_the_reads_it_covers() {
        if !crate::io_uring_for_tests() {
            return; // nothing to test where io_uring is off
        }
        let (_dir, store, seg) = file_store();
        let read = |page: u64, pages: usize| pages_read(&store, seg, page, pages);
        let mut parts = [read(5, 1), read(2, 2), read(3, 2), read(9, 1)];
        let refs: Vec<&DirectRead> = parts.iter().collect();
        let cover = DirectRead::covering(&refs).expect("one device");
        assert_eq!(
            (cover.offset(), cover.len()),
            (parts[1].offset(), 8 * PS as usize)
        );
        let mut q: ReadQueue<()> = ReadQueue::new(1).unwrap();
        q.submit(cover, ()).unwrap();
        let (_, cover, outcome) = wait_reap(&mut q, 1).pop().expect("one read");
        outcome.unwrap();
        for part in &mut parts {
            part.fill_from(&cover);
        }
        for (part, first) in parts.into_iter().zip([5u8, 2, 3, 9]) {
            let len = part.len();
            let buf = part.into_bytes();
            let want: Vec<u8> = (0..len / PS as usize)
                .flat_map(|p| vec![first + p as u8; PS as usize])
                .collect();
            assert!(buf[..len] == want[..], "page {first}");
        }
        assert!(DirectRead::covering(&[]).is_none());
    }

    #[test]
    fn reads_complete_with_their_tags_and_bytes() {
        if !crate::io_uring_for_tests() {
            return; // nothing to test where io_uring is off
        }
        let (_dir, store, seg) = file_store();
        let mut q: ReadQueue<u32> = ReadQueue::new(4).unwrap();
        let before = store.stats().device.read_ops;
        for page in [3u32, 7, 1] {
            let read = store
                .direct_read(seg, u64::from(page) * u64::from(PS), 2 * PS as usize)
                .unwrap()
                .expect("a file device reads directly");
            q.submit(read, page).unwrap();
        }
        assert_eq!(q.in_flight(), 3);
        let mut done = wait_reap(&mut q, 3);
        done.sort_by_key(|d| d.0);
        for (page, read, outcome) in done {
            outcome.unwrap();
            let len = read.len();
            let buf = read.into_bytes();
            let want: Vec<u8> = [page as u8, page as u8 + 1]
                .iter()
                .flat_map(|&p| vec![p; PS as usize])
                .collect();
            assert_eq!(&buf[..len], &want[..], "page {page}");
        }
        assert_eq!(q.in_flight(), 0);
        assert_eq!(store.stats().device.read_ops, before + 3);
    }

    /// Reads run at once into unzeroed buffers hold exactly the extents'
    /// bytes (sub-page extents included), are counted, and a NAND device
    /// (no descriptor to read directly) declines so the caller reads the
    /// zeroed way.
    #[test]
    fn reads_now_hold_their_extents() {
        if !crate::io_uring_for_tests() {
            return; // nothing to test where io_uring is off
        }
        let (_dir, store, seg) = file_store();
        let before = store.stats().device.read_ops;
        let ps = u64::from(PS);
        let extents = [
            (seg, 3 * ps, 2 * PS as usize),
            (seg, 0, PS as usize),
            (seg, 7 * ps + 512, 1024),
            (seg, 10 * ps, 6 * PS as usize),
        ];
        let bufs = store
            .read_now(&extents)
            .unwrap()
            .expect("a file device reads now");
        assert_eq!(bufs.len(), extents.len());
        for (&(_, offset, len), buf) in extents.iter().zip(&bufs) {
            let want: Vec<u8> = (offset..offset + len as u64)
                .map(|b| (b / ps) as u8)
                .collect();
            assert_eq!(&buf[..len], &want[..], "extent at {offset}");
            assert!(buf[len..].iter().all(|&b| b == 0), "padding after {offset}");
        }
        assert_eq!(store.stats().device.read_ops, before + extents.len() as u64);

        let (nand, nseg) = nand_store();
        nand.write(nseg, 0, &vec![1u8; PS as usize]).unwrap();
        assert!(nand.read_now(&[(nseg, 0, PS as usize)]).unwrap().is_none());
    }

    #[test]
    fn pushed_reads_start_at_the_flush() {
        if !crate::io_uring_for_tests() {
            return;
        }
        let (_dir, store, seg) = file_store();
        let mut q: ReadQueue<u8> = ReadQueue::new(4).unwrap();
        for tag in 0..3 {
            let read = store.direct_read(seg, 0, PS as usize).unwrap().unwrap();
            q.push(read, tag).unwrap();
        }
        assert!(q.has_unsubmitted());
        let mut pfd = libc::pollfd {
            fd: q.event_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, 50) };
        assert_eq!(
            ready, 0,
            "a read completed before it was handed to the kernel"
        );
        q.flush();
        assert!(!q.has_unsubmitted());
        assert_eq!(wait_reap(&mut q, 3).len(), 3);
    }

    #[test]
    fn a_full_queue_gives_the_read_back() {
        if !crate::io_uring_for_tests() {
            return;
        }
        let (_dir, store, seg) = file_store();
        let mut q: ReadQueue<u8> = ReadQueue::new(2).unwrap();
        let read = || store.direct_read(seg, 0, PS as usize).unwrap().unwrap();
        q.submit(read(), 1).unwrap();
        q.submit(read(), 2).unwrap();
        let (back, tag) = q.submit(read(), 3).expect_err("two in flight is the depth");
        assert_eq!((tag, back.len()), (3, PS as usize));
        assert_eq!(wait_reap(&mut q, 2).len(), 2);
        q.submit(back, 3).unwrap();
        assert_eq!(wait_reap(&mut q, 1)[0].0, 3);
    }

    #[test]
    fn a_failed_read_is_reported_and_the_queue_goes_on() {
        if !crate::io_uring_for_tests() {
            return;
        }
        let (_dir, store, seg) = file_store();
        let dev: Arc<dyn Device> = NandDevice::new(NandConfig::default());
        let mut q: ReadQueue<u8> = ReadQueue::new(4).unwrap();
        q.submit(DirectRead::new(dev, -1, 0, PS as usize), 1)
            .unwrap();
        let (tag, _, outcome) = wait_reap(&mut q, 1).remove(0);
        assert_eq!(tag, 1);
        assert!(matches!(outcome, Err(FlashError::Io(_))), "{outcome:?}");
        let read = store.direct_read(seg, 0, PS as usize).unwrap().unwrap();
        q.submit(read, 2).unwrap();
        let (_, _, outcome) = wait_reap(&mut q, 1).remove(0);
        outcome.unwrap();
    }

    #[test]
    fn dropping_the_queue_waits_for_reads_in_flight() {
        if !crate::io_uring_for_tests() {
            return;
        }
        let (_dir, store, seg) = file_store();
        let mut q: ReadQueue<()> = ReadQueue::new(32).unwrap();
        for i in 0..32u64 {
            let read = store.direct_read(seg, i % 15 * u64::from(PS), 2 * PS as usize);
            q.submit(read.unwrap().unwrap(), ()).unwrap();
        }
        drop(q); // must not free buffers the kernel is still filling
    }

    #[test]
    fn emulated_nand_has_no_direct_reads() {
        let (store, seg) = nand_store();
        assert!(store.direct_read(seg, 0, PS as usize).unwrap().is_none());
        assert!(matches!(
            store.direct_read(seg, 3, PS as usize),
            Err(FlashError::Misaligned(_))
        ));
    }
}
