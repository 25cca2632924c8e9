//! FUSE over io_uring: the LightStore patch to fuser 0.18 (see
//! `LIGHTSTORE.md` at the crate's root).
//!
//! Since Linux 6.14 (with `/sys/module/fuse/parameters/enable_uring` set)
//! the kernel can hand requests to the server through io_uring instead of
//! `read(2)`/`write(2)` on `/dev/fuse`. It keeps one queue per possible CPU
//! and gives a request to an idle entry of the queue of the CPU its caller
//! runs on, so a request is served on the caller's CPU and its reply and the
//! next fetch take one command, not two system calls.
//!
//! Each serving thread here owns one ring with one registered entry (a
//! 288-byte header buffer and a payload buffer) and is pinned to its queue's
//! CPU. It loops: wait for a request, rebuild it in `/dev/fuse` layout,
//! dispatch it to the file system as if read from the device, wait for its
//! reply, write the reply into the entry's buffers, and commit it while
//! fetching the next (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`). Forgets and
//! interrupts still arrive on `/dev/fuse`, which one classic thread reads.
//!
//! Kernel contract used here (`include/uapi/linux/fuse.h`, 7.42+):
//! - the header buffer is `fuse_uring_req_header`: `in_out` (128 bytes: the
//!   `fuse_in_header` on fetch, the `fuse_out_header` on commit), `op_in`
//!   (128 bytes: the request's first argument, its per-operation struct, or
//!   nothing), then `fuse_uring_ent_in_out` (commit id and payload size);
//! - the payload buffer holds the request's other arguments, and on commit
//!   the whole reply body; it must hold the connection's largest payload;
//! - `fuse_in_header.len` counts the header and every argument, so the size
//!   of `op_in`'s struct is `len - 40 - payload size`.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `fuse_in_header` and `fuse_out_header` sizes.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `fuse_uring_req_header`: `in_out`, `op_in`, `ring_ent_in_out`.
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_BUF: usize = 288;
/// Offsets in `fuse_uring_ent_in_out`.
const COMMIT_ID: usize = ENT_IN_OUT + 8;
const PAYLOAD_SZ: usize = ENT_IN_OUT + 16;
/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Offset of `len` in a 64-byte `io_uring_sqe`.
const SQE_LEN: usize = 24;
/// Requests whose payload is at most this are copied out of the entry, so
/// the reply can go straight into it; larger ones (writes) are parsed where
/// the kernel put them and their (small) reply is staged until the file
/// system has let go of the request.
const COPY_MAX: usize = 64 * 1024;
/// Room before the payload for a request's headers when parsed in place.
const SLACK: usize = 256;

/// What the session negotiated for io_uring.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    /// Size of each entry's payload buffer: the kernel's
    /// `max(FUSE_MIN_READ_BUFFER, max_write, max_pages * PAGE_SIZE)` or more.
    pub(crate) payload: usize,
    /// Where the file system is mounted (none for a session made from a
    /// descriptor), for [`abort_connection`].
    pub(crate) mountpoint: Option<Arc<std::path::PathBuf>>,
}

/// Ends the FUSE connection of the file system mounted at `mountpoint`, as
/// writing `/sys/fs/fuse/connections/N/abort` does, without asking the file
/// system anything. Once the kernel has been told io_uring, every request
/// waits until each CPU's queue has an entry, so a queue that cannot be
/// registered would leave the file system hanging; aborted, its callers get
/// ENOTCONN and the session ends. The connection is found through
/// `/proc/self/mountinfo` (a `stat` of the mount point would itself wait).
pub(crate) fn abort_connection(mountpoint: &std::path::Path) -> io::Result<()> {
    let wanted = if mountpoint.is_absolute() {
        mountpoint.to_path_buf()
    } else {
        std::env::current_dir()?.join(mountpoint)
    };
    let unescape = |field: &str| {
        field
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\")
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = info
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (dev, at) = (fields.get(2)?, fields.get(4)?);
            (std::path::Path::new(&unescape(at)) == wanted).then_some(*dev)
        })
        .last()
        .ok_or_else(|| {
            io::Error::other(format!("{} is not in the mount table", wanted.display()))
        })?;
    let (major, minor) = dev
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .ok_or_else(|| io::Error::other(format!("bad device {dev:?} in the mount table")))?;
    let connection = std::path::PathBuf::from(format!("{FUSECTL}/{}", (major << 20) | minor));
    if !connection.exists() {
        mount_fusectl()?;
    }
    std::fs::write(connection.join("abort"), b"1")
}

/// Where the FUSE control file system lists the connections.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Mounts the FUSE control file system on [`FUSECTL`]: systemd does at
/// boot, but a container or a minimal VM may not have it (root only). A
/// control file system already there is left as it is.
fn mount_fusectl() -> io::Result<()> {
    use nix::mount::{MsFlags, mount};
    match mount(
        Some("fusectl"),
        FUSECTL,
        Some("fusectl"),
        MsFlags::empty(),
        None::<&str>,
    ) {
        Ok(()) | Err(nix::errno::Errno::EBUSY) => Ok(()),
        Err(e) => Err(io::Error::other(format!(
            "the FUSE control file system is not on {FUSECTL} and cannot be mounted there: {e}"
        ))),
    }
}

/// The kernel's number of queues: one per possible CPU
/// (`/sys/devices/system/cpu/possible`, for example `0-3`).
pub(crate) fn queue_count() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = text
        .trim()
        .split(',')
        .filter_map(|range| range.rsplit('-').next())
        .filter_map(|n| n.parse::<usize>().ok())
        .max()
        .ok_or_else(|| io::Error::other(format!("cannot parse possible CPUs {text:?}")))?;
    Ok(last + 1)
}

/// A `Send` raw pointer into an entry's buffers, written by whichever
/// thread replies while the serving thread waits for it.
#[derive(Clone, Copy, Debug)]
struct BufPtr(*mut u8);
// SAFETY: the buffers outlive every reply (the serving thread waits for the
// reply before it touches or frees them), and one reply writes at a time
// under the slot's lock.
unsafe impl Send for BufPtr {}
unsafe impl Sync for BufPtr {}

/// The entry's buffers, for a reply written into them at once.
#[derive(Clone, Copy, Debug)]
struct Direct {
    header: BufPtr,
    payload: BufPtr,
    capacity: usize,
}

#[derive(Debug)]
struct SlotState {
    /// `None`: keep the reply in `staged` until the request's bytes, which
    /// lie in the entry, are released.
    direct: Option<Direct>,
    staged: Vec<u8>,
    replied: bool,
    /// The request's id, for an error reply in place of one that does not
    /// fit.
    unique: u64,
}

impl SlotState {
    /// Puts a reply where it goes (see `direct`).
    fn deliver(&mut self, data: &[IoSlice<'_>]) {
        match self.direct {
            None => {
                self.staged.clear();
                for s in data {
                    self.staged.extend_from_slice(s);
                }
            }
            // SAFETY: `header` holds HEADER_BUF bytes and `payload`
            // `capacity`, which the caller checked the body fits, both
            // alive and not otherwise accessed until `replied` is set (see
            // `BufPtr`).
            Some(direct) => unsafe { write_reply(data, direct.header.0, direct.payload.0) },
        }
    }
}

/// Where the reply to the request an entry holds goes.
#[derive(Debug)]
struct Slot {
    state: Mutex<SlotState>,
    replied: Condvar,
}

/// The reply channel of a request that came through io_uring.
#[derive(Clone, Debug)]
pub(crate) struct UringReply {
    slot: Arc<Slot>,
    /// `/dev/fuse`, for what still goes through the device (backing files).
    channel: ChannelSender,
}

impl UringReply {
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.channel
    }

    /// Takes the reply (`fuse_out_header` then the body, as for `writev` on
    /// the device).
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut state = self.slot.state.lock();
        if state.replied {
            return Err(io::Error::other("a second reply to one FUSE request"));
        }
        let total: usize = data.iter().map(|s| s.len()).sum();
        let room = state.direct.map_or(usize::MAX, |d| d.capacity);
        let fits = total >= OUT_HEADER && total - OUT_HEADER <= room;
        // Every request gets exactly one reply, or its entry never comes
        // back: one that does not fit becomes EIO.
        let result = if fits {
            state.deliver(data);
            Ok(())
        } else {
            let parts = error_reply(state.unique, libc::EIO);
            state.deliver(&[IoSlice::new(&parts[0]), IoSlice::new(&parts[1])]);
            Err(io::Error::other(format!(
                "a FUSE reply of {total} bytes does not fit the ring's entry"
            )))
        };
        state.replied = true;
        self.slot.replied.notify_one();
        result
    }
}

/// Copies a reply's bytes: the first OUT_HEADER into `header`'s `in_out`, the
/// rest into `payload`, and the body's size into `ring_ent_in_out`.
///
/// # Safety
/// `header` must point at HEADER_BUF writable bytes and `payload` at room for
/// the body.
unsafe fn write_reply(data: &[IoSlice<'_>], header: *mut u8, payload: *mut u8) {
    let mut at = 0usize;
    for slice in data {
        let mut src: &[u8] = slice;
        if at < OUT_HEADER {
            let n = (OUT_HEADER - at).min(src.len());
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), header.add(at), n) };
            at += n;
            src = &src[n..];
        }
        if !src.is_empty() {
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), payload.add(at - OUT_HEADER), src.len())
            };
            at += src.len();
        }
    }
    let body = (at - OUT_HEADER) as u32;
    unsafe {
        std::ptr::copy_nonoverlapping(body.to_ne_bytes().as_ptr(), header.add(PAYLOAD_SZ), 4);
    }
}

/// One registered entry: its two buffers, 8-byte aligned.
struct Entry {
    header: Vec<u64>,
    /// SLACK bytes, then the payload buffer the kernel knows.
    data: Vec<u64>,
    payload: usize,
    iov: [libc::iovec; 2],
}

impl Entry {
    fn new(payload: usize) -> Box<Entry> {
        let mut e = Box::new(Entry {
            header: vec![0u64; HEADER_BUF / 8],
            data: vec![0u64; (SLACK + payload).div_ceil(8)],
            payload,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        });
        let header = e.header_ptr();
        let payload_ptr = e.payload_ptr();
        e.iov = [
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_BUF,
            },
            libc::iovec {
                iov_base: payload_ptr.cast(),
                iov_len: payload,
            },
        ];
        e
    }

    fn header_ptr(&mut self) -> *mut u8 {
        self.header.as_mut_ptr().cast()
    }

    fn payload_ptr(&mut self) -> *mut u8 {
        // SAFETY: `data` holds SLACK + payload bytes.
        unsafe { self.data.as_mut_ptr().cast::<u8>().add(SLACK) }
    }

    fn header(&self) -> &[u8] {
        // SAFETY: HEADER_BUF bytes of plain integers.
        unsafe { std::slice::from_raw_parts(self.header.as_ptr().cast(), HEADER_BUF) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the whole buffer, SLACK + payload bytes of plain integers.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast(), SLACK + self.payload) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.as_mut_ptr().cast(), SLACK + self.payload)
        }
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.header()[at..at + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.header()[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// An io_uring command for `fd` with a `fuse_uring_cmd_req` in its data;
/// a register command also carries the entry's two buffers.
fn command(
    fd: RawFd,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut builder = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        builder = builder.addr(Some(iov.as_ptr() as u64));
    }
    let entry = builder.build();
    if iov.is_none() {
        return entry;
    }
    // The register command passes an iovec array in addr/len; the crate
    // sets addr only. `Entry128` is `repr(C)`: the 64-byte SQE, then the
    // extra 64 bytes of command data.
    // SAFETY: both are 128 plain bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
    raw[SQE_LEN..SQE_LEN + 4].copy_from_slice(&2u32.to_ne_bytes());
    unsafe { std::mem::transmute(raw) }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                debug!(
                    "cannot pin the queue {cpu} thread: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }
}

/// The kernel stopped the ring: the file system was unmounted or aborted.
fn is_teardown(errno: i32) -> bool {
    matches!(errno, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV)
}

/// Why a queue thread stopped serving io_uring.
#[derive(Debug)]
pub(crate) enum UringError {
    /// The ring could not be set up or the kernel refused the entry: no
    /// request came through it (and none will, see [`abort_connection`]).
    Setup(io::Error),
    /// Serving failed after requests came through the ring.
    Serve(io::Error),
}

impl<FS: Filesystem> SessionEventLoop<FS> {
    /// Registers one entry on queue `qid` and serves the requests it gets
    /// until the file system goes away.
    pub(crate) fn uring_event_loop(&self, qid: u16, params: Params) -> Result<(), UringError> {
        pin_to_cpu(qid as usize);
        let fd = self.ch.as_fd().as_raw_fd();
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
            IoUring::builder().build(2).map_err(UringError::Setup)?;
        let mut entry = Entry::new(params.payload);
        let register = command(fd, CMD_REGISTER, qid, 0, Some(&entry.iov));
        // SAFETY: the iovecs and the buffers they name live in `entry`, which
        // outlives the ring (dropped after it, below).
        unsafe { ring.submission().push(&register) }
            .map_err(|e| UringError::Setup(io::Error::other(e)))?;
        ring.submit().map_err(UringError::Setup)?;
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState {
                direct: None,
                staged: Vec::new(),
                replied: false,
                unique: 0,
            }),
            replied: Condvar::new(),
        });
        let mut copied = vec![0u64; (IN_HEADER + OP_IN + COPY_MAX).div_ceil(8)];
        let mut served = false;
        let result = loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => break Err(e),
            }
            let Some(cqe) = ring.completion().next() else {
                continue;
            };
            if cqe.result() < 0 {
                let errno = -cqe.result();
                if is_teardown(errno) {
                    break Ok(());
                }
                break Err(io::Error::from_raw_os_error(errno));
            }
            served = true;
            let commit_id = entry.u64_at(COMMIT_ID);
            let destroy = self.serve_entry(&mut entry, &slot, u64s_as_bytes(&mut copied));
            let commit = command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, None);
            // SAFETY: as for the register command.
            if let Err(e) = unsafe { ring.submission().push(&commit) } {
                break Err(io::Error::other(e));
            }
            if destroy {
                let _ = ring.submit();
                break Ok(());
            }
        };
        drop(ring);
        drop(entry);
        result.map_err(|e| {
            if served {
                UringError::Serve(e)
            } else {
                UringError::Setup(e)
            }
        })
    }

    /// Dispatches the request in `entry` and leaves its reply there. Returns
    /// whether it was the session's DESTROY.
    fn serve_entry(&self, entry: &mut Entry, slot: &Arc<Slot>, copied: &mut [u8]) -> bool {
        let len = entry.u32_at(0) as usize;
        let unique = entry.u64_at(8);
        let payload = entry.u32_at(PAYLOAD_SZ) as usize;
        let op_in = len
            .checked_sub(IN_HEADER + payload)
            .filter(|&n| n <= OP_IN && payload <= entry.payload);
        let Some(op_in) = op_in else {
            error!("io_uring request {unique}: length {len} does not fit payload {payload}");
            write_error(entry, unique, libc::EIO);
            return false;
        };
        let in_place = payload > COPY_MAX && op_in % 8 == 0;
        // A large payload after an odd-sized header (no such operation
        // today) is copied into a buffer of its own.
        let mut oversized;
        let copied = if !in_place && len > copied.len() {
            oversized = vec![0u64; len.div_ceil(8)];
            u64s_as_bytes(&mut oversized)
        } else {
            copied
        };
        let mut head = [0u8; IN_HEADER + OP_IN];
        head[..IN_HEADER].copy_from_slice(&entry.header()[..IN_HEADER]);
        head[IN_HEADER..IN_HEADER + op_in].copy_from_slice(&entry.header()[OP_IN..OP_IN + op_in]);
        let head = &head[..IN_HEADER + op_in];
        {
            let mut state = slot.state.lock();
            state.replied = false;
            state.unique = unique;
            state.direct = (!in_place).then(|| Direct {
                header: BufPtr(entry.header_ptr()),
                payload: BufPtr(entry.payload_ptr()),
                capacity: entry.payload,
            });
        }
        let reply = UringReply {
            slot: slot.clone(),
            channel: self.ch.sender(),
        };
        let mut destroy = false;
        {
            let data: &[u8] = if in_place {
                let start = SLACK - head.len();
                entry.bytes_mut()[start..SLACK].copy_from_slice(head);
                &entry.bytes()[start..SLACK + payload]
            } else {
                copied[..head.len()].copy_from_slice(head);
                copied[head.len()..len].copy_from_slice(&entry.bytes()[SLACK..SLACK + payload]);
                &copied[..len]
            };
            match RequestWithSender::new_uring(reply.clone(), data) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                        destroy = true;
                    } else {
                        req.dispatch(self);
                    }
                }
                None => {
                    warn!("io_uring request {unique} cannot be parsed");
                    let parts = error_reply(unique, libc::EIO);
                    let _ = reply.send(&[IoSlice::new(&parts[0]), IoSlice::new(&parts[1])]);
                }
            }
        }
        let mut state = slot.state.lock();
        while !state.replied {
            slot.replied.wait(&mut state);
        }
        if state.direct.is_none() {
            if state.staged.len() - OUT_HEADER <= entry.payload {
                let slices = [IoSlice::new(&state.staged)];
                // SAFETY: the entry's buffers, which nothing else holds now.
                unsafe { write_reply(&slices, entry.header_ptr(), entry.payload_ptr()) };
            } else {
                drop(state);
                write_error(entry, unique, libc::EIO);
            }
        }
        destroy
    }
}

fn u64s_as_bytes(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: plain integers viewed as their bytes.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 8) }
}

fn error_reply(unique: u64, errno: i32) -> [[u8; 8]; 2] {
    let mut first = [0u8; 8];
    first[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    first[4..].copy_from_slice(&(-errno).to_ne_bytes());
    [first, unique.to_ne_bytes()]
}

fn write_error(entry: &mut Entry, unique: u64, errno: i32) {
    let parts = error_reply(unique, errno);
    let slices = [IoSlice::new(&parts[0]), IoSlice::new(&parts[1])];
    // SAFETY: the entry's own buffers.
    unsafe { write_reply(&slices, entry.header_ptr(), entry.payload_ptr()) };
}
