//! Ordered iteration over keytables, levels and memtables, and the merge of
//! several sorted sources into one stream in `(key asc, seq desc)` order.

use std::cmp::Ordering;
use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;

use crate::error::Result;
use crate::keytable::Block;
use crate::types::{entry_order, Entry};
use crate::version::{Keytable, ReadCtx, Source};

/// A sorted stream of entries that may fail (device reads).
pub type EntryIter<'a> = Box<dyn Iterator<Item = Result<Entry>> + Send + 'a>;

/// Iterates one level (sorted, non-overlapping keytables) from a start key.
pub struct LevelIter<'a> {
    tables: Vec<Arc<Keytable>>,
    table: usize,
    block_idx: usize,
    block: Option<Arc<Block>>,
    pos: usize,
    ctx: &'a ReadCtx,
    failed: bool,
    /// Reads the rest of a keytable at once (see [`LevelIter::for_merge`]).
    read_ahead: bool,
    /// The current keytable's blocks after `block`, already read.
    ahead: std::vec::IntoIter<Arc<Block>>,
    /// Set for an iteration from cached blocks only (see
    /// [`LevelIter::cached`]): raised at the first block the cache lacks.
    declined: Option<&'a AtomicBool>,
}

impl<'a> LevelIter<'a> {
    /// Entries of `tables` ordered at or after `from`.
    pub fn new(tables: Vec<Arc<Keytable>>, from: &[u8], ctx: &'a ReadCtx) -> Self {
        Self::start(tables, from, ctx, None)
    }

    /// [`LevelIter::new`] for a caller that must not wait for the device:
    /// only cached blocks are read. At the first block the cache lacks the
    /// iteration ends and `declined` is set; what came before is correct,
    /// but the stream is then incomplete and the caller must not use it.
    pub fn cached(
        tables: Vec<Arc<Keytable>>,
        from: &[u8],
        ctx: &'a ReadCtx,
        declined: &'a AtomicBool,
    ) -> Self {
        Self::start(tables, from, ctx, Some(declined))
    }

    fn start(
        tables: Vec<Arc<Keytable>>,
        from: &[u8],
        ctx: &'a ReadCtx,
        declined: Option<&'a AtomicBool>,
    ) -> Self {
        let table = tables.partition_point(|kt| kt.index.largest.as_ref() < from);
        let mut it = LevelIter {
            tables,
            table,
            block_idx: 0,
            block: None,
            pos: 0,
            ctx,
            failed: false,
            read_ahead: false,
            ahead: Vec::new().into_iter(),
            declined,
        };
        if let Some(kt) = it.tables.get(table).cloned() {
            it.block_idx = kt.index.find_block(from).unwrap_or(0);
            match it.load(&kt) {
                Ok(Some(b)) => {
                    it.pos = b.seek(from, u64::MAX);
                    it.block = Some(b);
                }
                // A declined block ends the iteration (see `load`); an
                // error is reported by next(), which loads it again.
                Ok(None) | Err(_) => it.block = None,
            }
        }
        it
    }

    /// Every entry of `tables`, for a flush or compaction: a keytable
    /// block the cache lacks is read together with the rest of its
    /// keytable, in one device read, and is not cached. Merges read their
    /// inputs whole; once the levels outgrow the cache, reading them a
    /// block at a time made the flush wait on one small read per block.
    pub fn for_merge(tables: Vec<Arc<Keytable>>, ctx: &'a ReadCtx) -> Self {
        LevelIter {
            tables,
            table: 0,
            block_idx: 0,
            block: None,
            pos: 0,
            ctx,
            failed: false,
            read_ahead: true,
            ahead: Vec::new().into_iter(),
            declined: None,
        }
    }

    /// Block `block_idx` of `kt`: the next one read ahead, or as the mode
    /// reads it. `None` from a keytable without blocks to read ahead, or
    /// (ending the iteration) for a block a cache-only iteration declines.
    fn load(&mut self, kt: &Keytable) -> Result<Option<Arc<Block>>> {
        if let Some(declined) = self.declined {
            let block = kt.block_from(self.block_idx, self.ctx, Source::CacheOnly)?;
            if block.is_none() {
                declined.store(true, AtomicOrdering::Relaxed);
                self.failed = true;
            }
            return Ok(block);
        }
        if !self.read_ahead {
            return kt.block(self.block_idx, self.ctx).map(Some);
        }
        if let Some(b) = self.ahead.next() {
            return Ok(Some(b));
        }
        let mut blocks = kt.blocks_from(self.block_idx, self.ctx)?.into_iter();
        let first = blocks.next();
        self.ahead = blocks;
        Ok(first)
    }
}

impl Iterator for LevelIter<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        if self.failed {
            return None;
        }
        loop {
            if self.block.is_none() {
                let kt = Arc::clone(self.tables.get(self.table)?);
                match self.load(&kt) {
                    Ok(Some(b)) => self.block = Some(b),
                    Ok(None) if self.failed => return None,
                    // A keytable without blocks: on to the next one.
                    Ok(None) => {
                        self.block_idx = 0;
                        self.table += 1;
                        self.ahead = Vec::new().into_iter();
                        continue;
                    }
                    Err(e) => {
                        self.failed = true;
                        return Some(Err(e));
                    }
                }
            }
            let block = self.block.as_ref()?;
            if self.pos < block.len() {
                let e = block.entry(self.pos);
                self.pos += 1;
                return Some(Ok(e));
            }
            self.pos = 0;
            self.block = None;
            self.block_idx += 1;
            if self.block_idx >= self.tables[self.table].index.blocks.len() {
                self.block_idx = 0;
                self.table += 1;
                self.ahead = Vec::new().into_iter();
            }
        }
    }
}

struct HeapItem {
    entry: Entry,
    source: usize,
}

impl PartialEq for HeapItem {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for HeapItem {
    // BinaryHeap is a max-heap: reverse so the smallest entry (and, for equal
    // entries, the newest source) comes out first.
    fn cmp(&self, o: &Self) -> Ordering {
        entry_order(&o.entry.key, o.entry.seq, &self.entry.key, self.entry.seq)
            .then(o.source.cmp(&self.source))
    }
}

/// Merges sorted sources; source 0 is the newest. Equal `(key, seq)` entries
/// from several sources all come out, newest source first.
pub struct MergeIter<'a> {
    sources: Vec<EntryIter<'a>>,
    heap: BinaryHeap<HeapItem>,
    error: Option<crate::error::Error>,
}

impl<'a> MergeIter<'a> {
    /// Merges `sources` (newest first).
    pub fn new(mut sources: Vec<EntryIter<'a>>) -> Self {
        let mut heap = BinaryHeap::new();
        let mut error = None;
        for (i, s) in sources.iter_mut().enumerate() {
            match s.next() {
                Some(Ok(entry)) => heap.push(HeapItem { entry, source: i }),
                Some(Err(e)) => error = Some(e),
                None => {}
            }
        }
        MergeIter {
            sources,
            heap,
            error,
        }
    }
}

impl Iterator for MergeIter<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        if let Some(e) = self.error.take() {
            self.heap.clear();
            return Some(Err(e));
        }
        // Replace the top in place: one sift-down (a single comparison for
        // the two sources of a flush or compaction) instead of a pop and a
        // push.
        let mut top = self.heap.peek_mut()?;
        match self.sources[top.source].next() {
            Some(Ok(entry)) => Some(Ok(std::mem::replace(&mut top.entry, entry))),
            Some(Err(e)) => {
                self.error = Some(e);
                Some(Ok(PeekMut::pop(top).entry))
            }
            None => Some(Ok(PeekMut::pop(top).entry)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EntryIter, MergeIter};
    use crate::error::{Error, Result};
    use crate::test_support::put_entry as e;
    use crate::types::Entry;

    fn source(items: Vec<Result<Entry>>) -> EntryIter<'static> {
        Box::new(items.into_iter())
    }

    fn keys(it: MergeIter<'_>) -> Vec<(String, u64)> {
        it.map(|r| {
            let e = r.expect("entry");
            (String::from_utf8_lossy(&e.key).into_owned(), e.seq)
        })
        .collect()
    }

    /// Key ascending, newest first; an equal `(key, seq)` in several
    /// sources comes out once per source.
    #[test]
    fn merges_in_entry_order() {
        let merged = MergeIter::new(vec![
            source(vec![Ok(e("b", 9)), Ok(e("d", 5))]),
            source(vec![
                Ok(e("a", 1)),
                Ok(e("b", 3)),
                Ok(e("c", 2)),
                Ok(e("d", 5)),
            ]),
            source(vec![]),
        ]);
        let want = [("a", 1), ("b", 9), ("b", 3), ("c", 2), ("d", 5), ("d", 5)];
        let want: Vec<(String, u64)> = want.iter().map(|&(k, s)| (k.to_string(), s)).collect();
        assert_eq!(keys(merged), want);
    }

    /// A source's error comes out right after the entry before it, and ends
    /// the merge.
    #[test]
    fn an_error_ends_the_merge() {
        let mut merged = MergeIter::new(vec![
            source(vec![Ok(e("a", 1)), Err(Error::Corrupt("bad block".into()))]),
            source(vec![Ok(e("b", 1)), Ok(e("c", 1))]),
        ]);
        assert_eq!(merged.next().map(|r| r.is_ok()), Some(true));
        assert!(matches!(merged.next(), Some(Err(Error::Corrupt(_)))));
        assert!(merged.next().is_none());
    }
}
