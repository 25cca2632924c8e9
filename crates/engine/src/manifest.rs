//! The manifest: the engine state persisted in every flash checkpoint —
//! levels and their keytables, value-log segment accounting, the log position
//! recovery replays from, and counters. Encoded little-endian, versioned; the
//! flash layer checksums the whole blob.

use bytes::Bytes;
use flash::SegmentId;

use crate::error::{Error, Result};
use crate::types::SeqNo;
use crate::vlog::{LogPosition, SegMeta};

/// 2: value pointers carry their value's checksum (20 bytes, was 16).
const MANIFEST_VERSION: u32 = 2;

/// Where a keytable lives (its index is read from the device at open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeytableMeta {
    /// Keytable id.
    pub id: u64,
    /// Segment.
    pub seg: SegmentId,
    /// First page in the segment.
    pub first_page: u32,
    /// Data pages.
    pub data_pages: u32,
    /// Index pages.
    pub index_pages: u32,
    /// Smallest key.
    pub smallest: Bytes,
    /// Largest key.
    pub largest: Bytes,
}

/// Persistent counters (statistics that survive restarts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Key + value bytes written by users.
    pub user_bytes: u64,
    /// Device bytes written.
    pub device_bytes: u64,
}

/// Engine state in a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Incremented by every open; epochs are `boot << 32 | n`.
    pub boot: u64,
    /// Largest sequence number in the keytables.
    pub last_seq: SeqNo,
    /// Next keytable id.
    pub next_keytable_id: u64,
    /// Recovery scans the log from here.
    pub replay: LogPosition,
    /// Value-log segments and their accounting.
    pub log_segments: Vec<(SegmentId, SegMeta)>,
    /// Keytables per level (index 0 = L1).
    pub levels: Vec<Vec<KeytableMeta>>,
    /// The keytable segment being filled, if any.
    pub keytable_segment: Option<SegmentId>,
    /// How many of the first `levels` are flushed runs (see
    /// [`crate::version::Version::runs`]). Written last; a manifest without
    /// it (written before runs) has none. A binary from before runs reads
    /// them as ordinary levels, which is still correct: each level is
    /// sorted, and newer than the levels below it.
    pub runs: u32,
    /// Counters.
    pub counters: Counters,
}

struct W(Vec<u8>);
impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a>(&'a [u8], usize);
impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.1.checked_add(n).filter(|&e| e <= self.0.len());
        let end = end.ok_or_else(|| Error::Corrupt("manifest truncated".into()))?;
        let s = &self.0[self.1..end];
        self.1 = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<Bytes> {
        let n = self.u32()? as usize;
        Ok(Bytes::copy_from_slice(self.take(n)?))
    }
    fn count(&mut self) -> Result<usize> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return Err(Error::Corrupt(format!("manifest count {n} out of range")));
        }
        Ok(n)
    }
}

impl Manifest {
    /// Serializes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::new());
        w.u32(MANIFEST_VERSION);
        w.u64(self.boot);
        w.u64(self.last_seq);
        w.u64(self.next_keytable_id);
        w.u32(self.replay.seg);
        w.u32(self.replay.offset);
        w.u64(self.replay.epoch);
        w.u32(self.log_segments.len() as u32);
        for (seg, m) in &self.log_segments {
            w.u32(*seg);
            w.u64(m.epoch);
            w.u32(m.gen);
            w.u64(m.live_bytes);
            w.u64(m.written_bytes);
            w.u8(u8::from(m.sealed));
        }
        w.u32(self.levels.len() as u32);
        for level in &self.levels {
            w.u32(level.len() as u32);
            for kt in level {
                w.u64(kt.id);
                w.u32(kt.seg);
                w.u32(kt.first_page);
                w.u32(kt.data_pages);
                w.u32(kt.index_pages);
                w.bytes(&kt.smallest);
                w.bytes(&kt.largest);
            }
        }
        match self.keytable_segment {
            Some(s) => {
                w.u8(1);
                w.u32(s);
            }
            None => w.u8(0),
        }
        w.u64(self.counters.user_bytes);
        w.u64(self.counters.device_bytes);
        w.u32(self.runs);
        w.0
    }

    /// Parses; every count and length is bounds-checked.
    pub fn decode(b: &[u8]) -> Result<Manifest> {
        let mut r = R(b, 0);
        let version = r.u32()?;
        if version != MANIFEST_VERSION {
            return Err(Error::UnsupportedFormat {
                found: version,
                supported: MANIFEST_VERSION,
            });
        }
        let mut m = Manifest {
            boot: r.u64()?,
            last_seq: r.u64()?,
            next_keytable_id: r.u64()?,
            replay: LogPosition {
                seg: r.u32()?,
                offset: r.u32()?,
                epoch: r.u64()?,
            },
            ..Manifest::default()
        };
        for _ in 0..r.count()? {
            let seg = r.u32()?;
            let meta = SegMeta {
                epoch: r.u64()?,
                gen: r.u32()?,
                live_bytes: r.u64()?,
                written_bytes: r.u64()?,
                sealed: r.u8()? != 0,
            };
            m.log_segments.push((seg, meta));
        }
        for _ in 0..r.count()? {
            let mut level = Vec::new();
            for _ in 0..r.count()? {
                level.push(KeytableMeta {
                    id: r.u64()?,
                    seg: r.u32()?,
                    first_page: r.u32()?,
                    data_pages: r.u32()?,
                    index_pages: r.u32()?,
                    smallest: r.bytes()?,
                    largest: r.bytes()?,
                });
            }
            m.levels.push(level);
        }
        if r.u8()? == 1 {
            m.keytable_segment = Some(r.u32()?);
        }
        m.counters.user_bytes = r.u64()?;
        m.counters.device_bytes = r.u64()?;
        if r.1 < r.0.len() {
            m.runs = r.u32()?;
            if m.runs as usize > m.levels.len() {
                return Err(Error::Corrupt(format!(
                    "manifest: {} flushed runs in {} levels",
                    m.runs,
                    m.levels.len()
                )));
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let m = Manifest {
            boot: 3,
            last_seq: 99,
            next_keytable_id: 7,
            replay: LogPosition {
                seg: 4,
                offset: 8192,
                epoch: (3 << 32) | 5,
            },
            log_segments: vec![(4, SegMeta::default())],
            levels: vec![vec![KeytableMeta {
                id: 6,
                seg: 9,
                first_page: 0,
                data_pages: 2,
                index_pages: 1,
                smallest: Bytes::from_static(b"a"),
                largest: Bytes::from_static(b"z"),
            }]],
            keytable_segment: Some(9),
            counters: Counters::default(),
            runs: 1,
        };
        let enc = m.encode();
        assert_eq!(Manifest::decode(&enc).expect("decodes"), m);
        // Without its last field it is a manifest from before flushed runs.
        let before_runs = enc.len() - 4;
        for cut in 0..enc.len() {
            assert_eq!(
                Manifest::decode(&enc[..cut]).is_ok(),
                cut == before_runs,
                "cut {cut}"
            );
        }
        let old_style = Manifest::decode(&enc[..before_runs]).expect("decodes");
        assert_eq!(
            old_style,
            Manifest {
                runs: 0,
                ..m.clone()
            }
        );
        let too_many = Manifest {
            runs: 2,
            ..m.clone()
        };
        assert!(matches!(
            Manifest::decode(&too_many.encode()),
            Err(Error::Corrupt(_))
        ));
        let mut old = enc.clone();
        old[..4].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            Manifest::decode(&old),
            Err(Error::UnsupportedFormat {
                found: 1,
                supported: MANIFEST_VERSION
            })
        ));
    }
}
