//! Cluster status: each node's health, keys, bytes and engine figures, read
//! with `PING` and `INFO`.

use std::collections::HashMap;

use protocol::Reply;

use crate::cluster::Cluster;

/// One node's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStatus {
    /// The node's address.
    pub addr: String,
    /// Whether it answered.
    pub up: bool,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Keys stored (deletions still held as tombstones count too).
    pub keys: u64,
    /// Whether `keys` is a lower bound (the node counts exactly only up to
    /// a cap).
    pub keys_approximate: bool,
    /// Live bytes in the node's value log.
    pub live_bytes: u64,
    /// Device bytes written per user byte.
    pub write_amplification: f64,
    /// Device reads per GET.
    pub reads_per_get: f64,
    /// Free and total segments of the device.
    pub segments_free: u64,
    /// See `segments_free`.
    pub segments_total: u64,
    /// Bytes per segment (0 from a node too old to say).
    pub segment_bytes: u64,
    /// DRAM the engine uses for index, cache, filters and memtable.
    pub dram_bytes: u64,
    /// Writes this node holds for other nodes that missed them (hinted
    /// handoff), per missed node's address: under-replicated until
    /// delivered.
    pub hints: Vec<(String, u64)>,
    /// Missed writes this node has handed off since it started.
    pub hints_delivered: u64,
    /// Whether the node's previous run ended without a clean stop (it may
    /// miss writes it had acknowledged but not synced; `INFO server`
    /// `previous_stop:unclean`).
    pub unclean_restart: bool,
}

/// `key:value` lines of an INFO reply.
fn info_fields(reply: Reply) -> HashMap<String, String> {
    let text = match reply {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        Reply::Verbatim(s) | Reply::Status(s) => s,
        _ => String::new(),
    };
    text.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Cluster {
    /// Space for user data over the nodes that answer: their devices'
    /// total and free bytes, divided by the replica count. `None` when no
    /// node answers or none reports its segment size.
    pub fn capacity(&self) -> Option<crate::store::Capacity> {
        let up: Vec<NodeStatus> = self
            .status()
            .into_iter()
            .filter(|s| s.up && s.segment_bytes > 0)
            .collect();
        if up.is_empty() {
            return None;
        }
        let copies = self.replica_count().clamp(1, up.len()) as u64;
        let sum = |f: fn(&NodeStatus) -> u64| up.iter().map(f).sum::<u64>() / copies;
        Some(crate::store::Capacity {
            total: sum(|s| s.segments_total * s.segment_bytes),
            free: sum(|s| s.segments_free * s.segment_bytes),
        })
    }

    /// The status of every node, in configuration order. Nodes are asked in
    /// parallel; one that does not answer is reported down.
    pub fn status(&self) -> Vec<NodeStatus> {
        let jobs: Vec<(usize, ())> = (0..self.inner.nodes.len()).map(|i| (i, ())).collect();
        let results = self.inner.fan_out(jobs, |i, ()| {
            self.inner.with_conn(i, |c| {
                let replies = c.pipeline(&[
                    vec![&b"INFO"[..], b"server"],
                    vec![&b"INFO"[..], b"keyspace"],
                    vec![&b"INFO"[..], b"engine"],
                    vec![&b"INFO"[..], b"handoff"],
                ])?;
                replies
                    .into_iter()
                    .map(|r| c.check(r))
                    .collect::<Result<Vec<_>, _>>()
            })
        });
        results
            .into_iter()
            .map(|(i, r)| {
                let addr = self.inner.nodes[i].addr.clone();
                match r {
                    Ok(replies) => {
                        let mut f = HashMap::new();
                        for r in replies {
                            f.extend(info_fields(r));
                        }
                        parse_status(addr, &f)
                    }
                    Err(e) => NodeStatus {
                        addr,
                        up: false,
                        error: Some(e.to_string()),
                        ..NodeStatus::default()
                    },
                }
            })
            .collect()
    }
}

fn parse_status(addr: String, f: &HashMap<String, String>) -> NodeStatus {
    let num = |k: &str| {
        f.get(k)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let float = |k: &str| {
        f.get(k)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let db0: HashMap<&str, &str> = f
        .get("db0")
        .map(|v| v.split(',').filter_map(|kv| kv.split_once('=')).collect())
        .unwrap_or_default();
    NodeStatus {
        addr,
        up: true,
        error: None,
        keys: db0.get("keys").and_then(|v| v.parse().ok()).unwrap_or(0),
        keys_approximate: db0.get("approximate") == Some(&"1"),
        live_bytes: num("log_live_bytes"),
        write_amplification: float("write_amplification"),
        reads_per_get: float("device_reads_per_get"),
        segments_free: num("segments_free"),
        segment_bytes: num("segment_bytes"),
        segments_total: num("segments_total"),
        dram_bytes: [
            "dram_index_bytes",
            "dram_cache_bytes",
            "dram_bloom_bytes",
            "dram_memtable_bytes",
        ]
        .iter()
        .map(|k| num(k))
        .sum(),
        hints_delivered: num("hints_delivered"),
        unclean_restart: f.get("previous_stop").map(|v| v.trim()) == Some("unclean"),
        hints: f
            .get("hints_targets")
            .map(|v| {
                v.split(',')
                    .filter_map(|kv| kv.rsplit_once('='))
                    .filter_map(|(t, n)| Some((t.to_string(), n.trim().parse().ok()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}
