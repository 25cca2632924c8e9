//! Error type shared by every part of the crate.

use crate::SegmentId;

/// Every failure the flash layer can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlashError {
    /// An operating-system I/O error.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// The storage under the device has no room for a write: the host file
    /// system holding a sparse device file is full (`ENOSPC`) or over
    /// quota (`EDQUOT`). Nothing on the device is damaged; the same write
    /// succeeds once space is freed there.
    #[error("the file system holding the device is full: {0}")]
    HostFull(std::io::Error),
    /// A device sync failed earlier (the message says how). Writes since
    /// the last good sync may be lost, so nothing more is made durable or
    /// acknowledged until the store is reopened.
    #[error(
        "a device sync failed ({0}): writes since the last good sync may be lost, so no \
         further write is accepted until the store is reopened"
    )]
    SyncFailed(String),
    /// No segment is free.
    #[error("no free segment")]
    NoSpace,
    /// The (emulated) device lost power; every operation fails until it is power-cycled.
    #[error("device lost power")]
    PowerLoss,
    /// On-disk data failed a format check; the message says what and where.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A checksum did not match.
    #[error("checksum mismatch in {what}: expected {expected:#010x}, got {got:#010x}")]
    ChecksumMismatch {
        /// What was being checked.
        what: &'static str,
        /// Checksum stored on disk.
        expected: u32,
        /// Checksum computed over the data read.
        got: u32,
    },
    /// The superblock is missing or invalid.
    #[error("bad superblock: {0}")]
    BadSuperblock(String),
    /// The superblock has a format version this code does not understand.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u32),
    /// A checkpoint does not fit in its metadata slot.
    #[error("checkpoint needs {needed} bytes but a metadata slot holds {capacity}")]
    MetadataFull {
        /// Bytes the encoded checkpoint needs.
        needed: usize,
        /// Bytes one slot holds.
        capacity: usize,
    },
    /// An offset or length lies outside the device or segment.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// An offset, length or size violates an alignment rule.
    #[error("misaligned: {0}")]
    Misaligned(String),
    /// A page was written twice without an erase in between (strict-append devices).
    #[error("page {page} written twice without an erase")]
    Overwrite {
        /// Device page index.
        page: u64,
    },
    /// A segment id is not below the segment count.
    #[error("invalid segment id {0}")]
    InvalidSegment(SegmentId),
    /// Any other invalid argument or state transition.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<std::io::Error> for FlashError {
    /// `HostFull` for the errors a retry can outlive (out of space or over
    /// quota), `Io` for the rest.
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => FlashError::HostFull(e),
            _ => FlashError::Io(e),
        }
    }
}

impl FlashError {
    /// The [`FlashError::HostFull`] of a host file system without room
    /// (`ENOSPC`), for a refusal decided without a failed system call.
    pub fn host_out_of_room() -> FlashError {
        FlashError::HostFull(std::io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// True for [`FlashError::HostFull`]: the write may be retried later.
    pub fn is_host_full(&self) -> bool {
        matches!(self, FlashError::HostFull(_))
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, FlashError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_space_and_quota_are_host_full_other_errors_are_io() {
        for code in [libc::ENOSPC, libc::EDQUOT] {
            let e = FlashError::from(std::io::Error::from_raw_os_error(code));
            assert!(e.is_host_full(), "{code}: {e}");
            assert!(e
                .to_string()
                .contains("file system holding the device is full"));
        }
        for code in [libc::EIO, libc::EINVAL, libc::EBADF] {
            let e = FlashError::from(std::io::Error::from_raw_os_error(code));
            assert!(matches!(e, FlashError::Io(_)), "{code}: {e}");
        }
    }
}
