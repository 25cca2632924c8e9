//! The file adapter (LightStore-FS): a POSIX file system whose every
//! object lives in the cluster, served through FUSE.
//!
//! It owns the mapping of files to keys (`layout.rs`), the inode and entry
//! records (`inode.rs`), metadata changes as atomic batches on one replica
//! set (`filesystem.rs`, `namespace.rs`, `attrs.rs`), chunked file data
//! (`data.rs`; where its holes are and the blocks it takes in `seek.rs`
//! and `blocks.rs`), the cluster's file systems (`registry.rs`), the one-mount
//! lease (`lease.rs`) and the kernel interface (`fuse.rs`, its counters
//! in `metrics.rs`, and the mount's
//! read-ahead window in `readahead.rs`). It is built on
//! [`client::Store`] only, so its logic runs against the in-memory model in
//! tests and against the cluster when mounted.

pub mod attrs;
mod blocks;
mod cache;
pub mod check;
mod data;
pub mod error;
pub mod filesystem;
pub mod fuse;
pub mod inode;
pub mod layout;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod readahead;
pub mod registry;
pub mod seek;
mod writebehind;

pub use error::{FsError, Result};
pub use filesystem::FileSystem;
pub use registry::FsRecord;
