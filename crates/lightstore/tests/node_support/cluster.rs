//! A local cluster of real `lightstore node` processes on fixed ports (so a
//! node keeps its address across restarts), each with its own directory,
//! `--durability sync` unless told otherwise; nodes are killed with SIGKILL when dropped.

use std::path::PathBuf;

use client::{Cluster, ClusterConfig};

use super::{on_a_free_port, Node};

/// Nodes `0..n`; `nodes[i]` is `None` while node `i` is down.
pub struct TestCluster {
    _tmp: tempfile::TempDir,
    pub dirs: Vec<PathBuf>,
    pub addrs: Vec<String>,
    pub nodes: Vec<Option<Node>>,
    /// Flags every node gets besides `--durability sync` (which a
    /// `--durability` among them replaces).
    extra: Vec<String>,
}

impl TestCluster {
    pub fn start(n: usize) -> TestCluster {
        TestCluster::start_with(n, &[])
    }

    /// Nodes started with these extra flags too.
    pub fn start_with(n: usize, extra: &[&str]) -> TestCluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<PathBuf> = (0..n)
            .map(|i| tmp.path().join(format!("node{i}")))
            .collect();
        // Each node's address is chosen as it first starts (`start_first`).
        let addrs = vec![String::new(); n];
        let mut c = TestCluster {
            _tmp: tmp,
            dirs,
            addrs,
            nodes: (0..n).map(|_| None).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..n {
            c.start_first(i);
        }
        c
    }

    /// Starts node `i` for the first time, on a port [`on_a_free_port`]
    /// picks (it may trade a taken one: nothing knows the node's address
    /// yet), which becomes its address for good.
    fn start_first(&mut self, i: usize) {
        let node = on_a_free_port(|listen| {
            self.addrs[i] = listen.to_string();
            self.try_start(i)
        })
        .unwrap_or_else(|(code, log)| panic!("node {i} failed ({code:?}):\n{log}"));
        self.nodes[i] = Some(node);
    }

    pub fn restart(&mut self, i: usize) {
        let node = self
            .try_start(i)
            .unwrap_or_else(|(code, log)| panic!("node {i} failed ({code:?}):\n{log}"));
        self.nodes[i] = Some(node);
    }

    fn try_start(&self, i: usize) -> Result<Node, (Option<i32>, String)> {
        std::fs::create_dir_all(&self.dirs[i]).expect("node dir");
        // `--durability sync` unless the extra flags choose one.
        let mut flags = if self.extra.iter().any(|f| f == "--durability") {
            vec![]
        } else {
            vec!["--durability", "sync"]
        };
        flags.extend(self.extra.iter().map(String::as_str));
        Node::start_at(&self.dirs[i], &self.addrs[i], &flags)
    }

    pub fn kill(&mut self, i: usize) {
        // Node's drop is SIGKILL + wait.
        self.nodes[i] = None;
    }

    pub fn client(&self) -> Cluster {
        let mut cfg = ClusterConfig::new(self.addrs.clone());
        cfg.timeout_ms = 3000;
        cfg.retry_interval_ms = 100;
        Cluster::connect(cfg).expect("client")
    }
}
