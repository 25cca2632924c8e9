//! Helpers of the `nbd_*` tests: start `lightstore nbd` on a Unix socket
//! in front of real nodes, wait (bounded) for it, and check that the
//! third-party tools a test drives are installed (under `CI=true` a missing
//! tool fails the test instead of skipping it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether every tool in `tools` is installed; if not, under `CI=true`
/// panics, else prints why the test is skipped and returns false.
pub fn have_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "missing {missing:?} (apt-get install qemu-utils libnbd-bin python3-libnbd fio e2fsprogs fuse3)"
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("skipped: {msg}");
    false
}

/// A running `lightstore nbd`; killed when dropped.
pub struct NbdProc {
    pub child: Child,
    pub socket: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
    /// The thread copying its stderr into `log`; done at end of file.
    log_reader: Option<std::thread::JoinHandle<()>>,
}

impl NbdProc {
    /// `lightstore nbd --nodes NODES --unix SOCKET` plus `extra` flags.
    pub fn start(nodes: &str, socket: &Path, extra: &[&str]) -> NbdProc {
        NbdProc::start_within(nodes, socket, extra, Duration::from_secs(10))
    }

    /// [`NbdProc::start`], ready within `limit`.
    pub fn start_within(nodes: &str, socket: &Path, extra: &[&str], limit: Duration) -> NbdProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lightstore"))
            .args(["nbd", "--nodes", nodes, "--unix"])
            .arg(socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lightstore nbd");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        let log_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                log2.lock().expect("log").push(line);
            }
        });
        let deadline = Instant::now() + limit;
        loop {
            if log
                .lock()
                .expect("log")
                .iter()
                .any(|l| l.starts_with("lightstore nbd ready"))
            {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "lightstore nbd exited ({status}):\n{}",
                    log.lock().expect("log").join("\n")
                );
            }
            assert!(
                Instant::now() < deadline,
                "lightstore nbd not ready in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        NbdProc {
            child,
            socket: socket.to_path_buf(),
            log,
            log_reader: Some(log_reader),
        }
    }

    /// The NBD URI of export `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }

    /// Everything it printed.
    pub fn log_text(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// SIGTERM, then waits (bounded) for it to exit; its exit code, with
    /// everything it printed in `log`.
    pub fn stop(&mut self, limit: Duration) -> Option<i32> {
        // SAFETY: kill(2) on a child we own.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                // Its last lines may still be in the pipe: read to the end.
                if let Some(reader) = self.log_reader.take() {
                    let _ = reader.join();
                }
                return s.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NbdProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a tool; panics with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Its stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
