//! The client side of RESP: encoding requests and decoding replies.
//!
//! [`decode_reply`] parses one reply from the front of a buffer, or reports
//! that more bytes are needed. It accepts RESP2 and RESP3 types and bounds
//! every length and the nesting depth, so a misbehaving server cannot make a
//! client allocate without limit or recurse without end.

use bytes::{Bytes, BytesMut};

use crate::Reply;

/// Largest bulk string a reply may carry (Redis's own ceiling, 512 MiB).
pub const MAX_REPLY_BULK: usize = 512 << 20;
/// Largest number of elements of one aggregate reply.
pub const MAX_REPLY_ELEMENTS: usize = 1 << 24;
/// Deepest nesting of aggregate replies.
pub const MAX_REPLY_DEPTH: usize = 32;

/// A reply the client cannot parse; the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed reply: {0}")]
pub struct ReplyError(pub String);

/// Where a request is encoded: a byte buffer, or a writer that keeps long
/// arguments where they lie (the cluster client's vectored writes).
pub trait RequestSink<'a> {
    /// Appends `b` (RESP framing).
    fn put(&mut self, b: &[u8]);
    /// Appends an argument's bytes (a sink may keep a reference instead of
    /// copying them).
    fn put_arg(&mut self, arg: &'a [u8]) {
        self.put(arg);
    }
}

impl RequestSink<'_> for BytesMut {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Appends `args` as a RESP multibulk request to `out`.
pub fn encode_request<'a, A: AsRef<[u8]>>(args: &'a [A], out: &mut impl RequestSink<'a>) {
    put_header(out, b'*', args.len());
    for a in args {
        let a = a.as_ref();
        put_header(out, b'$', a.len());
        out.put_arg(a);
        out.put(b"\r\n");
    }
}

/// `tag`, `n` in decimal, CRLF.
fn put_header<'a>(out: &mut impl RequestSink<'a>, tag: u8, n: usize) {
    out.put(crate::reply::Header::new(tag, n).as_bytes());
}

/// Decodes one reply from the front of `buf`: `Ok(Some((reply, consumed)))`,
/// `Ok(None)` when `buf` holds only part of a reply, or an error when the
/// bytes are not RESP. Bulk strings are sliced out of `buf` without copying.
pub fn decode_reply(buf: &Bytes) -> Result<Option<(Reply, usize)>, ReplyError> {
    let mut pos = 0;
    match parse(buf, &mut pos, 0)? {
        Some(r) => Ok(Some((r, pos))),
        None => Ok(None),
    }
}

/// A guess at how many bytes the reply starting at the front of `buf` (not
/// yet whole) takes, for a reader sizing its buffer once instead of growing
/// it read by read: exact for a bulk string, and for an array whose
/// elements are bulk strings of the first one's length (a multi-get of
/// equal-sized values). `None` when the front says too little (the caller
/// grows its buffer as usual). Only a hint: the bytes come from the peer.
pub fn reply_size_hint(buf: &[u8]) -> Option<usize> {
    let mut pos = 0;
    let head = line(buf, &mut pos).ok()??;
    let (&tag, count) = head.split_first()?;
    let count = usize::try_from(number(count).ok()?).ok()?;
    let bulk = |len: usize| 1 + len.checked_ilog10().unwrap_or(0) as usize + 1 + 2 + len + 2;
    match tag {
        b'$' => pos.checked_add(count)?.checked_add(2),
        b'*' => {
            let first = line(buf, &mut pos).ok()??;
            let len = usize::try_from(number(first.strip_prefix(b"$")?).ok()?).ok()?;
            (head.len() + 2).checked_add(count.checked_mul(bulk(len))?)
        }
        _ => None,
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> ReplyError {
    ReplyError(msg.into())
}

/// The line starting at `*pos` (without CRLF), advancing past it.
pub(crate) fn line<'a>(buf: &'a [u8], pos: &mut usize) -> Result<Option<&'a [u8]>, ReplyError> {
    let rest = &buf[*pos..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(i) => {
            *pos += i + 2;
            Ok(Some(&rest[..i]))
        }
        None if rest.len() > 64 * 1024 => Err(bad("line without CRLF")),
        None => Ok(None),
    }
}

pub(crate) fn number(text: &[u8]) -> Result<i64, ReplyError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad number {:?}", String::from_utf8_lossy(text))))
}

/// A RESP3 double's text.
pub(crate) fn double(text: &[u8]) -> Result<f64, ReplyError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad double"))
}

/// The length of a bulk-like reply (`$`, `=`, `!`) from its header line:
/// `None` for RESP2's null bulk (`$-1`).
pub(crate) fn bulk_len(tag: u8, head: &[u8]) -> Result<Option<usize>, ReplyError> {
    let n = number(head)?;
    if n == -1 && tag == b'$' {
        return Ok(None);
    }
    let n = usize::try_from(n).map_err(|_| bad("negative bulk length"))?;
    if n > MAX_REPLY_BULK {
        return Err(bad(format!("bulk of {n} bytes is over the limit")));
    }
    Ok(Some(n))
}

/// The elements of an aggregate reply (`*`, `~`, `>`, `%`; a map's pairs
/// count twice) from its header line: `None` for RESP2's null array
/// (`*-1`).
pub(crate) fn aggregate_items(tag: u8, head: &[u8]) -> Result<Option<usize>, ReplyError> {
    let n = number(head)?;
    if n == -1 && tag == b'*' {
        return Ok(None);
    }
    let n = usize::try_from(n).map_err(|_| bad("negative aggregate length"))?;
    let items = if tag == b'%' { n.saturating_mul(2) } else { n };
    if items > MAX_REPLY_ELEMENTS {
        return Err(bad(format!(
            "aggregate of {items} elements is over the limit"
        )));
    }
    Ok(Some(items))
}

/// Whether `tag` starts a reply of one line (its header is all of it).
pub(crate) fn is_simple(tag: u8) -> bool {
    matches!(tag, b'+' | b'-' | b':' | b'(' | b',' | b'#' | b'_')
}

/// Whether `tag` starts an aggregate reply.
pub(crate) fn is_aggregate(tag: u8) -> bool {
    matches!(tag, b'*' | b'~' | b'>' | b'%')
}

/// Whether `tag` starts a bulk-like reply.
pub(crate) fn is_bulk(tag: u8) -> bool {
    matches!(tag, b'$' | b'=' | b'!')
}

fn text(t: &[u8]) -> String {
    String::from_utf8_lossy(t).into_owned()
}

fn parse(buf: &Bytes, pos: &mut usize, depth: usize) -> Result<Option<Reply>, ReplyError> {
    if depth > MAX_REPLY_DEPTH {
        return Err(bad("replies nested too deeply"));
    }
    let Some(&tag) = buf.get(*pos) else {
        return Ok(None);
    };
    let start = *pos;
    *pos += 1;
    let Some(head) = line(buf, pos)? else {
        *pos = start;
        return Ok(None);
    };
    let reply = match tag {
        b'+' => Reply::Status(text(head)),
        b'-' => Reply::Error(text(head)),
        b':' => Reply::Integer(number(head)?),
        b'(' => Reply::Status(text(head)),
        b',' => Reply::Double(double(head)?),
        b'#' => Reply::Integer(i64::from(head == b"t")),
        b'_' => Reply::Null,
        b'$' | b'=' | b'!' => {
            let Some(n) = bulk_len(tag, head)? else {
                return Ok(Some(Reply::Null));
            };
            if buf.len() < *pos + n + 2 {
                *pos = start;
                return Ok(None);
            }
            if &buf[*pos + n..*pos + n + 2] != b"\r\n" {
                return Err(bad("bulk string not terminated by CRLF"));
            }
            let body = buf.slice(*pos..*pos + n);
            *pos += n + 2;
            match tag {
                b'$' => Reply::Bulk(body),
                b'!' => Reply::Error(text(&body)),
                // Verbatim text starts with a 3-letter format and ':'.
                _ => Reply::Verbatim(text(body.get(4..).unwrap_or_default())),
            }
        }
        b'*' | b'~' | b'>' | b'%' => {
            let Some(items) = aggregate_items(tag, head)? else {
                return Ok(Some(Reply::NullArray));
            };
            let mut out = Vec::with_capacity(items.min(1024));
            for _ in 0..items {
                match parse(buf, pos, depth + 1)? {
                    Some(r) => out.push(r),
                    None => {
                        *pos = start;
                        return Ok(None);
                    }
                }
            }
            if tag == b'%' {
                let mut pairs = Vec::with_capacity(items / 2);
                let mut it = out.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Reply::Map(pairs)
            } else {
                Reply::Array(out)
            }
        }
        other => return Err(bad(format!("unknown reply type byte 0x{other:02x}"))),
    };
    Ok(Some(reply))
}

#[cfg(test)]
pub(crate) mod tests {

    #[test]
    fn size_hints_match_whole_replies_of_equal_values() {
        let whole = b"*3\r\n$4\r\nabcd\r\n$4\r\nefgh\r\n$4\r\nijkl\r\n";
        for cut in 9..whole.len() {
            assert_eq!(
                reply_size_hint(&whole[..cut]),
                Some(whole.len()),
                "cut {cut}"
            );
        }
        let big = format!("*2\r\n$4096\r\n{}\r\n$4096\r\n", "x".repeat(4096));
        assert_eq!(reply_size_hint(big.as_bytes()), Some(big.len() + 4096 + 2));
        assert_eq!(reply_size_hint(b"$5\r\nhel"), Some(11));
        assert_eq!(reply_size_hint(b"$0\r\n"), Some(6));
        for partial in [
            &b"*3\r\n"[..],
            b"*3",
            b"+OK\r\n",
            b"*2\r\n$-1\r\n",
            b"$-1\r\n",
            b"*x\r\n$1\r\n",
        ] {
            assert_eq!(reply_size_hint(partial), None, "{partial:?}");
        }
        assert_eq!(
            reply_size_hint(format!("*{}\r\n$9\r\n", usize::MAX).as_bytes()),
            None
        );
    }

    use super::*;
    use crate::RespVersion;

    fn roundtrip(r: Reply, v: RespVersion) -> Reply {
        let mut out = BytesMut::new();
        r.encode(v, &mut out);
        let bytes = out.freeze();
        let (back, used) = decode_reply(&bytes).expect("valid").expect("complete");
        assert_eq!(used, bytes.len());
        for cut in 0..bytes.len() {
            assert_eq!(decode_reply(&bytes.slice(..cut)), Ok(None), "prefix {cut}");
        }
        back
    }

    #[test]
    fn decodes_what_the_encoder_writes() {
        let nested = Reply::Array(vec![
            Reply::bulk(b"k\r\n\x00"),
            Reply::Integer(-7),
            Reply::Null,
            Reply::Array(vec![Reply::err("boom")]),
        ]);
        for v in [RespVersion::V2, RespVersion::V3] {
            assert_eq!(roundtrip(nested.clone(), v), nested);
            assert_eq!(roundtrip(Reply::ok(), v), Reply::Status("OK".into()));
        }
        let map = Reply::Map(vec![(Reply::bulk(b"a"), Reply::Integer(1))]);
        assert_eq!(roundtrip(map.clone(), RespVersion::V3), map);
        assert_eq!(
            roundtrip(map, RespVersion::V2),
            Reply::Array(vec![Reply::bulk(b"a"), Reply::Integer(1)])
        );
    }

    #[test]
    fn request_encoding_is_multibulk() {
        let mut out = BytesMut::new();
        encode_request(&[&b"SET"[..], b"k", b""], &mut out);
        assert_eq!(&out[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    /// Replies that can never decode (a bad type, a bad or oversized
    /// length, a bulk without its CRLF): the decoder and
    /// [`crate::ReplyScan`] both reject each.
    pub(crate) const MALFORMED: [&[u8]; 6] = [
        b"?x\r\n",
        b"$-5\r\n",
        b":12a\r\n",
        b"$99999999999\r\n",
        b"*99999999999\r\n",
        b"$1\r\nab\r\n",
    ];

    #[test]
    fn rejects_garbage_and_oversized_lengths() {
        for bad in MALFORMED {
            assert!(
                decode_reply(&Bytes::copy_from_slice(bad)).is_err(),
                "{bad:?}"
            );
        }
        let deep = Bytes::from("*1\r\n".repeat(MAX_REPLY_DEPTH + 2));
        assert!(decode_reply(&deep).is_err());
    }
}
