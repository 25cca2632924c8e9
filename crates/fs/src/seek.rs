//! `lseek(2)`'s `SEEK_DATA` and `SEEK_HOLE`, answered from the chunks a
//! file holds, so that `cp`, `tar --sparse`, `qemu-img` and `rsync
//! --sparse` skip a sparse file's holes instead of reading them as zeros.
//!
//! Contract (within what lseek(2) leaves to a file system): a chunk the
//! file holds is data from its start to its end (or to the file's end),
//! even past the last byte written into it; a chunk never written, or
//! punched out, is a hole. An answer may call a hole data, never data a
//! hole, since copiers skip holes: the cluster's key listing may still show
//! a chunk deleted a moment ago (a hole then reads as data), and a
//! `SEEK_HOLE` that meets `HOLE_SCAN_CHUNKS` held chunks in a row answers
//! the file's end, the implicit hole every file ends with. Writes the
//! adapter still buffers are written out first, so they count as data.

use crate::error::{posix, Result};
use crate::filesystem::{for_each_page_while, FileSystem};
use crate::inode::Kind;

/// Held chunks one `SEEK_HOLE` lists at most before it answers the file's
/// end (with 8 KiB chunks, 512 MiB of data in a row).
const HOLE_SCAN_CHUNKS: u64 = 1 << 16;

/// What a seek looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seek {
    /// `SEEK_DATA`: the first byte of data at or after the offset.
    Data,
    /// `SEEK_HOLE`: the first byte of a hole at or after the offset.
    Hole,
}

impl FileSystem {
    /// `lseek(fd, offset, SEEK_DATA | SEEK_HOLE)` on `ino`: the first
    /// offset at or after `offset` that is data (or in a hole, the file's
    /// end counting as one). ENXIO when `offset` is at or past the end, or
    /// when only holes follow it and data was asked for.
    pub fn seek(&self, ino: u64, offset: u64, to: Seek) -> Result<u64> {
        let i = self.inode(ino)?;
        if i.kind == Kind::Dir {
            return posix(libc::EISDIR);
        }
        if offset >= i.size {
            return posix(libc::ENXIO);
        }
        let first = offset / self.chunk;
        let last = (i.size - 1) / self.chunk;
        let (start, _) = self.keys.chunks_from(ino, first);
        let (end, _) = self.keys.chunks_from(ino, last + 1);
        self.settle_range(&start, &end)?;
        match to {
            Seek::Data => {
                let held = self.store.range_keys(&start, &end, 1)?;
                match held.first().and_then(|k| self.keys.chunk_of(k)) {
                    Some((_, c)) => Ok(offset.max(c * self.chunk)),
                    None => posix(libc::ENXIO),
                }
            }
            Seek::Hole => {
                let hole = self.first_missing_chunk(&start, &end, first)?;
                Ok(hole.map_or(i.size, |c| offset.max(c * self.chunk).min(i.size)))
            }
        }
    }

    /// The first chunk index from `first` that the keys in `[start, end)`
    /// (chunk keys of one file, from chunk `first`) do not hold: the one
    /// after the last listed if none is missing before the end, `None`
    /// after [`HOLE_SCAN_CHUNKS`] held chunks in a row.
    fn first_missing_chunk(&self, start: &[u8], end: &[u8], first: u64) -> Result<Option<u64>> {
        let mut expect = first;
        let mut bounded = false;
        for_each_page_while(
            start,
            |from, n| self.store.range_keys(from, end, n),
            |k| k,
            |page| {
                for key in &page {
                    match self.keys.chunk_of(key) {
                        Some((_, c)) if c == expect => expect += 1,
                        _ => return Ok(false),
                    }
                    if expect - first >= HOLE_SCAN_CHUNKS {
                        bounded = true;
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )?;
        Ok((!bounded).then_some(expect))
    }
}
