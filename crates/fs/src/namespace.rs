//! Directory operations. Each is one transaction (`Txn`): the entries,
//! the inodes whose link counts and times change, and reclaim marks are
//! written as one atomic batch, so a crash never leaves a half-done
//! rename, an entry without its inode, or a wrong link count.
//!
//! Permission checks are the kernel's (`default_permissions`); these
//! enforce what it cannot: existence, kinds, emptiness, loops.

use crate::cache::Known;
use crate::error::{posix, FsError, Result};
use crate::filesystem::{FileSystem, Txn};
use crate::inode::{decode_dentry, encode_dentry, Inode, Kind, Time, ROOT};

/// Longest name in a directory.
pub const NAME_MAX: usize = 255;
/// Longest symlink target.
const TARGET_MAX: usize = 4095;

/// Who asks (from the FUSE request).
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// What to make.
#[derive(Clone, Debug)]
pub struct NewNode<'a> {
    pub kind: Kind,
    /// Permission bits (`& 07777`; the kernel applied the umask).
    pub perm: u32,
    pub rdev: u32,
    /// A symlink's target.
    pub target: &'a [u8],
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return posix(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return posix(libc::EINVAL);
    }
    Ok(())
}

/// A directory that still exists (ENOTDIR, ENOENT).
fn live_dir(txn: &mut Txn<'_>, ino: u64) -> Result<()> {
    let d = txn.get(ino)?;
    if d.kind != Kind::Dir {
        return posix(libc::ENOTDIR);
    }
    if d.nlink == 0 {
        return posix(libc::ENOENT);
    }
    Ok(())
}

fn touch_dir(txn: &mut Txn<'_>, ino: u64, now: Time) -> Result<()> {
    let d = txn.get(ino)?;
    d.mtime = now;
    d.ctime = now;
    Ok(())
}

impl FileSystem {
    /// The entry `name` of `parent`: (ino, kind), or ENOENT.
    pub fn lookup_entry(&self, parent: u64, name: &[u8]) -> Result<(u64, Kind)> {
        if name.len() > NAME_MAX {
            return posix(libc::ENAMETOOLONG);
        }
        let generation = {
            let d = self.dentries.lock();
            match d.get(parent, name) {
                Known::Entry(ino, kind) => return Ok((ino, kind)),
                Known::Absent => return posix(libc::ENOENT),
                Known::Unknown => d.generation(),
            }
        };
        let key = self.keys.dentry(parent, name);
        self.settle_keys(&[&key])?;
        match self.store.get(&key)? {
            Some(v) => {
                let (ino, kind) = decode_dentry(&v)?;
                self.dentries
                    .lock()
                    .learned(generation, parent, name, ino, kind);
                Ok((ino, kind))
            }
            None => posix(libc::ENOENT),
        }
    }

    /// Whether `parent` has an entry `name`.
    fn has_entry(&self, parent: u64, name: &[u8]) -> Result<bool> {
        match self.lookup_entry(parent, name) {
            Ok(_) => Ok(true),
            Err(FsError::Posix(e)) if e.0 == libc::ENOENT => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The inode `name` names in `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Inode> {
        let (ino, _) = self.lookup_entry(parent, name)?;
        self.inode(ino)
    }

    /// Makes `name` in `parent`: a file, directory, symlink or special file.
    pub fn make(
        &self,
        caller: Caller,
        parent: u64,
        name: &[u8],
        new: NewNode<'_>,
    ) -> Result<Inode> {
        check_name(name)?;
        if new.target.len() > TARGET_MAX {
            return posix(libc::ENAMETOOLONG);
        }
        let (_ns, mut txn) = self.begin();
        live_dir(&mut txn, parent)?;
        if self.has_entry(parent, name)? {
            return posix(libc::EEXIST);
        }
        let p = txn.read(parent)?;
        let mut perm = (new.perm & 0o7777) as u16;
        let mut gid = caller.gid;
        // A set-gid directory passes on its group (and, to directories,
        // the set-gid bit).
        if p.perm & libc::S_ISGID as u16 != 0 {
            gid = p.gid;
            if new.kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        let ino = self.alloc_ino()?;
        let mut inode = Inode::new(ino, new.kind, perm, caller.uid, gid);
        inode.rdev = new.rdev;
        if new.kind == Kind::Symlink {
            inode.target = new.target.to_vec();
            inode.size = new.target.len() as u64;
        }
        if new.kind == Kind::Dir {
            inode.parent = parent;
            txn.get(parent)?.nlink += 1;
        }
        touch_dir(&mut txn, parent, inode.ctime)?;
        txn.put(
            self.keys.dentry(parent, name),
            encode_dentry(ino, new.kind).to_vec(),
        );
        txn.create(inode.clone());
        txn.commit()?;
        let mut d = self.dentries.lock();
        d.insert(parent, name, ino, new.kind);
        if new.kind == Kind::Dir {
            d.set_complete(ino, 0);
        }
        Ok(inode)
    }

    /// Removes the entry `name` of `parent` that names a non-directory.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        let (ns, mut txn) = self.begin();
        live_dir(&mut txn, parent)?;
        let (ino, kind) = self.lookup_entry(parent, name)?;
        if kind == Kind::Dir {
            return posix(libc::EISDIR);
        }
        let now = Time::now();
        txn.delete(self.keys.dentry(parent, name));
        self.drop_link(&mut txn, ino, now)?;
        touch_dir(&mut txn, parent, now)?;
        let orphaned = txn.read(ino)?.nlink == 0;
        txn.commit()?;
        self.dentries.lock().remove(parent, name);
        drop(ns);
        if orphaned {
            self.reclaim_later(ino)?;
        }
        Ok(())
    }

    /// One link fewer to non-directory `ino`; at zero it is marked for
    /// reclaim (its data goes once no handle has it open).
    fn drop_link(&self, txn: &mut Txn<'_>, ino: u64, now: Time) -> Result<()> {
        let i = txn.get(ino)?;
        i.nlink = i.nlink.saturating_sub(1);
        i.ctime = now;
        if i.nlink == 0 {
            txn.put(self.keys.orphan(ino), Vec::new());
        }
        Ok(())
    }

    /// Whether directory `ino` has no entries.
    fn is_empty_dir(&self, ino: u64) -> Result<bool> {
        let (s, e) = self.keys.dentries(ino);
        self.settle_range(&s, &e)?;
        Ok(self.store.range(&s, &e, 1)?.is_empty())
    }

    /// Deletes directory `ino` (empty) from `txn`, with its xattrs.
    fn drop_dir(&self, txn: &mut Txn<'_>, ino: u64) -> Result<()> {
        let (xs, xe) = self.keys.xattrs(ino);
        for (k, _) in self.list_pairs(&xs, &xe)? {
            txn.delete(k);
        }
        txn.remove(ino);
        Ok(())
    }

    /// Removes the empty directory `name` of `parent`.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        let (_ns, mut txn) = self.begin();
        live_dir(&mut txn, parent)?;
        let (ino, kind) = self.lookup_entry(parent, name)?;
        if kind != Kind::Dir {
            return posix(libc::ENOTDIR);
        }
        if !self.is_empty_dir(ino)? {
            return posix(libc::ENOTEMPTY);
        }
        txn.delete(self.keys.dentry(parent, name));
        self.drop_dir(&mut txn, ino)?;
        let p = txn.get(parent)?;
        p.nlink = p.nlink.saturating_sub(1);
        touch_dir(&mut txn, parent, Time::now())?;
        txn.commit()?;
        let mut d = self.dentries.lock();
        d.remove(parent, name);
        d.forget_dir(ino);
        Ok(())
    }

    /// A new name `newname` in `newparent` for non-directory `ino`.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Inode> {
        check_name(newname)?;
        let (_ns, mut txn) = self.begin();
        live_dir(&mut txn, newparent)?;
        let i = txn.read(ino)?;
        if i.kind == Kind::Dir {
            return posix(libc::EPERM);
        }
        if i.nlink == 0 {
            return posix(libc::ENOENT);
        }
        if i.nlink >= u32::from(u16::MAX) {
            return posix(libc::EMLINK);
        }
        if self.has_entry(newparent, newname)? {
            return posix(libc::EEXIST);
        }
        let now = Time::now();
        let i = txn.get(ino)?;
        i.nlink += 1;
        i.ctime = now;
        let kind = i.kind;
        touch_dir(&mut txn, newparent, now)?;
        txn.put(
            self.keys.dentry(newparent, newname),
            encode_dentry(ino, kind).to_vec(),
        );
        let kind = txn.read(ino)?.kind;
        let out = txn.read(ino)?;
        txn.commit()?;
        self.dentries.lock().insert(newparent, newname, ino, kind);
        Ok(out)
    }

    /// Whether `dir` is `ancestor` or lies below it (walking `..`).
    fn is_within(&self, txn: &mut Txn<'_>, mut dir: u64, ancestor: u64) -> Result<bool> {
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT {
                return Ok(false);
            }
            dir = txn.read(dir)?.parent;
        }
        Err(FsError::Corrupt(format!(
            "directory {dir}: parent chain loops"
        )))
    }

    /// Renames `parent/name` to `newparent/newname`: replacing what is
    /// there (default), never (`noreplace`), or swapping the two
    /// (`exchange`).
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> Result<()> {
        check_name(newname)?;
        let (ns, mut txn) = self.begin();
        live_dir(&mut txn, parent)?;
        live_dir(&mut txn, newparent)?;
        let (src, src_kind) = self.lookup_entry(parent, name)?;
        let dst = match self.lookup_entry(newparent, newname) {
            Ok(d) => Some(d),
            Err(FsError::Posix(e)) if e.0 == libc::ENOENT => None,
            Err(e) => return Err(e),
        };
        if exchange && dst.is_none() {
            return posix(libc::ENOENT);
        }
        if noreplace && dst.is_some() {
            return posix(libc::EEXIST);
        }
        if dst.is_some_and(|(d, _)| d == src) {
            return Ok(());
        }
        // A directory cannot move below itself.
        if src_kind == Kind::Dir
            && parent != newparent
            && self.is_within(&mut txn, newparent, src)?
        {
            return posix(libc::EINVAL);
        }
        if let Some((d, Kind::Dir)) = dst {
            if exchange && parent != newparent && self.is_within(&mut txn, parent, d)? {
                return posix(libc::EINVAL);
            }
        }
        let now = Time::now();
        let src_entry = encode_dentry(src, src_kind).to_vec();
        if exchange {
            let (d, d_kind) = dst.ok_or(FsError::Posix(crate::error::Errno(libc::ENOENT)))?;
            txn.put(
                self.keys.dentry(parent, name),
                encode_dentry(d, d_kind).to_vec(),
            );
            txn.put(self.keys.dentry(newparent, newname), src_entry);
            self.moved(&mut txn, src, src_kind, parent, newparent, now)?;
            self.moved(&mut txn, d, d_kind, newparent, parent, now)?;
        } else {
            if let Some((d, d_kind)) = dst {
                match (src_kind == Kind::Dir, d_kind == Kind::Dir) {
                    (true, false) => return posix(libc::ENOTDIR),
                    (false, true) => return posix(libc::EISDIR),
                    (true, true) => {
                        if !self.is_empty_dir(d)? {
                            return posix(libc::ENOTEMPTY);
                        }
                        self.drop_dir(&mut txn, d)?;
                        let np = txn.get(newparent)?;
                        np.nlink = np.nlink.saturating_sub(1);
                    }
                    (false, false) => self.drop_link(&mut txn, d, now)?,
                }
            }
            txn.delete(self.keys.dentry(parent, name));
            txn.put(self.keys.dentry(newparent, newname), src_entry);
            self.moved(&mut txn, src, src_kind, parent, newparent, now)?;
        }
        touch_dir(&mut txn, parent, now)?;
        touch_dir(&mut txn, newparent, now)?;
        let orphan = match dst {
            Some((d, k)) if !exchange && k != Kind::Dir => txn.read(d)?.nlink == 0,
            _ => false,
        };
        txn.commit()?;
        {
            let mut cache = self.dentries.lock();
            if exchange {
                if let Some((d, d_kind)) = dst {
                    cache.insert(parent, name, d, d_kind);
                }
            } else {
                cache.remove(parent, name);
                if let Some((d, Kind::Dir)) = dst {
                    cache.forget_dir(d);
                }
            }
            cache.insert(newparent, newname, src, src_kind);
        }
        drop(ns);
        if let (true, Some((d, _))) = (orphan, dst) {
            self.reclaim_later(d)?;
        }
        Ok(())
    }

    /// `ino` now lives in `to` instead of `from`: its ctime, and for a
    /// directory its `..` and both parents' link counts.
    fn moved(
        &self,
        txn: &mut Txn<'_>,
        ino: u64,
        kind: Kind,
        from: u64,
        to: u64,
        now: Time,
    ) -> Result<()> {
        let i = txn.get(ino)?;
        i.ctime = now;
        if kind == Kind::Dir && from != to {
            i.parent = to;
            let f = txn.get(from)?;
            f.nlink = f.nlink.saturating_sub(1);
            txn.get(to)?.nlink += 1;
        }
        Ok(())
    }

    /// The entries of directory `ino` (without `.` and `..`), in name
    /// order: (name, ino, kind).
    pub fn list_dir(&self, ino: u64) -> Result<Vec<(Vec<u8>, u64, Kind)>> {
        let (s, e) = self.keys.dentries(ino);
        let skip = self.keys.dentry_prefix_len();
        // Under the metadata lock, so the listing is whole and the cache
        // may call the directory complete.
        let _ns = self.ns.lock();
        if let Some(cached) = self.dentries.lock().list(ino) {
            return Ok(cached);
        }
        let entries = self
            .list_pairs(&s, &e)?
            .into_iter()
            .map(|(k, v)| {
                let (child, kind) = decode_dentry(&v)?;
                Ok((k[skip..].to_vec(), child, kind))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut d = self.dentries.lock();
        for (name, child, kind) in &entries {
            d.insert(ino, name, *child, *kind);
        }
        d.set_complete(ino, entries.len());
        Ok(entries)
    }

    /// A symlink's target.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.kind != Kind::Symlink {
            return posix(libc::EINVAL);
        }
        Ok(i.target)
    }
}
