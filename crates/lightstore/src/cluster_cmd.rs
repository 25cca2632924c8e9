//! `lightstore cluster`: talk to a cluster through the cluster client —
//! status, repair, recluster, and single-key get/set/del/range for scripts
//! and demos.

use std::path::PathBuf;

use bytes::Bytes;
use clap::{Args, Subcommand};
use client::{Cluster, ClusterConfig};
use protocol::Reply;

/// Which cluster to talk to.
#[derive(Args, Debug)]
pub struct ClusterTarget {
    /// Node addresses, host:port,host:port,...
    #[arg(long, global = true, conflicts_with = "cluster_config")]
    nodes: Option<String>,
    /// Cluster TOML file (nodes = [...], replicas, write_quorum, read_quorum,
    /// timeouts, password).
    /// Without a password there, LIGHTSTORE_PASSWORD is used.
    #[arg(long = "cluster-config", global = true, value_name = "FILE")]
    cluster_config: Option<PathBuf>,
    /// Copies per key (default 2 with at least 2 nodes).
    #[arg(long, global = true)]
    replicas: Option<usize>,
    /// Replicas a read asks (default: every replica that is up, newest copy
    /// wins; 1 reads one replica, faster but possibly stale).
    #[arg(long = "read-quorum", global = true, value_name = "N")]
    read_quorum: Option<usize>,
}

impl ClusterTarget {
    /// The configuration these flags describe.
    pub fn config(&self) -> Result<ClusterConfig, client::ClientError> {
        let mut cfg = match (&self.nodes, &self.cluster_config) {
            (Some(list), _) => ClusterConfig::from_list(list)?,
            (None, Some(path)) => ClusterConfig::from_file(path)?,
            (None, None) => {
                return Err(client::ClientError::Config(
                    "give the cluster with --nodes host:port,... or --cluster-config FILE".into(),
                ))
            }
        };
        if self.replicas.is_some() {
            cfg.replicas = self.replicas;
        }
        if self.read_quorum.is_some() {
            cfg.read_quorum = self.read_quorum;
        }
        cfg.password_from_env(std::env::var(client::PASSWORD_ENV).ok());
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Flags of `lightstore cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    target: ClusterTarget,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Show each node: up/down, keys, bytes, engine figures.
    Status,
    /// Copy missing or stale replicas so every key's replicas hold its newest version.
    Repair,
    /// Rewrite each node's small values in key order where they are
    /// scattered over its log (RECLUSTER, page by page, nodes in parallel),
    /// so range reads read long runs of the device: for after a bulk load
    /// of keys in random order that will be read by range.
    Recluster,
    /// Store a value.
    Set { key: String, value: String },
    /// Print a value (nothing and exit code 1 when missing).
    Get { key: String },
    /// Delete a key.
    Del { key: String },
    /// Write COUNT keys PREFIX000000000000.. of VALUE_SIZE bytes through the
    /// client (batches per thread), then print the time and rate.
    Load {
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 8192, value_parser = server::parse_size)]
        value_size: u64,
        #[arg(long, default_value_t = 64)]
        batch: usize,
        #[arg(long, default_value_t = 8)]
        threads: u64,
        #[arg(long, default_value = "load:")]
        prefix: String,
    },
    /// Print keys and values with start <= key < end ("" = unbounded), in order.
    Range {
        start: String,
        end: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

/// Runs `lightstore cluster`.
pub fn run(args: ClusterArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = Cluster::connect(args.target.config()?)?;
    match args.action {
        Action::Status => print_status(&cluster),
        Action::Repair => {
            let r = cluster.repair()?;
            println!(
                "repair: {} keys checked, {} copies written, {} misplaced copies left alone",
                r.keys,
                r.total_copied(),
                r.misplaced
            );
            for (node, n) in &r.copied {
                println!("  {node}: {n} copies written");
            }
            if !r.unreachable.is_empty() {
                return Err(format!(
                    "nodes not repaired (unreachable): {}",
                    r.unreachable.join(", ")
                )
                .into());
            }
        }
        Action::Recluster => recluster_all(&cluster)?,
        Action::Set { key, value } => {
            cluster.set(key.as_bytes(), value.as_bytes())?;
            println!("OK");
        }
        Action::Get { key } => match cluster.get(key.as_bytes())? {
            Some(v) => println!("{}", String::from_utf8_lossy(&v)),
            None => std::process::exit(1),
        },
        Action::Del { key } => {
            cluster.delete(key.as_bytes())?;
            println!("OK");
        }
        Action::Load {
            count,
            value_size,
            batch,
            threads,
            prefix,
        } => load(
            &cluster,
            count,
            value_size,
            batch.max(1),
            threads.max(1),
            &prefix,
        )?,
        Action::Range { start, end, limit } => {
            for (k, v) in cluster.range(start.as_bytes(), end.as_bytes(), limit)? {
                println!(
                    "{}\t{}",
                    String::from_utf8_lossy(&k),
                    String::from_utf8_lossy(&v)
                );
            }
        }
    }
    Ok(())
}

/// Keys per `RECLUSTER` call of `cluster recluster`: each call stays far
/// within the client's call timeout.
const RECLUSTER_PAGE: usize = 10_000;

/// What `RECLUSTER` did on one node, summed over its pages.
#[derive(Default)]
struct Reclustered {
    keys: i64,
    rewritten: i64,
    bytes: i64,
    stopped_for_space: bool,
}

/// `cluster recluster`: every node at once, page by page.
fn recluster_all(cluster: &Cluster) -> Result<(), Box<dyn std::error::Error>> {
    let nodes = cluster.nodes();
    let started = std::time::Instant::now();
    let results: Vec<Result<Reclustered, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..nodes.len())
            .map(|i| s.spawn(move || recluster_node(cluster, i)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let mut failed = Vec::new();
    for (addr, r) in nodes.iter().zip(results) {
        match r {
            Ok(r) => println!(
                "{addr}: {} keys, {} values rewritten ({:.1} MiB){}",
                r.keys,
                r.rewritten,
                r.bytes as f64 / f64::from(1 << 20),
                if r.stopped_for_space {
                    ", stopped: less than a quarter of the device free"
                } else {
                    ""
                }
            ),
            Err(e) => failed.push(format!("{addr}: {e}")),
        }
    }
    println!("recluster: {:.1} s", started.elapsed().as_secs_f64());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("recluster failed on {}", failed.join("; ")).into())
    }
}

/// Lists node `i`'s keys a page at a time and reclusters each page.
fn recluster_node(cluster: &Cluster, i: usize) -> Result<Reclustered, String> {
    let limit = RECLUSTER_PAGE.to_string();
    let mut total = Reclustered::default();
    let mut start: Vec<u8> = Vec::new();
    loop {
        let page = cluster
            .call_node(
                i,
                &[
                    &b"RANGE"[..],
                    &start,
                    b"",
                    b"LIMIT",
                    limit.as_bytes(),
                    b"KEYSONLY",
                ],
            )
            .map_err(|e| e.to_string())?;
        let Reply::Array(items) = page else {
            return Err(format!("unexpected RANGE reply {page:?}"));
        };
        let keys: Vec<Bytes> = items
            .into_iter()
            .filter_map(|r| match r {
                Reply::Bulk(k) => Some(k),
                _ => None,
            })
            .collect();
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(total);
        };
        let mut end = last.to_vec();
        end.push(0);
        let reply = cluster
            .call_node(i, &[&b"RECLUSTER"[..], first, &end])
            .map_err(|e| e.to_string())?;
        let Reply::Array(fields) = reply else {
            return Err(format!("unexpected RECLUSTER reply {reply:?}"));
        };
        for pair in fields.chunks(2) {
            if let [Reply::Bulk(name), Reply::Integer(v)] = pair {
                match &name[..] {
                    b"keys" => total.keys += v,
                    b"rewritten" => total.rewritten += v,
                    b"bytes" => total.bytes += v,
                    b"stopped_for_space" => total.stopped_for_space |= *v != 0,
                    _ => {}
                }
            }
        }
        if total.stopped_for_space || keys.len() < RECLUSTER_PAGE {
            return Ok(total);
        }
        start = end;
    }
}

/// `cluster load`: thread `t` writes keys `t, t + threads, ...` in batches.
fn load(
    cluster: &Cluster,
    count: u64,
    value_size: u64,
    batch: usize,
    threads: u64,
    prefix: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let value = vec![b'v'; usize::try_from(value_size)?];
    let start = std::time::Instant::now();
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (value, failed) = (&value, &failed);
            s.spawn(move || {
                let keys: Vec<u64> = (t..count).step_by(threads as usize).collect();
                for chunk in keys.chunks(batch) {
                    let pairs: Vec<(String, &[u8])> = chunk
                        .iter()
                        .map(|i| (format!("{prefix}{i:012}"), &value[..]))
                        .collect();
                    if let Err(e) = cluster.mset(&pairs) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(format!("load failed: {e}").into());
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "loaded {count} keys of {value_size} bytes in {secs:.2} s: {:.0} keys/s, {:.1} MiB/s",
        count as f64 / secs,
        (count * value_size) as f64 / secs / f64::from(1 << 20)
    );
    Ok(())
}

fn print_status(cluster: &Cluster) {
    println!(
        "{:<22} {:<5} {:>10} {:>12} {:>6} {:>9} {:>13} {:>10}",
        "node", "state", "keys", "live bytes", "WA", "reads/GET", "free segments", "DRAM"
    );
    let status = cluster.status();
    for s in &status {
        if !s.up {
            println!(
                "{:<22} {:<5} {}",
                s.addr,
                "down",
                s.error.as_deref().unwrap_or("")
            );
            continue;
        }
        let keys = format!("{}{}", s.keys, if s.keys_approximate { "+" } else { "" });
        println!(
            "{:<22} {:<5} {:>10} {:>12} {:>6.2} {:>9.2} {:>13} {:>10}",
            s.addr,
            "up",
            keys,
            s.live_bytes,
            s.write_amplification,
            s.reads_per_get,
            format!("{}/{}", s.segments_free, s.segments_total),
            s.dram_bytes
        );
    }
    // Writes some replica missed, waiting on the replicas that took them.
    let mut waiting: std::collections::BTreeMap<&str, u64> = Default::default();
    for s in &status {
        for (target, n) in &s.hints {
            *waiting.entry(target).or_default() += n;
        }
    }
    let delivered: u64 = status.iter().map(|s| s.hints_delivered).sum();
    if delivered > 0 {
        println!("hinted handoff: {delivered} missed writes handed off since the nodes started");
    }
    for (target, n) in &waiting {
        println!(
            "under-replicated: {target} missed writes; {n} hints wait to hand them off when it answers"
        );
    }
    for s in status.iter().filter(|s| s.up && s.unclean_restart) {
        println!(
            "restarted without a clean stop: {} may miss writes it acknowledged but had not synced; \
             reads take the newest copy from the other replicas, `lightstore cluster repair` copies them back",
            s.addr
        );
    }
    let up = status.iter().filter(|s| s.up).count();
    println!(
        "{up} of {} nodes up, {} replicas per key",
        status.len(),
        cluster.replica_count()
    );
}
