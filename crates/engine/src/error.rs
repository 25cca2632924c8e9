//! The engine's error type: every failure a caller can see, typed.

use flash::FlashError;

/// Errors returned by the engine. Input problems, full devices and corruption
/// are all reported here; the engine never panics on them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device has no free segment left for user data. Reads keep working;
    /// deletes followed by value GC make room again.
    #[error("NOSPACE: the device is full (delete data and let GC reclaim space)")]
    NoSpace,
    /// The file system holding the device file is full (or over quota).
    /// Reads keep working, deletes are accepted (into segments the host
    /// file system keeps for them) and nothing acknowledged is lost; writes
    /// fail until space is freed there, by other files or by GC after
    /// deletes, then resume without a restart. A write that failed this way
    /// after its records were appended (under `sync` durability, waiting
    /// for the device) may still become durable then.
    #[error(
        "NOSPACE: {0} (deletes still work; writes resume by themselves once space is freed \
         there or deletes let GC return some)"
    )]
    HostFull(String),
    /// A key is empty or longer than the configured maximum.
    #[error("invalid key length {len} (allowed 1..={max} bytes)")]
    KeyTooLarge {
        /// Length of the offending key.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// A value is longer than the configured maximum.
    #[error("value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge {
        /// Length of the offending value.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// Stored bytes failed their checksum; the data is not returned.
    #[error("checksum mismatch in {what}: expected {expected:#010x}, got {got:#010x}")]
    ChecksumMismatch {
        /// Which structure failed (value record, keytable block, ...).
        what: &'static str,
        /// Checksum stored on the device.
        expected: u32,
        /// Checksum of the bytes read.
        got: u32,
    },
    /// The store was written in an on-device format this build cannot read
    /// (an older or newer LightStore); nothing was changed on the device.
    #[error(
        "the store uses format version {found}, this build reads version {supported}: \
         it was written by an incompatible LightStore (use that version, or start on a \
         new data directory)"
    )]
    UnsupportedFormat {
        /// Version found on the device.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// Stored bytes are structurally invalid.
    #[error("corruption: {0}")]
    Corrupt(String),
    /// The options are inconsistent.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A read would return more bytes (keys and values) than the caller
    /// allowed; no value was read.
    #[error("the result would exceed the limit of {max} bytes: ask for fewer at a time")]
    TooLarge {
        /// The caller's limit.
        max: usize,
    },
    /// A call's arguments are inconsistent with each other.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device failed a write or a sync. Writes since the last good sync
    /// may be lost (after a failed `fsync` the kernel may drop the pages it
    /// could not write), so no further write is acknowledged until the
    /// store is reopened; reads go on. Reopening recovers what is durable.
    #[error("IOERR {0} (reads still work; restart the node to recover what is durable)")]
    DeviceFailed(String),
    /// A write waited [`crate::Options::max_write_stall`] for the memtable
    /// flush it depends on, which did not finish (maintenance is stuck or
    /// the device far too slow); nothing was written, retry later.
    #[error(
        "BUSY the write waited {0:?} for a memtable flush that did not finish (see the log); \
         nothing was written, retry later"
    )]
    WriteStall(std::time::Duration),
    /// The engine was shut down or a background task failed; see the log.
    #[error("engine stopped: {0}")]
    Stopped(String),
    /// An error from the flash layer.
    #[error(transparent)]
    Flash(FlashError),
    /// An operating-system I/O error outside the flash layer.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl From<FlashError> for Error {
    fn from(e: FlashError) -> Self {
        match e {
            FlashError::NoSpace => Error::NoSpace,
            e @ FlashError::HostFull(_) => Error::HostFull(e.to_string()),
            e @ FlashError::SyncFailed(_) => Error::DeviceFailed(e.to_string()),
            FlashError::ChecksumMismatch {
                what,
                expected,
                got,
            } => Error::ChecksumMismatch {
                what,
                expected,
                got,
            },
            other => Error::Flash(other),
        }
    }
}

impl Error {
    /// True for the errors that mean "out of space" ([`Error::NoSpace`],
    /// [`Error::HostFull`]): the engine goes on, and retrying later can work.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::NoSpace | Error::HostFull(_))
    }
}

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, Error>;
