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
//!
//! Digest reads keep this cheap: only the first replica in read order sends
//! the copy (`MGET`); the others send what they hold of it (`VMETA`:
//! version, checksum, length), which a node answers from its index without
//! reading the value. A replica whose digest is newer than the copy, or
//! differs at the same version, is then asked for its copy (a second round
//! trip, only then).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use protocol::versioned::{cmp_stored, version_of, Versioned};
use protocol::Reply;

use crate::cluster::{stored_requests, Cluster, Inner};
use crate::error::{ClientError, Result};
use crate::landing;

/// What one replica answered for a key.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// Its copy (`None`: it has none).
    Copy(Option<Bytes>),
    /// What it holds of its copy (`None`: it has none).
    Digest(Option<Digest>),
}

/// A replica's digest of its copy of a key (`VMETA`, `RANGE ... DIGESTS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) version: u64,
    /// CRC32C of the stored copy.
    pub(crate) crc: u32,
    /// The copy is a deletion's tombstone.
    pub(crate) deleted: bool,
}

impl Digest {
    /// One digest as a node sends it: `[version, crc32c, length, deleted]`,
    /// or Null (`Some(None)`); `None` if the reply has another shape.
    pub(crate) fn parse(item: &Reply) -> Option<Option<Digest>> {
        match item {
            Reply::Null => Some(None),
            Reply::Array(f) => match f.as_slice() {
                [Reply::Bulk(v), Reply::Integer(crc), Reply::Integer(_), Reply::Integer(del)] => {
                    let version = std::str::from_utf8(v).ok()?.parse().ok()?;
                    Some(Some(Digest {
                        version,
                        crc: u32::try_from(*crc).ok()?,
                        deleted: *del != 0,
                    }))
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// One key's read: the replicas to try, in order, and what they answered.
struct KeyRead {
    /// Replicas in read order (up first).
    order: Vec<usize>,
    /// Next index into `order` to ask.
    next: usize,
    /// Answers wanted: the replicas asked in the first round.
    wanted: usize,
    answers: Vec<(usize, Answer)>,
}

impl KeyRead {
    /// Whether some replica has sent its copy (else the next one asked
    /// must send it).
    fn has_copy(&self) -> bool {
        self.answers
            .iter()
            .any(|(_, a)| matches!(a, Answer::Copy(_)))
    }
}

/// Per node asked: the node, what it was asked, and its answers as
/// `(key index, answer)`.
type NodeAnswers = Vec<(usize, NodeAsk, Result<Vec<(usize, Answer)>>)>;

/// Keys to ask one node for: copies and digests.
#[derive(Clone, Default)]
struct NodeAsk {
    copies: Vec<usize>,
    digests: Vec<usize>,
}

impl Cluster {
    /// Reads copies as stored (versioned bytes, tombstones included) from
    /// each key's read quorum: the newest per key, `None` for a key no
    /// replica has. Stale replicas among those that answered are repaired
    /// before this returns (best effort: a failed repair is logged).
    pub(crate) fn mget_stored(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        self.mget_stored_sized(keys, None)
    }

    /// [`Cluster::mget_stored`] of copies about `stored_len` bytes long
    /// each, if given: a local node that can write this process's shared
    /// memory lands them there (see [`crate::landing`]).
    pub(crate) fn mget_stored_sized(
        &self,
        keys: &[&[u8]],
        stored_len: Option<usize>,
    ) -> Result<Vec<Option<Bytes>>> {
        let sized = stored_len.map(|n| n.to_string().into_bytes());
        let sized = sized.as_deref();
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
        // Ask until each key has its wanted answers, one of them a copy, or
        // has run out of replicas.
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        // Why the last replica that failed did (for the error if too few
        // answer).
        let mut last_failure: Option<ClientError> = None;
        while !pending.is_empty() {
            let mut asks: BTreeMap<usize, NodeAsk> = BTreeMap::new();
            for &k in &pending {
                let r = &mut reads[k];
                let mut asked = 0;
                let mut copy_asked = r.has_copy();
                while r.answers.len() + asked < r.wanted || !copy_asked {
                    let Some(&node) = r.order.get(r.next) else {
                        break;
                    };
                    r.next += 1;
                    asked += 1;
                    let ask = asks.entry(node).or_default();
                    if copy_asked {
                        ask.digests.push(k);
                    } else {
                        ask.copies.push(k);
                        copy_asked = true;
                    }
                }
            }
            if asks.is_empty() {
                break;
            }
            pending.clear();
            for (node, ask, result) in self.ask_all(keys, asks, sized) {
                match result {
                    Ok(answers) => {
                        for (k, a) in answers {
                            reads[k].answers.push((node, a));
                        }
                    }
                    // Ask this node's keys of their next replica.
                    Err(e) if e.is_node_failure() => {
                        pending.extend(ask.copies);
                        pending.extend(ask.digests);
                        last_failure = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            pending.retain(|&k| reads[k].next < reads[k].order.len());
            pending.sort_unstable();
            pending.dedup();
        }
        let needed = inner.config.read_quorum.unwrap_or(1);
        let check = |reads: &[KeyRead]| {
            for (k, r) in reads.iter().enumerate() {
                if r.answers.is_empty() || r.answers.len() < needed.min(r.order.len()) {
                    let why = last_failure
                        .as_ref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default();
                    return Err(ClientError::Unavailable(format!(
                        "{} of the {} replicas of key {:?} answered; the read needs {needed}{why}",
                        r.answers.len(),
                        r.order.len(),
                        String::from_utf8_lossy(keys[k])
                    )));
                }
            }
            Ok(())
        };
        check(&reads)?;
        // Also where the replica asked for the copy failed and only digests
        // came back: every digest of something is then "newer".
        self.fetch_newer_copies(keys, &mut reads)?;
        check(&reads)?;
        let mut repairs: BTreeMap<usize, Vec<(Bytes, Bytes)>> = BTreeMap::new();
        let mut out = Vec::with_capacity(keys.len());
        for (k, r) in reads.iter().enumerate() {
            let newest = newest_copy(&r.answers);
            if let Some(best) = &newest {
                for (node, a) in &r.answers {
                    if is_behind(a, best) {
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

    /// Sends every node its asks (`MGET` and/or `VMETA`, pipelined), all
    /// before reading any reply, so the nodes work in parallel; per node,
    /// its answers as `(key index, answer)`. A node that refuses its
    /// `MGET` reply as too large is asked again in parts. With `sized`
    /// (the copies' length, in decimal), the copies are asked for with a
    /// sized multi-get ([`crate::landing`]).
    fn ask_all(
        &self,
        keys: &[&[u8]],
        asks: BTreeMap<usize, NodeAsk>,
        sized: Option<&[u8]>,
    ) -> NodeAnswers {
        let jobs: Vec<(usize, Vec<Vec<&[u8]>>)> = asks
            .iter()
            .map(|(&node, ask)| {
                let copies: &[&[u8]] = match sized {
                    Some(len) => &[landing::SIZED_MGET, len],
                    None => &[b"MGET"],
                };
                let mut reqs = Vec::with_capacity(2);
                for (head, idx) in [(copies, &ask.copies), (&[&b"VMETA"[..]][..], &ask.digests)] {
                    if !idx.is_empty() {
                        let mut req: Vec<&[u8]> = Vec::with_capacity(idx.len() + head.len());
                        req.extend_from_slice(head);
                        req.extend(idx.iter().map(|&k| keys[k]));
                        reqs.push(req);
                    }
                }
                (node, reqs)
            })
            .collect();
        let replies = self.inner.pipeline_all(&jobs);
        asks.into_iter()
            .zip(replies)
            .map(|((node, ask), (_, r))| {
                let answers = r.and_then(|replies| self.answers(node, keys, &ask, replies));
                (node, ask, answers)
            })
            .collect()
    }

    /// A node's answers to `ask` from its `replies` (the `MGET`'s, if any,
    /// then the `VMETA`'s), as `(key index, answer)`.
    fn answers(
        &self,
        node: usize,
        keys: &[&[u8]],
        ask: &NodeAsk,
        replies: Vec<Reply>,
    ) -> Result<Vec<(usize, Answer)>> {
        let mut replies = replies.into_iter();
        let copies = if ask.copies.is_empty() {
            Vec::new()
        } else {
            let ks: Vec<&[u8]> = ask.copies.iter().map(|&k| keys[k]).collect();
            self.copies_from(node, replies.next().unwrap_or(Reply::Null), &ks)?
        };
        let digests = if ask.digests.is_empty() {
            Vec::new()
        } else {
            match replies.next().unwrap_or(Reply::Null) {
                Reply::Error(message) => return Err(self.inner.server_error(node, message)),
                reply => self.parse_digests(node, reply, ask.digests.len())?,
            }
        };
        Ok(ask
            .copies
            .iter()
            .copied()
            .zip(copies.into_iter().map(Answer::Copy))
            .chain(
                ask.digests
                    .iter()
                    .copied()
                    .zip(digests.into_iter().map(Answer::Digest)),
            )
            .collect())
    }

    /// One node's copies of `keys` from its reply to `MGET keys`: when the
    /// node refused the reply as too large, the keys are asked for again
    /// in parts ([`Cluster::mget_node`]).
    pub(crate) fn copies_from(
        &self,
        node: usize,
        reply: Reply,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Bytes>>> {
        match reply {
            Reply::Error(m) if m.starts_with("ERR reply too large") => self.mget_node(node, keys),
            Reply::Error(message) => Err(self.inner.server_error(node, message)),
            reply => self.parse_copies(node, reply, keys.len()),
        }
    }

    /// One node's copies of `keys` (`MGET`, split in halves when the node
    /// refuses the reply as too large).
    fn mget_node(&self, node: usize, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        let reply = self.mget_split(node, keys)?;
        self.parse_copies(node, reply, keys.len())
    }

    fn parse_copies(&self, node: usize, reply: Reply, n: usize) -> Result<Vec<Option<Bytes>>> {
        match reply {
            Reply::Array(vals) if vals.len() == n => Ok(vals
                .into_iter()
                .map(|v| match v {
                    Reply::Bulk(b) => Some(b),
                    _ => None,
                })
                .collect()),
            other => Err(self.unexpected(node, "MGET", &other)),
        }
    }

    fn parse_digests(&self, node: usize, reply: Reply, n: usize) -> Result<Vec<Option<Digest>>> {
        let Reply::Array(items) = &reply else {
            return Err(self.unexpected(node, "VMETA", &reply));
        };
        if items.len() != n {
            return Err(self.unexpected(node, "VMETA", &reply));
        }
        items
            .iter()
            .map(|item| Digest::parse(item).ok_or_else(|| self.unexpected(node, "VMETA", &reply)))
            .collect()
    }

    fn unexpected(&self, node: usize, command: &str, reply: &Reply) -> ClientError {
        ClientError::UnexpectedReply {
            node: self.inner.nodes[node].addr.clone(),
            command: command.into(),
            reply: format!("{reply:?}").chars().take(120).collect(),
        }
    }

    /// Asks for the copies of replicas whose digest is newer than the newest
    /// copy seen, or differs from it at the same version; fails if such a
    /// replica cannot send its copy.
    fn fetch_newer_copies(&self, keys: &[&[u8]], reads: &mut [KeyRead]) -> Result<()> {
        let mut asks: BTreeMap<usize, NodeAsk> = BTreeMap::new();
        for (k, r) in reads.iter().enumerate() {
            let best = newest_copy(&r.answers);
            for (node, a) in &r.answers {
                if let Answer::Digest(Some(d)) = a {
                    let newer = match &best {
                        None => true,
                        Some(b) => {
                            let bv = version_of(b);
                            d.version > bv || (d.version == bv && d.crc != crc32c::crc32c(b))
                        }
                    };
                    if newer {
                        asks.entry(*node).or_default().copies.push(k);
                    }
                }
            }
        }
        if asks.is_empty() {
            return Ok(());
        }
        for (node, ask, result) in self.ask_all(keys, asks, None) {
            match result {
                Ok(answers) => {
                    for (k, a) in answers {
                        if let Some(slot) = reads[k].answers.iter_mut().find(|(n, _)| *n == node) {
                            slot.1 = a;
                        }
                    }
                }
                // The replica showed a newer copy and cannot send it now:
                // answering with the older one would be a stale read (and a
                // read-modify-write on it would overwrite the newer data).
                Err(e) if e.is_node_failure() => {
                    let k = ask.copies.first().copied().unwrap_or(0);
                    return Err(ClientError::Unavailable(format!(
                        "a replica of key {:?} holds a newer copy but failed to send it: {e}",
                        String::from_utf8_lossy(keys.get(k).copied().unwrap_or_default())
                    )));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

    /// Whether each key holds a value (deleted keys and tombstones do not),
    /// by the newest digest (`VMETA`) among the replicas that are up:
    /// answered from the nodes' indexes, no value is read or sent. The same
    /// freshness as [`Cluster::mget`], without read repair.
    pub fn exists(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        let inner = &*self.inner;
        let mut asks: BTreeMap<usize, NodeAsk> = BTreeMap::new();
        for (k, key) in keys.iter().enumerate() {
            let order = inner.read_order(key);
            for &node in order.iter().take(inner.read_width(&order)) {
                asks.entry(node).or_default().digests.push(k);
            }
        }
        // Per key, the newest digest any replica answered.
        let mut newest: Vec<Option<Digest>> = vec![None; keys.len()];
        let mut failed: Vec<usize> = Vec::new();
        for (_, ask, result) in self.ask_all(keys, asks, None) {
            match result {
                Ok(answers) => {
                    for (k, a) in answers {
                        let Answer::Digest(Some(d)) = a else { continue };
                        if newest[k].is_none_or(|cur| d.version > cur.version) {
                            newest[k] = Some(d);
                        }
                    }
                }
                Err(e) if e.is_node_failure() => failed.extend(ask.digests),
                Err(e) => return Err(e),
            }
        }
        // Keys one of whose replicas failed: read them the long way (with
        // failover to the next replica and the read quorum), since the
        // replica that failed may be the one holding them.
        failed.sort_unstable();
        failed.dedup();
        for k in failed {
            let copy = self.mget_stored(&keys[k..=k])?.pop().flatten();
            newest[k] = copy.map(|c| Digest {
                version: version_of(&c),
                crc: 0,
                deleted: Versioned::decode(c).value.is_none(),
            });
        }
        Ok(newest
            .into_iter()
            .map(|d| d.is_some_and(|d| !d.deleted))
            .collect())
    }

    /// Copies this client has written back to replicas it found stale.
    pub fn read_repairs(&self) -> u64 {
        self.inner.read_repairs.load(Ordering::Relaxed)
    }
}

/// The newest copy among the answers that sent one.
fn newest_copy(answers: &[(usize, Answer)]) -> Option<Bytes> {
    answers
        .iter()
        .filter_map(|(_, a)| match a {
            Answer::Copy(Some(c)) => Some(c),
            _ => None,
        })
        .max_by(|a, b| cmp_stored(a, b))
        .cloned()
}

/// Whether a replica that answered `a` should be given `best`. A replica
/// without the key needs a deletion's tombstone only to keep it from
/// coming back through an older copy, which it does not have: skipped.
fn is_behind(a: &Answer, best: &Bytes) -> bool {
    let lacks = || Versioned::decode(best.clone()).value.is_some();
    match a {
        Answer::Copy(Some(c)) => cmp_stored(c, best).is_lt(),
        Answer::Copy(None) | Answer::Digest(None) => lacks(),
        // A digest newer than `best`, or equal in version but not in
        // bytes, was replaced by the replica's copy.
        Answer::Digest(Some(d)) => d.version < version_of(best),
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
    pub(crate) fn read_repair(&self, repairs: BTreeMap<usize, Vec<(Bytes, Bytes)>>) {
        let jobs: Vec<(usize, Vec<Vec<Bytes>>)> = repairs
            .iter()
            .map(|(&node, copies)| (node, stored_requests(copies)))
            .collect();
        let results: Vec<(usize, Result<u64>)> = self
            .pipeline_all_checked(&jobs)
            .into_iter()
            .zip(repairs.values())
            .map(|((node, r), copies)| (node, r.map(|_| copies.len() as u64)))
            .collect();
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
        let copy = |c: &Bytes| Answer::Copy(Some(c.clone()));
        assert!(is_behind(&copy(&old), &new));
        assert!(is_behind(&Answer::Copy(None), &new));
        assert!(!is_behind(&copy(&new), &new));
        assert!(!is_behind(&copy(&new), &old));
        let gone = encode_tombstone(30);
        assert!(is_behind(&copy(&new), &gone), "an older value is removed");
        assert!(
            !is_behind(&Answer::Copy(None), &gone),
            "no copy, nothing to remove"
        );
        let digest = |version| {
            Answer::Digest(Some(Digest {
                version,
                crc: 0,
                deleted: false,
            }))
        };
        assert!(is_behind(&digest(10), &new));
        assert!(!is_behind(&digest(20), &new));
        assert!(is_behind(&Answer::Digest(None), &new));
        assert!(!is_behind(&Answer::Digest(None), &gone));
    }

    #[test]
    fn the_newest_copy_wins_whoever_sent_it() {
        let answers = vec![
            (0, Answer::Copy(Some(encode_value(10, b"a")))),
            (1, Answer::Copy(Some(encode_value(12, b"b")))),
            (
                2,
                Answer::Digest(Some(Digest {
                    version: 99,
                    crc: 1,
                    deleted: false,
                })),
            ),
            (3, Answer::Copy(None)),
        ];
        assert_eq!(newest_copy(&answers), Some(encode_value(12, b"b")));
        assert_eq!(newest_copy(&answers[2..]), None);
    }
}
