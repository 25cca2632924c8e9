//! Small value types shared by every part of the engine: sequence numbers,
//! entry kinds, value pointers and the in-memory form of a keytable entry.

use bytes::Bytes;
use flash::SegmentId;

/// A sequence number: every write gets the next one; reads see a prefix.
pub type SeqNo = u64;

/// What an entry says about its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The key maps to the value at `ptr`.
    Put,
    /// The key was deleted.
    Delete,
}

impl Kind {
    /// On-device code.
    pub fn code(self) -> u8 {
        match self {
            Kind::Put => 1,
            Kind::Delete => 2,
        }
    }
    /// Inverse of [`Kind::code`].
    pub fn from_code(code: u8) -> Option<Kind> {
        match code {
            1 => Some(Kind::Put),
            2 => Some(Kind::Delete),
            _ => None,
        }
    }
}

/// The bytes of a value being written, in two parts stored back to back:
/// `head`, then `body`. A caller that puts a short header (the cluster's
/// version header) before bytes it received passes both as they are
/// instead of first joining them into a new buffer; the log copies each
/// once, into its page buffer. Most values are one part (`head` empty).
#[derive(Clone, Copy, Debug, Default)]
pub struct ValueBytes<'a> {
    pub head: &'a [u8],
    pub body: &'a [u8],
}

impl<'a> ValueBytes<'a> {
    /// A value in one part.
    pub fn whole(value: &'a [u8]) -> Self {
        ValueBytes {
            head: &[],
            body: value,
        }
    }

    /// Length of the value: both parts.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// Copies the value into `dst`, which must be exactly [`Self::len`]
    /// bytes.
    pub fn copy_to(&self, dst: &mut [u8]) {
        let (head, body) = dst.split_at_mut(self.head.len());
        head.copy_from_slice(self.head);
        body.copy_from_slice(self.body);
    }

    /// The first `N` bytes of the value, or `None` if it is shorter.
    pub fn prefix<const N: usize>(&self) -> Option<[u8; N]> {
        let mut out = [0u8; N];
        let from_head = self.head.len().min(N);
        out[..from_head].copy_from_slice(&self.head[..from_head]);
        let rest = N - from_head;
        out[from_head..].copy_from_slice(self.body.get(..rest)?);
        Some(out)
    }
}

/// Where a value record lives in the value log. `gen` is the segment's erase
/// count when the record was written: a pointer whose `gen` no longer matches
/// refers to a segment that was reclaimed and is never followed.
///
/// `value_crc` (CRC32C of the value alone) lets a read fetch and verify just
/// the value bytes, without the record's header and key: an 8 KiB value is
/// one 8 KiB device read, not 8.5 KiB (see `vlog` on value alignment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ValuePtr {
    /// Value-log segment.
    pub seg: SegmentId,
    /// Erase count of `seg` when the record was written.
    pub gen: u32,
    /// Byte offset of the record (header) inside the segment.
    pub offset: u32,
    /// Length of the whole record (header + key + value).
    pub len: u32,
    /// CRC32C of the value bytes.
    pub value_crc: u32,
}

/// Encoded size of a [`ValuePtr`].
pub const PTR_LEN: usize = 20;

impl ValuePtr {
    /// Whether both point at the same record (the same place in the same
    /// life of a segment), whatever their checksums say.
    pub fn same_record(&self, other: &ValuePtr) -> bool {
        (self.seg, self.gen, self.offset, self.len)
            == (other.seg, other.gen, other.offset, other.len)
    }

    /// Where the value of a record with a `key_len`-byte key lies in the
    /// segment: `(start, end)`, or `None` if the pointer cannot hold such a key.
    pub fn value_extent(&self, key_len: usize) -> Option<(u64, u64)> {
        let head = (crate::record::HEADER_LEN + key_len) as u64;
        let len = u64::from(self.len);
        let start = u64::from(self.offset);
        (head <= len).then_some((start + head, start + len))
    }

    /// Appends the 20-byte little-endian encoding.
    pub fn encode_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seg.to_le_bytes());
        out.extend_from_slice(&self.gen.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.value_crc.to_le_bytes());
    }
    /// Decodes from exactly [`PTR_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Option<ValuePtr> {
        if b.len() < PTR_LEN {
            return None;
        }
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(ValuePtr {
            seg: u(0),
            gen: u(4),
            offset: u(8),
            len: u(12),
            value_crc: u(16),
        })
    }
}

/// One version of one key, as the memtable and keytables hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// User key.
    pub key: Bytes,
    /// Sequence number of the write.
    pub seq: SeqNo,
    /// Put or delete.
    pub kind: Kind,
    /// Value location (meaningless for deletes).
    pub ptr: ValuePtr,
    /// What the entry knows of its value's tag (see `tag.rs`): `Unknown`
    /// for deletes and entries written before tags.
    pub tag: crate::tag::Tagging,
}

/// Orders entries as the LSM-tree does: key ascending, then newest first.
pub fn entry_order(a_key: &[u8], a_seq: SeqNo, b_key: &[u8], b_seq: SeqNo) -> std::cmp::Ordering {
    a_key.cmp(b_key).then(b_seq.cmp(&a_seq))
}
