//! Point writes and the read entry points: SET/GET/DEL and their batched
//! forms, split per node, sent in parallel, replicated and failed over
//! (the read path itself is in `read.rs`).

use std::collections::BTreeMap;

use bytes::Bytes;
use protocol::versioned::Versioned;

use crate::cluster::{Cluster, Inner};
use crate::error::{ClientError, Result};
use crate::runs::SyncMark;

/// Most key, version and value bytes in one VSET request; a larger batch
/// goes to a node as several pipelined VSETs (each pair stays atomic).
const MAX_WRITE_REQUEST: usize = 16 << 20;
/// Most keys in one VSET or VDEL request: a node refuses a request of more
/// than `max-args` arguments (default 1,048,576) by closing the connection,
/// so a large batch of small values or deletes goes in several.
const MAX_WRITE_KEYS: usize = 65_536;
/// Most keys in one HINT request.
const HINT_KEYS: usize = 4096;

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

    /// Stores and deletes (`None`) `ops` as one atomic batch on each
    /// replica: after a crash a node holds all of them or none. Every key
    /// must map to the same replicas (give them one hash tag, `{tag}`), and
    /// the batch must fit one request; otherwise nothing is written and
    /// [`ClientError::Config`] says why. Replication, quorum and hints as
    /// for [`Cluster::mset`].
    pub fn write_atomic(&self, ops: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        self.inner.write_atomic(ops.to_vec(), Durable::AsConfigured)
    }

    /// [`Cluster::write_atomic`], durable on every replica that took it
    /// when it returns, whatever the nodes' `--durability`: each replica's
    /// `VBATCH` is followed by `FSYNC` on the same connection. A node that
    /// dies between the two (and may have lost the batch with its unsynced
    /// log tail) fails its part of the write, as if it had missed it, so a
    /// success never rests on a node's word from before a restart. The
    /// `FSYNC` also makes durable every write the node acknowledged before
    /// the batch (a file system's data before the metadata naming it).
    pub fn write_atomic_durable(&self, ops: &[(&[u8], Option<&[u8]>)]) -> Result<()> {
        self.inner.write_atomic(ops.to_vec(), Durable::Now)
    }

    /// Makes every write the nodes acknowledged durable on their devices,
    /// whatever each node's `--durability`: `FSYNC` on every node that is
    /// up, in parallel, and on every node marked down that alone took
    /// writes not yet synced (if it does not answer, those writes cannot
    /// be vouched for). Other nodes known to be down are skipped (the
    /// writes they took are also on replicas this syncs). A node that fails
    /// to sync fails the call, and so does one that restarted without a
    /// clean stop after it alone acknowledged writes not yet synced
    /// ([`ClientError::LostWrites`], once per client: see
    /// [`Cluster::sync_with`] for once per writer; `runs.rs`). So success
    /// means every acknowledged write is durable on every replica that is
    /// up, and every write only one replica took is durable there. (A write
    /// several replicas took and lost together, every one of them
    /// restarting without a clean stop before a sync, is not detected.)
    pub fn sync(&self) -> Result<()> {
        self.inner.losses_reported.sync(|c| self.sync_with(c))
    }

    /// A cursor over losses of acknowledged writes from now on: a writer
    /// that syncs with it ([`Cluster::sync_with`]) is told of each later
    /// loss once, whoever else was told.
    pub fn loss_cursor(&self) -> crate::LossCursor {
        crate::LossCursor::new(
            self.inner
                .nodes
                .iter()
                .map(|n| n.runs.lock().losses())
                .collect(),
        )
    }

    /// [`Cluster::sync`], reporting each loss `cursor` was not told of yet
    /// (and then telling it).
    pub fn sync_with(&self, cursor: &mut crate::LossCursor) -> Result<()> {
        let inner = &*self.inner;
        let to_sync = || -> Vec<usize> {
            (0..inner.nodes.len())
                .filter(|&i| inner.is_up(i) || inner.nodes[i].runs.lock().unsynced() > 0)
                .collect()
        };
        let mut nodes = to_sync();
        if nodes.is_empty() {
            // Every node is marked down, and one may be back before the
            // health probe's next round finds it. Ask before giving up.
            inner.retry_down_nodes();
            nodes = to_sync();
        }
        if nodes.is_empty() {
            return Err(ClientError::Unavailable(
                "no node is up to make writes durable".into(),
            ));
        }
        let marks: Vec<_> = nodes
            .iter()
            .map(|&i| inner.nodes[i].runs.lock().mark())
            .collect();
        let reqs: Vec<(usize, Vec<[&[u8]; 1]>)> = nodes
            .iter()
            .map(|&node| (node, vec![[&b"FSYNC"[..]]]))
            .collect();
        let results = inner.pipeline_all_checked_runs(&reqs);
        // Every node's outcome is recorded before an error returns.
        let mut first_error = None;
        for ((node, r), mark) in results.into_iter().zip(marks) {
            match r {
                Ok((run, _)) => inner.nodes[node].runs.lock().synced(mark, run),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Losses are reported whether or not their node answers now.
        let mut first_loss = None;
        for (i, node) in inner.nodes.iter().enumerate() {
            let runs = node.runs.lock();
            if let Some(why) = runs.loss_after(cursor.seen(i)) {
                first_loss.get_or_insert_with(|| ClientError::LostWrites {
                    node: node.addr.clone(),
                    why: why.to_string(),
                });
            }
            cursor.set(i, runs.losses());
        }
        first_loss.or(first_error).map_or(Ok(()), Err)
    }

    /// Reads `key` (see [`Cluster::mget`]).
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.mget(&[key])?.pop().flatten())
    }

    /// Reads several keys: one MGET per node, nodes in parallel, from as
    /// many replicas as the read quorum asks (default: every replica that is
    /// up); the newest copy wins and replicas found stale are repaired.
    /// Keys whose node fails are read from their next replica.
    pub fn mget<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Bytes>>> {
        self.mget_values(keys, None)
    }

    /// [`Cluster::mget`] of values about `value_len` bytes long: a node on
    /// this machine that can write the process's shared memory writes them
    /// there instead of into its reply (see `client::landing`), so they
    /// cross no socket. Same answers as `mget`.
    pub fn mget_sized<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        value_len: usize,
    ) -> Result<Vec<Option<Bytes>>> {
        let stored_len = value_len.saturating_add(protocol::versioned::HEADER_LEN);
        self.mget_values(keys, Some(stored_len))
    }

    /// The values (versions stripped) of [`Cluster::mget_stored_sized`].
    fn mget_values<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        stored_len: Option<usize>,
    ) -> Result<Vec<Option<Bytes>>> {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
        Ok(self
            .mget_stored_sized(&keys, stored_len)?
            .into_iter()
            .map(|v| v.and_then(|b| Versioned::decode(b).value))
            .collect())
    }
}

/// One write's progress on one key.
#[derive(Default)]
pub(crate) struct KeyWrite {
    /// Replicas that took the write.
    pub(crate) acked_by: Vec<usize>,
    /// Replicas that missed it: skipped as down, or failed mid-write (those
    /// that refused it are not here: they would refuse a hand-off too).
    pub(crate) missed_by: Vec<usize>,
    /// The error of a replica that refused it.
    pub(crate) refused: Option<ClientError>,
    /// The error of the last replica that failed mid-write.
    pub(crate) last: Option<ClientError>,
}

impl Inner {
    /// Writes `(key, Some(value))` or `(key, None)` (delete) entries at one
    /// new version, atomic per key.
    pub(crate) fn write(&self, entries: Vec<(&[u8], Option<&[u8]>)>) -> Result<()> {
        self.write_with(entries, false, Durable::AsConfigured)
    }

    /// Writes entries whose keys share their replicas as one `VBATCH` per
    /// replica: all or nothing on each node.
    pub(crate) fn write_atomic(
        &self,
        entries: Vec<(&[u8], Option<&[u8]>)>,
        durable: Durable,
    ) -> Result<()> {
        let Some((first, _)) = entries.first() else {
            return Ok(());
        };
        let replicas = self.ring.replicas(first, self.replicas);
        if let Some((k, _)) = entries
            .iter()
            .find(|(k, _)| self.ring.replicas(k, self.replicas) != replicas)
        {
            return Err(ClientError::Config(format!(
                "an atomic batch must stay on one replica set, but {:?} and {:?} map to different nodes (give them one hash tag)",
                String::from_utf8_lossy(first),
                String::from_utf8_lossy(k)
            )));
        }
        let bytes: usize = entries
            .iter()
            .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len) + 32)
            .sum();
        if bytes > MAX_WRITE_REQUEST {
            return Err(ClientError::Config(format!(
                "an atomic batch of {bytes} bytes exceeds one request ({MAX_WRITE_REQUEST} bytes)"
            )));
        }
        self.write_with(entries, true, durable)
    }

    fn write_with(
        &self,
        entries: Vec<(&[u8], Option<&[u8]>)>,
        atomic: bool,
        durable: Durable,
    ) -> Result<()> {
        let version = self.next_version();
        let version_text = version.to_string();
        let mut per_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut replica_counts = Vec::with_capacity(entries.len());
        // Replicas known down: they get the write later, as a hint.
        let mut skipped: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (e, (key, _)) in entries.iter().enumerate() {
            let (replicas, targets) = self.write_targets(key);
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
        let groups: Vec<Vec<usize>> = per_node.values().cloned().collect();
        // Where the FSYNC after a durable write starts, per node.
        let marks: BTreeMap<usize, SyncMark> = match durable {
            Durable::Now => per_node
                .keys()
                .map(|&n| (n, self.nodes[n].runs.lock().mark()))
                .collect(),
            Durable::AsConfigured => BTreeMap::new(),
        };
        let jobs: Vec<(usize, Vec<Vec<&[u8]>>)> = per_node
            .iter()
            .map(|(&node, idx)| {
                let mut reqs = write_requests(&entries, idx, &version_text, atomic);
                if durable == Durable::Now {
                    reqs.push(vec![b"FSYNC"]);
                }
                (node, reqs)
            })
            .collect();
        // Every replica's requests go out before any reply is read.
        let results: Vec<(usize, Result<u64>)> = self
            .pipeline_all_checked_runs(&jobs)
            .into_iter()
            .map(|(node, r)| (node, r.map(|(run, _)| run)))
            .collect();
        let runs: BTreeMap<usize, u64> = results
            .iter()
            .filter_map(|(node, r)| Some((*node, *r.as_ref().ok()?)))
            .collect();
        let mut state: Vec<KeyWrite> = (0..entries.len()).map(|_| KeyWrite::default()).collect();
        for (node, idx) in &skipped {
            for &e in idx {
                state[e].missed_by.push(*node);
            }
        }
        for ((node, r), idx) in results.into_iter().zip(groups) {
            for e in idx {
                let s = &mut state[e];
                match &r {
                    Ok(_) => s.acked_by.push(node),
                    // A node that failed mid-write may or may not have it;
                    // handing it off again is harmless (versions only move
                    // forward).
                    Err(err) if err.is_node_failure() => {
                        s.missed_by.push(node);
                        s.last = Some(clone_error(err));
                    }
                    // A node that refused it (full, value too large) would
                    // refuse a hand-off too: no hint.
                    Err(err) => s.refused = Some(clone_error(err)),
                }
            }
        }
        self.record_hints(&entries, &version_text, &state);
        match durable {
            Durable::Now => self.note_synced(&runs, &marks),
            Durable::AsConfigured => self.note_acked_alone(&state, &runs),
        }
        state
            .into_iter()
            .zip(replica_counts)
            .try_for_each(|(s, replicas)| self.quorum_met(s, replicas))
    }

    /// Tells each node's run ledger (`runs.rs`) that its run `runs[node]`
    /// synced what it held when its `marks[node]` was taken (the FSYNC
    /// after a durable write).
    fn note_synced(&self, runs: &BTreeMap<usize, u64>, marks: &BTreeMap<usize, SyncMark>) {
        for (node, run) in runs {
            if let Some(&mark) = marks.get(node) {
                self.nodes[*node].runs.lock().synced(mark, *run);
            }
        }
    }

    /// Tells each node's run ledger (`runs.rs`) how many of the writes in
    /// `state` its run `runs[node]` acknowledged as their only replica:
    /// those a restart of the node before a sync would lose.
    pub(crate) fn note_acked_alone(&self, state: &[KeyWrite], runs: &BTreeMap<usize, u64>) {
        let mut alone: BTreeMap<usize, u64> = BTreeMap::new();
        for s in state {
            if let [node] = s.acked_by[..] {
                *alone.entry(node).or_default() += 1;
            }
        }
        for (node, n) in alone {
            if let Some(&run) = runs.get(&node) {
                self.nodes[node].runs.lock().acked_alone(run, n);
            }
        }
    }

    /// A key's replicas, and those a write goes to: the replicas that are
    /// up, or all of them when every one is marked down (try anyway).
    pub(crate) fn write_targets(&self, key: &[u8]) -> (Vec<usize>, Vec<usize>) {
        let replicas = self.ring.replicas(key, self.replicas);
        let up: Vec<usize> = replicas
            .iter()
            .copied()
            .filter(|&i| self.is_up(i))
            .collect();
        let targets = if up.is_empty() { replicas.clone() } else { up };
        (replicas, targets)
    }

    /// Whether one key's write reached its quorum among its `replicas`:
    /// with the default quorum every replica that is up must have taken it
    /// (one that answered an error, a full device say, fails it); with
    /// `write_quorum` set, that many.
    pub(crate) fn quorum_met(&self, s: KeyWrite, replicas: usize) -> Result<()> {
        let acked = s.acked_by.len();
        let needed = self.config.write_quorum.map_or(1, |q| q.min(replicas));
        let all_up_ok = self.config.write_quorum.is_some() || s.refused.is_none();
        if acked >= needed && all_up_ok {
            return Ok(());
        }
        Err(match (s.refused, s.last) {
            (Some(refused), _) if acked == 0 => refused,
            (refused, last) => ClientError::Quorum {
                acked,
                needed: needed.max(acked + 1),
                last: Box::new(refused.or(last).unwrap_or_else(|| {
                    ClientError::Unavailable("no replica was reachable".into())
                })),
            },
        })
    }

    /// Tells every replica that took a write which replicas missed it
    /// (`HINT missed key version ...`, see the node's `hints.rs`), so the
    /// replicas that have it hand it off when the missed node answers
    /// again, whether or not this client is still alive. Best effort: a
    /// hint that cannot be recorded is logged, and consistent reads (read
    /// repair) and `repair` still bring the missed node up to date.
    pub(crate) fn record_hints(
        &self,
        entries: &[(&[u8], Option<&[u8]>)],
        version: &str,
        state: &[KeyWrite],
    ) {
        // holder -> missed node -> HINT arguments.
        let mut hints: BTreeMap<usize, BTreeMap<usize, Vec<&[u8]>>> = BTreeMap::new();
        for (e, s) in state.iter().enumerate() {
            for &holder in &s.acked_by {
                for &missed in &s.missed_by {
                    let args = hints
                        .entry(holder)
                        .or_default()
                        .entry(missed)
                        .or_insert_with(|| vec![b"HINT", self.nodes[missed].addr.as_bytes()]);
                    args.extend([entries[e].0, version.as_bytes()]);
                }
            }
        }
        if hints.is_empty() {
            return;
        }
        // HINTs of at most HINT_KEYS keys each, so a large write stays
        // within the nodes' request limits.
        let jobs: Vec<(usize, Vec<Vec<&[u8]>>)> = hints
            .into_iter()
            .map(|(holder, per_missed)| {
                let reqs = per_missed
                    .into_values()
                    .flat_map(|args| {
                        let (head, pairs) = args.split_at(2);
                        pairs
                            .chunks(2 * HINT_KEYS)
                            .map(|c| [head, c].concat())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (holder, reqs)
            })
            .collect();
        for (holder, r) in self.pipeline_all_checked(&jobs) {
            if let Err(e) = r {
                tracing::warn!(node = %self.nodes[holder].addr, error = %e, "could not record hints of missed writes");
            }
        }
    }
}

/// When a write is durable on the nodes that acknowledge it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Durable {
    /// As each node's `--durability` says.
    AsConfigured,
    /// Before the write returns: `FSYNC` follows it on each connection.
    Now,
}

/// One node's requests for its entries `idx` of a write at `version`: one
/// `VBATCH` when `atomic`, else `VSET`s of at most [`MAX_WRITE_REQUEST`]
/// bytes each (at least one pair: a node bounds one request, and the
/// request memory all clients hold while it is read) and `VDEL`s, each of
/// at most [`MAX_WRITE_KEYS`] keys.
fn write_requests<'a>(
    entries: &[(&'a [u8], Option<&'a [u8]>)],
    idx: &[usize],
    version: &'a str,
    atomic: bool,
) -> Vec<Vec<&'a [u8]>> {
    if atomic {
        let mut req: Vec<&[u8]> = vec![b"VBATCH"];
        for &e in idx {
            let (key, value) = entries[e];
            let (kind, v): (&[u8], &[u8]) = match value {
                Some(v) => (b"SET", v),
                None => (b"DEL", b""),
            };
            req.extend([key, version.as_bytes(), kind, v]);
        }
        return vec![req];
    }
    let mut reqs: Vec<Vec<&[u8]>> = Vec::new();
    let mut vset: Vec<&[u8]> = vec![b"VSET"];
    let mut vset_bytes = 0;
    let mut vdel: Vec<&[u8]> = vec![b"VDEL"];
    for &e in idx {
        let (key, value) = entries[e];
        match value {
            Some(v) => {
                let n = key.len() + version.len() + v.len();
                let full = vset_bytes + n > MAX_WRITE_REQUEST || vset.len() > 3 * MAX_WRITE_KEYS;
                if vset.len() > 1 && full {
                    reqs.push(std::mem::replace(&mut vset, vec![b"VSET"]));
                    vset_bytes = 0;
                }
                vset.extend([key, version.as_bytes(), v]);
                vset_bytes += n;
            }
            None => {
                if vdel.len() > 2 * MAX_WRITE_KEYS {
                    reqs.push(std::mem::replace(&mut vdel, vec![b"VDEL"]));
                }
                vdel.extend([key, version.as_bytes()]);
            }
        }
    }
    reqs.extend([vset, vdel].into_iter().filter(|r| r.len() > 1));
    reqs
}

/// A copy of an error for every key of a failed per-node batch.
pub(crate) fn clone_error(e: &ClientError) -> ClientError {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_batches_go_in_requests_a_node_accepts() {
        let keys: Vec<Vec<u8>> = (0..(2 * MAX_WRITE_KEYS + 5) as u32)
            .map(|i| i.to_be_bytes().to_vec())
            .collect();
        let entries: Vec<(&[u8], Option<&[u8]>)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (&k[..], (i % 2 == 0).then_some(&b"v"[..])))
            .collect();
        let idx: Vec<usize> = (0..entries.len()).collect();
        let reqs = write_requests(&entries, &idx, "7", false);
        let (mut sets, mut dels) = (0, 0);
        for r in &reqs {
            assert!(r.len() <= 1 + 3 * MAX_WRITE_KEYS, "{} arguments", r.len());
            match r[0] {
                b"VSET" => sets += (r.len() - 1) / 3,
                b"VDEL" => dels += (r.len() - 1) / 2,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((sets, dels), (MAX_WRITE_KEYS + 3, MAX_WRITE_KEYS + 2));
        assert_eq!(reqs.len(), 4, "two of each");
    }
}
