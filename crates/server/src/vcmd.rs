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
//!
//! `VBATCH key version kind value [key version kind value ...]` writes
//! stores (`kind` SET) and tombstones (`kind` DEL, `value` ignored) the same
//! way, all in one engine batch: after a crash either every write it made
//! is there or none is (the file adapter's metadata changes). Replies like
//! VSET.
//!
//! `VCAS key expected version SET value` / `VCAS key expected version DEL`
//! writes one key only if the version of its stored copy is exactly
//! `expected` (0: absent, or a value written without a version) and
//! `version` is greater: a compare-and-set, atomic with respect to every
//! other versioned write of the key on this node (the same conditional
//! batch). Replies 1 when written, 0 when not. Leases use it, so a holder
//! renewing and a rival taking over can never both succeed on a replica.
//!
//! `VMETA key [key ...]` answers, per key, what a replica holds without
//! sending it: nil when absent, else `[version, crc32c, length, deleted]`
//! of the stored copy (version as a decimal bulk string, the others
//! integers; `deleted` is 1 for a versioned tombstone).
//! Readers compare it with another replica's copy (digest reads). It reads
//! no value when the engine's index kept the copy's tag.

use bytes::Bytes;
use engine::{BatchOp, Tagging, ValueMeta};
use protocol::versioned::{
    cmp_stored, encode_tombstone, is_tombstone_tag, value_header, version_of, version_of_tag,
    Versioned,
};
use protocol::Reply;

use crate::cmd::{errors, Cmd};
use crate::state::NodeState;

/// VSET (`tombstone == false`) or VDEL (`tombstone == true`).
pub fn vwrite(state: &NodeState, args: &[Bytes], tombstone: bool) -> engine::Result<Reply> {
    let ops = match parse(args, tombstone) {
        Ok(ops) => ops,
        Err(reply) => return Ok(reply),
    };
    let written = write(state, &ops)?;
    Ok(Reply::Integer(written.iter().filter(|&&w| w).count() as i64))
}

/// VBATCH: mixed stores and tombstones as one atomic batch.
pub fn vbatch(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let rest = &args[1..];
    if rest.is_empty() || !rest.len().is_multiple_of(4) {
        return Ok(errors::wrong_args("vbatch"));
    }
    let mut items = Vec::with_capacity(rest.len() / 4);
    for op in rest.chunks_exact(4) {
        let Some(version) = parse_version(&op[1]) else {
            return Ok(Reply::err("version is not an unsigned 64-bit integer"));
        };
        let copy = if op[2].eq_ignore_ascii_case(b"SET") {
            StoredCopy::store(&op[0], version, &op[3])
        } else if op[2].eq_ignore_ascii_case(b"DEL") {
            StoredCopy::tombstone(&op[0], version)
        } else {
            return Ok(Reply::err("vbatch kind must be SET or DEL"));
        };
        items.push(copy);
    }
    let ops = greatest_per_key(items);
    let written = write(state, &ops)?;
    Ok(Reply::Integer(written.iter().filter(|&&w| w).count() as i64))
}

/// VCAS: one versioned write if the stored version is `expected`.
pub fn vcas(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let (expected, version) = match (args.get(2), args.get(3)) {
        (Some(e), Some(v)) => match (parse_version(e), parse_version(v)) {
            (Some(e), Some(v)) => (e, v),
            _ => return Ok(Reply::err("version is not an unsigned 64-bit integer")),
        },
        _ => return Ok(errors::wrong_args("vcas")),
    };
    let copy = match (args.get(4), args.len()) {
        (Some(kind), 6) if kind.eq_ignore_ascii_case(b"SET") => {
            StoredCopy::store(&args[1], version, &args[5])
        }
        (Some(kind), 5) if kind.eq_ignore_ascii_case(b"DEL") => {
            StoredCopy::tombstone(&args[1], version)
        }
        _ => {
            return Ok(Reply::err(
                "vcas takes key expected version SET value, or key expected version DEL",
            ))
        }
    };
    if version <= expected {
        return Ok(Reply::err(
            "vcas: the new version must be greater than the expected one",
        ));
    }
    let op = BatchOp::PutParts {
        key: copy.key,
        head: copy.head,
        body: copy.body,
    };
    let _shared = state.write_order.read();
    // A compare-and-set of a small record (a lease renewed, a volume's or
    // file system's metadata) stays possible on a full device: an adapter
    // whose lease could not be renewed would refuse the TRIMs and unlinks
    // that make room.
    let written = state.db.write_batch_if_in(
        std::slice::from_ref(&op),
        engine::Room::SmallReplacements,
        |_, current| Ok(stored_version(current)? == expected),
    )?;
    Ok(Reply::Integer(i64::from(written.first() == Some(&true))))
}

/// A pipelined run of VSET/VDEL commands as one conditional batch: their
/// keys' current values are read together (one batch of device reads) and
/// their writes appended together, in command order, so a later command
/// sees what an earlier one wrote, as if they ran one by one. `None` if a
/// command is malformed or the batch fails: the caller then runs them one
/// at a time, so each reply carries its own outcome.
pub fn vwrite_run(state: &NodeState, run: &[(Cmd, Vec<Bytes>)]) -> Option<Vec<Reply>> {
    let mut ops = Vec::new();
    let mut ends = Vec::with_capacity(run.len());
    for (cmd, args) in run {
        ops.extend(parse(args, *cmd == Cmd::Vdel).ok()?);
        ends.push(ops.len());
    }
    let written = write(state, &ops).ok()?;
    let mut start = 0;
    Some(
        ends.into_iter()
            .map(|end| {
                let n = written[start..end].iter().filter(|&&w| w).count();
                start = end;
                Reply::Integer(n as i64)
            })
            .collect(),
    )
}

/// The writes of one VSET/VDEL, one per distinct key (the greatest of
/// duplicates, as if they arrived one by one), or the error reply.
fn parse(args: &[Bytes], tombstone: bool) -> Result<Vec<BatchOp>, Reply> {
    let width = if tombstone { 2 } else { 3 };
    let name = if tombstone { "vdel" } else { "vset" };
    let rest = &args[1..];
    if rest.is_empty() || !rest.len().is_multiple_of(width) {
        return Err(errors::wrong_args(name));
    }
    let mut items = Vec::with_capacity(rest.len() / width);
    for chunk in rest.chunks_exact(width) {
        let Some(version) = parse_version(&chunk[1]) else {
            return Err(Reply::err("version is not an unsigned 64-bit integer"));
        };
        items.push(if tombstone {
            StoredCopy::tombstone(&chunk[0], version)
        } else {
            StoredCopy::store(&chunk[0], version, &chunk[2])
        });
    }
    Ok(greatest_per_key(items))
}

/// A versioned copy to store: its header and, for a value, the client's
/// bytes, kept apart (the engine stores them back to back) so that the
/// value is never copied just to put the header before it.
struct StoredCopy {
    key: Bytes,
    head: Bytes,
    body: Bytes,
}

impl StoredCopy {
    fn store(key: &Bytes, version: u64, value: &Bytes) -> StoredCopy {
        StoredCopy {
            key: key.clone(),
            head: Bytes::copy_from_slice(&value_header(version)),
            body: value.clone(),
        }
    }

    fn tombstone(key: &Bytes, version: u64) -> StoredCopy {
        StoredCopy {
            key: key.clone(),
            head: encode_tombstone(version),
            body: Bytes::new(),
        }
    }

    /// [`cmp_stored`] of the two copies: both heads are whole versioned
    /// headers of one length, so comparing heads, then bodies, compares
    /// the stored bytes.
    fn cmp_stored(&self, other: &StoredCopy) -> std::cmp::Ordering {
        version_of(&self.head)
            .cmp(&version_of(&other.head))
            .then_with(|| (&self.head, &self.body).cmp(&(&other.head, &other.body)))
    }
}

/// One put per distinct key: the greatest of duplicates (see
/// [`cmp_stored`]), as if they arrived one by one.
fn greatest_per_key(mut items: Vec<StoredCopy>) -> Vec<BatchOp> {
    items.sort_by(|a, b| a.key.cmp(&b.key).then_with(|| b.cmp_stored(a)));
    items.dedup_by(|later, first| later.key == first.key);
    items
        .into_iter()
        .map(|c| BatchOp::PutParts {
            key: c.key,
            head: c.head,
            body: c.body,
        })
        .collect()
}

/// Writes each op whose copy is greater than the key's current one (see
/// [`cmp_stored`]); which were written. The current copy's version comes
/// from the engine's index (its tag) when it has one, so deciding reads no
/// value; only a tie, or a copy without a tag, reads the stored bytes.
fn write(state: &NodeState, ops: &[BatchOp]) -> engine::Result<Vec<bool>> {
    // Shared: exclusive holders (SET NX/XX/GET, DEL) read-compare-write.
    let _shared = state.write_order.read();
    state.db.write_batch_if(ops, |i, current| {
        let BatchOp::PutParts { head, body, .. } = &ops[i] else {
            return Ok(false);
        };
        if !current.exists() {
            return Ok(true);
        }
        if let Some(theirs) = indexed_version(current) {
            let mine = version_of(head);
            if mine != theirs {
                return Ok(mine > theirs);
            }
        }
        // A tie, or a copy whose version only its bytes tell: compare
        // whole copies (the one place the new copy is joined).
        let new = [&head[..], &body[..]].concat();
        Ok(current
            .value()?
            .is_none_or(|c| cmp_stored(&new, &c).is_gt()))
    })
}

/// The version of a key's stored copy as the index knows it (from the
/// value's tag, or 0 for a value known to have none); `None` when only the
/// value can tell (an entry older than tags) or the key is absent.
pub fn indexed_version(current: &engine::Current<'_>) -> Option<u64> {
    version_from_index(current.tag(), current.len()?)
}

/// The version of a stored copy of `len` bytes from what its index entry
/// records of its tag; `None` when the entry does not know.
pub fn version_from_index(tag: Tagging, len: usize) -> Option<u64> {
    match tag {
        Tagging::Tagged(tag) => Some(version_of_tag(&tag, len)),
        // A value without the versioned header is version 0.
        Tagging::Untagged => Some(0),
        Tagging::Unknown => None,
    }
}

/// The version of a key's stored copy (0 when absent), from the index when
/// it knows, else from the value.
pub fn stored_version(current: &mut engine::Current<'_>) -> engine::Result<u64> {
    if !current.exists() {
        return Ok(0);
    }
    match indexed_version(current) {
        Some(v) => Ok(v),
        None => Ok(current.value()?.map_or(0, |v| version_of(&v))),
    }
}

/// `VMETA key [key ...]`.
pub fn vmeta(state: &NodeState, args: &[Bytes]) -> engine::Result<Reply> {
    let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    let metas = state.db.multi_get_meta(&keys)?;
    let mut out = Vec::with_capacity(keys.len());
    for (key, meta) in keys.iter().zip(metas) {
        out.push(match meta {
            Some(meta) => digest(state, key, meta)?,
            None => Reply::Null,
        });
    }
    Ok(Reply::Array(out))
}

/// `VMETA` answered from DRAM alone (the network thread's path, no
/// executor hand-off): `None` when a keytable block is not cached or an
/// entry predates tags, and only [`vmeta`] can answer. A consistent read
/// sends one to every replica but the first, so this is half its requests.
pub fn try_vmeta(state: &NodeState, args: &[Bytes]) -> Option<Reply> {
    let keys: Vec<&[u8]> = args[1..].iter().map(|k| &k[..]).collect();
    let metas = match state.db.try_multi_get_meta(&keys) {
        Ok(Some(metas)) => metas,
        // `vmeta` answers it, with the error if there is one.
        Ok(None) | Err(_) => return None,
    };
    let mut out = Vec::with_capacity(keys.len());
    for (key, meta) in keys.iter().zip(metas) {
        out.push(match meta {
            // The version is in the value: a device read.
            Some(meta) if meta.tag == Tagging::Unknown => return None,
            Some(meta) => digest(state, key, meta).ok()?,
            None => Reply::Null,
        });
    }
    Some(Reply::Array(out))
}

/// A key's digest as VMETA and `RANGE ... DIGESTS` send it: `[version,
/// crc32c, length, deleted]`, or Null when the key vanished meanwhile.
pub fn digest(state: &NodeState, key: &[u8], meta: ValueMeta) -> engine::Result<Reply> {
    let len = meta.value_len as usize;
    let (version, deleted) = match meta.tag {
        Tagging::Tagged(tag) => (version_of_tag(&tag, len), is_tombstone_tag(&tag, len)),
        Tagging::Untagged => (0, false),
        // An entry older than tags: the version is in the value.
        Tagging::Unknown => match state.db.get(key)? {
            Some(v) => (version_of(&v), Versioned::decode(v).value.is_none()),
            None => return Ok(Reply::Null),
        },
    };
    Ok(Reply::Array(vec![
        Reply::Bulk(Bytes::from(version.to_string())),
        Reply::Integer(i64::from(meta.value_crc)),
        Reply::Integer(i64::from(meta.value_len)),
        Reply::Integer(i64::from(deleted)),
    ]))
}

/// A version in decimal ASCII, as `u64::from_str` reads it (an optional
/// `+`, then 1 to 20 digits, no overflow), without the UTF-8 check and
/// string parse once per key of a batch.
fn parse_version(b: &[u8]) -> Option<u64> {
    let digits = b.strip_prefix(b"+").unwrap_or(b);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let d = d.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Versions parse exactly as `u64::from_str` parses them.
    #[test]
    fn versions_parse_as_the_standard_library_does() {
        let cases: [&[u8]; 16] = [
            b"0",
            b"7",
            b"+7",
            b"0042",
            b"18446744073709551615",
            b"18446744073709551616",
            b"99999999999999999999",
            b"",
            b"+",
            b"-1",
            b" 1",
            b"1 ",
            b"1a",
            b"++1",
            b"\xff1",
            b"12345678901234567890123",
        ];
        for case in cases {
            let std = std::str::from_utf8(case)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
            assert_eq!(
                parse_version(case),
                std,
                "{:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    /// Comparing a copy's parts orders copies exactly as comparing the
    /// stored bytes does, ties between one version's copies included.
    #[test]
    fn parts_compare_like_stored_copies() {
        let key = Bytes::from_static(b"k");
        let copies: Vec<StoredCopy> = [1u64, 2, 256]
            .iter()
            .flat_map(|&v| {
                let bodies = [&b""[..], b"a", b"ab", b"b", b"\xff"];
                let key = &key;
                bodies
                    .into_iter()
                    .map(move |b| StoredCopy::store(key, v, &Bytes::copy_from_slice(b)))
                    .chain(std::iter::once(StoredCopy::tombstone(key, v)))
            })
            .collect();
        let joined = |c: &StoredCopy| [&c.head[..], &c.body[..]].concat();
        for a in &copies {
            for b in &copies {
                assert_eq!(
                    a.cmp_stored(b),
                    cmp_stored(&joined(a), &joined(b)),
                    "{:?} vs {:?}",
                    joined(a),
                    joined(b)
                );
            }
        }
        // The greatest duplicate wins, whatever the order they came in (at
        // one version a tombstone's kind byte sorts after a value's).
        let dups = vec![
            StoredCopy::store(&key, 7, &Bytes::from_static(b"a")),
            StoredCopy::tombstone(&key, 7),
            StoredCopy::store(&key, 7, &Bytes::from_static(b"b")),
        ];
        let ops = greatest_per_key(dups);
        assert_eq!(ops.len(), 1);
        let BatchOp::PutParts { head, body, .. } = &ops[0] else {
            panic!("a store")
        };
        let won = [&head[..], &body[..]].concat();
        assert_eq!(won, encode_tombstone(7).to_vec());
    }

    /// The engine keeps exactly the versioned header after its magic as a
    /// value's tag, which `version_of_tag` decodes.
    #[test]
    fn engine_tags_are_versioned_headers() {
        assert_eq!(engine::TAG_MAGIC, protocol::versioned::MAGIC);
        assert_eq!(engine::TAG_LEN, protocol::versioned::HEADER_LEN - 1);
    }
}
