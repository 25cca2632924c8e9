//! GC's deep pass: when space is short and every sealed segment is too
//! live for the low-space threshold (random overwrites spread their
//! garbage evenly: a block volume filling three quarters of its node's
//! device left every segment ~80 % live, and writes failed with a sixth of
//! the log garbage), GC cleans the least live segment that is clearly less
//! live than the densest one, one per pass, and only when nothing cheaper
//! can release space (`lowspace.rs`).
//!
//! Contract: a deep pass's relocation never takes the free segments a
//! merge needs ([`DEEP_PASS_KEEP`]), nor the one its own flush needs when
//! the keytable segment has no room for it, so with its victim released
//! it ends with at least one segment more; while it relocates, ordinary
//! writes leave free its reserve and the segments its victim's relocation
//! needs, or wait for it (`MaintSignal::deep_pass_floor`); a pass that
//! found less than half the garbage it cleans for stops deep passes until
//! the next compaction ([`DeepPassState`]).

use crate::db::{DbInner, MaintState};
use crate::gc::{relocation_margin, KT_FLUSH_SLACK_PAGES};
use crate::vlog::{Reserve, SegMeta};
use flash::SegmentId;

/// How much less live than the log's densest sealed segment a segment must
/// be for a deep pass ([`DbInner::deep_pass_due`]) to clean it: a
/// twentieth of it at least must be garbage, or the pass's relocation and
/// flush cost more than writers gain. Measured from the densest segment,
/// not from 1: alignment padding and the space a record too large for a
/// segment's end leaves are written again by relocation (4 KiB values are
/// padded to 512 B boundaries, so a segment of them is at most 0.9 live;
/// 16 KiB values in 64 KiB segments never fill more than 0.77 of one, and
/// deep passes cleaning such segments gained nothing, forever).
pub(crate) const DEEP_PASS_GAIN: f64 = 0.05;

/// Free segments a deep pass's relocation leaves (one more when its flush
/// needs a keytable segment): those a merge needs. One more made the
/// passes safe too, but took a segment from the little garbage a nearly
/// full log holds, and random writes ran markedly slower
/// (`bench/RESULTS.md`, session 40).
const DEEP_PASS_KEEP: u32 = crate::maint::kt_reserve::OPTIONAL;

/// Whether deep passes may run (kept with GC's victims, under the
/// maintenance lock).
#[derive(Default)]
pub(crate) struct DeepPassState {
    /// The compaction count when a deep pass found less than half the
    /// garbage it cleans for: none runs again before a compaction (which
    /// may release values) has.
    fruitless_at: Option<u64>,
}

impl DeepPassState {
    /// Whether a deep pass may run after `compactions` compactions.
    fn allowed(&mut self, compactions: u64) -> bool {
        if self.fruitless_at.is_some_and(|at| at != compactions) {
            self.fruitless_at = None;
        }
        self.fruitless_at.is_none()
    }

    /// A deep pass cleaned a segment of `meta` and found `dead` bytes of
    /// garbage in it, after `compactions` compactions.
    pub(crate) fn cleaned(&mut self, meta: &SegMeta, dead: u64, compactions: u64) {
        let expected = meta.written_bytes as f64 * DEEP_PASS_GAIN;
        if (dead as f64) < expected / 2.0 {
            self.fruitless_at = Some(compactions);
        }
    }
}

/// The segment a deep pass would clean, and where it relocates.
pub(crate) struct DeepVictim {
    pub(crate) reserve: Reserve,
    pub(crate) victim: (SegmentId, SegMeta),
}

impl DbInner {
    /// The segment a deep pass would clean now, if one may run after
    /// `compactions` compactions and a segment clearly less live than the
    /// densest fits where it may relocate. Whether it should run yet is
    /// [`Self::deep_pass_due`].
    pub(crate) fn deep_victim(&self, st: &mut MaintState, compactions: u64) -> Option<DeepVictim> {
        if !st.gc.deep.allowed(compactions) {
            return None;
        }
        let reserve = self.deep_pass_reserve(st);
        let victim = self.victims(st, self.deep_pass_live(), 1, reserve).pop()?;
        Some(DeepVictim { reserve, victim })
    }

    /// Whether a deep pass may run: nothing cheaper can release space —
    /// the writes waiting in the memtables and runs are not worth a merge
    /// yet (`lowspace.rs`; cleaning first would relocate values about to
    /// die), and no segment cleaned or released earlier waits to be freed.
    pub(crate) fn deep_pass_due(&self, st: &MaintState) -> bool {
        self.sv.read().imm.is_none()
            && st.gc.settled()
            && self.flash.pending_free_segments() == 0
            && !self.low_space_merge_due(true)
    }

    /// The free segments ordinary writes must leave while a deep pass
    /// relocates `victim` with `reserve`: its reserve and the whole
    /// segments the victim's live bytes need (with the margin its choice
    /// allowed for record framing and segment ends), plus one, since the
    /// write that finds exactly that many free may open one more. Below
    /// that they wait for the pass, whenever they get there: writes that
    /// appended into the room the relocation counted on made it fail half
    /// done with 2 segments free, and neither a merge nor another pass
    /// could run again. (Checked only at the pass's start, a pass that
    /// began with room to spare could still lose it to writes while it
    /// ran; a fixed floor of two segments beyond the victim's held writes
    /// back for most of each pass on a nearly full device: random writes
    /// ran measurably slower, `bench/RESULTS.md`, session 41.)
    pub(crate) fn deep_pass_write_floor(&self, reserve: Reserve, victim: &SegMeta) -> u32 {
        let Reserve::LeaveFree(keep) = reserve else {
            return 0;
        };
        let segment = self.flash.geometry().segment_bytes().max(1);
        let margin = relocation_margin(reserve, segment);
        let need = (victim.live_bytes + margin).div_ceil(segment);
        keep.saturating_add(u32::try_from(need).unwrap_or(u32::MAX))
            .saturating_add(1)
    }

    /// Where a deep pass relocates: never into the segments a merge needs
    /// ([`DEEP_PASS_KEEP`]), nor into the one the flush completing the pass
    /// needs when the keytable segment has no room for it. (Relocating
    /// into the last free segments wedged a small, overfull device: its
    /// merges could never run again.)
    fn deep_pass_reserve(&self, st: &MaintState) -> Reserve {
        let flush = u32::from(!self.deep_flush_fits(st));
        Reserve::LeaveFree(DEEP_PASS_KEEP + flush)
    }

    /// The live fraction below which a deep pass cleans a segment (see
    /// [`DEEP_PASS_GAIN`]).
    pub(crate) fn deep_pass_live(&self) -> f64 {
        self.vlog.densest_live_fraction() - DEEP_PASS_GAIN
    }

    /// Whether deep passes wait for a keytable segment: theirs has no room
    /// for their flush and too few segments are free to open one beside
    /// the relocation. A merge of the runs then opens it (and the old one
    /// is freed once the merge replaced what it held).
    pub(crate) fn deep_pass_blocked(&self, st: &MaintState) -> bool {
        self.flash.free_segments() <= DEEP_PASS_KEEP + 1 && !self.deep_flush_fits(st)
    }

    /// Whether the keytable segment has room for the flush that completes
    /// a deep pass (see [`Self::deep_flush_pages`]).
    fn deep_flush_fits(&self, st: &MaintState) -> bool {
        let seg_pages = self.flash.geometry().pages_per_segment;
        u64::from(st.kt.room_pages(seg_pages)) >= self.deep_flush_pages()
    }

    /// Keytable pages the flush completing a deep pass writes at most: the
    /// relocated entries of a victim (at most `1 - DEEP_PASS_GAIN` live)
    /// and what the memtable holds, each entry taking its share of
    /// the keytables now (their bytes per live value byte, and per entry),
    /// plus [`KT_FLUSH_SLACK_PAGES`]. The ordinary estimate, twice the
    /// first level, is L1 itself when no run is flushed: a deep pass then
    /// always counted on a keytable segment of its own, and with three
    /// segments free none could run.
    pub(crate) fn deep_flush_pages(&self) -> u64 {
        let (version, memtable_entries) = {
            let sv = self.sv.read();
            (sv.version.clone(), sv.mem.len() as u64)
        };
        let (entries, bytes) = self.keytable_totals(&version, version.levels.len());
        let live = u128::from(self.vlog.live_bytes().max(1));
        let victim = self.flash.geometry().segment_bytes() as f64 * (1.0 - DEEP_PASS_GAIN);
        let relocated = victim as u128 * u128::from(bytes) / live;
        let held = u128::from(memtable_entries) * u128::from(bytes) / u128::from(entries.max(1));
        let pages = (relocated + held) / self.page as u128 + 1;
        u64::try_from(pages)
            .unwrap_or(u64::MAX)
            .saturating_add(KT_FLUSH_SLACK_PAGES)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::test_support::small_db;
    use crate::vlog::{Reserve, SegMeta};

    /// While a deep pass relocates, an ordinary write that would leave
    /// fewer free segments than its floor is refused for room (and waits,
    /// when it may); deletes go on, and at the floor writes go on too.
    #[test]
    fn ordinary_writes_leave_a_deep_pass_its_floor_and_deletes_go_on() {
        let db = small_db();
        db.put(b"a", b"1").expect("put");
        let inner = &db.inner;
        let free = inner.flash.free_segments();
        inner.signal.set_deep_pass_floor(free + 1);
        assert!(matches!(db.put(b"b", b"2"), Err(Error::NoSpace)));
        db.delete(b"a").expect("a delete goes on");
        inner.signal.set_deep_pass_floor(free);
        db.put(b"b", b"2").expect("a write at the floor");
        inner.signal.set_deep_pass_floor(0);
        db.put(b"c", b"3").expect("a write with no pass running");
        assert_eq!(db.get(b"a").expect("get"), None);
    }

    /// The floor leaves the pass's reserve and the whole segments its
    /// victim's live bytes and margin need, plus the one a write may open.
    #[test]
    fn the_floor_leaves_the_room_the_victims_relocation_needs() {
        let db = small_db();
        let inner = &db.inner;
        let segment = inner.flash.geometry().segment_bytes();
        let victim = |live: u64| SegMeta {
            epoch: 0,
            gen: 0,
            live_bytes: live,
            written_bytes: segment,
            sealed: true,
        };
        let keep = Reserve::LeaveFree(2);
        assert_eq!(inner.deep_pass_write_floor(keep, &victim(segment / 2)), 4);
        assert_eq!(
            inner.deep_pass_write_floor(keep, &victim(segment * 7 / 8)),
            4
        );
        assert_eq!(
            inner.deep_pass_write_floor(keep, &victim(segment * 19 / 20)),
            5
        );
        assert_eq!(
            inner.deep_pass_write_floor(Reserve::Internal, &victim(1)),
            0
        );
    }
}
