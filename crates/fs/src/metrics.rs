//! The mount's request counters (`lightstore mount --metrics ADDR`): per
//! FUSE operation the requests answered and a histogram of the time each
//! took in the mount (the `latency` crate's buckets, as the node's), the
//! errors answered (POSIX ones such as ENOENT apart from failures of the
//! cluster, which become EIO), and the bytes read and written, in the
//! Prometheus text format over HTTP, as `lightstore nbd --metrics` does.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latency::{Histogram, HistogramSnapshot};

/// The operations counted, by [`Op`] index; "other" takes an error
/// reported under a name not listed.
pub const OP_NAMES: [&str; 33] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "fallocate",
    "copy_file_range",
    "lseek",
    "create",
    "other",
];
const N: usize = OP_NAMES.len();

/// An operation counted (its index in [`OP_NAMES`]).
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Fallocate,
    CopyFileRange,
    Lseek,
    Create,
}

/// The counters of one mount.
pub struct FuseStats {
    latency: [Histogram; N],
    posix_errors: [AtomicU64; N],
    store_errors: [AtomicU64; N],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    /// The kernel hands requests over through io_uring (set at FUSE init).
    io_uring: std::sync::atomic::AtomicBool,
}

impl Default for FuseStats {
    fn default() -> Self {
        FuseStats {
            latency: std::array::from_fn(|_| Histogram::default()),
            posix_errors: std::array::from_fn(|_| AtomicU64::new(0)),
            store_errors: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            io_uring: Default::default(),
        }
    }
}

/// Counts one request when dropped (its time from [`FuseStats::begin`]).
pub struct Timed<'a> {
    stats: &'a FuseStats,
    op: Op,
    began: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.stats.latency[self.op as usize].record_us(latency::micros(self.began.elapsed()));
    }
}

impl FuseStats {
    /// Records how the kernel hands requests over (at FUSE init).
    pub fn set_io_uring(&self, on: bool) {
        self.io_uring.store(on, Ordering::Relaxed);
    }

    /// Whether requests come through io_uring rather than `/dev/fuse`.
    pub fn io_uring(&self) -> bool {
        self.io_uring.load(Ordering::Relaxed)
    }

    /// Starts timing a request of `op`, counted when the guard drops.
    pub fn begin(&self, op: Op) -> Timed<'_> {
        Timed {
            stats: self,
            op,
            began: Instant::now(),
        }
    }

    /// An error answered to a request of the operation named `op`: a POSIX
    /// one (`posix`), or a failure of the cluster.
    pub fn error(&self, op: &str, posix: bool) {
        let i = OP_NAMES.iter().position(|n| *n == op).unwrap_or(N - 1);
        let counter = if posix {
            &self.posix_errors[i]
        } else {
            &self.store_errors[i]
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` bytes answered to a read.
    pub fn read_bytes(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` bytes taken by a write.
    pub fn written_bytes(&self, n: usize) {
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The counters in the Prometheus text format (operations never asked
    /// for are left out).
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let asked: Vec<(&str, HistogramSnapshot)> = OP_NAMES
            .iter()
            .zip(&self.latency)
            .map(|(op, h)| (*op, h.snapshot()))
            .filter(|(_, h)| h.count > 0)
            .collect();
        let _ = writeln!(o, "# TYPE lightstore_fs_requests_total counter");
        for (op, h) in &asked {
            let _ = writeln!(o, "lightstore_fs_requests_total{{op=\"{op}\"}} {}", h.count);
        }
        latency::render_prometheus(
            &mut o,
            "lightstore_fs_request_duration_seconds",
            "Time a FUSE request took in the mount, by operation.",
            "op",
            &asked,
        );
        for (name, counters) in [
            ("lightstore_fs_posix_errors_total", &self.posix_errors),
            ("lightstore_fs_store_errors_total", &self.store_errors),
        ] {
            let _ = writeln!(o, "# TYPE {name} counter");
            for (op, c) in OP_NAMES.iter().zip(counters.iter()) {
                let n = get(c);
                if n > 0 {
                    let _ = writeln!(o, "{name}{{op=\"{op}\"}} {n}");
                }
            }
        }
        for (name, c) in [
            ("lightstore_fs_read_bytes_total", &self.bytes_read),
            ("lightstore_fs_written_bytes_total", &self.bytes_written),
        ] {
            let _ = writeln!(o, "# TYPE {name} counter\n{name} {}", get(c));
        }
        let _ = writeln!(
            o,
            "# HELP lightstore_fs_io_uring 1 when the kernel hands requests over through io_uring, 0 through /dev/fuse.\n\
             # TYPE lightstore_fs_io_uring gauge\nlightstore_fs_io_uring {}",
            u8::from(self.io_uring())
        );
        o
    }
}

/// Serves `stats` over HTTP on `listener` (any path, one request per
/// connection) from a thread of its own, for the life of the process.
pub fn serve(stats: Arc<FuseStats>, listener: TcpListener) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("fs-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else {
                    // Out of descriptors, say: do not spin.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                // The request line is enough; a client that sends nothing
                // is answered after the timeout.
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                let _ = s.read(&mut [0u8; 1024]);
                let body = stats.render();
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_line_up_with_ops_and_render_counts_what_was_asked() {
        assert_eq!(OP_NAMES[Op::Create as usize], "create");
        assert_eq!(OP_NAMES[Op::CopyFileRange as usize], "copy_file_range");
        let stats = FuseStats::default();
        drop(stats.begin(Op::Lookup));
        drop(stats.begin(Op::Lookup));
        stats.error("lookup", true);
        stats.error("no such op", false);
        stats.written_bytes(4096);
        let text = stats.render();
        assert!(
            text.contains("lightstore_fs_requests_total{op=\"lookup\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("lightstore_fs_request_duration_seconds_count{op=\"lookup\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("lightstore_fs_posix_errors_total{op=\"lookup\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("lightstore_fs_store_errors_total{op=\"other\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("lightstore_fs_written_bytes_total 4096\n"),
            "{text}"
        );
        assert!(!text.contains("op=\"mkdir\""), "{text}");
    }
}
