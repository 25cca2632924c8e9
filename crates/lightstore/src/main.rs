//! `lightstore` — the LightStore command-line tool. Subcommands: `node`
//! (the node server: one device served over RESP), `bench` (the paper's
//! workloads against the engine in-process), `cluster` (status, repair and
//! key commands through the cluster client), `up` (a local N-node
//! cluster), `nbd` (volumes served over NBD), `volume` (manage them), `fs` (manage
//! file systems) and `mount` (serve one through FUSE).

use std::io::IsTerminal;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the engine allocates a key and a
/// skiplist node per write and frees a whole memtable per flush, and
/// glibc spent about a fifth of a small-value fill's CPU in malloc, free
/// and consolidation (`bench/RESULTS.md`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;
mod cluster_cmd;
mod fs_cmd;
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

/// Makes glibc's malloc give large buffers back to the system when they are
/// freed. By default it raises its mmap threshold after the first large
/// free (up to 32 MiB), so later large buffers — a multi-MiB value read on
/// one of the many executor and I/O threads — come from per-thread arenas,
/// which keep the memory: a client reading 200 values of 16 MiB left the
/// node at 2 GiB resident for good. A fixed 1 MiB threshold maps every
/// buffer of that size or more on its own and unmaps it on free. Fixing it
/// also fixes the trim threshold, which must stay well above the read
/// buffers (up to 256 KiB) that batched GETs allocate and free all the
/// time, or every batch would hand its pages back and fault them in again
/// (4.5× the page faults and +13 % CPU per GET at -P 16 with the default
/// 128 KiB). Small allocations are unaffected.
fn return_large_buffers_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before
    // any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
    }
}

fn main() {
    return_large_buffers_to_the_system();
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
