//! File contents: chunked reads and writes, truncation.
//!
//! Contract: a chunk stores the file's bytes from its start up to the last
//! byte written, never past the file's size (what a truncation cut off is
//! deleted before the size shrinks). A write stores its chunks first and
//! then grows the size in the cache (written back on close, fsync, a timer
//! or unmount); before the first write past the stored size it records the
//! file's growth mark, so after a crash the next open drops any chunk
//! bytes past the stored size and later growth reads zeros, not old data.

use crate::cache::Cached;
use crate::error::{posix, Result};
use crate::filesystem::FileSystem;
use crate::inode::{Kind, Time, MAY_HAVE_HOLES};
use crate::writebehind::{write_ops, Change};

/// Largest file size: the kernel's own limit for FUSE (`MAX_LFS_FILESIZE`).
/// It must not be lower: with the writeback cache the kernel accepts a
/// write up to its limit into the page cache, and a refusal here would
/// only come at writeback, as pages dropped with an EIO on close.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Most bytes one [`FileSystem::copy_range`] call copies (callers loop, as
/// they do for a short write), the piece read and written at a time, and
/// how many pieces are copied at once (one after another, a piece's read
/// and write each waited for the cluster: slower than the kernel's own
/// copy through read-ahead and write-back).
const COPY_MAX: u64 = 256 << 20;
const COPY_PIECE: u64 = 2 << 20;
const COPY_THREADS: usize = 4;
const COPY_MIN_HOLE: u64 = 256 << 10;

/// A part of a copy: `len` bytes at `at` (relative to the copy's start),
/// read and written, or where the source is a hole, punched.
#[derive(Clone, Copy)]
struct Piece {
    at: u64,
    len: u64,
    hole: bool,
}

impl FileSystem {
    /// `copy_file_range(2)`: copies up to `len` bytes of `from` at `from_at`
    /// to `to` at `to_at`, inside the adapter (no data crosses FUSE, and
    /// the kernel keeps no copy in its page cache), stopping at the
    /// source's end; returns the bytes copied, at most `COPY_MAX`. Where
    /// the source has no chunks (found by listing them) the destination
    /// gets a hole, so a sparse file stays sparse and its holes cost
    /// nothing to copy. The kernel has refused overlapping ranges of one
    /// file and written back the source's cached pages first.
    pub fn copy_range(
        &self,
        from: u64,
        from_at: u64,
        to: u64,
        to_at: u64,
        len: u64,
    ) -> Result<u64> {
        let size = self.inode(from)?.size;
        let total = len.min(size.saturating_sub(from_at)).min(COPY_MAX);
        if total == 0 {
            return Ok(0);
        }
        let pieces = self.copy_pieces(from, from_at, total)?;
        let next = std::sync::atomic::AtomicUsize::new(0);
        // Per piece, whether it was copied whole (a read comes back short
        // only if the source shrank meanwhile).
        let whole = parking_lot::Mutex::new(vec![false; pieces.len()]);
        let work = || -> Result<()> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = pieces.get(i) else {
                    return Ok(());
                };
                if p.hole {
                    self.fallocate(to, to_at + p.at, p.len, libc::FALLOC_FL_PUNCH_HOLE)?;
                } else {
                    let data = self.read(from, from_at + p.at, p.len as u32)?;
                    self.write(to, to_at + p.at, &data)?;
                    if (data.len() as u64) < p.len {
                        continue;
                    }
                }
                whole.lock()[i] = true;
            }
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = (1..COPY_THREADS.min(pieces.len()))
                .map(|_| scope.spawn(work))
                .collect();
            let mut result = work();
            for w in workers {
                let r = w.join().unwrap_or_else(|_| {
                    Err(crate::error::FsError::Corrupt(
                        "a copy thread panicked".into(),
                    ))
                });
                result = result.and(r);
            }
            result
        })?;
        // What the call reports: the pieces copied whole from its start.
        let whole = whole.into_inner();
        let copied = pieces.iter().zip(&whole).take_while(|(_, w)| **w);
        Ok(copied.map(|(p, _)| p.len).sum())
    }

    /// `total` bytes of `from` at `from_at` cut into pieces: where the
    /// source holds chunks, pieces of at most [`COPY_PIECE`]; each run of
    /// chunks it does not hold, one hole piece however long (runs shorter
    /// than [`COPY_MIN_HOLE`] are copied as data, zeros included, rather
    /// than cutting the copy into many small pieces).
    fn copy_pieces(&self, from: u64, from_at: u64, total: u64) -> Result<Vec<Piece>> {
        let (start_key, _) = self.keys.chunks_from(from, from_at / self.chunk);
        let (end_key, _) = self
            .keys
            .chunks_from(from, (from_at + total).div_ceil(self.chunk));
        let keys = self.list_keys(&start_key, &end_key)?;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut add = |at: u64, end: u64, hole: bool| {
            if at >= end {
                return;
            }
            match pieces.last_mut() {
                Some(last)
                    if last.hole == hole && (hole || last.len + (end - at) <= COPY_PIECE) =>
                {
                    last.len += end - at
                }
                _ => pieces.push(Piece {
                    at,
                    len: end - at,
                    hole,
                }),
            }
        };
        // Copy-relative bytes done so far.
        let mut at = 0;
        for c in keys
            .iter()
            .filter_map(|k| self.keys.chunk_of(k).map(|(_, index)| index))
        {
            let a = (c * self.chunk).saturating_sub(from_at).min(total);
            let b = ((c + 1) * self.chunk).saturating_sub(from_at).min(total);
            add(at, a, a - at >= COPY_MIN_HOLE);
            // Data: in pieces of at most COPY_PIECE (a chunk may be larger).
            let mut x = a.max(at);
            while x < b {
                let y = b.min(x + COPY_PIECE);
                add(x, y, false);
                x = y;
            }
            at = at.max(b);
        }
        add(at, total, true);
        Ok(pieces)
    }

    /// Up to `size` bytes of `ino` from `offset` (fewer at the end).
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        if i.kind == Kind::Dir {
            return posix(libc::EISDIR);
        }
        if offset >= i.size || size == 0 {
            return Ok(Vec::new());
        }
        let end = i.size.min(offset.saturating_add(u64::from(size)));
        // Filled chunk by chunk, in order: each chunk's bytes copied once,
        // zeros written only where a chunk is missing or short (the whole
        // buffer zeroed first cost a tenth of a sequential read's CPU).
        let mut out = Vec::with_capacity((end - offset) as usize);
        let first = offset / self.chunk;
        let last = (end - 1) / self.chunk;
        let keys: Vec<Vec<u8>> = (first..=last).map(|c| self.keys.chunk(ino, c)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let values = self.store.mget_sized(&refs, self.chunk as usize)?;
        for (c, value) in (first..=last).zip(values) {
            let start = c * self.chunk;
            // The part of this chunk the read covers, chunk-relative.
            let lo = offset.max(start) - start;
            let covered = end.min(start + self.chunk) - start;
            if let Some(value) = value {
                let hi = covered.min(value.len() as u64);
                if lo < hi {
                    out.extend_from_slice(&value[lo as usize..hi as usize]);
                }
            }
            out.resize((start + covered - offset) as usize, 0);
        }
        debug_assert_eq!(out.len() as u64, end - offset);
        Ok(out)
    }

    /// Writes `data` to `ino` at `offset`.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        let end = match offset.checked_add(data.len() as u64) {
            Some(e) if e <= MAX_FILE_SIZE => e,
            _ => return posix(libc::EFBIG),
        };
        if data.is_empty() {
            return Ok(());
        }
        self.writable()?;
        let first = offset / self.chunk;
        let last = (end - 1) / self.chunk;
        // Other chunks of the file may be written meanwhile; the size is
        // read under the locks, after any write to these chunks finished.
        let _locks = self.write_locks(ino, first, last);
        let i = self.inode(ino)?;
        if i.kind == Kind::Dir {
            return posix(libc::EISDIR);
        }
        // The inode (a create may still be queued) reaches the store
        // before its data: no chunk is ever left without an inode.
        self.settle_keys(&[&self.keys.inode(ino)])?;
        self.mark_growing(ino, end)?;
        let size = i.size;
        // Chunks this write covers only in part, holding bytes to keep.
        let partial: Vec<u64> = [first, last]
            .into_iter()
            .filter(|&c| {
                let start = c * self.chunk;
                let keep_end = (start + self.chunk).min(size);
                start < size && !(offset <= start && end >= keep_end)
            })
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        let old_keys: Vec<Vec<u8>> = partial.iter().map(|&c| self.keys.chunk(ino, c)).collect();
        let refs: Vec<&[u8]> = old_keys.iter().map(|k| &k[..]).collect();
        let old = if refs.is_empty() {
            Vec::new()
        } else {
            self.store.mget(&refs)?
        };
        // A chunk that keeps stored bytes, or that the write starts inside
        // (past the old end: zeros before it), is written from a buffer;
        // one the write covers from its start goes straight from `data`.
        let covers = |c: u64| {
            let start = c * self.chunk;
            let lo = (offset.max(start) - start) as usize;
            let hi = (end.min(start + self.chunk) - start) as usize;
            (start, lo, hi, (start + lo as u64 - offset) as usize)
        };
        let mut merged: Vec<(u64, Vec<u8>)> = Vec::new();
        for c in first..=last {
            let (start, lo, hi, from) = covers(c);
            let kept = partial.iter().position(|&p| p == c);
            if kept.is_none() && lo == 0 {
                continue;
            }
            let mut value = kept
                .and_then(|at| old[at].as_ref().map(|v| v.to_vec()))
                .unwrap_or_default();
            // Never keep stored bytes past the size (see the module doc).
            value.truncate(size.saturating_sub(start).min(self.chunk) as usize);
            if value.len() < hi {
                value.resize(hi, 0);
            }
            value[lo..hi].copy_from_slice(&data[from..from + (hi - lo)]);
            merged.push((c, value));
        }
        let keys: Vec<Vec<u8>> = (first..=last).map(|c| self.keys.chunk(ino, c)).collect();
        let ops: Vec<(&[u8], Option<&[u8]>)> = (first..=last)
            .zip(&keys)
            .map(|(c, key)| {
                let value = match merged.iter().find(|(m, _)| *m == c) {
                    Some((_, v)) => &v[..],
                    None => {
                        let (_, lo, hi, from) = covers(c);
                        &data[from..from + (hi - lo)]
                    }
                };
                (&key[..], Some(value))
            })
            .collect();
        self.store.write(&ops)?;
        // For `st_blocks` (blocks.rs): a chunk the write read is new if it
        // was missing; one it covers whole is new past the old end and may
        // have been a hole inside it. A write starting past the chunk the
        // old end was in leaves holes.
        let added = (first..=last)
            .filter(|&c| {
                partial
                    .iter()
                    .position(|&p| p == c)
                    .is_none_or(|at| old[at].is_none())
            })
            .count() as u64;
        let old_chunks = size.div_ceil(self.chunk);
        let now = Time::now();
        self.update_cached(ino, |c| {
            c.inode.size = c.inode.size.max(end);
            c.inode.mtime = now;
            c.inode.ctime = now;
            if first > old_chunks {
                c.inode.flags |= MAY_HAVE_HOLES;
            }
            c.dirty = true;
        })?;
        self.held
            .added(ino, added, end.max(size).div_ceil(self.chunk));
        Ok(())
    }

    /// `fallocate(2)`: mode 0 and `FALLOC_FL_KEEP_SIZE` grow the size (no
    /// space is reserved: the cluster allocates on write);
    /// `FALLOC_FL_PUNCH_HOLE` and `FALLOC_FL_ZERO_RANGE` make the range
    /// read zeros (whole chunks deleted, partial ones rewritten). Other
    /// modes: EOPNOTSUPP.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return posix(libc::EOPNOTSUPP);
        }
        let end = match offset.checked_add(len) {
            Some(e) if e <= MAX_FILE_SIZE && len > 0 => e,
            Some(_) if len == 0 => return posix(libc::EINVAL),
            _ => return posix(libc::EFBIG),
        };
        self.writable()?;
        let _data = self.data_lock(ino);
        let i = self.inode(ino)?;
        if i.kind != Kind::File {
            return posix(if i.kind == Kind::Dir {
                libc::EISDIR
            } else {
                libc::ENODEV
            });
        }
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if zero {
            self.zero_range(ino, offset, end.min(i.size), i.size)?;
            self.held.shrunk(ino, i.size.div_ceil(self.chunk));
        }
        let grow = mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > i.size;
        if zero || grow {
            let now = Time::now();
            // Growth by whole chunks and punched ranges leave holes.
            let holes = zero || end.div_ceil(self.chunk) > i.size.div_ceil(self.chunk);
            self.update_cached(ino, |c| {
                if grow {
                    c.inode.size = c.inode.size.max(end);
                }
                if holes {
                    c.inode.flags |= MAY_HAVE_HOLES;
                }
                c.inode.mtime = now;
                c.inode.ctime = now;
                c.dirty = true;
            })?;
            self.flush_inode(ino)?;
        }
        Ok(())
    }

    /// Makes `[start, end)` of `ino` (size `size`) read zeros: the chunks
    /// it covers whole are deleted, found by listing (a hole punched
    /// through a large sparse file costs what the file holds there, not
    /// its length), and the chunks at either end rewritten.
    fn zero_range(&self, ino: u64, start: u64, end: u64, size: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let first = start / self.chunk;
        let last = (end - 1) / self.chunk;
        // The last chunk of the file counts as whole once the range reaches
        // the size: nothing is stored past it.
        let whole = |c: u64| {
            let cs = c * self.chunk;
            start <= cs && end >= (cs + self.chunk).min(size)
        };
        let mut ops: Change = Vec::new();
        for c in if first == last {
            vec![first]
        } else {
            vec![first, last]
        } {
            if whole(c) {
                continue;
            }
            let cs = c * self.chunk;
            let key = self.keys.chunk(ino, c);
            let Some(old) = self.store.get(&key)? else {
                continue;
            };
            let mut v = old.to_vec();
            let lo = (start.max(cs) - cs) as usize;
            let hi = ((end.min(cs + self.chunk) - cs) as usize).min(v.len());
            if lo < hi {
                v[lo..hi].fill(0);
                ops.push((key, Some(v)));
            }
        }
        self.store.write(&write_ops(&ops))?;
        let from = if whole(first) { first } else { first + 1 };
        let to = if whole(last) { last + 1 } else { last };
        if from < to {
            self.delete_listed(&self.keys.chunk(ino, from), &self.keys.chunk(ino, to))?;
        }
        Ok(())
    }

    /// Records the growth mark of `ino` before it grows past its stored
    /// size to `end`.
    fn mark_growing(&self, ino: u64, end: u64) -> Result<()> {
        let needed = self
            .cache
            .lock()
            .get(ino)
            .is_none_or(|c| !c.growing && end > c.stored_size);
        if needed {
            self.store.put(&self.keys.growing(ino), b"")?;
            self.update_cached(ino, |c| c.growing = true)?;
        }
        Ok(())
    }

    /// Changes the cached inode `ino` (loading it first if needed) under
    /// the metadata lock.
    pub(crate) fn update_cached(&self, ino: u64, f: impl FnOnce(&mut Cached)) -> Result<()> {
        let _ns = self.ns.lock();
        for _ in 0..3 {
            if let Some(c) = self.cache.lock().get_mut(ino) {
                f(c);
                return Ok(());
            }
            self.inode(ino)?;
        }
        Err(crate::error::FsError::Corrupt(format!(
            "inode {ino} keeps leaving the cache"
        )))
    }

    /// Deletes the bytes of `ino` from `size` on (chunks past it, the tail
    /// of the one it ends in).
    pub(crate) fn drop_data_past(&self, ino: u64, size: u64) -> Result<()> {
        let (s, e) = self.keys.chunks_from(ino, size.div_ceil(self.chunk));
        self.delete_listed(&s, &e)?;
        let within = size % self.chunk;
        if within != 0 {
            let key = self.keys.chunk(ino, size / self.chunk);
            if let Some(v) = self.store.get(&key)? {
                if v.len() as u64 > within {
                    self.store.put(&key, &v[..within as usize])?;
                }
            }
        }
        Ok(())
    }
}
