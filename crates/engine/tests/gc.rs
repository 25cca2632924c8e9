//! Value GC under sustained random overwrites: space is reclaimed on its own
//! (background thread, no manual GC calls) and the device does not fill with
//! garbage. Also checks a segment holding one live value among garbage is
//! reclaimed.

mod common;

use common::*;
use engine::flash::LossMode;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[test]
fn sustained_overwrites_are_reclaimed_automatically() {
    for dev in TestDevice::both(32) {
        sustained_overwrites(&dev, 2000);
    }
}

/// The same with values large enough to be stored sector-aligned: GC
/// relocates them behind alignment pads and reads them back by value alone.
#[test]
fn sustained_overwrites_of_aligned_values_are_reclaimed() {
    for dev in TestDevice::both(32) {
        sustained_overwrites(&dev, 4500);
    }
}

/// The same with block chunks as the cluster stores them (a 10-byte
/// version header, then 4 KiB), which the log packs without pads.
#[test]
fn sustained_overwrites_of_packed_block_chunks_are_reclaimed() {
    for dev in TestDevice::both(32) {
        sustained_overwrites(&dev, 4096 + 10);
    }
}

fn sustained_overwrites(dev: &TestDevice, value_len: usize) {
    let mut opts = small_opts();
    opts.background = true;
    opts.memtable_bytes = 16 * 1024;
    opts.memtable_log_bytes = 256 * 1024;
    let db = dev.open(&opts);
    let keys = (800_000 / value_len) as u32;
    let mut rng = SmallRng::seed_from_u64(1);
    let mut latest = vec![0u64; keys as usize];
    // ~20x the live data set, several times the device's capacity.
    for i in 1..=10_000u64 {
        let k = rng.gen_range(0..keys);
        db.put(&key(k), &value_for(k, i, value_len))
            .unwrap_or_else(|e| panic!("write {i}: {e}; {:?}", db.stats()));
        latest[k as usize] = i;
    }
    // The writer may end ahead of GC; the background thread must catch up
    // on its own (stats do not wait for it), within a bounded time.
    let live = u64::from(keys) * value_len as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let s = loop {
        let s = db.stats();
        if s.log_bytes < 6 * live || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        s.gc_segments_reclaimed > 50,
        "{}: GC did not keep up: {s:?}",
        dev.name()
    );
    assert!(
        s.log_bytes < 6 * live,
        "value log holds too much garbage 20 s after the writes: {s:?}"
    );
    for k in 0..keys {
        let want = (latest[k as usize] > 0).then(|| value_for(k, latest[k as usize], value_len));
        assert_eq!(
            db.get(&key(k)).expect("get").map(|v| v.to_vec()),
            want,
            "key {k}"
        );
    }
}

#[test]
fn one_live_value_among_garbage_is_reclaimed() {
    let dev = nand(16, LossMode::AllUnsynced);
    let mut opts = small_opts();
    opts.gc_live_threshold = 0.0; // no automatic GC: the explicit pass below does it
    let db = open(&dev, &opts);
    db.put(b"survivor", b"still here").expect("put");
    for i in 0..200u32 {
        db.put(b"churn", &value_for(i, 0, 1500)).expect("put");
    }
    db.flush().expect("flush");
    db.maintenance().expect("maintenance");
    let before = db.stats();
    assert_eq!(before.gc_segments_reclaimed, 0);
    assert!(before.segments_log > 4, "{before:?}");
    let before = before.gc_segments_reclaimed;
    for _ in 0..5 {
        db.gc().expect("gc");
    }
    let s = db.stats();
    assert!(s.gc_segments_reclaimed > before, "{s:?}");
    assert!(s.segments_log <= 4, "old segments must be gone: {s:?}");
    assert_eq!(
        db.get(b"survivor").expect("get").as_deref(),
        Some(&b"still here"[..])
    );
}

/// With `lazy_gc`, while most of the device is free GC leaves segments
/// that are a quarter live alone (relocating their values would buy space
/// nobody needs yet), which eager GC cleans, and still cleans segments that
/// hold nothing live.
#[test]
fn lazy_gc_waits_for_cheap_segments_while_space_is_roomy() {
    for lazy in [true, false] {
        let dev = nand(64, LossMode::AllUnsynced);
        let opts = engine::Options {
            lazy_gc: lazy,
            ..small_opts()
        };
        let db = open(&dev, &opts);
        let (keys, value_len) = (300u32, 3000);
        let write = |version: u64, pick: &dyn Fn(u32) -> bool| {
            for k in (0..keys).filter(|&k| pick(k)) {
                db.put(&key(k), &value_for(k, version, value_len))
                    .expect("put");
            }
            db.flush().expect("flush");
            db.maintenance().expect("maintenance");
        };
        write(1, &|_| true); // every key once
        write(2, &|k| k % 4 != 0); // 3 of 4 again: the first segments are a quarter live
        let s = db.stats();
        assert!(
            s.segments_free * 2 >= s.segments_total,
            "the test needs a roomy device: {s:?}"
        );
        if lazy {
            assert_eq!(
                s.gc_segments_reclaimed, 0,
                "lazy GC cleaned a quarter-live segment: {s:?}"
            );
        } else {
            assert!(
                s.gc_segments_reclaimed > 0,
                "eager GC left quarter-live segments: {s:?}"
            );
        }
        let reclaimed = s.gc_segments_reclaimed;
        write(3, &|k| k % 4 == 0); // the rest: the first segments are now dead
        write(4, &|_| true);
        let s = db.stats();
        assert!(
            s.gc_segments_reclaimed > reclaimed,
            "lazy={lazy}: dead segments were not reclaimed: {s:?}"
        );
        for k in 0..keys {
            let want = value_for(k, 4, value_len);
            assert_eq!(
                db.get(&key(k)).expect("get").as_deref(),
                Some(&want[..]),
                "key {k}"
            );
        }
    }
}

/// Reads racing flushes and value GC. A GET, multi-get or scan that looked
/// a pointer up just before GC relocated the value and released its segment
/// (trimmed at the next checkpoint) must find the value where GC moved it;
/// one that took its sequence number just before a flush dropped the
/// version it resolves to must still see the key. Never an error, a
/// missing key or another key's bytes.
#[test]
fn reads_racing_value_gc_find_the_relocated_values() {
    for dev in TestDevice::both(16) {
        reads_racing_value_gc(&dev);
    }
}

/// On the file device, a fourth kind of read is the split GET the node's
/// network thread uses (the value read on an io_uring queue, then checked).
fn reads_racing_value_gc(dev: &TestDevice) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    const KEYS: u32 = 64;
    const LEN: usize = 2000;
    fn tagged(k: u32, version: u64) -> Vec<u8> {
        let mut v = version.to_le_bytes().to_vec();
        v.extend(value_for(k, version, LEN));
        v
    }
    fn check(k: u32, v: Option<bytes::Bytes>) -> Result<(), String> {
        let v = v.ok_or(format!("key {k} missing"))?;
        let version = u64::from_le_bytes(v[..8].try_into().map_err(|_| "short value")?);
        if v[..] != tagged(k, version)[..] {
            return Err(format!("key {k}: wrong bytes"));
        }
        Ok(())
    }

    let mut opts = small_opts();
    opts.gc_live_threshold = 0.0; // only the explicit passes below
    let db = Arc::new(dev.open(&opts));
    let split = engine::flash::io_uring_for_tests() && dev.name() == "file";
    let split_reads = Arc::new(AtomicU64::new(0));
    for k in 0..KEYS {
        db.put(&key(k), &tagged(k, 0)).expect("put");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (db, stop, split_reads) = (db.clone(), stop.clone(), split_reads.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut rng = SmallRng::seed_from_u64(100 + r);
                let mut queue = engine::flash::ReadQueue::new(4).ok().filter(|_| split);
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.gen_range(0..KEYS - 8);
                    match reads % 4 {
                        3 if queue.is_some() => {
                            let queue = queue.as_mut().ok_or("no queue")?;
                            // Up to 2 ms between lookup and read: GC may
                            // release and reuse the value's segment meanwhile.
                            let pause = Duration::from_micros(rng.gen_range(0..2000));
                            let (v, on_queue) =
                                split_get(&db, queue, &key(k), || std::thread::sleep(pause))
                                    .map_err(|e| format!("split get: {e}"))?;
                            split_reads.fetch_add(u64::from(on_queue), Ordering::Relaxed);
                            check(k, v)?;
                        }
                        0 => check(k, db.get(&key(k)).map_err(|e| format!("get: {e}"))?)?,
                        1 => {
                            let keys: Vec<Vec<u8>> = (k..k + 4).map(key).collect();
                            let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                            let got = db.multi_get(&refs).map_err(|e| format!("mget: {e}"))?;
                            for (i, v) in got.into_iter().enumerate() {
                                check(k + i as u32, v)?;
                            }
                        }
                        _ => {
                            let got = db
                                .scan(&key(k), &key(k + 8), 8)
                                .map_err(|e| format!("scan: {e}"))?;
                            if got.len() != 8 {
                                return Err(format!("scan from {k}: {} keys", got.len()));
                            }
                            for (i, (_, v)) in got.into_iter().enumerate() {
                                check(k + i as u32, Some(v))?;
                            }
                        }
                    }
                    reads += 1;
                }
                Ok(reads)
            })
        })
        .collect();
    // A snapshot reader: what a snapshot shows must not change while
    // flushes, compactions and GC run under it.
    let snapshot_reader = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64, String> {
            let mut views = 0;
            while !stop.load(Ordering::Relaxed) {
                let snap = db.snapshot();
                let first = db
                    .scan_at(&key(0), &[], KEYS as usize, &snap)
                    .map_err(|e| format!("snapshot scan: {e}"))?;
                if first.len() != KEYS as usize {
                    return Err(format!("snapshot scan: {} keys", first.len()));
                }
                for _ in 0..20 {
                    let again = db
                        .scan_at(&key(0), &[], KEYS as usize, &snap)
                        .map_err(|e| format!("snapshot rescan: {e}"))?;
                    if again != first {
                        return Err("a snapshot's scan changed".into());
                    }
                    for (k, v) in first.iter().step_by(7) {
                        let got = db
                            .get_at(k, &snap)
                            .map_err(|e| format!("snapshot get: {e}"))?;
                        if got.as_ref() != Some(v) {
                            return Err("a snapshot's get changed".into());
                        }
                    }
                    std::thread::yield_now();
                }
                views += 1;
            }
            Ok(views)
        })
    };
    let mut rng = SmallRng::seed_from_u64(7);
    for round in 1..=1000u64 {
        for _ in 0..16 {
            let k = rng.gen_range(0..KEYS);
            db.put(&key(k), &tagged(k, round)).expect("put");
        }
        db.flush().expect("flush");
        db.gc().expect("gc");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let reads = r
            .join()
            .expect("reader thread")
            .expect("a read racing GC failed");
        assert!(reads > 100, "only {reads} reads");
    }
    let views = snapshot_reader
        .join()
        .expect("snapshot reader thread")
        .expect("a snapshot read racing GC failed");
    assert!(views > 0, "no snapshot was checked");
    assert!(db.stats().gc_segments_reclaimed > 20, "{:?}", db.stats());
    if split {
        let n = split_reads.load(Ordering::Relaxed);
        assert!(
            n > 20,
            "{}: only {n} split GETs read the device",
            dev.name()
        );
    }
}
