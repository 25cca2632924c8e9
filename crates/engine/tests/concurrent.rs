//! Concurrent writers with background flush, compaction and GC, and power
//! cuts at random moments while they write. Each writer owns a disjoint set
//! of keys, so it is the oracle for them: a read of its own key right after
//! an acknowledged write must return that write, and after every recovery
//! each key must hold its last durable value (acknowledged under `sync`;
//! covered by the writer's own `Db::sync` under `interval`) or one of the
//! writes after it (unsynced, refused for want of host space, or cut off).
//! Variants run under `interval` and with the host file system filling up.
//! Key choice is deterministic per seed; the interleaving is not.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use engine::flash::{LossMode, NandDevice};
use engine::{Db, Durability, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WRITERS: u32 = 3;
const KEYS_PER_WRITER: u32 = 40;
/// Under `interval`, a writer calls `Db::sync` after this many writes.
const SYNC_EVERY: u32 = 16;

/// Writes refused because the host file system was full (all tests).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// What a key may hold after a power cut.
#[derive(Clone, Default)]
struct Slot {
    /// The last write known durable: acknowledged under `sync`, or
    /// acknowledged before a completed `Db::sync` under `interval`.
    durable: Option<Vec<u8>>,
    /// Later writes: acknowledged but not synced yet, refused, or cut off.
    /// Any of them may survive.
    since: Vec<Option<Vec<u8>>>,
    /// The last acknowledged write: what a read returns now.
    latest: Option<Vec<u8>>,
}

impl Slot {
    fn admits(&self, got: &Option<Vec<u8>>) -> bool {
        *got == self.durable || self.since.contains(got)
    }
}

type Oracle = HashMap<u32, Slot>;

fn opts(durability: Durability) -> Options {
    Options {
        durability,
        background: true,
        ..small_opts()
    }
}

/// Writer `w`'s keys: `w, w + WRITERS, ...`.
fn writer_key(rng: &mut SmallRng, w: u32) -> u32 {
    rng.gen_range(0..KEYS_PER_WRITER) * WRITERS + w
}

/// Writes until the power goes; returns the oracle of its keys. `synced`:
/// every acknowledged write is durable (`sync` durability); otherwise
/// writes become durable at the writer's own `Db::sync` calls.
fn writer(
    db: &Db,
    w: u32,
    seed: u64,
    synced: bool,
    mut oracle: Oracle,
    cut: &AtomicBool,
) -> Oracle {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut version = seed << 20;
    let mut written = 0u32;
    loop {
        version += 1;
        if !synced && written % SYNC_EVERY == SYNC_EVERY - 1 {
            match db.sync() {
                Ok(()) => {
                    for slot in oracle.values_mut() {
                        slot.durable = slot.latest.clone();
                        slot.since.clear();
                    }
                }
                Err(_) if cut.load(Ordering::Acquire) => return oracle,
                Err(e) => assert!(e.is_no_space(), "writer {w}: sync failed: {e}"),
            }
        }
        // One put, delete or batch of this writer's keys.
        let ops: Vec<(u32, Option<Vec<u8>>)> = match rng.gen_range(0..10) {
            0..=6 => {
                let k = writer_key(&mut rng, w);
                let len = if rng.gen_bool(0.8) {
                    rng.gen_range(1..1500)
                } else {
                    rng.gen_range(4000..9000)
                };
                vec![(k, Some(value_for(k, version, len)))]
            }
            7 => vec![(writer_key(&mut rng, w), None)],
            _ => (0..rng.gen_range(2..5))
                .map(|_| {
                    let k = writer_key(&mut rng, w);
                    (k, rng.gen_bool(0.8).then(|| value_for(k, version, 700)))
                })
                .collect(),
        };
        match db.write_batch(&batch_ops(&ops)) {
            Ok(()) => {
                written += 1;
                for (k, v) in &ops {
                    let slot = oracle.entry(*k).or_default();
                    slot.latest = v.clone();
                    if synced {
                        slot.durable = v.clone();
                        slot.since.clear();
                    } else {
                        slot.since.push(v.clone());
                    }
                }
            }
            Err(e) => {
                for (k, v) in &ops {
                    oracle.entry(*k).or_default().since.push(v.clone());
                }
                if cut.load(Ordering::Acquire) {
                    return oracle;
                }
                // The host file system is full: refused, outcome unknown
                // (under sync it may land once space returns).
                assert!(
                    e.is_no_space(),
                    "writer {w}: write failed with the power on: {e}"
                );
                REFUSED.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        }
        // Read back one key just written: only this writer writes it.
        let (k, _) = &ops[rng.gen_range(0..ops.len())];
        match db.get(&key(*k)) {
            Ok(got) => {
                let want = &oracle[k].latest;
                assert_eq!(
                    got.map(|b| b.to_vec()),
                    *want,
                    "writer {w}: key {k} right after its acknowledged write"
                );
            }
            Err(e) => assert!(
                cut.load(Ordering::Acquire),
                "writer {w}: read failed with the power on: {e}"
            ),
        }
    }
}

fn check(db: &Db, oracles: &mut [Oracle], what: &str) {
    for oracle in oracles.iter_mut() {
        for (k, slot) in oracle.iter_mut() {
            let got = db
                .get(&key(*k))
                .unwrap_or_else(|e| panic!("{what}: reading key {k}: {e}"))
                .map(|b| b.to_vec());
            assert!(slot.admits(&got), "{what}: key {k} lost or wrong");
            // Recovery decided: from here on that is the acknowledged state.
            *slot = Slot {
                durable: got.clone(),
                since: Vec::new(),
                latest: got,
            };
        }
    }
}

/// `host_limits`: while the writers run, the host file system under the
/// device fills up and frees again at random moments.
fn cycles(seed: u64, n: usize, durability: Durability, host_limits: bool) {
    let synced = matches!(durability, Durability::Sync);
    let dev: Arc<NandDevice> = nand(24, LossMode::RandomUnsynced);
    let mut oracles: Vec<Oracle> = (0..WRITERS).map(|_| Oracle::new()).collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    for cycle in 0..n {
        let db = Arc::new(open(&dev, &opts(durability)));
        check(
            &db,
            &mut oracles,
            &format!("seed {seed} cycle {cycle} at open"),
        );
        let cut = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = std::mem::take(&mut oracles)
            .into_iter()
            .enumerate()
            .map(|(w, oracle)| {
                let (db, cut) = (db.clone(), cut.clone());
                let s = seed * 1000 + cycle as u64 * 10 + w as u64;
                std::thread::spawn(move || writer(&db, w as u32, s, synced, oracle, &cut))
            })
            .collect();
        if host_limits {
            for _ in 0..rng.gen_range(1..4) {
                std::thread::sleep(Duration::from_millis(rng.gen_range(5..60)));
                let room = rng.gen_range(0..64u64) * 4096;
                dev.set_host_space(Some(dev.host_space_used() + room));
                std::thread::sleep(Duration::from_millis(rng.gen_range(5..60)));
                if rng.gen_bool(0.7) {
                    dev.set_host_space(None);
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        }
        cut.store(true, Ordering::Release);
        dev.cut_power_now();
        oracles = threads
            .into_iter()
            .map(|t| t.join().expect("writer thread"))
            .collect();
        drop(db);
        dev.power_cycle(seed * 1000 + cycle as u64);
        if host_limits && rng.gen_bool(0.5) {
            dev.set_host_space(None);
        }
    }
    dev.set_host_space(None);
    let db = open(&dev, &opts(durability));
    check(&db, &mut oracles, &format!("seed {seed} at the end"));
    let written: usize = oracles.iter().map(|o| o.len()).sum();
    assert!(written > 30, "seed {seed}: only {written} keys written");
}

/// Three writers, flush, compaction and GC in the background, and 12
/// power cuts per seed at random moments.
#[test]
fn concurrent_writers_with_power_cuts_lose_nothing_acknowledged() {
    for seed in 0..4 {
        cycles(seed, 12, Durability::Sync, false);
    }
}

/// The same under `interval` durability: what a writer's own `Db::sync`
/// covered must survive, later writes may.
#[test]
fn concurrent_writers_under_interval_keep_what_each_sync_covered() {
    for seed in 20..24 {
        cycles(
            seed,
            12,
            Durability::Interval(Duration::from_millis(50)),
            false,
        );
    }
}

/// The same while the host file system under the device fills and frees
/// (some cuts, and some opens, happen while it is full).
#[test]
fn concurrent_writers_with_a_filling_host_and_power_cuts_lose_nothing_acknowledged() {
    for seed in 10..14 {
        cycles(seed, 12, Durability::Sync, true);
    }
    assert!(
        REFUSED.load(Ordering::Relaxed) > 0,
        "the host never filled under a writer"
    );
}
