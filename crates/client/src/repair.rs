//! Anti-entropy repair: walk the whole key space of every node in key order
//! and give each key's replicas the newest copy, so a node that was down, or
//! replaced by an empty one, catches up.
//!
//! Copies are written with `VSET`/`VDEL` at the version they carry, and
//! nodes only move forward in version order, so a repair racing with live
//! writes never puts an older value over a newer one.

use std::collections::BTreeMap;

use bytes::Bytes;
use protocol::versioned::cmp_stored;

use crate::cluster::{send_stored, Cluster, Inner};
use crate::error::Result;
use crate::range::{newest, Listed, Merger};

/// Keys read per node per RANGE call during repair.
const PAGE: usize = 256;
/// Copies queued per node before they are sent.
const BATCH_KEYS: usize = 128;
const BATCH_BYTES: usize = 4 << 20;

/// What a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Distinct keys seen (deletions included).
    pub keys: u64,
    /// Copies written, per node address.
    pub copied: BTreeMap<String, u64>,
    /// Copies found on nodes that are not among the key's replicas (left
    /// alone; they appear after the node list changes).
    pub misplaced: u64,
    /// Nodes that could not be read or written; their keys are not repaired.
    pub unreachable: Vec<String>,
}

impl RepairReport {
    /// Total copies written.
    pub fn total_copied(&self) -> u64 {
        self.copied.values().sum()
    }
}

/// Copies waiting to be sent to one node.
#[derive(Default)]
struct Outbox {
    args: Vec<Bytes>,
    bytes: usize,
}

impl Cluster {
    /// Repairs the whole cluster; see the module documentation.
    pub fn repair(&self) -> Result<RepairReport> {
        self.inner.repair()
    }
}

impl Inner {
    fn repair(&self) -> Result<RepairReport> {
        let mut report = RepairReport::default();
        let nodes: Vec<usize> = (0..self.nodes.len()).collect();
        let mut merger = Merger::new(self, nodes, b"", b"", PAGE);
        let mut outboxes: BTreeMap<usize, Outbox> = BTreeMap::new();
        while let Some((key, listed)) = merger.next_key()? {
            report.keys += 1;
            let copies: Vec<(usize, Bytes)> = listed
                .into_iter()
                .filter_map(|(n, l)| match l {
                    Listed::Copy(v) => Some((n, v)),
                    Listed::Key | Listed::Digest(_) => None,
                })
                .collect();
            let replicas = self.ring.replicas(&key, self.replicas);
            report.misplaced += copies.iter().filter(|(n, _)| !replicas.contains(n)).count() as u64;
            let Some(best) = newest(&copies).cloned() else {
                continue;
            };
            for r in replicas {
                let has = copies.iter().find(|(n, _)| *n == r).map(|(_, v)| v);
                if has.is_some_and(|v| cmp_stored(v, &best).is_ge()) {
                    // Equal in the total order: the same bytes.
                    continue;
                }
                let out = outboxes.entry(r).or_default();
                out.bytes += key.len() + best.len();
                out.args.push(key.clone());
                out.args.push(best.clone());
                if out.args.len() / 2 >= BATCH_KEYS || out.bytes >= BATCH_BYTES {
                    let batch = std::mem::take(out);
                    self.send_copies(r, batch, &mut report);
                }
            }
        }
        for (node, batch) in outboxes {
            self.send_copies(node, batch, &mut report);
        }
        for (node, e) in merger.failed {
            let addr = self.nodes[node].addr.clone();
            tracing::warn!(node = %addr, error = %e, "repair could not read node");
            if !report.unreachable.contains(&addr) {
                report.unreachable.push(addr);
            }
        }
        Ok(report)
    }

    /// Writes stored copies (`key, stored bytes` pairs) to `node`.
    fn send_copies(&self, node: usize, batch: Outbox, report: &mut RepairReport) {
        if batch.args.is_empty() {
            return;
        }
        let copies: Vec<(Bytes, Bytes)> = batch
            .args
            .chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
        let n = copies.len() as u64;
        let sent = self.with_conn(node, |c| send_stored(c, &copies));
        let addr = self.nodes[node].addr.clone();
        match sent {
            Ok(()) => *report.copied.entry(addr).or_default() += n,
            Err(e) => {
                tracing::warn!(node = %addr, error = %e, "repair could not write node");
                if !report.unreachable.contains(&addr) {
                    report.unreachable.push(addr);
                }
            }
        }
    }
}
