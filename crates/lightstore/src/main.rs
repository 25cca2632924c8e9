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

/// Lets memory freed by the allocator stay mapped for a second before
/// mimalloc gives it back to the system (mimalloc v2's default is 10 ms;
/// v3, which the `libmimalloc-sys` in Cargo.lock builds, already waits
/// 1 s, and then this changes nothing). Buffers of
/// replies and device reads are freed and allocated again all the time; a
/// page given back is faulted in again on its next use, and a page fault in
/// a virtual machine is expensive: at 10 ms the NBD adapter took up to 0.6
/// page faults per random 8 KiB read in some runs (9 % of its CPU in the
/// kernel's page clearing), at 1 s none (`bench/RESULTS.md`, session 18).
/// Memory freed after a burst still goes back, a second later. An
/// operator's `MIMALLOC_PURGE_DELAY` wins.
fn keep_freed_memory_a_second() {
    use libmimalloc_sys::{mi_option_get, mi_option_set, mi_option_t};
    /// `mi_option_purge_delay` (its place in mimalloc's option enum, v2 and
    /// v3 alike; the Rust bindings do not name it).
    const PURGE_DELAY: mi_option_t = 15;
    /// mimalloc v2's default purge delay, ms: seeing it confirms the
    /// option (v3's default, 1,000 ms, needs no change).
    const DEFAULT_MS: std::ffi::c_long = 10;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: reading and setting an allocator option by its documented
    // index; mimalloc reads this option each time it schedules a purge.
    unsafe {
        if mi_option_get(PURGE_DELAY) == DEFAULT_MS {
            mi_option_set(PURGE_DELAY, 1000);
        }
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
    keep_freed_memory_a_second();
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
