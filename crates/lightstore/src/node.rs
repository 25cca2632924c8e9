//! `lightstore node`: command-line flags for the node server, layered over
//! an optional TOML config file.

use std::path::PathBuf;

use clap::Args;
use server::Config;

use crate::bench::parse_size;

/// Flags of `lightstore node`; each overrides the config file.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// TOML config file (keys as in `server::Config`: data_dir, listen, ...).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (default data/lightstore); the device file is `lightstore.dev` in it.
    #[arg(long)]
    data: Option<PathBuf>,
    /// TCP address to listen on (default 127.0.0.1:7379).
    #[arg(long)]
    listen: Option<String>,
    /// Also listen on this Unix socket.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// sync, interval, interval:MS or none (default interval).
    #[arg(long)]
    durability: Option<String>,
    /// Keytable cache size, e.g. 512M.
    #[arg(long, value_parser = parse_size)]
    cache_size: Option<u64>,
    /// Password clients must give (AUTH / HELLO ... AUTH). A flag is visible to
    /// every local user in `ps`: prefer `requirepass` in the config file or the
    /// LIGHTSTORE_REQUIREPASS environment variable.
    #[arg(long, env = "LIGHTSTORE_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// Protected mode, yes (the default) or no: without a password, refuse TCP
    /// clients that do not connect over loopback. Say no only on a trusted network.
    #[arg(long, value_name = "yes|no", value_parser = parse_yes_no)]
    protected_mode: Option<bool>,
    /// Hand writes other nodes missed to them when they answer again, yes (the
    /// default) or no (hints are kept until it is yes; tests and maintenance).
    #[arg(long, value_name = "yes|no", value_parser = parse_yes_no)]
    hinted_handoff: Option<bool>,
    /// Device file size for a new store, e.g. 8G (sparse).
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Most simultaneous clients (default 10000).
    #[arg(long)]
    maxclients: Option<usize>,
    /// Most value bytes one MGET or RANGE reply may carry, e.g. 256M (the default);
    /// more is refused with an error.
    #[arg(long, value_parser = parse_size)]
    max_reply: Option<u64>,
    /// Longest bulk string (a key or a value) a request may carry, e.g. 16M
    /// (default: the engine's value limit + 1K, 64M + 1K).
    #[arg(long, value_parser = parse_size)]
    max_bulk: Option<u64>,
    /// Most bytes of arguments in one request, e.g. 512M (the default; at least
    /// --max-bulk + 64K); more closes the connection with a protocol error.
    #[arg(long, value_parser = parse_size)]
    max_request: Option<u64>,
    /// Most bytes all clients together may hold in requests being read (beyond 256K
    /// each), e.g. 1G (the default); past it, new large requests wait.
    #[arg(long, value_parser = parse_size)]
    max_request_memory: Option<u64>,
    /// How long a client may wait for request memory before it is refused (default 30000).
    #[arg(long, value_name = "MS")]
    request_memory_wait_ms: Option<u64>,
    /// How long a reply write may make no progress (a client not reading its
    /// replies) before the connection is closed (default 60000).
    #[arg(long, value_name = "MS")]
    reply_timeout_ms: Option<u64>,
    /// Executor threads running writes (default 4; 16 under `--durability sync`).
    #[arg(long)]
    threads: Option<usize>,
    /// Executor threads running reads, each with a batch of device reads in flight
    /// (default 16; 64 where io_uring is unavailable).
    #[arg(long)]
    read_threads: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default), e.g. 127.0.0.1:9121.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Log (WARN) requests slower than N milliseconds with their phase breakdown.
    #[arg(long, value_name = "N")]
    slowlog_ms: Option<u64>,
    /// Keep the device file's blocks allocated when segments are erased instead of
    /// punching holes: faster synced writes and no I/O stalls, but the file system
    /// does not get the space back.
    #[arg(long)]
    keep_file_blocks: bool,
    /// Do not rewrite the values of ranges clients read in key order (on by
    /// default: range reads of values written in random order get faster).
    #[arg(long)]
    no_recluster: bool,
    /// Allocate the device file's every block at start (fill its holes with zeros,
    /// never touching data) and keep them: no write allocates, and GC waits while
    /// over half the device is free. Takes seconds per GiB and the file's full size.
    #[arg(long)]
    preallocate: bool,
}

/// Parses `yes` or `no` (as Redis spells its booleans), or `true`/`false`.
fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(format!("expected yes or no, not {s:?}")),
    }
}

/// Builds the configuration and runs the node until it stops.
pub fn run(args: NodeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut c = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(v) = args.data {
        c.data_dir = v;
    }
    if let Some(v) = args.listen {
        c.listen = v;
    }
    if let Some(v) = args.unix {
        c.unix_socket = Some(v);
    }
    if let Some(v) = args.durability {
        c.durability = v;
    }
    if let Some(v) = args.cache_size {
        c.cache_size = Some(server::config::Size(v));
    }
    if let Some(v) = args.requirepass {
        c.requirepass = Some(v);
    }
    if let Some(v) = args.protected_mode {
        c.protected_mode = v;
    }
    if let Some(v) = args.hinted_handoff {
        c.hinted_handoff = v;
    }
    if let Some(v) = args.capacity {
        c.capacity = server::config::Size(v);
    }
    if let Some(v) = args.maxclients {
        c.maxclients = v;
    }
    if let Some(v) = args.max_reply {
        c.max_reply = server::config::Size(v);
    }
    if let Some(v) = args.max_bulk {
        c.max_bulk = Some(server::config::Size(v));
    }
    if let Some(v) = args.max_request {
        c.max_request = Some(server::config::Size(v));
    }
    if let Some(v) = args.max_request_memory {
        c.max_request_memory = Some(server::config::Size(v));
    }
    if let Some(v) = args.request_memory_wait_ms {
        c.request_memory_wait_ms = v;
    }
    if let Some(v) = args.reply_timeout_ms {
        c.reply_timeout_ms = v;
    }
    if let Some(v) = args.threads {
        c.threads = Some(v);
    }
    if let Some(v) = args.read_threads {
        c.read_threads = Some(v);
    }
    if let Some(v) = args.metrics {
        c.metrics_listen = Some(v);
    }
    if let Some(v) = args.slowlog_ms {
        c.slowlog_ms = Some(v);
    }
    if args.no_recluster {
        c.recluster_scans = false;
    }
    if args.keep_file_blocks {
        c.keep_file_blocks = true;
    }
    if args.preallocate {
        c.preallocate = true;
    }
    server::run(c)?;
    Ok(())
}
