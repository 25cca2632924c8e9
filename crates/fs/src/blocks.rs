//! `st_blocks`: the space a file's data takes, so `du` and `ls -s` see a
//! sparse file's holes, and `cp` and `tar --sparse`, which look for holes
//! (`SEEK_HOLE`, `seek.rs`) only in a file whose blocks are fewer than its
//! size, copy them as holes.
//!
//! Contract: a file without [`MAY_HAVE_HOLES`] is dense, and its blocks
//! are its size (no listing). A file gets the flag, kept in its inode
//! record, when a hole may appear in it: a write starting past the chunk
//! its end was in, a truncation or `fallocate` that grows it by chunks, a
//! punched or zeroed range. For a flagged file the adapter counts the
//! chunks it holds once (one key listing of at most [`COUNT_MAX`] keys;
//! more is taken as dense) and then keeps the count while writes change
//! it: exact for chunks past the old end and for chunks a write read
//! first; a whole chunk overwritten inside the file counts as new, so the
//! count is an upper bound (never above the size's chunks), listed again
//! after a truncation or punched range when the file is small (up to
//! [`RECOUNT_MAX_CHUNKS`]) and kept as the bound otherwise. A file with
//! data never has zero blocks (`tar` archives such a file as all holes):
//! the listing may include chunks deleted a moment ago, never miss one.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::Result;
use crate::filesystem::{for_each_page_while, FileSystem};
use crate::inode::{Inode, Kind, MAY_HAVE_HOLES};

/// Chunk keys one count lists at most (with 8 KiB chunks, 512 MiB of
/// data); a file holding more is counted as dense.
const COUNT_MAX: usize = 1 << 16;
/// Files of at most this many chunks are counted again after chunks were
/// deleted (a listing of a few milliseconds at most).
const RECOUNT_MAX_CHUNKS: u64 = 4096;

/// What the adapter knows of a flagged file's chunks.
enum Held {
    Known(u64),
    /// Being listed; the chunks writes stored meanwhile, added to the
    /// listing's count when it ends (the listing may or may not have seen
    /// them: an upper bound).
    Counting {
        added: u64,
    },
}

/// Chunk counts of flagged files, for this mount's life.
#[derive(Default)]
pub(crate) struct HeldChunks {
    files: Mutex<HashMap<u64, Held>>,
}

impl HeldChunks {
    /// A write stored `added` chunks of `ino` that may be new, its size now
    /// `cap` chunks at most.
    pub(crate) fn added(&self, ino: u64, added: u64, cap: u64) {
        match self.files.lock().get_mut(&ino) {
            Some(Held::Known(n)) => *n = n.saturating_add(added).min(cap),
            Some(Held::Counting { added: a }) => *a = a.saturating_add(added),
            None => {}
        }
    }

    /// `ino` was deleted: forget its count.
    pub(crate) fn forget(&self, ino: u64) {
        self.files.lock().remove(&ino);
    }

    /// Chunks of `ino` were deleted (a truncation, a punched range), and it
    /// is now `chunks` chunks long at most. A file of at most
    /// [`RECOUNT_MAX_CHUNKS`] is counted again when asked; a larger one
    /// keeps its count as an upper bound (cut to its length), since a
    /// listing of tens of thousands of keys at the next attribute request
    /// after each punched range (a VM image's discards) would cost tens of
    /// milliseconds each.
    pub(crate) fn shrunk(&self, ino: u64, chunks: u64) {
        let mut files = self.files.lock();
        if chunks <= RECOUNT_MAX_CHUNKS {
            files.remove(&ino);
        } else if let Some(Held::Known(n)) = files.get_mut(&ino) {
            *n = (*n).min(chunks);
        }
    }

    fn known(&self, ino: u64) -> Option<u64> {
        match self.files.lock().get(&ino) {
            Some(Held::Known(n)) => Some(*n),
            _ => None,
        }
    }

    fn begin_count(&self, ino: u64) {
        self.files
            .lock()
            .entry(ino)
            .or_insert(Held::Counting { added: 0 });
    }

    /// The count of `ino` once `listed` chunks were found; kept unless a
    /// deletion forgot the file meanwhile (then it answers this once).
    fn end_count(&self, ino: u64, listed: u64, cap: u64) -> u64 {
        let mut files = self.files.lock();
        match files.get(&ino) {
            Some(Held::Counting { added }) => {
                let n = listed.saturating_add(*added).min(cap);
                files.insert(ino, Held::Known(n));
                n
            }
            Some(Held::Known(n)) => *n,
            None => listed.min(cap),
        }
    }
}

impl FileSystem {
    /// `st_blocks` of `i` (512-byte units; see the module doc). A count
    /// that fails (a store error) answers the size: never fewer blocks than
    /// the data takes.
    pub fn blocks(&self, i: &Inode) -> u64 {
        let dense = i.size.div_ceil(512);
        if i.kind != Kind::File || i.flags & MAY_HAVE_HOLES == 0 || i.size == 0 {
            return dense;
        }
        let cap = i.size.div_ceil(self.chunk);
        let held = match self.held.known(i.ino) {
            Some(n) => n,
            None => match self.count_chunks(i.ino) {
                Ok(Some(listed)) => self.held.end_count(i.ino, listed, cap),
                Ok(None) => self.held.end_count(i.ino, cap, cap),
                Err(e) => {
                    self.held.forget(i.ino);
                    tracing::warn!(ino = i.ino, error = %e, "cannot count a file's chunks");
                    return dense;
                }
            },
        };
        held.saturating_mul(self.chunk).min(i.size).div_ceil(512)
    }

    /// The chunks `ino` holds, listed (`None` past [`COUNT_MAX`]).
    fn count_chunks(&self, ino: u64) -> Result<Option<u64>> {
        self.held.begin_count(ino);
        let (start, end) = self.keys.chunks_from(ino, 0);
        self.settle_range(&start, &end)?;
        let mut listed = 0usize;
        for_each_page_while(
            &start,
            |from, n| self.store.range_keys(from, &end, n),
            |k| k,
            |page| {
                listed += page.len();
                Ok(listed <= COUNT_MAX)
            },
        )?;
        Ok((listed <= COUNT_MAX).then_some(listed as u64))
    }
}
