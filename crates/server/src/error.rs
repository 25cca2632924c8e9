//! Errors that stop a node from starting or running.

use std::path::PathBuf;

/// Why a node could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Another process holds the device lock.
    #[error("data directory {} is locked by another lightstore process", dir.display())]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },
    /// The data directory or device file could not be created or opened.
    #[error("cannot open the data directory {}: {source}", dir.display())]
    DataDir {
        /// The data directory.
        dir: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// `preallocate` could not allocate the device file's blocks.
    #[error("cannot preallocate the device file {}: {source}", path.display())]
    Preallocate {
        /// The device file.
        path: PathBuf,
        /// Underlying error (for example too little free space).
        source: flash::FlashError,
    },
    /// A listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The engine failed to open or close.
    #[error("engine: {0}")]
    Engine(#[from] engine::Error),
    /// Threads or the runtime could not be started.
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}
