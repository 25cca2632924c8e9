//! `flash` owns the raw storage of a LightStore drive: an append-only segment
//! store, i.e. the LightStore paper's hardware FTL done in software. It
//! provides the [`Device`] abstraction over an array of fixed-size pages (a
//! [`FileDevice`] on a file or raw block device, or an in-memory emulated
//! [`NandDevice`] with power-loss injection for crash tests), and on top of it
//! the [`FlashStore`]: pages grouped into segments that are written
//! append-only and reclaimed only whole (erase/TRIM), plus a small segment
//! table and an opaque user blob (the engine's manifest) persisted atomically
//! by checkpoints in two ping-pong slots behind a checksummed superblock.
//! Everything above whole segments (what the bytes mean, which segments are
//! live) belongs to the engine. A [`ReadQueue`] lets an event loop run
//! store reads asynchronously on io_uring.

#![deny(missing_docs)]

mod backing;
mod checkpoint;
mod codec;
mod device;
mod error;
mod file;
mod iopool;
pub mod iotime;
mod joined;
mod latency;
mod nand;
mod readqueue;
mod stats;
mod store;
mod superblock;
mod uring;

pub use backing::Purpose;
pub use device::{AlignedBuf, Device};
pub use error::{FlashError, Result};
pub use file::FileDevice;
pub use latency::{
    bucket_bound_us, bucket_of, micros, DeviceLatency, DeviceLatencySnapshot, DeviceOp, Histogram,
    HistogramSnapshot, BUCKETS,
};
pub use nand::{LossMode, NandConfig, NandDevice};
pub use readqueue::{read_now, DirectRead, LandingSpace, ReadQueue, MAX_MERGED_READ, MAX_READ_GAP};
pub use stats::{DeviceCounters, FlashStats};
pub use store::{FlashStore, FormatOptions, Geometry, SegmentInfo, SegmentState};
pub use uring::{io_uring_available, io_uring_for_tests};

/// Index of a data segment of a [`FlashStore`], `0..segment_count`.
pub type SegmentId = u32;

/// Default page size of devices: 8 KiB, a typical NAND page.
pub const DEFAULT_PAGE_SIZE: u32 = 8192;

/// Alignment required for read offsets, read lengths and I/O buffer addresses
/// (the O_DIRECT requirement of common Linux file systems and block devices).
pub const IO_ALIGN: usize = 4096;

/// Granularity of read offsets and lengths: the 512-byte logical block of
/// common devices. A small value read this way moves little more than the
/// value; a device or file system that cannot do sub-4 KiB direct reads
/// widens them to [`IO_ALIGN`] internally.
pub const READ_ALIGN: usize = 512;
