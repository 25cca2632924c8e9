//! Operation counters of devices and the segment store's statistics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Cumulative operation counters of a [`crate::Device`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Read calls (one `read_at`, or one request of `read_many`, is one op).
    pub read_ops: u64,
    /// Pages touched by reads.
    pub pages_read: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// `write_at` calls.
    pub write_ops: u64,
    /// Pages written.
    pub pages_written: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// `sync` calls.
    pub syncs: u64,
    /// `trim` calls.
    pub trims: u64,
    /// Pages covered by trims.
    pub pages_trimmed: u64,
}

/// Statistics of a [`crate::FlashStore`].
#[derive(Clone, Debug, Default)]
pub struct FlashStats {
    /// Number of data segments.
    pub segments_total: u32,
    /// Segments in state Free.
    pub segments_free: u32,
    /// Segments in state Used (including ones being allocated right now).
    pub segments_used: u32,
    /// Segments released but waiting for the next checkpoint.
    pub segments_pending_free: u32,
    /// Free segments whose blocks are allocated on the host file system
    /// (the reserve a full host cannot take away).
    pub segments_backed: u32,
    /// The host file system had no room for the last segment to back: only
    /// backed segments are handed out until one can be backed again.
    pub host_full: bool,
    /// Highest erase count of any segment.
    pub erase_count_max: u32,
    /// Mean erase count over all segments.
    pub erase_count_avg: f64,
    /// Checkpoints completed by this store instance (format's included).
    pub checkpoints: u64,
    /// Counters of the underlying device.
    pub device: DeviceCounters,
}

/// Lock-free accumulator behind [`DeviceCounters`]; shared by all device threads.
#[derive(Debug, Default)]
pub(crate) struct AtomicCounters {
    read_ops: AtomicU64,
    pages_read: AtomicU64,
    bytes_read: AtomicU64,
    write_ops: AtomicU64,
    pages_written: AtomicU64,
    bytes_written: AtomicU64,
    syncs: AtomicU64,
    trims: AtomicU64,
    pages_trimmed: AtomicU64,
}

/// Number of `page_size` pages that the byte range `offset..offset+len` touches.
pub(crate) fn pages_touched(offset: u64, len: u64, page_size: u32) -> u64 {
    if len == 0 {
        return 0;
    }
    let ps = u64::from(page_size);
    (offset + len - 1) / ps - offset / ps + 1
}

impl AtomicCounters {
    pub(crate) fn record_read(&self, pages: u64, bytes: u64) {
        self.read_ops.fetch_add(1, Ordering::Relaxed);
        self.pages_read.fetch_add(pages, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_write(&self, pages: u64, bytes: u64) {
        self.write_ops.fetch_add(1, Ordering::Relaxed);
        self.pages_written.fetch_add(pages, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_trim(&self, pages: u64) {
        self.trims.fetch_add(1, Ordering::Relaxed);
        self.pages_trimmed.fetch_add(pages, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DeviceCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DeviceCounters {
            read_ops: get(&self.read_ops),
            pages_read: get(&self.pages_read),
            bytes_read: get(&self.bytes_read),
            write_ops: get(&self.write_ops),
            pages_written: get(&self.pages_written),
            bytes_written: get(&self.bytes_written),
            syncs: get(&self.syncs),
            trims: get(&self.trims),
            pages_trimmed: get(&self.pages_trimmed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_touched_counts_partial_pages() {
        assert_eq!(pages_touched(0, 0, 8192), 0);
        assert_eq!(pages_touched(0, 4096, 8192), 1);
        assert_eq!(pages_touched(4096, 8192, 8192), 2);
        assert_eq!(pages_touched(8192, 8192, 8192), 1);
    }

    #[test]
    fn counters_accumulate() {
        let c = AtomicCounters::default();
        c.record_read(2, 100);
        c.record_read(1, 10);
        c.record_write(3, 300);
        c.record_trim(5);
        c.record_sync();
        let s = c.snapshot();
        assert_eq!((s.read_ops, s.pages_read, s.bytes_read), (2, 3, 110));
        assert_eq!((s.write_ops, s.pages_written, s.bytes_written), (1, 3, 300));
        assert_eq!((s.trims, s.pages_trimmed, s.syncs), (1, 5, 1));
    }
}
