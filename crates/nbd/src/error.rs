//! Errors of the block adapter, and the NBD error code each maps to.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// The cluster failed the request.
    #[error("cluster: {0}")]
    Store(#[from] client::ClientError),
    /// A volume name, size or record is not acceptable.
    #[error("{0}")]
    BadVolume(String),
    /// No volume has this name.
    #[error("no volume named {0}")]
    NoVolume(String),
    /// The socket failed or the peer went away.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol; the connection is closed.
    #[error("protocol: {0}")]
    Protocol(String),
    /// Another adapter serves the volume (its lease is live), or took it
    /// over from this one: this one neither serves nor changes it.
    #[error("{0}")]
    Held(String),
}

/// Result with [`NbdError`].
pub type Result<T> = std::result::Result<T, NbdError>;

/// NBD error codes (errno values on the wire).
pub mod errno {
    /// Operation not permitted (this adapter lost the volume's lease: taken
    /// over by another adapter, or not renewed in time).
    pub const EPERM: u32 = 1;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left.
    pub const ENOSPC: u32 = 28;
    /// Value too large (request too long).
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

impl NbdError {
    /// The NBD error code a request failing this way answers.
    pub fn errno(&self) -> u32 {
        match self {
            NbdError::Store(client::ClientError::Server { message, .. })
                if message.starts_with("ERR NOSPACE") || message.contains("full") =>
            {
                errno::ENOSPC
            }
            NbdError::BadVolume(_) | NbdError::NoVolume(_) => errno::EINVAL,
            NbdError::Held(_) => errno::EPERM,
            _ => errno::EIO,
        }
    }
}
