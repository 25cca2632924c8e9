//! Point reads and writes: SET/GET/DEL and their batched forms, split per
//! node, sent in parallel, replicated and failed over.

use std::collections::BTreeMap;

use bytes::Bytes;
use protocol::versioned::{encode_tombstone, encode_value, Versioned};
use protocol::Reply;

use crate::cluster::{Cluster, Inner};
use crate::error::{ClientError, Result};

/// Most key, version and value bytes in one VSET request; a larger batch
/// goes to a node as several pipelined VSETs (each pair stays atomic).
const MAX_WRITE_REQUEST: usize = 16 << 20;

impl Cluster {
    /// Stores `value` under `key` on its replicas.
    pub fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.mset(&[(key, value)])
    }

    /// Stores several pairs, one batch per node, nodes in parallel. Each
    /// pair is atomic on each node; the call fails if any pair missed its
    /// write quorum.
    pub fn mset<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, pairs: &[(K, V)]) -> Result<()> {
        let entries = pairs
            .iter()
            .map(|(k, v)| (k.as_ref(), Some(v.as_ref())))
            .collect();
        self.inner.write(entries)
    }

    /// Deletes `key` (a versioned tombstone on its replicas).
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.mdelete(&[key])
    }

    /// Deletes several keys.
    pub fn mdelete<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<()> {
        let entries = keys.iter().map(|k| (k.as_ref(), None)).collect();
        self.inner.write(entries)
    }

    /// Reads `key` from its first healthy replica.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.mget(&[key])?.pop().flatten())
    }

    /// Reads several keys: one MGET per node, nodes in parallel; keys whose
    /// node fails are read again from their next replica.
    pub fn mget<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Bytes>>> {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        Ok(self
            .mget_stored(&keys)?
            .into_iter()
            .map(|v| v.and_then(|b| Versioned::decode(b).value))
            .collect())
    }

    /// Like [`Cluster::mget`] but returns what the replica stores (versioned
    /// bytes, tombstones included), `None` only for keys it does not have.
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

    pub(crate) fn mget_stored(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        let orders: Vec<Vec<usize>> = keys.iter().map(|k| self.inner.read_order(k)).collect();
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut attempt = vec![0usize; keys.len()];
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        while !pending.is_empty() {
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &k in &pending {
                let Some(&node) = orders[k].get(attempt[k]) else {
                    return Err(ClientError::Unavailable(format!(
                        "every replica of key {:?} failed",
                        String::from_utf8_lossy(keys[k])
                    )));
                };
                groups.entry(node).or_default().push(k);
            }
            let jobs: Vec<(usize, Vec<usize>)> = groups.into_iter().collect();
            let sent: Vec<Vec<usize>> = jobs.iter().map(|(_, idx)| idx.clone()).collect();
            let results = self.inner.fan_out(jobs, |node, idx| {
                let wanted: Vec<&[u8]> = idx.iter().map(|&k| keys[k]).collect();
                self.mget_split(node, &wanted)
            });
            pending.clear();
            for ((node, r), idx) in results.into_iter().zip(sent) {
                match r {
                    Ok(Reply::Array(vals)) if vals.len() == idx.len() => {
                        for (k, v) in idx.into_iter().zip(vals) {
                            out[k] = match v {
                                Reply::Bulk(b) => Some(b),
                                _ => None,
                            };
                        }
                    }
                    Ok(other) => {
                        return Err(ClientError::UnexpectedReply {
                            node: self.inner.nodes[node].addr.clone(),
                            command: "MGET".into(),
                            reply: format!("{other:?}").chars().take(120).collect(),
                        })
                    }
                    Err(e) if e.is_node_failure() => {
                        // Read this node's keys from their next replica.
                        for k in idx {
                            attempt[k] += 1;
                            pending.push(k);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            pending.sort_unstable();
            pending.dedup();
        }
        Ok(out)
    }
}

/// One write's progress on one key.
struct KeyWrite {
    acked: usize,
    refused: Option<ClientError>,
    last: Option<ClientError>,
}

impl Inner {
    /// Writes `(key, Some(value))` or `(key, None)` (delete) entries at one
    /// new version.
    pub(crate) fn write(&self, entries: Vec<(&[u8], Option<&[u8]>)>) -> Result<()> {
        let version = self.next_version();
        let version_text = version.to_string();
        let mut per_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut replica_counts = Vec::with_capacity(entries.len());
        // Replicas known down: they get the write later, as a hint.
        let mut skipped: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (e, (key, _)) in entries.iter().enumerate() {
            let replicas = self.ring.replicas(key, self.replicas);
            let up: Vec<usize> = replicas
                .iter()
                .copied()
                .filter(|&i| self.is_up(i))
                .collect();
            // With every replica marked down, try them all anyway.
            let targets = if up.is_empty() { replicas.clone() } else { up };
            for &r in &replicas {
                if !targets.contains(&r) {
                    skipped.entry(r).or_default().push(e);
                }
            }
            replica_counts.push(replicas.len());
            for t in targets {
                per_node.entry(t).or_default().push(e);
            }
        }
        let stored = |e: usize| -> (Bytes, Bytes) {
            let (key, value) = entries[e];
            let bytes = match value {
                Some(v) => encode_value(version, v),
                None => encode_tombstone(version),
            };
            (Bytes::copy_from_slice(key), bytes)
        };
        let jobs: Vec<(usize, Vec<usize>)> = per_node.into_iter().collect();
        let groups: Vec<Vec<usize>> = jobs.iter().map(|(_, idx)| idx.clone()).collect();
        let results = self.fan_out(jobs, |node, idx| {
            // VSETs of at most MAX_WRITE_REQUEST bytes each (at least one
            // pair), pipelined: a node bounds one request (`max_request`)
            // and the request memory all clients hold while it is read.
            let mut reqs: Vec<Vec<&[u8]>> = Vec::new();
            let mut vset: Vec<&[u8]> = vec![b"VSET"];
            let mut vset_bytes = 0;
            let mut vdel: Vec<&[u8]> = vec![b"VDEL"];
            for &e in &idx {
                let (key, value) = entries[e];
                match value {
                    Some(v) => {
                        let n = key.len() + version_text.len() + v.len();
                        if vset.len() > 1 && vset_bytes + n > MAX_WRITE_REQUEST {
                            reqs.push(std::mem::replace(&mut vset, vec![b"VSET"]));
                            vset_bytes = 0;
                        }
                        vset.extend([key, version_text.as_bytes(), v]);
                        vset_bytes += n;
                    }
                    None => vdel.extend([key, version_text.as_bytes()]),
                }
            }
            reqs.extend([vset, vdel].into_iter().filter(|r| r.len() > 1));
            self.with_conn(node, |c| {
                let replies = c.pipeline(&reqs)?;
                replies.into_iter().try_for_each(|r| c.check(r).map(drop))
            })
        });
        let mut state: Vec<KeyWrite> = (0..entries.len())
            .map(|_| KeyWrite {
                acked: 0,
                refused: None,
                last: None,
            })
            .collect();
        for (node, idx) in &skipped {
            self.add_hints(*node, idx.iter().map(|&e| stored(e)));
        }
        for ((node, r), idx) in results.into_iter().zip(groups) {
            if matches!(&r, Err(err) if err.is_node_failure()) {
                // The node failed mid-write: it may or may not have the
                // write; replaying it is harmless (versions only move forward).
                self.add_hints(node, idx.iter().map(|&e| stored(e)));
            }
            for e in idx {
                let s = &mut state[e];
                match &r {
                    Ok(()) => s.acked += 1,
                    Err(err) if err.is_node_failure() => s.last = Some(clone_error(err)),
                    Err(err) => s.refused = Some(clone_error(err)),
                }
            }
        }
        for (s, replicas) in state.into_iter().zip(replica_counts) {
            let needed = self.config.write_quorum.map_or(1, |q| q.min(replicas));
            // With the default quorum every replica that is up must take the
            // write: one that answered an error (a full device, say) fails it.
            let all_up_ok = self.config.write_quorum.is_some() || s.refused.is_none();
            if s.acked >= needed && all_up_ok {
                continue;
            }
            return Err(match (s.refused, s.last) {
                (Some(refused), _) if s.acked == 0 => refused,
                (refused, last) => ClientError::Quorum {
                    acked: s.acked,
                    needed: needed.max(s.acked + 1),
                    last: Box::new(refused.or(last).unwrap_or_else(|| {
                        ClientError::Unavailable("no replica was reachable".into())
                    })),
                },
            });
        }
        Ok(())
    }
}

/// A copy of an error for every key of a failed per-node batch.
fn clone_error(e: &ClientError) -> ClientError {
    match e {
        ClientError::Server { node, message } => ClientError::Server {
            node: node.clone(),
            message: message.clone(),
        },
        ClientError::Timeout { node, timeout } => ClientError::Timeout {
            node: node.clone(),
            timeout: *timeout,
        },
        ClientError::Io { node, source } => ClientError::Io {
            node: node.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        other => ClientError::Unavailable(other.to_string()),
    }
}
