//! A volume as a block device over a [`Store`]: byte ranges mapped to
//! fixed-size chunks. A chunk never written (or trimmed) is absent and
//! reads as zeros; writes of whole chunks store them as they are, writes
//! of part of a chunk read it, patch it and store it back (read-modify-
//! write) under the chunk's stripe lock, so two requests writing different
//! parts of one chunk both survive. Every write takes the stripe locks of
//! all its chunks, in ascending order, so it never interleaves with a
//! read-modify-write of the same chunk. A chunk that becomes all zeros is
//! deleted rather than stored.
//!
//! The locks are this process's: two adapter processes writing parts of
//! one chunk at once can lose one of the writes. Serve a volume from one
//! adapter at a time (several connections to it are fine).

use std::sync::Arc;

use bytes::Bytes;
use client::lease::Fence;
use client::{Store, WriteOp};
use parking_lot::{Mutex, MutexGuard};

use crate::error::{NbdError, Result};
use crate::volume::{chunk_index, chunk_key, Volume};

/// Stripe locks for read-modify-write of chunks.
const STRIPES: usize = 1024;

/// Zeros that holes are read from (see [`push_zeros`]).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Appends `n` zero bytes to `parts` as slices of [`ZEROS`].
fn push_zeros(parts: &mut Vec<Bytes>, mut n: usize) {
    while n > 0 {
        let k = n.min(ZEROS.len());
        parts.push(Bytes::from_static(&ZEROS[..k]));
        n -= k;
    }
}

/// One chunk's share of a byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    chunk: u64,
    /// Offset inside the chunk.
    at: usize,
    /// Bytes.
    len: usize,
    /// Offset inside the request's buffer.
    buf_at: usize,
}

/// A volume opened for block I/O.
pub struct Blocks {
    store: Arc<dyn Store>,
    vol: Volume,
    stripes: Box<[Mutex<()>]>,
    /// The serving lease's fence: while it does not hold, writes are
    /// refused (another adapter may be writing).
    fence: Option<Fence>,
    /// The losses of acknowledged writes this volume's flushes have
    /// reported (each volume is told of each loss once).
    losses: client::WriterLosses,
}

/// One write (`data`) or zeroing (`None`) of a batch.
#[derive(Clone, Copy, Debug)]
pub struct Patch<'a> {
    /// Byte offset.
    pub offset: u64,
    /// Bytes (`data.len()` for a write).
    pub len: usize,
    /// The bytes to write, or `None` to zero.
    pub data: Option<&'a [u8]>,
    /// Keep the chunks it zeroes stored (WRITE_ZEROES with NO_HOLE): they
    /// must stay allocated, so they are written as zeros, not deleted.
    pub keep: bool,
}

/// Zeroings longer than this run in windows of this size, so memory stays
/// bounded whatever the request's length.
const ZERO_WINDOW: usize = 8 << 20;

/// Chunk keys one listing of a long zeroing asks for (few in tests, so
/// that they page).
const LIST_PAGE: usize = if cfg!(test) { 16 } else { 2048 };

/// Most chunks one BLOCK_STATUS looks at (it may answer less than asked;
/// few in tests, so that they do).
pub const MAX_STATUS_LISTED: usize = if cfg!(test) { 64 } else { 16_384 };

/// Allocation of a byte range, as BLOCK_STATUS reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Bytes.
    pub len: u64,
    /// Never written or trimmed: reads as zeros.
    pub hole: bool,
}

impl Blocks {
    /// Block I/O on `vol`.
    pub fn new(store: Arc<dyn Store>, vol: Volume) -> Blocks {
        Blocks {
            losses: client::WriterLosses::new(store.loss_cursor()),
            store,
            vol,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            fence: None,
        }
    }

    /// Block I/O on `vol` that refuses writes once `fence` no longer
    /// holds (the serving lease was lost).
    pub fn fenced(store: Arc<dyn Store>, vol: Volume, fence: Fence) -> Blocks {
        Blocks {
            fence: Some(fence),
            ..Blocks::new(store, vol)
        }
    }

    /// Whether writes are taken: no lease to lose, or it is still held.
    pub fn holds_lease(&self) -> bool {
        self.fence.as_ref().is_none_or(Fence::holds)
    }

    /// Refuses writes once the serving lease is lost.
    fn check_lease(&self) -> Result<()> {
        if self.holds_lease() {
            return Ok(());
        }
        Err(NbdError::Held(format!(
            "volume {} was taken over by another adapter, or its lease could not be renewed: writes refused",
            self.vol.name
        )))
    }

    /// The volume.
    pub fn volume(&self) -> &Volume {
        &self.vol
    }

    fn chunk_size(&self) -> usize {
        self.vol.chunk_size as usize
    }

    /// The pieces of `[offset, offset + len)`; the caller checked bounds.
    fn pieces(&self, offset: u64, len: usize) -> Vec<Piece> {
        let cs = self.vol.chunk_size as u64;
        let mut out = Vec::with_capacity(len / self.chunk_size() + 2);
        let mut pos = offset;
        let end = offset + len as u64;
        while pos < end {
            let chunk = pos / cs;
            let at = (pos % cs) as usize;
            let n = ((cs - at as u64).min(end - pos)) as usize;
            out.push(Piece {
                chunk,
                at,
                len: n,
                buf_at: (pos - offset) as usize,
            });
            pos += n as u64;
        }
        out
    }

    fn lock(&self, pieces: &[Piece]) -> Vec<MutexGuard<'_, ()>> {
        let mut ids: Vec<usize> = pieces
            .iter()
            .map(|p| (p.chunk % STRIPES as u64) as usize)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        Ok(self.read_many(&[(offset, len)])?.pop().unwrap_or_default())
    }

    /// Reads several `(offset, len)` ranges with one multi-get for all
    /// their chunks (a chunk two ranges share is fetched once), each range
    /// joined into one buffer ([`Self::read_many_parts`] leaves it in pieces).
    pub fn read_many(&self, ranges: &[(u64, usize)]) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .read_many_parts(ranges)?
            .into_iter()
            .map(|parts| parts.concat())
            .collect())
    }

    /// Reads several `(offset, len)` ranges with one multi-get for all their
    /// chunks, each range as the pieces that make it up, in order: slices
    /// of the values the store returned (no copy) and, for holes, slices
    /// of a static block of zeros (no allocation).
    pub fn read_many_parts(&self, ranges: &[(u64, usize)]) -> Result<Vec<Vec<Bytes>>> {
        let pieces: Vec<Vec<Piece>> = ranges.iter().map(|&(o, l)| self.pieces(o, l)).collect();
        let mut chunks: Vec<u64> = pieces.iter().flatten().map(|p| p.chunk).collect();
        chunks.sort_unstable();
        chunks.dedup();
        let keys: Vec<Vec<u8>> = chunks.iter().map(|&c| chunk_key(self.vol.id, c)).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let values = self.store.mget_sized(&refs, self.chunk_size())?;
        let mut out = Vec::with_capacity(ranges.len());
        for ps in &pieces {
            let mut parts = Vec::with_capacity(ps.len());
            for p in ps {
                let value = chunks
                    .binary_search(&p.chunk)
                    .ok()
                    .and_then(|i| values[i].as_ref());
                // A hole reads zeros; so does a short chunk past its end
                // (never written so, but tolerated).
                let have = value.map_or(0, |c| c.len().saturating_sub(p.at).min(p.len));
                if let Some(c) = value.filter(|_| have > 0) {
                    parts.push(c.slice(p.at..p.at + have));
                }
                push_zeros(&mut parts, p.len - have);
            }
            out.push(parts);
        }
        Ok(out)
    }

    /// Writes `data` at `offset`; with `fua`, durable when it returns.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.apply_many(&[Patch {
            offset,
            len: data.len(),
            data: Some(data),
            keep: false,
        }])?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Zeros `len` bytes at `offset` (WRITE_ZEROES and TRIM): whole chunks
    /// are deleted (stored as zeros with `keep`), parts of chunks zeroed in
    /// place. A long range that need not stay allocated touches only the
    /// chunks a listing finds stored, so its cost follows what the volume
    /// holds there, not its length (`mkfs` trims the whole device first).
    pub fn zero(&self, offset: u64, len: usize, fua: bool, keep: bool) -> Result<()> {
        self.check_lease()?;
        if keep || len <= ZERO_WINDOW {
            self.zero_in_windows(offset, len, keep)?;
        } else {
            self.zero_listed(offset, len)?;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Zeros `[offset, offset + len)` chunk by chunk, in windows of
    /// [`ZERO_WINDOW`] bytes.
    fn zero_in_windows(&self, offset: u64, len: usize, keep: bool) -> Result<()> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZERO_WINDOW);
            self.apply_many(&[Patch {
                offset: offset + done as u64,
                len: n,
                data: None,
                keep,
            }])?;
            done += n;
        }
        Ok(())
    }

    /// Zeros `[offset, offset + len)` without keeping it allocated: the
    /// chunks at either end in part, and of the whole chunks between them
    /// those a listing shows, each group of neighbours as one zeroing of
    /// at most [`ZERO_WINDOW`] bytes (which checks what each chunk holds
    /// before it deletes: a listing may show chunks deleted recently).
    fn zero_listed(&self, offset: u64, len: usize) -> Result<()> {
        let cs = u64::from(self.vol.chunk_size);
        let end = offset + len as u64;
        let (first, stop) = (offset.div_ceil(cs), end / cs);
        if first >= stop {
            return self.zero_in_windows(offset, len, false);
        }
        if offset < first * cs {
            self.zero_in_windows(offset, (first * cs - offset) as usize, false)?;
        }
        if stop * cs < end {
            self.zero_in_windows(stop * cs, (end - stop * cs) as usize, false)?;
        }
        let per_window = (ZERO_WINDOW as u64 / cs).max(1);
        let stop_key = chunk_key(self.vol.id, stop);
        let mut from = first;
        while from < stop {
            let keys =
                self.store
                    .range_keys(&chunk_key(self.vol.id, from), &stop_key, LIST_PAGE)?;
            let chunks: Vec<u64> = keys
                .iter()
                .filter_map(|k| chunk_index(self.vol.id, k))
                .filter(|c| (from..stop).contains(c))
                .collect();
            let mut rest = &chunks[..];
            while let Some(&a) = rest.first() {
                let n = rest.iter().take_while(|&&c| c < a + per_window).count();
                let b = rest[n - 1] + 1;
                self.apply_many(&[Patch {
                    offset: a * cs,
                    len: ((b - a) * cs) as usize,
                    data: None,
                    keep: false,
                }])?;
                rest = &rest[n..];
            }
            match chunks.last() {
                Some(&c) if keys.len() == LIST_PAGE => from = c + 1,
                _ => break,
            }
        }
        Ok(())
    }

    /// Applies several writes and zeroings, in order, as one batch: the
    /// locks of all their chunks, one multi-get of the chunks some patch
    /// covers only in part, one write of every chunk touched (atomic per
    /// chunk). Whole chunks start from zeros (never read); all-zero results
    /// are deleted.
    pub fn apply_many(&self, patches: &[Patch<'_>]) -> Result<()> {
        self.check_lease()?;
        let cs = self.chunk_size();
        let pieces: Vec<Vec<Piece>> = patches
            .iter()
            .map(|p| self.pieces(p.offset, p.len))
            .collect();
        let all: Vec<Piece> = pieces.iter().flatten().copied().collect();
        let _guards = self.lock(&all);
        // Chunks touched, and which of them some patch covers only in part.
        let mut touched: Vec<u64> = all.iter().map(|p| p.chunk).collect();
        touched.sort_unstable();
        touched.dedup();
        // A chunk whose last writer in the batch covers it whole with data
        // is written from that data as is: no buffer, no read.
        let mut whole: Vec<Option<&[u8]>> = vec![None; touched.len()];
        let mut keep = vec![false; touched.len()];
        for (patch, ps) in patches.iter().zip(&pieces) {
            for p in ps {
                let Ok(i) = touched.binary_search(&p.chunk) else {
                    continue;
                };
                keep[i] |= patch.keep;
                whole[i] = match patch.data {
                    Some(d) if p.len == cs => Some(&d[p.buf_at..p.buf_at + cs]),
                    _ => None,
                };
            }
        }
        let mut partial: Vec<u64> = all
            .iter()
            .filter(|p| p.len < cs)
            .map(|p| p.chunk)
            .filter(|c| touched.binary_search(c).is_ok_and(|i| whole[i].is_none()))
            .collect();
        partial.sort_unstable();
        partial.dedup();
        let partial_keys: Vec<Vec<u8>> =
            partial.iter().map(|&c| chunk_key(self.vol.id, c)).collect();
        let refs: Vec<&[u8]> = partial_keys.iter().map(|k| &k[..]).collect();
        let current = if refs.is_empty() {
            Vec::new()
        } else {
            self.store.mget(&refs)?
        };
        // The other chunks start from zeros or what they held, and take
        // every piece in order.
        let mut bufs: Vec<Vec<u8>> = touched
            .iter()
            .zip(&whole)
            .map(|(c, w)| {
                if w.is_some() {
                    return Vec::new();
                }
                let mut b = vec![0u8; cs];
                if let Ok(i) = partial.binary_search(c) {
                    if let Some(old) = &current[i] {
                        let n = old.len().min(cs);
                        b[..n].copy_from_slice(&old[..n]);
                    }
                }
                b
            })
            .collect();
        for (patch, ps) in patches.iter().zip(&pieces) {
            for p in ps {
                let Ok(i) = touched.binary_search(&p.chunk) else {
                    continue;
                };
                if whole[i].is_some() {
                    continue;
                }
                let dst = &mut bufs[i][p.at..p.at + p.len];
                match patch.data {
                    Some(d) => dst.copy_from_slice(&d[p.buf_at..p.buf_at + p.len]),
                    None => dst.fill(0),
                }
            }
        }
        let keys: Vec<Vec<u8>> = touched.iter().map(|&c| chunk_key(self.vol.id, c)).collect();
        let ops: Vec<WriteOp<'_>> = keys
            .iter()
            .zip(bufs.iter().zip(&whole).map(|(b, w)| w.unwrap_or(&b[..])))
            .zip(&keep)
            .map(|((k, b), &keep)| (&k[..], (keep || b.iter().any(|&x| x != 0)).then_some(b)))
            .collect();
        // Whether each chunk holds data now: known for the chunks read for
        // a partial write, asked of the store for wholly zeroed ones. A
        // delete of a chunk that holds nothing is skipped, so a TRIM of a
        // fresh volume writes no tombstones.
        let mut held: Vec<Option<bool>> = touched
            .iter()
            .map(|c| partial.binary_search(c).ok().map(|i| current[i].is_some()))
            .collect();
        let unknown: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].1.is_none() && held[i].is_none())
            .collect();
        if !unknown.is_empty() {
            let probe: Vec<&[u8]> = unknown.iter().map(|&i| ops[i].0).collect();
            for (&i, exists) in unknown.iter().zip(self.store.exists(&probe)?) {
                held[i] = Some(exists);
            }
        }
        let ops: Vec<WriteOp<'_>> = ops
            .into_iter()
            .zip(held)
            .filter(|(op, held)| op.1.is_some() || *held != Some(false))
            .map(|(op, _)| op)
            .collect();
        // Large batches go in parts so one cluster request stays bounded.
        for batch in ops.chunks((8 << 20) / cs + 1) {
            self.store.write(batch)?;
        }
        Ok(())
    }

    /// Makes every write that returned so far durable; fails once for
    /// each loss of acknowledged writes this volume was not told of yet.
    pub fn flush(&self) -> Result<()> {
        Ok(self.losses.sync(|c| self.store.sync_with(c))?)
    }

    /// Allocation of `[offset, offset + len)` or of a part of it from
    /// `offset` on: the chunks a listing shows that still hold data, holes
    /// between them, adjacent extents of one kind merged. Its cost follows
    /// the chunks stored there (at most [`MAX_STATUS_LISTED`]; a listing
    /// cut short answers up to its last chunk), not the range's length.
    pub fn status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let cs = u64::from(self.vol.chunk_size);
        let end = offset + len;
        let (first, last) = (offset / cs, end.div_ceil(cs));
        let listed = self.store.stored_keys(
            &chunk_key(self.vol.id, first),
            &chunk_key(self.vol.id, last),
            MAX_STATUS_LISTED,
        )?;
        let in_range = |k: &[u8]| chunk_index(self.vol.id, k).filter(|c| (first..last).contains(c));
        let chunks: Vec<u64> = listed.keys.iter().filter_map(|k| in_range(k)).collect();
        // A listing cut short answers up to its last chunk.
        let end = match listed.full_at.as_deref().and_then(in_range) {
            Some(c) => end.min((c + 1) * cs),
            None => end,
        };
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len: u64, hole: bool| match out.last_mut() {
            Some(l) if l.hole == hole => l.len += len,
            _ if len > 0 => out.push(Extent { len, hole }),
            _ => {}
        };
        let mut pos = offset;
        for &c in &chunks {
            let (a, z) = ((c * cs).max(offset), ((c + 1) * cs).min(end));
            push(a.saturating_sub(pos), true);
            push(z - a, false);
            pos = z;
        }
        push(end - pos, true);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume;
    use client::MemStore;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn blocks(size: u64, chunk: u32) -> (Arc<MemStore>, Blocks) {
        let store = Arc::new(MemStore::new());
        let vol = volume::create(&*store, "t", size, chunk).expect("create");
        (store.clone(), Blocks::new(store, vol))
    }

    /// Random writes, zeroes and reads against a byte-array oracle, with
    /// chunk-straddling offsets and lengths.
    #[test]
    fn matches_a_byte_array_oracle() {
        let size = 1 << 20;
        let (store, b) = blocks(size, 8192);
        let mut oracle = vec![0u8; size as usize];
        let mut rng = SmallRng::seed_from_u64(5);
        for round in 0..600 {
            let off = rng.gen_range(0..size - 1);
            let len = rng.gen_range(1..=(size - off).min(40_000)) as usize;
            match rng.gen_range(0..10) {
                0..=4 => {
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    b.write(off, &data, round % 7 == 0).expect("write");
                    oracle[off as usize..off as usize + len].copy_from_slice(&data);
                }
                5 | 6 => {
                    b.zero(off, len, false, false).expect("zero");
                    oracle[off as usize..off as usize + len].fill(0);
                }
                _ => {
                    let got = b.read(off, len).expect("read");
                    assert!(
                        got == oracle[off as usize..off as usize + len],
                        "round {round}"
                    );
                }
            }
        }
        assert_eq!(b.read(0, size as usize).expect("read all"), oracle);
        // Stored chunks are exactly the non-zero ones.
        let nonzero = oracle
            .chunks(8192)
            .filter(|c| c.iter().any(|&x| x != 0))
            .count();
        assert_eq!(store.len(), nonzero + 1, "chunks plus the volume record");
    }

    /// Holes longer than the static zeros come out as several slices of
    /// them; data and holes keep their order.
    #[test]
    fn large_reads_are_pieces_of_values_and_zeros() {
        let (_, b) = blocks(4 << 20, 256 << 10);
        b.write((256 << 10) + 10, &[7u8; 100], false)
            .expect("write");
        let parts = b.read_many_parts(&[(0, 1 << 20)]).expect("read").remove(0);
        // Three 256 KiB holes of four zero slices each, and one chunk.
        assert_eq!(
            parts.len(),
            3 * 4 + 1,
            "{:?}",
            parts.iter().map(Bytes::len).collect::<Vec<_>>()
        );
        let joined: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
        let mut want = vec![0u8; 1 << 20];
        want[(256 << 10) + 10..(256 << 10) + 110].fill(7);
        assert!(joined == want);
    }

    /// Batches of overlapping writes and zeroings apply in order, and
    /// batched reads (sharing chunks) read what the oracle holds.
    #[test]
    fn batches_match_the_oracle() {
        let size = 256 << 10;
        let (_, b) = blocks(size, 4096);
        let mut oracle = vec![0u8; size as usize];
        let mut rng = SmallRng::seed_from_u64(9);
        for _ in 0..200 {
            let n = rng.gen_range(1..8);
            let mut datas = Vec::new();
            let mut spans = Vec::new();
            for _ in 0..n {
                let off = rng.gen_range(0..size - 1);
                let len = rng.gen_range(1..=(size - off).min(10_000)) as usize;
                let zero = rng.gen_range(0..4) == 0;
                datas.push((!zero).then(|| (0..len).map(|_| rng.gen::<u8>()).collect::<Vec<u8>>()));
                spans.push((off, len));
            }
            let patches: Vec<Patch<'_>> = spans
                .iter()
                .zip(&datas)
                .map(|(&(offset, len), d)| Patch {
                    offset,
                    len,
                    data: d.as_deref(),
                    keep: false,
                })
                .collect();
            b.apply_many(&patches).expect("batch");
            for (&(off, len), d) in spans.iter().zip(&datas) {
                let dst = &mut oracle[off as usize..off as usize + len];
                match d {
                    Some(d) => dst.copy_from_slice(d),
                    None => dst.fill(0),
                }
            }
            let reads: Vec<(u64, usize)> = (0..n)
                .map(|_| {
                    let off = rng.gen_range(0..size - 1);
                    (off, rng.gen_range(1..=(size - off).min(9000)) as usize)
                })
                .collect();
            for ((off, len), got) in reads.iter().zip(b.read_many(&reads).expect("reads")) {
                assert!(got == oracle[*off as usize..*off as usize + len]);
            }
        }
    }

    #[test]
    fn holes_are_reported_and_whole_chunk_zeroes_delete() {
        let (store, b) = blocks(64 << 10, 4096);
        b.write(4096, &[1u8; 8192], false).expect("write");
        b.write(40_000, &[2u8; 10], false).expect("write");
        let st = b.status(0, 64 << 10).expect("status");
        assert_eq!(
            st,
            vec![
                Extent {
                    len: 4096,
                    hole: true
                },
                Extent {
                    len: 8192,
                    hole: false
                },
                Extent {
                    len: 36864 - 12288,
                    hole: true
                },
                Extent {
                    len: 4096,
                    hole: false
                },
                Extent {
                    len: (64 << 10) - 40960,
                    hole: true
                },
            ]
        );
        let before = store.len();
        b.zero(4096, 8192, false, false).expect("trim");
        // NO_HOLE: zeroed but kept allocated.
        b.zero(40_960, 4096, false, true).expect("zero, no hole");
        assert_eq!(
            b.status(40_960, 4096).expect("status"),
            vec![Extent {
                len: 4096,
                hole: false
            }]
        );
        assert_eq!(b.read(40_960, 4096).expect("read"), vec![0u8; 4096]);
        assert_eq!(
            store.len(),
            before - 2 + 1,
            "two chunks trimmed, one zero chunk kept"
        );
        assert_eq!(
            b.status(4096, 100).expect("status"),
            vec![Extent {
                len: 100,
                hole: true
            }]
        );
    }

    /// Long zeroings (the listing path) and allocation reports against a
    /// byte array: a chunk is a hole exactly when it holds only zeros.
    #[test]
    fn long_zeroings_and_status_match_the_oracle() {
        let (cs, size) = (4096usize, 40u64 << 20);
        let (_, b) = blocks(size, cs as u32);
        let mut oracle = vec![0u8; size as usize];
        let mut rng = SmallRng::seed_from_u64(11);
        let mut cut_short = 0;
        for round in 0..120 {
            let off = rng.gen_range(0..size - 1);
            let room = size - off;
            if rng.gen_range(0..3) == 0 && room > ZERO_WINDOW as u64 {
                let len = rng.gen_range(ZERO_WINDOW as u64 + 1..=room) as usize;
                b.zero(off, len, false, false).expect("long zero");
                oracle[off as usize..off as usize + len].fill(0);
            } else {
                let len = rng.gen_range(1..=room.min(96 * cs as u64)) as usize;
                let data: Vec<u8> = (0..len).map(|_| rng.gen_range(0..2)).collect();
                b.write(off, &data, false).expect("write");
                oracle[off as usize..off as usize + len].copy_from_slice(&data);
            }
            // Asked again from where each answer stopped (an answer is cut
            // short after MAX_STATUS_LISTED stored chunks).
            let (a, z) = (rng.gen_range(0..size - 1), size);
            let mut pos = a;
            while pos < z {
                if pos > a {
                    cut_short += 1;
                }
                let extents = b.status(pos, z - pos).expect("status");
                assert!(!extents.is_empty(), "round {round}");
                for e in extents {
                    assert!(e.len > 0, "round {round}");
                    for at in (pos..pos + e.len).step_by(1 << 10) {
                        let c = at as usize / cs * cs;
                        let zeros = oracle[c..c + cs].iter().all(|&x| x == 0);
                        assert_eq!(e.hole, zeros, "round {round}, byte {at}");
                    }
                    pos += e.len;
                }
                assert!(pos <= z, "round {round}: answered past the range");
            }
        }
        assert_eq!(b.read(0, size as usize).expect("read all"), oracle);
        assert!(cut_short > 10, "status answers cut short: {cut_short}");
    }

    /// `mkfs` trims a whole device and `qemu-img map` asks about all of it:
    /// on a large, mostly empty volume both cost what it holds.
    #[test]
    fn trims_and_status_of_a_large_sparse_volume_cost_what_it_holds() {
        use std::sync::atomic::Ordering::Relaxed;
        let (store, b) = blocks(1 << 40, 4096);
        let marks = [4096u64 * 3 + 10, 1 << 30, (4 << 30) - 4096];
        for &at in &marks {
            b.write(at, b"data", false).expect("write");
        }
        // The longest NBD request, 4 GiB less one block, whole chunks.
        let max = (4u64 << 30) - 4096;
        let st = b.status(0, max).expect("status");
        let lens: Vec<(u64, bool)> = st.iter().map(|e| (e.len, e.hole)).collect();
        assert_eq!(
            lens,
            [
                (3 * 4096, true),
                (4096, false),
                ((1 << 30) - 4 * 4096, true),
                (4096, false),
                (max - (1 << 30) - 4096, true),
            ]
        );
        b.zero(4096, (max - 4096) as usize, false, false)
            .expect("trim");
        assert_eq!(b.read(marks[0], 4).expect("read"), [0; 4]);
        assert_eq!(b.read(marks[1], 4).expect("read"), [0; 4]);
        assert_eq!(b.read(marks[2], 4).expect("read"), b"data", "past the trim");
        assert!(
            store.exists_keys.load(Relaxed) < 10_000,
            "{} keys probed",
            store.exists_keys.load(Relaxed)
        );
        assert_eq!(store.len(), 2, "one chunk and the volume record");
    }

    /// Two writers of different halves of the same chunks, many times: both
    /// halves survive every time.
    #[test]
    fn concurrent_partial_writes_of_one_chunk_both_survive() {
        let (_, b) = blocks(1 << 20, 65536);
        let b = Arc::new(b);
        for round in 0..50u8 {
            let h: Vec<_> = (0..2u64)
                .map(|half| {
                    let b = b.clone();
                    std::thread::spawn(move || {
                        b.write(
                            half * 32768,
                            &[round.wrapping_add(half as u8 + 1); 32768],
                            false,
                        )
                        .expect("write")
                    })
                })
                .collect();
            for t in h {
                t.join().expect("writer");
            }
            let got = b.read(0, 65536).expect("read");
            assert!(
                got[..32768].iter().all(|&x| x == round.wrapping_add(1)),
                "round {round}"
            );
            assert!(
                got[32768..].iter().all(|&x| x == round.wrapping_add(2)),
                "round {round}"
            );
        }
    }

    #[test]
    fn trimming_what_was_never_written_writes_nothing() {
        let (store, b) = blocks(1 << 20, 4096);
        let before = store.writes.load(std::sync::atomic::Ordering::Relaxed);
        b.zero(0, 1 << 20, false, false).expect("trim");
        b.zero(100, 5000, false, false).expect("partial trim");
        assert_eq!(
            store.writes.load(std::sync::atomic::Ordering::Relaxed),
            before
        );
        b.write(8192, &[1; 10], false).expect("write");
        b.zero(0, 1 << 20, false, false).expect("trim");
        assert_eq!(store.len(), 1, "only the volume record is left");
    }

    #[test]
    fn a_volume_whose_lease_is_lost_refuses_writes() {
        let store = Arc::new(MemStore::new());
        let vol = volume::create(&*store, "t", 1 << 20, 4096).expect("create");
        let fence = Fence::held();
        let b = Blocks::fenced(store, vol, fence.clone());
        b.write(0, &[1; 100], false).expect("while held");
        fence.revoke();
        let e = b.write(0, &[2; 100], false).expect_err("lost");
        assert_eq!(e.errno(), crate::error::errno::EPERM, "{e}");
        assert!(b.zero(0, 4096, false, false).is_err());
        assert_eq!(b.read(0, 100).expect("reads go on"), [1; 100]);
    }

    #[test]
    fn each_volume_hears_of_a_loss_once_at_its_next_flush() {
        let (store, a) = blocks(1 << 20, 4096);
        let other = volume::create(&*store, "u", 1 << 20, 4096).expect("create");
        let b = Blocks::new(store.clone(), other);
        store.lose_unsynced_writes();
        assert!(a.flush().is_err(), "a hears of it");
        assert!(
            b.write(0, &[1; 10], true).is_err(),
            "so does b, at a FUA write"
        );
        a.flush().expect("once");
        b.flush().expect("once");
    }

    #[test]
    fn fua_and_flush_sync_the_store() {
        let (store, b) = blocks(1 << 20, 4096);
        let syncs = || store.syncs.load(std::sync::atomic::Ordering::Relaxed);
        let created = syncs();
        assert_eq!(created, 1, "a volume is durable once created");
        b.write(0, &[1; 10], true).expect("fua write");
        b.flush().expect("flush");
        assert_eq!(syncs() - created, 2);
    }
}
