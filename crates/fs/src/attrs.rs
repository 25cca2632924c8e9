//! Attribute changes (`setattr`: mode, owner, size, times) and extended
//! attributes, each one transaction.

use crate::error::{posix, Result};
use crate::filesystem::FileSystem;
use crate::inode::{Inode, Kind, Time, HAS_XATTRS};

/// Longest xattr name and value.
const XATTR_NAME_MAX: usize = 255;
const XATTR_VALUE_MAX: usize = 64 << 10;

/// A time to set: a given one, or now.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    At(Time),
    Now,
}

/// What `setattr` changes (`None`: unchanged).
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Time>,
    /// Clear set-user-ID and set-group-ID as [`Inode::drop_set_id`] does
    /// (unless `mode` is set): the owner changes, or a caller without
    /// `CAP_FSETID` truncates. The kernel leaves this to the file system
    /// once it offers `FUSE_HANDLE_KILLPRIV_V2` (see `crate::fuse`).
    pub drop_set_id: bool,
}

/// How `setxattr` may treat an existing attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrMode {
    Any,
    /// Fail with EEXIST if it exists (`XATTR_CREATE`).
    Create,
    /// Fail with ENODATA if it does not (`XATTR_REPLACE`).
    Replace,
}

impl FileSystem {
    /// Applies `set` to `ino`; its new attributes.
    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Inode> {
        self.writable()?;
        // Truncation changes data first: hold the file's data lock.
        let _data = set.size.map(|_| self.data_lock(ino));
        if let Some(size) = set.size {
            if size > crate::data::MAX_FILE_SIZE {
                return posix(libc::EFBIG);
            }
            let i = self.inode(ino)?;
            match i.kind {
                Kind::Dir => return posix(libc::EISDIR),
                Kind::File => {}
                _ => return posix(libc::EINVAL),
            }
            if size < i.size {
                self.drop_data_past(ino, size)?;
                self.held.shrunk(ino, size.div_ceil(self.chunk));
            }
        }
        let (_ns, mut txn) = self.begin();
        let now = Time::now();
        let i = txn.get(ino)?;
        if let Some(mode) = set.mode {
            i.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            i.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.gid = gid;
        }
        if set.drop_set_id && set.mode.is_none() {
            i.drop_set_id();
        }
        if let Some(size) = set.size {
            if size != i.size || set.mtime.is_none() {
                i.mtime = now;
            }
            // Growth by whole chunks leaves holes (`st_blocks`, blocks.rs).
            if size.div_ceil(self.chunk) > i.size.div_ceil(self.chunk) {
                i.flags |= crate::inode::MAY_HAVE_HOLES;
            }
            i.size = size;
        }
        let at = |t: SetTime| match t {
            SetTime::At(t) => t,
            SetTime::Now => now,
        };
        if let Some(t) = set.atime {
            i.atime = at(t);
        }
        if let Some(t) = set.mtime {
            i.mtime = at(t);
        }
        i.ctime = set.ctime.unwrap_or(now);
        let out = i.clone();
        txn.commit()?;
        Ok(out)
    }

    /// Clears `ino`'s set-user-ID and set-group-ID bits as a write by a
    /// caller without `CAP_FSETID` does ([`Inode::drop_set_id`]).
    pub fn drop_set_id(&self, ino: u64) -> Result<()> {
        self.writable()?;
        let now = Time::now();
        self.update_cached(ino, |c| {
            if c.inode.drop_set_id() {
                c.inode.ctime = now;
                c.dirty = true;
            }
        })
    }

    /// Sets xattr `name` of `ino` to `value`.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return posix(libc::ERANGE);
        }
        if value.len() > XATTR_VALUE_MAX {
            return posix(libc::E2BIG);
        }
        let (_ns, mut txn) = self.begin();
        let key = self.keys.xattr(ino, name);
        let i = txn.read(ino)?;
        self.settle_keys(&[&key])?;
        let exists = i.flags & HAS_XATTRS != 0 && self.store.get(&key)?.is_some();
        match (mode, exists) {
            (XattrMode::Create, true) => return posix(libc::EEXIST),
            (XattrMode::Replace, false) => return posix(libc::ENODATA),
            _ => {}
        }
        let i = txn.get(ino)?;
        i.flags |= HAS_XATTRS;
        i.ctime = Time::now();
        txn.put(key, value.to_vec());
        txn.commit()
    }

    /// The value of xattr `name` of `ino` (ENODATA if absent).
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.flags & HAS_XATTRS == 0 || name.len() > XATTR_NAME_MAX {
            return posix(libc::ENODATA);
        }
        let key = self.keys.xattr(ino, name);
        self.settle_keys(&[&key])?;
        match self.store.get(&key)? {
            Some(v) => Ok(v.to_vec()),
            None => posix(libc::ENODATA),
        }
    }

    /// The names of `ino`'s xattrs.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let i = self.inode(ino)?;
        if i.flags & HAS_XATTRS == 0 {
            return Ok(Vec::new());
        }
        let (s, e) = self.keys.xattrs(ino);
        let skip = s.len();
        Ok(self
            .list_pairs(&s, &e)?
            .into_iter()
            .map(|(k, _)| k[skip..].to_vec())
            .collect())
    }

    /// Removes xattr `name` of `ino` (ENODATA if absent).
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let (_ns, mut txn) = self.begin();
        let i = txn.read(ino)?;
        let key = self.keys.xattr(ino, name);
        self.settle_keys(&[&key])?;
        if i.flags & HAS_XATTRS == 0 || self.store.get(&key)?.is_none() {
            return posix(libc::ENODATA);
        }
        txn.get(ino)?.ctime = Time::now();
        txn.delete(key);
        txn.commit()
    }
}
