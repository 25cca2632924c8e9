//! A full host file system under a sparse device file (emulated with the
//! NAND device's host-space limit): writes fail with `HostFull`, reads keep
//! working, nothing acknowledged is lost across power cuts, a store opens
//! while the host is full, and writes resume by themselves once there is
//! room again. Where the host can reserve blocks (`fallocate`, the
//! default), segments in use and a reserve of free ones are backed, so
//! deletes and GC still work on a host that other files filled, and give
//! it room back; where it cannot (`set_fallocate(false)`), chunk writes
//! find the host full and wait in memory.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use engine::flash::LossMode;
use engine::{Db, Durability, Error, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Retries `put` until it succeeds (the stall must end by itself), for at
/// most 20 s.
fn put_when_room(db: &Db, k: &[u8], v: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match db.put(k, v) {
            Ok(()) => return,
            Err(e) if e.is_no_space() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("writes did not resume once the host had room: {e}"),
        }
    }
}

/// Puts 2000-byte values under keys `from..` until one is refused (the
/// host must fill within 10,000); the first key refused and why.
fn put_until_refused(db: &Db, from: u32) -> (u32, Error) {
    for k in from..10_000 {
        if let Err(e) = db.put(&key(k), &value_for(k, 1, 2000)) {
            return (k, e);
        }
    }
    panic!("the host never filled");
}

fn get(db: &Db, k: u32) -> Option<Vec<u8>> {
    db.get(&key(k))
        .unwrap_or_else(|e| panic!("reading key {k}: {e}"))
        .map(|v| v.to_vec())
}

/// A device on a host that cannot reserve blocks: its segments are sparse
/// even in use.
fn nand_without_fallocate(mib: u64, loss: LossMode) -> std::sync::Arc<engine::flash::NandDevice> {
    let dev = nand(mib, loss);
    dev.set_fallocate(false);
    dev
}

/// Other files fill the host file system: writes are refused at the next
/// segment, but nothing acknowledged waits for room (a sync succeeds),
/// reads go on, deletes are accepted, and GC of what they freed gives the
/// host room back, after which writes resume by themselves, without a
/// restart. Under `interval` and `sync` durability; a power cut at the
/// end loses nothing acknowledged.
#[test]
fn a_host_filled_by_other_files_leaves_room_for_deletes_and_gc() {
    for durability in [
        Durability::Interval(Duration::from_millis(5)),
        Durability::Sync,
    ] {
        let dev = nand(16, LossMode::AllUnsynced);
        let opts = background_opts(durability);
        let db = open(&dev, &opts);
        for k in 0..600 {
            db.put(&key(k), &value_for(k, 1, 2000)).expect("put");
        }
        db.sync().expect("sync");
        // Other files take every block the device file does not hold yet.
        dev.set_host_space(Some(dev.host_space_used()));
        let (acked, err) = put_until_refused(&db, 600);
        assert!(
            matches!(err, Error::HostFull(_)),
            "{durability:?}: got {err}"
        );
        assert!(err.to_string().starts_with("NOSPACE"), "{err}");
        assert!(db.stats().host_full);
        db.sync().expect("nothing acknowledged waits for host room");
        for k in (0..acked).step_by(7) {
            assert_eq!(get(&db, k), Some(value_for(k, 1, 2000)), "key {k}");
        }
        for k in (0..acked).filter(|k| k % 4 != 0) {
            if let Err(e) = db.delete(&key(k)) {
                panic!(
                    "{durability:?}: delete {k} on a full host: {e}; {:?}",
                    db.stats()
                );
            }
        }
        // More than a few segments of new data: each new segment needs
        // host room, which only GC's trims give back.
        put_when_room(&db, b"after", b"deletes");
        for k in 0..200 {
            put_when_room(&db, &key(100_000 + k), &value_for(k, 2, 2000));
        }
        assert!(!db.stats().host_full, "{:?}", db.stats());
        assert!(db.stats().gc_segments_reclaimed > 0);
        db.sync().expect("sync");
        crash(&dev, db, 7);
        let db = open(&dev, &opts);
        for k in 0..acked {
            let want = (k % 4 == 0).then(|| value_for(k, 1, 2000));
            assert_eq!(get(&db, k), want, "{durability:?}: key {k}");
        }
        assert_eq!(get_raw(&db, b"after"), Some(b"deletes".to_vec()));
        for k in 0..200 {
            assert_eq!(get(&db, 100_000 + k), Some(value_for(k, 2, 2000)));
        }
        db.close().expect("close");
    }
}

fn get_raw(db: &Db, k: &[u8]) -> Option<Vec<u8>> {
    db.get(k).expect("get").map(|v| v.to_vec())
}

#[test]
fn writes_stop_when_the_host_fills_and_resume_when_it_has_room() {
    let dev = nand_without_fallocate(16, LossMode::AllUnsynced);
    let opts = background_opts(Durability::Interval(Duration::from_millis(5)));
    let db = open(&dev, &opts);
    for k in 0..100 {
        db.put(&key(k), &value_for(k, 1, 2000)).expect("put");
    }
    db.sync().expect("sync");
    dev.set_host_space(Some(dev.host_space_used() + (64 << 10)));
    let (mut acked, err) = put_until_refused(&db, 100);
    assert!(matches!(err, Error::HostFull(_)), "got {err}");
    assert!(err.to_string().starts_with("NOSPACE"), "{err}");
    assert!(db.stats().host_full);
    // Reads work, including values still waiting in memory to be written.
    for k in 0..acked {
        assert_eq!(get(&db, k), Some(value_for(k, 1, 2000)), "key {k}");
    }
    // It stays a clean refusal (not a stopped engine) while the host is full.
    std::thread::sleep(Duration::from_millis(300));
    for k in 0..5 {
        let e = db.put(&key(k), b"refused").expect_err("host still full");
        assert!(matches!(e, Error::HostFull(_)), "got {e}");
    }
    assert!(matches!(db.sync(), Err(Error::HostFull(_))));
    dev.set_host_space(None);
    put_when_room(&db, &key(acked), &value_for(acked, 1, 2000));
    acked += 1;
    for k in acked..acked + 200 {
        db.put(&key(k), &value_for(k, 1, 2000))
            .expect("put after resume");
    }
    acked += 200;
    assert!(!db.stats().host_full);
    db.sync().expect("sync after resume");
    crash(&dev, db, 1);
    let db = open(&dev, &opts);
    for k in 0..acked {
        assert_eq!(get(&db, k), Some(value_for(k, 1, 2000)), "key {k}");
    }
    db.close().expect("close");
}

#[test]
fn a_store_opens_on_a_full_host_serves_reads_and_takes_writes_once_there_is_room() {
    let dev = nand_without_fallocate(16, LossMode::AllUnsynced);
    // A memtable that holds all 300 puts: none of them fills it, so they
    // are still a log tail to replay at the crash however the threads are
    // scheduled (asserted below).
    let opts = Options {
        memtable_bytes: 16 << 20,
        memtable_log_bytes: 16 << 20,
        ..background_opts(Durability::Sync)
    };
    let db = open(&dev, &opts);
    for k in 0..300 {
        db.put(&key(k), &value_for(k, 1, 1500)).expect("put");
    }
    assert!(db.stats().memtable_entries > 0, "{:?}", db.stats());
    // Crash with a log tail to replay: opening must flush it and checkpoint.
    crash(&dev, db, 2);
    dev.set_host_space(Some(0));
    let db = open(&dev, &opts);
    for k in 0..300 {
        assert_eq!(get(&db, k), Some(value_for(k, 1, 1500)), "key {k}");
    }
    let e = db.put(&key(0), b"refused").expect_err("host full");
    assert!(matches!(e, Error::HostFull(_)), "got {e}");
    assert!(db.stats().host_full);
    // A crash while it waits loses nothing either.
    crash(&dev, db, 3);
    let db = open(&dev, &opts);
    assert_eq!(get(&db, 299), Some(value_for(299, 1, 1500)));
    // Room for the new log's first page and one more (what the put below
    // needs) but not for the keytables of the checkpoint after open: the
    // log resumes, yet writes must still wait, since until that checkpoint
    // a crash would lose the way to this run's log.
    dev.set_host_space(Some(dev.host_space_used() + 2 * 4096));
    std::thread::sleep(Duration::from_millis(600));
    let e = db.put(&key(0), b"refused").expect_err("no checkpoint yet");
    assert!(matches!(e, Error::HostFull(_)), "got {e}");
    assert!(db.stats().host_full);
    crash(&dev, db, 5);
    let db = open(&dev, &opts);
    assert_eq!(get(&db, 0), Some(value_for(0, 1, 1500)));
    dev.set_host_space(None);
    put_when_room(&db, &key(300), &value_for(300, 1, 1500));
    for k in 301..400 {
        db.put(&key(k), &value_for(k, 1, 1500)).expect("put");
    }
    crash(&dev, db, 4);
    let db = open(&dev, &opts);
    for k in 0..400 {
        assert_eq!(get(&db, k), Some(value_for(k, 1, 1500)), "key {k}");
    }
    db.close().expect("close");
}

/// What a key may read as: its last acknowledged value, or any value of a
/// write that failed with an out-of-space error since (under `sync`, a
/// write can fail after its records were appended, and then still land).
#[derive(Clone, Default)]
struct Allowed {
    acked: Option<Vec<u8>>,
    maybe: Vec<Option<Vec<u8>>>,
}

impl Allowed {
    fn admits(&self, v: &Option<Vec<u8>>) -> bool {
        *v == self.acked || self.maybe.contains(v)
    }
}

fn check_all(db: &Db, model: &BTreeMap<u32, Allowed>, keys: u32, what: &str) {
    for k in 0..keys {
        let got = get(db, k);
        let allowed = model.get(&k).cloned().unwrap_or_default();
        assert!(
            allowed.admits(&got),
            "{what}: key {k} reads {:?} bytes, acknowledged {:?} bytes",
            got.as_ref().map(Vec::len),
            allowed.acked.as_ref().map(Vec::len)
        );
    }
}

/// Random writes, deletes and reads while the host space limit comes and
/// goes, with power cuts (some while the host is full); every read must
/// match an oracle of acknowledged writes.
#[test]
fn random_operations_with_a_filling_host_and_power_cuts_lose_nothing_acknowledged() {
    for seed in 0..8u64 {
        host_full_model(seed, 1500, true);
    }
    // Where the host cannot reserve blocks (the older, sparse path).
    for seed in 8..12u64 {
        host_full_model(seed, 1500, false);
    }
}

fn host_full_model(seed: u64, ops: usize, fallocate: bool) {
    const KEYS: u32 = 150;
    let mut rng = SmallRng::seed_from_u64(seed);
    let dev = nand(16, LossMode::RandomUnsynced);
    dev.set_fallocate(fallocate);
    let opts = background_opts(Durability::Sync);
    let mut db = open(&dev, &opts);
    let mut model: BTreeMap<u32, Allowed> = BTreeMap::new();
    let (mut host_full_errors, mut cuts) = (0, 0);
    for i in 0..ops {
        let k = rng.gen_range(0..KEYS);
        match rng.gen_range(0..100) {
            0..=69 => {
                let v = if rng.gen_range(0..100) < 85 {
                    let len = rng.gen_range(1..3000);
                    Some(value_for(k, i as u64, len))
                } else {
                    None
                };
                let r = match &v {
                    Some(v) => db.put(&key(k), v),
                    None => db.delete(&key(k)),
                };
                let slot = model.entry(k).or_default();
                match r {
                    Ok(()) => {
                        slot.acked = v;
                        slot.maybe.clear();
                    }
                    Err(e) if e.is_no_space() => {
                        host_full_errors += 1;
                        slot.maybe.push(v);
                    }
                    Err(e) => panic!("seed {seed} op {i}: write failed with {e}"),
                }
            }
            70..=89 => {
                let got = get(&db, k);
                let allowed = model.get(&k).cloned().unwrap_or_default();
                assert!(allowed.admits(&got), "seed {seed} op {i}: key {k}");
            }
            90..=95 => {
                let limit = if rng.gen_bool(0.5) {
                    None
                } else {
                    Some(dev.host_space_used() + rng.gen_range(0..32u64) * 4096)
                };
                dev.set_host_space(limit);
            }
            _ => {
                cuts += 1;
                crash(&dev, db, seed * 1000 + i as u64);
                if rng.gen_bool(0.3) {
                    dev.set_host_space(Some(0));
                }
                db = open(&dev, &opts);
                check_all(
                    &db,
                    &model,
                    KEYS,
                    &format!("seed {seed} after cut at op {i}"),
                );
            }
        }
    }
    assert!(host_full_errors > 0, "seed {seed}: the host never filled");
    assert!(cuts > 0, "seed {seed}: no power cut");
    dev.set_host_space(None);
    put_when_room(&db, b"final", b"write");
    check_all(&db, &model, KEYS, &format!("seed {seed} at the end"));
    db.close().expect("close");
    let db = open(&dev, &opts);
    check_all(&db, &model, KEYS, &format!("seed {seed} after close"));
}

/// Closing while acknowledged `interval` writes wait in memory for host
/// space says they are lost; under `sync` nothing acknowledged waits, and
/// close succeeds (the next open replays the log).
#[test]
fn close_on_a_full_host_reports_lost_interval_writes_and_succeeds_under_sync() {
    for durability in [
        Durability::Interval(Duration::from_secs(60)),
        Durability::Sync,
    ] {
        let dev = nand_without_fallocate(16, LossMode::AllUnsynced);
        let opts = background_opts(durability);
        let db = open(&dev, &opts);
        db.put(b"before", b"full").expect("put");
        db.sync().expect("sync");
        dev.set_host_space(Some(dev.host_space_used()));
        let (k, _) = put_until_refused(&db, 0);
        match (durability, db.close()) {
            (Durability::Sync, r) => r.expect("close under sync"),
            (_, Err(e)) => assert!(
                e.to_string().contains("host file system full") && k > 0,
                "{e}"
            ),
            (_, Ok(())) => panic!("close lost {k} acknowledged writes silently"),
        }
        dev.set_host_space(None);
        let db = open(&dev, &opts);
        assert_eq!(
            db.get(b"before").expect("get").as_deref(),
            Some(&b"full"[..])
        );
    }
}

/// Without background threads nothing probes the host on its own: a
/// maintenance run does, and writes resume after it.
#[test]
fn maintenance_finds_room_again_without_background_threads() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = small_opts();
    let db = open(&dev, &opts);
    dev.set_host_space(Some(dev.host_space_used()));
    let (k, err) = put_until_refused(&db, 0);
    assert!(matches!(err, Error::HostFull(_)), "got {err}");
    assert!(db.stats().host_full);
    dev.set_host_space(None);
    db.maintenance().expect("maintenance");
    assert!(!db.stats().host_full, "{:?}", db.stats());
    for k in k..k + 200 {
        db.put(&key(k), &value_for(k, 1, 2000)).expect("room again");
    }
}
