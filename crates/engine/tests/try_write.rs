//! `Db::try_write_batch`: the write that never waits. It writes the whole
//! batch when nothing must wait and otherwise writes nothing and says so,
//! promptly, so a network thread can hand the write to a thread that may.

mod common;

use std::time::{Duration, Instant};

use common::*;
use engine::flash::LossMode;
use engine::{BatchOp, Durability, Options};

/// Background threads on (without them every write waits for its own
/// device writes) and a memtable large enough that flushing never slows
/// the writes down.
fn background_opts(durability: Durability) -> Options {
    Options {
        durability,
        background: true,
        memtable_bytes: 1 << 20,
        memtable_log_bytes: 8 << 20,
        ..small_opts()
    }
}

fn put(k: u32, v: &[u8]) -> BatchOp {
    BatchOp::Put(key(k).into(), v.to_vec().into())
}

#[test]
fn writes_the_whole_batch_when_nothing_must_wait() {
    let dev = nand(64, LossMode::AllUnsynced);
    let db = open(
        &dev,
        &background_opts(Durability::Interval(Duration::from_millis(50))),
    );
    let batch = [put(1, b"one"), put(2, b"two")];
    assert!(db.try_write_batch(&batch).expect("try_write_batch"));
    assert_eq!(db.get(&key(1)).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(db.get(&key(2)).unwrap().as_deref(), Some(&b"two"[..]));
    assert!(db
        .try_write_batch(&[BatchOp::Delete(key(1).into())])
        .expect("try delete"));
    assert_eq!(db.get(&key(1)).unwrap(), None);
    // What it wrote is as durable as any write once synced.
    let db = reopened(&dev, db, &background_opts(Durability::None));
    assert_eq!(db.get(&key(2)).unwrap().as_deref(), Some(&b"two"[..]));
    assert_eq!(db.get(&key(1)).unwrap(), None);
}

#[test]
fn writes_nothing_under_sync_durability() {
    let dev = nand(64, LossMode::AllUnsynced);
    let db = open(&dev, &background_opts(Durability::Sync));
    assert!(!db
        .try_write_batch(&[put(1, b"one")])
        .expect("try_write_batch"));
    assert_eq!(db.get(&key(1)).unwrap(), None);
    // The ordinary write still works and waits for its sync.
    db.write_batch(&[put(1, b"one")]).expect("write_batch");
    assert_eq!(db.get(&key(1)).unwrap().as_deref(), Some(&b"one"[..]));
}

#[test]
fn gives_up_at_once_on_a_device_full_of_live_data() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &background_opts(Durability::None));
    let value = vec![7u8; 3000];
    let mut n = 0u32;
    while db.put(&key(n), &value).is_ok() {
        n += 1;
        assert!(n < 100_000, "device never filled");
    }
    let t = Instant::now();
    let written = db
        .try_write_batch(&[put(n, &value)])
        .expect("try_write_batch");
    assert!(!written, "a full device took a write");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "try_write_batch waited {:?} on a full device",
        t.elapsed()
    );
    assert_eq!(db.get(&key(n)).unwrap(), None);
    assert_eq!(db.get(&key(0)).unwrap().as_deref(), Some(&value[..]));
}
