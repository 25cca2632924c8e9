//! Basic behaviour of the engine on the emulated device.

mod common;

use std::sync::Arc;

use bytes::Bytes;

use common::*;
use engine::flash::{LossMode, NandDevice};
use engine::{BatchOp, Db, Durability, Error, Options};

#[test]
fn put_get_delete_scan_across_flushes_and_reopen() {
    for dev in TestDevice::both(16) {
        put_get_delete_scan(&dev);
    }
}

fn put_get_delete_scan(dev: &TestDevice) {
    let opts = small_opts();
    let db = dev.open(&opts);
    for i in 0..300u32 {
        db.put(&key(i), &value_for(i, 1, 100 + i as usize * 7))
            .expect("put");
    }
    db.delete(&key(5)).expect("delete");
    db.maintenance().expect("maintenance");
    assert!(db.stats().flushes > 0, "small memtable must have flushed");
    for i in 0..300u32 {
        let got = db.get(&key(i)).expect("get");
        if i == 5 {
            assert_eq!(got, None);
        } else {
            assert_eq!(
                got.as_deref(),
                Some(&value_for(i, 1, 100 + i as usize * 7)[..]),
                "key {i}"
            );
        }
    }
    let r = db.scan(&key(3), &key(8), 100).expect("scan");
    let keys: Vec<_> = r.iter().map(|(k, _)| k.to_vec()).collect();
    assert_eq!(keys, vec![key(3), key(4), key(6), key(7)]);
    let r = db.scan(&key(3), b"", 2).expect("scan limit");
    assert_eq!(r.len(), 2);
    drop(db);
    let db = dev.open(&opts);
    assert_eq!(db.get(&key(5)).expect("get"), None);
    assert_eq!(
        db.get(&key(299)).expect("get").as_deref(),
        Some(&value_for(299, 1, 100 + 299 * 7)[..])
    );
}

#[test]
fn snapshots_see_old_versions_through_compaction() {
    for dev in TestDevice::both(16) {
        snapshots_see_old_versions(&dev);
    }
}

fn snapshots_see_old_versions(dev: &TestDevice) {
    let db = dev.open(&small_opts());
    db.put(b"a", b"1").expect("put");
    let snap = db.snapshot();
    db.put(b"a", b"2").expect("put");
    db.delete(b"b").expect("delete");
    for i in 0..500u32 {
        db.put(&key(i), &value_for(i, 2, 200)).expect("put");
    }
    db.maintenance().expect("maintenance");
    db.gc().expect("gc");
    assert_eq!(
        db.get_at(b"a", &snap).expect("get").as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(db.get(b"a").expect("get").as_deref(), Some(&b"2"[..]));
    assert_eq!(
        db.scan_at(b"a", b"b", 10, &snap).expect("scan")[0]
            .1
            .as_ref(),
        b"1"
    );
}

#[test]
fn limits_give_clear_errors() {
    for dev in TestDevice::both(16) {
        limits(&dev);
    }
}

fn limits(dev: &TestDevice) {
    let opts = small_opts();
    let db = dev.open(&opts);
    assert!(matches!(db.put(b"", b"v"), Err(Error::KeyTooLarge { .. })));
    assert!(matches!(
        db.put(&vec![1u8; opts.max_key_size + 1], b"v"),
        Err(Error::KeyTooLarge { .. })
    ));
    let big = vec![7u8; db.max_value_size() + 1];
    assert!(matches!(
        db.put(b"k", &big),
        Err(Error::ValueTooLarge { .. })
    ));
    let ok = vec![7u8; db.max_value_size()];
    db.put(b"k", &ok).expect("largest value");
    assert_eq!(db.get(b"k").expect("get").map(|v| v.len()), Some(ok.len()));
}

#[test]
fn batches_are_atomic_and_visible_together() {
    for dev in TestDevice::both(16) {
        batches_visible_together(&dev);
    }
}

fn batches_visible_together(dev: &TestDevice) {
    let db = dev.open(&small_opts());
    db.write_batch(&[
        BatchOp::Put("x".into(), "1".into()),
        BatchOp::Put("y".into(), "2".into()),
        BatchOp::Delete("x".into()),
    ])
    .expect("batch");
    assert_eq!(db.get(b"x").expect("get"), None);
    assert_eq!(db.get(b"y").expect("get").as_deref(), Some(&b"2"[..]));
}

#[test]
fn dram_budget_keeps_index_then_cache_then_filters() {
    let dev = nand(16, LossMode::AllUnsynced);
    let opts = small_opts();
    let db = open(&dev, &opts);
    for i in 0..1500u32 {
        db.put(&key(i), &value_for(i, 1, 64)).expect("put");
    }
    db.maintenance().expect("maintenance");
    let roomy = db.stats();
    assert!(
        roomy.dram_bloom_bytes > 0 && roomy.dram_index_bytes > 0,
        "{roomy:?}"
    );
    drop(db);
    // A budget that holds the level index only: filters go, the cache gets nothing.
    let mut tight = opts.clone();
    tight.dram_budget = roomy.dram_index_bytes as usize + 1024;
    let db = open(&dev, &tight);
    for i in (0..1500u32).step_by(13) {
        assert_eq!(
            db.get(&key(i)).expect("get").as_deref(),
            Some(&value_for(i, 1, 64)[..])
        );
    }
    let s = db.stats();
    assert_eq!(s.dram_bloom_bytes, 0, "{s:?}");
    assert!(s.dram_cache_bytes <= 1024, "{s:?}");
    assert!(
        s.device_reads_per_get > 1.0,
        "uncached keytables are read from the device: {s:?}"
    );
}

#[test]
fn large_batches_of_small_records_fit() {
    let dev = nand(16, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    // Far more records than the segment has pages.
    let ops: Vec<BatchOp> = (0..600u32)
        .map(|i| BatchOp::Put(key(i).into(), bytes::Bytes::from(value_for(i, 3, 8))))
        .collect();
    db.write_batch(&ops).expect("batch of small records");
    assert_eq!(
        db.get(&key(599)).expect("get").as_deref(),
        Some(&value_for(599, 3, 8)[..])
    );
}

#[test]
fn values_of_64_mib_on_a_file_device() {
    use engine::flash::{Device, FileDevice};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dev");
    let open_file = || {
        let dev = FileDevice::open(&path, Some(4 << 30), 8192).expect("device");
        engine::Db::open(
            dev as std::sync::Arc<dyn Device>,
            engine::Options::default(),
        )
        .expect("open")
    };
    let db = open_file();
    assert!(
        db.max_value_size() >= 64 << 20,
        "limit {}",
        db.max_value_size()
    );
    let big = value_for(1, 1, 64 << 20);
    db.put(b"big", &big).expect("64 MiB value");
    db.put(b"small", b"x").expect("put");
    assert!(db.get(b"big").expect("get").as_deref() == Some(&big[..]));
    db.close().expect("close");
    let db = open_file();
    assert!(db.get(b"big").expect("get after reopen").as_deref() == Some(&big[..]));
    assert!(matches!(
        db.put(b"bigger", &vec![0u8; (64 << 20) + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
}

/// A store holding keys `0..n` with `len`-byte values (version 1), reopened
/// so that reads come from the device.
fn reopened_with_values(n: u32, len: usize) -> (Arc<NandDevice>, Db) {
    let dev = nand(64, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    for i in 0..n {
        db.put(&key(i), &value_for(i, 1, len)).expect("put");
    }
    let db = reopened(&dev, db, &small_opts());
    (dev, db)
}

/// A multi-get reads each value's record and no more: its 512-byte-aligned
/// extent, not the 4 KiB-rounded buffer it lands in.
#[test]
fn multi_get_reads_only_the_records() {
    let len = 8192;
    let (dev, db) = reopened_with_values(64, len);
    let wanted: Vec<Vec<u8>> = (0..64u32).step_by(8).map(key).collect();
    let keys: Vec<&[u8]> = wanted.iter().map(|k| &k[..]).collect();
    let (got, reads) = reads_during(&dev, || db.multi_get(&keys).expect("multi_get"));
    let read = reads.bytes;
    for (i, v) in (0..64u32).step_by(8).zip(&got) {
        assert_eq!(v.as_deref(), Some(&value_for(i, 1, len)[..]), "key {i}");
    }
    // Only the values are read (their checksums are in the index), and each
    // 8 KiB value starts on a 512-byte boundary: exactly 8 KiB per value.
    // The keytable cache is warmed at open, so no keytable block is read.
    let want = (keys.len() * len) as u64;
    assert_eq!(
        read,
        want,
        "bytes read for {} values of {len} bytes",
        keys.len()
    );
}

/// A bounded multi-get answers each group's keys in order while its
/// records fit the byte bound (at least one value per group), reads no
/// value past the cut, and answers missing keys on the way.
#[test]
fn bounded_multi_get_answers_a_prefix_of_each_group_and_reads_no_more() {
    let len = 8192;
    let (dev, db) = reopened_with_values(64, len);
    let wanted: Vec<Vec<u8>> = (0..10u32).map(key).chain([b"missing".to_vec()]).collect();
    // Groups: [k0 k1 k2 k3 k4] [k5] [missing-first: "missing" is placed
    // below as its own group] [k6 k7 k8 k9].
    let keys: Vec<&[u8]> = [0usize, 1, 2, 3, 4, 5, 10, 6, 7, 8, 9]
        .iter()
        .map(|&i| &wanted[i][..])
        .collect();
    let groups = [5, 1, 1, 4];
    // Room for two 8 KiB records per group, not three.
    let bound = 2 * len + 1024;
    let (got, reads) = reads_during(&dev, || {
        db.multi_get_bounded(&keys, &groups, bound)
            .expect("bounded multi_get")
    });
    let lens: Vec<usize> = got.iter().map(Vec::len).collect();
    assert_eq!(lens, [2, 1, 1, 2], "answered prefix per group");
    let expect = |i: u32| Some(Bytes::from(value_for(i, 1, len)));
    assert_eq!(got[0], [expect(0), expect(1)]);
    assert_eq!(got[1], [expect(5)]);
    assert_eq!(got[2], [None], "a missing key is answered");
    assert_eq!(got[3], [expect(6), expect(7)]);
    // Five values, and no sixth (a lookup of the missing key may read a
    // small keytable block).
    let read = reads.bytes;
    assert!(
        (5 * len as u64..6 * len as u64).contains(&read),
        "only the answered values are read: {read} bytes"
    );
    // A single value larger than the bound is still read: progress.
    let one = db
        .multi_get_bounded(&keys[..1], &[1], 1)
        .expect("tiny bound");
    assert_eq!(one, [vec![expect(0)]]);
    // Inconsistent groups are refused, not guessed at.
    assert!(matches!(
        db.multi_get_bounded(&keys, &[1], bound),
        Err(Error::InvalidArgument(_))
    ));
}

/// Bounded scans refuse, before reading any value, a result whose keys (and
/// records) exceed the bound, and answer in full below it.
#[test]
fn bounded_scans_refuse_results_over_the_bound() {
    let len = 8192;
    let (dev, db) = reopened_with_values(64, len);
    let (r, reads) = reads_during(&dev, || db.scan_bounded(b"", b"", 10, 5 * len));
    assert!(matches!(r, Err(Error::TooLarge { max }) if max == 5 * len));
    assert!(
        reads.bytes < len as u64,
        "no value read: {} bytes",
        reads.bytes
    );
    let got = db.scan_bounded(b"", b"", 4, 5 * len).expect("within bound");
    assert_eq!(got.len(), 4);
    assert_eq!(got, db.scan(b"", b"", 4).expect("scan"));
    let key_bytes: usize = (0..10u32).map(|i| key(i).len()).sum();
    assert!(matches!(
        db.scan_keys_bounded(b"", b"", 10, key_bytes - 1),
        Err(Error::TooLarge { .. })
    ));
    assert_eq!(
        db.scan_keys_bounded(b"", b"", 10, key_bytes)
            .expect("keys fit"),
        db.scan_keys(b"", b"", 10).expect("scan_keys")
    );
}

/// Large values are stored sector-aligned, whatever their key length, so a
/// GET reads exactly the value's own 512-byte blocks (an 8 KiB value is one
/// 8 KiB read, not 8.5 KiB with its record header and key).
#[test]
fn large_values_are_read_as_exactly_their_blocks() {
    let dev = nand(64, LossMode::AllUnsynced);
    let db = open(&dev, &small_opts());
    // Key lengths around the cases where the alignment pad must grow: a pad
    // shorter than a record header, a record that would start in a page tail.
    let key_lens = [2, 11, 300, 470, 490, 492, 500, 511, 512, 520, 1000, 1024];
    let value_lens = [4096, 5000, 8192, 8193, 12_000];
    let mut written = Vec::new();
    for (i, kl) in key_lens.iter().enumerate() {
        for (j, vl) in value_lens.iter().enumerate() {
            let mut k = vec![b'a' + i as u8, b'a' + j as u8];
            k.resize(*kl, b'x');
            let v = value_for((i * 10 + j) as u32, 1, *vl);
            db.put(&k, &v).expect("put");
            // Small records in between shift the next record's start.
            db.put(format!("s{i}{j}").as_bytes(), &value_for(7, 1, i * 37 + j))
                .expect("put small");
            written.push((k, v));
        }
    }
    let db = reopened(&dev, db, &small_opts());
    for (k, v) in &written {
        let (got, reads) = reads_during(&dev, || db.get(k).expect("get"));
        let read = reads.bytes;
        assert!(got.as_deref() == Some(&v[..]), "key of {} bytes", k.len());
        assert_eq!(
            read,
            v.len().div_ceil(512) as u64 * 512,
            "a value of {} bytes under a key of {} bytes",
            v.len(),
            k.len()
        );
    }
}

/// Values of whole blocks behind a short header (the cluster's versioned
/// values: 10 bytes, then 4 KiB) are not aligned: their records lie back to
/// back with no pad, and a GET still reads at most one sector more than the
/// value spans.
#[test]
fn values_with_a_short_tail_are_packed() {
    let dev = nand(64, LossMode::AllUnsynced);
    // No sync after each batch (a sync pads the log to its page's end).
    let opts = Options {
        durability: Durability::None,
        ..small_opts()
    };
    let db = open(&dev, &opts);
    let n = 8u32;
    // A batch of `len`-byte values; the log bytes it took.
    let batch = |db: &Db, first: u32, len: usize| {
        let before = db.stats().log_bytes;
        let items: Vec<(u32, Option<Vec<u8>>)> = (first..first + n)
            .map(|i| (i, Some(value_for(i, 1, len))))
            .collect();
        db.write_batch(&batch_ops(&items)).expect("batch");
        db.stats().log_bytes - before
    };
    let (packed, aligned) = (4096 + 10, 4096 + 100);
    let record = |len: usize| (20 + key(0).len() + len) as u64;
    // Page tails too short for a record header are all it adds.
    let used = batch(&db, 0, packed);
    assert!(
        used <= u64::from(n) * (record(packed) + 20),
        "{used} bytes of log for {n} records of {}",
        record(packed)
    );
    let used = batch(&db, n, aligned);
    assert!(
        used >= u64::from(n) * 4608,
        "{used} bytes for {n} aligned values"
    );
    let db = reopened(&dev, db, &opts);
    for i in 0..2 * n {
        let len = if i < n { packed } else { aligned };
        let (got, reads) = reads_during(&dev, || db.get(&key(i)).expect("get"));
        assert!(got.as_deref() == Some(&value_for(i, 1, len)[..]), "key {i}");
        let most = if i < n {
            len.div_ceil(512) + 1
        } else {
            len.div_ceil(512)
        };
        assert!(
            reads.bytes <= most as u64 * 512,
            "{} bytes read for a value of {len}",
            reads.bytes
        );
    }
}

/// A range of large values written one after another is read with a few
/// large device reads, through the headers and alignment pads between the
/// values, not one read per value.
#[test]
fn scans_of_large_values_merge_their_reads() {
    let len = 8192;
    let (dev, db) = reopened_with_values(24, len);
    let (got, reads) = reads_during(&dev, || db.scan(&key(0), b"", 100).expect("scan"));
    let reads = reads.ops;
    assert_eq!(got.len(), 24);
    for (i, (k, v)) in got.iter().enumerate() {
        assert_eq!(&k[..], &key(i as u32)[..]);
        assert!(v[..] == value_for(i as u32, 1, len)[..], "value {i}");
    }
    // 24 × 8 KiB plus gaps is under two 256 KiB merged reads; segment
    // boundaries may add one or two.
    assert!(
        reads <= 4,
        "{reads} device reads for a scan of 24 adjacent values"
    );
}
