//! Consistent point reads: each key is read from several of its replicas at
//! once, the newest copy in the total order of
//! [`protocol::versioned::cmp_stored`] wins, and a replica found holding an
//! older copy (or none) is given the newest one (read repair).
//!
//! The contract, with the default read quorum (every replica that is up):
//! a read returns a version at least as new as every write acknowledged
//! before the read began by a replica this client can reach. A node that
//! comes back after missing writes is therefore never read alone: the
//! replica that took the writes answers beside it and wins. With
//! `read_quorum = 1` a read asks the first healthy replica only, which is
//! cheaper and may be stale (`docs/consistency.md`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use protocol::versioned::{cmp_stored, Versioned};
use protocol::Reply;

use crate::cluster::{send_stored, Cluster, Inner};
use crate::error::{ClientError, Result};

/// One key's read: the replicas to try, in order, and what they answered.
struct KeyRead {
    /// Replicas in read order (up and current first).
    order: Vec<usize>,
    /// Next index into `order` to ask.
    next: usize,
    /// Answers wanted: the replicas asked in the first round.
    wanted: usize,
    /// `(node, stored copy)` of every replica that answered.
    answers: Vec<(usize, Option<Bytes>)>,
}

impl KeyRead {
    /// The newest copy among the answers.
    fn newest(&self) -> Option<&Bytes> {
        self.answers
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .max_by(|a, b| cmp_stored(a, b))
    }
}

impl Cluster {
    /// Reads copies as stored (versioned bytes, tombstones included) from
    /// each key's read quorum: the newest per key, `None` for a key no
    /// replica has. Stale replicas among those that answered are repaired
    /// before this returns (best effort: a failed repair is logged).
    pub(crate) fn mget_stored(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        let inner = &*self.inner;
        let mut reads: Vec<KeyRead> = keys
            .iter()
            .map(|k| {
                let order = inner.read_order(k);
                let wanted = inner.read_width(&order);
                KeyRead {
                    order,
                    next: 0,
                    wanted,
                    answers: Vec::with_capacity(wanted),
                }
            })
            .collect();
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        while !pending.is_empty() {
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &k in &pending {
                let r = &mut reads[k];
                let mut asked = 0;
                while r.answers.len() + asked < r.wanted {
                    let Some(&node) = r.order.get(r.next) else {
                        break;
                    };
                    r.next += 1;
                    asked += 1;
                    groups.entry(node).or_default().push(k);
                }
            }
            if groups.is_empty() {
                break;
            }
            let jobs: Vec<(usize, Vec<usize>)> = groups.into_iter().collect();
            let sent: Vec<Vec<usize>> = jobs.iter().map(|(_, idx)| idx.clone()).collect();
            let results = inner.fan_out(jobs, |node, idx| {
                let wanted: Vec<&[u8]> = idx.iter().map(|&k| keys[k]).collect();
                self.mget_split(node, &wanted)
            });
            pending.clear();
            for ((node, r), idx) in results.into_iter().zip(sent) {
                match r {
                    Ok(Reply::Array(vals)) if vals.len() == idx.len() => {
                        for (k, v) in idx.into_iter().zip(vals) {
                            let copy = match v {
                                Reply::Bulk(b) => Some(b),
                                _ => None,
                            };
                            reads[k].answers.push((node, copy));
                        }
                    }
                    Ok(other) => {
                        return Err(ClientError::UnexpectedReply {
                            node: inner.nodes[node].addr.clone(),
                            command: "MGET".into(),
                            reply: format!("{other:?}").chars().take(120).collect(),
                        })
                    }
                    // Ask this node's keys of their next replica.
                    Err(e) if e.is_node_failure() => pending.extend(idx),
                    Err(e) => return Err(e),
                }
            }
            pending.sort_unstable();
            pending.dedup();
        }
        let needed = inner.config.read_quorum.unwrap_or(1);
        let mut repairs: BTreeMap<usize, Vec<(Bytes, Bytes)>> = BTreeMap::new();
        let mut out = Vec::with_capacity(keys.len());
        for (k, r) in reads.iter().enumerate() {
            if r.answers.len() < needed.min(r.order.len()) {
                return Err(ClientError::Unavailable(format!(
                    "{} of the {} replicas of key {:?} answered; the read needs {needed}",
                    r.answers.len(),
                    r.order.len(),
                    String::from_utf8_lossy(keys[k])
                )));
            }
            let newest = r.newest().cloned();
            if let Some(best) = &newest {
                for (node, copy) in &r.answers {
                    if needs_repair(copy.as_ref(), best) {
                        repairs
                            .entry(*node)
                            .or_default()
                            .push((Bytes::copy_from_slice(keys[k]), best.clone()));
                    }
                }
            }
            out.push(newest);
        }
        if !repairs.is_empty() {
            inner.read_repair(repairs);
        }
        Ok(out)
    }

    /// One node's MGET of `keys`. A node refuses an MGET whose values
    /// exceed its reply bound (`-ERR reply too large`); the keys are then
    /// asked for in halves, on the same connection, and the answers joined.
    fn mget_split(&self, node: usize, keys: &[&[u8]]) -> Result<Reply> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(keys.len() + 1);
        args.push(b"MGET");
        args.extend_from_slice(keys);
        match self.inner.with_conn(node, |c| c.call(&args)) {
            Err(ClientError::Server { message, .. })
                if keys.len() > 1 && message.starts_with("ERR reply too large") =>
            {
                let (a, b) = keys.split_at(keys.len() / 2);
                match (self.mget_split(node, a)?, self.mget_split(node, b)?) {
                    (Reply::Array(mut x), Reply::Array(y)) => {
                        x.extend(y);
                        Ok(Reply::Array(x))
                    }
                    (Reply::Array(_), other) | (other, _) => Ok(other),
                }
            }
            other => other,
        }
    }

    /// Copies this client has written back to replicas it found stale.
    pub fn read_repairs(&self) -> u64 {
        self.inner.read_repairs.load(Ordering::Relaxed)
    }
}

/// Whether a replica answering `copy` should be given `best`. A replica
/// without the key needs a deletion's tombstone only to keep it from
/// coming back through an older copy, which it does not have: skipped.
fn needs_repair(copy: Option<&Bytes>, best: &Bytes) -> bool {
    match copy {
        Some(c) => cmp_stored(c, best).is_lt(),
        None => Versioned::decode(best.clone()).value.is_some(),
    }
}

impl Inner {
    /// How many replicas (of `order`) a read asks at first: the read quorum,
    /// or by default every replica that is up (at least one).
    fn read_width(&self, order: &[usize]) -> usize {
        match self.config.read_quorum {
            Some(q) => q.min(order.len()),
            None => order.iter().filter(|&&i| self.is_up(i)).count().max(1),
        }
    }

    /// Writes the newest copies back to the replicas found stale, nodes in
    /// parallel. Versions only move forward on a node, so a repair racing
    /// a newer write cannot undo it.
    fn read_repair(&self, repairs: BTreeMap<usize, Vec<(Bytes, Bytes)>>) {
        let jobs: Vec<(usize, Vec<(Bytes, Bytes)>)> = repairs.into_iter().collect();
        let results = self.fan_out(jobs, |node, copies| {
            let n = copies.len() as u64;
            self.with_conn(node, |c| send_stored(c, &copies))?;
            Ok(n)
        });
        for (node, r) in results {
            match r {
                Ok(n) => {
                    self.read_repairs.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(node = %self.nodes[node].addr, error = %e, "read repair failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::versioned::{encode_tombstone, encode_value};

    #[test]
    fn a_replica_is_repaired_only_when_behind() {
        let new = encode_value(20, b"new");
        let old = encode_value(10, b"old");
        assert!(needs_repair(Some(&old), &new));
        assert!(needs_repair(None, &new));
        assert!(!needs_repair(Some(&new), &new));
        assert!(!needs_repair(Some(&new), &old));
        let gone = encode_tombstone(30);
        assert!(needs_repair(Some(&new), &gone), "an older value is removed");
        assert!(!needs_repair(None, &gone), "no copy, nothing to remove");
    }
}
