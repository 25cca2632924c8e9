//! Encoded replies on their way to a socket, without copying large values.
//!
//! A [`Wire`] holds encoded replies as a list of pieces: small replies and
//! every header are copied into a growing buffer, while a large bulk
//! string is kept as the [`Bytes`] it already is (often a slice of a
//! device read buffer) and written from there with a vectored write. A
//! 1 MiB `MGET` reply then costs one copy, the kernel's into the socket,
//! instead of two. A bulk string counts as large from [`BORROW_BULK`]
//! bytes, or from [`BORROW_IN_LARGE`] bytes once the wire holds
//! [`LARGE_WIRE`] bytes: for a small reply one plain write of a copy is
//! cheaper than a vectored write of many pieces (measured with 8 KiB
//! reads made of two 4 KiB values), for a large one the copies add up.

use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

use crate::reply::Sink;

/// Bulk strings at least this long are written from where they are.
pub const BORROW_BULK: usize = 8 << 10;
/// Bulk strings at least this long are written from where they are once
/// the wire holds [`LARGE_WIRE`] bytes.
pub const BORROW_IN_LARGE: usize = 4 << 10;
/// See [`BORROW_IN_LARGE`].
pub const LARGE_WIRE: usize = 64 << 10;

/// Encoded replies waiting to be written (see the module doc).
#[derive(Default)]
pub struct Wire {
    /// Pieces finished before `tail`, in order; the first may be partly
    /// written already (see [`Wire::advance`]).
    done: Vec<Bytes>,
    /// Where small replies and headers are being copied.
    tail: BytesMut,
    /// Bytes held in `done` and `tail`.
    len: usize,
}

impl Wire {
    /// An empty wire.
    pub fn new() -> Wire {
        Wire::default()
    }

    /// Bytes waiting to be written.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops everything (a connection that is done).
    pub fn clear(&mut self) {
        self.done.clear();
        self.tail.clear();
        self.len = 0;
    }

    /// The waiting bytes, in order, for a vectored write (at most `max`
    /// slices: a write takes at most `IOV_MAX` of them anyway).
    pub fn slices(&self, max: usize) -> Vec<IoSlice<'_>> {
        self.done
            .iter()
            .map(|b| &b[..])
            .chain(std::iter::once(&self.tail[..]))
            .filter(|s| !s.is_empty())
            .take(max)
            .map(IoSlice::new)
            .collect()
    }

    /// Marks the first `n` waiting bytes written.
    ///
    /// # Panics
    /// If fewer than `n` bytes wait (a caller's bug).
    pub fn advance(&mut self, mut n: usize) {
        assert!(n <= self.len, "advancing {n} of {} bytes", self.len);
        self.len -= n;
        let whole = self.done.iter().take_while(|b| {
            let fits = b.len() <= n;
            if fits {
                n -= b.len();
            }
            fits
        });
        let whole = whole.count();
        self.done.drain(..whole);
        if n > 0 {
            match self.done.first_mut() {
                Some(b) => b.advance(n),
                None => self.tail.advance(n),
            }
        }
        if self.len == 0 {
            self.clear();
        }
    }

    /// Closes the tail piece so that a borrowed one can follow it.
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            self.done.push(self.tail.split().freeze());
        }
    }
}

impl Sink for Wire {
    fn put(&mut self, b: &[u8]) {
        self.tail.extend_from_slice(b);
        self.len += b.len();
    }

    fn put_value(&mut self, b: &Bytes) {
        let large =
            b.len() >= BORROW_BULK || (b.len() >= BORROW_IN_LARGE && self.len >= LARGE_WIRE);
        if !large {
            return self.put(b);
        }
        self.seal_tail();
        self.len += b.len();
        self.done.push(b.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Reply, RespVersion};

    fn flat(w: &Wire) -> Vec<u8> {
        w.slices(usize::MAX)
            .iter()
            .flat_map(|s| s.to_vec())
            .collect()
    }

    fn replies() -> Vec<Reply> {
        let big = Bytes::from((0..3 * BORROW_BULK).map(|i| i as u8).collect::<Vec<u8>>());
        let many_small = (0..20)
            .map(|i| Reply::Bulk(big.slice(i..i + BORROW_IN_LARGE)))
            .collect();
        vec![
            Reply::Simple("OK"),
            Reply::Bulk(big.slice(..BORROW_BULK - 1)),
            Reply::Array(vec![
                Reply::Bulk(big.clone()),
                Reply::Null,
                Reply::Bulk(big.slice(7..7 + BORROW_BULK)),
                Reply::Integer(42),
            ]),
            Reply::Bulk(big),
            Reply::Array(many_small),
            Reply::Error("ERR x".into()),
        ]
    }

    /// Whatever the pieces, the bytes are those of the plain encoding, and
    /// any sequence of partial writes hands them out once, in order.
    #[test]
    fn the_bytes_are_the_plain_encoding_and_partial_writes_resume() {
        for v in [RespVersion::V2, RespVersion::V3] {
            let mut plain = BytesMut::new();
            let mut wire = Wire::new();
            for r in replies() {
                r.encode(v, &mut plain);
                r.encode(v, &mut wire);
            }
            assert_eq!(flat(&wire), plain.to_vec());
            assert_eq!(wire.len(), plain.len());
            assert!(
                wire.slices(usize::MAX).len() > 3,
                "large values are borrowed"
            );
            for step in [1, 5, 4095, 4096, 4097, 10_000, 100_000] {
                let mut w = Wire::new();
                for r in replies() {
                    r.encode(v, &mut w);
                }
                let mut out = Vec::new();
                while !w.is_empty() {
                    // What a write of at most `step` bytes takes.
                    let mut n = 0;
                    for s in w.slices(2) {
                        let take = (step - n).min(s.len());
                        out.extend_from_slice(&s[..take]);
                        n += take;
                    }
                    w.advance(n);
                }
                assert_eq!(out, plain.to_vec(), "step {step}");
            }
        }
    }
}
