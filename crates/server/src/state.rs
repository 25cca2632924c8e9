//! State shared by the network thread and the executor pool: the engine,
//! settings, the write-ordering lock, SCAN cursors and counters.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use protocol::Limits;

use crate::budget::RequestBudget;
use crate::cmd::COMMANDS;
use crate::config::Config;
use crate::cursor::CursorTable;
use crate::metrics::Metrics;

/// Counters reported by INFO.
pub struct Counters {
    /// Connections accepted since start.
    pub connections_received: AtomicU64,
    /// Connections refused by `maxclients` or protected mode.
    pub rejected_connections: AtomicU64,
    /// Connections refused by protected mode (non-loopback, no password).
    pub rejected_protected: AtomicU64,
    /// Connections closed because a reply write made no progress for
    /// `reply_timeout_ms`.
    pub reply_timeouts: AtomicU64,
    /// Connections open now.
    pub clients: AtomicUsize,
    /// Requests processed.
    pub commands: AtomicU64,
    /// Plain SETs the network thread wrote itself (no executor hand-off).
    pub inline_sets: AtomicU64,
    /// GETs answered on the network thread (no executor hand-off).
    pub net_gets: AtomicU64,
    /// VMETAs answered on the network thread (no executor hand-off).
    pub net_vmetas: AtomicU64,
    /// `RANGE ... DIGESTS` listings answered on the network thread.
    pub net_ranges: AtomicU64,
    /// Values read from the device straight into a client's shared memory
    /// (`MGETSHM`, no copy by the node).
    pub landed_reads: AtomicU64,
    /// Calls per entry of [`COMMANDS`].
    pub calls: Vec<AtomicU64>,
}

impl Counters {
    fn new() -> Self {
        Counters {
            connections_received: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            rejected_protected: AtomicU64::new(0),
            reply_timeouts: AtomicU64::new(0),
            clients: AtomicUsize::new(0),
            commands: AtomicU64::new(0),
            inline_sets: AtomicU64::new(0),
            net_gets: AtomicU64::new(0),
            net_vmetas: AtomicU64::new(0),
            net_ranges: AtomicU64::new(0),
            landed_reads: AtomicU64::new(0),
            calls: COMMANDS.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Adds one to `c`.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Zeroes the totals (`CONFIG RESETSTAT`); connections open now stay
    /// counted.
    pub fn reset(&self) {
        for c in [
            &self.connections_received,
            &self.rejected_connections,
            &self.rejected_protected,
            &self.reply_timeouts,
            &self.commands,
            &self.inline_sets,
            &self.net_gets,
            &self.net_vmetas,
            &self.net_ranges,
            &self.landed_reads,
        ]
        .into_iter()
        .chain(&self.calls)
        {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Everything connections and executor jobs share.
pub struct NodeState {
    /// The engine.
    pub db: engine::Db,
    /// Settings the node was started with.
    pub config: Config,
    /// Parser limits for every authenticated connection.
    pub limits: Limits,
    /// Bytes all connections together may hold in requests being read.
    pub request_budget: std::sync::Arc<RequestBudget>,
    /// Read-modify-write commands (SET with NX/XX/GET, DEL) take this
    /// exclusively, blind writes shared, so conditional writes are atomic.
    pub write_order: RwLock<()>,
    /// SCAN cursor ids to the next start key.
    pub cursors: Mutex<CursorTable>,
    /// INFO counters.
    pub counters: Counters,
    /// Latency histograms and phase totals (INFO, /metrics, slowlog).
    pub metrics: Metrics,
    /// Source of client ids.
    pub next_client_id: AtomicU64,
    /// When the node started.
    pub started: Instant,
    /// Set to true to stop the node (signals, SHUTDOWN).
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Address actually bound (for INFO).
    pub tcp_port: u16,
    /// Whether plain SETs may be written on the network thread: not under
    /// `sync` durability, where every write waits for a device sync.
    pub sets_may_run_inline: bool,
    /// Hints kept for other nodes and their delivery (`hints.rs`).
    pub hints: crate::hints::HintState,
    /// The network thread's read queue for GETs, where io_uring works.
    pub net_reads: Option<std::sync::Arc<crate::netread::NetReads>>,
    /// This process's run (`RUNID`, `run.rs`).
    pub run: crate::run::Run,
    /// Ranges that were read, for reclustering (`recluster.rs`); `None`
    /// when `recluster_scans` is off.
    pub recluster: Option<crate::recluster::Reclusterer>,
}

impl NodeState {
    /// State around an open engine.
    pub fn new(
        db: engine::Db,
        config: Config,
        limits: Limits,
        request_budget: std::sync::Arc<RequestBudget>,
        tcp_port: u16,
    ) -> Self {
        let sets_may_run_inline = !matches!(config.durability(), Ok(engine::Durability::Sync));
        let recluster = config
            .recluster_scans
            .then(crate::recluster::Reclusterer::default);
        NodeState {
            sets_may_run_inline,
            db,
            config,
            limits,
            request_budget,
            write_order: RwLock::new(()),
            cursors: Mutex::new(CursorTable::new(crate::cursor::MAX_CURSORS)),
            counters: Counters::new(),
            metrics: Metrics::default(),
            next_client_id: AtomicU64::new(1),
            started: Instant::now(),
            shutdown: tokio::sync::watch::channel(false).0,
            tcp_port,
            hints: crate::hints::HintState::default(),
            net_reads: None,
            run: crate::run::Run::default(),
            recluster,
        }
    }

    /// Asks the node to stop.
    pub fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Most value bytes one reply may carry (`max_reply`).
    pub fn max_reply(&self) -> usize {
        usize::try_from(self.config.max_reply.0).unwrap_or(usize::MAX)
    }
}
