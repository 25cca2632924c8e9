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

    /// Records `inode` as the store now holds it (clean), keeping its
    /// growth mark state.
    pub fn stored(&mut self, inode: Inode, growing: bool) {
        let stored_size = inode.size;
        self.map.insert(
            inode.ino,
            Cached {
                inode,
                dirty: false,
                stored_size,
                growing,
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
