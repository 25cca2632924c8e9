//! Batched reads through io_uring: the calling thread queues a whole batch
//! of reads and waits for all of them in one system call, so a batch of N
//! reads keeps N requests in flight at the device without waking N I/O
//! threads (two context switches per read saved, which on a small machine is
//! most of a random read's CPU cost).
//!
//! Each thread has its own ring, created on first use with [`RING_ENTRIES`]
//! slots; batches larger than that are streamed through it. Where io_uring
//! cannot be used (an old kernel, `kernel.io_uring_disabled`, a seccomp
//! filter) [`read_batch`] returns `None` and the caller uses its thread pool;
//! the first such failure turns io_uring off for the whole process.
//!
//! Invariant: the kernel writes into the caller's buffers only while
//! [`read_batch`] runs: it returns only after every read it submitted has
//! completed (also when some failed).

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use io_uring::{opcode, types, IoUring, Probe};

/// Slots per thread's ring: the most reads one thread keeps in flight.
pub(crate) const RING_ENTRIES: u32 = 64;

/// Cleared when io_uring turned out to be unusable here.
static AVAILABLE: AtomicBool = AtomicBool::new(true);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Whether this process still tries io_uring.
pub(crate) fn available() -> bool {
    AVAILABLE.load(Ordering::Relaxed)
}

/// Whether batched reads of [`crate::FileDevice`] go through io_uring here
/// (a ring can be created and reads are supported). Probed once.
pub fn io_uring_available() -> bool {
    static PROBED: OnceLock<bool> = OnceLock::new();
    *PROBED.get_or_init(|| new_ring().is_ok()) && available()
}

/// For tests of io_uring paths: whether io_uring is available, so the
/// test can run. Where it is not, the test may skip itself, except under
/// CI (`CI` set and not `false`), where this panics: a green CI must mean
/// those paths ran.
///
/// # Panics
/// Under CI when io_uring is unavailable.
pub fn io_uring_for_tests() -> bool {
    if io_uring_available() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    assert!(
        !ci,
        "io_uring is unavailable on this machine (CI is set): the io_uring read paths \
         would go untested; run CI where io_uring_setup(2) is allowed"
    );
    false
}

/// Turns io_uring off for this process (tests, and `LIGHTSTORE_NO_URING`).
pub(crate) fn disable() {
    AVAILABLE.store(false, Ordering::Relaxed);
}

/// Reads every `(offset, buf)` of `reqs` from `fd`, filling each buffer
/// whole. Returns `None` if io_uring is unavailable (nothing was read), else
/// the outcome: the first error met, or an `UnexpectedEof` for a read that
/// hit the end of the file. With O_DIRECT the buffers, lengths and offsets
/// must be aligned as the file requires.
pub(crate) fn read_batch(fd: RawFd, reqs: &mut [(u64, &mut [u8])]) -> Option<io::Result<()>> {
    let targets: Vec<Target> = reqs
        .iter_mut()
        .map(|(offset, buf)| Target {
            fd,
            offset: *offset,
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        })
        .collect();
    // SAFETY: each target is a buffer borrowed mutably from `reqs` for the
    // whole call.
    unsafe { read_targets(&targets) }
}

/// Where one read of a batch goes: `len` bytes at `offset` of `fd` into
/// the memory at `ptr`.
pub(crate) struct Target {
    pub fd: RawFd,
    pub offset: u64,
    pub ptr: *mut u8,
    pub len: usize,
}

/// [`read_batch`] into raw memory, which need not be initialized: the
/// kernel only writes it. On `Some(Ok(()))` every target's `len` bytes
/// were written.
///
/// # Safety
/// Each target's `ptr` must be valid for writes of `len` bytes, not read or
/// written by anyone else until this returns, and the targets must not
/// overlap.
pub(crate) unsafe fn read_targets(reqs: &[Target]) -> Option<io::Result<()>> {
    if !available() {
        return None;
    }
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            match new_ring() {
                Ok(ring) => *slot = Some(ring),
                Err(e) => {
                    report_off(&e);
                    disable();
                    return None;
                }
            }
        }
        let ring = slot.as_mut()?;
        // SAFETY: passed on from the caller.
        Some(unsafe { run(ring, reqs) })
    })
}

/// Creates a ring and checks that the kernel knows `IORING_OP_READ` (5.6+).
fn new_ring() -> io::Result<IoUring> {
    if std::env::var_os("LIGHTSTORE_NO_URING").is_some() {
        return Err(io::Error::other("disabled by LIGHTSTORE_NO_URING"));
    }
    let ring = IoUring::new(RING_ENTRIES)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    if !probe.is_supported(opcode::Read::CODE) {
        return Err(io::Error::other("IORING_OP_READ not supported"));
    }
    Ok(ring)
}

/// Reports once why io_uring is off (the flash crate has no logger).
fn report_off(e: &io::Error) {
    if available() && std::env::var_os("LIGHTSTORE_NO_URING").is_none() {
        eprintln!("lightstore: io_uring unavailable ({e}); reads use the I/O thread pool");
    }
}

/// Streams `reqs` through `ring`, at most [`RING_ENTRIES`] in flight.
///
/// # Safety
/// As [`read_targets`].
unsafe fn run(ring: &mut IoUring, reqs: &[Target]) -> io::Result<()> {
    // Bytes read so far per request; a short read is continued.
    let mut done = vec![0usize; reqs.len()];
    let mut next = 0; // next request never submitted
    let mut retry: Vec<usize> = Vec::new(); // short reads to continue
    let mut in_flight = 0usize;
    let mut first_error: Option<io::Error> = None;
    loop {
        // Queue what fits, unless an error already decided the outcome.
        while first_error.is_none() && (in_flight as u32) < RING_ENTRIES {
            let i = match retry.pop() {
                Some(i) => i,
                None if next < reqs.len() => {
                    next += 1;
                    next - 1
                }
                None => break,
            };
            let t = &reqs[i];
            let len = u32::try_from(t.len - done[i]).unwrap_or(u32::MAX);
            // SAFETY: `done[i] <= t.len`, so this stays inside the target.
            let rest = unsafe { t.ptr.add(done[i]) };
            let sqe = opcode::Read::new(types::Fd(t.fd), rest, len)
                .offset(t.offset + done[i] as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the target is the caller's for the whole call (see
            // `read_targets`) and this function returns only when
            // `in_flight` is zero, i.e. after the kernel completed this read.
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                retry.push(i); // queue full: submit what is there first
                break;
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        // One wake-up for the whole batch: the caller needs every read anyway.
        wait_for(ring, in_flight)?;
        for cqe in ring.completion() {
            in_flight -= 1;
            let i = cqe.user_data() as usize;
            let res = cqe.result();
            let want = reqs[i].len;
            if res < 0 {
                first_error.get_or_insert(io::Error::from_raw_os_error(-res));
            } else if res == 0 {
                first_error.get_or_insert(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of the device",
                ));
            } else {
                done[i] += res as usize;
                if done[i] < want {
                    retry.push(i);
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Submits what is queued and waits until the completion queue holds
/// `want` entries (the caller reaps it empty each time). Interrupted
/// and busy waits are retried; any other failure would leave reads in flight
/// in buffers the caller is about to free, so it is fatal.
fn wait_for(ring: &mut IoUring, want: usize) -> io::Result<()> {
    let mut attempts = 0u32;
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) && attempts < 1_000_000 =>
            {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn file_with(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        f.flush().unwrap();
        (f, data)
    }

    #[test]
    fn reads_more_requests_than_ring_slots() {
        let (f, data) = file_with(1 << 20);
        let n = 3 * RING_ENTRIES as usize + 5;
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; 100 + i * 13]).collect();
        let offsets: Vec<u64> = (0..n).map(|i| (i * 3001 % 900_000) as u64).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = offsets
            .iter()
            .zip(bufs.iter_mut())
            .map(|(o, b)| (*o, &mut b[..]))
            .collect();
        match read_batch(f.as_file().as_raw_fd(), &mut reqs) {
            None => eprintln!("skipping: io_uring unavailable"),
            Some(r) => {
                r.unwrap();
                for (o, b) in offsets.iter().zip(&bufs) {
                    let o = *o as usize;
                    assert_eq!(&b[..], &data[o..o + b.len()]);
                }
            }
        }
    }

    #[test]
    fn read_past_end_is_an_error_and_others_complete() {
        let (f, data) = file_with(10_000);
        let mut a = vec![0u8; 1000];
        let mut b = vec![0u8; 1000];
        let mut reqs: Vec<(u64, &mut [u8])> = vec![(0, &mut a), (20_000, &mut b)];
        if let Some(r) = read_batch(f.as_file().as_raw_fd(), &mut reqs) {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(&a[..], &data[..1000]);
        }
    }

    /// A read that starts inside the file and runs past its end is
    /// continued after the short read and then reported as end of file.
    #[test]
    fn short_read_is_continued_then_reported() {
        let (f, data) = file_with(10_000);
        let mut a = vec![0u8; 1000];
        let mut b = vec![0u8; 300];
        let mut reqs: Vec<(u64, &mut [u8])> = vec![(9_500, &mut a), (100, &mut b)];
        if let Some(r) = read_batch(f.as_file().as_raw_fd(), &mut reqs) {
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(&a[..500], &data[9_500..]);
            assert_eq!(&b[..], &data[100..400]);
        }
    }

    #[test]
    fn bad_descriptor_is_an_error() {
        let mut a = vec![0u8; 10];
        let mut reqs: Vec<(u64, &mut [u8])> = vec![(0, &mut a)];
        if let Some(r) = read_batch(-1, &mut reqs) {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBADF));
        }
    }
}
