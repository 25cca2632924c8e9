//! Replies and their encoding in RESP2 or RESP3 (chosen per connection by
//! `HELLO`). RESP3-only types degrade to their RESP2 equivalents: maps to
//! flat arrays, nulls to the null bulk string, doubles to bulk strings.

use bytes::{Bytes, BytesMut};

/// Protocol version of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RespVersion {
    /// RESP2 (the default until `HELLO 3`).
    #[default]
    V2,
    /// RESP3.
    V3,
}

/// A reply to a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Simple(&'static str),
    /// A simple string built at run time.
    Status(String),
    /// `-ERR ...` (the text includes the error code word).
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc`.
    Bulk(Bytes),
    /// Null (`$-1` in RESP2, `_` in RESP3).
    Null,
    /// `*N` followed by N replies.
    Array(Vec<Reply>),
    /// Null array (`*-1` in RESP2, `_` in RESP3).
    NullArray,
    /// A map (`%N` in RESP3, a flat array in RESP2).
    Map(Vec<(Reply, Reply)>),
    /// A double (`,1.5` in RESP3, a bulk string in RESP2).
    Double(f64),
    /// Verbatim text (`=` in RESP3, a bulk string in RESP2), e.g. INFO.
    Verbatim(String),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    /// `-ERR msg`.
    pub fn err(msg: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {msg}"))
    }

    /// A bulk string copied from bytes.
    pub fn bulk(b: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(b.as_ref()))
    }

    /// Appends the encoding of this reply to `out`.
    pub fn encode(&self, v: RespVersion, out: &mut impl Sink) {
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Status(s) => line(out, b'+', clean(s).as_bytes()),
            Reply::Error(s) => line(out, b'-', clean(s).as_bytes()),
            Reply::Integer(i) => out.put(Header::new(b':', *i).as_bytes()),
            Reply::Bulk(b) => {
                out.put(Header::new(b'$', b.len()).as_bytes());
                out.put_value(b);
                out.put(b"\r\n");
            }
            Reply::Null => match v {
                RespVersion::V2 => out.put(b"$-1\r\n"),
                RespVersion::V3 => out.put(b"_\r\n"),
            },
            Reply::NullArray => match v {
                RespVersion::V2 => out.put(b"*-1\r\n"),
                RespVersion::V3 => out.put(b"_\r\n"),
            },
            Reply::Array(items) => {
                out.put(Header::new(b'*', items.len()).as_bytes());
                for r in items {
                    r.encode(v, out);
                }
            }
            Reply::Map(pairs) => {
                match v {
                    RespVersion::V2 => out.put(Header::new(b'*', 2 * pairs.len()).as_bytes()),
                    RespVersion::V3 => out.put(Header::new(b'%', pairs.len()).as_bytes()),
                }
                for (k, val) in pairs {
                    k.encode(v, out);
                    val.encode(v, out);
                }
            }
            Reply::Double(d) => {
                let s = if d.is_finite() {
                    format!("{d}")
                } else if *d > 0.0 {
                    "inf".into()
                } else if *d < 0.0 {
                    "-inf".into()
                } else {
                    "nan".into()
                };
                match v {
                    RespVersion::V2 => bulk(out, s.as_bytes()),
                    RespVersion::V3 => line(out, b',', s.as_bytes()),
                }
            }
            Reply::Verbatim(text) => match v {
                RespVersion::V2 => bulk(out, text.as_bytes()),
                RespVersion::V3 => {
                    out.put(Header::new(b'=', text.len() + 4).as_bytes());
                    out.put(b"txt:");
                    out.put(text.as_bytes());
                    out.put(b"\r\n");
                }
            },
        }
    }
}

/// Where a reply is encoded: a byte buffer, or a [`crate::Wire`] that
/// keeps large values where they are.
pub trait Sink {
    /// Appends `b`.
    fn put(&mut self, b: &[u8]);
    /// Appends a bulk string's bytes (a sink may keep a reference instead
    /// of copying them).
    fn put_value(&mut self, b: &Bytes) {
        self.put(b);
    }
}

impl Sink for BytesMut {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// A RESP header line: a type byte, a number in decimal, CRLF, formatted
/// on the stack (a `to_string` per header was an allocation per value of
/// every reply and request).
pub(crate) struct Header {
    bytes: [u8; Header::MAX],
    len: usize,
}

impl Header {
    /// The type byte, the longest number itoa writes (a 128-bit one: a
    /// sign and 39 digits), CRLF.
    const MAX: usize = 43;

    pub(crate) fn new(tag: u8, n: impl itoa::Integer) -> Header {
        let mut digits = itoa::Buffer::new();
        let d = digits.format(n).as_bytes();
        let mut bytes = [0u8; Header::MAX];
        bytes[0] = tag;
        bytes[1..1 + d.len()].copy_from_slice(d);
        bytes[1 + d.len()..3 + d.len()].copy_from_slice(b"\r\n");
        Header {
            bytes,
            len: 3 + d.len(),
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn line(out: &mut impl Sink, tag: u8, body: &[u8]) {
    out.put(&[tag]);
    out.put(body);
    out.put(b"\r\n");
}

fn bulk(out: &mut impl Sink, b: &[u8]) {
    out.put(Header::new(b'$', b.len()).as_bytes());
    out.put(b);
    out.put(b"\r\n");
}

/// Simple strings and errors may not contain CR or LF.
fn clean(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\r', '\n']) {
        std::borrow::Cow::Owned(s.replace(['\r', '\n'], " "))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: &Reply, v: RespVersion) -> Vec<u8> {
        let mut b = BytesMut::new();
        r.encode(v, &mut b);
        b.to_vec()
    }

    #[test]
    fn encodings() {
        use RespVersion::*;
        assert_eq!(enc(&Reply::ok(), V2), b"+OK\r\n");
        assert_eq!(enc(&Reply::err("bad\r\nthing"), V2), b"-ERR bad  thing\r\n");
        assert_eq!(enc(&Reply::Integer(-3), V3), b":-3\r\n");
        assert_eq!(enc(&Reply::bulk("ab"), V2), b"$2\r\nab\r\n");
        assert_eq!(enc(&Reply::Null, V2), b"$-1\r\n");
        assert_eq!(enc(&Reply::Null, V3), b"_\r\n");
        let m = Reply::Map(vec![(Reply::bulk("k"), Reply::Integer(1))]);
        assert_eq!(enc(&m, V2), b"*2\r\n$1\r\nk\r\n:1\r\n");
        assert_eq!(enc(&m, V3), b"%1\r\n$1\r\nk\r\n:1\r\n");
        assert_eq!(enc(&Reply::Verbatim("hi".into()), V3), b"=6\r\ntxt:hi\r\n");
        assert_eq!(enc(&Reply::Double(1.5), V3), b",1.5\r\n");
    }
}
