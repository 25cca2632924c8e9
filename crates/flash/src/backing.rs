//! Segment allocation, and the free segments a full host cannot take away.
//!
//! A device file is sparse: a segment takes blocks of the host file system
//! only once it is written, and gives them back when it is trimmed. When
//! other files fill that file system, a sparse device could not write
//! anything, not even the deletes and the GC that would make room. So:
//!
//! - Every allocation *prepares* its segment ([`Device::prepare`]): its
//!   blocks are allocated before it is handed out, so no write into a
//!   segment in use finds the host full; a host that lacks the room fails
//!   the allocation instead, before anything is written.
//! - Up to `target` Free segments are kept *backed* (allocated, never
//!   punched): a released segment stays backed while fewer are, and
//!   allocations take unbacked segments while there are any. The owner
//!   sets `target` to the segments its space-making work needs
//!   ([`FlashStore::keep_backed`]).
//! - While the host is full ([`FlashStore::host_full`]: an allocation
//!   found no room to back its segment), allocations for new data fail,
//!   and only backed segments count as free and are handed out, to work
//!   that makes room ([`Purpose`]), so the owner's own reserve rules apply
//!   to what can really be written. It ends when a segment can be backed
//!   again ([`FlashStore::replenish`], which the owner calls now and then
//!   while the host is full).
//!
//! Invariant: an entry's `backed` flag is true only for a Free segment
//! whose range a successful `prepare` allocated since it was last trimmed.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::error::{FlashError, Result};
use crate::latency::DeviceOp;
use crate::store::{Entry, EntryState, FlashStore};
use crate::SegmentId;

/// What an allocation is for: whether it may take the backed reserve while
/// the host file system is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// New data: refused while the host is full.
    NewData,
    /// Work that makes room or keeps the store consistent (deletes, GC,
    /// flushes, compactions): takes backed segments while the host is full.
    MakesRoom,
}

/// How many Free segments to keep backed, and whether the host is full.
#[derive(Debug, Default)]
pub(crate) struct Backing {
    /// Free segments to keep backed.
    target: AtomicU32,
    /// Set when backing a segment failed for want of room on the host;
    /// cleared when one could be backed again.
    host_full: AtomicBool,
}

/// The Free segment with the lowest erase count (ties: lowest id) that
/// `eligible` admits.
fn pick(table: &[Entry], eligible: impl Fn(usize, &Entry) -> bool) -> Option<SegmentId> {
    table
        .iter()
        .enumerate()
        .filter(|(i, e)| e.state == EntryState::Free && eligible(*i, e))
        .min_by_key(|(i, e)| (e.erase_count, *i))
        .map(|(i, _)| i as SegmentId)
}

impl FlashStore {
    /// Keeps `n` Free segments backed from now on, and backs them now.
    /// Which segments a previous run kept backed is not recorded, so every
    /// Free segment is trimmed first (giving their blocks back), and `n`
    /// of them backed again: restarts do not leave the file holding more.
    /// Call it once recovery has claimed every segment it found written
    /// (trimming and backing erase). `HostFull` when the host lacks the
    /// room for all of them (the store still hands out unbacked segments
    /// until an allocation finds no room). Nothing to do on a device whose
    /// space is its own ([`crate::Device::allocates_on_write`]).
    pub fn keep_backed(&self, n: u32) -> Result<()> {
        if !self.dev.allocates_on_write() {
            // A raw device's space is its own: nothing to back (and no
            // reason to discard every free segment at each start).
            return Ok(());
        }
        self.backing.target.store(n, Ordering::Relaxed);
        let free: Vec<SegmentId> = {
            let table = self.table.lock();
            (0..table.len())
                .filter(|&i| table[i].state == EntryState::Free && !table[i].backed)
                .map(|i| i as SegmentId)
                .collect()
        };
        for seg in free {
            self.trim_segment(seg)?;
        }
        self.back_free(usize::MAX)
    }

    /// [`crate::Device::prepare`] of segment `seg`'s whole range.
    fn prepare_segment(&self, seg: SegmentId) -> Result<()> {
        self.device_op(DeviceOp::Prepare, || {
            self.dev
                .prepare(self.segment_offset(seg), self.geo.segment_bytes())
        })
    }

    /// [`crate::Device::trim`] of segment `seg`'s whole range.
    fn trim_segment(&self, seg: SegmentId) -> Result<()> {
        self.device_op(DeviceOp::Trim, || {
            self.dev
                .trim(self.segment_offset(seg), self.geo.segment_bytes())
        })
    }

    /// True while the host file system lacks room to back a segment: then
    /// only backed segments are free ([`FlashStore::free_segments`]).
    pub fn host_full(&self) -> bool {
        self.backing.host_full.load(Ordering::Acquire)
    }

    /// Free segments that are backed.
    pub(crate) fn backed_free(&self, table: &[Entry]) -> u32 {
        table
            .iter()
            .filter(|e| e.state == EntryState::Free && e.backed)
            .count() as u32
    }

    /// Free segments an allocation may take now.
    pub(crate) fn usable_free(&self, table: &[Entry]) -> u32 {
        if self.host_full() {
            self.backed_free(table)
        } else {
            self.usable_free_ignoring_host(table)
        }
    }

    /// Free segments, backed or not.
    fn usable_free_ignoring_host(&self, table: &[Entry]) -> u32 {
        table.iter().filter(|e| e.state == EntryState::Free).count() as u32
    }

    /// Backs Free segments until the target is met; while the host is full,
    /// tries one more to see whether it has room again (which ends the
    /// host-full state). `HostFull` when it still lacks the room.
    pub fn replenish(&self) -> Result<()> {
        self.back_free(1)
    }

    /// Backs Free segments, each tried at most once, until the target is
    /// met or `max_failures` found no room; with the target met while the
    /// host is full, backs one more as a probe. A segment backed ends the
    /// host-full state; a reserve short of its target does not start it
    /// (only an allocation that finds no room does): a host with room for
    /// some segments but not the whole reserve still takes new data.
    fn back_free(&self, max_failures: usize) -> Result<()> {
        let mut tried = vec![false; self.geo.segment_count as usize];
        let mut failure: Option<FlashError> = None;
        let mut failures = 0;
        let mut backed_any = false;
        let mut probed = false;
        loop {
            let seg = {
                let mut table = self.table.lock();
                let need = self.backed_free(&table) < self.backing.target.load(Ordering::Relaxed);
                let probe = !need && self.host_full() && !probed && failures == 0 && !backed_any;
                if !need && !probe {
                    break;
                }
                let Some(seg) = pick(&table, |i, e| !e.backed && !tried[i]) else {
                    if self.backed_free(&table) == self.usable_free_ignoring_host(&table) {
                        // Every Free segment is backed: nothing needs the host.
                        backed_any = true;
                    }
                    break;
                };
                tried[seg as usize] = true;
                probed |= probe;
                table[seg as usize].state = EntryState::Backing;
                seg
            };
            let backed = self.prepare_segment(seg);
            {
                let mut table = self.table.lock();
                let entry = &mut table[seg as usize];
                entry.state = EntryState::Free;
                entry.backed = backed.is_ok();
            }
            match backed {
                Ok(()) => backed_any = true,
                Err(e) if e.is_host_full() => {
                    failure = Some(e);
                    failures += 1;
                    if failures >= max_failures {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if backed_any {
            self.backing.host_full.store(false, Ordering::Release);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Allocates a Free segment for `purpose`: an unbacked one if there is
    /// one (the lowest erase count, ties: lowest id), else a backed one;
    /// while the host is full, a backed one for [`Purpose::MakesRoom`] and
    /// none for [`Purpose::NewData`]. Prepares it (erased, its blocks
    /// allocated) and marks it Used with `kind`; returns it and its new
    /// erase count. Fails, changing nothing, when no more than `keep`
    /// segments are free: `NoSpace`, or `HostFull` while the host is full
    /// (see the module documentation).
    ///
    /// After [`FlashStore::open`], [`FlashStore::claim`] every segment written
    /// since the last checkpoint *before* allocating, or this may erase one.
    pub fn allocate_for(&self, purpose: Purpose, kind: u8, keep: u32) -> Result<(SegmentId, u32)> {
        loop {
            let full = self.host_full();
            if full && purpose == Purpose::NewData {
                return Err(FlashError::host_out_of_room());
            }
            let seg = {
                let mut table = self.table.lock();
                if self.usable_free(&table) <= keep {
                    return Err(if full {
                        FlashError::host_out_of_room()
                    } else {
                        FlashError::NoSpace
                    });
                }
                let seg = if full {
                    pick(&table, |_, e| e.backed)
                } else {
                    pick(&table, |_, e| !e.backed).or_else(|| pick(&table, |_, _| true))
                }
                .ok_or(FlashError::NoSpace)?;
                table[seg as usize].state = EntryState::Allocating;
                seg
            };
            let prepared = self.prepare_segment(seg);
            match self.finish_allocation(seg, kind, prepared) {
                Err(e) if e.is_host_full() && !full => {
                    // Only backed segments may be handed out now, and only
                    // to work that makes room: try again so.
                    self.backing.host_full.store(true, Ordering::Release);
                }
                done => return done,
            }
        }
    }

    /// Marks `seg` (being allocated) Used with `kind` if its erase
    /// succeeded, Free again if not; returns it and its new erase count.
    fn finish_allocation(
        &self,
        seg: SegmentId,
        kind: u8,
        erased: Result<()>,
    ) -> Result<(SegmentId, u32)> {
        let mut table = self.table.lock();
        let entry = &mut table[seg as usize];
        entry.backed = false;
        match erased {
            Ok(()) => {
                entry.state = EntryState::Used;
                entry.kind = kind;
                entry.erase_count = entry.erase_count.saturating_add(1);
                Ok((seg, entry.erase_count))
            }
            Err(e) => {
                entry.state = EntryState::Free;
                Err(e)
            }
        }
    }

    /// Allocates as [`FlashStore::allocate_for`] work that makes room,
    /// leaving nothing.
    pub fn allocate(&self, kind: u8) -> Result<(SegmentId, u32)> {
        self.allocate_for(Purpose::MakesRoom, kind, 0)
    }

    /// Allocates as [`FlashStore::allocate`] but, when the host file system
    /// has no room to back a segment, hands out one that is only erased
    /// (trimmed): writes into it may then find the host full. For a store
    /// that must open on a full host, to serve reads and wait for room.
    pub fn allocate_sparse(&self, kind: u8) -> Result<(SegmentId, u32)> {
        match self.allocate(kind) {
            Err(e) if e.is_host_full() => {}
            other => return other,
        }
        let seg = {
            let mut table = self.table.lock();
            let seg = pick(&table, |_, _| true).ok_or(FlashError::NoSpace)?;
            table[seg as usize].state = EntryState::Allocating;
            seg
        };
        let erased = self.trim_segment(seg);
        self.finish_allocation(seg, kind, erased)
    }

    /// Erases released segment `seg` (its checkpoint is durable) and marks
    /// it Free: backed (blocks kept) while fewer than the target are,
    /// otherwise trimmed, giving its blocks back to the host.
    pub(crate) fn free_released(&self, seg: SegmentId) -> Result<()> {
        let keep = {
            let table = self.table.lock();
            self.backed_free(&table) < self.backing.target.load(Ordering::Relaxed)
        };
        let backed = keep && self.prepare_segment(seg).is_ok();
        if !backed {
            self.trim_segment(seg)?;
        }
        let mut table = self.table.lock();
        let entry = &mut table[seg as usize];
        if entry.state == EntryState::PendingFree {
            entry.state = EntryState::Free;
            entry.backed = backed;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Purpose;
    use crate::{Device, FlashStore, FormatOptions, NandConfig, NandDevice};

    const PS: u32 = 4096;
    const PPS: u32 = 16;
    const SEG_BYTES: u64 = PS as u64 * PPS as u64;

    fn device() -> Arc<NandDevice> {
        NandDevice::new(NandConfig {
            page_size: PS,
            capacity: PS as u64 * (1 + 2 * 8 + 10 * PPS as u64),
            ..Default::default()
        })
    }

    fn format(dev: &Arc<NandDevice>) -> FlashStore {
        let d: Arc<dyn Device> = dev.clone();
        FlashStore::format(
            d,
            &FormatOptions {
                pages_per_segment: PPS,
                meta_slot_bytes: Some(8 * PS as u64),
            },
        )
        .expect("format")
    }

    #[test]
    fn a_full_host_leaves_the_backed_reserve_to_work_that_makes_room() {
        let dev = device();
        let store = format(&dev);
        store.keep_backed(3).expect("room for the reserve");
        assert_eq!(store.stats().segments_backed, 3);
        // New data takes unbacked segments, not the reserve.
        let (data, _) = store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect("new data");
        assert_eq!(store.stats().segments_backed, 3);
        // Other files take every block the device file does not hold yet.
        dev.set_host_space(Some(dev.host_space_used()));
        let e = store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect_err("no room for new data");
        assert!(e.is_host_full(), "{e}");
        assert!(store.host_full());
        assert_eq!(store.free_segments(), 3, "only backed segments are free");
        let e = store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect_err("the reserve is not for new data");
        assert!(e.is_host_full(), "{e}");
        // Work that makes room takes the reserve, down to what it leaves.
        let (a, _) = store
            .allocate_for(Purpose::MakesRoom, 2, 1)
            .expect("reserve");
        store
            .write(a, 0, &vec![7u8; PS as usize])
            .expect("a backed segment takes writes");
        store
            .allocate_for(Purpose::MakesRoom, 2, 1)
            .expect("reserve");
        let e = store
            .allocate_for(Purpose::MakesRoom, 2, 1)
            .expect_err("one left");
        assert!(e.is_host_full(), "{e}");
        // A released segment returns to the reserve, blocks kept.
        store.release(data).expect("release");
        store
            .checkpoint(b"")
            .expect("a checkpoint finds room on a full host");
        assert_eq!(store.stats().segments_backed, 2);
        assert!(store.host_full());
        // Room again on the host: the next probe ends the host-full state.
        dev.set_host_space(None);
        store.replenish().expect("room");
        assert!(!store.host_full());
        assert_eq!(store.stats().segments_backed, 3);
        store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect("new data again");
    }

    #[test]
    fn released_segments_beyond_the_reserve_give_their_blocks_back() {
        let dev = device();
        let store = format(&dev);
        store.keep_backed(1).expect("reserve");
        let segs: Vec<_> = (0..4)
            .map(|_| {
                store
                    .allocate_for(Purpose::NewData, 1, 0)
                    .expect("allocate")
                    .0
            })
            .collect();
        let held = dev.host_space_used();
        for s in &segs {
            store.release(*s).expect("release");
        }
        store.checkpoint(b"").expect("checkpoint");
        // The reserve was whole: all four are trimmed.
        assert_eq!(dev.host_space_used(), held - 4 * SEG_BYTES);
        assert_eq!(store.stats().segments_backed, 1);
    }

    #[test]
    fn restarts_do_not_leave_the_file_holding_more() {
        let dev = device();
        let store = format(&dev);
        store.keep_backed(3).expect("reserve");
        let held = dev.host_space_used();
        // Wear one backed segment (taken on a full host, released, kept
        // backed), so it is no longer among the least worn at the restart.
        dev.set_host_space(Some(held));
        let (seg, _) = store
            .allocate_for(Purpose::MakesRoom, 2, 0)
            .expect("reserve");
        dev.set_host_space(None);
        store.release(seg).expect("release");
        store.checkpoint(b"").expect("checkpoint");
        assert_eq!(store.stats().segments_backed, 3);
        assert_eq!(dev.host_space_used(), held);
        drop(store);
        for _ in 0..3 {
            let d: Arc<dyn Device> = dev.clone();
            let (store, _) = FlashStore::open(d).expect("open");
            store.keep_backed(3).expect("reserve");
            assert_eq!(store.stats().segments_backed, 3);
        }
        assert_eq!(dev.host_space_used(), held);
    }

    #[test]
    fn backed_segments_are_found_again_after_a_restart_on_a_full_host() {
        let dev = device();
        let store = format(&dev);
        store.keep_backed(3).expect("reserve");
        store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect("allocate");
        store.checkpoint(b"").expect("checkpoint");
        drop(store);
        dev.set_host_space(Some(dev.host_space_used()));
        let d: Arc<dyn Device> = dev.clone();
        let (store, _) = FlashStore::open(d).expect("open");
        store.keep_backed(3).expect("the reserve needs no new room");
        assert_eq!(store.stats().segments_backed, 3);
        assert!(
            !store.host_full(),
            "a short reserve alone is not a full host"
        );
        let e = store
            .allocate_for(Purpose::NewData, 1, 0)
            .expect_err("no room for new data");
        assert!(e.is_host_full(), "{e}");
        store
            .allocate_for(Purpose::MakesRoom, 2, 2)
            .expect("reserve");
    }
}
