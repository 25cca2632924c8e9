//! The FUSE transport's ceiling: a file system that keeps names in memory
//! and does nothing else, mounted as `lightstore mount` mounts (same
//! options and capabilities), to measure what the kernel's FUSE path and
//! fuser cost per operation without the cluster.
//!
//! ```sh
//! echo Y > /sys/module/fuse/parameters/enable_uring     # for io_uring
//! cargo run --release -p fs --example fuse_ceiling -- /mnt/x yes 16 &
//! python3 -c 'import os; [os.close(os.open(f"/mnt/x/f{i}", os.O_CREAT | os.O_WRONLY)) for i in range(10000)]'
//! fusermount3 -u /mnt/x
//! ```
//!
//! Arguments: MOUNTPOINT, `yes` (io_uring) or `no` (`/dev/fuse`), threads.
//! To see what the mount's choices cost, `CEILING_PERMISSIONS=no` mounts
//! without `default_permissions` (the kernel then asks for no permission
//! checks) and `CEILING_WRITEBACK=no` without the writeback cache.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request,
};

const TTL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Names {
    /// Directory entries by parent.
    dirs: HashMap<u64, BTreeMap<Vec<u8>, u64>>,
    /// Mode by inode.
    modes: HashMap<u64, u32>,
    next: u64,
}

struct Null {
    names: Mutex<Names>,
    io_uring: bool,
}

fn attr(ino: u64, mode: u32) -> FileAttr {
    let kind = if mode & libc::S_IFMT == libc::S_IFDIR {
        FileType::Directory
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: (mode & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Null {
    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn make(&self, parent: INodeNo, name: &OsStr, mode: u32) -> FileAttr {
        let mut n = self.names();
        n.next += 1;
        let ino = n.next;
        n.dirs
            .entry(parent.0)
            .or_default()
            .insert(name.as_bytes().to_vec(), ino);
        n.modes.insert(ino, mode);
        if mode & libc::S_IFMT == libc::S_IFDIR {
            n.dirs.insert(ino, BTreeMap::new());
        }
        attr(ino, mode)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut n = self.names();
        match n
            .dirs
            .get_mut(&parent.0)
            .and_then(|d| d.remove(name.as_bytes()))
        {
            Some(ino) => {
                n.modes.remove(&ino);
                n.dirs.remove(&ino);
                reply.ok()
            }
            None => reply.error(fuser::Errno::ENOENT),
        }
    }
}

impl Filesystem for Null {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut wanted = fuser::InitFlags::FUSE_PARALLEL_DIROPS | fuser::InitFlags::FUSE_ASYNC_DIO;
        if !switched_off("CEILING_WRITEBACK") {
            wanted |= fuser::InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.io_uring {
            wanted |= fuser::InitFlags::FUSE_OVER_IO_URING;
        }
        config
            .add_capabilities(wanted)
            .map_err(|missing| std::io::Error::other(format!("kernel lacks {missing:?}")))
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let n = self.names();
        match n.dirs.get(&parent.0).and_then(|d| d.get(name.as_bytes())) {
            Some(&ino) => reply.entry(&TTL, &attr(ino, n.modes[&ino]), Generation(0)),
            // A negative entry the kernel keeps, as the mount answers.
            None => reply.entry(&TTL, &attr(0, libc::S_IFREG), Generation(0)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.names().modes.get(&ino.0) {
            Some(&mode) => reply.attr(&TTL, &attr(ino.0, mode)),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.getattr(req, ino, fh, reply)
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.entry(
            &TTL,
            &self.make(parent, name, libc::S_IFDIR | mode),
            Generation(0),
        )
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let a = self.make(parent, name, mode);
        reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty())
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, reply)
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty())
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let n = self.names();
        if let Some(d) = n.dirs.get(&ino.0) {
            for (i, (name, &child)) in d.iter().enumerate().skip(offset as usize) {
                let kind = attr(child, n.modes[&child]).kind;
                if reply.add(INodeNo(child), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                    break;
                }
            }
        }
        reply.ok()
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, mountpoint, io_uring, threads] = &args[..] else {
        eprintln!("usage: fuse_ceiling MOUNTPOINT yes|no THREADS");
        std::process::exit(2);
    };
    let mut names = Names::default();
    names.dirs.insert(1, BTreeMap::new());
    names.modes.insert(1, libc::S_IFDIR | 0o755);
    names.next = 1;
    let fs = Null {
        names: Mutex::new(names),
        io_uring: io_uring == "yes",
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("fuse-ceiling".into())];
    if !switched_off("CEILING_PERMISSIONS") {
        config
            .mount_options
            .push(fuser::MountOption::DefaultPermissions);
    }
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(threads.parse().unwrap_or(16));
    config.clone_fd = true;
    fuser::Session::new(fs, mountpoint, &config)?.run()
}

/// Whether the environment variable `name` is `no`.
fn switched_off(name: &str) -> bool {
    std::env::var(name).as_deref() == Ok("no")
}
