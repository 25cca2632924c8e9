//! The node's reserved keys: one key range, `RESERVED..RESERVED_END`, where
//! the node keeps its own records (the hints of `hints.rs`) in the same
//! engine as user data, so they share its crash safety and space.
//!
//! Clients never see or write that range: a write command naming a key in
//! it is refused, and every range read (`SCAN`, `RANGE`, `DBSIZE`) skips
//! it, so user keys on both sides of it still read in order.

use bytes::Bytes;

use crate::cmd::Cmd;

/// First key of the reserved range (and the prefix of every key in it).
pub const RESERVED: &[u8] = b"\xff\xff\xff\xfflightstore/";
/// First key after the reserved range.
const RESERVED_END: &[u8] = b"\xff\xff\xff\xfflightstore0";

/// Whether `key` lies in the reserved range.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED)
}

/// The first reserved key a command names, if any (`args[0]` is the
/// command; arities were checked): writes, point reads and HINT.
pub fn reserved_key_in_write(cmd: Cmd, args: &[Bytes]) -> Option<&Bytes> {
    let (first, step) = match cmd {
        Cmd::Set | Cmd::Get | Cmd::Strlen | Cmd::Getrange | Cmd::Vcas => {
            return args.get(1).filter(|k| is_reserved(k))
        }
        Cmd::Mset => (1, 2),
        Cmd::Del | Cmd::Mget | Cmd::Exists | Cmd::Vmeta => (1, 1),
        Cmd::Vset => (1, 3),
        Cmd::Vdel => (1, 2),
        Cmd::Vbatch => (1, 4),
        Cmd::Hint => (2, 2),
        _ => return None,
    };
    args.iter()
        .skip(first)
        .step_by(step)
        .find(|k| is_reserved(k))
}

/// The parts of the user range `[start, end)` (empty `end`: unbounded)
/// outside the reserved range, in key order: one or two ranges, or none.
pub fn visible_parts(start: &[u8], end: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let below_end: &[u8] = if end.is_empty() || end > RESERVED {
        RESERVED
    } else {
        end
    };
    let mut parts = Vec::with_capacity(2);
    if start < below_end {
        parts.push((start.to_vec(), below_end.to_vec()));
    }
    let above_start = start.max(RESERVED_END);
    if end.is_empty() || above_start < end {
        parts.push((above_start.to_vec(), end.to_vec()));
    }
    parts
}

/// Runs a bounded range read over the visible parts of `[start, end)`:
/// `read(start, end, limit)` is called per part with what is left of
/// `limit`, and the results are joined in key order.
pub fn read_visible<T, E>(
    start: &[u8],
    end: &[u8],
    limit: usize,
    mut read: impl FnMut(&[u8], &[u8], usize) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, E> {
    let mut out = Vec::new();
    for (s, e) in visible_parts(start, end) {
        if out.len() >= limit {
            break;
        }
        out.extend(read(&s, &e, limit - out.len())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: &[u8] = RESERVED;

    fn key(tail: &[u8]) -> Vec<u8> {
        [R, tail].concat()
    }

    #[test]
    fn the_reserved_range_is_cut_out_of_user_ranges() {
        let all = visible_parts(b"", b"");
        assert_eq!(
            all,
            vec![
                (Vec::new(), R.to_vec()),
                (RESERVED_END.to_vec(), Vec::new())
            ]
        );
        assert_eq!(
            visible_parts(b"a", b"b"),
            vec![(b"a".to_vec(), b"b".to_vec())]
        );
        assert_eq!(
            visible_parts(&key(b"x"), b""),
            vec![(RESERVED_END.to_vec(), Vec::new())]
        );
        assert_eq!(visible_parts(&key(b"x"), &key(b"y")), vec![]);
        let after = [RESERVED_END, b"z"].concat();
        assert_eq!(
            visible_parts(&after, b""),
            vec![(after.clone(), Vec::new())]
        );
        for (s, e) in visible_parts(b"", b"") {
            assert!(!is_reserved(&s));
            assert!(e.is_empty() || e.as_slice() <= R);
        }
    }

    #[test]
    fn writes_naming_a_reserved_key_are_found() {
        let b = |v: &[&[u8]]| {
            v.iter()
                .map(|x| Bytes::copy_from_slice(x))
                .collect::<Vec<_>>()
        };
        let hint = key(b"hint/x");
        assert!(reserved_key_in_write(Cmd::Set, &b(&[b"SET", &hint, b"v"])).is_some());
        assert!(reserved_key_in_write(Cmd::Set, &b(&[b"SET", b"k", &hint])).is_none());
        assert!(
            reserved_key_in_write(Cmd::Mset, &b(&[b"MSET", b"a", &hint, &hint, b"v"])).is_some()
        );
        assert!(reserved_key_in_write(Cmd::Mset, &b(&[b"MSET", b"a", &hint])).is_none());
        assert!(reserved_key_in_write(Cmd::Vset, &b(&[b"VSET", b"a", b"1", &hint])).is_none());
        assert!(
            reserved_key_in_write(Cmd::Vdel, &b(&[b"VDEL", b"a", b"1", &hint, b"2"])).is_some()
        );
        assert!(reserved_key_in_write(
            Cmd::Vbatch,
            &b(&[b"VBATCH", b"a", b"1", b"DEL", b"", &hint, b"2", b"SET", b"v"])
        )
        .is_some());
        assert!(reserved_key_in_write(Cmd::Del, &b(&[b"DEL", b"a", &hint])).is_some());
        assert!(reserved_key_in_write(Cmd::Get, &b(&[b"GET", &hint])).is_some());
        assert!(reserved_key_in_write(Cmd::Mget, &b(&[b"MGET", b"a", &hint])).is_some());
        assert!(reserved_key_in_write(Cmd::Hint, &b(&[b"HINT", b"h:1", &hint, b"1"])).is_some());
        assert!(reserved_key_in_write(Cmd::Hint, &b(&[b"HINT", b"h:1", b"k", b"1"])).is_none());
    }
}
