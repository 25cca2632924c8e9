//! `lightstore` — the LightStore command-line tool. Subcommands: `node`
//! (the node server: one device served over RESP), `bench` (the paper's
//! workloads against the engine in-process), `cluster` (status, repair and
//! key commands through the cluster client), `up` (a local N-node
//! cluster), `nbd` (volumes served over NBD), `volume` (manage them), `fs` (manage
//! file systems) and `mount` (serve one through FUSE).

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the engine allocated a key and a
/// skiplist node per write and freed a whole memtable per flush, and
/// glibc spent about a fifth of a small-value fill's CPU in malloc, free
/// and consolidation (`bench/RESULTS.md`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod cluster_cmd;
mod fs_cmd;
mod holder;
mod nbd_cmd;
mod node;
mod up;
mod workload;

#[derive(Parser)]
#[command(
    name = "lightstore",
    version,
    about = "LightStore: a network-attached key-value drive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node: own one device and serve it over RESP (redis-cli works).
    Node(Box<node::NodeArgs>),
    /// Run a key-value workload against the engine in-process.
    Bench(bench::BenchArgs),
    /// Talk to a cluster: status, repair, get/set/del/range.
    Cluster(cluster_cmd::ClusterArgs),
    /// Start a local N-node cluster and run it until Ctrl-C / SIGTERM.
    Up(up::UpArgs),
    /// Serve the cluster's volumes as NBD exports (qemu, nbdcopy, nbdfuse, fio).
    Nbd(nbd_cmd::NbdArgs),
    /// Create, list, inspect, resize and delete block volumes.
    Volume(nbd_cmd::VolumeArgs),
    /// Create, list, inspect and delete file systems.
    Fs(fs_cmd::FsArgs),
    /// Mount a file system through FUSE; runs until unmounted.
    Mount(fs_cmd::MountArgs),
}

/// How long memory freed by the allocator stays mapped before mimalloc
/// gives it back to the system, in milliseconds: ten seconds, jemalloc's
/// default decay for freed ("dirty") pages.
///
/// Buffers of requests, replies, log chunks and device reads are freed and
/// allocated again all the time, often on other threads, and a page given
/// back is faulted in (and cleared) again on its next use: expensive in a
/// virtual machine, and with transparent huge pages each fault clears
/// 2 MiB. mimalloc's own defaults (10 ms in v2, 1 s in v3) are too short
/// for a server's load, which pauses between bursts: at 10 ms the NBD
/// adapter took up to 0.6 page faults per random 8 KiB read (session 18 in
/// `bench/RESULTS.md`); at 1 s a node taking sequential block writes still
/// faulted 28–45 thousand times per 3 GiB, a tenth of its CPU (session
/// 31). Memory freed after a burst still goes back, ten seconds later. An
/// operator's `MIMALLOC_PURGE_DELAY` wins.
const FREED_MEMORY_KEPT_MS: std::ffi::c_long = 10_000;

/// `mi_option_purge_delay`: its place in mimalloc's option enum, v2 and v3
/// alike (the Rust bindings do not name it).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets mimalloc's purge delay to [`FREED_MEMORY_KEPT_MS`] unless the
/// operator set `MIMALLOC_PURGE_DELAY`.
fn keep_freed_memory_a_while() {
    use libmimalloc_sys::mi_option_set;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: setting an allocator option by its documented index;
    // mimalloc reads this option each time it schedules a purge.
    unsafe {
        mi_option_set(PURGE_DELAY, FREED_MEMORY_KEPT_MS);
    }
}

/// Ends `fs check` and `volume check`: prints each problem, then the
/// summary line; an error (exit status 1) saying `{failure}N problems` if
/// there was any.
/// The note a `check --repair` adds to its summary: how many leaked chunks
/// it deleted (nothing without `--repair`).
pub(crate) fn deleted_note(repair: bool, deleted: u64) -> String {
    if repair {
        format!(" ({deleted} deleted)")
    } else {
        String::new()
    }
}

pub(crate) fn print_check(
    findings: &client::findings::Findings,
    summary: &str,
    failure: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    for p in &findings.problems {
        println!("problem: {p}");
    }
    println!("{summary}");
    if findings.is_clean() {
        Ok(())
    } else {
        Err(format!("{failure}{} problems", findings.count).into())
    }
}

fn main() {
    keep_freed_memory_a_while();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // fuser logs each request the kernel interrupted and each
                // optional operation it declines: noise for an operator.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node(args) => node::run(*args),
        Command::Bench(args) => bench::run(args).map_err(Into::into),
        Command::Cluster(args) => cluster_cmd::run(args),
        Command::Up(args) => up::run(args),
        Command::Nbd(args) => nbd_cmd::run_nbd(args),
        Command::Volume(args) => nbd_cmd::run_volume(args),
        Command::Fs(args) => fs_cmd::run_fs(args),
        Command::Mount(args) => fs_cmd::run_mount(args),
    };
    if let Err(e) = result {
        eprintln!("lightstore: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option index names mimalloc's purge delay: after the call,
    /// mimalloc reports the delay set (or the operator's, if given).
    #[test]
    fn freed_memory_is_kept_ten_seconds_unless_the_operator_says_otherwise() {
        keep_freed_memory_a_while();
        // SAFETY: reading an allocator option by its documented index.
        let now = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        match std::env::var("MIMALLOC_PURGE_DELAY") {
            Ok(ms) => assert_eq!(Some(now), ms.trim().parse().ok(), "operator's delay"),
            Err(_) => assert_eq!(now, FREED_MEMORY_KEPT_MS),
        }
    }
}
