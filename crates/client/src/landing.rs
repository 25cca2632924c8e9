//! Values a node on this machine writes into the process's shared memory
//! instead of its reply (`MGETSHM`; the read side of [`crate::shm`]).
//!
//! A caller that knows about how long the values it reads are (the block
//! adapter: a chunk) asks for them with a [`SIZED_MGET`] request. When
//! they come to at least [`MIN_LANDING`] bytes, on a connection whose node
//! can write the arena (it answered `SHMATTACH` with `+OK MGETSHM`), the
//! connection reserves a range of the arena for them and sends `MGETSHM
//! offset capacity key ...`; the node puts each long value into the range,
//! in order (read there straight from its device, or copied), and answers
//! it with its length. The connection turns that reply back into `MGET`'s
//! (the values as `Bytes` that borrow the arena), so callers see an `MGET`
//! reply either way. Otherwise the request goes out as a plain `MGET`.
//!
//! Contract (on top of [`crate::shm`]'s):
//! - A [`Landed`] range is written by the node only until it replies; its
//!   block is pinned on the connection like a `VSETSHM` value's, so a
//!   connection dropped with the request unanswered leaks the block (the
//!   node may still write it) and it is never reused.
//! - After the reply the range is the client's: the values are slices of
//!   it, and its block is free again once the last of them is dropped.
//! - A reply that names bytes outside the range is a protocol error, never
//!   a read of memory the range does not own.

use std::sync::Arc;

use bytes::Bytes;
use protocol::shm::{Placement, LANDED_ALIGN, MIN_LANDED};
use protocol::Reply;

use crate::shm::{Arena, Pin};

/// The request a caller sends for a multi-get whose values are about
/// `value_len` bytes each: `MGET~SIZED value_len key ...`. Only a
/// connection sends it on, as `MGETSHM` or `MGET` (a node that saw it
/// would answer "unknown command").
pub(crate) const SIZED_MGET: &[u8] = b"MGET~SIZED";
/// A multi-get lands its values only when they are expected to take at
/// least this much: random 8 KiB block reads (two 4 KiB chunks) ran about
/// a tenth slower landed than copied (session 47 in `bench/RESULTS.md`).
const MIN_LANDING: usize = 64 << 10;

/// A range of the arena a node writes an `MGETSHM`'s values into.
pub(crate) struct Landed {
    arena: &'static Arena,
    block: usize,
    /// Offset of the range in the arena (what the node is told).
    start: usize,
    capacity: usize,
}

impl Drop for Landed {
    fn drop(&mut self) {
        self.arena.release(self.block);
    }
}

/// A landed value, as the owner of a `Bytes`.
struct Value {
    range: Arc<Landed>,
    at: usize,
    len: usize,
}

impl AsRef<[u8]> for Value {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `at + len <= capacity` (checked in `Landed::values`); the
        // range lies in the arena's mapping, which lives as long as the
        // process, and the node no longer writes it (it replied).
        unsafe {
            std::slice::from_raw_parts(
                self.range.arena.base().add(self.range.start + self.at),
                self.len,
            )
        }
    }
}

/// A [`SIZED_MGET`] as it goes out, and where its values land.
pub(crate) struct Rewritten {
    /// `MGETSHM offset capacity` or `MGET`: what replaces the request's
    /// first two arguments.
    head: Vec<Vec<u8>>,
    /// Where the values land (`None`: a plain `MGET`).
    pub(crate) landed: Option<Arc<Landed>>,
}

impl Rewritten {
    /// The request's arguments as sent, over the original ones.
    pub(crate) fn args<'a, A: AsRef<[u8]>>(&'a self, original: &'a [A]) -> Vec<&'a [u8]> {
        let mut out: Vec<&[u8]> = Vec::with_capacity(self.head.len() + original.len());
        out.extend(self.head.iter().map(|h| &h[..]));
        out.extend(original.iter().skip(2).map(|a| a.as_ref()));
        out
    }
}

/// `None` if `req` is not a [`SIZED_MGET`]; for one, how it goes out:
/// as `MGETSHM offset capacity key ...`, its range reserved and pinned
/// into `pins`, when `arena` (the arena, if a node that can write it
/// attached it) has room, else as `MGET key ...`.
pub(crate) fn rewrite<A: AsRef<[u8]>>(
    arena: Option<&'static Arena>,
    req: &[A],
    pins: &mut Vec<Pin>,
) -> Option<Rewritten> {
    // Even one without keys goes out as an `MGET` (whose error names it):
    // the pseudo-command itself never reaches a node.
    if req.first().map(|a| a.as_ref()) != Some(SIZED_MGET) || req.len() < 2 {
        return None;
    }
    let keys = req.len() - 2;
    let per_value = std::str::from_utf8(req[1].as_ref())
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n >= MIN_LANDED)
        .map(|n| n.next_multiple_of(LANDED_ALIGN));
    let landed = per_value
        .and_then(|v| v.checked_mul(keys))
        .filter(|&capacity| capacity >= MIN_LANDING)
        .zip(arena)
        .and_then(|(capacity, arena)| {
            let (block, start) = arena.reserve(capacity)?;
            pins.push(arena.pin_block(block));
            Some(Arc::new(Landed {
                arena,
                block,
                start,
                capacity,
            }))
        });
    let head: Vec<Vec<u8>> = match &landed {
        Some(r) => vec![
            b"MGETSHM".to_vec(),
            r.start.to_string().into_bytes(),
            r.capacity.to_string().into_bytes(),
        ],
        None => vec![b"MGET".to_vec()],
    };
    Some(Rewritten { head, landed })
}

impl Landed {
    /// `reply` to this range's `MGETSHM` as the `MGET` reply it stands
    /// for: each length the node answered becomes the value it wrote,
    /// found where [`Placement`] puts it after the lengths before it.
    pub(crate) fn values(self: &Arc<Self>, reply: Reply) -> Reply {
        let Reply::Array(items) = reply else {
            return reply;
        };
        let mut placement = Placement::new(self.capacity);
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Reply::Integer(n) => {
                    let len = usize::try_from(n).unwrap_or(usize::MAX);
                    let Some(at) = placement.place(len) else {
                        return Reply::Error(format!(
                            "ERR MGETSHM reply names a value of {len} bytes that does not land in its {}-byte range",
                            self.capacity
                        ));
                    };
                    out.push(Reply::Bulk(Bytes::from_owner(Value {
                        range: self.clone(),
                        at,
                        len,
                    })));
                }
                other => out.push(other),
            }
        }
        Reply::Array(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::BLOCK;

    /// `MGET~SIZED value_len key ...` for `keys`.
    fn sized_mget<'a>(value_len: &'a [u8], keys: &[&'a [u8]]) -> Vec<&'a [u8]> {
        [&[SIZED_MGET, value_len][..], keys].concat()
    }

    fn arena(blocks: usize) -> &'static Arena {
        Box::leak(Box::new(Arena::new(blocks).expect("memfd")))
    }

    /// What a node does with an `MGETSHM` (server::shm::Landing::land).
    fn node_lands(
        arena: &Arena,
        offset: usize,
        capacity: usize,
        values: &[Option<Vec<u8>>],
    ) -> Reply {
        let mut placement = Placement::new(capacity);
        Reply::Array(
            values
                .iter()
                .map(|v| match v {
                    None => Reply::Null,
                    Some(v) => match placement.place(v.len()) {
                        Some(at) => {
                            // SAFETY: inside the test's arena range.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    v.as_ptr(),
                                    arena.base().add(offset + at),
                                    v.len(),
                                )
                            };
                            Reply::Integer(v.len() as i64)
                        }
                        None => Reply::Bulk(Bytes::from(v.clone())),
                    },
                })
                .collect(),
        )
    }

    fn arg(args: &[&[u8]], i: usize) -> usize {
        std::str::from_utf8(args[i]).unwrap().parse().unwrap()
    }

    #[test]
    fn landed_values_come_back_as_an_mget_reply() {
        let a = arena(2);
        let mut pins = Vec::new();
        let keys: Vec<&[u8]> = vec![&b"k"[..]; 16];
        let req = sized_mget(b"4106", &keys);
        let rw = rewrite(Some(a), &req, &mut pins).expect("a sized MGET");
        let (head, range) = (rw.args(&req), rw.landed.clone().expect("room in the arena"));
        assert_eq!(head[0], b"MGETSHM");
        assert_eq!(&head[3..], &req[2..]);
        let (offset, capacity) = (arg(&head, 1), arg(&head, 2));
        assert_eq!(capacity, 16 * 4608);
        assert_eq!(pins.len(), 1);
        let mut values = vec![
            Some(vec![1u8; 4106]),
            None,
            Some(b"tiny".to_vec()),
            Some(vec![4u8; 4000]),
        ];
        values.extend((0..12).map(|i| Some(vec![i as u8; 4106])));
        let reply = range.values(node_lands(a, offset, capacity, &values));
        let Reply::Array(items) = reply else {
            panic!("an array")
        };
        let got: Vec<Option<Vec<u8>>> = items
            .into_iter()
            .map(|r| match r {
                Reply::Bulk(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(got, values);
    }

    #[test]
    fn the_block_is_reused_only_after_the_reply_and_the_values() {
        let a = arena(1);
        let mut pins = Vec::new();
        let req = sized_mget(b"65536", &[b"a"]);
        let rw = rewrite(Some(a), &req, &mut pins).expect("sized");
        let (offset, capacity) = (arg(&rw.args(&req), 1), arg(&rw.args(&req), 2));
        let range = rw.landed.clone().expect("room");
        drop(rw);
        let reply = node_lands(a, offset, capacity, &[Some(vec![5u8; 65536])]);
        let Reply::Array(mut items) = range.values(reply) else {
            panic!()
        };
        drop(range);
        pins.clear(); // the connection read every reply
        let Some(Reply::Bulk(v)) = items.pop() else {
            panic!()
        };
        // A whole block is to be had only when nothing but the arena's
        // cursor holds it.
        let whole_block = || crate::shm::Payload::in_arena(Some(a), BLOCK);
        assert!(!whole_block().is_shared(), "the value holds the block");
        assert!(v.iter().all(|&b| b == 5));
        drop(v);
        assert!(whole_block().is_shared(), "nothing holds it");
        // A connection that dropped with the request unanswered leaks it.
        drop(rewrite(Some(a), &req, &mut pins).expect("sized"));
        std::mem::forget(std::mem::take(&mut pins));
        assert!(!whole_block().is_shared(), "leaked for good");
    }

    #[test]
    fn without_room_or_a_writing_node_it_is_a_plain_mget() {
        let a = arena(1);
        let mut pins = Vec::new();
        let req = sized_mget(b"4096", &[b"a", b"b"]);
        let rw = rewrite(None, &req, &mut pins).expect("sized");
        assert_eq!(rw.args(&req), [&b"MGET"[..], b"a", b"b"]);
        assert!(rw.landed.is_none() && pins.is_empty());
        // More than a block.
        let keys: Vec<&[u8]> = vec![&b"k"[..]; BLOCK / 4096 + 1];
        let req = sized_mget(b"4096", &keys);
        let rw = rewrite(Some(a), &req, &mut pins).expect("sized");
        assert_eq!(rw.args(&req)[0], b"MGET");
        assert!(rw.landed.is_none());
        // Short values are not worth landing, nor a few (8 KiB) in all.
        let req = sized_mget(b"100", &[b"a"]);
        let rw = rewrite(Some(a), &req, &mut pins).expect("sized");
        assert_eq!(rw.args(&req), [&b"MGET"[..], b"a"]);
        let req = sized_mget(b"4096", &[b"a", b"b"]);
        let rw = rewrite(Some(a), &req, &mut pins).expect("sized");
        assert_eq!(rw.args(&req), [&b"MGET"[..], b"a", b"b"]);
        assert!(rewrite(Some(a), &[&b"MGET"[..], b"a"], &mut pins).is_none());
        let req = sized_mget(b"4096", &[]);
        let rw = rewrite(Some(a), &req, &mut pins).expect("sized");
        assert_eq!(rw.args(&req), [&b"MGET"[..]]);
    }

    #[test]
    fn a_reply_naming_bytes_past_the_range_is_an_error() {
        let a = arena(1);
        let mut pins = Vec::new();
        let req = sized_mget(b"65536", &[b"a"]);
        let range = rewrite(Some(a), &req, &mut pins)
            .expect("sized")
            .landed
            .expect("room");
        let bad = Reply::Array(vec![Reply::Integer(65537)]);
        assert!(matches!(range.values(bad), Reply::Error(_)));
        let bad = Reply::Array(vec![Reply::Integer(-1)]);
        assert!(matches!(range.values(bad), Reply::Error(_)));
        let e = Reply::Error("ERR reply too large".into());
        assert_eq!(range.values(e.clone()), e);
    }
}
