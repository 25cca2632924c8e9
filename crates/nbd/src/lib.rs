//! `nbd` — the block adapter: volumes stored in a LightStore cluster,
//! served over the standard NBD protocol, so QEMU, libnbd's tools
//! (nbdinfo, nbdcopy, nbdsh, nbdfuse), fio's nbd engine and Linux's
//! nbd-client use them unchanged. Built on [`client::Store`] only: the
//! cluster in production, an in-memory model in tests.
//!
//! - [`volume`]: volume records (name, id, size, chunk size) in the cluster.
//! - [`blocks`]: byte ranges over chunks; holes, read-modify-write.
//! - [`proto`]: the wire format, parsed and encoded without I/O.
//! - [`server`]: handshake and transmission over TCP and Unix sockets.
#![deny(missing_docs)]

pub mod blocks;
pub mod check;
pub mod error;
pub mod proto;
pub mod server;
pub mod volume;

pub use blocks::{Blocks, Extent};
pub use error::{NbdError, Result};
pub use server::{Holder, NbdServer};
pub use volume::Volume;
