//! The request parser. Requests are arrays of bulk strings
//! (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or inline lines (`GET k\r\n`, as typed
//! into telnet). The parser is incremental: it consumes complete elements
//! from the buffer as they arrive and keeps its place, so a request of 100k
//! arguments or a 64 MiB value is read in one pass, and each argument is a
//! `Bytes` split off the read buffer without copying.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::ProtocolError;

/// Hard limits on what one request may announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string (default 512 MiB, as Redis).
    pub max_bulk: usize,
    /// Most arguments in one request (default 1,048,576).
    pub max_args: usize,
    /// Longest inline command line (default 64 KiB).
    pub max_inline: usize,
    /// Most bytes of arguments in one request (default 1 GiB, as Redis's
    /// query buffer limit): bounds what one request makes the server hold
    /// before it can run, whatever its argument count.
    pub max_request: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 512 << 20,
            max_args: 1 << 20,
            max_inline: 64 << 10,
            max_request: 1 << 30,
        }
    }
}

/// Parses requests out of a connection's read buffer.
#[derive(Debug)]
pub struct RequestParser {
    limits: Limits,
    /// Arguments of the request in progress and how many it announced.
    args: Vec<Bytes>,
    expected: Option<usize>,
    /// Length of the bulk string whose header was consumed.
    bulk: Option<usize>,
    /// What the request in progress holds: its arguments read so far and
    /// the one announced in `bulk`, each with [`ARG_OVERHEAD`].
    held: usize,
}

/// Bytes counted per argument on top of its length (its `Bytes` handle), so
/// that a million empty arguments count as the 32 MiB of handles they are.
pub const ARG_OVERHEAD: usize = std::mem::size_of::<Bytes>();

/// Position of the first CRLF in `b`, if any.
fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// Parses a decimal length (optionally negative) from `line`.
fn parse_len(line: &[u8]) -> Option<i64> {
    if line.is_empty() || line.len() > 19 {
        return None;
    }
    std::str::from_utf8(line).ok()?.parse::<i64>().ok()
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        RequestParser {
            limits,
            args: Vec::new(),
            expected: None,
            bulk: None,
            held: 0,
        }
    }

    /// Replaces the limits; they apply from the next element parsed.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bytes the request in progress holds or has announced: its arguments
    /// read so far plus the whole length of the bulk string being read
    /// (each with [`ARG_OVERHEAD`]). Zero between requests.
    pub fn request_bytes(&self) -> usize {
        self.held
    }

    /// The part of [`RequestParser::request_bytes`] already read: the
    /// arguments parsed so far, without the bulk string being read.
    pub fn request_bytes_read(&self) -> usize {
        self.held - self.bulk.map_or(0, |n| n + ARG_OVERHEAD)
    }

    /// Bytes still missing from `buf` to complete the bulk string being
    /// read (with its CRLF), zero if none is pending.
    pub fn bulk_missing(&self, buf: &BytesMut) -> usize {
        self.bulk.map_or(0, |n| (n + 2).saturating_sub(buf.len()))
    }

    /// The next complete request, `Ok(None)` if more bytes are needed. Empty
    /// requests (`*0`, blank inline lines) are skipped.
    pub fn next_request(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            if self.expected.is_none() {
                if buf.is_empty() {
                    return Ok(None);
                }
                if buf[0] != b'*' {
                    match self.inline(buf)? {
                        Some(args) if args.is_empty() => continue,
                        other => return Ok(other),
                    }
                }
                let Some(end) = find_crlf(buf) else {
                    if buf.len() > self.limits.max_inline {
                        return Err(ProtocolError::InvalidMultibulkLength);
                    }
                    return Ok(None);
                };
                let n = parse_len(&buf[1..end]).ok_or(ProtocolError::InvalidMultibulkLength)?;
                buf.advance(end + 2);
                if n <= 0 {
                    continue; // *0 and *-1: nothing to do
                }
                let n = n as usize;
                if n > self.limits.max_args {
                    return Err(ProtocolError::TooManyArguments {
                        count: n,
                        max: self.limits.max_args,
                    });
                }
                self.expected = Some(n);
                self.args = Vec::with_capacity(n.min(1024));
            }
            let expected = self.expected.unwrap_or(0);
            while self.args.len() < expected {
                if !self.next_bulk(buf)? {
                    return Ok(None);
                }
            }
            self.expected = None;
            self.held = 0;
            return Ok(Some(std::mem::take(&mut self.args)));
        }
    }

    /// Consumes one bulk string into `args`; false if incomplete.
    fn next_bulk(&mut self, buf: &mut BytesMut) -> Result<bool, ProtocolError> {
        let len = match self.bulk {
            Some(len) => len,
            None => {
                let Some(&first) = buf.first() else {
                    return Ok(false);
                };
                if first != b'$' {
                    return Err(ProtocolError::ExpectedBulk(first as char));
                }
                let Some(end) = find_crlf(buf) else {
                    if buf.len() > 32 {
                        return Err(ProtocolError::InvalidBulkLength);
                    }
                    return Ok(false);
                };
                let n = parse_len(&buf[1..end]).ok_or(ProtocolError::InvalidBulkLength)?;
                if n < 0 {
                    return Err(ProtocolError::InvalidBulkLength);
                }
                let n = n as usize;
                if n > self.limits.max_bulk {
                    return Err(ProtocolError::BulkTooLarge {
                        len: n,
                        max: self.limits.max_bulk,
                    });
                }
                let held = self.held.saturating_add(n).saturating_add(ARG_OVERHEAD);
                if held > self.limits.max_request {
                    return Err(ProtocolError::RequestTooLarge {
                        max: self.limits.max_request,
                    });
                }
                buf.advance(end + 2);
                self.bulk = Some(n);
                self.held = held;
                // The caller makes room for the value (see `bulk_missing`)
                // once it may hold it.
                n
            }
        };
        if buf.len() < len + 2 {
            return Ok(false);
        }
        if &buf[len..len + 2] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        let arg = buf.split_to(len).freeze();
        buf.advance(2);
        self.bulk = None;
        self.args.push(arg);
        Ok(true)
    }

    /// Parses one inline command line (space-separated, with "double" and
    /// 'single' quotes as redis-cli and telnet users write them).
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let Some(nl) = buf.iter().position(|&c| c == b'\n') else {
            if buf.len() > self.limits.max_inline {
                return Err(ProtocolError::InlineTooLong);
            }
            return Ok(None);
        };
        if nl > self.limits.max_inline {
            return Err(ProtocolError::InlineTooLong);
        }
        let line = buf.split_to(nl + 1);
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let args = split_inline(line)?;
        if args.len() > self.limits.max_args {
            return Err(ProtocolError::TooManyArguments {
                count: args.len(),
                max: self.limits.max_args,
            });
        }
        Ok(Some(args))
    }
}

/// Splits an inline line into arguments, honouring quotes and the escapes
/// `\n \r \t \\ \" \xHH` inside double quotes.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            break;
        }
        let mut arg = Vec::new();
        match line[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    let Some(&c) = line.get(i) else {
                        return Err(ProtocolError::UnbalancedQuotes);
                    };
                    i += 1;
                    if c == q {
                        if line.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
                            return Err(ProtocolError::UnbalancedQuotes);
                        }
                        break;
                    }
                    if c == b'\\' && q == b'"' {
                        let Some(&e) = line.get(i) else {
                            return Err(ProtocolError::UnbalancedQuotes);
                        };
                        i += 1;
                        match e {
                            b'n' => arg.push(b'\n'),
                            b'r' => arg.push(b'\r'),
                            b't' => arg.push(b'\t'),
                            b'x' => {
                                let hex =
                                    line.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                                    Some(b) => {
                                        arg.push(b);
                                        i += 2;
                                    }
                                    None => arg.push(b'x'),
                                }
                            }
                            other => arg.push(other),
                        }
                    } else if c == b'\\' && q == b'\'' && line.get(i) == Some(&b'\'') {
                        arg.push(b'\'');
                        i += 1;
                    } else {
                        arg.push(c);
                    }
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    arg.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(Bytes::from(arg));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = p.next_request(&mut buf)? {
            out.push(r);
        }
        Ok(out)
    }

    fn args(v: &[&str]) -> Vec<Bytes> {
        v.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn pipelined_multibulk_and_inline() {
        let got = parse_all(
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                args(&["GET", "k"]),
                args(&["PING"]),
                args(&["SET", "a", ""])
            ]
        );
    }

    #[test]
    fn byte_at_a_time_gives_the_same_requests() {
        let input = b"*3\r\n$3\r\nSET\r\n$5\r\nk\r\n\x00y\r\n$4\r\nv\r\nw\r\nset \"a b\" 'c'\r\n";
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(r) = p.next_request(&mut buf).unwrap() {
                out.push(r);
            }
        }
        assert_eq!(
            out[0],
            vec![
                Bytes::from_static(b"SET"),
                Bytes::from_static(b"k\r\n\x00y"),
                Bytes::from_static(b"v\r\nw")
            ]
        );
        assert_eq!(out[1], args(&["set", "a b", "c"]));
    }

    #[test]
    fn malformed_requests_are_errors() {
        assert_eq!(
            parse_all(b"*x\r\n").unwrap_err(),
            ProtocolError::InvalidMultibulkLength
        );
        assert_eq!(
            parse_all(b"*1\r\n$-5\r\n").unwrap_err(),
            ProtocolError::InvalidBulkLength
        );
        assert_eq!(
            parse_all(b"*1\r\n:5\r\n").unwrap_err(),
            ProtocolError::ExpectedBulk(':')
        );
        assert_eq!(
            parse_all(b"*1\r\n$1\r\nab\r\n").unwrap_err(),
            ProtocolError::MissingCrlf
        );
        assert!(matches!(
            parse_all(b"*99999999999\r\n"),
            Err(ProtocolError::TooManyArguments { .. })
        ));
        assert!(matches!(
            parse_all(b"*1\r\n$99999999999\r\n"),
            Err(ProtocolError::BulkTooLarge { .. })
        ));
        assert_eq!(
            parse_all(b"set \"abc\r\n").unwrap_err(),
            ProtocolError::UnbalancedQuotes
        );
        let long = vec![b'a'; 70_000];
        assert_eq!(parse_all(&long).unwrap_err(), ProtocolError::InlineTooLong);
    }

    #[test]
    fn incomplete_input_waits() {
        assert!(parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\n").unwrap().is_empty());
        assert!(parse_all(b"*2\r\n$3\r\nG").unwrap().is_empty());
        assert!(parse_all(b"GET k").unwrap().is_empty());
    }

    #[test]
    fn empty_requests_are_skipped() {
        assert_eq!(
            parse_all(b"*0\r\n\r\n  \r\nPING\r\n").unwrap(),
            vec![args(&["PING"])]
        );
    }

    #[test]
    fn a_request_is_held_to_max_request_across_its_arguments() {
        let o = ARG_OVERHEAD;
        let limits = Limits {
            max_bulk: 10,
            max_request: 25 + 3 * o,
            ..Limits::default()
        };
        let mut p = RequestParser::new(limits);
        let mut buf = BytesMut::from(&b"*4\r\n$3\r\nSET\r\n$10\r\n0123456789\r\n$10\r\n"[..]);
        assert_eq!(p.next_request(&mut buf).unwrap(), None);
        // SET and the first value read, the second value announced.
        assert_eq!(p.request_bytes(), 23 + 3 * o);
        assert_eq!(p.request_bytes_read(), 13 + 2 * o);
        assert_eq!(p.bulk_missing(&buf), 12);
        buf.extend_from_slice(b"0123456789\r\n$3\r\n");
        assert_eq!(
            p.next_request(&mut buf).unwrap_err(),
            ProtocolError::RequestTooLarge { max: 25 + 3 * o }
        );
        // The same arguments spread over two requests are fine.
        let mut p = RequestParser::new(limits);
        let mut buf = BytesMut::from(
            &b"*2\r\n$3\r\nSET\r\n$10\r\n0123456789\r\n*3\r\n$3\r\nSET\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n"[..],
        );
        assert!(p.next_request(&mut buf).unwrap().is_some());
        assert!(p.next_request(&mut buf).unwrap().is_some());
        assert_eq!(p.request_bytes(), 0);
        assert_eq!(p.bulk_missing(&buf), 0);
        // Empty arguments count their handles: 1,000 of them exceed 25 + 3 * o.
        let mut p = RequestParser::new(limits);
        let mut wire = b"*1000\r\n".to_vec();
        wire.extend(b"$0\r\n\r\n".repeat(1000));
        assert!(matches!(
            p.next_request(&mut BytesMut::from(&wire[..])),
            Err(ProtocolError::RequestTooLarge { .. })
        ));
    }
}
