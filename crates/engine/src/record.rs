//! Value-log record format. The value log is also the write-ahead log, so
//! every record carries enough to rebuild the memtable after a crash.
//!
//! Record layout (little-endian), `HEADER_LEN` = 20 bytes of header:
//! ```text
//! crc32c u32 | kind u8 | flags u8 | key_len u16 | value_len u32 | seq u64 | key | value
//! ```
//! The CRC covers the segment's epoch (8 bytes, not stored in the record)
//! followed by everything after the CRC field. Seeding with the epoch makes a
//! record left over from an earlier life of a reused segment fail its check,
//! so stale bytes are never mistaken for the log tail.
//!
//! Kinds: `PUT` and `DELETE` are user records; `PAD` fills a page up to its
//! end (after a sync, the next record starts on a fresh page so no page is
//! ever programmed twice); `LINK` ends a segment and names the next one;
//! `SEGMENT_HEADER` opens a segment. A record never starts in the last
//! `HEADER_LEN - 1` bytes of a page; those bytes are implicit padding.

use crate::types::SeqNo;

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

/// Checksum of a record body seeded with the segment epoch.
pub fn record_crc(epoch: u64, body_after_crc: &[u8]) -> u32 {
    let seed = crc32c::crc32c(&epoch.to_le_bytes());
    crc32c::crc32c_append(seed, body_after_crc)
}

/// Writes a complete record into `dst`, which must be exactly `HEADER_LEN +
/// key.len() + value.len()` bytes (the value is copied once, straight into
/// the log page buffer).
pub fn encode_into(
    dst: &mut [u8],
    epoch: u64,
    kind: u8,
    flags: u8,
    seq: SeqNo,
    key: &[u8],
    value: &[u8],
) {
    debug_assert_eq!(dst.len(), HEADER_LEN + key.len() + value.len());
    dst[4] = kind;
    dst[5] = flags;
    dst[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    dst[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    dst[12..20].copy_from_slice(&seq.to_le_bytes());
    dst[HEADER_LEN..HEADER_LEN + key.len()].copy_from_slice(key);
    dst[HEADER_LEN + key.len()..].copy_from_slice(value);
    let crc = record_crc(epoch, &dst[4..]);
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
    let got = record_crc(epoch, &b[4..len]);
    if got != header.crc {
        return Err(DecodeError::Checksum {
            expected: header.crc,
            got,
        });
    }
    let key_end = HEADER_LEN + header.key_len as usize;
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
    fn roundtrip_and_epoch_seed() {
        let mut buf = vec![0u8; HEADER_LEN + 8];
        encode_into(&mut buf, 7, KIND_PUT, 0, 42, b"key", b"value");
        let r = decode(&buf, 7).expect("valid");
        assert_eq!(r.key, b"key");
        assert_eq!(r.value, b"value");
        assert_eq!(r.header.seq, 42);
        assert!(matches!(decode(&buf, 8), Err(DecodeError::Checksum { .. })));
        buf[HEADER_LEN + 1] ^= 1;
        assert!(matches!(decode(&buf, 7), Err(DecodeError::Checksum { .. })));
        assert_eq!(decode(&buf[..10], 7).unwrap_err(), DecodeError::Truncated);
    }

    #[test]
    fn erased_bytes_are_not_records() {
        assert!(decode(&[0xFF; 64], 1).is_err());
        assert!(decode(&[0x00; 64], 1).is_err());
    }
}
