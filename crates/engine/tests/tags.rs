//! Value tags (`tag.rs`): for every key, what `multi_get_meta` answers from
//! the index must match the value a GET returns (its tag, length and
//! checksum) through flushes, compactions, value GC, a power cut and
//! recovery, against an in-memory model; and a conditional batch that
//! decides from tags alone reads no value from the device.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::*;
use engine::flash::LossMode;
use engine::{BatchOp, Durability, Options, Tagging, TAG_LEN, TAG_MAGIC};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A value with a tag (`[TAG_MAGIC, version..]`) or, one in four, without.
fn value(rng: &mut SmallRng, version: u64) -> Vec<u8> {
    let len = rng.gen_range(0..600);
    let mut v = Vec::with_capacity(len + 10);
    if rng.gen_range(0..4) > 0 {
        v.push(TAG_MAGIC);
        v.push(1);
        v.extend_from_slice(&version.to_be_bytes());
    }
    v.extend((0..len).map(|i| (i as u64 ^ version) as u8));
    v
}

fn expected_tag(v: &[u8]) -> Tagging {
    if v.len() > TAG_LEN && v[0] == TAG_MAGIC {
        Tagging::Tagged(v[1..=TAG_LEN].try_into().expect("9 bytes"))
    } else {
        Tagging::Untagged
    }
}

fn check(db: &engine::Db, model: &BTreeMap<Vec<u8>, Vec<u8>>, keys: &[Vec<u8>], when: &str) {
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let metas = db.multi_get_meta(&refs).expect("meta");
    // From DRAM alone (the node's network thread): the same answers, or
    // none at all when a keytable block is not cached.
    if let Some(fast) = db.try_multi_get_meta(&refs).expect("try meta") {
        assert_eq!(fast, metas, "{when}: metadata from DRAM alone");
    }
    for (k, m) in keys.iter().zip(metas) {
        match (model.get(k), m) {
            (None, None) => {}
            (Some(v), Some(m)) => {
                assert_eq!(m.value_len as usize, v.len(), "{when}: length of {k:?}");
                assert_eq!(m.value_crc, crc32c::crc32c(v), "{when}: crc of {k:?}");
                // Entries always keep the tag now (none predate tags here).
                assert_eq!(m.tag, expected_tag(v), "{when}: tag of {k:?}");
            }
            (want, got) => panic!("{when}: {k:?}: model {want:?}, meta {got:?}"),
        }
    }
    // A range listing answers the same, in key order, live keys only.
    let listed = db
        .scan_meta_bounded(b"", b"", usize::MAX, usize::MAX)
        .expect("scan meta");
    assert_eq!(listed.len(), model.len(), "{when}: keys listed");
    for ((k, m), (mk, v)) in listed.iter().zip(model.iter()) {
        assert_eq!(&k[..], &mk[..], "{when}: listing order");
        assert_eq!(
            m.value_len as usize,
            v.len(),
            "{when}: listed length of {k:?}"
        );
        assert_eq!(
            m.value_crc,
            crc32c::crc32c(v),
            "{when}: listed crc of {k:?}"
        );
        assert_eq!(m.tag, expected_tag(v), "{when}: listed tag of {k:?}");
    }
    let (from, to) = (&keys[10][..], &keys[20][..]);
    let part = db.scan_meta_bounded(from, to, 3, usize::MAX).expect("part");
    let want: Vec<&Vec<u8>> = model
        .range(from.to_vec()..to.to_vec())
        .map(|(k, _)| k)
        .take(3)
        .collect();
    let got: Vec<Vec<u8>> = part.iter().map(|(k, _)| k.to_vec()).collect();
    assert_eq!(
        got.iter().collect::<Vec<_>>(),
        want,
        "{when}: bounded listing"
    );
    // From DRAM alone: the same listings, or none at all.
    for (from, to, limit) in [(&b""[..], &b""[..], usize::MAX), (from, to, 3)] {
        if let Some(fast) = db
            .try_scan_meta_bounded(from, to, limit, usize::MAX)
            .expect("try scan meta")
        {
            let slow = db
                .scan_meta_bounded(from, to, limit, usize::MAX)
                .expect("scan meta");
            assert_eq!(fast, slow, "{when}: listing from DRAM alone");
        }
    }
}

#[test]
fn index_tags_match_the_values_through_maintenance_and_recovery() {
    let dev = nand(32, LossMode::AllUnsynced);
    let opts = Options {
        durability: Durability::Sync,
        ..small_opts()
    };
    let mut db = open(&dev, &opts);
    let mut rng = SmallRng::seed_from_u64(17);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let keys: Vec<Vec<u8>> = (0..300).map(key).collect();
    for round in 0..12u64 {
        for i in 0..400u64 {
            let k = keys[rng.gen_range(0..keys.len())].clone();
            if rng.gen_range(0..10) == 0 {
                db.delete(&k).expect("delete");
                model.remove(&k);
            } else if rng.gen_range(0..3) == 0 {
                // The same value written in two parts, split anywhere
                // (inside the tag too): stored and tagged as one.
                let v = value(&mut rng, round * 1000 + i);
                let split = rng.gen_range(0..=v.len());
                let op = BatchOp::PutParts {
                    key: Bytes::from(k.clone()),
                    head: Bytes::copy_from_slice(&v[..split]),
                    body: Bytes::copy_from_slice(&v[split..]),
                };
                db.write_batch(&[op]).expect("put parts");
                assert_eq!(db.get(&k).expect("get").as_deref(), Some(&v[..]));
                model.insert(k, v);
            } else {
                let v = value(&mut rng, round * 1000 + i);
                db.put(&k, &v).expect("put");
                model.insert(k, v);
            }
        }
        check(
            &db,
            &model,
            &keys,
            &format!("round {round} before maintenance"),
        );
        db.maintenance().expect("maintenance");
        if round % 3 == 2 {
            db.gc().expect("gc");
        }
        check(
            &db,
            &model,
            &keys,
            &format!("round {round} after maintenance"),
        );
        if round % 4 == 3 {
            crash(&dev, db, round);
            db = open(&dev, &opts);
            check(&db, &model, &keys, &format!("round {round} after recovery"));
        }
    }
}

/// Version compares decided from tags: the device is not read for values
/// (the keytables of this small store stay cached).
#[test]
fn tag_decisions_read_no_values() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    let versioned = |v: u64| {
        let mut b = vec![TAG_MAGIC, 1];
        b.extend_from_slice(&v.to_be_bytes());
        b.extend_from_slice(&[9; 2000]);
        Bytes::from(b)
    };
    for k in 0..20 {
        db.put(&key(k), &versioned(10)).expect("put");
    }
    db.maintenance().expect("flush");
    let db = reopened(&dev, db, &small_opts());
    let newer: Vec<BatchOp> = (0..20)
        .map(|k| BatchOp::Put(key(k).into(), versioned(if k % 2 == 0 { 20 } else { 5 })))
        .collect();
    let newer_version = |tag: [u8; TAG_LEN]| u64::from_be_bytes(tag[1..].try_into().expect("8"));
    let (written, reads) = reads_during(&dev, || {
        db.write_batch_if(&newer, |i, cur| {
            let BatchOp::Put(_, v) = &newer[i] else {
                return Ok(false);
            };
            let mine = newer_version(v[1..=TAG_LEN].try_into().expect("tag"));
            Ok(match cur.tag() {
                Tagging::Tagged(t) => newer_version(t) < mine,
                _ => true,
            })
        })
        .expect("conditional")
    });
    assert_eq!(
        written,
        (0..20).map(|k| k % 2 == 0).collect::<Vec<_>>(),
        "newer versions written, older refused"
    );
    assert!(
        reads.bytes < 20 * 2000,
        "decisions read {} bytes: values were read",
        reads.bytes
    );
}

/// `try_multi_get_meta` answers what `multi_get_meta` answers while the
/// keytable blocks it needs are cached, and declines, without reading the
/// device, when one is not.
#[test]
fn metadata_from_dram_alone_matches_or_declines() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    for k in 0..500 {
        db.put(&key(k), &value_for(k, 1, 100)).expect("put");
    }
    db.maintenance().expect("flush");
    let keys: Vec<Vec<u8>> = (0..520).map(key).collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let slow = db.multi_get_meta(&refs).expect("meta");
    assert_eq!(slow.iter().filter(|m| m.is_some()).count(), 500);
    let (fast, reads) = reads_during(&dev, || db.try_multi_get_meta(&refs).expect("try"));
    assert_eq!(fast, Some(slow.clone()), "cached: the same answers");
    assert_eq!(reads.ops, 0);
    // No keytable block stays cached: it declines, and reads nothing.
    let cold = Options {
        cache_bytes: 0,
        ..small_opts()
    };
    let db = reopened(&dev, db, &cold);
    let (fast, reads) = reads_during(&dev, || db.try_multi_get_meta(&refs).expect("try"));
    assert_eq!(fast, None, "a block to read: declined");
    assert_eq!(reads.ops, 0, "declined without a device read");
    assert_eq!(db.multi_get_meta(&refs).expect("meta"), slow);
}

/// `try_scan_meta_bounded` lists what `scan_meta_bounded` lists while the
/// keytable blocks it walks are cached (the memtable's versions merged
/// with the levels', at any limit), and declines, without reading the
/// device, when one is not: also when the listing it could give from the
/// memtable alone would break the byte bound.
#[test]
fn listings_from_dram_alone_match_or_decline() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    for k in 0..500 {
        db.put(&key(k), &value_for(k, 1, 100)).expect("put");
    }
    db.maintenance().expect("flush");
    // Newer versions and deletions in the memtable, over the levels.
    for k in (0..500).step_by(7) {
        db.put(&key(k), &value_for(k, 2, 60)).expect("put");
    }
    for k in (3..500).step_by(11) {
        db.delete(&key(k)).expect("delete");
    }
    let slow = db
        .scan_meta_bounded(b"", b"", usize::MAX, usize::MAX)
        .expect("scan");
    assert!(slow.len() > 400, "{} listed", slow.len());
    for limit in [1, 10, 100, usize::MAX] {
        let want = db
            .scan_meta_bounded(&key(20), b"", limit, usize::MAX)
            .expect("scan");
        let (fast, reads) = reads_during(&dev, || {
            db.try_scan_meta_bounded(&key(20), b"", limit, usize::MAX)
                .expect("try")
        });
        assert_eq!(fast, Some(want), "cached, limit {limit}: the same listing");
        assert_eq!(reads.ops, 0);
    }
    let cold = Options {
        cache_bytes: 0,
        ..small_opts()
    };
    let db = reopened(&dev, db, &cold);
    let (fast, reads) = reads_during(&dev, || {
        db.try_scan_meta_bounded(b"", b"", usize::MAX, usize::MAX)
            .expect("try")
    });
    assert_eq!(fast, None, "a block to read: declined");
    assert_eq!(reads.ops, 0, "declined without a device read");
    // A bound the memtable's versions alone would break: still declined,
    // not refused as too large.
    for k in 0..50 {
        db.put(&key(k), &value_for(k, 3, 10)).expect("put");
    }
    assert_eq!(
        db.try_scan_meta_bounded(b"", b"", usize::MAX, 64)
            .expect("declined, not an error"),
        None
    );
    let revived = (0..50).filter(|k| k % 11 == 3).count();
    assert_eq!(
        db.scan_meta_bounded(b"", b"", usize::MAX, usize::MAX)
            .expect("scan")
            .len(),
        slow.len() + revived,
        "the slow path still answers"
    );
    // A walk past more deletions than four entries per key asked for
    // (plus 256) declines: bounded work for the network thread.
    let cached = Options {
        cache_bytes: 64 << 20,
        ..small_opts()
    };
    let db = reopened(&dev, db, &cached);
    db.scan_meta_bounded(b"", b"", usize::MAX, usize::MAX)
        .expect("warm the cache");
    for k in 100..450 {
        db.delete(&key(k)).expect("delete");
    }
    let slow = db
        .scan_meta_bounded(&key(100), b"", 2, usize::MAX)
        .expect("scan");
    assert_eq!(slow.len(), 2, "two live keys after the deleted run");
    assert_eq!(
        db.try_scan_meta_bounded(&key(100), b"", 2, usize::MAX)
            .expect("try"),
        None,
        "350 deletions to pass for 2 keys: declined"
    );
    // Each deleted key is two entries (its deletion, its older put): some
    // 800 to the end, within 4 × 200 + 256.
    assert_eq!(
        db.try_scan_meta_bounded(&key(100), b"", 200, usize::MAX)
            .expect("try"),
        Some(
            db.scan_meta_bounded(&key(100), b"", 200, usize::MAX)
                .expect("scan")
        ),
        "within the bound: answered"
    );
}
