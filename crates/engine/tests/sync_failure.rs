//! A failed device sync is sticky (the fsync-gate lesson): after it, the
//! kernel may have dropped the dirty pages it could not write, so a later
//! sync that succeeds would acknowledge writes that are not on the device.
//! The emulated NAND models exactly that (`NandDevice::fail_syncs`): the
//! failed sync drops the unsynced pages, reads still see them, a power cut
//! loses them. The engine must refuse every later write with `DeviceFailed`
//! until it is reopened, and nothing it acknowledged may be lost.

mod common;

use std::time::{Duration, Instant};

use common::*;
use engine::flash::LossMode;
use engine::{Db, Durability, Error};

/// Writes `count` keys from `first` and returns those acknowledged.
fn write_keys(db: &Db, first: u32, count: u32) -> Vec<u32> {
    (first..first + count)
        .filter(|&k| db.put(&key(k), &value_for(k, 1, 100)).is_ok())
        .collect()
}

#[test]
fn after_a_failed_sync_no_write_is_acknowledged_and_none_acknowledged_is_lost() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = background_opts(Durability::Sync);
    let db = open(&dev, &opts);
    let before = write_keys(&db, 0, 20);
    assert_eq!(before.len(), 20, "healthy device: every write acknowledged");
    dev.fail_syncs(1);
    match db.put(&key(100), b"during the failed sync") {
        Err(Error::DeviceFailed(why)) => assert!(why.contains("sync"), "{why}"),
        other => panic!("the write whose sync failed: {other:?}"),
    }
    // The device syncs fine again, but the pages the failed sync dropped
    // are gone: acknowledging anything now would be a lie.
    for k in 101..120 {
        match db.put(&key(k), &value_for(k, 1, 100)) {
            Err(e @ Error::DeviceFailed(_)) => {
                assert!(e.to_string().starts_with("IOERR"), "{e}");
            }
            other => panic!("write {k} after a failed sync: {other:?}"),
        }
    }
    assert!(matches!(db.delete(&key(0)), Err(Error::DeviceFailed(_))));
    assert!(matches!(db.sync(), Err(Error::DeviceFailed(_))));
    let why = db.stats().device_failed.expect("stats name the failure");
    assert!(why.contains("sync"), "{why}");
    // Reads go on.
    for &k in &before {
        assert_eq!(
            db.get(&key(k)).unwrap().as_deref(),
            Some(&value_for(k, 1, 100)[..])
        );
    }
    crash(&dev, db, 7);
    let db = open(&dev, &opts);
    for &k in &before {
        assert_eq!(
            db.get(&key(k)).unwrap().as_deref(),
            Some(&value_for(k, 1, 100)[..]),
            "acknowledged key {k} lost"
        );
    }
    assert!(
        db.stats().device_failed.is_none(),
        "a reopened store starts clean"
    );
    let after = write_keys(&db, 200, 10);
    assert_eq!(after.len(), 10, "writes work again after the reopen");
}

#[test]
fn a_failed_background_sync_stops_interval_writes() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = background_opts(Durability::Interval(Duration::from_millis(5)));
    let db = open(&dev, &opts);
    assert_eq!(write_keys(&db, 0, 20).len(), 20);
    db.sync().expect("sync");
    dev.fail_syncs(1);
    // Something to sync, so the interval thread's sync runs and fails.
    let _ = db.put(&key(50), b"x");
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.stats().device_failed.is_none() {
        assert!(Instant::now() < deadline, "the failed sync was not noticed");
        let _ = db.put(&key(51), b"y");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(
        db.put(&key(60), b"z"),
        Err(Error::DeviceFailed(_))
    ));
    assert!(db.get(&key(3)).unwrap().is_some(), "reads go on");
}

#[test]
fn a_failed_checkpoint_sync_stops_writes_too() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = background_opts(Durability::Sync);
    let db = open(&dev, &opts);
    assert_eq!(write_keys(&db, 0, 20).len(), 20);
    dev.fail_syncs(1);
    // A flush ends with a checkpoint; its sync fails; the store stays failed until
    // reopened, whatever syncs would do afterwards.
    assert!(db.flush().is_err());
    assert!(matches!(
        db.put(&key(30), b"v"),
        Err(Error::DeviceFailed(_))
    ));
    crash(&dev, db, 3);
    let db = open(&dev, &opts);
    for k in 0..20 {
        assert!(db.get(&key(k)).unwrap().is_some(), "key {k} lost");
    }
}
