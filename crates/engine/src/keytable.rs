//! Keytables: immutable sorted runs of `(key, seq, kind, value pointer)`
//! entries on flash — keys only, values stay in the value log.
//!
//! A keytable is a run of pages in a keytable segment: data blocks (one page
//! each, or more when a single entry is larger than a page) followed by an
//! index (first key and page of every block, the Bloom filter, entry count,
//! smallest and largest key). Every block and the index carry a CRC32C seeded
//! with the keytable id, so bytes from another keytable never pass.
//!
//! Block layout: `crc u32 | count u32 | data_len u32 | entries | offsets u32 * count`,
//! entry: `key_len u16 | key | seq u64 | kind u8 | ptr (20 B) [| tag (9 B)]`.
//! Kind codes: 1 put (its value's tag not recorded: written before tags),
//! 2 delete, 3 put followed by its value's tag (`tag.rs`), 4 put of a value
//! without a tag.

use std::sync::Arc;

use bytes::Bytes;

use crate::bloom::Bloom;
use crate::error::{Error, Result};
use crate::tag::{Tag, Tagging, TAG_LEN};
use crate::types::{entry_order, Entry, Kind, SeqNo, ValuePtr, PTR_LEN};

const BLOCK_HEADER: usize = 12;
const ENTRY_FIXED: usize = 2 + 8 + 1 + PTR_LEN;
/// Kind code of a put whose entry carries its value's tag.
const CODE_PUT_TAGGED: u8 = 3;
/// Kind code of a put whose value has no tag.
const CODE_PUT_UNTAGGED: u8 = 4;

/// `(kind, tag follows, known untagged)` of an on-device kind code.
fn decode_kind(code: u8) -> Option<(Kind, bool, bool)> {
    match code {
        CODE_PUT_TAGGED => Some((Kind::Put, true, false)),
        CODE_PUT_UNTAGGED => Some((Kind::Put, false, true)),
        c => Kind::from_code(c).map(|k| (k, false, false)),
    }
}

fn id_crc(id: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&id.to_le_bytes()), body)
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A decoded, checksum-verified data block.
#[derive(Debug)]
pub struct Block {
    /// The block's bytes (an [`Entry`] from [`Block::entry_sharing`]
    /// shares them for its key).
    data: Bytes,
    count: usize,
    offsets_at: usize,
}

impl Block {
    /// Verifies and wraps the bytes of one block of keytable `id`.
    pub fn parse(data: Vec<u8>, id: u64) -> Result<Block> {
        let corrupt = |m: &str| Error::Corrupt(format!("keytable {id} block: {m}"));
        let crc = read_u32(&data, 0).ok_or_else(|| corrupt("short"))?;
        let count = read_u32(&data, 4).ok_or_else(|| corrupt("short"))? as usize;
        let data_len = read_u32(&data, 8).ok_or_else(|| corrupt("short"))? as usize;
        let end = count
            .checked_mul(4)
            .and_then(|o| o.checked_add(BLOCK_HEADER + data_len))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| corrupt("lengths out of range"))?;
        let got = id_crc(id, &data[4..end]);
        if got != crc {
            return Err(Error::ChecksumMismatch {
                what: "keytable block",
                expected: crc,
                got,
            });
        }
        let block = Block {
            data: Bytes::from(data),
            count,
            offsets_at: BLOCK_HEADER + data_len,
        };
        // Validate every entry once so accessors cannot go out of bounds.
        for i in 0..count {
            let off = block.offset(i);
            let klen = read_u16(&block.data, off).ok_or_else(|| corrupt("entry offset"))? as usize;
            if off + ENTRY_FIXED + klen > block.offsets_at {
                return Err(corrupt("entry overruns block"));
            }
            let Some((_, tagged, _)) = decode_kind(block.data[off + 2 + klen + 8]) else {
                return Err(corrupt("bad entry kind"));
            };
            if tagged && off + ENTRY_FIXED + klen + TAG_LEN > block.offsets_at {
                return Err(corrupt("entry tag overruns block"));
            }
        }
        Ok(block)
    }

    fn offset(&self, i: usize) -> usize {
        let at = self.offsets_at + 4 * i;
        u32::from_le_bytes([
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ]) as usize
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Bytes of DRAM this block occupies when cached.
    pub fn dram_bytes(&self) -> usize {
        self.data.len()
    }

    /// Key of entry `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        let off = self.offset(i);
        let klen = u16::from_le_bytes([self.data[off], self.data[off + 1]]) as usize;
        &self.data[off + 2..off + 2 + klen]
    }

    fn seq(&self, i: usize) -> SeqNo {
        let off = self.offset(i);
        let klen = u16::from_le_bytes([self.data[off], self.data[off + 1]]) as usize;
        let p = off + 2 + klen;
        u64::from_le_bytes(self.data[p..p + 8].try_into().unwrap_or([0; 8]))
    }

    /// Entry `i` (validated at parse time), its key copied: what a scan
    /// or a merge collects may outlive the block by far, and a key must not
    /// hold a whole block in memory (outside the cache's budget).
    pub fn entry(&self, i: usize) -> Entry {
        self.entry_at(i, false)
    }

    /// [`Self::entry`] with a key that shares the block's bytes instead of
    /// a fresh allocation, for a point lookup's answer, which lives no
    /// longer than the lookup's caller needs it (a lookup allocated and
    /// copied each key it found).
    pub fn entry_sharing(&self, i: usize) -> Entry {
        self.entry_at(i, true)
    }

    fn entry_at(&self, i: usize, share: bool) -> Entry {
        let off = self.offset(i);
        let klen = u16::from_le_bytes([self.data[off], self.data[off + 1]]) as usize;
        let p = off + 2 + klen;
        let (kind, tagged, untagged) =
            decode_kind(self.data[p + 8]).unwrap_or((Kind::Delete, false, false));
        let tag_at = p + 9 + PTR_LEN;
        let tag = if tagged {
            Tag::try_from(&self.data[tag_at..tag_at + TAG_LEN])
                .map_or(Tagging::Unknown, Tagging::Tagged)
        } else if untagged {
            Tagging::Untagged
        } else {
            Tagging::Unknown
        };
        Entry {
            key: if share {
                self.data.slice(off + 2..p)
            } else {
                Bytes::copy_from_slice(&self.data[off + 2..p])
            },
            seq: self.seq(i),
            kind,
            ptr: ValuePtr::decode(&self.data[p + 9..tag_at]).unwrap_or_default(),
            tag,
        }
    }

    /// Index of the first entry ordered at or after `(key, seq)`.
    pub fn seek(&self, key: &[u8], seq: SeqNo) -> usize {
        self.search(key, seq, 0, self.count)
    }

    /// [`Self::seek`], starting at `from` when every entry before it is
    /// ordered before `(key, seq)` (the answer to a seek of an earlier key
    /// in this block): it looks 1, 2, 4, ... entries ahead, so a key near
    /// the last costs a comparison or two. Any `from` gives the right
    /// answer; others cost a whole search.
    pub fn seek_from(&self, key: &[u8], seq: SeqNo, from: usize) -> usize {
        let before = |i: usize| entry_order(self.key(i), self.seq(i), key, seq).is_lt();
        if from > self.count || (from > 0 && !before(from - 1)) {
            return self.seek(key, seq);
        }
        // Entries before `lo` are before the target; the one at `hi`, if
        // any, is not.
        let (mut lo, mut step) = (from, 1);
        let hi = loop {
            let i = lo + step - 1;
            if i >= self.count {
                break self.count;
            }
            if !before(i) {
                break i;
            }
            lo = i + 1;
            step *= 2;
        };
        self.search(key, seq, lo, hi)
    }

    /// The first entry of `lo..hi` ordered at or after `(key, seq)` (or
    /// `hi`), where those before `lo` are before it.
    fn search(&self, key: &[u8], seq: SeqNo, mut lo: usize, mut hi: usize) -> usize {
        while lo < hi {
            let mid = (lo + hi) / 2;
            if entry_order(self.key(mid), self.seq(mid), key, seq).is_lt() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Where a data block sits inside its keytable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockHandle {
    /// First key in the block (the level index).
    pub first_key: Bytes,
    /// Page offset from the keytable start.
    pub page: u32,
    /// Pages the block spans.
    pub pages: u32,
}

/// The decoded index of a keytable.
#[derive(Clone, Debug)]
pub struct KeytableIndex {
    /// Blocks in key order.
    pub blocks: Vec<BlockHandle>,
    /// Bloom filter over all keys.
    pub bloom: Bloom,
    /// Number of entries.
    pub entries: u64,
    /// Smallest key.
    pub smallest: Bytes,
    /// Largest key.
    pub largest: Bytes,
}

impl KeytableIndex {
    fn encode(&self) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&self.entries.to_le_bytes());
        p.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for b in &self.blocks {
            p.extend_from_slice(&b.page.to_le_bytes());
            p.extend_from_slice(&b.pages.to_le_bytes());
            put_key(&mut p, &b.first_key);
        }
        self.bloom.encode_to(&mut p);
        put_key(&mut p, &self.smallest);
        put_key(&mut p, &self.largest);
        p
    }

    /// Verifies and decodes the index pages of keytable `id`.
    pub fn decode(b: &[u8], id: u64) -> Result<KeytableIndex> {
        let corrupt = |m: &str| Error::Corrupt(format!("keytable {id} index: {m}"));
        let crc = read_u32(b, 0).ok_or_else(|| corrupt("short"))?;
        let len = read_u32(b, 4).ok_or_else(|| corrupt("short"))? as usize;
        let payload = b.get(8..8 + len).ok_or_else(|| corrupt("length"))?;
        let got = id_crc(id, payload);
        if got != crc {
            return Err(Error::ChecksumMismatch {
                what: "keytable index",
                expected: crc,
                got,
            });
        }
        let mut at = 0;
        let entries = read_u64(payload, at).ok_or_else(|| corrupt("entries"))?;
        at += 8;
        let n = read_u32(payload, at).ok_or_else(|| corrupt("blocks"))? as usize;
        at += 4;
        let mut blocks = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            let page = read_u32(payload, at).ok_or_else(|| corrupt("block page"))?;
            let pages = read_u32(payload, at + 4).ok_or_else(|| corrupt("block pages"))?;
            at += 8;
            let first_key = get_key(payload, &mut at).ok_or_else(|| corrupt("first key"))?;
            blocks.push(BlockHandle {
                first_key,
                page,
                pages,
            });
        }
        let (bloom, used) = Bloom::decode(&payload[at..]).ok_or_else(|| corrupt("bloom"))?;
        at += used;
        let smallest = get_key(payload, &mut at).ok_or_else(|| corrupt("smallest"))?;
        let largest = get_key(payload, &mut at).ok_or_else(|| corrupt("largest"))?;
        Ok(KeytableIndex {
            blocks,
            bloom,
            entries,
            smallest,
            largest,
        })
    }

    /// DRAM the level index part occupies (first keys and handles).
    pub fn index_dram_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| b.first_key.len() + std::mem::size_of::<BlockHandle>())
            .sum()
    }

    /// Whether block `i` is the one [`Self::find_block`] gives for `key`,
    /// found from the block and its successor alone (a lookup of keys in
    /// ascending order asks of the block the last one was found in).
    pub fn is_block_of(&self, i: usize, key: &[u8]) -> bool {
        let Some(block) = self.blocks.get(i) else {
            return false;
        };
        let starts_before = if i == 0 {
            block.first_key.as_ref() <= key
        } else {
            block.first_key.as_ref() < key
        };
        starts_before
            && self
                .blocks
                .get(i + 1)
                .is_none_or(|next| next.first_key.as_ref() >= key)
    }

    /// The block that may hold `key`, if any.
    pub fn find_block(&self, key: &[u8]) -> Option<usize> {
        // Versions of one key may span blocks, so start at the last block
        // whose first key is strictly smaller (its tail may hold the newest
        // versions), or at the first block; callers continue forward.
        if self.blocks.first()?.first_key.as_ref() > key {
            return None;
        }
        let i = self.blocks.partition_point(|b| b.first_key.as_ref() < key);
        Some(i.saturating_sub(1))
    }
}

fn put_key(out: &mut Vec<u8>, k: &[u8]) {
    out.extend_from_slice(&(k.len() as u16).to_le_bytes());
    out.extend_from_slice(k);
}

fn get_key(b: &[u8], at: &mut usize) -> Option<Bytes> {
    let len = read_u16(b, *at)? as usize;
    let k = b.get(*at + 2..*at + 2 + len)?;
    *at += 2 + len;
    Some(Bytes::copy_from_slice(k))
}

/// Builds one keytable in memory from entries added in order.
///
/// Each block is built in a page buffer of its own (header, entries,
/// offsets), appended once to the keytable's bytes and kept as the parsed
/// [`Block`] that warms the cache: no block is copied again or re-verified.
pub struct KeytableBuilder {
    id: u64,
    page_size: usize,
    bits_per_key: usize,
    /// Finished blocks, page-aligned.
    out: Vec<u8>,
    /// The block being built: a header placeholder, then its entries.
    cur: Vec<u8>,
    cur_offsets: Vec<u32>,
    cur_first: Option<Bytes>,
    blocks: Vec<BlockHandle>,
    parsed: Vec<Arc<Block>>,
    hashes: Vec<u64>,
    entries: u64,
    smallest: Option<Bytes>,
    /// The last key added (the largest so far).
    last_key: Vec<u8>,
}

/// A finished keytable: its pages and its decoded index.
pub struct BuiltKeytable {
    /// Keytable id.
    pub id: u64,
    /// Page-aligned bytes: data pages then index pages.
    pub bytes: Vec<u8>,
    /// Number of data pages.
    pub data_pages: u32,
    /// Number of index pages.
    pub index_pages: u32,
    /// The decoded index.
    pub index: KeytableIndex,
    /// Data blocks, already parsed (to warm the cache).
    pub blocks: Vec<Arc<Block>>,
}

impl KeytableBuilder {
    /// Starts keytable `id`.
    #[cfg(test)]
    pub fn new(id: u64, page_size: usize, bits_per_key: usize) -> Self {
        Self::reusing(id, page_size, bits_per_key, Vec::new())
    }

    /// Starts keytable `id`, building its bytes in `out` (cleared first; a
    /// finished keytable's bytes, so its memory is used again).
    pub fn reusing(id: u64, page_size: usize, bits_per_key: usize, mut out: Vec<u8>) -> Self {
        out.clear();
        KeytableBuilder {
            id,
            page_size,
            bits_per_key,
            out,
            cur: Self::empty_block(page_size),
            cur_offsets: Vec::new(),
            cur_first: None,
            blocks: Vec::new(),
            parsed: Vec::new(),
            hashes: Vec::new(),
            entries: 0,
            smallest: None,
            last_key: Vec::new(),
        }
    }

    /// A block buffer holding only its (placeholder) header.
    fn empty_block(page_size: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(page_size);
        b.resize(BLOCK_HEADER, 0);
        b
    }

    /// Bytes written so far (approximate final size).
    pub fn estimated_bytes(&self) -> usize {
        self.out.len() + self.cur.len() + 4 * self.cur_offsets.len()
    }

    /// Number of entries added.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Adds an entry; entries must arrive in [`entry_order`].
    pub fn add(&mut self, e: &Entry) {
        let (code, tag) = match (e.kind, e.tag) {
            (Kind::Put, Tagging::Tagged(t)) => (CODE_PUT_TAGGED, Some(t)),
            (Kind::Put, Tagging::Untagged) => (CODE_PUT_UNTAGGED, None),
            (kind, _) => (kind.code(), None),
        };
        let elen = ENTRY_FIXED + e.key.len() + if tag.is_some() { TAG_LEN } else { 0 };
        let used = self.cur.len() + 4 * (self.cur_offsets.len() + 1) + elen;
        if !self.cur_offsets.is_empty() && used > self.page_size {
            self.finish_block();
        }
        // Keys kept for the keytable's life are copies: an entry's key may
        // be a slice of a memtable's shared key chunk, which it would pin.
        if self.cur_offsets.is_empty() {
            self.cur_first = Some(Bytes::copy_from_slice(&e.key));
        }
        self.cur_offsets.push(self.cur.len() as u32);
        self.cur
            .extend_from_slice(&(e.key.len() as u16).to_le_bytes());
        self.cur.extend_from_slice(&e.key);
        self.cur.extend_from_slice(&e.seq.to_le_bytes());
        self.cur.push(code);
        e.ptr.encode_to(&mut self.cur);
        if let Some(tag) = tag {
            self.cur.extend_from_slice(&tag);
        }
        if self.entries == 0 {
            self.smallest = Some(Bytes::copy_from_slice(&e.key));
        }
        if self.entries == 0 || self.last_key[..] != e.key[..] {
            self.hashes.push(Bloom::hash(&e.key));
            self.last_key.clear();
            self.last_key.extend_from_slice(&e.key);
        }
        self.entries += 1;
    }

    fn finish_block(&mut self) {
        let count = self.cur_offsets.len();
        let data_len = self.cur.len() - BLOCK_HEADER;
        for o in &self.cur_offsets {
            self.cur.extend_from_slice(&o.to_le_bytes());
        }
        self.cur[4..8].copy_from_slice(&(count as u32).to_le_bytes());
        self.cur[8..12].copy_from_slice(&(data_len as u32).to_le_bytes());
        let crc = id_crc(self.id, &self.cur[4..]);
        self.cur[0..4].copy_from_slice(&crc.to_le_bytes());
        let padded = self.cur.len().div_ceil(self.page_size) * self.page_size;
        self.cur.resize(padded, 0);
        let start = self.out.len();
        self.out.extend_from_slice(&self.cur);
        self.blocks.push(BlockHandle {
            first_key: self.cur_first.take().unwrap_or_default(),
            page: (start / self.page_size) as u32,
            pages: (padded / self.page_size) as u32,
        });
        let data = std::mem::replace(&mut self.cur, Self::empty_block(self.page_size));
        debug_assert!(
            Block::parse(data.clone(), self.id).is_ok(),
            "a built block parses"
        );
        self.parsed.push(Arc::new(Block {
            data: Bytes::from(data),
            count,
            offsets_at: BLOCK_HEADER + data_len,
        }));
        self.cur_offsets.clear();
    }

    /// Finishes the keytable. REQUIRES: at least one entry was added.
    pub fn finish(mut self) -> Result<BuiltKeytable> {
        if !self.cur_offsets.is_empty() {
            self.finish_block();
        }
        let data_pages = (self.out.len() / self.page_size) as u32;
        let index = KeytableIndex {
            blocks: std::mem::take(&mut self.blocks),
            bloom: Bloom::build(&self.hashes, self.bits_per_key),
            entries: self.entries,
            smallest: self.smallest.take().unwrap_or_default(),
            largest: Bytes::copy_from_slice(&self.last_key),
        };
        let payload = index.encode();
        let mut out = self.out;
        out.extend_from_slice(&id_crc(self.id, &payload).to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        let padded = out.len().div_ceil(self.page_size) * self.page_size;
        out.resize(padded, 0);
        let index_pages = (padded / self.page_size) as u32 - data_pages;
        Ok(BuiltKeytable {
            id: self.id,
            bytes: out,
            data_pages,
            index_pages,
            index,
            blocks: self.parsed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(k: &str, seq: u64) -> Entry {
        Entry {
            ptr: ValuePtr {
                seg: 1,
                gen: 2,
                offset: seq as u32,
                len: 9,
                value_crc: seq as u32 ^ 0xdead_beef,
            },
            // All three encodings of a put in one keytable.
            tag: match seq % 3 {
                0 => Tagging::Tagged([seq as u8; TAG_LEN]),
                1 => Tagging::Untagged,
                _ => Tagging::Unknown,
            },
            ..crate::test_support::put_entry(k, seq)
        }
    }

    #[test]
    fn build_and_search() {
        let mut b = KeytableBuilder::new(9, 512, 10);
        for i in 0..200u64 {
            b.add(&e(&format!("key{i:05}"), 1000 - i));
        }
        let kt = b.finish().expect("built");
        assert!(kt.index.blocks.len() > 5);
        let idx =
            KeytableIndex::decode(&kt.bytes[kt.data_pages as usize * 512..], 9).expect("index");
        assert_eq!(idx.entries, 200);
        assert_eq!(idx.blocks, kt.index.blocks);
        let bi = idx.find_block(b"key00123").expect("block");
        let block = &kt.blocks[bi];
        let i = block.seek(b"key00123", u64::MAX);
        assert_eq!(block.entry(i), e("key00123", 1000 - 123));
        for k in [120u64, 121, 122] {
            let key = format!("key{k:05}");
            let bi = idx.find_block(key.as_bytes()).expect("block");
            let block = &kt.blocks[bi];
            let got = block.entry(block.seek(key.as_bytes(), u64::MAX));
            assert_eq!(got, e(&key, 1000 - k));
            assert_eq!(
                matches!(got.tag, Tagging::Tagged(_)),
                (1000 - k).is_multiple_of(3)
            );
        }
        assert!(idx.bloom.may_contain(Bloom::hash(b"key00123")));
        assert!(KeytableIndex::decode(&kt.bytes[kt.data_pages as usize * 512..], 10).is_err());
    }

    #[test]
    fn a_block_is_the_one_found_for_a_key_exactly_when_find_block_says_so() {
        // Several versions of some keys, so that versions span blocks and
        // blocks start with equal first keys.
        let mut b = KeytableBuilder::new(9, 512, 10);
        for i in 0..120u64 {
            for v in 0..(1 + i % 4) {
                b.add(&e(&format!("key{i:05}"), 1000 - v));
            }
        }
        let idx = b.finish().expect("built").index;
        assert!(idx.blocks.len() > 5);
        let mut probes: Vec<String> = (0..125u64).map(|i| format!("key{i:05}")).collect();
        probes.extend(["a".into(), "key".into(), "key00050x".into(), "z".into()]);
        for k in &probes {
            let found = idx.find_block(k.as_bytes());
            for i in 0..idx.blocks.len() + 1 {
                assert_eq!(
                    idx.is_block_of(i, k.as_bytes()),
                    found == Some(i),
                    "key {k} block {i} (find_block: {found:?})"
                );
            }
        }
    }

    #[test]
    fn seeking_from_anywhere_finds_what_a_seek_finds() {
        let mut b = KeytableBuilder::new(9, 4096, 10);
        for i in 0..60u64 {
            for v in 0..(1 + i % 3) {
                b.add(&e(&format!("key{:05}", i * 2), 1000 - v));
            }
        }
        let kt = b.finish().expect("built");
        let block = &kt.blocks[0];
        assert!(block.len() > 40, "one block with many entries");
        for k in 0..125u64 {
            let key = format!("key{k:05}");
            for seq in [0, 999, 1000, u64::MAX] {
                let want = block.seek(key.as_bytes(), seq);
                for from in 0..block.len() + 2 {
                    assert_eq!(
                        block.seek_from(key.as_bytes(), seq, from),
                        want,
                        "key {key} seq {seq} from {from}"
                    );
                }
            }
        }
    }

    /// The blocks a builder hands to the cache are the blocks its bytes
    /// hold, and a builder reusing an earlier keytable's buffer writes
    /// exactly what a fresh one does.
    #[test]
    fn built_blocks_match_the_bytes_and_reuse_changes_nothing() {
        let build = |b: &mut KeytableBuilder| {
            for i in 0..300u64 {
                // Some keys twice (two versions), the last longer than a page.
                let key = if i == 299 {
                    "x".repeat(700)
                } else {
                    format!("key{:05}", i / 2 * 2)
                };
                b.add(&e(&key, 5000 - i));
            }
        };
        let mut fresh = KeytableBuilder::new(4, 512, 10);
        build(&mut fresh);
        let fresh = fresh.finish().expect("built");
        let dirty = vec![0xa5u8; 4096];
        let mut reused = KeytableBuilder::reusing(4, 512, 10, dirty);
        build(&mut reused);
        let reused = reused.finish().expect("built");
        assert_eq!(fresh.bytes, reused.bytes);
        assert_eq!(fresh.blocks.len(), fresh.index.blocks.len());
        for (h, block) in fresh.index.blocks.iter().zip(&fresh.blocks) {
            let s = h.page as usize * 512;
            let parsed = Block::parse(fresh.bytes[s..s + h.pages as usize * 512].to_vec(), 4)
                .expect("parses");
            assert_eq!(parsed.len(), block.len());
            for i in 0..block.len() {
                assert_eq!(parsed.entry(i), block.entry(i));
            }
        }
        assert_eq!(fresh.index.largest.as_ref(), "x".repeat(700).as_bytes());
    }

    #[test]
    fn corrupt_block_is_rejected() {
        let mut b = KeytableBuilder::new(1, 512, 10);
        b.add(&e("a", 1));
        let kt = b.finish().expect("built");
        let mut page = kt.bytes[..512].to_vec();
        page[20] ^= 0x40;
        assert!(Block::parse(page, 1).is_err());
        let mut page = kt.bytes[..512].to_vec();
        page[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Block::parse(page, 1).is_err());
    }

    #[test]
    fn oversized_entry_spans_pages() {
        let mut b = KeytableBuilder::new(3, 512, 10);
        b.add(&e(&"x".repeat(1000), 5));
        b.add(&e(&"y".repeat(10), 4));
        let kt = b.finish().expect("built");
        assert_eq!(kt.index.blocks[0].pages, 3);
        assert_eq!(kt.blocks[1].entry(0).key.len(), 10);
    }
}
