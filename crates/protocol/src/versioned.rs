//! Versioned values: how the cluster client stores a value with the version
//! that decides which of two replicas' copies is newer.
//!
//! A versioned value is a 10-byte header followed by the payload:
//!
//! ```text
//! byte 0      0xF1 (magic)
//! byte 1      kind: 0x01 value, 0x02 tombstone (payload empty)
//! bytes 2..10 version, unsigned 64-bit big-endian
//! bytes 10..  payload
//! ```
//!
//! Nodes compare versions in `VSET`/`VDEL` so a replica only ever moves to a
//! newer version; a stored value without the header (written by a plain
//! `SET`) counts as version 0. Other languages (the YCSB binding) implement
//! exactly this layout.

use bytes::{BufMut, Bytes, BytesMut};

/// First byte of every versioned value.
pub const MAGIC: u8 = 0xF1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 10;
const KIND_VALUE: u8 = 0x01;
/// Kind byte (the first tag byte) of a tombstone: the header alone.
pub const KIND_TOMBSTONE: u8 = 0x02;

/// A decoded versioned value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// Version chosen by the writer; larger is newer.
    pub version: u64,
    /// The value, or `None` for a deletion (tombstone).
    pub value: Option<Bytes>,
}

impl Versioned {
    /// Encodes this value with its header.
    pub fn encode(&self) -> Bytes {
        match &self.value {
            Some(v) => encode_value(self.version, v),
            None => encode_tombstone(self.version),
        }
    }

    /// Decodes a stored value. Bytes without a valid header are a plain
    /// (unversioned) value: version 0.
    pub fn decode(stored: Bytes) -> Versioned {
        match header(&stored) {
            Some((KIND_VALUE, version)) => Versioned {
                version,
                value: Some(stored.slice(HEADER_LEN..)),
            },
            Some((_, version)) => Versioned {
                version,
                value: None,
            },
            None => Versioned {
                version: 0,
                value: Some(stored),
            },
        }
    }
}

/// `(kind, version)` of a stored value with a valid header.
fn header(stored: &[u8]) -> Option<(u8, u64)> {
    if stored.len() < HEADER_LEN || stored[0] != MAGIC {
        return None;
    }
    let kind = stored[1];
    if kind != KIND_VALUE && (kind != KIND_TOMBSTONE || stored.len() != HEADER_LEN) {
        return None;
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&stored[2..HEADER_LEN]);
    Some((kind, u64::from_be_bytes(v)))
}

/// The version of a stored value (0 when it has no header).
pub fn version_of(stored: &[u8]) -> u64 {
    header(stored).map_or(0, |(_, v)| v)
}

/// The version of a stored copy known only by its first byte being
/// [`MAGIC`], its next nine bytes `tag` (kind and version; the engine keeps
/// these in its index) and its length: what [`version_of`] would say of the
/// whole copy.
pub fn version_of_tag(tag: &[u8; HEADER_LEN - 1], len: usize) -> u64 {
    let mut head = [0u8; HEADER_LEN];
    head[0] = MAGIC;
    head[1..].copy_from_slice(tag);
    match header(&head) {
        Some((KIND_TOMBSTONE, _)) if len != HEADER_LEN => 0,
        Some((_, v)) => v,
        None => 0,
    }
}

/// Whether a stored copy known by its tag and length (see
/// [`version_of_tag`]) is a deletion's tombstone.
pub fn is_tombstone_tag(tag: &[u8; HEADER_LEN - 1], len: usize) -> bool {
    tag[0] == KIND_TOMBSTONE && len == HEADER_LEN
}

/// The total order of stored copies of one key: by version, then, between
/// two copies of one version (two writers that picked the same version),
/// by their bytes, so every replica and every reader picks the same winner
/// whatever order the writes arrive in. A plain value (no header) is
/// version 0. Nodes keep a `VSET`/`VDEL` only if it is greater than the
/// stored copy; equal means the same write.
pub fn cmp_stored(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    // A copy compared with itself (a reader checking the one answer it got
    // against the newest) is equal without reading its bytes.
    if std::ptr::eq(a, b) {
        return std::cmp::Ordering::Equal;
    }
    version_of(a).cmp(&version_of(b)).then_with(|| a.cmp(b))
}

/// The header [`encode_value`] puts before a value: `encode_value(version,
/// value)` is these bytes followed by `value`.
pub fn value_header(version: u64) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0] = MAGIC;
    out[1] = KIND_VALUE;
    out[2..].copy_from_slice(&version.to_be_bytes());
    out
}

/// Encodes `value` at `version`.
pub fn encode_value(version: u64, value: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + value.len());
    out.put_slice(&value_header(version));
    out.put_slice(value);
    out.freeze()
}

/// Encodes a deletion at `version`.
pub fn encode_tombstone(version: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN);
    out.put_u8(MAGIC);
    out.put_u8(KIND_TOMBSTONE);
    out.put_u64(version);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_from_a_tag_is_the_version_of_the_copy() {
        let copies = [
            encode_value(7, b"payload"),
            encode_value(9, b""),
            encode_tombstone(11),
            Bytes::from_static(b"\xf1\x02\x00\x00\x00\x00\x00\x00\x00\x05 not a tombstone"),
            Bytes::from_static(b"\xf1\x07\x00\x00\x00\x00\x00\x00\x00\x05 bad kind"),
        ];
        for c in copies {
            let tag: [u8; 9] = c[1..10].try_into().expect("tag");
            assert_eq!(version_of_tag(&tag, c.len()), version_of(&c), "{c:?}");
            assert_eq!(
                is_tombstone_tag(&tag, c.len()),
                header(&c).is_some_and(|(k, _)| k == KIND_TOMBSTONE),
                "{c:?}"
            );
        }
    }

    #[test]
    fn copies_are_totally_ordered_by_version_then_bytes() {
        use std::cmp::Ordering::*;
        assert_eq!(
            cmp_stored(&encode_value(2, b"a"), &encode_value(1, b"z")),
            Greater
        );
        assert_eq!(
            cmp_stored(&encode_value(1, b"a"), &encode_value(1, b"b")),
            Less
        );
        assert_eq!(
            cmp_stored(&encode_value(1, b"a"), &encode_value(1, b"a")),
            Equal
        );
        assert_eq!(
            cmp_stored(&encode_tombstone(1), &encode_value(1, b"")),
            Greater
        );
        assert_eq!(cmp_stored(b"plain", &encode_value(1, b"")), Less);
    }

    #[test]
    fn layout_is_fixed() {
        assert_eq!(
            &encode_value(0x0102_0304_0506_0708, b"ab")[..],
            b"\xF1\x01\x01\x02\x03\x04\x05\x06\x07\x08ab"
        );
        assert_eq!(&encode_tombstone(1)[..], b"\xF1\x02\0\0\0\0\0\0\0\x01");
    }

    #[test]
    fn roundtrips_and_plain_values_are_version_zero() {
        for v in [
            Versioned {
                version: 7,
                value: Some(Bytes::from_static(b"")),
            },
            Versioned {
                version: u64::MAX,
                value: Some(Bytes::from_static(b"\xF1\x02x")),
            },
            Versioned {
                version: 3,
                value: None,
            },
        ] {
            assert_eq!(Versioned::decode(v.encode()), v);
            assert_eq!(version_of(&v.encode()), v.version);
        }
        let plain = Bytes::from_static(b"hello world");
        assert_eq!(
            Versioned::decode(plain.clone()),
            Versioned {
                version: 0,
                value: Some(plain)
            }
        );
        // A tombstone header with trailing bytes is not a tombstone.
        let odd = Bytes::from_static(b"\xF1\x02\0\0\0\0\0\0\0\x01zz");
        assert_eq!(Versioned::decode(odd.clone()).version, 0);
    }
}
