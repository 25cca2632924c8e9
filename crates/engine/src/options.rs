//! Engine settings with sane defaults.

use std::time::Duration;

/// When an acknowledged write is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged only after its log page is synced; concurrent writers
    /// share one device sync (group commit).
    Sync,
    /// The log is synced every `interval`; a crash loses at most that window.
    Interval(Duration),
    /// No explicit sync; data reaches the device as log pages fill up.
    None,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Durability::Sync),
            "none" => Ok(Durability::None),
            "interval" => Ok(Durability::Interval(Duration::from_millis(100))),
            other => match other.strip_prefix("interval:") {
                Some(ms) => ms
                    .parse::<u64>()
                    .map(|ms| Durability::Interval(Duration::from_millis(ms)))
                    .map_err(|_| format!("bad interval in {other:?}")),
                None => Err(format!(
                    "unknown durability {other:?} (sync, interval, interval:MS, none)"
                )),
            },
        }
    }
}

/// Engine options. `Options::default()` suits a real device; tests shrink
/// the sizes to force flushes, compactions and GC.
#[derive(Clone, Debug)]
pub struct Options {
    /// Durability of acknowledged writes.
    pub durability: Durability,
    /// Largest accepted key, bytes (at most 8 KiB).
    pub max_key_size: usize,
    /// Largest accepted value, bytes. Default 64 MiB; clamped to what fits in
    /// one value-log segment (segments are 128 MiB on devices of 2 GiB and
    /// more, smaller on smaller devices).
    pub max_value_size: usize,
    /// DRAM the L0 memtable holds before it is flushed: key bytes plus a
    /// per-entry overhead, and per key the slot of its point index.
    pub memtable_bytes: usize,
    /// Log bytes written since the last flush that force a flush (bounds recovery time).
    pub memtable_log_bytes: u64,
    /// Target keytable size in bytes.
    pub keytable_bytes: usize,
    /// Keytable bytes of the first level below the flushed runs while the
    /// bottom level is no larger; the levels between grow by one ratio from
    /// this to the bottom's size (see `shape.rs`).
    pub l1_bytes: u64,
    /// Largest size ratio between adjacent levels: past it, a new level
    /// starts at the top.
    pub level_ratio: u64,
    /// Total DRAM budget for level index, keytable cache and Bloom filters.
    pub dram_budget: usize,
    /// Keytable cache budget (within the DRAM budget).
    pub cache_bytes: usize,
    /// Bloom filter bits per key.
    pub bloom_bits_per_key: usize,
    /// A sealed value segment whose live fraction is below this is a GC candidate.
    pub gc_live_threshold: f64,
    /// While at least half the device is free, clean only nearly empty
    /// segments (live fraction under 0.1): relocating values then buys space
    /// nobody needs yet, takes device time and CPU from requests, and costs
    /// less later, when the segments hold more garbage. On by default; with
    /// small values eager GC was a third of a random fill's CPU, spent on
    /// looking up and re-inserting records (`bench/RESULTS.md`).
    pub lazy_gc: bool,
    /// Free segments kept back from user writes for GC and compaction.
    pub reserved_segments: u32,
    /// The first tag byte (see `tag.rs`) of values that are tombstones of
    /// an upper layer (the node's versioned deletes): a batch of nothing
    /// but deletes and such minimal tagged values (magic and tag alone)
    /// frees space like plain deletes and may use the delete reserve when
    /// the device is full. `None`: only plain deletes do.
    pub tombstone_tag: Option<u8>,
    /// Size of one log write chunk (written as one device I/O), bytes.
    pub log_chunk_bytes: usize,
    /// Segment size in pages used when formatting a blank device (`None`:
    /// 128 MiB, smaller on small devices so there are at least 16 segments).
    pub format_segment_pages: Option<u32>,
    /// Longest a write waits for the memtable flush when flushing has
    /// fallen far behind; past it the write fails with
    /// [`crate::Error::WriteStall`].
    pub max_write_stall: Duration,
    /// Run background work (flush, compaction, GC) on a thread. Tests may turn
    /// it off and call `Db::maintenance` themselves for determinism.
    pub background: bool,
    /// How long writes must have stopped before background maintenance
    /// merges the flushed runs left above L1 (up to seven after a load:
    /// a point read probes each one's Bloom filter, a scan merges them
    /// all). `None`: only when enough runs pile up.
    pub idle_merge_after: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Interval(Duration::from_millis(100)),
            max_key_size: 8 * 1024,
            max_value_size: 64 * 1024 * 1024,
            memtable_bytes: 128 * 1024 * 1024,
            memtable_log_bytes: 1024 * 1024 * 1024,
            keytable_bytes: 2 * 1024 * 1024,
            l1_bytes: 256 * 1024 * 1024,
            level_ratio: 4,
            dram_budget: 1024 * 1024 * 1024,
            cache_bytes: 768 * 1024 * 1024,
            bloom_bits_per_key: 10,
            gc_live_threshold: 0.5,
            lazy_gc: true,
            reserved_segments: 3,
            tombstone_tag: None,
            log_chunk_bytes: 1024 * 1024,
            format_segment_pages: None,
            max_write_stall: Duration::from_secs(30),
            background: true,
            idle_merge_after: Some(Duration::from_secs(10)),
        }
    }
}

impl Options {
    /// Small sizes that make every mechanism run often; for tests.
    pub fn small_for_tests() -> Self {
        Options {
            durability: Durability::None,
            max_key_size: 1024,
            max_value_size: 16 * 1024,
            memtable_bytes: 4 * 1024,
            memtable_log_bytes: 64 * 1024,
            keytable_bytes: 8 * 1024,
            l1_bytes: 8 * 1024,
            level_ratio: 4,
            dram_budget: 64 * 1024 * 1024,
            cache_bytes: 32 * 1024 * 1024,
            bloom_bits_per_key: 10,
            gc_live_threshold: 0.5,
            lazy_gc: false,
            reserved_segments: 3,
            tombstone_tag: None,
            log_chunk_bytes: 16 * 1024,
            format_segment_pages: Some(16),
            max_write_stall: Duration::from_secs(30),
            background: false,
            idle_merge_after: Some(Duration::from_millis(200)),
        }
    }
}
