//! `lightstore up`: a local N-node cluster for demos and tests. Each node is
//! a `lightstore node` child process with its own data directory and port;
//! the cluster's TOML file is written next to them. SIGINT or SIGTERM stops
//! every node cleanly (SIGTERM, then SIGKILL after a grace period).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use client::Conn;

/// Flags of `lightstore up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Port of the first node; the others follow.
    #[arg(long, default_value_t = 7401)]
    base_port: u16,
    /// Directory holding node0, node1, ... and cluster.toml.
    #[arg(long, default_value = "data/cluster")]
    dir: PathBuf,
    /// Copies per key written into cluster.toml (default 2 with at least 2 nodes).
    #[arg(long)]
    replicas: Option<usize>,
    /// Durability of every node: sync, interval, none.
    #[arg(long, default_value = "interval")]
    durability: String,
    /// Device file size of each node, e.g. 4G (sparse).
    #[arg(long, default_value = "4G")]
    capacity: String,
    /// Keytable cache of each node, e.g. 64M.
    #[arg(long)]
    cache_size: Option<String>,
    /// Executor write threads of each node (default: a node's own, 4, or 16
    /// under `--durability sync`, where they wait for syncs, not cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// How long nodes get to start and to stop.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Nodes started so far; stopped on drop, whatever happens.
struct Nodes(Vec<(String, Child)>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, child) in &self.0 {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) with a pid we spawned; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        for (addr, child) in &mut self.0 {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        eprintln!("lightstore up: node {addr} stopped ({status})");
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        eprintln!("lightstore up: node {addr} did not stop; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

/// Runs `lightstore up` until SIGINT/SIGTERM or a node dies.
pub fn run(args: UpArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.nodes == 0 {
        return Err("--nodes must be at least 1".into());
    }
    let last = u32::from(args.base_port) + args.nodes as u32 - 1;
    if last > u32::from(u16::MAX) {
        return Err("ports run past 65535: lower --base-port".into());
    }
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let exe = std::env::current_exe()?;
    let mut nodes = Nodes(Vec::new());
    for i in 0..args.nodes {
        let addr = format!("127.0.0.1:{}", u32::from(args.base_port) + i as u32);
        let data = args.dir.join(format!("node{i}"));
        let child = spawn_node(&exe, &args, &addr, &data)?;
        nodes.0.push((addr, child));
    }
    let addrs: Vec<String> = nodes.0.iter().map(|(a, _)| a.clone()).collect();
    for (addr, child) in &mut nodes.0 {
        wait_ready(addr, child)?;
    }
    let toml = args.dir.join("cluster.toml");
    let mut text = format!(
        "# written by `lightstore up`\nnodes = [{}]\n",
        addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(r) = args.replicas {
        text.push_str(&format!("replicas = {r}\n"));
    }
    std::fs::write(&toml, text).map_err(|e| format!("cannot write {}: {e}", toml.display()))?;
    println!(
        "lightstore up: {} nodes ready: {} (cluster config {})",
        addrs.len(),
        addrs.join(","),
        toml.display()
    );
    wait_for_stop(&mut nodes)
}

fn spawn_node(exe: &Path, args: &UpArgs, addr: &str, data: &Path) -> Result<Child, String> {
    std::fs::create_dir_all(data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
    let log = std::fs::File::create(data.join("node.log"))
        .map_err(|e| format!("cannot create node log in {}: {e}", data.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("node")
        .args(["--listen", addr, "--durability", &args.durability])
        .args(["--capacity", &args.capacity])
        .arg("--data")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(c) = &args.cache_size {
        cmd.args(["--cache-size", c]);
    }
    if let Some(t) = args.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    cmd.spawn()
        .map_err(|e| format!("cannot start node {addr}: {e}"))
}

fn wait_ready(addr: &str, child: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "node {addr} exited during start ({status}); see its node.log"
            ));
        }
        if let Ok(mut c) = Conn::open(addr, Duration::from_millis(200), None) {
            if c.call(&[&b"PING"[..]]).is_ok() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "node {addr} did not answer within {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Blocks until SIGINT/SIGTERM (then the nodes are stopped by `Nodes`'s
/// drop) or until a node exits on its own (an error).
fn wait_for_stop(nodes: &mut Nodes) -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = tick.tick() => {
                    for (addr, child) in &mut nodes.0 {
                        if let Ok(Some(status)) = child.try_wait() {
                            return Err(format!("node {addr} exited ({status}); stopping the cluster").into());
                        }
                    }
                }
            }
        }
        eprintln!("lightstore up: stopping {} nodes", nodes.0.len());
        Ok(())
    })
}
