//! Encoding of a checkpoint: the segment table plus the user blob, written
//! into one of the two metadata slots.
//!
//! Layout (little-endian):
//! ```text
//! header (HEADER_LEN = 40 bytes)
//!  0  magic        [u8; 8] = b"LSCKPT01"
//!  8  format id    u64     must equal the superblock's
//! 16  sequence     u64     higher = newer
//! 24  body length  u64
//! 32  body crc32c  u32
//! 36  header crc   u32     crc32c of bytes 0..36
//! body
//!  0  segment count u32    must equal the superblock's
//!  4  per segment: state u8 (0 Free, 1 Used), kind u8, erase count u32
//!     user length u64, user bytes   (body ends exactly there)
//! ```
//! PendingFree segments are recorded as Free: once this checkpoint is
//! durable, nothing reachable from it references their content.

use crate::codec::{Reader, Writer};
use crate::error::{FlashError, Result};
use crate::store::{SegmentInfo, SegmentState};

const CHECKPOINT_MAGIC: &[u8; 8] = b"LSCKPT01";
/// Encoded header size.
pub(crate) const HEADER_LEN: usize = 40;
/// Encoded size of one segment entry.
const ENTRY_LEN: usize = 6;
const STATE_FREE: u8 = 0;
const STATE_USED: u8 = 1;

/// Bytes an encoded checkpoint of `segments` entries and a `user_len`-byte blob needs.
pub(crate) fn encoded_len(segments: usize, user_len: usize) -> usize {
    HEADER_LEN + 4 + segments * ENTRY_LEN + 8 + user_len
}

/// Encodes a complete checkpoint (header and body).
pub(crate) fn encode(
    format_id: u64,
    sequence: u64,
    segments: &[SegmentInfo],
    user: &[u8],
) -> Vec<u8> {
    let mut body = Writer::with_capacity(encoded_len(segments.len(), user.len()) - HEADER_LEN);
    body.u32(segments.len() as u32);
    for s in segments {
        body.u8(match s.state {
            SegmentState::Used => STATE_USED,
            SegmentState::Free | SegmentState::PendingFree => STATE_FREE,
        });
        body.u8(s.kind);
        body.u32(s.erase_count);
    }
    body.u64(user.len() as u64);
    body.bytes(user);

    let mut out = Writer::with_capacity(HEADER_LEN + body.buf.len());
    out.bytes(CHECKPOINT_MAGIC);
    out.u64(format_id);
    out.u64(sequence);
    out.u64(body.buf.len() as u64);
    out.u32(crc32c::crc32c(&body.buf));
    let header_crc = crc32c::crc32c(&out.buf);
    out.u32(header_crc);
    out.bytes(&body.buf);
    out.buf
}

/// A checkpoint header that passed its checksum and format-id checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) sequence: u64,
    /// Guaranteed `<= max_body` given to [`decode_header`].
    pub(crate) body_len: usize,
    body_crc: u32,
}

/// Decodes and checks the header at the start of `bytes`. `max_body` is the
/// room the slot has after the header; a longer stated body is corrupt.
pub(crate) fn decode_header(bytes: &[u8], format_id: u64, max_body: usize) -> Result<Header> {
    let mut r = Reader::new(bytes, "checkpoint header");
    if r.take(CHECKPOINT_MAGIC.len())? != CHECKPOINT_MAGIC {
        return Err(FlashError::Corrupt(
            "checkpoint header: magic not found".into(),
        ));
    }
    let id = r.u64()?;
    let sequence = r.u64()?;
    let body_len = r.u64()?;
    let body_crc = r.u32()?;
    let covered = &bytes[..r.pos()];
    let stored = r.u32()?;
    let computed = crc32c::crc32c(covered);
    if stored != computed {
        return Err(FlashError::ChecksumMismatch {
            what: "checkpoint header",
            expected: stored,
            got: computed,
        });
    }
    if id != format_id {
        return Err(FlashError::Corrupt(format!(
            "checkpoint header: format id {id:#x} does not match superblock {format_id:#x}"
        )));
    }
    let body_len = usize::try_from(body_len)
        .ok()
        .filter(|&n| n <= max_body)
        .ok_or_else(|| {
            FlashError::Corrupt(format!(
                "checkpoint header: body length {body_len} exceeds slot room {max_body}"
            ))
        })?;
    Ok(Header {
        sequence,
        body_len,
        body_crc,
    })
}

/// Decodes the body (exactly `header.body_len` bytes) into the segment table
/// (only Free/Used) and the user blob.
pub(crate) fn decode_body(
    header: &Header,
    body: &[u8],
    segment_count: u32,
) -> Result<(Vec<SegmentInfo>, Vec<u8>)> {
    let body = body
        .get(..header.body_len)
        .ok_or_else(|| FlashError::Corrupt("checkpoint body: truncated".into()))?;
    let computed = crc32c::crc32c(body);
    if computed != header.body_crc {
        return Err(FlashError::ChecksumMismatch {
            what: "checkpoint body",
            expected: header.body_crc,
            got: computed,
        });
    }
    let mut r = Reader::new(body, "checkpoint body");
    let count = r.u32()?;
    if count != segment_count {
        return Err(FlashError::Corrupt(format!(
            "checkpoint body: {count} segments, superblock says {segment_count}"
        )));
    }
    // Bounds-check the table size before allocating for it.
    if (count as usize).saturating_mul(ENTRY_LEN) > r.remaining() {
        return Err(FlashError::Corrupt(format!(
            "checkpoint body: table of {count} segments is truncated"
        )));
    }
    let mut segments = Vec::with_capacity(count as usize);
    for id in 0..count {
        let state = match r.u8()? {
            STATE_FREE => SegmentState::Free,
            STATE_USED => SegmentState::Used,
            other => {
                return Err(FlashError::Corrupt(format!(
                    "checkpoint body: segment {id} has state byte {other}"
                )))
            }
        };
        let kind = r.u8()?;
        let erase_count = r.u32()?;
        segments.push(SegmentInfo {
            state,
            kind,
            erase_count,
        });
    }
    let user_len = r.u64()?;
    if user_len != r.remaining() as u64 {
        return Err(FlashError::Corrupt(format!(
            "checkpoint body: user blob length {user_len}, {} bytes remain",
            r.remaining()
        )));
    }
    let user = r.take(r.remaining())?.to_vec();
    Ok((segments, user))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<SegmentInfo> {
        vec![
            SegmentInfo {
                state: SegmentState::Used,
                kind: 3,
                erase_count: 7,
            },
            SegmentInfo {
                state: SegmentState::PendingFree,
                kind: 1,
                erase_count: 2,
            },
            SegmentInfo {
                state: SegmentState::Free,
                kind: 0,
                erase_count: 0,
            },
        ]
    }

    fn decode_all(bytes: &[u8], id: u64, segs: u32) -> Result<(u64, Vec<SegmentInfo>, Vec<u8>)> {
        let h = decode_header(bytes, id, 1 << 20)?;
        let (t, u) = decode_body(&h, &bytes[HEADER_LEN..], segs)?;
        Ok((h.sequence, t, u))
    }

    #[test]
    fn roundtrip_records_pending_free_as_free() {
        let bytes = encode(99, 5, &table(), b"manifest");
        assert_eq!(bytes.len(), encoded_len(3, 8));
        let (seq, t, u) = decode_all(&bytes, 99, 3).unwrap();
        assert_eq!(seq, 5);
        assert_eq!(u, b"manifest");
        let states: Vec<_> = t.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [SegmentState::Used, SegmentState::Free, SegmentState::Free]
        );
        assert_eq!((t[0].kind, t[0].erase_count, t[1].erase_count), (3, 7, 2));
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let bytes = encode(1, 2, &table(), b"abc");
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_all(&b, 1, 3).is_err(), "bit {bit} accepted");
        }
    }

    #[test]
    fn rejects_foreign_format_oversized_body_and_erased_slot() {
        let bytes = encode(1, 2, &table(), b"abc");
        assert!(matches!(
            decode_all(&bytes, 2, 3),
            Err(FlashError::Corrupt(_))
        ));
        assert!(matches!(
            decode_header(&bytes, 1, 10),
            Err(FlashError::Corrupt(_))
        ));
        assert!(matches!(
            decode_all(&bytes, 1, 4),
            Err(FlashError::Corrupt(_))
        ));
        assert!(decode_all(&[0xFF; 4096], 1, 3).is_err());
        assert!(decode_all(&[0u8; 4096], 1, 3).is_err());
        assert!(decode_all(&bytes[..20], 1, 3).is_err());
    }
}
