//! The cluster description: nodes, replication and timeouts, from a small
//! TOML file or a `host:port,host:port` list.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{ClientError, Result};

/// How a cluster client places, replicates and times out requests.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Node addresses: `host:port`, or `unix:PATH` for a node on this
    /// machine listening on a Unix socket (`lightstore node --unix PATH`),
    /// which costs less CPU per request than TCP over loopback. A node's
    /// address is also its id on the hash ring, so every client must list
    /// a node the same way.
    pub nodes: Vec<String>,
    /// Copies of each key, on distinct nodes. Default: 2 when there are at
    /// least 2 nodes, else 1.
    #[serde(default)]
    pub replicas: Option<usize>,
    /// Acknowledgements a write needs. Default: every replica that is up
    /// (replicas known down are skipped and caught up by repair), at least 1.
    #[serde(default)]
    pub write_quorum: Option<usize>,
    /// Replicas a read asks and needs answers from. Default: every replica
    /// that is up (at least 1): the newest copy wins and stale replicas are
    /// repaired, so a read never returns a version older than a write
    /// acknowledged by a replica that is up (see `docs/consistency.md`).
    /// `1` reads the first healthy replica only: faster, but a replica that
    /// missed writes while it was away serves them stale until repaired.
    #[serde(default)]
    pub read_quorum: Option<usize>,
    /// Timeout of one call to a node, milliseconds (default 2000). A node
    /// that has not answered by then is asked whether it is alive (a
    /// `PING` on a fresh connection): a node that answers is busy, not
    /// down, and the call waits on, up to `busy_timeout_ms`; one that does
    /// not answer is marked down.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Longest a call waits on a node that is slow but alive, milliseconds
    /// (default 30000, the engine's longest write stall): a disk that
    /// stalls for seconds makes calls slow, not failed. At most
    /// `timeout_ms` turns the probe off.
    #[serde(default = "default_busy_timeout_ms")]
    pub busy_timeout_ms: u64,
    /// Timeout of opening a connection, milliseconds (default 1000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How often a node marked down is tried again, milliseconds (default 500).
    #[serde(default = "default_retry_ms")]
    pub retry_interval_ms: u64,
    /// Password for `AUTH`, when the nodes require one. Tools built on the
    /// client also take it from [`PASSWORD_ENV`] (see
    /// [`ClusterConfig::password_from_env`]), which, unlike a flag, other
    /// local users cannot read in `ps`.
    #[serde(default)]
    pub password: Option<String>,
}

/// The environment variable the `lightstore` tools and the YCSB binding
/// read the cluster's password from when the configuration gives none.
pub const PASSWORD_ENV: &str = "LIGHTSTORE_PASSWORD";

fn default_timeout_ms() -> u64 {
    2000
}
fn default_busy_timeout_ms() -> u64 {
    30_000
}
fn default_connect_timeout_ms() -> u64 {
    1000
}
fn default_retry_ms() -> u64 {
    500
}

impl ClusterConfig {
    /// A configuration with defaults for these nodes.
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> ClusterConfig {
        ClusterConfig {
            nodes: nodes.into_iter().map(Into::into).collect(),
            replicas: None,
            write_quorum: None,
            read_quorum: None,
            timeout_ms: default_timeout_ms(),
            busy_timeout_ms: default_busy_timeout_ms(),
            connect_timeout_ms: default_connect_timeout_ms(),
            retry_interval_ms: default_retry_ms(),
            password: None,
        }
    }

    /// Parses a `host:port,host:port,...` list.
    pub fn from_list(list: &str) -> Result<ClusterConfig> {
        let cfg = ClusterConfig::new(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a TOML file (`nodes = ["127.0.0.1:7400", ...]`, `replicas`,
    /// `write_quorum`, `read_quorum`, `timeout_ms`, `busy_timeout_ms`,
    /// `connect_timeout_ms`, `retry_interval_ms`, `password`).
    pub fn from_file(path: &Path) -> Result<ClusterConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
        let cfg: ClusterConfig = toml::from_str(&text)
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Takes the password from `value` (the caller reads [`PASSWORD_ENV`])
    /// when the configuration has none; a password written in the
    /// configuration wins. An empty value counts as none.
    pub fn password_from_env(&mut self, value: Option<String>) {
        if self.password.is_none() {
            self.password = value.filter(|v| !v.is_empty());
        }
    }

    /// Checks the configuration makes sense.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ClientError::Config(m));
        if self.nodes.is_empty() {
            return bad("the cluster has no nodes".into());
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let tcp_ok = |n: &str| {
                n.rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            };
            let ok = match crate::conn::unix_path(n) {
                Some(path) => !path.as_os_str().is_empty(),
                None => tcp_ok(n),
            };
            if !ok {
                return bad(format!("node {n:?} is not host:port or unix:PATH"));
            }
            if self.nodes[..i].contains(n) {
                return bad(format!("node {n} is listed twice"));
            }
        }
        if self.replicas == Some(0) {
            return bad("replicas must be at least 1".into());
        }
        if let Some(r) = self.replicas {
            if r > self.nodes.len() {
                return bad(format!(
                    "replicas = {r} but the cluster has only {} nodes",
                    self.nodes.len()
                ));
            }
        }
        if let Some(q) = self.write_quorum {
            if q == 0 || q > self.replica_count() {
                return bad(format!(
                    "write_quorum = {q} must be between 1 and replicas ({})",
                    self.replica_count()
                ));
            }
        }
        if let Some(q) = self.read_quorum {
            if q == 0 || q > self.replica_count() {
                return bad(format!(
                    "read_quorum = {q} must be between 1 and replicas ({})",
                    self.replica_count()
                ));
            }
        }
        if self.timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return bad("timeouts must be positive".into());
        }
        Ok(())
    }

    /// Copies per key after defaults.
    pub fn replica_count(&self) -> usize {
        self.replicas
            .unwrap_or(if self.nodes.len() >= 2 { 2 } else { 1 })
            .min(self.nodes.len())
    }

    /// The call timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The longest wait on a node that is busy but alive (`None`: a call
    /// fails at the call timeout).
    pub fn busy_limit(&self) -> Option<Duration> {
        (self.busy_timeout_ms > self.timeout_ms)
            .then(|| Duration::from_millis(self.busy_timeout_ms))
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let c = ClusterConfig::from_list("a:1, b:2 ,c:3").expect("valid");
        assert_eq!(c.nodes, ["a:1", "b:2", "c:3"]);
        assert_eq!(c.replica_count(), 2);
        assert_eq!(
            ClusterConfig::from_list("a:1")
                .expect("one")
                .replica_count(),
            1
        );
        for bad in ["", "a", "a:x", ":1", "a:1,a:1", "unix:", "unix:/s,unix:/s"] {
            assert!(ClusterConfig::from_list(bad).is_err(), "{bad}");
        }
        let mixed = ClusterConfig::from_list("unix:/run/ls.sock,h:1").expect("unix and tcp");
        assert_eq!(mixed.nodes, ["unix:/run/ls.sock", "h:1"]);
        let mut c = ClusterConfig::new(["a:1", "b:2"]);
        c.replicas = Some(3);
        assert!(c.validate().is_err());
        c.replicas = Some(2);
        c.write_quorum = Some(3);
        assert!(c.validate().is_err());
        c.write_quorum = Some(2);
        assert!(c.validate().is_ok());
        c.read_quorum = Some(0);
        assert!(c.validate().is_err());
        c.read_quorum = Some(3);
        assert!(c.validate().is_err());
        c.read_quorum = Some(1);
        assert!(c.validate().is_ok());
        // A slow node is waited on for 30 s by default; a busy timeout not
        // above the call timeout turns that off.
        assert_eq!(c.busy_limit(), Some(Duration::from_secs(30)));
        c.busy_timeout_ms = c.timeout_ms;
        assert_eq!(c.busy_limit(), None);
    }

    #[test]
    fn toml_file() {
        let dir = std::env::temp_dir().join(format!("ls-client-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("cluster.toml");
        std::fs::write(
            &p,
            "nodes = [\"h:1\", \"h:2\", \"h:3\"]\nreplicas = 3\nwrite_quorum = 2\n",
        )
        .expect("write");
        let c = ClusterConfig::from_file(&p).expect("parse");
        assert_eq!((c.replica_count(), c.write_quorum), (3, Some(2)));
        std::fs::write(&p, "nodes = [\"h:1\"]\nreplica = 3\n").expect("write");
        assert!(
            ClusterConfig::from_file(&p).is_err(),
            "unknown keys are refused"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn password_from_the_environment_only_when_none_is_configured() {
        let mut cfg = ClusterConfig::new(["127.0.0.1:1"]);
        cfg.password_from_env(None);
        assert_eq!(cfg.password, None);
        cfg.password_from_env(Some(String::new()));
        assert_eq!(cfg.password, None);
        cfg.password_from_env(Some("from-env".into()));
        assert_eq!(cfg.password.as_deref(), Some("from-env"));
        cfg.password_from_env(Some("other".into()));
        assert_eq!(cfg.password.as_deref(), Some("from-env"));
    }
}
