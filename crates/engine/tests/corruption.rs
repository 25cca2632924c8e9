//! Corruption: flipped bits in value pages, keytables and the manifest give
//! checksum errors (or a clean open failure), never wrong data or a panic.

mod common;

use std::sync::Arc;

use common::*;
use engine::flash::{Device, LossMode, NandDevice};
use engine::{Error, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KEYS: u32 = 300;

fn value_len(k: u32) -> usize {
    200 + (k as usize % 7) * 300
}

fn filled(opts: &Options) -> Arc<NandDevice> {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, opts);
    for k in 0..KEYS {
        db.put(&key(k), &value_for(k, 1, value_len(k)))
            .expect("put");
    }
    db.maintenance().expect("maintenance");
    db.flush().expect("flush");
    drop(db);
    dev
}

/// Byte offsets where `needle` occurs on the device.
fn find(dev: &NandDevice, needle: &[u8]) -> Vec<u64> {
    let mut hits = Vec::new();
    let mut at = 0u64;
    while at < dev.capacity() {
        let chunk = (1usize << 20).min((dev.capacity() - at) as usize);
        let mut buf = vec![0u8; chunk];
        dev.read_at(at, &mut buf).expect("raw read");
        for i in 0..chunk.saturating_sub(needle.len()) {
            if &buf[i..i + needle.len()] == needle {
                hits.push(at + i as u64);
            }
        }
        if at + chunk as u64 >= dev.capacity() {
            break;
        }
        at += chunk as u64 - needle.len() as u64;
        at -= at % 4096;
    }
    hits.sort_unstable();
    hits.dedup();
    hits
}

/// Every key reads back correctly or fails with an error; returns the failures.
fn check_all(dev: &Arc<NandDevice>, opts: &Options) -> Option<Vec<u32>> {
    let db = engine::Db::open(dev.clone() as Arc<dyn Device>, opts.clone()).ok()?;
    let mut failed = Vec::new();
    for k in 0..KEYS {
        match db.get(&key(k)) {
            Ok(Some(v)) => assert_eq!(
                v.as_ref(),
                &value_for(k, 1, value_len(k))[..],
                "wrong data for {k}"
            ),
            Ok(None) => panic!("key {k} silently missing"),
            Err(_) => failed.push(k),
        }
    }
    Some(failed)
}

#[test]
fn flipped_value_bit_is_a_checksum_error() {
    let opts = small_opts();
    let dev = filled(&opts);
    let v = value_for(42, 1, value_len(42));
    let hits = find(&dev, &v[..64]);
    assert_eq!(hits.len(), 1, "value stored once");
    dev.flip_bit(hits[0] + 10, 3);
    let db = open(&dev, &opts);
    assert!(matches!(
        db.get(&key(42)),
        Err(Error::ChecksumMismatch { .. })
    ));
    assert!(db.get(&key(43)).expect("other keys fine").is_some());
}

#[test]
fn flipped_keytable_bit_is_a_checksum_error() {
    for cache_bytes in [0, 32 << 20] {
        flipped_keytable_bit(cache_bytes);
    }
}

/// With `cache_bytes` 0 blocks are read on demand; with a cache they are
/// loaded at open, where a corrupt one must not make the store unusable.
fn flipped_keytable_bit(cache_bytes: usize) {
    let mut opts = small_opts();
    opts.cache_bytes = cache_bytes;
    let dev = filled(&opts);
    // The key occurs in its log record and in a keytable block; corrupt both.
    for at in find(&dev, &key(77)) {
        dev.flip_bit(at + 3, 0);
    }
    let failed = check_all(&dev, &opts).expect("open works");
    assert!(failed.contains(&77), "corrupted key must fail");
}

#[test]
fn corrupt_manifest_slots() {
    let opts = small_opts();
    let dev = filled(&opts);
    // Slots follow the superblock page; corrupting one falls back to the
    // other checkpoint, corrupting both makes open fail cleanly.
    let page = 4096u64;
    let slot = 2 << 20;
    for first in [page + 40, page + slot + 40] {
        let dev = filled(&opts);
        dev.flip_bit(first, 1);
        let _ = check_all(&dev, &opts);
    }
    dev.flip_bit(page + 40, 1);
    dev.flip_bit(page + slot + 40, 1);
    let both = engine::Db::open(dev.clone() as Arc<dyn Device>, opts.clone());
    assert!(both.is_err(), "both checkpoints corrupt must fail to open");
}

#[test]
fn random_bit_flips_never_give_wrong_data() {
    let opts = {
        let mut o = small_opts();
        o.cache_bytes = 0;
        o
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let base = filled(&opts);
    let mut written = Vec::new();
    let mut page = vec![0u8; 4096];
    for p in 0..base.capacity() / 4096 {
        base.read_at(p * 4096, &mut page).expect("raw read");
        if page.iter().any(|&b| b != 0xFF) {
            written.push(p);
        }
    }
    for _ in 0..60 {
        let dev = filled(&opts);
        for _ in 0..3 {
            let p = written[rng.gen_range(0..written.len())];
            dev.flip_bit(p * 4096 + rng.gen_range(0..4096), rng.gen_range(0..8));
        }
        let _ = check_all(&dev, &opts);
    }
}
