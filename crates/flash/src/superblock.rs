//! The superblock: page 0 of the device, describing the store's layout.
//!
//! Layout (little-endian), `SUPERBLOCK_LEN` bytes, rest of the page zero:
//! ```text
//!  0  magic             [u8; 8] = b"LSFLASH1"
//!  8  format version    u32     = 1
//! 12  page size         u32
//! 16  pages per segment u32
//! 20  segment count     u32
//! 24  slot bytes        u64     size of each checkpoint slot
//! 32  data offset       u64     byte offset of segment 0
//! 40  format id         u64     random; every checkpoint must carry it
//! 48  crc32c            u32     of bytes 0..48
//! ```
//! The version field sits at the same place in every version, so it is
//! checked before the checksum (whose position a later version may move).

use crate::codec::{Reader, Writer};
use crate::error::{FlashError, Result};

/// Magic at byte 0 of the device.
pub(crate) const SUPERBLOCK_MAGIC: &[u8; 8] = b"LSFLASH1";
/// The only format version this code reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Encoded size in bytes.
pub(crate) const SUPERBLOCK_LEN: usize = 52;

/// Decoded superblock. `decode` guarantees only checksum integrity; layout
/// consistency with the device is checked by the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub(crate) page_size: u32,
    pub(crate) pages_per_segment: u32,
    pub(crate) segment_count: u32,
    pub(crate) slot_bytes: u64,
    pub(crate) data_offset: u64,
    pub(crate) format_id: u64,
}

impl Superblock {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(SUPERBLOCK_LEN);
        w.bytes(SUPERBLOCK_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(self.page_size);
        w.u32(self.pages_per_segment);
        w.u32(self.segment_count);
        w.u64(self.slot_bytes);
        w.u64(self.data_offset);
        w.u64(self.format_id);
        let crc = crc32c::crc32c(&w.buf);
        w.u32(crc);
        w.buf
    }

    /// True when `bytes` starts with the superblock magic.
    pub(crate) fn has_magic(bytes: &[u8]) -> bool {
        bytes.starts_with(SUPERBLOCK_MAGIC)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Superblock> {
        let bad = |m: String| FlashError::BadSuperblock(m);
        if !Self::has_magic(bytes) {
            return Err(bad("magic not found at offset 0".into()));
        }
        let mut r = Reader::new(bytes, "superblock");
        r.take(SUPERBLOCK_MAGIC.len())?;
        let version = r.u32().map_err(|e| bad(e.to_string()))?;
        if version != FORMAT_VERSION {
            return Err(FlashError::UnsupportedVersion(version));
        }
        let body = bytes
            .get(..SUPERBLOCK_LEN - 4)
            .ok_or_else(|| bad("truncated".into()))?;
        let decode_fields = |r: &mut Reader<'_>| -> Result<Superblock> {
            let sb = Superblock {
                page_size: r.u32()?,
                pages_per_segment: r.u32()?,
                segment_count: r.u32()?,
                slot_bytes: r.u64()?,
                data_offset: r.u64()?,
                format_id: r.u64()?,
            };
            let stored = r.u32()?;
            let computed = crc32c::crc32c(body);
            if stored != computed {
                return Err(bad(format!(
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )));
            }
            Ok(sb)
        };
        decode_fields(&mut r).map_err(|e| match e {
            FlashError::BadSuperblock(_) => e,
            other => bad(other.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            page_size: 8192,
            pages_per_segment: 16,
            segment_count: 10,
            slot_bytes: 65536,
            data_offset: 8192 + 2 * 65536,
            format_id: 0x1234_5678_9ABC,
        }
    }

    #[test]
    fn roundtrip() {
        let bytes = sample().encode();
        assert_eq!(bytes.len(), SUPERBLOCK_LEN);
        assert_eq!(Superblock::decode(&bytes).unwrap(), sample());
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let bytes = sample().encode();
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            match Superblock::decode(&b) {
                Err(FlashError::BadSuperblock(_)) | Err(FlashError::UnsupportedVersion(_)) => {}
                other => panic!("bit {bit}: {other:?}"),
            }
        }
    }

    #[test]
    fn version_and_truncation() {
        let mut b = sample().encode();
        b[8] = 2;
        assert!(matches!(
            Superblock::decode(&b),
            Err(FlashError::UnsupportedVersion(2))
        ));
        let b = sample().encode();
        assert!(matches!(
            Superblock::decode(&b[..20]),
            Err(FlashError::BadSuperblock(_))
        ));
        assert!(matches!(
            Superblock::decode(&[0xFF; 64]),
            Err(FlashError::BadSuperblock(_))
        ));
    }
}
