//! `server` — the LightStore node: one process that owns one device, runs
//! the engine on it and serves it over RESP, so `redis-cli`, `redis-py` and
//! `redis-benchmark` work unchanged.
//!
//! Thread model (LightStore paper §4.2): one tokio worker thread does all
//! network I/O (accept, read, parse, encode, write); a fixed pool of executor
//! threads, fed through a lock-free queue, runs the engine calls that block
//! on device reads and group-commit syncs; the engine has its own background
//! threads. One exception: a lone plain SET that the engine can take without
//! waiting (not `sync` durability, no write throttling) is written on the
//! network thread, saving the two thread hand-offs that dominate its cost;
//! likewise a lone GET whose lookup needs no device read has its value read
//! on an io_uring queue that the network thread polls (`netread`).
//! A connection parses every complete request it has (pipelining),
//! hands them to the pool as one job, writes all replies and only then reads
//! again.
#![deny(missing_docs)]

mod budget;
mod cmd;
pub mod config;
mod conn;
mod cursor;
mod data;
mod error;
mod exec;
mod glob;
mod handoff;
mod hints;
mod info;
mod metrics;
mod metrics_http;
mod netread;
mod node;
mod prom;
mod readbuf;
mod recluster;
mod reserved;
mod run;
mod session;
mod shm;
mod size;
mod slowlog;
mod state;
mod vcmd;

pub use config::{Config, ConfigError};
pub use error::ServerError;
pub use glob::{glob_match, Glob};
pub use node::run;
pub use size::parse_size;
