//! The adapter's inode cache. One mount owns a file system (the lease), so
//! the cache is authoritative: every metadata change goes to the store and
//! then here, under the file system's metadata lock. A write updates size
//! and times here only and marks the inode dirty; `flush` (close, fsync,
//! unmount, a timer) writes dirty inodes back. Clean entries are dropped
//! when the cache grows past its bound; dirty ones never are.

use std::collections::{BTreeMap, HashMap};

use crate::inode::{Inode, Kind};

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
/// whole under the metadata lock) authoritative misses and listings.
/// Changed only under the metadata lock after the store took the change; a
/// reader that read the store without that lock inserts only if no change
/// happened since it started (`generation`).
#[derive(Default)]
pub struct DentryCache {
    dirs: HashMap<u64, DirEntries>,
    /// Entries held, over all directories.
    len: usize,
    generation: u64,
}

/// The cached entries of one directory, by name.
#[derive(Default)]
struct DirEntries {
    names: BTreeMap<Vec<u8>, (u64, Kind)>,
    /// `names` holds every entry of the directory.
    complete: bool,
}

/// What the cache knows of one name.
pub enum Known {
    Entry(u64, Kind),
    Absent,
    Unknown,
}

impl DentryCache {
    pub fn get(&self, parent: u64, name: &[u8]) -> Known {
        let Some(dir) = self.dirs.get(&parent) else {
            return Known::Unknown;
        };
        match dir.names.get(name) {
            Some(&(ino, kind)) => Known::Entry(ino, kind),
            None if dir.complete => Known::Absent,
            None => Known::Unknown,
        }
    }

    /// Every entry of `dir` in name order (as the store lists them), when
    /// the cache holds them all.
    pub fn list(&self, dir: u64) -> Option<Vec<(Vec<u8>, u64, Kind)>> {
        let d = self.dirs.get(&dir).filter(|d| d.complete)?;
        Some(
            d.names
                .iter()
                .map(|(name, &(ino, kind))| (name.clone(), ino, kind))
                .collect(),
        )
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records an entry read from the store when the read began at
    /// `generation`.
    pub fn learned(&mut self, generation: u64, parent: u64, name: &[u8], ino: u64, kind: Kind) {
        if generation == self.generation {
            self.insert(parent, name, ino, kind);
        }
    }

    pub fn insert(&mut self, parent: u64, name: &[u8], ino: u64, kind: Kind) {
        self.generation += 1;
        if self.len >= MAX_DENTRIES {
            self.clear();
        }
        let dir = self.dirs.entry(parent).or_default();
        if dir.names.insert(name.to_vec(), (ino, kind)).is_none() {
            self.len += 1;
        }
    }

    pub fn remove(&mut self, parent: u64, name: &[u8]) {
        self.generation += 1;
        if let Some(dir) = self.dirs.get_mut(&parent) {
            if dir.names.remove(name).is_some() {
                self.len -= 1;
            }
        }
    }

    /// `dir` has `entries` entries, all inserted: marks it whole, unless
    /// the cache let some of them go meanwhile (it clears itself when
    /// full, so a listing longer than what is left of it is not all here).
    pub fn set_complete(&mut self, dir: u64, entries: usize) {
        let held = self.dirs.get(&dir).map_or(0, |d| d.names.len());
        if held == entries && self.len < MAX_DENTRIES {
            self.dirs.entry(dir).or_default().complete = true;
        }
    }

    /// `dir` is gone.
    pub fn forget_dir(&mut self, dir: u64) {
        self.generation += 1;
        if let Some(d) = self.dirs.remove(&dir) {
            self.len -= d.names.len();
        }
    }

    /// Forgets everything (after a failed change: the store may or may not
    /// hold it).
    pub fn clear(&mut self) {
        self.generation += 1;
        self.dirs.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_directories_answer_misses_and_listings() {
        let mut c = DentryCache::default();
        c.insert(1, b"b", 11, Kind::File);
        c.insert(1, b"a", 10, Kind::Dir);
        assert!(matches!(c.get(1, b"a"), Known::Entry(10, Kind::Dir)));
        assert!(matches!(c.get(1, b"zz"), Known::Unknown));
        assert!(c.list(1).is_none(), "not known to be whole");
        c.set_complete(1, 2);
        assert!(matches!(c.get(1, b"zz"), Known::Absent));
        c.insert(1, b"c", 12, Kind::File);
        c.remove(1, b"b");
        let names: Vec<_> = c
            .list(1)
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(names, [b"a".to_vec(), b"c".to_vec()]);
        c.set_complete(2, 0);
        assert_eq!(
            c.list(2).map(|l| l.len()),
            Some(0),
            "a new directory is empty"
        );
        c.forget_dir(1);
        assert!(matches!(c.get(1, b"a"), Known::Unknown));
        assert!(c.list(1).is_none());
        assert_eq!(c.len, 0);
    }

    #[test]
    fn a_listing_the_cache_could_not_hold_whole_is_not_whole() {
        let mut c = DentryCache::default();
        for i in 0..MAX_DENTRIES - 10 {
            c.insert(1, format!("x{i}").as_bytes(), i as u64 + 100, Kind::File);
        }
        // A listing of directory 2 whose insertion fills the cache, which
        // then clears itself: its first entries are gone.
        for i in 0..50u64 {
            c.insert(2, format!("y{i:02}").as_bytes(), i + 10, Kind::File);
        }
        c.set_complete(2, 50);
        assert!(
            matches!(c.get(2, b"y00"), Known::Unknown),
            "an entry let go must not read as absent"
        );
        assert!(c.list(2).is_none(), "a partial listing is not whole");
    }
}
