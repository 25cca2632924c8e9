//! Value-log record format. The value log is also the write-ahead log, so
//! every record carries enough to rebuild the memtable after a crash.
//!
//! Record layout (little-endian), `HEADER_LEN` = 20 bytes of header:
//! ```text
//! crc32c u32 | kind u8 | flags u8 | key_len u16 | value_len u32 | seq u64 | key | value
//! ```
//! The CRC covers the segment's epoch (8 bytes, not stored in the record),
//! the rest of the header and the key, then the value's own CRC32C (4 bytes
//! little-endian, not stored in the record) in place of the value: the value
//! is scanned once, and its CRC, kept in the index, verifies a read of the
//! value alone. Seeding with the epoch makes a
//! record left over from an earlier life of a reused segment fail its check,
//! so stale bytes are never mistaken for the log tail.
//!
//! Kinds: `PUT` and `DELETE` are user records; `PAD` is filler that readers
//! skip: it fills a page up to its end (after a sync, the next record starts
//! on a fresh page so no page is ever programmed twice) or, before a large
//! value, the gap that makes the value start on a 512-byte boundary (so the
//! value alone can be read, verified by the checksum of the value alone that
//! its pointer keeps); `LINK` ends a segment and names the next one;
//! `SEGMENT_HEADER` opens a segment. A record never starts in the last
//! `HEADER_LEN - 1` bytes of a page; those bytes are implicit padding.

use crate::types::{SeqNo, ValueBytes};

/// Bytes of header before the key.
pub const HEADER_LEN: usize = 20;
/// User put.
pub const KIND_PUT: u8 = 1;
/// User delete.
pub const KIND_DELETE: u8 = 2;
/// Padding to the end of the page.
pub const KIND_PAD: u8 = 3;
/// End of segment; the value holds the next segment and its epoch.
pub const KIND_LINK: u8 = 4;
/// First record of every log segment; the value holds segment id and epoch.
pub const KIND_SEGMENT_HEADER: u8 = 5;

/// Flag: more records of the same atomic batch follow.
pub const FLAG_BATCH_CONTINUES: u8 = 1;
/// Flag: a value re-inserted by GC (keeps its original sequence number).
pub const FLAG_RELOCATED: u8 = 2;

/// Bytes a `LINK` record takes; every segment keeps this much room at its end.
pub const LINK_RECORD_LEN: usize = HEADER_LEN + 12;

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Stored checksum.
    pub crc: u32,
    /// Record kind.
    pub kind: u8,
    /// Flag bits.
    pub flags: u8,
    /// Key length.
    pub key_len: u16,
    /// Value length.
    pub value_len: u32,
    /// Sequence number (0 for framing records).
    pub seq: SeqNo,
}

impl Header {
    /// Total record length.
    pub fn record_len(&self) -> usize {
        HEADER_LEN + self.key_len as usize + self.value_len as usize
    }

    /// Parses a header; `None` if fewer than `HEADER_LEN` bytes.
    pub fn parse(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN {
            return None;
        }
        Some(Header {
            crc: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            kind: b[4],
            flags: b[5],
            key_len: u16::from_le_bytes([b[6], b[7]]),
            value_len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            seq: u64::from_le_bytes([b[12], b[13], b[14], b[15], b[16], b[17], b[18], b[19]]),
        })
    }
}

/// Checksum of a record: its header after the CRC field and its key
/// (`head`) and its value's checksum, seeded with the segment epoch.
pub fn record_crc(epoch: u64, head: &[u8], value_crc: u32) -> u32 {
    // One pass over a small contiguous copy: the CRC routine's setup costs
    // more than these few bytes.
    let mut buf = [0u8; 128];
    let n = 8 + head.len() + 4;
    if n <= buf.len() {
        buf[..8].copy_from_slice(&epoch.to_le_bytes());
        buf[8..8 + head.len()].copy_from_slice(head);
        buf[8 + head.len()..n].copy_from_slice(&value_crc.to_le_bytes());
        return crc32c::crc32c(&buf[..n]);
    }
    let seed = crc32c::crc32c(&epoch.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c_append(seed, head), &value_crc.to_le_bytes())
}

/// CRC32C of a value alone (kept in its [`crate::types::ValuePtr`]).
///
/// Every byte written or read passes through here, so it takes the
/// fastest routine the CPU allows (`crc-fast` picks one at run time); the
/// result is the same CRC32C (Castagnoli) as `crc32c`'s, which the other,
/// short checksums use.
pub fn value_crc(value: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC32C; the 64-bit result holds the 32-bit CRC.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, value) as u32
}

/// Writes a complete record into `dst`, which must be exactly `HEADER_LEN +
/// key.len() + value.len()` bytes (the value is copied once, straight into
/// the log page buffer). Returns the value's own checksum ([`value_crc`]),
/// which the record's checksum covers in place of the value.
pub(crate) fn encode_into(
    dst: &mut [u8],
    epoch: u64,
    kind: u8,
    flags: u8,
    seq: SeqNo,
    key: &[u8],
    value: ValueBytes<'_>,
) -> u32 {
    debug_assert_eq!(dst.len(), HEADER_LEN + key.len() + value.len());
    dst[4] = kind;
    dst[5] = flags;
    dst[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    dst[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    dst[12..20].copy_from_slice(&seq.to_le_bytes());
    dst[HEADER_LEN..HEADER_LEN + key.len()].copy_from_slice(key);
    let value_at = HEADER_LEN + key.len();
    value.copy_to(&mut dst[value_at..]);
    let vcrc = value_crc(&dst[value_at..]);
    let crc = record_crc(epoch, &dst[4..value_at], vcrc);
    dst[..4].copy_from_slice(&crc.to_le_bytes());
    vcrc
}

/// Longest `PAD` body whose value checksum comes from a table.
const ZERO_CRC_TABLE_LEN: usize = 2048;

/// CRC32C of `n` zero bytes (a `PAD` record's body), from a table built
/// once for the short pads that align values.
fn zeros_crc(n: usize) -> u32 {
    static TABLE: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = Vec::with_capacity(ZERO_CRC_TABLE_LEN + 1);
        let mut crc = value_crc(&[]);
        t.push(crc);
        for _ in 0..ZERO_CRC_TABLE_LEN {
            crc = crc32c::crc32c_append(crc, &[0]);
            t.push(crc);
        }
        t
    });
    match table.get(n) {
        Some(&crc) => crc,
        None => value_crc(&vec![0u8; n]),
    }
}

/// Writes a `PAD` record of `dst.len()` bytes (at least `HEADER_LEN`) with
/// a zero body into `dst`.
pub fn encode_pad_into(dst: &mut [u8], epoch: u64) {
    debug_assert!(dst.len() >= HEADER_LEN);
    let body = dst.len() - HEADER_LEN;
    dst[4] = KIND_PAD;
    dst[5] = 0;
    dst[6..8].fill(0);
    dst[8..12].copy_from_slice(&(body as u32).to_le_bytes());
    dst[12..].fill(0);
    let crc = record_crc(epoch, &dst[4..HEADER_LEN], zeros_crc(body));
    dst[..4].copy_from_slice(&crc.to_le_bytes());
}

/// A record that passed its checksum.
#[derive(Debug)]
pub struct Record<'a> {
    /// Its header.
    pub header: Header,
    /// Key bytes.
    pub key: &'a [u8],
    /// Value bytes.
    pub value: &'a [u8],
}

/// Why a record could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header claims.
    Truncated,
    /// Checksum mismatch.
    Checksum {
        /// Stored.
        expected: u32,
        /// Computed.
        got: u32,
    },
    /// Unknown kind.
    BadKind(u8),
}

/// Decodes and verifies the record at the start of `b`.
pub fn decode(b: &[u8], epoch: u64) -> Result<Record<'_>, DecodeError> {
    let header = Header::parse(b).ok_or(DecodeError::Truncated)?;
    if !(KIND_PUT..=KIND_SEGMENT_HEADER).contains(&header.kind) {
        return Err(DecodeError::BadKind(header.kind));
    }
    let len = header.record_len();
    if b.len() < len {
        return Err(DecodeError::Truncated);
    }
    let key_end = HEADER_LEN + header.key_len as usize;
    let got = record_crc(epoch, &b[4..key_end], value_crc(&b[key_end..len]));
    if got != header.crc {
        return Err(DecodeError::Checksum {
            expected: header.crc,
            got,
        });
    }
    Ok(Record {
        header,
        key: &b[HEADER_LEN..key_end],
        value: &b[key_end..len],
    })
}

/// Value of a `LINK` record: next segment id and its epoch.
pub fn link_value(next_seg: u32, next_epoch: u64) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&next_seg.to_le_bytes());
    v[4..].copy_from_slice(&next_epoch.to_le_bytes());
    v
}

/// Parses a `LINK` (or `SEGMENT_HEADER`) value.
pub fn parse_link_value(v: &[u8]) -> Option<(u32, u64)> {
    if v.len() != 12 {
        return None;
    }
    let seg = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    let mut e = [0u8; 8];
    e.copy_from_slice(&v[4..12]);
    Some((seg, u64::from_le_bytes(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_crc_is_crc32c_at_every_length() {
        // Records on existing devices were checksummed with `crc32c`.
        let bytes: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in [
            0, 1, 7, 8, 15, 16, 63, 64, 255, 256, 4095, 4096, 4097, 8192, 65_536, 70_000,
        ] {
            assert_eq!(
                value_crc(&bytes[..len]),
                crc32c::crc32c(&bytes[..len]),
                "{len}"
            );
        }
    }

    #[test]
    fn record_crc_is_the_same_for_short_and_long_heads() {
        for len in [0, 10, 116, 117, 500] {
            let head: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut whole = 9u64.to_le_bytes().to_vec();
            whole.extend_from_slice(&head);
            whole.extend_from_slice(&0xabcd_ef01u32.to_le_bytes());
            assert_eq!(
                record_crc(9, &head, 0xabcd_ef01),
                crc32c::crc32c(&whole),
                "{len}"
            );
        }
    }

    #[test]
    fn pads_decode_whatever_their_length() {
        for n in [
            0,
            1,
            7,
            500,
            1043,
            ZERO_CRC_TABLE_LEN,
            ZERO_CRC_TABLE_LEN + 1,
            9000,
        ] {
            let mut buf = vec![0xffu8; HEADER_LEN + n];
            encode_pad_into(&mut buf, 3);
            let r = decode(&buf, 3).expect("valid pad");
            assert_eq!(r.header.kind, KIND_PAD);
            assert_eq!(r.value.len(), n);
            assert!(r.value.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn roundtrip_and_epoch_seed() {
        let mut buf = vec![0u8; HEADER_LEN + 8];
        let vcrc = encode_into(
            &mut buf,
            7,
            KIND_PUT,
            0,
            42,
            b"key",
            ValueBytes::whole(b"value"),
        );
        assert_eq!(vcrc, value_crc(b"value"));
        assert_eq!(
            u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
            record_crc(7, &buf[4..HEADER_LEN + 3], vcrc),
        );
        let r = decode(&buf, 7).expect("valid");
        assert_eq!(r.key, b"key");
        assert_eq!(r.value, b"value");
        assert_eq!(r.header.seq, 42);
        assert!(matches!(decode(&buf, 8), Err(DecodeError::Checksum { .. })));
        buf[HEADER_LEN + 1] ^= 1;
        assert!(matches!(decode(&buf, 7), Err(DecodeError::Checksum { .. })));
        buf[HEADER_LEN + 1] ^= 1;
        buf[HEADER_LEN + 5] ^= 0x10; // in the value
        assert!(matches!(decode(&buf, 7), Err(DecodeError::Checksum { .. })));
        buf[HEADER_LEN + 5] ^= 0x10;
        assert_eq!(decode(&buf[..10], 7).unwrap_err(), DecodeError::Truncated);
    }

    #[test]
    fn erased_bytes_are_not_records() {
        assert!(decode(&[0xFF; 64], 1).is_err());
        assert!(decode(&[0x00; 64], 1).is_err());
    }
}
