//! [`RunBuilder`] turns the sorted entries of a flush, merge or compaction
//! into keytables of about one size, dropping the versions no reader can
//! see and handing back the pointers of the values it dropped.

use bytes::Bytes;

use crate::error::Result;
use crate::keytable::{BuiltKeytable, KeytableBuilder};
use crate::types::{Entry, Kind, SeqNo, ValuePtr};

/// Turns a sorted entry stream (`(key asc, seq desc)`) into keytables of
/// about `keytable_bytes`, dropping each version hidden by a newer one
/// that every reader sees, GC's relocation twins of a version kept, and,
/// at the bottom level, tombstones no reader needs.
pub(crate) struct RunBuilder {
    smallest_snapshot: SeqNo,
    bottom: bool,
    keytable_bytes: usize,
    builder: Option<KeytableBuilder>,
    cur_key: Option<Bytes>,
    last_seq_for_key: SeqNo,
    prev_seq: Option<SeqNo>,
    dropped: Vec<ValuePtr>,
}

impl RunBuilder {
    /// A builder that keeps every version a reader at `smallest_snapshot`
    /// or later can see; `bottom` when nothing older lies below the output.
    pub(crate) fn new(smallest_snapshot: SeqNo, bottom: bool, keytable_bytes: usize) -> Self {
        RunBuilder {
            smallest_snapshot,
            bottom,
            keytable_bytes,
            builder: None,
            cur_key: None,
            last_seq_for_key: SeqNo::MAX,
            prev_seq: None,
            dropped: Vec::new(),
        }
    }

    /// Adds the next entry; `start` makes the builder of a new keytable.
    /// Returns the keytable the entry's key closed, if it reached its size
    /// (keytables end only between keys, so their ranges never overlap).
    pub(crate) fn push(
        &mut self,
        e: Entry,
        start: impl FnOnce() -> KeytableBuilder,
    ) -> Result<Option<BuiltKeytable>> {
        let mut finished = None;
        if self.cur_key.as_ref() != Some(&e.key) {
            if self
                .builder
                .as_ref()
                .is_some_and(|b| b.estimated_bytes() >= self.keytable_bytes)
            {
                if let Some(b) = self.builder.take() {
                    finished = Some(b.finish()?);
                }
            }
            self.cur_key = Some(e.key.clone());
            self.last_seq_for_key = SeqNo::MAX;
            self.prev_seq = None;
        }
        if self.prev_seq == Some(e.seq) {
            // A GC relocation twin of the version just kept (older source).
            return Ok(finished);
        }
        self.prev_seq = Some(e.seq);
        let hidden = self.last_seq_for_key <= self.smallest_snapshot;
        let dead_tombstone =
            e.kind == Kind::Delete && e.seq <= self.smallest_snapshot && self.bottom;
        self.last_seq_for_key = e.seq;
        if hidden || dead_tombstone {
            if e.kind == Kind::Put {
                self.dropped.push(e.ptr);
            }
            return Ok(finished);
        }
        self.builder.get_or_insert_with(start).add(&e);
        Ok(finished)
    }

    /// The last keytable, if it holds anything, and the pointers of the
    /// values dropped, whose bytes are released once the result is
    /// installed.
    pub(crate) fn finish(self) -> Result<(Option<BuiltKeytable>, Vec<ValuePtr>)> {
        let last = match self.builder {
            Some(b) if b.entries() > 0 => Some(b.finish()?),
            _ => None,
        };
        Ok((last, self.dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::put_at;

    #[test]
    fn a_run_builder_drops_hidden_versions_and_dead_tombstones() {
        let mut run = RunBuilder::new(1000, true, 1 << 20);
        let mut put = |k: &str, seq: u64, kind: Kind| {
            let e = Entry {
                kind,
                ..put_at(k.as_bytes(), seq, seq as u32)
            };
            run.push(e, || KeytableBuilder::new(1, 512, 10))
                .expect("push")
        };
        assert!(put("a", 9, Kind::Put).is_none());
        put("a", 5, Kind::Put); // hidden by seq 9
        put("b", 8, Kind::Delete); // a dead tombstone at the bottom
        put("b", 4, Kind::Put); // hidden by the tombstone
        put("c", 7, Kind::Put);
        put("c", 7, Kind::Put); // a GC relocation twin
        let (last, dropped) = run.finish().expect("finish");
        let kt = last.expect("a keytable");
        assert_eq!(kt.index.entries, 2, "a@9 and c@7");
        let offsets: Vec<u32> = dropped.iter().map(|p| p.offset).collect();
        assert_eq!(offsets, [5, 4]);
    }
}
