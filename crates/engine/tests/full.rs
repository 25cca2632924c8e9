//! A full device: writes fail with NoSpace, reads keep working, and deletes
//! followed by GC make room again.

mod common;

use common::*;
use engine::Error;

#[test]
fn no_space_then_delete_and_gc_make_room() {
    for dev in TestDevice::both(8) {
        no_space_then_room(&dev);
    }
}

fn no_space_then_room(dev: &TestDevice) {
    let mut opts = small_opts();
    // Tiny segments (16 pages) hold few keytables: keep enough headroom for
    // the compactions that turn deletes into garbage GC can see.
    opts.reserved_segments = 8;
    let db = dev.open(&opts);
    let mut written = 0u32;
    let err = loop {
        match db.put(&key(written), &value_for(written, 1, 3000)) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        if written.is_multiple_of(16) {
            db.maintenance().expect("maintenance while filling");
        }
        assert!(written < 100_000, "device never filled");
    };
    assert!(matches!(err, Error::NoSpace), "expected NoSpace, got {err}");
    assert!(written > 100);
    for k in (0..written).step_by(7) {
        assert_eq!(
            db.get(&key(k)).expect("reads work when full").as_deref(),
            Some(&value_for(k, 1, 3000)[..])
        );
    }
    // Delete most keys, let GC reclaim, then write again.
    for k in 0..written {
        if k % 4 != 0 {
            db.delete(&key(k)).expect("deletes work when full");
        }
    }
    for round in 0..20 {
        if let Err(e) = db.maintenance() {
            panic!("maintenance round {round}: {e}; {:?}", db.stats());
        }
        if let Err(e) = db.gc() {
            panic!("gc round {round}: {e}; {:?}", db.stats());
        }
    }
    assert!(db.stats().gc_segments_reclaimed > 0);
    for k in written..written + 200 {
        db.put(&key(k), &value_for(k, 2, 3000))
            .expect("room again after deletes and GC");
    }
    for k in (0..written).step_by(4) {
        assert_eq!(
            db.get(&key(k)).expect("get").as_deref(),
            Some(&value_for(k, 1, 3000)[..])
        );
    }
}
