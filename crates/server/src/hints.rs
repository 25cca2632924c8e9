//! Hinted handoff, the records: `HINT target key version [key version ...]`
//! tells this node that `target` (another node, named by the address
//! clients use for it) missed the write of `key` at `version`, which this
//! node took. The cluster client sends it to the replicas that acknowledged
//! a write some replica missed, before it acknowledges the write itself.
//!
//! A hint is a key of the reserved range (`reserved.rs`):
//! `RESERVED "hint/" target 0x00 key`, holding the missed version as an
//! empty versioned value (`protocol::versioned`), so the engine's index
//! keeps its version and comparing one reads no value. It is written like
//! data (same engine, same durability)
//! and only ever moves to a newer version, so it survives a crash of this
//! node as the write it describes does. `handoff.rs` delivers this node's
//! current copy of each hinted key to its target and then deletes the hint,
//! unless a newer one arrived meanwhile. Replies with the number of hints
//! recorded or raised.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use engine::BatchOp;
use parking_lot::{Condvar, Mutex};
use protocol::Reply;

use crate::cmd::errors;
use crate::reserved::RESERVED;
use crate::state::NodeState;

/// Longest target name (a `host:port` as clients write it).
const MAX_TARGET: usize = 255;

/// The first key of the hints of every target.
pub fn hints_start() -> Vec<u8> {
    [RESERVED, b"hint/"].concat()
}

/// The first key after every hint.
pub fn hints_end() -> Vec<u8> {
    [RESERVED, b"hint0"].concat()
}

/// The hint key of `key` for `target`.
pub fn hint_key(target: &[u8], key: &[u8]) -> Vec<u8> {
    [&hints_start()[..], target, b"\0", key].concat()
}

/// The first key after every hint for `target`.
pub fn after_target(target: &[u8]) -> Vec<u8> {
    [&hints_start()[..], target, b"\x01"].concat()
}

/// `(target, key)` of a hint key.
pub fn parse_hint_key(hint: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = hint.strip_prefix(&hints_start()[..])?;
    let nul = rest.iter().position(|&b| b == 0)?;
    Some((&rest[..nul], &rest[nul + 1..]))
}

/// The stored value of a hint for the write at `version`.
pub fn hint_value(version: u64) -> Bytes {
    protocol::versioned::encode_value(version, b"")
}

/// Hints kept per target, counted from the store (keys only, no value
/// read). Run once when the node opens its store, before it serves anyone
/// or delivers anything; from then on [`HintState`] keeps the counts in
/// step with every hint written or deleted, so `INFO handoff` (which
/// monitoring may poll often) reads them without a scan.
pub fn count_stored(db: &engine::Db) -> engine::Result<BTreeMap<String, u64>> {
    const CHUNK: usize = 4096;
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    crate::data::scan_key_pages(db, hints_start(), &hints_end(), CHUNK, |keys| {
        for k in keys {
            if let Some((target, _)) = parse_hint_key(k) {
                *counts
                    .entry(String::from_utf8_lossy(target).into_owned())
                    .or_default() += 1;
            }
        }
        true
    })?;
    Ok(counts)
}

/// Hinted handoff's counters and the handoff thread's wake-up.
#[derive(Default)]
pub struct HintState {
    /// Hints delivered since start.
    pub delivered: AtomicU64,
    /// Hints kept per target: counted from the store at start
    /// ([`count_stored`]), then raised by each hint [`hint`] creates and
    /// lowered by each one delivery deletes (the only two ways a hint key
    /// comes or goes: clients cannot write reserved keys). Signed: a
    /// delivery may delete a hint just written before its writer counted
    /// it, and the two updates then meet at the right sum in either order.
    pending: Mutex<BTreeMap<String, i64>>,
    /// The last delivery failure, per target (cleared by a success).
    pub last_error: Mutex<BTreeMap<String, String>>,
    wake: Mutex<bool>,
    woken: Condvar,
}

impl HintState {
    /// Counters for a store holding `pending` hints per target.
    pub fn with_pending(pending: BTreeMap<String, u64>) -> Self {
        let pending = pending
            .into_iter()
            .map(|(t, n)| (t, i64::try_from(n).unwrap_or(i64::MAX)))
            .collect();
        HintState {
            pending: Mutex::new(pending),
            ..HintState::default()
        }
    }

    /// Hints kept per target, targets with none left out.
    pub fn pending(&self) -> BTreeMap<String, u64> {
        self.pending
            .lock()
            .iter()
            .filter_map(|(t, &n)| {
                u64::try_from(n)
                    .ok()
                    .filter(|&n| n > 0)
                    .map(|n| (t.clone(), n))
            })
            .collect()
    }

    /// Adds `n` (negative: hints deleted) to the count of `target`.
    fn count(&self, target: &str, n: i64) {
        if n == 0 {
            return;
        }
        let mut pending = self.pending.lock();
        let left = pending.entry(target.to_string()).or_default();
        *left = left.saturating_add(n);
        if *left == 0 {
            pending.remove(target);
        }
    }

    /// Wakes the handoff thread (new hints, or shutdown).
    pub fn wake(&self) {
        *self.wake.lock() = true;
        self.woken.notify_all();
    }

    /// Waits until woken or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let mut woken = self.wake.lock();
        if !*woken {
            self.woken.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }

    /// Records a delivery's outcome: `n` hints for `target` deleted.
    pub fn delivered(&self, target: &str, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
        self.last_error.lock().remove(target);
        self.count(target, -i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// `HINT target key version [key version ...]`.
pub fn hint(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let target = &args[1];
    let rest = &args[2..];
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return Ok(errors::wrong_args("hint"));
    }
    if target.is_empty() || target.len() > MAX_TARGET || target.contains(&0) {
        return Ok(Reply::err(
            "HINT target must be a node address (host:port), without NUL bytes",
        ));
    }
    if std::str::from_utf8(target).is_err() {
        return Ok(Reply::err("HINT target must be UTF-8 (host:port)"));
    }
    let mut ops = Vec::with_capacity(rest.len() / 2);
    let mut versions = Vec::with_capacity(rest.len() / 2);
    let max_key = state.db.max_key_size();
    for pair in rest.chunks_exact(2) {
        let Some(version) = std::str::from_utf8(&pair[1])
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return Ok(Reply::err("version is not an unsigned 64-bit integer"));
        };
        let key = hint_key(target, &pair[0]);
        if key.len() > max_key {
            // A user key this close to the limit has no room for the hint
            // prefix: skip it (consistent reads and repair still catch the
            // missed node up) rather than fail the other hints.
            tracing::warn!(
                len = pair[0].len(),
                "key too long to hint; left to read repair"
            );
            continue;
        }
        ops.push(BatchOp::Put(Bytes::from(key), hint_value(version)));
        versions.push(version);
    }
    // Whether each hint is new (not a raise of one already kept), for the
    // counts; judged under the batch's key locks, so exact.
    let mut new = vec![false; ops.len()];
    let written = state.db.write_batch_if(&ops, |i, current| {
        new[i] = !current.exists();
        Ok(crate::vcmd::stored_version(current)? < versions[i])
    })?;
    let created = written.iter().zip(&new).filter(|(&w, &n)| w && n).count();
    state
        .hints
        .count(&String::from_utf8_lossy(target), created as i64);
    state.hints.wake();
    Ok(Reply::Integer(written.iter().filter(|&&w| w).count() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_meet_whichever_update_comes_first() {
        let h = HintState::with_pending(BTreeMap::from([("a:1".to_string(), 2)]));
        // A delivery deletes a hint its writer has not counted yet.
        h.delivered("b:2", 1);
        assert!(!h.pending().contains_key("b:2"), "never shown below zero");
        h.count("b:2", 1);
        h.delivered("a:1", 1);
        assert_eq!(h.pending(), BTreeMap::from([("a:1".to_string(), 1)]));
        h.delivered("a:1", 1);
        assert!(h.pending().is_empty());
        assert_eq!(h.delivered.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn hint_keys_name_their_target_and_key() {
        let k = hint_key(b"10.0.0.2:7401", b"user\x00:1");
        assert!(crate::reserved::is_reserved(&k));
        assert_eq!(
            parse_hint_key(&k),
            Some((&b"10.0.0.2:7401"[..], &b"user\x00:1"[..]))
        );
        assert!(k.as_slice() >= hints_start().as_slice() && k < hints_end());
        assert!(k < after_target(b"10.0.0.2:7401"));
        // A target that extends another's name sorts after all its hints.
        assert!(after_target(b"h:80") <= hint_key(b"h:8080", b""));
        assert_eq!(parse_hint_key(b"other"), None);
        assert_eq!(protocol::versioned::version_of(&hint_value(7)), 7);
        assert!(engine::Tagging::of(&hint_value(7)) != engine::Tagging::Untagged);
    }
}
