//! [`DeviceLatency`]: a latency histogram (the `latency` crate's log2
//! buckets of microseconds) per device operation, which a
//! [`crate::FlashStore`] keeps so that an operator can tell a slow device
//! from a slow store (`INFO device` on a node).
//!
//! What a sample covers: a synchronous call ([`DeviceOp::Write`],
//! [`DeviceOp::Sync`], a read or a batch of reads, a [`DeviceOp::Prepare`]
//! that allocates a segment's blocks, a [`DeviceOp::Trim`]) from its start
//! to its return; a read on a [`crate::ReadQueue`] from when it was queued
//! to when its completion was reaped.

use std::time::Duration;

pub use latency::{bucket_bound_us, bucket_of, micros, Histogram, HistogramSnapshot, BUCKETS};

/// A kind of device operation timed by [`DeviceLatency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// A write of whole pages (one log chunk, a keytable, a checkpoint).
    Write,
    /// A read, a batch of reads issued together, or one read on a
    /// [`crate::ReadQueue`].
    Read,
    /// Making everything written durable (`fdatasync`).
    Sync,
    /// Allocating a segment's blocks on the host before it is used (on a
    /// device file: `fallocate`).
    Prepare,
    /// Giving a segment's blocks back (hole punch, discard).
    Trim,
}

impl DeviceOp {
    /// Every operation, in report order.
    pub const ALL: [DeviceOp; 5] = [
        DeviceOp::Write,
        DeviceOp::Read,
        DeviceOp::Sync,
        DeviceOp::Prepare,
        DeviceOp::Trim,
    ];

    /// Its name in reports (`INFO device`).
    pub fn name(self) -> &'static str {
        match self {
            DeviceOp::Write => "write",
            DeviceOp::Read => "read",
            DeviceOp::Sync => "sync",
            DeviceOp::Prepare => "prepare",
            DeviceOp::Trim => "trim",
        }
    }
}

/// How long each kind of device operation took (see the module doc).
#[derive(Default)]
pub struct DeviceLatency {
    ops: [Histogram; DeviceOp::ALL.len()],
}

/// A copy of a [`DeviceLatency`]: one histogram per operation, in
/// [`DeviceOp::ALL`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceLatencySnapshot(pub Vec<(DeviceOp, HistogramSnapshot)>);

impl DeviceLatency {
    /// Records one operation that took `d`.
    pub fn record(&self, op: DeviceOp, d: Duration) {
        self.ops[op as usize].record_us(micros(d));
    }

    /// Copies every histogram.
    pub fn snapshot(&self) -> DeviceLatencySnapshot {
        DeviceLatencySnapshot(
            DeviceOp::ALL
                .iter()
                .map(|&op| (op, self.ops[op as usize].snapshot()))
                .collect(),
        )
    }
}

impl DeviceLatencySnapshot {
    /// The histogram of `op`.
    pub fn of(&self, op: DeviceOp) -> Option<&HistogramSnapshot> {
        self.0.iter().find(|(o, _)| *o == op).map(|(_, h)| h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_kept_apart() {
        let d = DeviceLatency::default();
        d.record(DeviceOp::Write, Duration::from_millis(2));
        d.record(DeviceOp::Write, Duration::from_millis(5));
        d.record(DeviceOp::Sync, Duration::from_micros(40));
        let s = d.snapshot();
        let write = s.of(DeviceOp::Write).expect("write");
        assert_eq!((write.count, write.max_us), (2, 5_000));
        assert_eq!(s.of(DeviceOp::Sync).map(|h| h.count), Some(1));
        assert_eq!(s.of(DeviceOp::Read).map(|h| h.count), Some(0));
        assert_eq!(s.0.len(), DeviceOp::ALL.len());
    }
}
