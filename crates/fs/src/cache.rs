//! The adapter's inode cache. One mount owns a file system (the lease), so
//! the cache is authoritative: every metadata change goes to the store and
//! then here, under the file system's metadata lock. A write updates size
//! and times here only and marks the inode dirty; `flush` (close, fsync,
//! unmount, a timer) writes dirty inodes back. Clean entries are dropped
//! when the cache grows past its bound; dirty ones never are.

use std::collections::HashMap;

use crate::inode::Inode;

/// Most clean inodes kept.
const MAX_CLEAN: usize = 100_000;

/// A cached inode.
#[derive(Clone, Debug)]
pub struct Cached {
    pub inode: Inode,
    /// Changed here since last written to the store.
    pub dirty: bool,
    /// The size the store's record holds.
    pub stored_size: u64,
    /// The store holds this inode's growth mark (`G`).
    pub growing: bool,
}

/// Inodes by number.
#[derive(Default)]
pub struct InodeCache {
    map: HashMap<u64, Cached>,
}

impl InodeCache {
    pub fn get(&self, ino: u64) -> Option<&Cached> {
        self.map.get(&ino)
    }

    pub fn get_mut(&mut self, ino: u64) -> Option<&mut Cached> {
        self.map.get_mut(&ino)
    }

    /// Records `inode` as the store now holds it: clean, and with no
    /// growth mark known (a committed inode's mark is deleted with it).
    pub fn stored(&mut self, inode: Inode) {
        let stored_size = inode.size;
        self.map.insert(
            inode.ino,
            Cached {
                inode,
                dirty: false,
                stored_size,
                growing: false,
            },
        );
        if self.map.len() > MAX_CLEAN {
            self.map.retain(|_, c| c.dirty);
        }
    }

    pub fn remove(&mut self, ino: u64) {
        self.map.remove(&ino);
    }

    /// Inodes changed here and not yet written.
    pub fn dirty(&self) -> Vec<u64> {
        self.map
            .iter()
            .filter(|(_, c)| c.dirty)
            .map(|(&i, _)| i)
            .collect()
    }
}

/// Most directory entries kept.
const MAX_DENTRIES: usize = 200_000;

/// The adapter's directory-entry cache: positive entries, and for
/// directories whose every entry is known (made by this mount, or listed
/// whole under the metadata lock) authoritative misses. Changed only under
/// the metadata lock after the store took the change; a reader that read
/// the store without that lock inserts only if no change happened since it
/// started (`generation`).
#[derive(Default)]
pub struct DentryCache {
    map: HashMap<(u64, Vec<u8>), (u64, crate::inode::Kind)>,
    complete: std::collections::HashSet<u64>,
    generation: u64,
}

/// What the cache knows of one name.
pub enum Known {
    Entry(u64, crate::inode::Kind),
    Absent,
    Unknown,
}

impl DentryCache {
    pub fn get(&self, parent: u64, name: &[u8]) -> Known {
        match self.map.get(&(parent, name.to_vec())) {
            Some(&(ino, kind)) => Known::Entry(ino, kind),
            None if self.complete.contains(&parent) => Known::Absent,
            None => Known::Unknown,
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records an entry read from the store when the read began at
    /// `generation`.
    pub fn learned(
        &mut self,
        generation: u64,
        parent: u64,
        name: &[u8],
        ino: u64,
        kind: crate::inode::Kind,
    ) {
        if generation == self.generation {
            self.insert(parent, name, ino, kind);
        }
    }

    pub fn insert(&mut self, parent: u64, name: &[u8], ino: u64, kind: crate::inode::Kind) {
        self.generation += 1;
        if self.map.len() >= MAX_DENTRIES {
            self.clear();
        }
        self.map.insert((parent, name.to_vec()), (ino, kind));
    }

    pub fn remove(&mut self, parent: u64, name: &[u8]) {
        self.generation += 1;
        self.map.remove(&(parent, name.to_vec()));
    }

    /// Every entry of `dir` is in the cache (or it has none).
    pub fn set_complete(&mut self, dir: u64) {
        if self.map.len() < MAX_DENTRIES {
            self.complete.insert(dir);
        }
    }

    /// `dir` is gone.
    pub fn forget_dir(&mut self, dir: u64) {
        self.generation += 1;
        self.complete.remove(&dir);
    }

    /// Forgets everything (after a failed change: the store may or may not
    /// hold it).
    pub fn clear(&mut self) {
        self.generation += 1;
        self.map.clear();
        self.complete.clear();
    }
}
