//! The cluster client's versioned writes: `VSET` and `VDEL`.
//!
//! `VSET key version value [key version value ...]` stores each value with
//! its version (the layout of [`protocol::versioned`]) unless the key already
//! holds a version at least as new; `VDEL key version [key version ...]`
//! stores a tombstone the same way. Both reply with the number of keys
//! written. The compare and the write happen under the node's exclusive
//! write lock and go to the engine as one atomic batch, so replicas only
//! ever move forward in version order, whatever order writes and repairs
//! arrive in.

use bytes::Bytes;
use engine::BatchOp;
use protocol::versioned::{encode_tombstone, encode_value, version_of};
use protocol::Reply;

use crate::cmd::errors;
use crate::state::NodeState;

/// VSET (`tombstone == false`) or VDEL (`tombstone == true`).
pub fn vwrite(state: &NodeState, args: &[Bytes], tombstone: bool) -> engine::Result<Reply> {
    let width = if tombstone { 2 } else { 3 };
    let name = if tombstone { "vdel" } else { "vset" };
    let rest = &args[1..];
    if rest.is_empty() || !rest.len().is_multiple_of(width) {
        return Ok(errors::wrong_args(name));
    }
    let mut items = Vec::with_capacity(rest.len() / width);
    for chunk in rest.chunks_exact(width) {
        let Some(version) = parse_version(&chunk[1]) else {
            return Ok(Reply::err("version is not an unsigned 64-bit integer"));
        };
        let stored = if tombstone {
            encode_tombstone(version)
        } else {
            encode_value(version, &chunk[2])
        };
        items.push((&chunk[0], version, stored));
    }
    // The newest of duplicate keys within one call wins, as it would if the
    // writes arrived one by one.
    items.sort_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)));
    items.dedup_by(|later, first| later.0 == first.0);

    let keys: Vec<&[u8]> = items.iter().map(|(k, _, _)| &k[..]).collect();
    let _exclusive = state.write_order.write();
    let current = state.db.multi_get(&keys)?;
    let ops: Vec<BatchOp> = items
        .into_iter()
        .zip(current)
        .filter(|((_, version, _), cur)| cur.as_ref().is_none_or(|c| version_of(c) < *version))
        .map(|((key, _, stored), _)| BatchOp::Put(key.clone(), stored))
        .collect();
    if !ops.is_empty() {
        state.db.write_batch(&ops)?;
    }
    Ok(Reply::Integer(ops.len() as i64))
}

fn parse_version(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}
