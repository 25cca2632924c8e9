//! Ordered range reads over the cluster: every node is asked for the range
//! (hashing scatters any key range over all nodes), the answers are merged
//! in key order, replicas' copies of a key collapse to the newest version,
//! deletions are dropped, and nodes are paged until the limit is met. The
//! result is exactly what one node holding everything would return.
//!
//! [`Cluster::range`] lists digests first (`RANGE ... DIGESTS`: each key
//! with its copy's version and checksum, from the index, no value read),
//! then reads each live key's value once, from one replica holding the
//! newest copy, and repairs the replicas the listing showed behind: a
//! range is as fresh as point reads with the default read quorum, and
//! costs one value read per key returned.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use protocol::versioned::{cmp_stored, encode_tombstone, version_of, Versioned};
use protocol::Reply;

use crate::cluster::{Cluster, Inner};
use crate::error::{ClientError, Result};
use crate::read::Digest;

/// Largest page asked of one node per RANGE call.
const MAX_PAGE: usize = 1000;

/// What a range listing asks each node for besides the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listing {
    /// Stored values (`RANGE`).
    Values,
    /// Nothing (`RANGE ... KEYSONLY`): no value is read.
    Keys,
    /// Digests (`RANGE ... DIGESTS`): no value is read.
    Digests,
}

/// What one node listed for a key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Listed {
    /// Its stored value ([`Listing::Values`]).
    Copy(Bytes),
    /// Only the key ([`Listing::Keys`]).
    Key,
    /// Its digest ([`Listing::Digests`]); `None` if the key vanished
    /// between the node's listing and its digest.
    Digest(Option<Digest>),
}

/// A key with what every node that has it listed.
pub(crate) type KeyCopies = (Bytes, Vec<(usize, Listed)>);

/// Pages one node's part of a range.
struct NodeCursor {
    node: usize,
    next: Vec<u8>,
    buf: VecDeque<(Bytes, Listed)>,
    done: bool,
}

/// A k-way merge of node cursors; yields each key with every node's copy.
pub(crate) struct Merger<'a> {
    inner: &'a Inner,
    cursors: Vec<NodeCursor>,
    end: Vec<u8>,
    page: usize,
    listing: Listing,
    /// Nodes dropped from the merge because they failed.
    pub(crate) failed: Vec<(usize, ClientError)>,
}

impl<'a> Merger<'a> {
    /// A merge over `nodes` of `[start, end)` (empty `end`: unbounded).
    pub(crate) fn new(
        inner: &'a Inner,
        nodes: Vec<usize>,
        start: &[u8],
        end: &[u8],
        page: usize,
    ) -> Merger<'a> {
        Merger {
            inner,
            cursors: nodes
                .into_iter()
                .map(|node| NodeCursor {
                    node,
                    next: start.to_vec(),
                    buf: VecDeque::new(),
                    done: false,
                })
                .collect(),
            end: end.to_vec(),
            page: page.clamp(1, MAX_PAGE),
            listing: Listing::Values,
            failed: Vec::new(),
        }
    }

    /// Asks the nodes for `listing` instead of values.
    pub(crate) fn listing(mut self, listing: Listing) -> Self {
        self.listing = listing;
        self
    }

    /// The nodes still in the merge (those that have not failed).
    pub(crate) fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.cursors.iter().map(|c| c.node)
    }

    /// The next key in order with what every node that has it listed. A
    /// node that fails is dropped and recorded in `failed`; an
    /// error reply from a node is returned.
    pub(crate) fn next_key(&mut self) -> Result<Option<KeyCopies>> {
        self.refill()?;
        let Some(min) = self
            .cursors
            .iter()
            .filter_map(|c| c.buf.front().map(|(k, _)| k))
            .min()
            .cloned()
        else {
            return Ok(None);
        };
        let mut copies = Vec::new();
        for c in &mut self.cursors {
            if c.buf.front().is_some_and(|(k, _)| *k == min) {
                if let Some((_, v)) = c.buf.pop_front() {
                    copies.push((c.node, v));
                }
            }
        }
        Ok(Some((min, copies)))
    }

    /// Fetches the next page of every cursor whose buffer ran dry.
    fn refill(&mut self) -> Result<()> {
        let jobs: Vec<(usize, Vec<u8>)> = self
            .cursors
            .iter()
            .filter(|c| c.buf.is_empty() && !c.done)
            .map(|c| (c.node, c.next.clone()))
            .collect();
        if jobs.is_empty() {
            return Ok(());
        }
        let (end, page, listing) = (&self.end, self.page, self.listing);
        let mut shrink = false;
        let limit = page.to_string();
        let reqs: Vec<(usize, Vec<Vec<&[u8]>>)> = jobs
            .iter()
            .map(|(node, start)| {
                let mut args: Vec<&[u8]> = vec![b"RANGE", start, end, b"LIMIT", limit.as_bytes()];
                match listing {
                    Listing::Values => {}
                    Listing::Keys => args.push(b"KEYSONLY"),
                    Listing::Digests => args.push(b"DIGESTS"),
                }
                (*node, vec![args])
            })
            .collect();
        // Every node's page is asked for before any reply is read.
        let results: Vec<(usize, Result<Reply>)> = self
            .inner
            .pipeline_all_checked(&reqs)
            .into_iter()
            .map(|(node, r)| (node, r.map(|mut v| v.pop().unwrap_or(Reply::Null))))
            .collect();
        for (node, r) in results {
            let Some(pos) = self.cursors.iter().position(|c| c.node == node) else {
                continue;
            };
            match r.map(|reply| parse_listing(reply, listing)) {
                Ok(Ok(items)) => {
                    let c = &mut self.cursors[pos];
                    c.done = items.len() < page;
                    c.buf.extend(items);
                    if let Some((last, _)) = c.buf.back() {
                        // The smallest key after `last`.
                        c.next = last.to_vec();
                        c.next.push(0);
                    }
                }
                Ok(Err(other)) => {
                    return Err(ClientError::UnexpectedReply {
                        node: self.inner.nodes[node].addr.clone(),
                        command: "RANGE".into(),
                        reply: format!("{other:?}").chars().take(120).collect(),
                    })
                }
                Err(e) if e.is_node_failure() => {
                    self.cursors.remove(pos);
                    self.failed.push((node, e));
                }
                // The page's values exceed the node's max-reply: ask again
                // for smaller pages.
                Err(ClientError::Server { message, .. })
                    if page > 1 && message.starts_with("ERR reply too large") =>
                {
                    shrink = true;
                }
                Err(e) => return Err(e),
            }
        }
        if shrink {
            self.page = page / 2;
            return self.refill();
        }
        Ok(())
    }
}

/// A node's page of a listing as `(key, what it listed)`; the reply itself
/// if it has another shape.
fn parse_listing(
    reply: Reply,
    listing: Listing,
) -> std::result::Result<Vec<(Bytes, Listed)>, Reply> {
    let Reply::Array(items) = reply else {
        return Err(reply);
    };
    if listing == Listing::Keys {
        return items
            .into_iter()
            .map(|k| match k {
                Reply::Bulk(k) => Ok((k, Listed::Key)),
                other => Err(other),
            })
            .collect();
    }
    if !items.len().is_multiple_of(2) {
        return Err(Reply::Array(items));
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let listed = match (listing, v) {
            (Listing::Values, Reply::Bulk(v)) => Listed::Copy(v),
            (Listing::Digests, v) => match Digest::parse(&v) {
                Some(d) => Listed::Digest(d),
                None => return Err(v),
            },
            (_, other) => return Err(other),
        };
        match k {
            Reply::Bulk(k) => out.push((k, listed)),
            other => return Err(other),
        }
    }
    Ok(out)
}

/// The newest of several stored copies of a key.
pub(crate) fn newest(copies: &[(usize, Bytes)]) -> Option<&Bytes> {
    copies
        .iter()
        .map(|(_, v)| v)
        .max_by(|a, b| cmp_stored(a, b))
}

/// Fails when `down` of `all` nodes are down and so, with `replicas`
/// copies per key, some key may have no reachable copy.
fn check_coverage(down: usize, all: usize, replicas: usize) -> Result<()> {
    if down >= replicas {
        return Err(ClientError::Unavailable(format!(
            "{down} of {all} nodes are down; with {replicas} replicas some keys may have no copy"
        )));
    }
    Ok(())
}

/// A listed key: the nodes in the merge that list it, with their digests.
struct ListedKey {
    key: Bytes,
    digests: Vec<(usize, Option<Digest>)>,
}

impl ListedKey {
    /// The newest version listed (0 if no node still holds the key).
    fn newest_version(&self) -> u64 {
        self.digests
            .iter()
            .filter_map(|(_, d)| d.map(|d| d.version))
            .max()
            .unwrap_or(0)
    }

    /// Whether the newest copy listed is a deletion's tombstone (or no
    /// node still holds the key): nothing to read.
    fn is_deleted(&self) -> bool {
        let v = self.newest_version();
        self.digests
            .iter()
            .filter_map(|(_, d)| *d)
            .filter(|d| d.version == v)
            .all(|d| d.deleted)
    }

    /// The nodes to read the newest copy from: one per distinct copy at
    /// the newest version (copies that differ at one version are ordered
    /// by their bytes, so each is read), in listing order.
    fn sources(&self) -> Vec<usize> {
        let v = self.newest_version();
        let mut crcs = Vec::new();
        let mut out = Vec::new();
        for (node, d) in &self.digests {
            if let Some(d) = d.filter(|d| d.version == v && !crcs.contains(&d.crc)) {
                crcs.push(d.crc);
                out.push(*node);
            }
        }
        out
    }
}

impl Cluster {
    /// Up to `limit` pairs with `start <= key < end` (empty `end`: no upper
    /// bound), in key order, across the whole cluster. Fails when so many
    /// nodes are down that some key may have no reachable copy.
    ///
    /// Digests are listed first (`RANGE ... DIGESTS` on every node that is
    /// up: no value is read), then each live key's newest copy is read
    /// once, from a node that holds it, and replicas the listing showed
    /// older (or lacking the key) are given it (read repair).
    pub fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        let inner = &*self.inner;
        let all = inner.nodes.len();
        let up: Vec<usize> = (0..all).filter(|&i| inner.is_up(i)).collect();
        // Enough per node that one round usually meets the limit.
        let page =
            (limit.saturating_mul(inner.replicas) / up.len().max(1)).saturating_add(limit / 4 + 8);
        let mut merger = Merger::new(inner, up.clone(), start, end, page).listing(Listing::Digests);
        let mut out = Vec::with_capacity(limit.min(4096));
        let mut exhausted = false;
        while out.len() < limit && !exhausted {
            let want = limit - out.len();
            let mut live: Vec<ListedKey> = Vec::with_capacity(want.min(4096));
            // Keys whose newest copy is a tombstone, with its bytes (which
            // follow from its version): they need no read.
            let mut deleted: Vec<(ListedKey, Bytes)> = Vec::new();
            while live.len() < want {
                let next = merger.next_key()?;
                check_coverage(all - up.len() + merger.failed.len(), all, inner.replicas)?;
                let Some((key, listed)) = next else {
                    exhausted = true;
                    break;
                };
                let digests = listed
                    .into_iter()
                    .map(|(n, l)| (n, if let Listed::Digest(d) = l { d } else { None }))
                    .collect();
                let k = ListedKey { key, digests };
                if !k.is_deleted() {
                    live.push(k);
                } else if k.newest_version() > 0 {
                    let tombstone = encode_tombstone(k.newest_version());
                    deleted.push((k, tombstone));
                }
            }
            let merged: Vec<usize> = merger.nodes().collect();
            let mut repairs: BTreeMap<usize, Vec<(Bytes, Bytes)>> = BTreeMap::new();
            for (k, tombstone) in &deleted {
                self.note_behind(k, tombstone, &merged, &mut repairs);
            }
            let copies = self.read_newest(&live)?;
            for (k, best) in live.iter().zip(copies) {
                let Some(best) = best else { continue };
                self.note_behind(k, &best, &merged, &mut repairs);
                if let Some(v) = Versioned::decode(best).value {
                    out.push((k.key.clone(), v));
                }
            }
            if !repairs.is_empty() {
                inner.read_repair(repairs);
            }
        }
        Ok(out)
    }

    /// The newest copy of each listed key: one `MGET` per source node,
    /// nodes in parallel. A key whose sources failed or no longer have it
    /// is read from every node that listed it; fails if what comes back is
    /// older than the listing showed, or nothing while a source failed
    /// (either would be a stale answer).
    fn read_newest(&self, keys: &[ListedKey]) -> Result<Vec<Option<Bytes>>> {
        let mut asks: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            for node in k.sources() {
                asks.entry(node).or_default().push(i);
            }
        }
        let jobs: Vec<(usize, Vec<usize>)> = asks.into_iter().collect();
        let reqs: Vec<(usize, Vec<Vec<&[u8]>>)> = jobs
            .iter()
            .map(|(node, idx)| {
                let mut mget: Vec<&[u8]> = vec![b"MGET"];
                mget.extend(idx.iter().map(|&i| &keys[i].key[..]));
                (*node, vec![mget])
            })
            .collect();
        // Every node's MGET goes out before any reply is read; one refused
        // as too large is asked again in parts.
        let replies = self.inner.pipeline_all(&reqs);
        let mut copies: Vec<Vec<(usize, Bytes)>> = vec![Vec::new(); keys.len()];
        let mut source_failed = vec![false; keys.len()];
        for ((node, r), (_, idx)) in replies.into_iter().zip(jobs) {
            let got = r.and_then(|mut replies| {
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i].key[..]).collect();
                self.copies_from(node, replies.pop().unwrap_or(Reply::Null), &ks)
            });
            match got {
                Ok(got) => {
                    for (i, c) in idx.into_iter().zip(got) {
                        if let Some(c) = c {
                            copies[i].push((node, c));
                        }
                    }
                }
                Err(e) if e.is_node_failure() => {
                    for i in idx {
                        source_failed[i] = true;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let mut best = newest(&copies[i]).cloned();
            let listed = k.newest_version();
            let older = |b: &Option<Bytes>| b.as_ref().is_some_and(|b| version_of(b) < listed);
            let source_failed = source_failed[i];
            if source_failed || best.is_none() || older(&best) {
                let holders: Vec<usize> = k.digests.iter().map(|(n, _)| *n).collect();
                best = self.newest_from(&k.key, &holders)?;
                // Gone from every node that answered is a deletion since
                // the listing (a plain DEL); gone because its source
                // failed, or older than listed, would be a stale answer.
                if older(&best) || (best.is_none() && source_failed) {
                    return Err(ClientError::Unavailable(format!(
                        "no replica of key {:?} that listed its newest copy could send it",
                        String::from_utf8_lossy(&k.key)
                    )));
                }
            }
            out.push(best);
        }
        Ok(out)
    }

    /// Adds to `repairs` every replica of `k` still in the merge whose
    /// listing showed it older than `best`, or without the key while `best`
    /// is a value (a replica without the key needs no tombstone).
    fn note_behind(
        &self,
        k: &ListedKey,
        best: &Bytes,
        merged: &[usize],
        repairs: &mut BTreeMap<usize, Vec<(Bytes, Bytes)>>,
    ) {
        let (version, crc) = (version_of(best), crc32c::crc32c(best));
        let is_value = Versioned::decode(best.clone()).value.is_some();
        for r in self.inner.ring.replicas(&k.key, self.inner.replicas) {
            if !merged.contains(&r) {
                continue;
            }
            let behind = match k.digests.iter().find(|(n, _)| *n == r) {
                Some((_, Some(d))) => d.version < version || (d.version == version && d.crc != crc),
                _ => is_value,
            };
            if behind {
                repairs
                    .entry(r)
                    .or_default()
                    .push((k.key.clone(), best.clone()));
            }
        }
    }

    /// Up to `limit` keys with `start <= key < end` in key order, listed
    /// without reading values. May include keys recently deleted (their
    /// tombstones): for finding what to delete, not what exists.
    pub fn range_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        let inner = &*self.inner;
        let all = inner.nodes.len();
        let up: Vec<usize> = (0..all).filter(|&i| inner.is_up(i)).collect();
        let page = (limit / up.len().max(1)).saturating_add(limit / 4 + 8);
        let mut merger = Merger::new(inner, up.clone(), start, end, page).listing(Listing::Keys);
        let mut out = Vec::with_capacity(limit.min(4096));
        while out.len() < limit {
            let next = merger.next_key()?;
            check_coverage(all - up.len() + merger.failed.len(), all, inner.replicas)?;
            match next {
                Some((key, _)) => out.push(key),
                None => break,
            }
        }
        Ok(out)
    }

    /// The newest stored copy of `key` among `nodes` (those that listed it).
    fn newest_from(&self, key: &[u8], nodes: &[usize]) -> Result<Option<Bytes>> {
        let mut copies = Vec::new();
        for &n in nodes {
            match self.inner.with_conn(n, |c| c.call(&[&b"GET"[..], key])) {
                Ok(Reply::Bulk(b)) => copies.push((n, b)),
                Ok(_) => {}
                Err(e) if e.is_node_failure() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(newest(&copies).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(version: u64, crc: u32, deleted: bool) -> Option<Digest> {
        Some(Digest {
            version,
            crc,
            deleted,
        })
    }

    fn listed(digests: Vec<(usize, Option<Digest>)>) -> ListedKey {
        ListedKey {
            key: Bytes::from_static(b"k"),
            digests,
        }
    }

    #[test]
    fn the_newest_copy_is_read_once_per_distinct_checksum() {
        // Two replicas agree at the newest version: one read, from the first.
        let k = listed(vec![
            (2, d(7, 1, false)),
            (0, d(7, 1, false)),
            (1, d(5, 9, false)),
        ]);
        assert_eq!(
            (k.newest_version(), k.sources(), k.is_deleted()),
            (7, vec![2], false)
        );
        // They differ at one version: both are read (their bytes order them).
        let k = listed(vec![(0, d(7, 1, false)), (1, d(7, 2, false))]);
        assert_eq!(k.sources(), vec![0, 1]);
        // A vanished copy is neither newest nor a source.
        let k = listed(vec![(0, None), (1, d(3, 1, false))]);
        assert_eq!((k.newest_version(), k.sources()), (3, vec![1]));
    }

    #[test]
    fn a_key_whose_newest_copy_is_a_tombstone_needs_no_read() {
        assert!(listed(vec![(0, d(9, 1, true)), (1, d(8, 2, false))]).is_deleted());
        assert!(!listed(vec![(0, d(8, 1, true)), (1, d(9, 2, false))]).is_deleted());
        // A tombstone and a value at one version: the value is read, and
        // the stored bytes decide.
        assert!(!listed(vec![(0, d(9, 1, true)), (1, d(9, 2, false))]).is_deleted());
        assert!(listed(vec![(0, None)]).is_deleted(), "gone from every node");
    }

    #[test]
    fn listings_parse_by_kind_and_refuse_other_shapes() {
        let bulk = |b: &'static [u8]| Reply::Bulk(Bytes::from_static(b));
        let digest = Reply::Array(vec![
            bulk(b"12"),
            Reply::Integer(3),
            Reply::Integer(4),
            Reply::Integer(1),
        ]);
        let got = parse_listing(
            Reply::Array(vec![bulk(b"a"), digest.clone(), bulk(b"b"), Reply::Null]),
            Listing::Digests,
        )
        .expect("digests");
        assert_eq!(
            got,
            vec![
                (Bytes::from_static(b"a"), Listed::Digest(d(12, 3, true))),
                (Bytes::from_static(b"b"), Listed::Digest(None)),
            ]
        );
        let keys = parse_listing(Reply::Array(vec![bulk(b"a")]), Listing::Keys).expect("keys");
        assert_eq!(keys, vec![(Bytes::from_static(b"a"), Listed::Key)]);
        for (reply, listing) in [
            (Reply::Array(vec![bulk(b"a")]), Listing::Digests),
            (
                Reply::Array(vec![bulk(b"a"), bulk(b"not a digest")]),
                Listing::Digests,
            ),
            (Reply::Array(vec![bulk(b"a"), digest]), Listing::Values),
            (Reply::Integer(1), Listing::Keys),
        ] {
            assert!(parse_listing(reply, listing).is_err());
        }
    }
}
