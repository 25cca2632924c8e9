//! Conditional batches (`Db::write_batch_if`): decisions from the current
//! value, in-batch order, atomicity per key under concurrent writers (the
//! version-compare the node's VSET is built on), and durability under
//! `sync` across a power cut.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use engine::flash::LossMode;
use engine::{BatchOp, Durability, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn put(k: &str, v: &[u8]) -> BatchOp {
    BatchOp::Put(
        Bytes::copy_from_slice(k.as_bytes()),
        Bytes::copy_from_slice(v),
    )
}

fn version(v: Option<&Bytes>) -> u64 {
    v.map_or(0, |b| {
        u64::from_be_bytes(b[..8].try_into().expect("8-byte version"))
    })
}

#[test]
fn decides_from_the_current_value_and_applies_in_order() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    db.put(b"a", b"old").unwrap();
    // "Set if absent": a exists, b does not; the second b sees the first.
    let ops = [put("a", b"1"), put("b", b"2"), put("b", b"3")];
    let written = db.write_batch_if(&ops, |_, cur| Ok(!cur.exists())).unwrap();
    assert_eq!(written, [false, true, false]);
    assert_eq!(db.get(b"a").unwrap().as_deref(), Some(&b"old"[..]));
    assert_eq!(db.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    // A delete seen by a later operation of the same batch.
    let ops = [BatchOp::Delete(Bytes::from_static(b"a")), put("a", b"new")];
    let written = db
        .write_batch_if(&ops, |i, cur| Ok(i == 0 || !cur.exists()))
        .unwrap();
    assert_eq!(written, [true, true]);
    assert_eq!(db.get(b"a").unwrap().as_deref(), Some(&b"new"[..]));
    // Nothing accepted: nothing written, no error.
    assert_eq!(
        db.write_batch_if(&ops, |_, _| Ok(false)).unwrap(),
        [false, false]
    );
    // Bad input fails the whole batch.
    let bad = [put("", b"x")];
    assert!(db.write_batch_if(&bad, |_, _| Ok(true)).is_err());
}

/// A value written in two parts is one value to later operations of the
/// same batch: its length, and its bytes when asked for.
#[test]
fn later_operations_see_a_value_written_in_parts_whole() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    let parts = BatchOp::PutParts {
        key: Bytes::from_static(b"k"),
        head: Bytes::from_static(b"head-"),
        body: Bytes::from_static(b"body"),
    };
    let ops = [parts, put("k", b"later")];
    let mut seen = None;
    let written = db
        .write_batch_if(&ops, |i, cur| {
            if i == 1 {
                seen = Some((cur.len(), cur.value()?));
            }
            Ok(i == 0)
        })
        .unwrap();
    assert_eq!(written, [true, false]);
    assert_eq!(
        seen,
        Some((Some(9), Some(Bytes::from_static(b"head-body"))))
    );
    assert_eq!(db.get(b"k").unwrap().as_deref(), Some(&b"head-body"[..]));
}

/// Many threads write random versions of a few keys, each only if newer
/// than what the key holds: every key must end at the largest version
/// written to it. A read-then-write without per-key atomicity loses
/// updates here (a newer version overwritten by an older one).
#[test]
fn version_compare_is_atomic_per_key_under_concurrency() {
    const KEYS: usize = 4;
    const THREADS: usize = 8;
    const WRITES: usize = 1500;
    let dev = nand(64, LossMode::AllUnsynced);
    let opts = Options {
        background: true,
        ..small_opts()
    };
    let db = Arc::new(open(&dev, &opts));
    // Versions from one shared clock with jitter, like timestamps of
    // clients: concurrent writers of a key carry close, unordered versions.
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let db = db.clone();
            let clock = clock.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t as u64);
                let mut best = [0u64; KEYS];
                for _ in 0..WRITES {
                    // Two keys per batch, in random order.
                    let mut ops = Vec::new();
                    let mut versions = Vec::new();
                    for _ in 0..2 {
                        let k = rng.gen_range(0..KEYS);
                        let v = clock
                            .fetch_add(rng.gen_range(1..3), std::sync::atomic::Ordering::Relaxed)
                            + rng.gen_range(0..64);
                        let mut value = v.to_be_bytes().to_vec();
                        value.extend_from_slice(&[t as u8; 100]);
                        ops.push(put(&format!("key{k}"), &value));
                        versions.push((k, v));
                    }
                    let written = db
                        .write_batch_if(&ops, |i, cur| {
                            Ok(versions[i].1 > version(cur.value()?.as_ref()))
                        })
                        .expect("conditional batch");
                    for (i, &(k, v)) in versions.iter().enumerate() {
                        best[k] = best[k].max(v);
                        if written[i] {
                            // A key only moves forward: an accepted version
                            // can only have been replaced by a newer one.
                            let now =
                                version(db.get(format!("key{k}").as_bytes()).unwrap().as_ref());
                            assert!(now >= v, "key{k}: version {v} accepted, then {now} read");
                        }
                    }
                }
                best
            })
        })
        .collect();
    let mut best = [0u64; KEYS];
    for h in handles {
        for (k, v) in h.join().expect("writer").into_iter().enumerate() {
            best[k] = best[k].max(v);
        }
    }
    for (k, want) in best.iter().enumerate() {
        let got = version(db.get(format!("key{k}").as_bytes()).unwrap().as_ref());
        assert_eq!(got, *want, "key{k} lost its newest version");
    }
}

#[test]
fn under_sync_what_returned_survives_a_power_cut() {
    let dev = nand(16, LossMode::RandomUnsynced);
    let opts = Options {
        durability: Durability::Sync,
        background: true,
        ..small_opts()
    };
    let db = open(&dev, &opts);
    for i in 0..50u64 {
        let mut value = (i + 1).to_be_bytes().to_vec();
        value.extend_from_slice(&[7; 300]);
        let key = format!("k{}", i % 10);
        let w = db
            .write_batch_if(&[put(&key, &value)], |_, cur| {
                Ok(i + 1 > version(cur.value()?.as_ref()))
            })
            .unwrap();
        assert_eq!(w, [true]);
    }
    dev.cut_power_now();
    drop(db);
    dev.power_cycle(11);
    let db = open(&dev, &opts);
    for k in 0..10u64 {
        let got = version(db.get(format!("k{k}").as_bytes()).unwrap().as_ref());
        assert_eq!(got, 41 + k, "k{k}");
    }
}
