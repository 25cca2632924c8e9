//! `engine` — the LightStore LSM-tree with key-value separation.
//!
//! Values are appended once to a value log that doubles as the write-ahead
//! log; keys and value pointers go to the L0 memtable, which is flushed into
//! sorted keytables on flash (a flushed run each, merged eight at a time into
//! levels L1..Ln, sized from the bottom up). Compaction merges keytables
//! only — values never move — and keeps exact per-segment live-byte counts;
//! value GC re-inserts the few live values of mostly-dead segments (PinK) and
//! trims them. Reads go through an in-DRAM level index, Bloom filters and a
//! keytable cache, so a GET costs one device read of just its value's bytes
//! (a value pointer carries the value's checksum, and values of 4 KiB and
//! more start on a 512-byte boundary: an 8 KiB GET reads 8 KiB). Recovery
//! replays the log tail from the last checkpoint and cuts it at the first bad
//! checksum. The engine owns everything above the `flash` segment store and
//! below the network protocol.
#![deny(missing_docs)]

mod bloom;
mod cache;
mod conditional;
mod db;
mod deeppass;
mod error;
mod gc;
mod getsplit;
mod iter;
mod keytable;
mod ktwriter;
mod lowspace;
mod maint;
mod manifest;
mod memindex;
mod memruns;
mod memtable;
mod options;
mod recluster;
mod record;
mod recovery;
mod runbuilder;
mod segreader;
mod shape;
mod signal;
mod stats;
mod tag;
#[cfg(test)]
mod test_support;
mod types;
mod version;
mod vlog;

pub use conditional::{Room, SMALL_REPLACEMENT};
pub use db::{BatchOp, Db, Snapshot};
pub use error::{Error, Result};
pub use getsplit::{GetStart, PendingGet};
pub use options::{Durability, Options};
pub use recluster::ReclusterStats;
pub use stats::Stats;
pub use tag::{Current, Tag, Tagging, ValueMeta, TAG_LEN, TAG_MAGIC};
pub use types::SeqNo;

/// Re-exported flash types needed to open a store.
pub use flash;
