//! A Jepsen-style fault test on this machine: three real nodes, two
//! replicas, writers and readers running while a seeded nemesis kills nodes
//! (SIGKILL, then restart) and pauses them (SIGSTOP, then SIGCONT), one
//! fault at a time: after each fault heals, the cluster must catch up (no
//! hints left) within a bound before the next one.
//!
//! Each key has one writer, whose values carry a sequence number that grows
//! with the writer's versions. Afterwards a checker verifies that no read
//! returned a sequence older than one acknowledged before that read began,
//! and, once every node is back and caught up, that every replica of every
//! key holds at least its last acknowledged write. The fault schedule is
//! seeded (`LS_FAULT_SEED`, printed on failure); thread timing is not.

mod node_support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::{Cluster, ClusterConfig};
use node_support::cluster::TestCluster;
use protocol::versioned::Versioned;
use protocol::Reply;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WRITERS: usize = 3;
const KEYS_PER_WRITER: usize = 6;
const READERS: usize = 2;
/// Faults injected (each followed by its heal and a catch-up).
const FAULTS: usize = 6;

/// One acknowledged write or completed read, with when it ran.
#[derive(Clone, Debug)]
struct Op {
    key: usize,
    seq: u64,
    start: Instant,
    end: Instant,
}

fn key_name(k: usize) -> String {
    format!("jepsen:{k:03}")
}

fn value(k: usize, seq: u64) -> String {
    format!("k{k}-s{seq:08}")
}

/// The sequence number of a value written by [`value`].
fn seq_of(v: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(v);
    s.rsplit_once("-s")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("foreign value {s:?}"))
}

fn client(tc: &TestCluster) -> Cluster {
    let mut cfg = ClusterConfig::new(tc.addrs.clone());
    cfg.timeout_ms = 800;
    cfg.connect_timeout_ms = 500;
    cfg.retry_interval_ms = 100;
    Cluster::connect(cfg).expect("client")
}

fn signal(tc: &TestCluster, i: usize, sig: &str) {
    let pid = tc.nodes[i].as_ref().expect("node running").child.id();
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Waits until no node keeps hints (every missed write was handed off).
fn wait_caught_up(observer: &Cluster, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = observer.status();
        if status.iter().all(|s| s.up && s.hints.is_empty()) {
            return;
        }
        if Instant::now() >= deadline {
            let handoff: Vec<String> = (0..status.len())
                .map(
                    |i| match observer.call_node(i, &[&b"INFO"[..], b"handoff"]) {
                        Ok(Reply::Bulk(b)) => String::from_utf8_lossy(&b).into_owned(),
                        Ok(Reply::Verbatim(s)) => s,
                        other => format!("{other:?}"),
                    },
                )
                .collect();
            panic!(
                "not caught up within {limit:?}: {:?}\n{}",
                status
                    .iter()
                    .map(|s| (&s.addr, s.up, &s.hints))
                    .collect::<Vec<_>>(),
                handoff.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn no_stale_reads_and_no_lost_writes_under_kills_and_pauses() {
    let seed: u64 = std::env::var("LS_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0017);
    let mut tc = TestCluster::start(3);
    let stop = Arc::new(AtomicBool::new(false));
    let writes: Arc<Mutex<Vec<Op>>> = Arc::default();
    let reads: Arc<Mutex<Vec<Op>>> = Arc::default();
    let t0 = Instant::now();
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (c, stop, writes) = (client(&tc), stop.clone(), writes.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ (w as u64 + 1));
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = w * KEYS_PER_WRITER + rng.gen_range(0..KEYS_PER_WRITER);
                seq += 1;
                let start = Instant::now();
                if c.set(key_name(key).as_bytes(), value(key, seq).as_bytes())
                    .is_ok()
                {
                    let end = Instant::now();
                    writes.lock().expect("lock").push(Op {
                        key,
                        seq,
                        start,
                        end,
                    });
                }
            }
        }));
    }
    for r in 0..READERS {
        let (c, stop, reads) = (client(&tc), stop.clone(), reads.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(seed ^ (0x100 + r as u64));
            while !stop.load(Ordering::Relaxed) {
                let key = rng.gen_range(0..WRITERS * KEYS_PER_WRITER);
                let start = Instant::now();
                if let Ok(v) = c.get(key_name(key).as_bytes()) {
                    let end = Instant::now();
                    let seq = v.map_or(0, |v| seq_of(&v));
                    reads.lock().expect("lock").push(Op {
                        key,
                        seq,
                        start,
                        end,
                    });
                }
            }
        }));
    }

    let observer = client(&tc);
    let mut nemesis = SmallRng::seed_from_u64(seed);
    let mut log = Vec::new();
    for _ in 0..FAULTS {
        std::thread::sleep(Duration::from_millis(nemesis.gen_range(300..800)));
        let node = nemesis.gen_range(0..3);
        let hold = Duration::from_millis(nemesis.gen_range(300..1500));
        if nemesis.gen_bool(0.5) {
            log.push(format!("{:?} kill node {node} for {hold:?}", t0.elapsed()));
            tc.kill(node);
            std::thread::sleep(hold);
            tc.restart(node);
        } else {
            log.push(format!("{:?} pause node {node} for {hold:?}", t0.elapsed()));
            signal(&tc, node, "-STOP");
            std::thread::sleep(hold);
            signal(&tc, node, "-CONT");
        }
        wait_caught_up(&observer, Duration::from_secs(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    wait_caught_up(&observer, Duration::from_secs(20));

    let writes = writes.lock().expect("lock").clone();
    let reads = reads.lock().expect("lock").clone();
    let context = || format!("seed {seed}, faults:\n{}", log.join("\n"));
    assert!(writes.len() > 200, "{} writes; {}", writes.len(), context());
    assert!(reads.len() > 200, "{} reads; {}", reads.len(), context());

    // No stale read: each read saw at least the newest write of its key
    // acknowledged before the read began.
    let mut by_key: HashMap<usize, Vec<&Op>> = HashMap::new();
    for w in &writes {
        by_key.entry(w.key).or_default().push(w);
    }
    let mut stale = Vec::new();
    for r in &reads {
        let floor = by_key
            .get(&r.key)
            .into_iter()
            .flatten()
            .filter(|w| w.end < r.start)
            .map(|w| w.seq)
            .max()
            .unwrap_or(0);
        if r.seq < floor {
            stale.push(format!(
                "key {} read seq {} at {:?}..{:?}, acknowledged {floor} before",
                r.key,
                r.seq,
                r.start - t0,
                r.end - t0
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{} stale reads of {}: {:?}; {}",
        stale.len(),
        reads.len(),
        &stale[..stale.len().min(10)],
        context()
    );

    // No lost write: every replica holds at least the last acknowledged
    // write of each key.
    for (key, ws) in &by_key {
        let last = ws.iter().map(|w| w.seq).max().unwrap_or(0);
        let name = key_name(*key);
        for node in observer.replicas_of(name.as_bytes()) {
            let held = match observer
                .call_node(node, &[b"GET", name.as_bytes()])
                .expect("node GET")
            {
                Reply::Bulk(b) => Versioned::decode(b).value.map_or(0, |v| seq_of(&v)),
                _ => 0,
            };
            assert!(
                held >= last,
                "node {node} holds seq {held} of key {key}, last acknowledged {last}; {}",
                context()
            );
        }
    }
    eprintln!(
        "{} writes, {} reads, 0 stale; {}",
        writes.len(),
        reads.len(),
        context()
    );
}
