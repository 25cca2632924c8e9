//! `client` is the cluster client every LightStore adapter uses. It owns how
//! keys map to nodes (consistent hashing with virtual nodes and Redis-style
//! `{hash tags}`, see [`ring`]), replication with a write quorum and
//! versioned writes (newest version wins, see [`protocol::versioned`]),
//! reads from every replica that is up with the newest copy winning and
//! read repair (see `read.rs`), failover, down-node detection with background retry, batches
//! split per node and sent in parallel, ordered range reads merged across
//! nodes, anti-entropy repair and cluster status, compare-and-set on one key (`cas.rs`), [`lease`]s for one holder at a time,
//! syncs that report writes a node lost by restarting (node runs, per-writer [`LossCursor`]s: `runs.rs`); [`Store`] is what the
//! adapters build on, with an in-memory model ([`MemStore`]) for their tests. It talks RESP to nodes over
//! pooled, timed-out TCP connections and knows nothing of the engine.

#![deny(missing_docs)]

mod cas;
mod cluster;
mod config;
mod conn;
mod error;
pub mod findings;
mod kv;
mod landing;
pub mod lease;
mod range;
mod read;
pub mod records;
mod repair;
pub mod ring;
mod runs;
pub mod shm;
mod status;
mod store;
pub mod testing;
pub mod version;

pub use cluster::Cluster;
pub use config::{ClusterConfig, PASSWORD_ENV};
pub use conn::Conn;
pub use error::{ClientError, Result};
pub use protocol::versioned::Versioned;
pub use repair::RepairReport;
pub use runs::{LossCursor, WriterLosses};
pub use status::NodeStatus;
pub use store::{Capacity, MemStore, Store, StoredKeys, WriteOp};
