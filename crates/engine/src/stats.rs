//! Engine statistics: a point-in-time copy of every counter an operator or
//! benchmark needs (write amplification, reads per GET, DRAM by part, GC).

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, updated with relaxed atomics.
#[derive(Default)]
pub struct Counters {
    pub(crate) user_bytes: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) get_device_reads: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) flushes_during_merges: AtomicU64,
    pub(crate) compactions: AtomicU64,
    pub(crate) compaction_bytes_written: AtomicU64,
    pub(crate) gc_runs: AtomicU64,
    pub(crate) gc_deep_passes: AtomicU64,
    pub(crate) gc_segments_reclaimed: AtomicU64,
    pub(crate) gc_bytes_relocated: AtomicU64,
    pub(crate) gc_bytes_scanned: AtomicU64,
    pub(crate) recluster_bytes: AtomicU64,
    pub(crate) write_throttle_micros: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// A snapshot of the engine's statistics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Key + value bytes written by users (persisted across restarts).
    pub user_bytes_written: u64,
    /// Bytes written to the device (log, keytables, checkpoints).
    pub device_bytes_written: u64,
    /// `device_bytes_written / user_bytes_written`.
    pub write_amplification: f64,
    /// GET calls since open.
    pub gets: u64,
    /// Device reads (value and keytable) made by those GETs.
    pub get_device_reads: u64,
    /// `get_device_reads / gets` (1.0 when all keytables are cached).
    pub device_reads_per_get: f64,
    /// Level index DRAM (first key of every keytable block).
    pub dram_index_bytes: u64,
    /// Keytable cache DRAM in use.
    pub dram_cache_bytes: u64,
    /// Bloom filter DRAM in use.
    pub dram_bloom_bytes: u64,
    /// Memtable DRAM (keys and pointers).
    pub dram_memtable_bytes: u64,
    /// The configured DRAM budget.
    pub dram_budget_bytes: u64,
    /// Keytables per level: first the flushed runs (newest first), then
    /// L1..Ln.
    pub keytables_per_level: Vec<usize>,
    /// How many of the first levels are flushed runs.
    pub flushed_runs: usize,
    /// Keytable bytes per level.
    pub bytes_per_level: Vec<u64>,
    /// Entries in the memtables.
    pub memtable_entries: u64,
    /// Sorted runs of the active memtable: what a scan seeks and merges
    /// (background maintenance merges them when scans find many).
    pub memtable_runs: u64,
    /// Memtable flushes.
    pub flushes: u64,
    /// Of those, flushes made between two keytables of a merge of the
    /// flushed runs into L1, so that writers did not wait for the merge.
    pub flushes_during_merges: u64,
    /// Compactions.
    pub compactions: u64,
    /// Keytable bytes written by flushes and compactions.
    pub compaction_bytes_written: u64,
    /// GC passes.
    pub gc_runs: u64,
    /// GC passes that cleaned a segment too live for the low-space
    /// threshold, once nothing cheaper could release space (`gc.rs`).
    pub gc_deep_passes: u64,
    /// Value segments reclaimed by GC.
    pub gc_segments_reclaimed: u64,
    /// Bytes of live values GC re-inserted.
    pub gc_bytes_relocated: u64,
    /// Bytes GC read from victim segments.
    pub gc_bytes_scanned: u64,
    /// Bytes of records reclustering rewrote in key order (`recluster.rs`).
    pub recluster_bytes: u64,
    /// Bytes appended to value-log segments still held.
    pub log_bytes: u64,
    /// Of those, bytes of values still referenced.
    pub log_live_bytes: u64,
    /// `1 - live / written` over value-log segments.
    pub garbage_ratio: f64,
    /// Segments on the device / free / used.
    pub segments_total: u32,
    /// Free segments.
    pub segments_free: u32,
    /// Free segments whose blocks are allocated on the host file system:
    /// the room deletes, GC and flushes keep when other files fill it.
    pub segments_backed: u32,
    /// Bytes per segment.
    pub segment_bytes: u64,
    /// Value-log segments in use.
    pub segments_log: u32,
    /// Time writers spent slowed down by backpressure, microseconds.
    pub write_throttle_micros: u64,
    /// Checkpoints written since open.
    pub checkpoints: u64,
    /// Largest segment erase count (wear).
    pub erase_count_max: u32,
    /// Last sequence number.
    pub last_seq: u64,
    /// Writes are refused because the host file system holding the device
    /// file is full; they resume by themselves once space is freed there.
    pub host_full: bool,
    /// Why every write is refused until the store is reopened (a device
    /// write or sync failed), if it is.
    pub device_failed: Option<String>,
    /// How long each kind of device operation took since open.
    pub device_latency: flash::DeviceLatencySnapshot,
}
