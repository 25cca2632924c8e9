//! Value reclustering (`Db::recluster`): a range whose small values were
//! written in random order is rewritten in key order, after which a scan of
//! it reads the device a few times instead of once per value; the data,
//! snapshots, deletes and newer writes read the same before and after, and
//! after a crash.

mod common;

use common::*;
use engine::flash::LossMode;
use engine::Durability;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const KEYS: u32 = 4000;
const LEN: usize = 300;

/// `KEYS` keys written once each in a random order, flushed to keytables.
fn scattered_store(dev: &std::sync::Arc<engine::flash::NandDevice>) -> engine::Db {
    let opts = small_opts();
    let db = open(dev, &opts);
    let mut order: Vec<u32> = (0..KEYS).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(7));
    for k in order {
        db.put(&key(k), &value_for(k, 1, LEN)).expect("put");
    }
    db.flush().expect("flush");
    reopened(dev, db, &opts)
}

fn scan_all(db: &engine::Db) -> Vec<(Vec<u8>, Vec<u8>)> {
    db.scan(b"", b"", usize::MAX)
        .expect("scan")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

/// 100 neighbouring keys of the middle of the store, with their values.
fn scan_part(db: &engine::Db) -> Vec<(Vec<u8>, Vec<u8>)> {
    db.scan(&key(1000), &key(1100), usize::MAX)
        .expect("scan")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect()
}

#[test]
fn a_scattered_range_is_rewritten_in_key_order_and_then_scans_read_less() {
    let dev = nand(32, LossMode::AllUnsynced);
    let opts = small_opts();
    let db = scattered_store(&dev);
    let before = scan_all(&db);
    assert_eq!(before.len(), KEYS as usize);
    let (part, scattered_reads) = reads_during(&dev, || scan_part(&db));
    assert_eq!(part.len(), 100);

    let stats = db.recluster(b"", b"").expect("recluster");
    assert_eq!(stats.keys, u64::from(KEYS));
    assert!(stats.rewritten >= u64::from(KEYS) * 9 / 10, "{stats:?}");
    assert!(!stats.stopped_for_space);
    assert_eq!(db.stats().recluster_bytes, stats.bytes);
    assert_eq!(scan_all(&db), before, "same data right after");

    db.flush().expect("flush");
    let db = reopened(&dev, db, &opts);
    assert_eq!(scan_all(&db), before, "same data after a reopen");
    let (part_after, clustered_reads) = reads_during(&dev, || scan_part(&db));
    assert_eq!(part_after, part);
    assert!(
        clustered_reads.ops * 5 < scattered_reads.ops,
        "device reads of a scan: {} scattered, {} after",
        scattered_reads.ops,
        clustered_reads.ops
    );

    let again = db.recluster(b"", b"").expect("recluster again");
    assert_eq!(again.rewritten, 0, "already in key order: {again:?}");

    // Power cut after reclustering a part (unsynced rewrites may be lost,
    // the originals are still there): every key reads its value.
    db.recluster(&key(100), &key(300))
        .expect("recluster a part");
    crash(&dev, db, 3);
    let db = open(&dev, &opts);
    assert_eq!(scan_all(&db), before, "same data after a power cut");
}

/// Only the latest version of each key is rewritten, with its sequence
/// number: newer writes and deletes stay on top, a snapshot taken before
/// them still reads the old data, and GC afterwards keeps all of it.
#[test]
fn newer_writes_deletes_and_snapshots_read_the_same() {
    let dev = nand(32, LossMode::AllUnsynced);
    let opts = small_opts();
    let db = scattered_store(&dev);
    let old = scan_all(&db);
    let snap = db.snapshot();
    for k in (0..KEYS).step_by(3) {
        db.put(&key(k), &value_for(k, 2, LEN)).expect("overwrite");
    }
    for k in (1..KEYS).step_by(5) {
        db.delete(&key(k)).expect("delete");
    }
    let new = scan_all(&db);
    db.recluster(b"", b"").expect("recluster");
    db.flush().expect("flush");
    db.gc().expect("gc");
    assert_eq!(scan_all(&db), new);
    let at_snap: Vec<(Vec<u8>, Vec<u8>)> = db
        .scan_at(b"", b"", usize::MAX, &snap)
        .expect("scan at snapshot")
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
    assert_eq!(at_snap, old, "the snapshot reads what it read");
    drop(snap);
    db.gc().expect("gc");
    let db = reopened(&dev, db, &opts);
    assert_eq!(scan_all(&db), new);
}

/// Reclustering while writers overwrite and delete at random (background
/// maintenance on): the store ends equal to a model of the writes.
#[test]
fn concurrent_writers_lose_nothing() {
    let dev = nand(64, LossMode::AllUnsynced);
    let opts = background_opts(Durability::Interval(std::time::Duration::from_millis(5)));
    let db = std::sync::Arc::new(open(&dev, &opts));
    let mut model = vec![None::<Vec<u8>>; KEYS as usize];
    let mut order: Vec<u32> = (0..KEYS).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(11));
    for k in order {
        let v = value_for(k, 1, LEN);
        db.put(&key(k), &v).expect("put");
        model[k as usize] = Some(v);
    }
    db.flush().expect("flush");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(5);
            let mut model = model;
            let mut version = 2;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || version < 500 {
                let k = rng.gen_range(0..KEYS);
                if rng.gen_range(0..4) == 0 {
                    db.delete(&key(k)).expect("delete");
                    model[k as usize] = None;
                } else {
                    let v = value_for(k, version, LEN);
                    db.put(&key(k), &v).expect("put");
                    model[k as usize] = Some(v);
                }
                version += 1;
            }
            model
        })
    };
    for _ in 0..3 {
        db.recluster(b"", b"").expect("recluster");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let model = writer.join().expect("writer");
    let expect: Vec<(Vec<u8>, Vec<u8>)> = model
        .iter()
        .enumerate()
        .filter_map(|(k, v)| v.as_ref().map(|v| (key(k as u32), v.clone())))
        .collect();
    assert_eq!(scan_all(&db), expect);
    let db = std::sync::Arc::into_inner(db).expect("one owner");
    let db = reopened(&dev, db, &opts);
    assert_eq!(scan_all(&db), expect, "after a reopen");
}

/// A device with less than a quarter of its segments free is left alone:
/// reclustering stops at once, rewrites nothing and loses nothing.
#[test]
fn a_nearly_full_device_is_not_reclustered() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = small_opts();
    let db = open(&dev, &opts);
    let mut order: Vec<u32> = (0..40_000).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(3));
    let mut written = Vec::new();
    for (i, k) in order.into_iter().enumerate() {
        if i % 200 == 0 {
            db.maintenance().expect("maintenance");
            let s = db.stats();
            if s.segments_free * 4 < s.segments_total {
                break;
            }
        }
        db.put(&key(k), &value_for(k, 1, LEN)).expect("put");
        written.push(k);
    }
    db.flush().expect("flush");
    let s = db.stats();
    assert!(s.segments_free * 4 < s.segments_total, "{s:?}");
    let before = scan_all(&db);
    assert_eq!(before.len(), written.len());
    let stats = db.recluster(b"", b"").expect("recluster");
    assert!(stats.stopped_for_space, "{stats:?}");
    assert_eq!(stats.rewritten, 0);
    assert_eq!(scan_all(&db), before);
}
