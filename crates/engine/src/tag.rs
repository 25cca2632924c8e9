//! Value tags: the first bytes of a value, kept in its index entry, so that
//! what they say can be read without reading the value from the log.
//!
//! A value whose first byte is [`TAG_MAGIC`] and that is at least
//! `1 + TAG_LEN` bytes long has a tag: its bytes `1..=TAG_LEN`. The cluster's
//! versioned values (`protocol::versioned`: magic, kind, 64-bit version)
//! are laid out so that their tag is their kind and version. The memtable
//! and keytables keep a put's tag beside its value pointer (9 bytes more
//! per tagged entry); GC relocation and recovery take it from the value
//! again, compaction copies it.
//!
//! [`Db::multi_get_meta`] answers a key's tag, value length and value
//! checksum from the index alone: no value-log read. [`Current`] is what a
//! conditional batch's predicate sees of a key (`conditional.rs`): the tag
//! first, the value only if the predicate asks for it.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use crate::db::{BatchOp, Db};
use crate::error::Result;
use crate::record::HEADER_LEN;
use crate::types::{Entry, Kind, ValueBytes};
use crate::version::{Finger, Probe};

/// First byte of a value that carries a tag.
pub const TAG_MAGIC: u8 = 0xF1;
/// Bytes of a tag.
pub const TAG_LEN: usize = 9;
/// A value's tag: its bytes `1..=TAG_LEN`.
pub type Tag = [u8; TAG_LEN];

/// The tag of `value`, if it has one.
pub fn tag_of(value: &[u8]) -> Option<Tag> {
    if value.len() <= TAG_LEN || value[0] != TAG_MAGIC {
        return None;
    }
    Tag::try_from(&value[1..=TAG_LEN]).ok()
}

/// [`tag_of`] a value in two parts.
/// Its first `1 + TAG_LEN` bytes decide, as for a value in one part (a
/// shorter value has no tag).
pub(crate) fn tag_of_parts(value: ValueBytes<'_>) -> Option<Tag> {
    let first: [u8; 1 + TAG_LEN] = value.prefix()?;
    tag_of(&first)
}

/// What an index entry knows of its value's tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tagging {
    /// Not known: a delete, or an entry written before tags.
    #[default]
    Unknown,
    /// The value has no tag (its first byte is not [`TAG_MAGIC`], or it is
    /// too short).
    Untagged,
    /// The value's tag.
    Tagged(Tag),
}

impl Tagging {
    /// What `value`'s entry records.
    pub fn of(value: &[u8]) -> Tagging {
        tag_of(value).map_or(Tagging::Untagged, Tagging::Tagged)
    }

    /// [`Tagging::of`] a value in two parts.
    pub(crate) fn of_parts(value: ValueBytes<'_>) -> Tagging {
        tag_of_parts(value).map_or(Tagging::Untagged, Tagging::Tagged)
    }
}

/// What the index knows of a key's current value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueMeta {
    /// What the entry knows of the value's tag.
    pub tag: Tagging,
    /// CRC32C of the value bytes.
    pub value_crc: u32,
    /// Length of the value in bytes.
    pub value_len: u32,
}

impl ValueMeta {
    fn of(e: &Entry) -> ValueMeta {
        let head = (HEADER_LEN + e.key.len()) as u32;
        ValueMeta {
            tag: e.tag,
            value_crc: e.ptr.value_crc,
            value_len: e.ptr.len.saturating_sub(head),
        }
    }
}

impl Db {
    /// What the index holds of each key's current value, `None` for a key
    /// that is absent or deleted. Reads no value from the log (only
    /// keytable blocks that are not cached, as any lookup does).
    pub fn multi_get_meta(&self, keys: &[&[u8]]) -> Result<Vec<Option<ValueMeta>>> {
        let (sv, seq) = self.inner.read_view(None);
        let mut finger = Finger::default();
        keys.iter()
            .map(|k| {
                Ok(self
                    .inner
                    .lookup_near(&sv, k, seq, &mut finger)?
                    .filter(|e| e.kind == Kind::Put)
                    .map(|e| ValueMeta::of(&e)))
            })
            .collect()
    }

    /// [`Db::multi_get_meta`] from DRAM alone, for a caller that must not
    /// wait for the device (the node's network thread): the same answers,
    /// or `None` when some key's keytable block is not cached and only
    /// `multi_get_meta` can answer.
    pub fn try_multi_get_meta(&self, keys: &[&[u8]]) -> Result<Option<Vec<Option<ValueMeta>>>> {
        let (sv, seq) = self.inner.read_view(None);
        let mut finger = Finger::default();
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match crate::getsplit::probe_in(&self.inner, &sv, k, seq, &mut finger)? {
                Probe::Found(e) => {
                    out.push(e.filter(|e| e.kind == Kind::Put).map(|e| ValueMeta::of(&e)))
                }
                Probe::NeedsRead => return Ok(None),
            }
        }
        Ok(Some(out))
    }

    /// [`Db::scan_meta_bounded`] from DRAM alone, for a caller that must
    /// not wait for the device (the node's network thread): the same
    /// answer, or `None` when a keytable block it needs is not cached, or
    /// the walk would pass more than four index entries per key asked for
    /// (plus 256: older versions, deletions), and only `scan_meta_bounded`
    /// can answer.
    pub fn try_scan_meta_bounded(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Bytes, ValueMeta)>>> {
        let (sv, seq) = self.inner.read_view(None);
        let declined = AtomicBool::new(false);
        let found = self.inner.visible_entries(
            &sv,
            start,
            end,
            limit,
            seq,
            max_bytes,
            false,
            Some(&declined),
        );
        // Declined first: an incomplete listing may also fail its byte
        // bound where the whole one would not.
        if declined.load(Ordering::Relaxed) {
            return Ok(None);
        }
        Ok(Some(listing(found?)))
    }

    /// Up to `limit` live keys of `[start, end)` (empty `end`: unbounded)
    /// in key order, each with what the index holds of its value: a range
    /// listing that lets a reader compare replicas without reading values.
    /// Fails with [`crate::Error::TooLarge`] once the keys found add up to
    /// more than `max_bytes`.
    pub fn scan_meta_bounded(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(Bytes, ValueMeta)>> {
        let (sv, seq) = self.inner.read_view(None);
        Ok(listing(self.inner.visible_entries(
            &sv, start, end, limit, seq, max_bytes, false, None,
        )?))
    }
}

/// Listed entries as a range listing gives them: each key with what the
/// index holds of its value.
fn listing(found: Vec<Entry>) -> Vec<(Bytes, ValueMeta)> {
    found
        .into_iter()
        .map(|e| {
            let meta = ValueMeta::of(&e);
            (e.key, meta)
        })
        .collect()
}

/// A key's current value as a conditional batch's predicate sees it: what
/// the index says, and the value itself on demand.
pub struct Current<'a> {
    db: &'a Db,
    key: &'a [u8],
    state: State<'a>,
}

enum State<'a> {
    Absent,
    /// In the store; the value is read only if asked for.
    Stored(ValueMeta),
    /// Read from the store.
    Value(Bytes),
    /// Written by an earlier operation of the same batch (a put), borrowed:
    /// a batch's operations are slices of one request buffer, and a clone
    /// of each per operation was a contended reference count; the value is
    /// copied (and two parts joined) only if asked for.
    Written(ValueBytes<'a>),
}

impl<'a> Current<'a> {
    pub(crate) fn stored(db: &'a Db, key: &'a [u8], meta: Option<ValueMeta>) -> Self {
        let state = meta.map_or(State::Absent, State::Stored);
        Current { db, key, state }
    }

    pub(crate) fn set(&mut self, value: Option<Bytes>) {
        self.state = value.map_or(State::Absent, State::Value);
    }

    /// What the key holds once `op` (on this key) is applied.
    pub(crate) fn set_written(&mut self, op: &'a BatchOp) {
        self.state = match op {
            BatchOp::Put(_, v) => State::Written(ValueBytes::whole(v)),
            BatchOp::PutParts { head, body, .. } => State::Written(ValueBytes { head, body }),
            BatchOp::Delete(_) => State::Absent,
        };
    }

    /// Whether the key holds a value.
    pub fn exists(&self) -> bool {
        !matches!(self.state, State::Absent)
    }

    /// What is known of the value's tag without reading it (`Unknown` for
    /// an absent key, or an entry that did not record it).
    pub fn tag(&self) -> Tagging {
        match &self.state {
            State::Absent => Tagging::Unknown,
            State::Stored(m) => m.tag,
            State::Value(v) => Tagging::of(v),
            State::Written(v) => Tagging::of_parts(*v),
        }
    }

    /// The value's length, when it exists.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> Option<usize> {
        match &self.state {
            State::Absent => None,
            State::Stored(m) => Some(m.value_len as usize),
            State::Value(v) => Some(v.len()),
            State::Written(v) => Some(v.len()),
        }
    }

    /// The value itself, read from the log if not read yet.
    pub fn value(&mut self) -> Result<Option<Bytes>> {
        match &self.state {
            State::Stored(_) => {
                let v = self.db.get(self.key)?;
                self.set(v);
            }
            State::Written(v) => {
                let v = Bytes::from([v.head, v.body].concat());
                self.set(Some(v));
            }
            State::Absent | State::Value(_) => {}
        }
        Ok(match &self.state {
            State::Value(v) => Some(v.clone()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_values_with_the_magic_and_room_have_tags() {
        let mut v = vec![TAG_MAGIC];
        v.extend(1u8..=9);
        assert_eq!(tag_of(&v), Some([1, 2, 3, 4, 5, 6, 7, 8, 9]));
        v.push(42);
        assert_eq!(tag_of(&v), Some([1, 2, 3, 4, 5, 6, 7, 8, 9]));
        assert_eq!(tag_of(&v[..9]), None, "too short");
        v[0] = 0;
        assert_eq!(tag_of(&v), None, "no magic");
        assert_eq!(tag_of(b""), None);
    }
}
