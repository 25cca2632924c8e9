//! Errors of the file adapter, and the errno each answers the kernel with.

use std::fmt;

/// An errno the file system answers with (`libc::ENOENT`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A POSIX error for the caller (no such file, not empty, ...).
    #[error("{0}")]
    Posix(Errno),
    /// The cluster failed the request.
    #[error("cluster: {0}")]
    Store(#[from] client::ClientError),
    /// A stored record cannot be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// A name, record or state that the command cannot accept (a file
    /// system that exists, a lease held by another mount, ...).
    #[error("{0}")]
    Refused(String),
}

/// Result with [`FsError`].
pub type Result<T> = std::result::Result<T, FsError>;

/// Shorthand: fail with errno `code`.
pub fn posix<T>(code: i32) -> Result<T> {
    Err(FsError::Posix(Errno(code)))
}

impl FsError {
    /// The errno a request failing this way answers.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Posix(e) => e.0,
            FsError::Store(client::ClientError::Server { message, .. })
                if message.contains("NOSPACE") || message.contains("full") =>
            {
                libc::ENOSPC
            }
            FsError::Refused(_) => libc::EINVAL,
            FsError::Store(_) | FsError::Corrupt(_) => libc::EIO,
        }
    }
}
