//! Serves a [`FileSystem`] to the kernel through FUSE (the `fuser` crate,
//! no libfuse): each request is translated to one core call and its
//! result or errno. Permission checks are the kernel's
//! (`default_permissions`); attributes and entries are cached by the
//! kernel for `TTL` (one mount owns the file system, so nothing else
//! changes them behind its back).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::attrs::{SetAttr, SetTime, XattrMode};
use crate::error::FsError;
use crate::filesystem::FileSystem;
use crate::inode::{Inode, Kind, Time};
use crate::metrics::{FuseStats, Op};
use crate::namespace::{Caller, NewNode, NAME_MAX};
use crate::seek::Seek;

/// How long the kernel may cache attributes and entries.
const TTL: Duration = Duration::from_secs(1);
/// Largest read and write request (FUSE `max_pages` 256).
const MAX_IO: u32 = 1 << 20;
/// Entries READDIRPLUS looks up at a time (more than one reply holds: a
/// kernel request of 4 KiB takes about 25 of them).
const READDIRPLUS_WINDOW: usize = 128;

/// A directory listing: (name, ino, type) per entry, `.` and `..` first.
type Listing = Vec<(Vec<u8>, u64, FileType)>;

/// The FUSE face of a file system.
pub struct FuseFs {
    fs: Arc<FileSystem>,
    /// Open directory listings by handle (a stable snapshot per opendir).
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
    writeback: bool,
    transport: Transport,
    stats: Arc<FuseStats>,
}

/// How the kernel hands requests to the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it, else `/dev/fuse`.
    Auto,
    /// io_uring or no mount: the kernel must offer it (Linux 6.14+ with
    /// `/sys/module/fuse/parameters/enable_uring` set).
    IoUring,
    /// `read`/`write` on `/dev/fuse`.
    Device,
}

impl FuseFs {
    /// Serves `fs`; with `writeback` the kernel's page cache buffers
    /// writes and sends them in large batches (FUSE_WRITEBACK_CACHE), and
    /// close, fsync and unmount write them out.
    pub fn new(fs: Arc<FileSystem>, writeback: bool) -> FuseFs {
        FuseFs {
            fs,
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            writeback,
            transport: Transport::Auto,
            stats: Arc::default(),
        }
    }

    /// Chooses how the kernel hands requests over (default [`Transport::Auto`]).
    /// Through io_uring a request is served on its caller's CPU and its
    /// reply and the next fetch take one command: metadata operations
    /// about 1.7 times as many per second as through `/dev/fuse`.
    pub fn with_transport(mut self, transport: Transport) -> FuseFs {
        self.transport = transport;
        self
    }

    /// The mount's request counters (for `--metrics`).
    pub fn stats(&self) -> Arc<FuseStats> {
        self.stats.clone()
    }

    fn attr(&self, i: &Inode) -> FileAttr {
        FileAttr {
            ino: INodeNo(i.ino),
            size: i.size,
            blocks: self.fs.blocks(i),
            atime: i.atime.to_system(),
            mtime: i.mtime.to_system(),
            ctime: i.ctime.to_system(),
            crtime: i.ctime.to_system(),
            kind: file_type(i.kind),
            perm: i.perm,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            blksize: self.fs.chunk_size() as u32,
            flags: 0,
        }
    }
}

/// The attributes of a negative entry: inode 0 says "no such name".
/// Whether this process may make the rings FUSE over io_uring needs
/// (128-byte submission entries): `kernel.io_uring_disabled` or a seccomp
/// filter can forbid io_uring where the kernel offers the transport, and
/// once the kernel is told io_uring it serves nothing through `/dev/fuse`.
fn io_uring_usable() -> std::io::Result<()> {
    io_uring::IoUring::<io_uring::squeue::Entry128, io_uring::cqueue::Entry>::builder()
        .build(2)
        .map(|_| ())
}

fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: std::time::UNIX_EPOCH,
        mtime: std::time::UNIX_EPOCH,
        ctime: std::time::UNIX_EPOCH,
        crtime: std::time::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

/// Whether the caller lacks `CAP_FSETID` (and so loses set-ID bits when
/// it writes or truncates). FUSE passes no capabilities, only ids: a
/// caller other than root is taken to lack it.
fn lacks_fsetid(req: &Request) -> bool {
    req.uid() != 0
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(Time::from_system(t)),
    }
}

impl FuseFs {
    /// The errno answering `e` for operation `op`, counted; a failure
    /// other than a POSIX error is logged.
    fn errno(&self, op: &str, e: &FsError) -> Errno {
        let posix = matches!(e, FsError::Posix(_));
        if !posix {
            tracing::warn!(op, error = %e, "file system request failed");
        }
        self.stats.error(op, posix);
        Errno::from_i32(e.errno())
    }

    fn reply_entry(&self, op: &str, r: crate::error::Result<Inode>, reply: ReplyEntry) {
        match r {
            Ok(i) => {
                // The kernel now holds a lookup reference until FORGET.
                self.fs.pin(i.ino, 1);
                reply.entry(&TTL, &self.attr(&i), Generation(0))
            }
            Err(e) => reply.error(self.errno(op, &e)),
        }
    }

    fn reply_attr(&self, op: &str, r: crate::error::Result<Inode>, reply: ReplyAttr) {
        match r {
            Ok(i) => reply.attr(&TTL, &self.attr(&i)),
            Err(e) => reply.error(self.errno(op, &e)),
        }
    }

    fn reply_data(&self, op: &str, r: crate::error::Result<Vec<u8>>, reply: ReplyData) {
        match r {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(self.errno(op, &e)),
        }
    }

    fn reply_empty(&self, op: &str, r: crate::error::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(op, &e)),
        }
    }

    /// Clears `ino`'s set-ID bits if the caller lacks `CAP_FSETID`
    /// ([`lacks_fsetid`]): what the kernel leaves to us, unsaid, around a
    /// `fallocate` or `copy_file_range` under FUSE_HANDLE_KILLPRIV_V2.
    fn drop_set_id_for(&self, req: &Request, ino: u64) -> crate::error::Result<()> {
        if lacks_fsetid(req) {
            self.fs.drop_set_id(ino)
        } else {
            Ok(())
        }
    }

    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        new: NewNode<'_>,
    ) -> crate::error::Result<Inode> {
        self.fs.make(caller(req), parent.0, name.as_bytes(), new)
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel may offer less; what it grants is fine.
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let mut wanted = fuser::InitFlags::FUSE_PARALLEL_DIROPS
            | fuser::InitFlags::FUSE_CACHE_SYMLINKS
            | fuser::InitFlags::FUSE_DO_READDIRPLUS
            | fuser::InitFlags::FUSE_READDIRPLUS_AUTO
            // Set-user-ID and set-group-ID bits are cleared here on write,
            // truncation, fallocate, copy_file_range and owner change
            // (`Inode::drop_set_id`), so the
            // kernel need not ask for `security.capability` before every
            // write (a round trip that queued behind the write-back of
            // earlier writes: the writer stalled on each call). The kernel
            // still asks once per file, and removes a capability itself.
            | fuser::InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // O_DIRECT reads and writes submitted together (libaio,
            // io_uring) reach the adapter together; without it the kernel
            // sends them one at a time.
            | fuser::InitFlags::FUSE_ASYNC_DIO;
        if self.writeback {
            wanted |= fuser::InitFlags::FUSE_WRITEBACK_CACHE;
        }
        let offered = config
            .capabilities()
            .contains(fuser::InitFlags::FUSE_OVER_IO_URING);
        // The probe ring is made only where its answer decides something.
        let usable = match self.transport {
            Transport::IoUring | Transport::Auto if offered => io_uring_usable(),
            _ => Ok(()),
        };
        match (self.transport, offered, usable) {
            (Transport::IoUring, false, _) => {
                return Err(std::io::Error::other(
                    "the kernel does not offer FUSE over io_uring (Linux 6.14 or later, \
                     with /sys/module/fuse/parameters/enable_uring set to Y)",
                ));
            }
            (Transport::IoUring, true, Err(e)) => {
                return Err(std::io::Error::other(format!(
                    "the kernel offers FUSE over io_uring but this process may not use \
                     io_uring ({e}; see kernel.io_uring_disabled)"
                )));
            }
            (Transport::Auto, true, Err(e)) => {
                tracing::warn!(error = %e, "FUSE over io_uring offered but io_uring is unavailable; using /dev/fuse");
            }
            (Transport::IoUring | Transport::Auto, true, Ok(())) => {
                wanted |= fuser::InitFlags::FUSE_OVER_IO_URING;
            }
            _ => {}
        }
        self.stats
            .set_io_uring(wanted.contains(fuser::InitFlags::FUSE_OVER_IO_URING));
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::info!(?missing, "the kernel lacks some FUSE capabilities");
            let _ = config.add_capabilities(wanted & !missing);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.flush_all() {
            tracing::error!(error = %e, "cannot write back inodes at unmount");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.begin(Op::Lookup);
        match self.fs.lookup(parent.0, name.as_bytes()) {
            // A negative entry (inode 0) that the kernel keeps for TTL, so
            // a repeated probe of a missing name (PATH and import searches,
            // git) costs no round trip. Safe because this mount makes every
            // change to the file system (the lease), and the kernel turns
            // its own negative entry positive when a name is made through
            // it.
            Err(crate::error::FsError::Posix(e)) if e.0 == libc::ENOENT => {
                reply.entry(&TTL, &negative_attr(), Generation(0))
            }
            r => self.reply_entry("lookup", r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.stats.begin(Op::Forget);
        if let Err(e) = self.fs.unpin(ino.0, nlookup) {
            tracing::warn!(ino = ino.0, error = %e, "cannot reclaim a forgotten unlinked file now; the next mount will");
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.stats.begin(Op::Getattr);
        self.reply_attr("getattr", self.fs.inode(ino.0), reply);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.stats.begin(Op::Setattr);
        // `chown(f, -1, -1)` reaches us as a change of nothing but (with
        // the write-back cache, for a regular file) ctime: the kernel
        // dropped the owner change it would have made but still expects
        // set-user-ID and set-group-ID cleared, as a local file system
        // does. No other call sends such a request (`utimensat` omitting
        // both times returns before asking).
        let chown_to_same = mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(Time::from_system),
            // What the kernel asks with FATTR_KILL_SUIDGID (which fuser
            // does not pass on): always when the owner changes (even to
            // the same owner, above); on a truncation when the caller
            // lacks CAP_FSETID.
            drop_set_id: uid.is_some()
                || gid.is_some()
                || chown_to_same
                || (size.is_some() && lacks_fsetid(req)),
        };
        self.reply_attr("setattr", self.fs.setattr(ino.0, &set), reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.stats.begin(Op::Readlink);
        self.reply_data("readlink", self.fs.readlink(ino.0), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.begin(Op::Mknod);
        let Some(kind) = Kind::from_mode(mode).filter(|k| *k != Kind::Dir && *k != Kind::Symlink)
        else {
            return reply.error(Errno::EINVAL);
        };
        let new = NewNode {
            kind,
            perm: mode,
            rdev,
            target: b"",
        };
        self.reply_entry("mknod", self.make(req, parent, name, new), reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.begin(Op::Mkdir);
        let new = NewNode {
            kind: Kind::Dir,
            perm: mode,
            rdev: 0,
            target: b"",
        };
        self.reply_entry("mkdir", self.make(req, parent, name, new), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.begin(Op::Unlink);
        self.reply_empty("unlink", self.fs.unlink(parent.0, name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.begin(Op::Rmdir);
        self.reply_empty("rmdir", self.fs.rmdir(parent.0, name.as_bytes()), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.begin(Op::Symlink);
        let new = NewNode {
            kind: Kind::Symlink,
            perm: 0o777,
            rdev: 0,
            target: target.as_os_str().as_bytes(),
        };
        self.reply_entry("symlink", self.make(req, parent, link_name, new), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Rename);
        let r = self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        self.reply_empty("rename", r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.stats.begin(Op::Link);
        self.reply_entry(
            "link",
            self.fs.link(ino.0, newparent.0, newname.as_bytes()),
            reply,
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.begin(Op::Open);
        match self.fs.inode(ino.0) {
            Ok(_) => {
                self.fs.opened(ino.0);
                reply.opened(FileHandle(0), FopenFlags::empty());
            }
            Err(e) => reply.error(self.errno("open", &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.stats.begin(Op::Read);
        let r = self.fs.read(ino.0, offset, size.min(MAX_IO));
        if let Ok(d) = &r {
            self.stats.read_bytes(d.len());
        }
        self.reply_data("read", r, reply);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.stats.begin(Op::Write);
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.fs.drop_set_id(ino.0) {
                return reply.error(self.errno("write", &e));
            }
        }
        match self.fs.write(ino.0, offset, data) {
            Ok(()) => {
                self.stats.written_bytes(data.len());
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(self.errno("write", &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Flush);
        // Every close() sends a FLUSH, a round trip that a create (LOOKUP,
        // CREATE, GETATTR of the directory, FLUSH, RELEASE) could do
        // without: RELEASE writes the inode back as well, and the kernel
        // itself writes back cached pages and reports their errors before
        // it sends FLUSH. ENOSYS (after this first write-back) tells the
        // kernel to stop sending it; close() then returns 0.
        match self.fs.flush_inode(ino.0) {
            Ok(()) => reply.error(Errno::ENOSYS),
            Err(e) => reply.error(self.errno("flush", &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Release);
        self.reply_empty("release", self.fs.released(ino.0), reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Fsync);
        self.reply_empty("fsync", self.fs.fsync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.begin(Op::Opendir);
        let listing = self.fs.inode(ino.0).and_then(|d| {
            if d.kind != Kind::Dir {
                return crate::error::posix(libc::ENOTDIR);
            }
            let mut out = vec![
                (b".".to_vec(), d.ino, FileType::Directory),
                (b"..".to_vec(), d.parent.max(1), FileType::Directory),
            ];
            for (name, child, kind) in self.fs.list_dir(ino.0)? {
                out.push((name, child, file_type(kind)));
            }
            Ok(out)
        });
        match listing {
            Ok(l) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().insert(fh, l);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(self.errno("opendir", &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.stats.begin(Op::Readdir);
        let mut sent = Vec::new();
        {
            let dirs = self.dirs.lock();
            let Some(listing) = dirs.get(&fh.0) else {
                return reply.error(Errno::EBADF);
            };
            for (i, (name, child, kind)) in listing.iter().enumerate().skip(offset as usize) {
                if reply.add(
                    INodeNo(*child),
                    i as u64 + 1,
                    *kind,
                    OsStr::from_bytes(name),
                ) {
                    break;
                }
                if name != b"." && name != b".." {
                    sent.push(*child);
                }
            }
        }
        reply.ok();
        // The kernel asks plainly (no attributes) for every listing page
        // after the first when no lookup came in between: `rm -rf` and
        // `find` read a whole directory, then look up each name. Fetching
        // the page's inodes now, in one multi-get after the reply, turns
        // those lookups into cache hits instead of a node read each (cold
        // `rm -rf` of 20,000 files: bench/RESULTS.md). Best effort: a
        // lookup reads what this did not.
        if let Err(e) = self.fs.inodes(&sent) {
            tracing::debug!(error = %e, "readdir: prefetching the listed inodes failed");
        }
    }

    /// READDIR with each entry's attributes (the kernel then needs no
    /// LOOKUP for them, as `ls -l` would otherwise send per name). Each
    /// entry but `.` and `..` counts as a lookup, as for LOOKUP itself.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.stats.begin(Op::Readdirplus);
        let window: Vec<(usize, Vec<u8>, u64)> = {
            let dirs = self.dirs.lock();
            let Some(listing) = dirs.get(&fh.0) else {
                return reply.error(Errno::EBADF);
            };
            listing
                .iter()
                .enumerate()
                .skip(offset as usize)
                .take(READDIRPLUS_WINDOW)
                .map(|(i, (name, child, _))| (i, name.clone(), *child))
                .collect()
        };
        let inos: Vec<u64> = window.iter().map(|(_, _, child)| *child).collect();
        let inodes = match self.fs.inodes(&inos) {
            Ok(v) => v,
            Err(e) => return reply.error(self.errno("readdirplus", &e)),
        };
        for ((i, name, child), inode) in window.into_iter().zip(inodes) {
            // An entry removed since the listing was taken is left out
            // (an unlinked file still open keeps its inode, with no links).
            let Some(inode) = inode.filter(|i| i.nlink > 0) else {
                continue;
            };
            // So is one renamed away or replaced since: the kernel links
            // each entry into its dentry cache, and a directory listed
            // where it no longer is would be pulled back from where a
            // rename put it (or the walk fails with ESTALE when a rename
            // is in progress). The kernel holds this directory's lock
            // through the request, so no rename of its entries runs
            // between this check and the reply.
            if name != b"." && name != b".." {
                match self.fs.lookup_entry(ino.0, &name) {
                    Ok((now, _)) if now == child => {}
                    Ok(_) | Err(FsError::Posix(_)) => continue,
                    Err(e) => return reply.error(self.errno("readdirplus", &e)),
                }
            }
            let attr = self.attr(&inode);
            if reply.add(
                INodeNo(child),
                i as u64 + 1,
                OsStr::from_bytes(&name),
                &TTL,
                &attr,
                Generation(0),
            ) {
                break; // full: the kernel asks again from this entry
            }
            if name != b"." && name != b".." {
                self.fs.pin(child, 1);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Releasedir);
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Fsyncdir);
        self.reply_empty("fsyncdir", self.fs.sync_all(), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.stats.begin(Op::Statfs);
        let bsize = 4096u64;
        // Unknown capacity (no node answers): a large, free file system.
        let (total, free) = self
            .fs
            .capacity()
            .map_or((1 << 50, 1 << 50), |c| (c.total, c.free));
        // Inodes are keys: as many as blocks, as free as space.
        let (blocks, bfree) = (total / bsize, free / bsize);
        reply.statfs(
            blocks,
            bfree,
            bfree,
            blocks,
            bfree,
            bsize as u32,
            NAME_MAX as u32,
            bsize as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Setxattr);
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        self.reply_empty(
            "setxattr",
            self.fs.setxattr(ino.0, name.as_bytes(), value, mode),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.stats.begin(Op::Getxattr);
        match self.fs.getxattr(ino.0, name.as_bytes()) {
            Ok(v) => reply_sized(&v, size, reply),
            Err(e) => reply.error(self.errno("getxattr", &e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.stats.begin(Op::Listxattr);
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut all = Vec::new();
                for n in names {
                    all.extend_from_slice(&n);
                    all.push(0);
                }
                reply_sized(&all, size, reply);
            }
            Err(e) => reply.error(self.errno("listxattr", &e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.begin(Op::Fallocate);
        // Like a write (`file_modified`): the kernel leaves clearing the
        // set-ID bits to us (FUSE_HANDLE_KILLPRIV_V2) without saying so.
        let r = self
            .drop_set_id_for(req, ino.0)
            .and_then(|()| self.fs.fallocate(ino.0, offset, length, mode));
        self.reply_empty("fallocate", r, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = self.stats.begin(Op::CopyFileRange);
        // A write to the destination: set-ID bits go as for a write.
        let r = self.drop_set_id_for(req, ino_out.0).and_then(|()| {
            self.fs
                .copy_range(ino_in.0, offset_in, ino_out.0, offset_out, len)
        });
        match r {
            // At most the adapter's per-call limit (256 MiB): fits the
            // reply's u32.
            Ok(n) => reply.written(n.min(u64::from(u32::MAX)) as u32),
            Err(e) => reply.error(self.errno("copy_file_range", &e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.stats.begin(Op::Lseek);
        // The kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself, and
        // writes back its dirty pages of the file before it asks.
        let to = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        // A negative offset is past any end, as the kernel's own
        // `generic_file_llseek` reads it.
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.seek(ino.0, offset, to) {
            // At most the file's size, itself at most `i64::MAX`.
            Ok(at) => reply.offset(i64::try_from(at).unwrap_or(i64::MAX)),
            Err(e) => reply.error(self.errno("lseek", &e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // No ioctls of our own. The kernel asks about every ioctl on a file
        // (a tty check, TCGETS, at each Python `open` of a file in text
        // mode) and caches neither answer, ENOTTY nor ENOSYS: a round trip
        // each.
        reply.error(Errno::ENOTTY);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.begin(Op::Removexattr);
        self.reply_empty(
            "removexattr",
            self.fs.removexattr(ino.0, name.as_bytes()),
            reply,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.stats.begin(Op::Create);
        let new = NewNode {
            kind: Kind::File,
            perm: mode,
            rdev: 0,
            target: b"",
        };
        match self.make(req, parent, name, new) {
            Ok(i) => {
                // A lookup reference and an open handle.
                self.fs.pin(i.ino, 1);
                self.fs.opened(i.ino);
                reply.created(
                    &TTL,
                    &self.attr(&i),
                    Generation(0),
                    FileHandle(0),
                    FopenFlags::empty(),
                );
            }
            Err(e) => reply.error(self.errno("create", &e)),
        }
    }
}

/// An xattr reply: the size when asked for it (`size` 0), else the bytes
/// if they fit (ERANGE if not).
fn reply_sized(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(v);
    }
}
