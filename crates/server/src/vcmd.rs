//! The cluster client's versioned writes: `VSET` and `VDEL`.
//!
//! `VSET key version value [key version value ...]` stores each value with
//! its version (the layout of [`protocol::versioned`]) unless the key already
//! holds a copy at least as new in the total order of
//! [`protocol::versioned::cmp_stored`] (version, then bytes); `VDEL key
//! version [key version ...]` stores a tombstone the same way. Both reply
//! with the number of keys written. The compare and the write are one
//! engine conditional batch ([`engine::Db::write_batch_if`]): atomic per
//! key, with no node-wide lock, so VSETs on different keys run and
//! group-commit together, and replicas only ever move forward in that
//! order, whatever order writes and repairs arrive in.

use bytes::Bytes;
use engine::BatchOp;
use protocol::versioned::{cmp_stored, encode_tombstone, encode_value};
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
        items.push((&chunk[0], stored));
    }
    // The greatest of duplicate keys within one call wins, as it would if
    // the writes arrived one by one; the reply counts distinct keys.
    items.sort_by(|a, b| a.0.cmp(b.0).then_with(|| cmp_stored(&b.1, &a.1)));
    items.dedup_by(|later, first| later.0 == first.0);
    let ops: Vec<BatchOp> = items
        .into_iter()
        .map(|(key, stored)| BatchOp::Put(key.clone(), stored))
        .collect();
    // Shared: exclusive holders (SET NX/XX/GET, DEL) read-compare-write.
    let _shared = state.write_order.read();
    let written = state.db.write_batch_if(&ops, |i, current| {
        let BatchOp::Put(_, new) = &ops[i] else {
            return false;
        };
        current.is_none_or(|c| cmp_stored(new, c).is_gt())
    })?;
    Ok(Reply::Integer(written.iter().filter(|&&w| w).count() as i64))
}

fn parse_version(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}
