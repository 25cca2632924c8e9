//! Flushed runs: a flush writes the memtable as a run of its own above L1;
//! runs shadow older levels (overwrites and deletes alike), survive a
//! power cut through the manifest, and are merged into L1 together.

mod common;

use common::*;
use engine::flash::LossMode;

/// Versions written per round: enough to fill the small test memtable.
const KEYS: u32 = 60;

/// Round `r` overwrites every key with version `r`, except that round 3
/// deletes the even keys.
fn write_round(db: &engine::Db, r: u64) {
    for k in 0..KEYS {
        if r == 3 && k % 2 == 0 {
            db.delete(&key(k)).expect("delete");
        } else {
            db.put(&key(k), &value_for(k, r, 300)).expect("put");
        }
    }
}

/// Every key reads as round `r` left it.
fn check(db: &engine::Db, r: u64) {
    for k in 0..KEYS {
        let want = (r != 3 || k % 2 == 1).then(|| value_for(k, r, 300));
        assert_eq!(
            db.get(&key(k)).expect("get").map(|v| v.to_vec()),
            want,
            "key {k} after round {r}"
        );
    }
    let scanned = db.scan(&[], &[], usize::MAX).expect("scan");
    let live = if r == 3 { KEYS / 2 } else { KEYS };
    assert_eq!(scanned.len(), live as usize, "scan after round {r}");
}

#[test]
fn flushes_stack_runs_that_shadow_l1_and_merge_into_it() {
    let opts = small_opts();
    let dev = nand(16, LossMode::AllUnsynced);
    let mut db = open(&dev, &opts);
    write_round(&db, 1);
    db.flush().expect("flush");
    assert_eq!(
        db.stats().flushed_runs,
        0,
        "an explicit flush merges into L1"
    );
    let mut seen_runs = Vec::new();
    for r in 2..=11 {
        write_round(&db, r);
        // One maintenance pass: flushes the full memtable as a run, and
        // merges the runs once there are enough of them.
        db.maintenance().expect("maintenance");
        seen_runs.push(db.stats().flushed_runs);
        check(&db, r);
        // The runs and L1 as the manifest has them, after a power cut.
        db.sync().expect("sync");
        crash(&dev, db, r);
        db = open(&dev, &opts);
        assert_eq!(db.stats().flushed_runs, *seen_runs.last().unwrap_or(&0));
        check(&db, r);
    }
    assert!(
        seen_runs.iter().any(|&n| n > 0),
        "flushes left runs above L1: {seen_runs:?}"
    );
    assert!(
        seen_runs.windows(2).any(|w| w[1] < w[0]),
        "runs were merged into L1: {seen_runs:?}"
    );
    db.flush().expect("flush");
    assert_eq!(db.stats().flushed_runs, 0);
    check(&db, 11);
}

/// With background maintenance, runs that writes left above L1 are merged
/// once writes stop for `idle_merge_after`, and every key still reads back.
#[test]
fn runs_left_by_writes_are_merged_once_writes_stop() {
    let opts = engine::Options {
        background: true,
        idle_merge_after: Some(std::time::Duration::from_millis(300)),
        ..small_opts()
    };
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &opts);
    let mut r = 1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // Write rounds until a flush leaves a run behind (the background
    // thread flushes the small memtable as it fills).
    while db.stats().flushed_runs == 0 {
        assert!(std::time::Instant::now() < deadline, "no run was left");
        r += 1;
        write_round(&db, if r == 3 { 4 } else { r });
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let last = if r == 3 { 4 } else { r };
    while db.stats().flushed_runs > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "runs still there long after writes stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    check(&db, last);
}
