//! Value GC (PinK's reinsertion): a sealed value-log segment whose live
//! fraction has fallen low is read back; every value the tree still points
//! to at that exact address (for the latest view or any live snapshot) is
//! re-inserted through the log with its original sequence number; after the
//! next flush the segment is released and trimmed. A segment holding a single
//! live value among garbage is reclaimed like any other.

use crate::db::{DbInner, MaintState};
use crate::deeppass::DeepPassState;
use crate::error::{Error, Result};
use crate::record::{self, HEADER_LEN};
use crate::segreader::SegmentReader;
use crate::stats::Counters;
use crate::types::{Kind, SeqNo, ValuePtr};
use crate::vlog::Reserve;
use crate::vlog::SegMeta;
use flash::SegmentId;

/// Keytable pages beyond its estimate (twice the first level; for a deep
/// pass, `DbInner::deep_flush_pages`) that a GC flush is assumed to need
/// at most (index pages, the relocated entries' own keys).
pub(crate) const KT_FLUSH_SLACK_PAGES: u64 = 8;
/// Segments cleaned per pass at most.
const MAX_VICTIMS_PER_PASS: usize = 4;

/// With [`crate::Options::lazy_gc`], space is roomy while at least this
/// fraction of the device's segments is free ...
const ROOMY_FREE_FRACTION: f64 = 0.5;
/// ... and then only segments less live than this are cleaned (cheap:
/// little to relocate).
const ROOMY_LIVE_THRESHOLD: f64 = 0.1;

/// GC's bookkeeping between passes (kept in `MaintState`): segments
/// cleaned and waiting for the flush that makes their relocated values'
/// pointers durable, segments flushed and waiting for the checkpoint that
/// releases them, and segments a snapshot still needs (retried once the
/// set of snapshots changes).
#[derive(Default)]
pub(crate) struct GcVictims {
    awaiting_flush: Vec<SegmentId>,
    ready: Vec<SegmentId>,
    pinned: Vec<SegmentId>,
    /// The snapshots that pinned `pinned`.
    pinned_for: Vec<SeqNo>,
    /// Whether deep passes may run (`deeppass.rs`).
    pub(crate) deep: DeepPassState,
}

impl GcVictims {
    /// Forgets the pins if the snapshots are no longer those that pinned.
    fn unpin_unless(&mut self, snapshots: Vec<SeqNo>) {
        if self.pinned_for != snapshots {
            self.pinned.clear();
            self.pinned_for = snapshots;
        }
    }

    /// Whether no cleaned segment waits for its flush or its release.
    pub(crate) fn settled(&self) -> bool {
        self.awaiting_flush.is_empty() && self.ready.is_empty()
    }

    /// Whether `seg` is cleaned, releasable or pinned already.
    fn tracks(&self, seg: &SegmentId) -> bool {
        self.awaiting_flush.contains(seg) || self.ready.contains(seg) || self.pinned.contains(seg)
    }

    /// A flush made the cleaned segments' relocations durable: the next
    /// checkpoint may release them.
    pub(crate) fn flushed(&mut self) {
        self.ready.append(&mut self.awaiting_flush);
    }

    /// The segments a checkpoint releases now (no longer tracked).
    pub(crate) fn take_ready(&mut self) -> Vec<SegmentId> {
        std::mem::take(&mut self.ready)
    }
}

/// The bytes of room a pass relocating with `reserve` keeps beyond its
/// victims' live bytes, for the records' framing and the end of each
/// segment (see `DbInner::relocation_room`): an eighth of a segment for a
/// deep pass ([`Reserve::LeaveFree`]), half of one otherwise.
pub(crate) fn relocation_margin(reserve: Reserve, segment_bytes: u64) -> u64 {
    match reserve {
        Reserve::LeaveFree(_) => segment_bytes / 8,
        _ => segment_bytes / 2,
    }
}

impl DbInner {
    /// One GC pass (under the maintenance lock). `force` cleans any segment
    /// with garbage; otherwise the thresholds decide.
    pub(crate) fn gc_pass(&self, force: bool) -> Result<usize> {
        let mut st = self.maint.lock();
        self.gc_locked(&mut st, force)
    }

    pub(crate) fn gc_locked(&self, st: &mut MaintState, force: bool) -> Result<usize> {
        let snapshots = self.snapshot_seqs();
        st.gc.unpin_unless(snapshots);
        let low_space = self.space_low();
        // Cleaning a segment costs rewriting its live bytes and gains its
        // garbage: below the threshold the gain is worth it; when space is
        // short a smaller gain is accepted, when it is roomy (lazy GC) only
        // a large one; never clean what gains nothing.
        let threshold = if force {
            1.0
        } else if low_space {
            self.low_space_gc_threshold()
        } else if self.opts.lazy_gc && self.space_roomy() {
            self.opts.gc_live_threshold.min(ROOMY_LIVE_THRESHOLD)
        } else {
            self.opts.gc_live_threshold
        };
        let mut reserve = self.relocation_reserve(st);
        let mut victims = self.victims(st, threshold, MAX_VICTIMS_PER_PASS, reserve);
        let compactions = Counters::get(&self.counters.compactions);
        let deep_victim = if low_space && !force {
            self.deep_victim(st, compactions)
        } else {
            None
        };
        self.signal.set_deep_pass_possible(deep_victim.is_some());
        let mut deep = false;
        if let Some(d) = deep_victim {
            if victims.is_empty() && self.deep_pass_due(st) {
                Counters::add(&self.counters.gc_deep_passes, 1);
                (reserve, victims, deep) = (d.reserve, vec![d.victim], true);
            }
        }
        if victims.is_empty() {
            return Ok(0);
        }
        Counters::add(&self.counters.gc_runs, 1);
        let mut cleaned = 0;
        for (seg, meta) in &victims {
            if deep {
                self.signal
                    .set_deep_pass_floor(self.deep_pass_write_floor(reserve, meta));
            }
            let found = self.gc_segment(*seg, meta, reserve);
            self.signal.set_deep_pass_floor(0);
            match found? {
                Some(dead) => {
                    st.gc.awaiting_flush.push(*seg);
                    cleaned += 1;
                    if deep {
                        st.gc.deep.cleaned(meta, dead, compactions);
                    }
                }
                None => st.gc.pinned.push(*seg),
            }
        }
        if cleaned == 0 {
            return Ok(0);
        }
        // Make the re-inserted pointers durable in keytables so the victims
        // can be released by the flush's checkpoint.
        self.flush_locked(st, crate::maint::kt_reserve::GC_FLUSH)?;
        Ok(cleaned)
    }

    /// Up to `max` sealed segments less live than `threshold`, least live
    /// first, whose live bytes together fit where relocation with `reserve`
    /// may write: a pass that ran out of space mid-way left its relocations
    /// in the memtable with no segment for the flush that releases anything
    /// (four victims on a small, mostly live device did).
    pub(crate) fn victims(
        &self,
        st: &MaintState,
        threshold: f64,
        max: usize,
        reserve: Reserve,
    ) -> Vec<(SegmentId, SegMeta)> {
        let current = self.vlog.current_segment();
        let mut victims: Vec<(SegmentId, SegMeta)> = self
            .vlog
            .segments()
            .into_iter()
            .filter(|(seg, m)| {
                *seg != current
                    && m.sealed
                    && m.epoch < st.replay.epoch
                    && !st.gc.tracks(seg)
                    && m.live_fraction() < threshold
                    && m.live_bytes < m.written_bytes
            })
            .collect();
        victims.sort_by(|a, b| a.1.live_fraction().total_cmp(&b.1.live_fraction()));
        victims.truncate(max);
        let mut room = self.relocation_room(reserve);
        victims.retain(|(_, m)| {
            let fits = m.live_bytes <= room;
            if fits {
                room -= m.live_bytes;
            }
            fits
        });
        victims
    }

    /// How far GC relocation may dip into the free segments: all but the
    /// last one, which the flush completing the pass may need for its
    /// keytables, or the last one too when the keytable segment already has
    /// room for that flush. The flush writes the relocated entries as a
    /// new flushed run, about as large as the first level when that is a
    /// run (less than L1 when there is none); twice the level's pages and
    /// a few more leave a wide margin. Without this, a device
    /// whose deletes' flush took the second-last segment could never
    /// relocate, and so never reclaim, anything.
    fn relocation_reserve(&self, st: &MaintState) -> Reserve {
        let seg_pages = u64::from(self.flash.geometry().pages_per_segment);
        let room = u64::from(st.kt.room_pages(seg_pages as u32));
        let page = self.page;
        let first_level_pages: u64 = self
            .sv
            .read()
            .version
            .levels
            .first()
            .map_or(0, |l| l.iter().map(|kt| kt.bytes(page) / page as u64).sum());
        if room >= 2 * first_level_pages + KT_FLUSH_SLACK_PAGES {
            Reserve::InternalLast
        } else {
            Reserve::Internal
        }
    }

    /// The live bytes a pass's victims may have together: what the free
    /// segments `reserve` lets relocation use hold, less a margin for the
    /// records' framing and the end of each segment (a record never
    /// spans two): half a segment for ordinary passes, an eighth for a
    /// deep pass, whose single victim is at most `1 - DEEP_PASS_GAIN` live
    /// (`deeppass.rs`).
    fn relocation_room(&self, reserve: Reserve) -> u64 {
        let free = self.flash.free_segments();
        let segment_bytes = self.flash.geometry().segment_bytes();
        let usable = match reserve {
            Reserve::InternalLast => free,
            Reserve::LeaveFree(keep) => free.saturating_sub(keep),
            _ => free.saturating_sub(1),
        };
        (u64::from(usable) * segment_bytes)
            .saturating_sub(relocation_margin(reserve, segment_bytes))
    }

    /// At least [`ROOMY_FREE_FRACTION`] of the device's segments are free.
    fn space_roomy(&self) -> bool {
        let segments = f64::from(self.flash.geometry().segment_count);
        f64::from(self.flash.free_segments()) >= ROOMY_FREE_FRACTION * segments
    }

    /// Re-inserts the live values of `seg` as it reads them (so memory stays
    /// bounded by one record). Returns the bytes of the records it found
    /// dead, or `None` if a live snapshot still needs
    /// an older version stored in it: re-inserting an old version above
    /// newer ones would hide them, so such a segment waits until the snapshot
    /// is released (the latest versions already re-inserted are harmless
    /// duplicates that shadow their originals).
    fn gc_segment(&self, seg: SegmentId, meta: &SegMeta, reserve: Reserve) -> Result<Option<u64>> {
        let page = self.vlog.page_size() as u64;
        let mut reader = SegmentReader::new(&self.flash, seg);
        let snapshots = self.snapshot_seqs();
        let mut off = 0u64;
        let mut dead = 0u64;
        let corrupt = |off: u64, what: &str| {
            Error::Corrupt(format!("value segment {seg}: record at {off}: {what}"))
        };
        while off < meta.written_bytes {
            if page - off % page < HEADER_LEN as u64 {
                off += page - off % page;
                continue;
            }
            let header = record::Header::parse(reader.window(off, HEADER_LEN)?)
                .ok_or_else(|| corrupt(off, "short header"))?;
            let len = header.record_len();
            let bytes = reader.window(off, len)?;
            let rec =
                record::decode(bytes, meta.epoch).map_err(|e| corrupt(off, &format!("{e:?}")))?;
            match rec.header.kind {
                record::KIND_LINK => break,
                record::KIND_PUT => {
                    // Liveness compares places, not checksums.
                    let ptr = ValuePtr {
                        seg,
                        gen: meta.gen,
                        offset: off as u32,
                        len: len as u32,
                        value_crc: 0,
                    };
                    match self.liveness(rec.key, rec.header.seq, ptr, &snapshots)? {
                        Liveness::Dead => dead += len as u64,
                        Liveness::Latest => {
                            self.relocate(rec.key, rec.value, rec.header.seq, reserve)?;
                            Counters::add(&self.counters.gc_bytes_relocated, len as u64);
                        }
                        Liveness::PinnedBySnapshot => {
                            Counters::add(&self.counters.gc_bytes_scanned, reader.bytes_read);
                            return Ok(None);
                        }
                    }
                }
                _ => {}
            }
            off += len as u64;
        }
        Counters::add(&self.counters.gc_bytes_scanned, reader.bytes_read);
        Ok(Some(dead))
    }

    /// Whether the latest view, or only a live snapshot, resolves `key` to
    /// exactly this record.
    pub(crate) fn liveness(
        &self,
        key: &[u8],
        seq: SeqNo,
        ptr: ValuePtr,
        snapshots: &[SeqNo],
    ) -> Result<Liveness> {
        let points_here = |e: Option<crate::types::Entry>| {
            e.is_some_and(|e| e.kind == Kind::Put && e.seq == seq && e.ptr.same_record(&ptr))
        };
        let latest = self.lookup(key, SeqNo::MAX)?;
        let newest_seq = latest.as_ref().map(|e| e.seq);
        if points_here(latest) {
            return Ok(Liveness::Latest);
        }
        // A newer version whose batch is still being appended is not visible
        // yet: reads, and snapshots taken now, still resolve to this one.
        let visible = self.visible_seq.load(std::sync::atomic::Ordering::Acquire);
        if newest_seq.is_some_and(|s| s > visible) && points_here(self.lookup(key, visible)?) {
            return Ok(Liveness::Latest);
        }
        for &s in snapshots {
            if s >= seq && points_here(self.lookup(key, s)?) {
                return Ok(Liveness::PinnedBySnapshot);
            }
        }
        Ok(Liveness::Dead)
    }
}

pub(crate) enum Liveness {
    Dead,
    Latest,
    PinnedBySnapshot,
}

#[cfg(test)]
mod tests {
    use super::Liveness;
    use crate::test_support::small_db;
    use crate::types::{Kind, SeqNo};

    /// While a newer version's batch is being appended (in the memtable,
    /// not yet visible), the visible version is what reads and new
    /// snapshots resolve to: GC must keep it.
    #[test]
    fn a_version_hidden_only_by_an_invisible_one_is_live() {
        let db = small_db();
        db.put(b"k", b"visible").expect("put");
        let inner = &db.inner;
        let e = inner.lookup(b"k", SeqNo::MAX).unwrap().expect("entry");
        let live = |inner: &crate::db::DbInner| {
            matches!(
                inner.liveness(b"k", e.seq, e.ptr, &[]).expect("liveness"),
                Liveness::Latest
            )
        };
        assert!(live(inner));
        // What an append does before it publishes the batch's sequence.
        let sv = inner.sv.read().clone();
        sv.mem.insert(b"k", e.seq + 1, Kind::Put, e.ptr, e.tag);
        assert!(live(inner), "hidden only by an invisible version");
        inner
            .visible_seq
            .store(e.seq + 1, std::sync::atomic::Ordering::Release);
        assert!(!live(inner), "hidden by a visible version");
    }
}
