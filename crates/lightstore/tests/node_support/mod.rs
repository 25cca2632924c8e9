//! Shared helpers of the `node_*` tests: start the real `lightstore node`
//! binary on a free port and a temporary data directory, wait (bounded) for
//! it to be ready, talk to it with redis-cli or raw RESP, and always kill it.
#![allow(dead_code)]

pub mod cluster;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a node may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running node; killed when dropped.
pub struct Node {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
    /// Everything the node printed to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
    _tmp: Option<tempfile::TempDir>,
}

impl Node {
    /// A node on a fresh temporary data directory.
    pub fn start(extra: &[&str]) -> Node {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut n = Node::start_in(&dir, extra).expect("node starts");
        n._tmp = Some(tmp);
        n
    }

    /// A node on `dir`; `Err(stderr)` if it exits before it is ready.
    /// Its port is one [`free_port`] gave (see [`on_a_free_port`]).
    pub fn start_in(dir: &Path, extra: &[&str]) -> Result<Node, (Option<i32>, String)> {
        on_a_free_port(|listen| Node::start_at(dir, listen, extra))
    }

    /// A node on `dir` listening on `listen` (a fixed port survives restarts).
    pub fn start_at(
        dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Result<Node, (Option<i32>, String)> {
        Node::start_with_env(dir, listen, extra, &[])
    }

    /// As [`Node::start_at`], with these environment variables set.
    pub fn start_with_env(
        dir: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Node, (Option<i32>, String)> {
        // 1 GiB devices unless the test picks its own capacity.
        let capacity: &[&str] = if extra.contains(&"--capacity") {
            &[]
        } else {
            &["--capacity", "1G"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_lightstore"))
            .args(["node", "--listen", listen])
            .args(capacity)
            .args(["--threads", "4", "--cache-size", "64M"])
            .arg("--data")
            .arg(dir)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lightstore node");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("lightstore node ready: listening on ") {
                    let port = rest
                        .split_whitespace()
                        .next()
                        .and_then(|a| a.rsplit(':').next())
                        .and_then(|p| p.parse::<u16>().ok());
                    let _ = tx.send(port);
                }
                log2.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Some(port)) => {
                    return Ok(Node {
                        child,
                        port,
                        dir: dir.to_path_buf(),
                        log,
                        _tmp: None,
                    })
                }
                Ok(None) => panic!("ready line without a port"),
                Err(_) => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                let text = log.lock().unwrap().join("\n");
                return Err((status.code(), text));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node not ready within {READY_TIMEOUT:?}");
            }
        }
    }

    /// The `/metrics` address from the ready line (`--metrics` given).
    /// Polls briefly: the stderr reader may record the line just after readiness.
    pub fn metrics_addr(&self) -> Option<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let found = self.log.lock().unwrap().iter().find_map(|l| {
                let rest = l.split("metrics on http://").nth(1)?;
                Some(rest.split('/').next()?.to_string())
            });
            if found.is_some() || std::time::Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Calls of `command` the node has counted since its start or the last
    /// `CONFIG RESETSTAT` (`INFO commandstats`), 0 when it lists none.
    pub fn calls_of(&self, command: &str) -> u64 {
        command_calls(&self.cli(&["info", "commandstats"]), command).unwrap_or(0)
    }

    /// Everything the node printed to stderr so far, one string.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Runs redis-cli against this node; returns its output (any exit status).
    pub fn cli_output(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-p", &self.port.to_string()]).args(args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("redis-cli is installed (apt-get install redis-tools)");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.map(<[u8]>::to_vec).unwrap_or_default();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("redis-cli runs");
        let _ = writer.join();
        out
    }

    /// Runs redis-cli, asserts success, returns trimmed stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args, None);
        assert!(
            out.status.success(),
            "redis-cli {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    /// A raw TCP connection to the node.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// Sends `input` on a new connection, then reads until the node closes
    /// it (or 10 s pass); what the node sent, as text.
    pub fn send_and_drain(&self, input: &[u8]) -> String {
        let mut s = self.connect();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(input);
        drain(&mut s)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok);
    }

    /// Sends SIGTERM and asserts the node exits with status 0 within
    /// `limit` (its log in the failure message).
    pub fn stop_cleanly(&mut self, limit: Duration) {
        self.terminate();
        let code = self.wait_exit(limit);
        assert_eq!(code, Some(0), "{}", self.log_text());
    }

    /// Waits up to `limit` for the node to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "node did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A RESP value read back from the node.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
}

/// Calls of `command` in an `INFO commandstats` text
/// (`cmdstat_NAME:calls=N,...`), if it lists the command.
pub fn command_calls(info: &str, command: &str) -> Option<u64> {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
}

/// The number after `field:` in an `INFO` text, if it has that line.
pub fn info_number(info: &str, field: &str) -> Option<u64> {
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Encodes a request as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_string())
}

/// Reads one RESP2 reply.
pub fn read_reply(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let line = read_line(r)?;
    let (tag, rest) = line.split_at(1.min(line.len()));
    let n = || rest.parse::<i64>().unwrap_or(-2);
    Ok(match tag {
        "+" => Resp::Simple(rest.into()),
        "-" => Resp::Error(rest.into()),
        ":" => Resp::Int(n()),
        "$" if n() < 0 => Resp::Nil,
        "$" => {
            let mut b = vec![0; n() as usize + 2];
            r.read_exact(&mut b)?;
            b.truncate(b.len() - 2);
            Resp::Bulk(b)
        }
        "*" => {
            let mut items = Vec::new();
            for _ in 0..n().max(0) {
                items.push(read_reply(r)?);
            }
            Resp::Array(items)
        }
        _ => return Err(std::io::Error::other(format!("bad reply line {line:?}"))),
    })
}

/// Reads until the peer closes `s` (or its read timeout passes); what was
/// read, as text.
pub fn drain(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(s, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Runs the `lightstore` binary with `args`, stdin closed; its output.
pub fn lightstore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run lightstore")
}

/// Sends one request and reads its reply.
pub fn call(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Resp {
    conn.get_mut().write_all(&encode(args)).expect("write");
    read_reply(conn).expect("reply")
}

/// Runs `start` with an address on a port from [`free_port`] (never
/// another node's, even one killed a moment ago); a port some other
/// process took between that and the bind (`start` failing with "Address
/// already in use") is traded for another, five times at most.
pub fn on_a_free_port<T>(
    mut start: impl FnMut(&str) -> Result<T, (Option<i32>, String)>,
) -> Result<T, (Option<i32>, String)> {
    let mut tries = 0;
    loop {
        let listen = format!("127.0.0.1:{}", free_port());
        match start(&listen) {
            Err((_, log)) if log.contains("Address already in use") && tries < 5 => tries += 1,
            started => return started,
        }
    }
}

/// A TCP port that was free a moment ago on 127.0.0.1, and that no other
/// call in this test process has returned. The kernel hands out a port
/// again as soon as it is free, and a node killed by one test leaves its
/// port free until the test restarts it: another test's node must not
/// take it meanwhile (a restart would then fail, or a peer's hinted
/// handoff deliver to the wrong cluster).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted on drop;
/// `None` where mounting is not allowed (not root), except under CI, which
/// runs as root and must run this test.
pub struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn mount(mib: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}M"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        if out.status.success() {
            return Some(SmallFs { dir });
        }
        let why = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs: {why}"
        );
        eprintln!("skipped: cannot mount a tmpfs here ({why})");
        None
    }

    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes 1 MiB pieces to `path` until the file system refuses: other
/// files filling the host under the node.
pub fn fill_host(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("ballast");
    let piece = vec![9u8; 1 << 20];
    for _ in 0..100_000 {
        if f.write_all(&piece).is_err() {
            return;
        }
    }
    panic!("the host file system never filled");
}
