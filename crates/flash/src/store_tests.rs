//! Tests of [`FlashStore`] on both backends: an in-memory [`NandDevice`] and a
//! [`FileDevice`] on a temporary file.

use super::*;
use crate::{FileDevice, LossMode, NandConfig, NandDevice};

const PS: u32 = 4096;
const PPS: u32 = 16;
const SLOT_PAGES: u64 = 8;
const SEGS: u32 = 8;
const CAPACITY: u64 = PS as u64 * (1 + 2 * SLOT_PAGES + SEGS as u64 * PPS as u64);

fn opts() -> FormatOptions {
    FormatOptions {
        pages_per_segment: PPS,
        meta_slot_bytes: Some(SLOT_PAGES * PS as u64),
    }
}

fn nand_with(loss: LossMode) -> Arc<NandDevice> {
    NandDevice::new(NandConfig {
        page_size: PS,
        capacity: CAPACITY,
        loss,
        ..Default::default()
    })
}

/// Runs `f` once per backend with a fresh, unformatted device.
fn on_both(f: impl Fn(&str, Arc<dyn Device>)) {
    f("nand", nand_with(LossMode::AllUnsynced));
    let dir = tempfile::tempdir().unwrap();
    let file = FileDevice::open(&dir.path().join("dev"), Some(CAPACITY), PS).unwrap();
    f("file", file);
}

fn page_of(byte: u8) -> Vec<u8> {
    vec![byte; PS as usize]
}

fn read_page(store: &FlashStore, seg: SegmentId, page: u32) -> Vec<u8> {
    let mut buf = vec![0u8; PS as usize];
    store
        .read(seg, u64::from(page) * u64::from(PS), &mut buf)
        .unwrap();
    buf
}

/// Flips one bit at `offset` through the device interface (works on both backends).
fn corrupt(dev: &dyn Device, offset: u64) {
    let ps = u64::from(dev.page_size());
    let page = offset / ps * ps;
    let mut buf = vec![0u8; ps as usize];
    dev.read_at(page, &mut buf).unwrap();
    buf[(offset - page) as usize] ^= 0x10;
    dev.trim(page, ps).unwrap();
    dev.write_at(page, &buf).unwrap();
    dev.sync().unwrap();
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FlashStore>();
}

#[test]
fn format_open_roundtrip() {
    on_both(|name, dev| {
        assert!(!FlashStore::is_formatted(dev.as_ref()).unwrap(), "{name}");
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        assert!(FlashStore::is_formatted(dev.as_ref()).unwrap());
        let geo = store.geometry();
        assert_eq!(
            geo,
            Geometry {
                page_size: PS,
                pages_per_segment: PPS,
                segment_count: SEGS
            }
        );
        assert_eq!(geo.segment_bytes(), u64::from(PS * PPS));
        let (seg, _) = store.allocate(7).unwrap();
        store.checkpoint(b"manifest v1").unwrap();
        drop(store);

        let (store, user) = FlashStore::open(dev.clone()).unwrap();
        assert_eq!(user, b"manifest v1", "{name}");
        let info = store.segment_info(seg).unwrap();
        assert_eq!(
            (info.state, info.kind, info.erase_count),
            (SegmentState::Used, 7, 1)
        );
        store.checkpoint(b"manifest v2").unwrap();
        drop(store);
        let (_, user) = FlashStore::open(dev).unwrap();
        assert_eq!(user, b"manifest v2", "{name}");
    });
}

#[test]
fn fresh_format_has_empty_blob_and_free_table() {
    on_both(|name, dev| {
        FlashStore::format(dev.clone(), &opts()).unwrap();
        let (store, user) = FlashStore::open(dev).unwrap();
        assert!(user.is_empty(), "{name}");
        assert!(store
            .segments()
            .iter()
            .all(|s| s.state == SegmentState::Free && s.erase_count == 0));
        let st = store.stats();
        assert_eq!(
            (st.segments_total, st.segments_free, st.segments_used),
            (SEGS, SEGS, 0)
        );
    });
}

#[test]
fn default_options_compute_slot_and_segments() {
    let dev = NandDevice::new(NandConfig {
        capacity: 256 << 20,
        ..Default::default()
    });
    let store = FlashStore::format(dev, &FormatOptions::default()).unwrap();
    // 2 MiB slots: (256 MiB - 8 KiB - 4 MiB) / 64 MiB = 3 segments.
    assert_eq!(store.slot_bytes, 2 << 20);
    assert_eq!(store.geometry().segment_count, 3);
    assert_eq!(store.geometry().segment_bytes(), 64 << 20);
}

#[test]
fn format_rejects_impossible_layouts() {
    let dev = nand_with(LossMode::AllUnsynced);
    let huge = FormatOptions {
        pages_per_segment: 1 << 20,
        meta_slot_bytes: Some(4096),
    };
    assert!(matches!(
        FlashStore::format(dev.clone(), &huge),
        Err(FlashError::InvalidArgument(_))
    ));
    let zero = FormatOptions {
        pages_per_segment: 0,
        meta_slot_bytes: None,
    };
    assert!(matches!(
        FlashStore::format(dev, &zero),
        Err(FlashError::InvalidArgument(_))
    ));
}

#[test]
fn allocate_until_no_space() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        for expected in 0..SEGS {
            assert_eq!(store.allocate(1).unwrap(), (expected, 1), "{name}");
        }
        assert!(matches!(store.allocate(1), Err(FlashError::NoSpace)));
        assert_eq!(store.stats().segments_used, SEGS);
    });
}

#[test]
fn released_segment_reusable_only_after_checkpoint() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        for _ in 0..SEGS {
            store.allocate(0).unwrap();
        }
        store.write(3, 0, &page_of(0xAB)).unwrap();
        store.release(3).unwrap();
        assert_eq!(
            store.segment_info(3).unwrap().state,
            SegmentState::PendingFree
        );
        assert!(
            matches!(store.allocate(0), Err(FlashError::NoSpace)),
            "{name}"
        );
        assert!(matches!(
            store.release(3),
            Err(FlashError::InvalidArgument(_))
        ));
        assert!(matches!(
            store.write(3, 1, &page_of(1)),
            Err(FlashError::InvalidArgument(_))
        ));
        // Still readable until the checkpoint.
        assert_eq!(read_page(&store, 3, 0), page_of(0xAB));
        assert_eq!(store.stats().segments_pending_free, 1);

        store.checkpoint(b"").unwrap();
        assert_eq!(store.segment_info(3).unwrap().state, SegmentState::Free);
        assert_eq!(store.allocate(5).unwrap(), (3, 2));
        let info = store.segment_info(3).unwrap();
        assert_eq!((info.state, info.kind), (SegmentState::Used, 5));
        // Erased on reallocation, so page 0 is writable again (strict append on NAND).
        store.write(3, 0, &page_of(0xCD)).unwrap();
        assert_eq!(read_page(&store, 3, 0), page_of(0xCD));
    });
}

#[test]
fn erase_counts_level_across_segments() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        for round in 0..2 * SEGS {
            let (seg, count) = store.allocate(0).unwrap();
            // Least-worn first, ties by lowest id: a strict rotation.
            assert_eq!(seg, round % SEGS, "{name}");
            assert_eq!(count, round / SEGS + 1);
            store.release(seg).unwrap();
            store.checkpoint(&round.to_le_bytes()).unwrap();
        }
        assert!(store.segments().iter().all(|s| s.erase_count == 2));
        let st = store.stats();
        assert_eq!(st.erase_count_max, 2);
        assert!((st.erase_count_avg - 2.0).abs() < 1e-9);
        assert_eq!(st.checkpoints, 1 + 2 * u64::from(SEGS));
    });
}

#[test]
fn erase_counts_survive_reopen() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        for _ in 0..3 {
            let (seg, _) = store.allocate(2).unwrap();
            store.release(seg).unwrap();
            store.checkpoint(b"x").unwrap();
        }
        let before = store.segments();
        drop(store);
        let (store, _) = FlashStore::open(dev).unwrap();
        let after = store.segments();
        let counts = |v: &[SegmentInfo]| v.iter().map(|s| s.erase_count).collect::<Vec<_>>();
        assert_eq!(counts(&before), counts(&after), "{name}");
        assert_eq!(counts(&after)[..3], [1, 1, 1]);
    });
}

#[test]
fn claim_recovers_segment_written_after_checkpoint() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        store.checkpoint(b"before").unwrap();
        let (seg, count) = store.allocate(9).unwrap();
        store.write(seg, 0, &page_of(0x5A)).unwrap();
        store.sync().unwrap();
        drop(store); // crash: the allocation was never checkpointed

        let (store, user) = FlashStore::open(dev).unwrap();
        assert_eq!(user, b"before", "{name}");
        assert_eq!(store.segment_info(seg).unwrap().state, SegmentState::Free);
        // Recovery reads the content, then claims the segment without erasing it.
        assert_eq!(read_page(&store, seg, 0), page_of(0x5A));
        assert_eq!(store.claim(seg, 9).unwrap(), count);
        assert_eq!(read_page(&store, seg, 0), page_of(0x5A));
        let info = store.segment_info(seg).unwrap();
        assert_eq!(
            (info.state, info.kind, info.erase_count),
            (SegmentState::Used, 9, count)
        );
        store.write(seg, 1, &page_of(0x5B)).unwrap();
        assert!(matches!(
            store.claim(seg, 9),
            Err(FlashError::InvalidArgument(_))
        ));
        assert!(matches!(store.claim(SEGS, 9), Err(FlashError::InvalidSegment(s)) if s == SEGS));
    });
}

#[test]
fn write_and_read_validate_arguments() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        assert!(
            matches!(
                store.write(0, 0, &page_of(1)),
                Err(FlashError::InvalidArgument(_))
            ),
            "{name}"
        );
        let (seg, _) = store.allocate(0).unwrap();
        assert!(matches!(
            store.write(seg, 0, &[1u8; 100]),
            Err(FlashError::Misaligned(_))
        ));
        assert!(matches!(
            store.write(seg, PPS - 1, &[1u8; 2 * PS as usize]),
            Err(FlashError::OutOfRange(_))
        ));
        assert!(matches!(
            store.write(SEGS, 0, &page_of(1)),
            Err(FlashError::InvalidSegment(_))
        ));
        store.write(seg, PPS - 1, &page_of(1)).unwrap();
        let mut buf = vec![0u8; PS as usize];
        assert!(matches!(
            store.read(seg, 100, &mut buf),
            Err(FlashError::Misaligned(_))
        ));
        assert!(matches!(
            store.read(seg, u64::from(PS * PPS), &mut buf),
            Err(FlashError::OutOfRange(_))
        ));
        assert!(matches!(
            store.read(SEGS, 0, &mut buf),
            Err(FlashError::InvalidSegment(_))
        ));
        assert!(matches!(
            store.segment_info(SEGS),
            Err(FlashError::InvalidSegment(_))
        ));
        assert!(matches!(
            store.release(seg + 1),
            Err(FlashError::InvalidArgument(_))
        ));
    });
}

#[test]
fn read_many_across_segments() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        let (a, _) = store.allocate(0).unwrap();
        let (b, _) = store.allocate(0).unwrap();
        let mut data = page_of(1);
        data.extend(page_of(2));
        store.write(a, 0, &data).unwrap();
        store.write(b, 4, &page_of(3)).unwrap();
        let (mut x, mut y, mut z) = (vec![0u8; 4096], vec![0u8; 4096], vec![0u8; 8192]);
        let mut reqs: Vec<(SegmentId, u64, &mut [u8])> =
            vec![(a, 4096, &mut x), (b, 4 * 4096, &mut y), (a, 0, &mut z)];
        store.read_many(&mut reqs).unwrap();
        assert_eq!(x, page_of(2), "{name}");
        assert_eq!(y, page_of(3));
        assert_eq!(z, data);
        let mut bad: Vec<(SegmentId, u64, &mut [u8])> = vec![(a, 3, &mut x)];
        assert!(matches!(
            store.read_many(&mut bad),
            Err(FlashError::Misaligned(_))
        ));
    });
}

#[test]
fn concurrent_writers_on_distinct_segments() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let store = &store;
                s.spawn(move || {
                    let (seg, _) = store.allocate(t).unwrap();
                    for p in 0..PPS {
                        store
                            .write(seg, p, &page_of(t.wrapping_mul(16).wrapping_add(p as u8)))
                            .unwrap();
                    }
                });
            }
        });
        store.sync().unwrap();
        for seg in 0..4 {
            let t = store.segment_info(seg).unwrap().kind;
            for p in 0..PPS {
                assert_eq!(
                    read_page(&store, seg, p),
                    page_of(t.wrapping_mul(16).wrapping_add(p as u8)),
                    "{name}"
                );
            }
        }
    });
}

#[test]
fn oversized_blob_is_metadata_full_and_harmless() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        store.checkpoint(b"small").unwrap();
        let big = vec![0u8; (SLOT_PAGES * PS as u64) as usize];
        match store.checkpoint(&big) {
            Err(FlashError::MetadataFull { needed, capacity }) => {
                assert!(needed > capacity, "{name}");
                assert_eq!(capacity as u64, SLOT_PAGES * PS as u64);
            }
            other => panic!("{name}: expected MetadataFull, got {other:?}"),
        }
        drop(store);
        assert_eq!(FlashStore::open(dev).unwrap().1, b"small");
    });
}

#[test]
fn corrupt_newest_slot_falls_back_to_other() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap(); // slot A, seq 1
        store.checkpoint(b"one").unwrap(); // slot B, seq 2
        store.checkpoint(b"two").unwrap(); // slot A, seq 3
        let slot_a = store.slot_offset(0);
        drop(store);
        // A bit in slot A's body (the user blob).
        corrupt(
            dev.as_ref(),
            slot_a + HEADER_LEN as u64 + 4 + 6 * u64::from(SEGS) + 8,
        );
        let (store, user) = FlashStore::open(dev.clone()).unwrap();
        assert_eq!(user, b"one", "{name}");
        // The next checkpoint goes into the corrupt slot A, leaving "one" intact.
        store.checkpoint(b"three").unwrap();
        drop(store);
        assert_eq!(FlashStore::open(dev).unwrap().1, b"three");
    });
}

#[test]
fn corrupt_both_slots_is_an_error() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        store.checkpoint(b"one").unwrap();
        let (a, b) = (store.slot_offset(0), store.slot_offset(1));
        drop(store);
        corrupt(dev.as_ref(), a + 17); // header field of A
        corrupt(dev.as_ref(), b + HEADER_LEN as u64 + 2); // body of B
        match FlashStore::open(dev) {
            Err(FlashError::Corrupt(msg)) => {
                assert!(msg.contains("slot A") && msg.contains("slot B"), "{msg}")
            }
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    });
}

#[test]
fn flipped_bit_on_nand_media_falls_back() {
    let dev = nand_with(LossMode::AllUnsynced);
    let store = FlashStore::format(dev.clone(), &opts()).unwrap();
    store.checkpoint(b"one").unwrap(); // B
    store.checkpoint(b"two").unwrap(); // A
    let (a, b) = (store.slot_offset(0), store.slot_offset(1));
    drop(store);
    dev.flip_bit(a + 30, 1);
    assert_eq!(FlashStore::open(dev.clone()).unwrap().1, b"one");
    dev.flip_bit(b + 50, 6);
    assert!(matches!(FlashStore::open(dev), Err(FlashError::Corrupt(_))));
}

#[test]
fn bad_superblock_is_rejected() {
    on_both(|name, dev| {
        assert!(
            matches!(
                FlashStore::open(dev.clone()),
                Err(FlashError::BadSuperblock(_))
            ),
            "{name}"
        );
        FlashStore::format(dev.clone(), &opts()).unwrap();
        corrupt(dev.as_ref(), 20); // segment count field: checksum mismatch
        assert!(FlashStore::is_formatted(dev.as_ref()).unwrap());
        assert!(
            matches!(
                FlashStore::open(dev.clone()),
                Err(FlashError::BadSuperblock(_))
            ),
            "{name}"
        );
        corrupt(dev.as_ref(), 0); // magic
        assert!(!FlashStore::is_formatted(dev.as_ref()).unwrap());
        assert!(matches!(
            FlashStore::open(dev),
            Err(FlashError::BadSuperblock(_))
        ));
    });
}

#[test]
fn superblock_must_match_device() {
    let dev = nand_with(LossMode::AllUnsynced);
    FlashStore::format(dev.clone(), &opts()).unwrap();
    // Same content on a smaller device: the layout no longer fits.
    let mut image = vec![0u8; CAPACITY as usize];
    dev.read_at(0, &mut image).unwrap();
    let small = NandDevice::new(NandConfig {
        page_size: PS,
        capacity: CAPACITY - u64::from(PS),
        ..Default::default()
    });
    small
        .write_at(0, &image[..(CAPACITY - u64::from(PS)) as usize])
        .unwrap();
    assert!(matches!(
        FlashStore::open(small),
        Err(FlashError::BadSuperblock(_))
    ));
}

#[test]
fn reformat_invalidates_old_checkpoints() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev.clone(), &opts()).unwrap();
        for i in 0..5u8 {
            store.checkpoint(&[i; 10]).unwrap();
        }
        drop(store);
        FlashStore::format(dev.clone(), &opts()).unwrap();
        let (store, user) = FlashStore::open(dev).unwrap();
        assert!(user.is_empty(), "{name}");
        assert_eq!(store.stats().segments_free, SEGS);
    });
}

/// One crash scenario: a checkpoint "new" (which also frees a released
/// segment) is cut after `cut` page writes. Returns whether it had completed.
fn crash_during_checkpoint(loss: LossMode, cut: u64) -> bool {
    let old = vec![1u8; 10_000];
    let new = vec![2u8; 20_000];
    let dev = nand_with(loss);
    let store = FlashStore::format(dev.clone(), &opts()).unwrap();
    let (kept, _) = store.allocate(1).unwrap();
    let (released, _) = store.allocate(2).unwrap();
    store.write(kept, 0, &page_of(0x11)).unwrap();
    store.write(released, 0, &page_of(0x22)).unwrap();
    store.sync().unwrap();
    store.checkpoint(&old).unwrap();
    store.release(released).unwrap();

    dev.cut_power_after_page_writes(Some(cut));
    let completed = match store.checkpoint(&new) {
        Ok(()) => true,
        Err(FlashError::PowerLoss) => false,
        Err(e) => panic!("cut {cut}: unexpected error {e}"),
    };
    drop(store);
    dev.cut_power_now();
    dev.power_cycle(cut);

    let (store, user) = FlashStore::open(dev.clone())
        .unwrap_or_else(|e| panic!("{loss:?} cut {cut}: open failed: {e}"));
    let released_state = store.segment_info(released).unwrap().state;
    if completed {
        assert!(user == new, "{loss:?} cut {cut}: completed checkpoint lost");
        assert_eq!(released_state, SegmentState::Free);
    } else {
        assert!(
            user == old,
            "{loss:?} cut {cut}: interrupted checkpoint visible"
        );
        // The old checkpoint still references the released segment: untouched.
        assert_eq!(released_state, SegmentState::Used);
        assert_eq!(read_page(&store, released, 0), page_of(0x22));
    }
    assert_eq!(read_page(&store, kept, 0), page_of(0x11));
    // The store keeps working after recovery (next slot is trimmed before reuse).
    store.checkpoint(b"after").unwrap();
    drop(store);
    assert_eq!(FlashStore::open(dev).unwrap().1, b"after");
    completed
}

#[test]
fn checkpoint_survives_power_cut_at_every_page_write() {
    let pages = checkpoint::encoded_len(SEGS as usize, 20_000).div_ceil(PS as usize) as u64;
    for loss in [LossMode::AllUnsynced, LossMode::RandomUnsynced] {
        for cut in 0..=pages + 1 {
            let completed = crash_during_checkpoint(loss, cut);
            assert_eq!(completed, cut >= pages, "{loss:?} cut {cut} of {pages}");
        }
    }
}

/// Every kind of device operation the store runs is timed: preparing a
/// segment, writing, reading, syncing, and trimming what a checkpoint
/// released.
#[test]
fn device_operations_are_timed_by_kind() {
    on_both(|name, dev| {
        let store = FlashStore::format(dev, &opts()).unwrap();
        let count = |op: DeviceOp| store.latency().of(op).map_or(0, |h| h.count);
        let before: Vec<u64> = DeviceOp::ALL.iter().map(|&op| count(op)).collect();
        let (seg, _) = store.allocate(0).unwrap();
        store.write(seg, 0, &page_of(7)).unwrap();
        store.sync().unwrap();
        assert_eq!(read_page(&store, seg, 0), page_of(7), "{name}");
        store.release(seg).unwrap();
        store.checkpoint(b"").unwrap();
        for (op, was) in DeviceOp::ALL.iter().zip(before) {
            assert!(count(*op) > was, "{name}: no {} timed", op.name());
        }
        let write = store
            .latency()
            .of(DeviceOp::Write)
            .cloned()
            .unwrap_or_default();
        assert!(write.max_us <= write.sum_us, "{name}: {write:?}");
    });
}
