//! `nbd` — the block adapter: volumes stored in a LightStore cluster,
//! served over the standard NBD protocol, so QEMU, libnbd's tools
//! (nbdinfo, nbdcopy, nbdsh, nbdfuse), fio's nbd engine and Linux's
//! nbd-client use them unchanged. Built on [`client::Store`] only: the
//! cluster in production, an in-memory model in tests.
//!
//! - [`volume`]: volume records (name, id, size, chunk size) in the cluster.
//! - [`blocks`]: byte ranges over chunks; holes, read-modify-write.
#![deny(missing_docs)]

pub mod blocks;
pub mod error;
pub mod volume;

pub use blocks::{Blocks, Extent};
pub use error::{NbdError, Result};
pub use volume::Volume;
