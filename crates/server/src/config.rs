//! Node configuration: defaults, a TOML file, and overrides from the
//! command line (applied by the caller to the loaded `Config`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A configuration problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for `Config`.
    #[error("invalid config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A setting has an invalid value.
    #[error("invalid setting {name}: {message}")]
    Invalid {
        /// Setting name.
        name: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// A byte size written as a number or a string like `"512M"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeRepr")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Number(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Self, String> {
        match r {
            SizeRepr::Number(n) => Ok(Size(n)),
            SizeRepr::Text(s) => crate::size::parse_size(&s).map(Size),
        }
    }
}

/// Everything a node needs to start. Field names are the TOML keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Data directory; the device file `lightstore.dev` lives inside it.
    pub data_dir: PathBuf,
    /// Device file size for a new store (sparse).
    pub capacity: Size,
    /// TCP address to listen on.
    pub listen: String,
    /// Optional Unix socket path to listen on as well.
    pub unix_socket: Option<PathBuf>,
    /// `sync`, `interval`, `interval:MS` or `none`.
    pub durability: String,
    /// Keytable cache size (engine default when unset).
    pub cache_size: Option<Size>,
    /// Password every client must give with AUTH or HELLO.
    pub requirepass: Option<String>,
    /// Protected mode (on by default, as in Redis): while no `requirepass`
    /// is set, TCP connections from addresses other than loopback are
    /// refused with `-DENIED …`. Unix-socket and loopback clients are
    /// always served. Turn it off only on a trusted network.
    pub protected_mode: bool,
    /// Hand off writes other nodes missed (on by default): the node keeps
    /// the hints clients send it and delivers them (`hints.rs`,
    /// `handoff.rs`). Off, hints are still kept but wait until it is on.
    pub hinted_handoff: bool,
    /// Most simultaneous client connections.
    pub maxclients: usize,
    /// Longest bulk string (default: the engine's value limit + 1 KiB, at most 512 MiB).
    pub max_bulk: Option<Size>,
    /// Most arguments in one request.
    pub max_args: usize,
    /// Longest inline command line.
    pub max_inline: Size,
    /// Most bytes of arguments in one request, whatever their number
    /// and their handles (default 512 MiB; at least `max_bulk` + 64 KiB);
    /// more is a protocol error and the connection is closed.
    pub max_request: Option<Size>,
    /// Most bytes all connections together may hold in requests still
    /// being read, beyond 256 KiB each (default 1 GiB, and never below
    /// `max_request`). A connection about to read a request past this bound
    /// waits until others finish theirs; one that is already holding part
    /// of a request and needs more gets `-ERR request memory exhausted` and
    /// is closed, so two half-read requests can never wait on each other.
    pub max_request_memory: Option<Size>,
    /// How long a connection may wait for request memory before it gets
    /// `-ERR request memory exhausted` and is closed, and how long one
    /// holding request memory may send nothing before it is closed
    /// (default 30000 ms).
    pub request_memory_wait_ms: u64,
    /// How long a reply write may make no progress (a client that does not
    /// read what it asked for) before the connection is closed (default
    /// 60000 ms). What such a client holds stays bounded by the reply
    /// budget, but its connection would otherwise stay open for good.
    pub reply_timeout_ms: u64,
    /// Most value bytes one reply may carry (MGET, RANGE); a command that
    /// would return more is refused with `-ERR reply too large`, before its
    /// values are read. Pipelined requests are not affected: their replies
    /// are sent in parts. Default 256 MiB.
    pub max_reply: Size,
    /// Executor threads running writes (SET, MSET, DEL, VSET, VDEL, and
    /// pipelined batches holding any). Default: see
    /// [`Config::write_threads`].
    pub threads: Option<usize>,
    /// Executor threads running reads (GET, MGET, RANGE, SCAN, ...). Each
    /// keeps a whole batch of device reads in flight through io_uring, so a
    /// few suffice: default 16; 64 where io_uring is unavailable and each
    /// thread waits for one read at a time.
    pub read_threads: Option<usize>,
    /// Address of the Prometheus `/metrics` HTTP endpoint (off when unset).
    pub metrics_listen: Option<String>,
    /// Log requests slower than this many milliseconds (off when unset).
    pub slowlog_ms: Option<u64>,
    /// Keep the device file's blocks allocated when segments are erased
    /// instead of punching holes (which gives the space back to the file
    /// system but stalls the file's direct I/O and makes later synced
    /// writes there slower). Off by default.
    pub keep_file_blocks: bool,
    /// Allocate every block of the device file at start (its holes are
    /// filled with zeros; data is never touched) and keep them allocated,
    /// so no write has to allocate. Costs one write of the file's unallocated part
    /// (seconds per GiB) and its full size on the file system. Off by
    /// default.
    pub preallocate: bool,
    /// Rewrite the small values of ranges that clients read in key order
    /// where they are scattered over the log, in the background, so later
    /// range reads of them read long runs of the device (on by default;
    /// nodes serving no range reads do none of it).
    pub recluster_scans: bool,
}

/// Room `max_request` keeps above `max_bulk` for the command, the key and
/// the arguments' handles around the largest value.
const REQUEST_SLACK: usize = 64 << 10;

/// Name of the device file inside the data directory.
pub const DEVICE_FILE: &str = "lightstore.dev";

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("data/lightstore"),
            capacity: Size(8 << 30),
            listen: "127.0.0.1:7379".into(),
            unix_socket: None,
            durability: "interval".into(),
            cache_size: None,
            requirepass: None,
            protected_mode: true,
            hinted_handoff: true,
            maxclients: 10_000,
            max_bulk: None,
            max_args: 1 << 20,
            max_inline: Size(64 << 10),
            max_request: None,
            max_request_memory: None,
            request_memory_wait_ms: 30_000,
            reply_timeout_ms: 60_000,
            max_reply: Size(256 << 20),
            threads: None,
            read_threads: None,
            metrics_listen: None,
            slowlog_ms: None,
            keep_file_blocks: false,
            preallocate: false,
            recluster_scans: true,
        }
    }
}

/// Write workers by default under `interval` and `none` durability. A
/// write there never waits for the device, only for the log's lock and
/// its copy and index work, so a few workers keep two cores busy; each
/// more grows its own allocator pages and takes turns on the same locks
/// (a fresh node's block fill and plain SETs were faster with 4 than with
/// 16, VSETs the same: `bench/RESULTS.md`, session 38).
pub const WRITE_THREADS: usize = 4;
/// Write workers by default under `sync` durability: each waits for its
/// batch's device sync, and the versioned writes of different connections
/// (every cluster write) are separate batches, so the workers waiting at
/// once are what one group commit gathers (with 4, VSETs from 16
/// pipelining connections fell below 0.8 of plain SETs; same section).
pub const SYNC_WRITE_THREADS: usize = 16;

impl Config {
    /// Threads of the read pool after defaults (see [`Config::read_threads`]).
    pub fn read_threads(&self) -> usize {
        self.read_threads
            .unwrap_or(if flash::io_uring_available() { 16 } else { 64 })
    }

    /// Threads of the write pool after defaults: [`Config::threads`] if
    /// set, else [`SYNC_WRITE_THREADS`] under `sync` durability and
    /// [`WRITE_THREADS`] otherwise.
    pub fn write_threads(&self) -> usize {
        self.threads.unwrap_or_else(|| match self.durability() {
            Ok(engine::Durability::Sync) => SYNC_WRITE_THREADS,
            _ => WRITE_THREADS,
        })
    }

    /// Loads a TOML file; missing keys keep their defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Whether a TCP client at `peer` must be refused: protected mode is on,
    /// no password is set, and the peer is not a loopback address (an
    /// IPv4-mapped IPv6 loopback counts as loopback).
    pub fn refuses_peer(&self, peer: std::net::IpAddr) -> bool {
        let loopback = match peer {
            std::net::IpAddr::V4(a) => a.is_loopback(),
            std::net::IpAddr::V6(a) => {
                a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        };
        self.protected_mode && self.requirepass.is_none() && !loopback
    }

    /// Path of the device file.
    pub fn device_path(&self) -> PathBuf {
        self.data_dir.join(DEVICE_FILE)
    }

    /// The durability setting, parsed.
    pub fn durability(&self) -> Result<engine::Durability, ConfigError> {
        self.durability
            .parse()
            .map_err(|message| ConfigError::Invalid {
                name: "durability",
                message,
            })
    }

    /// Checks values that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.durability()?;
        let bad = |name, message: &str| {
            Err(ConfigError::Invalid {
                name,
                message: message.into(),
            })
        };
        if self.threads.is_some_and(|t| t == 0 || t > 1024) {
            return bad("threads", "must be 1..=1024");
        }
        if self.read_threads.is_some_and(|t| t == 0 || t > 1024) {
            return bad("read_threads", "must be 1..=1024");
        }
        if self.maxclients == 0 {
            return bad("maxclients", "must be at least 1");
        }
        if self.max_args == 0 {
            return bad("max_args", "must be at least 1");
        }
        if self.max_reply.0 == 0 {
            return bad("max_reply", "must be at least 1");
        }
        if self.capacity.0 < (64 << 20) {
            return bad("capacity", "must be at least 64M");
        }
        let explicit = |v: Option<Size>| v.map(|Size(n)| usize::try_from(n).unwrap_or(usize::MAX));
        // A client may make the node allocate what it announces (once the
        // request memory allows): keep that within reason.
        if explicit(self.max_bulk).is_some_and(|n| n > 1 << 30) {
            return bad("max_bulk", "must be at most 1G");
        }
        if explicit(self.max_request).is_some_and(|n| n > 4 << 30) {
            return bad("max_request", "must be at most 4G");
        }
        // Partial inline lines stay in the read buffer, within the 256K a
        // connection holds without touching the request-memory budget.
        if self.max_inline.0 > 128 << 10 {
            return bad("max_inline", "must be at most 128K");
        }
        if let (Some(bulk), Some(request)) = (explicit(self.max_bulk), explicit(self.max_request)) {
            if request < bulk.saturating_add(REQUEST_SLACK) {
                return bad("max_request", "must be at least max_bulk + 64K");
            }
        }
        if let (Some(request), Some(memory)) = (
            explicit(self.max_request),
            explicit(self.max_request_memory),
        ) {
            if memory < request {
                return bad("max_request_memory", "must be at least max_request");
            }
        }
        if self.reply_timeout_ms == 0 {
            return bad("reply_timeout_ms", "must be at least 1");
        }
        if self.requirepass.as_deref() == Some("") {
            return bad("requirepass", "must not be empty");
        }
        Ok(())
    }

    /// Longest accepted bulk string given the engine's value limit.
    pub fn max_bulk_for(&self, max_value: usize) -> usize {
        match self.max_bulk {
            Some(Size(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            None => (max_value + 1024).min(512 << 20),
        }
    }

    /// The parser limits for a store whose values may be `max_value` bytes;
    /// fails where the request bounds are set below the bulk bound.
    pub fn limits_for(&self, max_value: usize) -> Result<protocol::Limits, ConfigError> {
        let max_bulk = self.max_bulk_for(max_value);
        let max_request = match self.max_request {
            Some(Size(n)) => usize::try_from(n).unwrap_or(usize::MAX),
            None => max_bulk.saturating_add(REQUEST_SLACK).max(512 << 20),
        };
        if max_request < max_bulk.saturating_add(REQUEST_SLACK) {
            return Err(ConfigError::Invalid {
                name: "max_request",
                message: format!("must be at least max_bulk + 64K ({max_bulk} + 65536 bytes)"),
            });
        }
        Ok(protocol::Limits {
            max_bulk,
            max_args: self.max_args,
            max_inline: usize::try_from(self.max_inline.0).unwrap_or(usize::MAX),
            max_request,
        })
    }

    /// The node-wide bound on request bytes being read (see
    /// [`Config::max_request_memory`]) for these parser limits.
    pub fn max_request_memory_for(&self, limits: &protocol::Limits) -> Result<usize, ConfigError> {
        match self.max_request_memory {
            Some(Size(n)) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n < limits.max_request {
                    return Err(ConfigError::Invalid {
                        name: "max_request_memory",
                        message: format!(
                            "must be at least max_request ({} bytes)",
                            limits.max_request
                        ),
                    });
                }
                Ok(n)
            }
            None => Ok(limits.max_request.max(1 << 30)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_sizes_and_defaults() {
        let c = Config::from_toml(
            "data_dir = \"/tmp/x\"\ncapacity = \"1G\"\ncache_size = 1048576\nthreads = 4\n\
             metrics_listen = \"127.0.0.1:9100\"\nslowlog_ms = 25\n\
             keep_file_blocks = true\npreallocate = true\n",
        )
        .unwrap();
        assert_eq!(c.capacity, Size(1 << 30));
        assert_eq!(c.cache_size, Some(Size(1 << 20)));
        assert_eq!(c.threads, Some(4));
        assert_eq!(c.write_threads(), 4);
        assert_eq!(c.listen, "127.0.0.1:7379");
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9100"));
        assert_eq!(c.slowlog_ms, Some(25));
        assert!(c.keep_file_blocks);
        assert!(!Config::default().keep_file_blocks);
        assert!(c.preallocate);
        assert!(!Config::default().preallocate);
        assert_eq!(Config::default().metrics_listen, None);
        assert!(c.validate().is_ok());
        assert!(Config::from_toml("bogus = 1").is_err());
        assert!(Config::from_toml("capacity = \"1Q\"").is_err());
        let c = Config {
            durability: "sometimes".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn write_workers_default_by_durability_unless_set() {
        let with = |durability: &str, threads: Option<usize>| Config {
            durability: durability.into(),
            threads,
            ..Config::default()
        };
        assert_eq!(Config::default().write_threads(), WRITE_THREADS);
        assert_eq!(with("none", None).write_threads(), WRITE_THREADS);
        assert_eq!(with("interval", None).write_threads(), WRITE_THREADS);
        assert_eq!(with("sync", None).write_threads(), SYNC_WRITE_THREADS);
        assert_eq!(with("sync", Some(2)).write_threads(), 2);
        assert_eq!(with("interval", Some(32)).write_threads(), 32);
        const { assert!(WRITE_THREADS < SYNC_WRITE_THREADS) };
    }

    #[test]
    fn protected_mode_refuses_only_remote_peers_without_a_password() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let open = Config::default();
        assert!(open.protected_mode);
        assert!(!open.refuses_peer(ip("127.0.0.1")));
        assert!(!open.refuses_peer(ip("127.8.9.1")));
        assert!(!open.refuses_peer(ip("::1")));
        assert!(!open.refuses_peer(ip("::ffff:127.0.0.1")));
        assert!(open.refuses_peer(ip("192.0.2.7")));
        assert!(open.refuses_peer(ip("::ffff:10.0.0.1")));
        assert!(open.refuses_peer(ip("2001:db8::1")));
        let with_password = Config {
            requirepass: Some("pw".into()),
            ..Config::default()
        };
        assert!(!with_password.refuses_peer(ip("192.0.2.7")));
        let trusted = Config::from_toml("protected_mode = false").unwrap();
        assert!(!trusted.refuses_peer(ip("192.0.2.7")));
    }
}
