//! The cluster client against real `lightstore node` processes: replica
//! placement, a node killed with SIGKILL under load (no acknowledged write
//! lost, every read served), restart and repair, range reads merged across
//! nodes against an in-memory model, and the `lightstore up` / `cluster`
//! subcommands.

mod node_support;

use node_support::cluster::TestCluster;
use node_support::lightstore;
use node_support::{free_port, Node};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{Cluster, ClusterConfig};
use protocol::versioned::{version_of, Versioned};
use protocol::Reply;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What node `i` stores for `key`, decoded.
fn stored(c: &Cluster, i: usize, key: &[u8]) -> Option<Versioned> {
    match c.call_node(i, &[&b"GET"[..], key]).expect("node GET") {
        Reply::Bulk(b) => Some(Versioned::decode(b)),
        _ => None,
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:05}").into_bytes()
}

#[test]
fn dead_node_loses_nothing_and_repair_catches_it_up() {
    // Without hinted handoff, so repair is what catches the node up.
    let mut tc = TestCluster::start_with(3, &["--hinted-handoff", "no"]);
    let c = tc.client();
    assert_eq!(c.replica_count(), 2);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
        .map(|i| (key(i), format!("v1-{i}").into_bytes()))
        .collect();
    for chunk in pairs.chunks(50) {
        c.mset(chunk).expect("mset");
    }
    model.extend(pairs);

    // Each key is on exactly its two replicas, distinct nodes.
    for k in model.keys() {
        let r = c.replicas_of(k);
        assert_eq!(r.len(), 2);
        assert_ne!(r[0], r[1]);
        for i in 0..3 {
            assert_eq!(
                stored(&c, i, k).is_some(),
                r.contains(&i),
                "key {k:?} on node {i}"
            );
        }
    }

    // Kill node 1 with SIGKILL; writes, overwrites and deletes go on.
    tc.kill(1);
    for i in 300..500 {
        c.set(&key(i), format!("v1-{i}").as_bytes())
            .expect("set while a node is down");
        model.insert(key(i), format!("v1-{i}").into_bytes());
    }
    for i in (0..300).step_by(7) {
        c.set(&key(i), format!("v2-{i}").as_bytes())
            .expect("overwrite");
        model.insert(key(i), format!("v2-{i}").into_bytes());
    }
    for i in (1..500).step_by(11) {
        c.delete(&key(i)).expect("delete");
        model.remove(&key(i));
    }
    assert!(!c.is_up(1), "the dead node is marked down");
    // Every read succeeds and sees every acknowledged write.
    let keys: Vec<Vec<u8>> = (0..500).map(key).collect();
    let got = c.mget(&keys).expect("mget with a node down");
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(v.as_deref(), model.get(k).map(|v| &v[..]), "key {k:?}");
    }
    for k in keys.iter().step_by(13) {
        assert_eq!(
            c.get(k).expect("get").as_deref(),
            model.get(k).map(|v| &v[..])
        );
    }
    let all = c.range(b"", b"", 10_000).expect("range with a node down");
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let got: Vec<(Vec<u8>, Vec<u8>)> = all.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
    assert_eq!(got, want);

    // The writing client goes away with its hints (as after an application
    // restart); the node restarts with its old data and misses what
    // happened meanwhile until a repair.
    drop(c);
    tc.restart(1);
    let c = tc.client();
    let stale = (0..500)
        .filter(|&i| c.replicas_of(&key(i)).contains(&1))
        .filter(|&i| {
            stored(&c, 1, &key(i)).map(|v| v.value.map(|b| b.to_vec()))
                != Some(model.get(&key(i)).cloned())
        })
        .count();
    assert!(stale > 50, "node 1 should be behind, {stale} stale keys");

    let report = c.repair().expect("repair");
    assert!(report.unreachable.is_empty(), "{report:?}");
    assert_eq!(report.misplaced, 0);
    assert!(
        report.total_copied() as usize >= stale,
        "{report:?} vs {stale} stale"
    );
    // Every replica of every key now holds the newest version.
    for i in 0..500 {
        let k = key(i);
        let copies: Vec<Option<Versioned>> = c
            .replicas_of(&k)
            .iter()
            .map(|&n| stored(&c, n, &k))
            .collect();
        for v in &copies {
            let v = v.as_ref().expect("replica has the key or its tombstone");
            assert_eq!(v.value.as_deref(), model.get(&k).map(|v| &v[..]), "key {i}");
        }
        assert_eq!(
            copies[0].as_ref().map(|v| v.version),
            copies[1].as_ref().map(|v| v.version)
        );
    }
    let again = c.repair().expect("second repair");
    assert_eq!(again.total_copied(), 0, "{again:?}");
}

/// A node that was down while a client wrote gets the writes it missed
/// from the replicas that took them (hinted handoff), with no client left
/// alive and no repair: the hints survive SIGKILL of the nodes holding them,
/// `status` shows them while they wait, and they are gone once delivered.
#[test]
fn missed_writes_are_handed_off_when_a_node_returns() {
    let mut tc = TestCluster::start(3);
    let c = tc.client();
    tc.kill(2);
    let keys: Vec<Vec<u8>> = (0..200).map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        c.set(k, format!("hinted-{i}").as_bytes())
            .expect("set with node 2 down");
    }
    c.mdelete(&keys[..20]).expect("deletes with node 2 down");
    assert!(!c.is_up(2));
    drop(c);
    // The holders of the hints crash and come back: the hints are durable.
    tc.kill(0);
    tc.kill(1);
    tc.restart(0);
    tc.restart(1);
    let observer = tc.client();
    let on_node2: Vec<usize> = (0..keys.len())
        .filter(|&i| observer.replicas_of(&keys[i]).contains(&2))
        .collect();
    assert!(on_node2.len() > 80, "{}", on_node2.len());
    let status = observer.status();
    assert!(status.iter().take(2).all(|s| s.up), "{status:?}");
    let waiting: u64 = status
        .iter()
        .flat_map(|s| s.hints.iter())
        .filter(|(t, _)| *t == tc.addrs[2])
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        waiting as usize,
        on_node2.len(),
        "one hint per missed write: {status:?}"
    );

    tc.restart(2);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let behind = on_node2
            .iter()
            .filter(|&&i| {
                let want = (i >= 20).then(|| format!("hinted-{i}").into_bytes());
                stored(&observer, 2, &keys[i]).map(|v| v.value.map(|b| b.to_vec())) != Some(want)
            })
            .count();
        if behind == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{behind} writes not handed off");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while observer.status().iter().any(|s| !s.hints.is_empty()) {
        assert!(Instant::now() < deadline, "hints kept after delivery");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(observer.repair().expect("repair").total_copied(), 0);
}

#[test]
fn range_reads_merge_like_one_node() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for round in 0..20 {
        let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..40)
            .map(|_| {
                let k = format!("r{:04}", rng.gen_range(0..1000)).into_bytes();
                (k, format!("val-{round}-{}", rng.gen::<u32>()).into_bytes())
            })
            .collect();
        // Duplicate keys in one MSET: the last one wins, as on one node.
        let mut dedup: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for (k, v) in &batch {
            dedup.insert(k.clone(), v.clone());
        }
        let batch: Vec<(Vec<u8>, Vec<u8>)> = dedup.into_iter().collect();
        c.mset(&batch).expect("mset");
        model.extend(batch);
        let dels: Vec<Vec<u8>> = (0..10)
            .map(|_| format!("r{:04}", rng.gen_range(0..1000)).into_bytes())
            .collect();
        c.mdelete(&dels).expect("mdelete");
        for d in &dels {
            model.remove(d);
        }
    }
    for _ in 0..60 {
        let a = format!("r{:04}", rng.gen_range(0..1100)).into_bytes();
        let b = if rng.gen_bool(0.2) {
            Vec::new()
        } else {
            format!("r{:04}", rng.gen_range(0..1100)).into_bytes()
        };
        let limit = [0, 1, 5, 37, 200, 5000][rng.gen_range(0..6)];
        let got = c.range(&a, &b, limit).expect("range");
        let want: Vec<(&Vec<u8>, &Vec<u8>)> = model
            .range(a.clone()..)
            .filter(|(k, _)| b.is_empty() || **k < b)
            .take(limit)
            .collect();
        assert_eq!(got.len(), want.len(), "range {a:?}..{b:?} limit {limit}");
        for ((gk, gv), (wk, wv)) in got.iter().zip(want) {
            assert_eq!((&gk[..], &gv[..]), (&wk[..], &wv[..]));
        }
    }
    // A key its first replica lacks (a write it missed) is still listed by
    // the other replica, and read from there.
    let lost = b"s-missed-on-primary";
    c.set(lost, b"still here").expect("set");
    let primary = c.replicas_of(lost)[0];
    c.call_node(primary, &[&b"DEL"[..], lost])
        .expect("node DEL");
    let got = c.range(b"s", b"t", 10).expect("range");
    assert_eq!(got.len(), 1);
    assert_eq!(
        (&got[0].0[..], &got[0].1[..]),
        (&lost[..], &b"still here"[..])
    );

    // A replica that missed the newest write of a key, or its deletion:
    // the range answers as of the newest copy, reading no stale one, and
    // gives the replica that copy (read repair).
    let (newer, gone) = (&b"t-newer-on-second"[..], &b"t-deleted-on-second"[..]);
    c.set(newer, b"old").expect("set");
    c.set(gone, b"old").expect("set");
    let version = |v: u64| v.to_string().into_bytes();
    let next = u64::MAX / 2;
    let (p1, p2) = (c.replicas_of(newer)[0], c.replicas_of(gone)[0]);
    let second = |k: &[u8]| c.replicas_of(k)[1];
    c.call_node(
        second(newer),
        &[&b"VSET"[..], newer, &version(next), &b"new"[..]],
    )
    .expect("VSET on one replica");
    c.call_node(second(gone), &[&b"VDEL"[..], gone, &version(next)[..]])
        .expect("VDEL on one replica");
    let repairs = c.read_repairs();
    let got = c.range(b"t", b"u", 10).expect("range");
    assert_eq!(
        got,
        vec![(Bytes::from_static(newer), Bytes::from_static(b"new"))]
    );
    assert_eq!(
        c.read_repairs() - repairs,
        2,
        "both stale replicas repaired"
    );
    for (node, key) in [(p1, newer), (p2, gone)] {
        let Reply::Bulk(stored) = c.call_node(node, &[&b"GET"[..], key]).expect("GET") else {
            panic!("{key:?} lost on its primary");
        };
        assert_eq!(version_of(&stored), next, "{key:?} repaired on its primary");
    }

    // A read of a missing key, and binary-safe keys and values.
    assert_eq!(c.get(b"nope").expect("get"), None);
    let bin = Bytes::from_static(b"\x00\xff{\r\n}");
    c.set(&bin, &bin).expect("binary set");
    assert_eq!(c.get(&bin).expect("binary get"), Some(bin.clone()));
}

/// The first of three consecutive ports that are free now, below the
/// kernel's ephemeral range (where the other tests' nodes get theirs).
fn three_free_ports() -> u16 {
    let mut seed = std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15;
    for _ in 0..1000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let base = 20_000 + (seed % 12_000) as u16;
        let free = (base..base + 3).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no three consecutive free ports in 20000..32000");
}

/// `lightstore up` starts a cluster that `lightstore cluster` can use, and
/// SIGTERM stops every node cleanly.
#[test]
fn up_and_cluster_subcommands() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = three_free_ports();
    let dir = tmp.path().join("c");
    let mut up = Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args([
            "up",
            "--nodes",
            "3",
            "--capacity",
            "1G",
            "--base-port",
            &base.to_string(),
        ])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn up");
    let cfg = dir.join("cluster.toml");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cfg.exists() {
        if let Ok(Some(s)) = up.try_wait() {
            let out = up.wait_with_output().expect("output");
            panic!("up exited {s}: {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(Instant::now() < deadline, "cluster not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cfg_arg = cfg.to_str().expect("utf-8 path");
    let run = |args: &[&str]| {
        let mut all = vec!["cluster", "--cluster-config", cfg_arg];
        all.extend_from_slice(args);
        lightstore(&all)
    };
    assert!(run(&["set", "greeting", "hello"]).status.success());
    let got = run(&["get", "greeting"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "hello");
    assert!(!run(&["get", "absent"]).status.success());
    let status = run(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("3 of 3 nodes up"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(" up ")).count(),
        3,
        "{text}"
    );
    let repair = run(&["repair"]);
    assert!(repair.status.success());
    assert!(String::from_utf8_lossy(&repair.stdout).contains("0 copies written"));
    // Eight threads' interleaved batches leave neighbouring keys' values
    // apart: the first recluster rewrites them, the second finds nothing.
    let load = run(&[
        "load",
        "--count",
        "3000",
        "--value-size",
        "300",
        "--threads",
        "8",
        "--batch",
        "4",
    ]);
    assert!(load.status.success());
    let rewritten = |out: &std::process::Output| -> u64 {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                l.split(" keys, ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    assert!(rewritten(&run(&["recluster"])) > 1000);
    assert_eq!(rewritten(&run(&["recluster"])), 0);
    let got = run(&["get", "load:000000002999"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v".repeat(300));

    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(up.id() as i32, libc::SIGTERM) };
    let stop = Instant::now();
    let code = loop {
        if let Some(s) = up.try_wait().expect("wait") {
            break s;
        }
        assert!(stop.elapsed() < Duration::from_secs(40), "up did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code}");
    let err = String::from_utf8_lossy(&up.wait_with_output().expect("out").stderr).to_string();
    assert_eq!(err.matches("stopped (exit status: 0)").count(), 3, "{err}");
    assert!(Path::new(&dir.join("node0/lightstore.dev")).exists());
}

/// A node refuses an MGET or RANGE over its `max_reply`; the client then
/// asks for the keys in halves (smaller pages) and still answers `mget`,
/// `range` and `repair` in full.
#[test]
fn client_splits_mgets_a_node_refuses_as_too_large() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let _node = Node::start_at(tmp.path(), &addr, &["--max-reply", "1M"])
        .unwrap_or_else(|(code, log)| panic!("node failed ({code:?}):\n{log}"));
    let mut cfg = ClusterConfig::new([addr]);
    cfg.replicas = Some(1);
    cfg.timeout_ms = 3000;
    let c = Cluster::connect(cfg).expect("client");
    let value = |i: usize| vec![i as u8; 200 << 10];
    let keys: Vec<Vec<u8>> = (0..12).map(key).collect();
    for (i, k) in keys.iter().enumerate() {
        c.set(k, &value(i)).expect("set");
    }
    // 12 values of 200 KiB: 2.4 MiB, over the node's 1 MiB per reply.
    let got = c.mget(&keys).expect("mget");
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(&value(i)[..]), "mget key {i}");
    }
    let range = c.range(b"", b"", 100).expect("range");
    assert_eq!(range.len(), 12);
    for (k, v) in &range {
        let i = keys.iter().position(|x| x == k).expect("known key");
        assert_eq!(v[..], value(i)[..], "range key {i}");
    }
    // Repair pages through keys and values: smaller pages, same result.
    let report = c.repair().expect("repair over a small max-reply");
    assert_eq!(report.keys, 12);
}

/// A batch larger than a node's `max_request` goes as several VSETs of at
/// most 16 MiB: 4 values of 8 MiB to one node bounded at 17 MiB a request.
#[test]
fn client_splits_large_write_batches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let _node = Node::start_at(
        tmp.path(),
        &addr,
        &["--max-bulk", "16M", "--max-request", "17M"],
    )
    .unwrap_or_else(|(code, log)| panic!("node failed ({code:?}):\n{log}"));
    let mut cfg = ClusterConfig::new([addr]);
    cfg.replicas = Some(1);
    cfg.timeout_ms = 10_000;
    let c = Cluster::connect(cfg).expect("client");
    let value = |i: usize| vec![i as u8 + 1; 8 << 20];
    let keys: Vec<Vec<u8>> = (0..4).map(key).collect();
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().cloned().zip((0..4).map(value)).collect();
    c.mset(&pairs).expect("mset of 32 MiB to one node");
    let got = c.mget(&keys).expect("mget");
    for (i, v) in got.iter().enumerate() {
        assert!(v.as_deref() == Some(&value(i)[..]), "key {i}");
    }
}

/// `Cluster::sync` (the node's `FSYNC`) makes acknowledged writes durable
/// whatever the node's durability: under `--durability none` a node killed
/// with SIGKILL right after the sync still has every write; with every node
/// down, the sync fails rather than claim durability.
#[test]
fn sync_makes_writes_durable_under_no_durability() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let start = || {
        Node::start_at(tmp.path(), &addr, &["--durability", "none"])
            .unwrap_or_else(|(code, log)| panic!("node failed ({code:?}):\n{log}"))
    };
    let node = start();
    let mut cfg = ClusterConfig::new([addr.clone()]);
    cfg.timeout_ms = 3000;
    cfg.retry_interval_ms = 100;
    let c = Cluster::connect(cfg).expect("client");
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|i| (key(i), format!("durable-{i}").into_bytes()))
        .collect();
    c.mset(&pairs).expect("mset");
    c.sync().expect("sync");
    drop(node); // SIGKILL
    assert!(c.sync().is_err(), "a sync with every node down fails");
    let _node = start();
    let keys: Vec<Vec<u8>> = pairs.iter().map(|(k, _)| k.clone()).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        match c.mget(&keys) {
            Ok(got) => break got,
            Err(e) => assert!(Instant::now() < deadline, "node not back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for ((k, v), got) in pairs.iter().zip(got) {
        assert_eq!(
            got.as_deref(),
            Some(&v[..]),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
}

/// `write_atomic` sends one VBATCH per replica: stores and deletes under
/// one hash tag land together on both replicas; keys on different replica
/// sets are refused before anything is written; a malformed VBATCH gets a
/// clear error.
#[test]
fn atomic_batches_land_whole_on_every_replica() {
    let tc = TestCluster::start(3);
    let c = tc.client();
    c.set(b"{t}old", b"x").expect("set");
    c.write_atomic(&[
        (b"{t}a", Some(&b"1"[..])),
        (b"{t}b", Some(b"2")),
        (b"{t}old", None),
    ])
    .expect("atomic");
    let replicas = c.replicas_of(b"{t}a");
    assert_eq!(replicas.len(), 2);
    for &r in &replicas {
        let a = stored(&c, r, b"{t}a").expect("a");
        let old = stored(&c, r, b"{t}old").expect("tombstone");
        assert_eq!(a.value.as_deref(), Some(&b"1"[..]));
        assert!(old.value.is_none(), "the delete landed on node {r}");
        assert_eq!(a.version, old.version, "one version for the batch");
    }
    let spread: Vec<Vec<u8>> = (0..64).map(|i| format!("k{i}").into_bytes()).collect();
    let ops: Vec<(&[u8], Option<&[u8]>)> =
        spread.iter().map(|k| (&k[..], Some(&b"v"[..]))).collect();
    let err = c.write_atomic(&ops).expect_err("different replica sets");
    assert!(err.to_string().contains("hash tag"), "{err}");
    assert!(c.get(b"k0").expect("get").is_none(), "nothing written");
    let err = c
        .call_node(0, &[&b"VBATCH"[..], b"k", b"1", b"PUT", b"v"])
        .expect_err("bad kind");
    assert!(err.to_string().contains("SET or DEL"), "{err}");
}

/// `FSYNC` calls node `i` has served.
fn fsyncs(c: &Cluster, i: usize) -> u64 {
    let Reply::Bulk(info) = c
        .call_node(i, &[&b"INFO"[..], b"commandstats"])
        .expect("INFO")
    else {
        panic!("INFO is not a bulk string");
    };
    node_support::command_calls(&String::from_utf8_lossy(&info), "fsync").unwrap_or(0)
}

/// `write_atomic_durable` is followed by `FSYNC` on each replica it wrote
/// (and on no other node); under `interval` durability a batch it
/// acknowledged survives a SIGKILL of the node at once. And a client whose
/// pooled connections died with that node has its first call after the
/// restart served, however quick the restart: the stale connections are
/// not handed to it.
#[test]
fn durable_batches_survive_a_kill_and_stale_connections_are_dropped() {
    let mut tc = TestCluster::start_with(3, &["--durability", "interval"]);
    let c = tc.client();
    let before: Vec<u64> = (0..3).map(|i| fsyncs(&c, i)).collect();
    c.write_atomic_durable(&[(b"{d}a", Some(&b"1"[..])), (b"{d}b", Some(b"2"))])
        .expect("durable batch");
    let replicas = c.replicas_of(b"{d}a");
    for (i, before) in before.into_iter().enumerate() {
        let added = fsyncs(&c, i) - before;
        let want = u64::from(replicas.contains(&i));
        assert_eq!(
            added, want,
            "FSYNC calls on node {i} (replicas {replicas:?})"
        );
    }
    // Only the node holding the batch alone: a 1-replica client.
    let mut cfg = ClusterConfig::new(vec![tc.addrs[replicas[0]].clone()]);
    cfg.timeout_ms = 3000;
    cfg.retry_interval_ms = 100;
    let lone = Cluster::connect(cfg).expect("client");
    lone.write_atomic_durable(&[(b"{e}x", Some(&b"kept"[..]))])
        .expect("durable batch");
    // Pooled connections to fill: several calls at once.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| lone.get(b"{e}x").expect("get"));
        }
    });
    tc.kill(replicas[0]);
    tc.restart(replicas[0]);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(
        lone.get(b"{e}x")
            .expect("the first call after the restart")
            .as_deref(),
        Some(&b"kept"[..]),
        "a durable batch survives SIGKILL under interval durability"
    );
    // A restart quicker than any pause between calls (a node is up again
    // in a few milliseconds): the first call after it is served too.
    for round in 0..5 {
        tc.kill(replicas[0]);
        tc.restart(replicas[0]);
        assert_eq!(
            lone.get(b"{e}x")
                .unwrap_or_else(|e| panic!("round {round}: first call after a quick restart: {e}"))
                .as_deref(),
            Some(&b"kept"[..])
        );
    }
}

/// A node that answers `RUNID` on a new connection is up from then on,
/// whatever the call the connection was opened for gets: a restarted node
/// is not left marked down by a first call that fails on its own merits.
#[test]
fn a_returning_node_is_up_once_a_connection_reaches_it() {
    let mut tc = TestCluster::start(1);
    let c = tc.client();
    c.set(b"a", b"1").expect("set");
    tc.kill(0);
    let _ = c.get(b"a");
    assert!(!c.is_up(0), "a dead node is marked down");
    tc.restart(0);
    let err = c
        .call_node(0, &["NO-SUCH-COMMAND"])
        .expect_err("an unknown command");
    assert!(!err.is_node_failure(), "{err}");
    assert!(c.is_up(0), "it answered RUNID first");
    assert_eq!(c.get(b"a").expect("get").as_deref(), Some(&b"1"[..]));
}

/// A node that restarts without a clean stop after it alone acknowledged
/// writes not yet synced fails the client's next `sync`, once, instead of
/// vouching for writes it lost (`interval` durability); a clean stop
/// (SIGTERM), `sync` durability, a sync in between, or a second replica
/// holding the writes keep the next sync successful. And a node marked
/// down with such writes fails a sync too rather than being skipped.
#[test]
fn a_sync_reports_writes_lost_with_a_restart() {
    let mut tc = TestCluster::start_with(1, &["--durability", "interval"]);
    let c = tc.client();
    // A second writer on the same client (another volume, say).
    let mut other = c.loss_cursor();
    c.set(b"a", b"1").expect("set");
    tc.kill(0);
    tc.restart(0);
    let err = c.sync().expect_err("the write may be lost");
    assert!(
        matches!(err, client::ClientError::LostWrites { .. })
            && err.to_string().contains("1 write(s)"),
        "{err}"
    );
    c.sync().expect("reported once");
    assert!(
        matches!(
            c.sync_with(&mut other),
            Err(client::ClientError::LostWrites { .. })
        ),
        "each writer is told once"
    );
    c.sync_with(&mut other).expect("and only once");
    let mut later = c.loss_cursor();
    c.sync_with(&mut later)
        .expect("a writer that came after the loss");
    // The node says so, and `cluster status` shows it.
    assert!(c.status()[0].unclean_restart);
    let out = lightstore(&["cluster", "--nodes", &tc.addrs[0], "status"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("restarted without a clean stop"), "{said}");
    // Synced before the crash: nothing to report.
    c.set(b"b", b"2").expect("set");
    c.sync().expect("sync");
    tc.kill(0);
    tc.restart(0);
    c.sync().expect("everything acknowledged was synced");
    // A clean stop syncs and vouches for the run.
    c.set(b"c", b"3").expect("set");
    tc.nodes[0]
        .as_mut()
        .expect("node")
        .stop_cleanly(Duration::from_secs(20));
    tc.restart(0);
    assert_eq!(c.get(b"c").expect("get").as_deref(), Some(&b"3"[..]));
    c.sync().expect("a clean stop loses nothing");
    assert!(!c.status()[0].unclean_restart);
    // Down with unsynced writes: the sync fails, it does not skip the node.
    c.set(b"d", b"4").expect("set");
    tc.kill(0);
    let _ = c.get(b"d");
    assert!(!c.is_up(0));
    assert!(c.sync().is_err(), "a down node's unsynced writes");
    tc.restart(0);
    assert!(c.sync().is_err(), "and lost with its restart");
    c.sync().expect("reported once");

    // Under sync durability a crash loses nothing acknowledged.
    let mut tc = TestCluster::start(1);
    let c = tc.client();
    c.set(b"a", b"1").expect("set");
    tc.kill(0);
    tc.restart(0);
    c.sync().expect("sync durability");

    // With two replicas a write is not lost with one of them.
    let mut tc = TestCluster::start_with(3, &["--durability", "interval"]);
    let c = tc.client();
    let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("k{i}").into_bytes()).collect();
    for k in &keys {
        c.set(k, b"v").expect("set");
    }
    tc.kill(1);
    tc.restart(1);
    c.sync().expect("each write is on a second replica");
    for k in &keys {
        assert_eq!(c.get(k).expect("get").as_deref(), Some(&b"v"[..]));
    }
}

/// Compare-and-set on real nodes: `VCAS` writes only over the version it
/// expects (absent = 0), atomically per node; through the client, of
/// writers racing from one version at most one wins on every replica, a
/// plain write in between makes the next compare-and-set fail, a
/// conditional delete leaves a tombstone, and with a replica down the
/// write lands on the other and reaches the returning node as a hint.
#[test]
fn compare_and_set_writes_only_over_the_expected_version() {
    let mut tc = TestCluster::start(3);
    let c = tc.client();
    let vcas = |node: usize, args: &[&[u8]]| {
        let mut req: Vec<&[u8]> = vec![b"VCAS"];
        req.extend_from_slice(args);
        c.call_node(node, &req)
    };
    assert!(matches!(
        vcas(0, &[b"n", b"0", b"5", b"SET", b"a"]),
        Ok(Reply::Integer(1))
    ));
    assert!(matches!(
        vcas(0, &[b"n", b"0", b"6", b"SET", b"b"]),
        Ok(Reply::Integer(0))
    ));
    assert!(matches!(
        vcas(0, &[b"n", b"5", b"7", b"DEL"]),
        Ok(Reply::Integer(1))
    ));
    assert!(matches!(
        vcas(0, &[b"n", b"7", b"8", b"SET", b"c"]),
        Ok(Reply::Integer(1))
    ));
    for (bad, says) in [
        (&[&b"n"[..], b"8", b"8", b"SET", b"d"][..], "greater"),
        (&[b"n", b"8", b"9", b"PUT", b"d"], "SET value"),
        (&[b"n", b"8", b"9", b"DEL", b"d"], "SET value"),
        (&[b"n", b"x", b"9", b"DEL"], "unsigned"),
    ] {
        let err = vcas(0, bad).expect_err("malformed VCAS");
        assert!(err.to_string().contains(says), "{err}");
    }
    assert_eq!(
        stored(&c, 0, b"n").and_then(|v| v.value).as_deref(),
        Some(&b"c"[..])
    );

    // Through the client: racing writers from one version.
    let v0 = c.get_versioned(b"lease").expect("read").version;
    assert_eq!(v0, 0);
    let writers: Vec<Cluster> = (0..6).map(|_| tc.client()).collect();
    let won: Vec<u64> = std::thread::scope(|s| {
        let racers: Vec<_> = writers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                s.spawn(move || w.write_if_version(b"lease", 0, Some(format!("w{i}").as_bytes())))
            })
            .collect();
        racers
            .into_iter()
            .filter_map(|r| r.join().expect("racer").expect("cas"))
            .collect()
    });
    assert!(won.len() <= 1, "{} writers won", won.len());
    let now = c.get_versioned(b"lease").expect("read");
    let replicas = c.replicas_of(b"lease");
    for &r in &replicas {
        assert_eq!(
            stored(&c, r, b"lease").map(|v| v.version),
            Some(now.version),
            "replica {r}"
        );
    }
    c.set(b"lease", b"plain").expect("plain write");
    assert_eq!(
        c.write_if_version(b"lease", now.version, Some(b"late"))
            .expect("cas"),
        None
    );
    let now = c.get_versioned(b"lease").expect("read");
    let v = c
        .write_if_version(b"lease", now.version, None)
        .expect("cas delete")
        .expect("nothing wrote in between");
    let gone = c.get_versioned(b"lease").expect("read");
    assert_eq!((gone.version, gone.value), (v, None));

    // A replica down: the write lands on the other, then by hint.
    let down = replicas[1];
    tc.kill(down);
    let v2 = c
        .write_if_version(b"lease", v, Some(b"while down"))
        .expect("cas with a replica down")
        .expect("the live replica was at the version");
    tc.restart(down);
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored(&c, down, b"lease").map(|v| v.version) != Some(v2) {
        assert!(
            Instant::now() < deadline,
            "the write did not reach node {down}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node on `dir` listening on a Unix socket there as well, and a
/// one-replica client reaching it over that socket.
fn node_on_unix_socket(dir: &Path) -> (Node, Cluster) {
    let sock = dir.join("node.sock");
    let sock_arg = sock.to_str().expect("utf-8 path");
    let node = Node::start_in(&dir.join("n"), &["--unix", sock_arg])
        .unwrap_or_else(|(code, log)| panic!("node failed ({code:?}):\n{log}"));
    let mut cfg = ClusterConfig::new([format!("unix:{sock_arg}")]);
    cfg.replicas = Some(1);
    let client = Cluster::connect(cfg).expect("client over a Unix socket");
    (node, client)
}

/// A node on this machine can be reached over its Unix socket
/// (`unix:PATH` in the node list): reads, writes, ranges and a sync work
/// as over TCP, and a missing socket is a clear connection error.
#[test]
fn nodes_are_reached_over_unix_sockets() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_node, c) = node_on_unix_socket(tmp.path());
    c.set(b"u1", b"one").expect("set");
    c.mset(&[(b"u2".to_vec(), b"two".to_vec())]).expect("mset");
    assert_eq!(c.get(b"u1").expect("get").as_deref(), Some(&b"one"[..]));
    let got = c.range(b"u", b"v", 10).expect("range");
    assert_eq!(got.len(), 2);
    c.sync().expect("sync");

    let mut gone = ClusterConfig::new([format!("unix:{}", tmp.path().join("none.sock").display())]);
    gone.replicas = Some(1);
    let err = Cluster::connect(gone)
        .and_then(|c| c.get(b"u1"))
        .expect_err("no node behind the path");
    assert!(err.to_string().contains("none.sock"), "{err}");
}

/// A client's values held in its shared memory (`client::shm::Payload`,
/// what the block adapter receives WRITE payloads into) reach a node over
/// its Unix socket by reference (`SHMATTACH`, `VSETSHM`) and read back
/// whole, and sized multi-gets land values there (`MGETSHM`); over TCP
/// they travel through the socket; a connection that did not attach
/// memory gets a clear error for each command.
#[test]
fn local_nodes_take_values_from_shared_memory() {
    use client::shm::Payload;
    use client::Store;

    let tmp = tempfile::tempdir().expect("tempdir");
    let (node, local) = node_on_unix_socket(tmp.path());
    // Payloads go to the arena once a node attached it (a first call
    // opens a connection).
    assert_eq!(local.get(b"none").expect("get"), None);

    let pattern = |seed: usize, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| ((i * 31 + seed * 7) % 251) as u8)
            .collect()
    };
    // One payload per write, and one payload cut into several values.
    let mut payloads = Vec::new();
    for i in 0..32 {
        let mut p = Payload::with_capacity(64 << 10);
        p.extend_from_slice(&pattern(i, 64 << 10));
        assert!(p.is_shared(), "attached, and the arena has room");
        local.put(format!("shm{i}").as_bytes(), &p).expect("put");
        payloads.push(p);
    }
    let big = &payloads[0];
    let keys: Vec<Vec<u8>> = (0..16).map(|i| format!("part{i}").into_bytes()).collect();
    let ops: Vec<client::WriteOp<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (&k[..], Some(&big[i * 4096..(i + 1) * 4096])))
        .collect();
    local.write(&ops).expect("write");
    for (i, p) in payloads.iter().enumerate() {
        let got = local.get(format!("shm{i}").as_bytes()).expect("get");
        assert_eq!(got.as_deref(), Some(&p[..]), "value {i}");
    }
    for (i, k) in keys.iter().enumerate() {
        let got = local.get(k).expect("get");
        assert_eq!(got.as_deref(), Some(&big[i * 4096..(i + 1) * 4096]));
    }
    let by_ref = node.calls_of("vsetshm");
    assert!(by_ref >= 33, "{by_ref} VSETSHM calls for 33 writes");
    // Sized multi-gets land their values in the arena (`MGETSHM`); a
    // missing key, a short value and values longer than the size hint
    // come back as MGET's would.
    local.put(b"short", b"tiny").expect("put");
    let mut names: Vec<Vec<u8>> = (0..32).map(|i| format!("shm{i}").into_bytes()).collect();
    names.push(b"missing".to_vec());
    names.push(b"short".to_vec());
    names.extend(keys.iter().cloned());
    let refs: Vec<&[u8]> = names.iter().map(|k| &k[..]).collect();
    for hint in [4096, 64 << 10] {
        let got = local.mget_sized(&refs, hint).expect("sized mget");
        assert_eq!(got, local.mget(&refs).expect("mget"), "hint {hint}");
        assert_eq!(got[0].as_deref(), Some(&payloads[0][..]));
        assert_eq!(got[32], None);
        assert_eq!(got[33].as_deref(), Some(&b"tiny"[..]));
    }
    let landed = node.calls_of("mgetshm");
    assert_eq!(landed, 2, "one MGETSHM per sized multi-get");

    // Over TCP the same values go through the socket.
    let mut cfg = ClusterConfig::new([format!("127.0.0.1:{}", node.port)]);
    cfg.replicas = Some(1);
    let remote = Cluster::connect(cfg).expect("client over TCP");
    remote.put(b"tcp", &payloads[1]).expect("put over TCP");
    assert_eq!(
        remote.get(b"tcp").expect("get").as_deref(),
        Some(&payloads[1][..])
    );
    assert_eq!(node.calls_of("vsetshm"), by_ref, "no VSETSHM over TCP");
    let got = remote.mget_sized(&refs, 4096).expect("sized mget over TCP");
    assert_eq!(got, local.mget(&refs).expect("mget"));
    assert_eq!(node.calls_of("mgetshm"), landed, "no MGETSHM over TCP");

    let mut conn = std::io::BufReader::new(node.connect());
    let token = "00".repeat(16);
    let reply = node_support::call(&mut conn, &[b"SHMATTACH", b"3", b"4120", token.as_bytes()]);
    assert!(format!("{reply:?}").contains("Unix socket"), "{reply:?}");
    let reply = node_support::call(&mut conn, &[b"VSETSHM", b"r", b"k", b"1", &[0u8; 16]]);
    assert!(
        format!("{reply:?}").contains("without SHMATTACH"),
        "{reply:?}"
    );
    let reply = node_support::call(&mut conn, &[b"MGETSHM", b"4096", b"4096", b"k"]);
    assert!(
        format!("{reply:?}").contains("without SHMATTACH"),
        "{reply:?}"
    );
    assert_eq!(local.get(b"k").expect("get"), None);
}
