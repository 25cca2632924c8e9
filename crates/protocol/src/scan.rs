//! Where a reply ends, found without decoding it: a reader that receives a
//! large reply over many reads asks after each read whether the reply is
//! whole yet, and [`ReplyScan`] answers by looking at the newly arrived
//! elements only. Decoding the partial reply after every read instead
//! walked (and sliced, and dropped) every element received so far each
//! time: a seventh of a block adapter's CPU in 1 MiB reads.
//!
//! Contract: [`ReplyScan::advance`] says a reply is whole exactly when
//! [`crate::decode_reply`] would decode it (or fail on it: a reply the scan
//! calls whole may still be malformed inside, which decoding then reports);
//! bytes that can never become a reply (an unknown type, a bad length, too
//! deep a nesting) are an error at once, so a reader never waits for more
//! bytes that cannot help.

use crate::decode::{
    aggregate_items, bad, bulk_len, double, is_aggregate, is_bulk, is_simple, line, number,
};
use crate::{ReplyError, MAX_REPLY_DEPTH};

/// Progress through one reply being received (see the module doc). Start a
/// new one for each reply.
#[derive(Debug, Default)]
pub struct ReplyScan {
    /// Bytes from the reply's start known to be its header and whole
    /// elements.
    done: usize,
    /// Elements of the top-level aggregate past `done` still to come;
    /// `None` until its header has arrived (or for a reply that is not an
    /// aggregate).
    left: Option<usize>,
}

impl ReplyScan {
    /// A scan of a reply not received yet.
    pub fn new() -> ReplyScan {
        ReplyScan::default()
    }

    /// Looks at `buf`, the bytes of the reply received so far from its
    /// start (each call with the bytes of the last one and maybe more):
    /// `Ok(Some(len))` when the reply is whole and takes `buf[..len]`,
    /// `Ok(None)` when more bytes are needed, an error when `buf` cannot
    /// start a reply.
    pub fn advance(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        let mut left = match self.left {
            Some(left) => left,
            None => {
                let Some(&tag) = buf.first() else {
                    return Ok(None);
                };
                if !is_aggregate(tag) {
                    let mut pos = 0;
                    return Ok(skip(buf, &mut pos, 0)?.map(|()| pos));
                }
                let mut pos = 1;
                let Some(head) = line(buf, &mut pos)? else {
                    return Ok(None);
                };
                let Some(items) = aggregate_items(tag, head)? else {
                    return Ok(Some(pos)); // a null array
                };
                self.done = pos;
                items
            }
        };
        while left > 0 {
            let mut pos = self.done;
            if skip(buf, &mut pos, 1)?.is_none() {
                break;
            }
            self.done = pos;
            left -= 1;
        }
        self.left = Some(left);
        Ok((left == 0).then_some(self.done))
    }
}

/// Moves `pos` past the whole reply starting there: `Some(())`, or `None`
/// (with `pos` where it was) when `buf` ends inside it. Checks what
/// [`crate::decode_reply`] checks to find the reply's end: types, lengths
/// and their limits, bulk terminators, nesting depth.
fn skip(buf: &[u8], pos: &mut usize, depth: usize) -> Result<Option<()>, ReplyError> {
    if depth > MAX_REPLY_DEPTH {
        return Err(bad("replies nested too deeply"));
    }
    let Some(&tag) = buf.get(*pos) else {
        return Ok(None);
    };
    if !(is_simple(tag) || is_bulk(tag) || is_aggregate(tag)) {
        return Err(bad(format!("unknown reply type byte 0x{tag:02x}")));
    }
    let start = *pos;
    *pos += 1;
    let Some(head) = line(buf, pos)? else {
        *pos = start;
        return Ok(None);
    };
    if is_simple(tag) {
        // What decoding checks of a one-line reply: its number.
        match tag {
            b':' => {
                number(head)?;
            }
            b',' => {
                double(head)?;
            }
            _ => {}
        }
        return Ok(Some(()));
    }
    if is_bulk(tag) {
        let Some(n) = bulk_len(tag, head)? else {
            return Ok(Some(())); // a null bulk
        };
        if buf.len() < *pos + n + 2 {
            *pos = start;
            return Ok(None);
        }
        if &buf[*pos + n..*pos + n + 2] != b"\r\n" {
            return Err(bad("bulk string not terminated by CRLF"));
        }
        *pos += n + 2;
        return Ok(Some(()));
    }
    let Some(items) = aggregate_items(tag, head)? else {
        return Ok(Some(())); // a null array
    };
    for _ in 0..items {
        if skip(buf, pos, depth + 1)?.is_none() {
            *pos = start;
            return Ok(None);
        }
    }
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;

    use super::*;
    use crate::{decode_reply, Reply, RespVersion};

    /// What decoding says of `buf`: whole (and its length), partial, or
    /// malformed.
    fn decoded(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        decode_reply(&Bytes::copy_from_slice(buf)).map(|r| r.map(|(_, used)| used))
    }

    /// Feeds `bytes` to one scan in pieces cut at `cuts`, checking each
    /// answer against decoding the same prefix.
    fn agrees_piecewise(bytes: &[u8], cuts: &[usize]) {
        let mut scan = ReplyScan::new();
        for &cut in cuts.iter().chain([&bytes.len()]) {
            let prefix = &bytes[..cut.min(bytes.len())];
            let scanned = scan.advance(prefix);
            match decoded(prefix) {
                Ok(Some(len)) => assert_eq!(scanned, Ok(Some(len)), "prefix {cut}"),
                Ok(None) => assert_eq!(scanned, Ok(None), "prefix {cut}"),
                Err(_) => {
                    // Malformed inside a reply the scan may call whole.
                    if let Ok(None) = scanned {
                        panic!("prefix {cut}: the scan waits for bytes that cannot help");
                    }
                    return;
                }
            }
        }
    }

    fn sample_replies() -> Vec<Reply> {
        let bulk = |n: usize| Reply::Bulk(Bytes::from(vec![b'x'; n]));
        vec![
            Reply::Status("OK".into()),
            Reply::Error("ERR no".into()),
            Reply::Integer(-7),
            Reply::Null,
            Reply::NullArray,
            bulk(0),
            bulk(5000),
            Reply::Array((0..64).map(|i| bulk(16 + i)).collect()),
            Reply::Array(vec![
                bulk(3),
                Reply::Null,
                Reply::Array(vec![Reply::Integer(1), bulk(2)]),
                Reply::Array(vec![]),
            ]),
            Reply::Map(vec![(bulk(1), Reply::Integer(2))]),
        ]
    }

    #[test]
    fn agrees_with_decoding_at_every_cut() {
        for r in sample_replies() {
            for v in [RespVersion::V2, RespVersion::V3] {
                let mut out = BytesMut::new();
                r.encode(v, &mut out);
                // Byte by byte, and in one piece with the next reply's
                // first bytes behind it.
                let cuts: Vec<usize> = (0..out.len()).collect();
                agrees_piecewise(&out, &cuts);
                let mut two = out.to_vec();
                two.extend_from_slice(b"*2\r\n$1");
                let mut scan = ReplyScan::new();
                assert_eq!(scan.advance(&two), Ok(Some(out.len())), "{r:?}");
            }
        }
    }

    #[test]
    fn bytes_that_cannot_become_a_reply_fail_at_once() {
        let more: [&[u8]; 3] = [
            // A bad type before its line is whole.
            b"*2\r\n$1\r\na\r\n?",
            // A bad number inside an aggregate still short of elements.
            b"*3\r\n:x\r\n:1\r\n",
            b"*3\r\n,x\r\n",
        ];
        for bad in crate::decode::tests::MALFORMED.into_iter().chain(more) {
            assert!(ReplyScan::new().advance(bad).is_err(), "{bad:?}");
        }
        let deep = "*1\r\n".repeat(MAX_REPLY_DEPTH + 2);
        assert!(ReplyScan::new().advance(deep.as_bytes()).is_err());
    }

    proptest! {
        #[test]
        fn never_waits_where_decoding_fails_or_finishes(
            bytes in proptest::collection::vec(
                prop_oneof![
                    Just(b'*'), Just(b'$'), Just(b':'), Just(b','), Just(b'\r'),
                    Just(b'\n'), Just(b'1'), Just(b'2'), Just(b'-'), Just(b'x'),
                ],
                0..40,
            ),
        ) {
            let mut scan = ReplyScan::new();
            for cut in 0..=bytes.len() {
                let scanned = scan.advance(&bytes[..cut]);
                if scanned.is_err() {
                    break; // a reader drops the connection here
                }
                let whole = matches!(scanned, Ok(Some(_)));
                match decoded(&bytes[..cut]) {
                    Ok(Some(len)) => prop_assert_eq!(scanned, Ok(Some(len)), "cut {}", cut),
                    Ok(None) => prop_assert_eq!(scanned, Ok(None), "cut {}", cut),
                    Err(_) => prop_assert!(whole, "cut {}: waits where decoding fails", cut),
                }
                if whole {
                    break;
                }
            }
        }

        #[test]
        fn agrees_with_decoding_in_random_pieces(
            which in 0usize..10,
            mut cuts in proptest::collection::vec(0usize..6000, 0..8),
            resp3 in any::<bool>(),
        ) {
            let r = &sample_replies()[which];
            let mut out = BytesMut::new();
            r.encode(if resp3 { RespVersion::V3 } else { RespVersion::V2 }, &mut out);
            cuts.sort_unstable();
            agrees_piecewise(&out, &cuts);
        }
    }
}
