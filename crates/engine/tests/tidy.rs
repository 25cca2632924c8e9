//! A memtable holding a data set in many sorted runs: once scans find
//! them, background maintenance merges them (`memruns::SortedRuns::tidy`),
//! and scans and reads stay exact while it does and writers go on.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use engine::flash::LossMode;
use engine::{Durability, Options};

/// Keys loaded: well over the versions of 8 full runs (16 Ki each).
const KEYS: u32 = 200_000;

fn opts() -> Options {
    Options {
        durability: Durability::None,
        background: true,
        // The whole load stays in the active memtable.
        memtable_bytes: 512 << 20,
        memtable_log_bytes: 1 << 30,
        ..small_opts()
    }
}

/// Key `k` in a scrambled order, so that every run spans the key space.
fn scrambled(i: u32) -> u32 {
    (i.wrapping_mul(2_654_435_761)) % KEYS
}

#[test]
fn scans_stay_exact_while_maintenance_tidies_the_memtable() {
    let dev = nand(128, LossMode::AllUnsynced);
    let db = Arc::new(open(&dev, &opts()));
    let model: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>> = Arc::default();
    {
        let mut m = model.lock().expect("model");
        for i in 0..KEYS {
            let k = scrambled(i);
            let v = value_for(k, 1, 8);
            db.put(&key(k), &v).expect("put");
            m.insert(key(k), v);
        }
    }
    let before = db.stats().memtable_runs;
    assert!(before > 8, "{before} runs after the load");
    // A writer overwrites keys while scans run and maintenance tidies;
    // the model takes each write under its lock, with the put.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, model, stop) = (db.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded, so that the log never fills the test device.
            for version in 2..40u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                for i in (0..KEYS).step_by(97) {
                    let k = scrambled(i.wrapping_add(version as u32));
                    let v = value_for(k, version, 8);
                    let mut m = model.lock().expect("model");
                    db.put(&key(k), &v).expect("put");
                    m.insert(key(k), v);
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut scans = 0;
    let tidied = loop {
        // A scan of a slice of the keys, checked against the model taken
        // at the same moment (writes hold the model's lock).
        let from = key(scrambled(scans * 7919));
        let (got, want) = {
            let m = model.lock().expect("model");
            let got = db.scan(&from, &[], 300).expect("scan");
            let want: Vec<(Vec<u8>, Vec<u8>)> = m
                .range(from.clone()..)
                .take(300)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (got, want)
        };
        let got: Vec<(Vec<u8>, Vec<u8>)> = got
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(got, want, "scan {scans} from {from:?}");
        scans += 1;
        let runs = db.stats().memtable_runs;
        if runs * 2 < before || Instant::now() > deadline {
            break runs;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    assert!(
        tidied * 2 < before,
        "{before} runs, {tidied} after {scans} scans"
    );
    // Everything reads as the model has it, whole and by key.
    let m = model.lock().expect("model");
    let all = db.scan(&[], &[], usize::MAX).expect("scan");
    assert_eq!(all.len(), m.len());
    for ((k, v), (mk, mv)) in all.iter().zip(m.iter()) {
        assert_eq!((&k[..], &v[..]), (&mk[..], &mv[..]));
    }
    for k in (0..KEYS).step_by(1009) {
        let got = db.get(&key(k)).expect("get").map(|v| v.to_vec());
        assert_eq!(got.as_ref(), m.get(&key(k)), "key {k}");
    }
}
