//! Hinted handoff, the delivery: a background thread that gives each
//! node named by a hint (`hints.rs`) this node's current copy of the keys
//! it missed, so a node that was down or unreachable catches up without an
//! operator and without any client staying alive.
//!
//! Each round walks the hints in key order, target by target, in batches:
//! it reads this node's copies of the batch's keys, sends them to the
//! target as `VSET`/`VDEL` at the versions they carry (the target only ever
//! moves a key forward, so a late or repeated delivery is harmless), and
//! then deletes each hint whose version is not newer than the copy sent (a
//! hint raised meanwhile stays for the next round). A target that cannot
//! be reached or refuses is skipped until the next round; rounds run every
//! [`ROUND`], or at once when a `HINT` arrives.
//!
//! The thread connects to peers with this node's own password
//! (`requirepass`): the nodes of one cluster share one.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use client::Conn;
use engine::BatchOp;
use protocol::versioned::Versioned;

use crate::hints::{after_target, hint_version, hints_end, hints_start, parse_hint_key};
use crate::state::NodeState;

/// Time between rounds when nothing wakes the thread.
const ROUND: Duration = Duration::from_secs(1);
/// Hints read per batch, and most copy bytes sent in one batch.
const BATCH_HINTS: usize = 256;
const BATCH_BYTES: usize = 8 << 20;
/// Timeouts of the connection to a target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the handoff thread; it stops when the node's shutdown is asked
/// and [`crate::hints::HintState::wake`] is called.
pub fn start(state: Arc<NodeState>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ls-handoff".into())
        .spawn(move || run(&state))
}

fn stopping(state: &NodeState) -> bool {
    *state.shutdown.borrow()
}

fn run(state: &NodeState) {
    let mut conns: HashMap<Vec<u8>, Conn> = HashMap::new();
    while !stopping(state) {
        if !state.config.hinted_handoff {
            state.hints.wait(ROUND);
            continue;
        }
        if let Err(e) = round(state, &mut conns) {
            tracing::warn!(error = %e, "hinted handoff round failed");
        }
        state.hints.wait(ROUND);
    }
}

/// One pass over every hint.
fn round(state: &NodeState, conns: &mut HashMap<Vec<u8>, Conn>) -> engine::Result<()> {
    let end = hints_end();
    let mut start = hints_start();
    while !stopping(state) {
        let batch = state.db.scan(&start, &end, BATCH_HINTS)?;
        let Some((first, _)) = batch.first() else {
            return Ok(());
        };
        let Some((target, _)) = parse_hint_key(first) else {
            // Not a hint key: clear it, it can never be delivered.
            state.db.delete(first)?;
            continue;
        };
        let target = target.to_vec();
        let mine: Vec<(Bytes, Bytes)> = batch
            .into_iter()
            .take_while(|(k, _)| parse_hint_key(k).is_some_and(|(t, _)| t == target))
            .collect();
        let name = String::from_utf8_lossy(&target).into_owned();
        match deliver(state, conns, &target, &mine) {
            Ok(last) => {
                start = last.to_vec();
                start.push(0);
            }
            Err(why) => {
                conns.remove(&target);
                let mut errors = state.hints.last_error.lock();
                if errors.get(&name) != Some(&why) {
                    tracing::info!(target = %name, reason = %why, "hinted writes wait for their node");
                }
                errors.insert(name, why);
                start = after_target(&target);
            }
        }
    }
    Ok(())
}

/// Delivers `hints` (all for `target`, in key order, at least one) as far
/// as [`BATCH_BYTES`] allows; the last hint key handled, or why not.
fn deliver<'h>(
    state: &NodeState,
    conns: &mut HashMap<Vec<u8>, Conn>,
    target: &[u8],
    hints: &'h [(Bytes, Bytes)],
) -> Result<&'h Bytes, String> {
    let keys: Vec<&[u8]> = hints
        .iter()
        .filter_map(|(h, _)| parse_hint_key(h).map(|(_, k)| k))
        .collect();
    let copies = state
        .db
        .multi_get(&keys)
        .map_err(|e| format!("reading local copies: {e}"))?;
    let mut vset: Vec<Bytes> = vec![Bytes::from_static(b"VSET")];
    let mut vdel: Vec<Bytes> = vec![Bytes::from_static(b"VDEL")];
    // (hint index, version sent) of each hint this batch settles.
    let mut settled: Vec<(usize, u64)> = Vec::with_capacity(hints.len());
    let mut bytes = 0;
    for (i, copy) in copies.into_iter().enumerate() {
        if i > 0 && bytes >= BATCH_BYTES {
            break;
        }
        let key = Bytes::copy_from_slice(keys[i]);
        let Some(copy) = copy else {
            // No copy here any more (a plain DEL): nothing to hand off.
            settled.push((i, u64::MAX));
            continue;
        };
        bytes += key.len() + copy.len();
        let v = Versioned::decode(copy);
        let version = Bytes::from(v.version.to_string());
        match v.value {
            Some(value) => vset.extend([key, version, value]),
            None => vdel.extend([key, version]),
        }
        settled.push((i, v.version));
    }
    let reqs: Vec<Vec<Bytes>> = [vset, vdel].into_iter().filter(|r| r.len() > 1).collect();
    if !reqs.is_empty() {
        let conn = connect(state, conns, target)?;
        let replies = conn.pipeline(&reqs).map_err(|e| e.to_string())?;
        for r in replies {
            conn.check(r).map_err(|e| e.to_string())?;
        }
    }
    let ops: Vec<BatchOp> = settled
        .iter()
        .map(|&(i, _)| BatchOp::Delete(hints[i].0.clone()))
        .collect();
    let deleted = state
        .db
        .write_batch_if(&ops, |j, current| {
            Ok(current
                .value()?
                .is_some_and(|c| hint_version(&c) <= settled[j].1))
        })
        .map_err(|e| format!("clearing delivered hints: {e}"))?;
    let n = deleted.iter().filter(|&&d| d).count() as u64;
    state.hints.delivered(&String::from_utf8_lossy(target), n);
    let last = settled.last().map_or(0, |&(i, _)| i);
    Ok(&hints[last].0)
}

/// A connection to `target`, opened (and authenticated with this node's
/// password) when none is cached.
fn connect<'c>(
    state: &NodeState,
    conns: &'c mut HashMap<Vec<u8>, Conn>,
    target: &[u8],
) -> Result<&'c mut Conn, String> {
    if !conns.contains_key(target) {
        let addr = std::str::from_utf8(target).map_err(|_| "target is not UTF-8".to_string())?;
        let mut conn = Conn::open(addr, CONNECT_TIMEOUT, state.config.requirepass.as_deref())
            .map_err(|e| e.to_string())?;
        conn.set_timeout(CALL_TIMEOUT);
        conns.insert(target.to_vec(), conn);
    }
    conns
        .get_mut(target)
        .ok_or_else(|| "connection vanished".to_string())
}
