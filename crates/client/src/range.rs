//! Ordered range reads over the cluster: every node is asked for the range
//! (hashing scatters any key range over all nodes), the answers are merged
//! in key order, replicas' copies of a key collapse to the newest version,
//! deletions are dropped, and nodes are paged until the limit is met. The
//! result is exactly what one node holding everything would return.

use std::collections::VecDeque;

use bytes::Bytes;
use protocol::versioned::{cmp_stored, Versioned};
use protocol::Reply;

use crate::cluster::{Cluster, Inner};
use crate::error::{ClientError, Result};

/// Largest page asked of one node per RANGE call.
const MAX_PAGE: usize = 1000;

/// A key with `(node, stored value)` of every node that has it.
pub(crate) type KeyCopies = (Bytes, Vec<(usize, Bytes)>);

/// Pages one node's part of a range.
struct NodeCursor {
    node: usize,
    next: Vec<u8>,
    buf: VecDeque<(Bytes, Bytes)>,
    done: bool,
}

/// A k-way merge of node cursors; yields each key with every node's copy.
pub(crate) struct Merger<'a> {
    inner: &'a Inner,
    cursors: Vec<NodeCursor>,
    end: Vec<u8>,
    page: usize,
    /// Ask for keys only (`RANGE ... KEYSONLY`): no value is read.
    keys_only: bool,
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
            keys_only: false,
            failed: Vec::new(),
        }
    }

    /// Lists keys only; each copy's value is then empty.
    pub(crate) fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// The next key in order with `(node, stored value)` of every node that
    /// has it. A node that fails is dropped and recorded in `failed`; an
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
        let (end, page, keys_only) = (&self.end, self.page, self.keys_only);
        let mut shrink = false;
        let limit = page.to_string();
        let results = self.inner.fan_out(jobs, |node, start| {
            let mut args: Vec<&[u8]> = vec![b"RANGE", &start, end, b"LIMIT", limit.as_bytes()];
            if keys_only {
                args.push(b"KEYSONLY");
            }
            self.inner.with_conn(node, |c| c.call(&args))
        });
        for (node, r) in results {
            let Some(pos) = self.cursors.iter().position(|c| c.node == node) else {
                continue;
            };
            match r {
                Ok(Reply::Array(items)) if keys_only || items.len() % 2 == 0 => {
                    let c = &mut self.cursors[pos];
                    let n = if keys_only {
                        items.len()
                    } else {
                        items.len() / 2
                    };
                    let mut it = items.into_iter();
                    if keys_only {
                        for k in it.by_ref() {
                            if let Reply::Bulk(k) = k {
                                c.buf.push_back((k, Bytes::new()));
                            }
                        }
                    }
                    while let (Some(Reply::Bulk(k)), Some(Reply::Bulk(v))) = (it.next(), it.next())
                    {
                        c.buf.push_back((k, v));
                    }
                    c.done = n < page;
                    if let Some((last, _)) = c.buf.back() {
                        // The smallest key after `last`.
                        c.next = last.to_vec();
                        c.next.push(0);
                    }
                }
                Ok(other) => {
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

impl Cluster {
    /// Up to `limit` pairs with `start <= key < end` (empty `end`: no upper
    /// bound), in key order, across the whole cluster. Fails when so many
    /// nodes are down that some key may have no reachable copy.
    ///
    /// Keys are listed first (`RANGE ... KEYSONLY` on every node: no value
    /// is read), then each value is read once, from the key's first healthy
    /// replica, as a point read would; a key that replica lacks is read from
    /// the nodes that listed it, newest copy first.
    pub fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        let inner = &*self.inner;
        let all = inner.nodes.len();
        let up: Vec<usize> = (0..all).filter(|&i| inner.is_up(i)).collect();
        // Enough per node that one round usually meets the limit.
        let page =
            (limit.saturating_mul(inner.replicas) / up.len().max(1)).saturating_add(limit / 4 + 8);
        let mut merger = Merger::new(inner, up.clone(), start, end, page).keys_only();
        let mut out = Vec::with_capacity(limit.min(4096));
        while out.len() < limit {
            let want = limit - out.len();
            let mut listed: Vec<(Bytes, Vec<usize>)> = Vec::with_capacity(want.min(4096));
            while listed.len() < want {
                let next = merger.next_key()?;
                check_coverage(all - up.len() + merger.failed.len(), all, inner.replicas)?;
                match next {
                    Some((key, copies)) => {
                        listed.push((key, copies.into_iter().map(|(n, _)| n).collect()))
                    }
                    None => break,
                }
            }
            if listed.is_empty() {
                break;
            }
            let exhausted = listed.len() < want;
            let keys: Vec<&[u8]> = listed.iter().map(|(k, _)| &k[..]).collect();
            let stored = self.mget_stored(&keys)?;
            for ((key, holders), stored) in listed.iter().zip(stored) {
                let stored = match stored {
                    Some(s) => Some(s),
                    None => self.newest_from(key, holders)?,
                };
                if let Some(v) = stored.and_then(|s| Versioned::decode(s).value) {
                    out.push((key.clone(), v));
                }
            }
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    /// Up to `limit` keys with `start <= key < end` in key order, listed
    /// without reading values. May include keys recently deleted (their
    /// tombstones): for finding what to delete, not what exists.
    pub fn range_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        let inner = &*self.inner;
        let all = inner.nodes.len();
        let up: Vec<usize> = (0..all).filter(|&i| inner.is_up(i)).collect();
        let page = (limit / up.len().max(1)).saturating_add(limit / 4 + 8);
        let mut merger = Merger::new(inner, up.clone(), start, end, page).keys_only();
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
