//! `lightstore fs` (create, list, inspect and delete file systems) and
//! `lightstore mount` (serve one through FUSE until unmounted).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use client::{Cluster, Store};
use fs::fuse::FuseFs;
use fs::layout::Keys;
use fs::registry::{self, DEFAULT_CHUNK_SIZE};
use fs::FileSystem;

use crate::cluster_cmd::ClusterTarget;
use crate::holder::{claim_or_wait, same_machine, this_process};

/// How often a mount writes back changed inodes.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long the read-ahead setter waits for the mount to answer.
const READ_AHEAD_WAIT: Duration = Duration::from_secs(10);

/// Flags of `lightstore fs`.
#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(flatten)]
    target: ClusterTarget,
    #[command(subcommand)]
    action: FsAction,
}

#[derive(Subcommand, Debug)]
enum FsAction {
    /// Create an empty file system.
    Create {
        name: String,
        /// Bytes per data chunk (power of two, 4K-4M).
        #[arg(long, value_parser = server::parse_size)]
        chunk_size: Option<u64>,
    },
    /// List file systems.
    List,
    /// Show a file system's record and whether it is mounted.
    Info { name: String },
    /// Check a file system's consistency, read-only (as `e2fsck -n`):
    /// entries against inodes, link counts, parents, marks; exit status 1
    /// if anything is wrong. Check an unmounted file system.
    Check {
        name: String,
        /// Also list every data chunk and check it belongs to a file
        /// (reads a key per chunk).
        #[arg(long)]
        data: bool,
        /// Delete the leaked chunks found (implies --data): data that a
        /// crash left without the file that would have named it. Takes the
        /// mount lease, so it is refused while the file system is mounted.
        #[arg(long)]
        repair: bool,
        /// With --repair: take the lease of a mount known to be dead.
        #[arg(long, requires = "repair")]
        force: bool,
    },
    /// Delete a file system and everything in it.
    Delete {
        name: String,
        /// Delete even if a mount holds its lease.
        #[arg(long)]
        force: bool,
    },
}

/// Flags of `lightstore mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    #[command(flatten)]
    target: ClusterTarget,
    /// The file system to mount.
    #[arg(long = "fs")]
    name: String,
    /// Where to mount it.
    mountpoint: PathBuf,
    /// Create the file system if it does not exist.
    #[arg(long)]
    create: bool,
    /// Take over the mount lease of a mount known to be dead.
    #[arg(long)]
    force: bool,
    /// FUSE worker threads: requests the mount works on at once. A
    /// partial-chunk write holds one for two round trips to the cluster
    /// (read, then write), so random writes gain from many. Over io_uring
    /// they are spread over the CPUs' queues (at least one each, pinned to
    /// its CPU), so the callers on one CPU have threads/CPUs requests
    /// served at once: raise it on a machine with many CPUs.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Let the kernel's page cache buffer writes (yes) or send each write
    /// through at once (no).
    #[arg(long, value_parser = ["yes", "no"], default_value = "yes")]
    writeback_cache: String,
    /// Acknowledge metadata changes from the adapter's caches and write
    /// them behind in ordered atomic batches (yes; fsync waits for them),
    /// or write each before it returns (no).
    #[arg(long, value_parser = ["yes", "no"], default_value = "yes")]
    write_behind: String,
    /// The kernel's read-ahead window for sequential reads (FUSE leaves it
    /// at 128 KiB; set through sysfs once mounted, which needs root; 0
    /// keeps the kernel's).
    #[arg(long, value_parser = crate::bench::parse_size, default_value = "4M")]
    read_ahead: u64,
    /// How the kernel hands requests to the mount: through io_uring, one
    /// queue per CPU (yes: the kernel must offer it, Linux 6.14+ with
    /// /sys/module/fuse/parameters/enable_uring set to Y), through reads
    /// and writes on /dev/fuse (no), or io_uring when offered (auto).
    #[arg(long, value_parser = ["auto", "yes", "no"], default_value = "auto")]
    io_uring: String,
    /// Serve request counters (per FUSE operation: requests, seconds,
    /// errors; bytes read and written) in the Prometheus format on this
    /// address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// The kernel's switch for FUSE over io_uring (Linux 6.14+).
const FUSE_URING_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel has FUSE over io_uring and it is switched off.
fn io_uring_switched_off() -> bool {
    std::fs::read_to_string(FUSE_URING_SWITCH).is_ok_and(|v| v.trim() == "N")
}

fn chunk_size(v: Option<u64>) -> Result<u32, Box<dyn std::error::Error>> {
    Ok(match v {
        Some(v) => u32::try_from(v).map_err(|_| format!("chunk size {v} is too large"))?,
        None => DEFAULT_CHUNK_SIZE,
    })
}

fn print_record(r: &fs::FsRecord, mounted: Option<String>) {
    println!(
        "{}\tchunk {}\tid {:016x}\tcreated {}\t{}",
        r.name,
        r.chunk_size,
        r.id,
        r.created,
        mounted.map_or("not mounted".into(), |h| format!("mounted {h}"))
    );
}

/// Runs `lightstore fs`.
pub fn run_fs(args: FsArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cluster: Arc<dyn Store> = Arc::new(Cluster::connect(args.target.config()?)?);
    let store = &*cluster;
    match args.action {
        FsAction::Create {
            name,
            chunk_size: cs,
        } => {
            let r = registry::create(store, &name, chunk_size(cs)?)?;
            print_record(&r, None);
        }
        FsAction::List => {
            for r in registry::list(store)? {
                let held = fs::lease::live_holder(store, &Keys::new(r.id))?;
                print_record(&r, held);
            }
        }
        FsAction::Info { name } => match registry::open(store, &name)? {
            Some(r) => {
                let held = fs::lease::live_holder(store, &Keys::new(r.id))?;
                print_record(&r, held);
            }
            None => return Err(format!("no file system named {name}").into()),
        },
        FsAction::Check {
            name,
            data,
            repair,
            force,
        } => {
            let Some(r) = registry::open(store, &name)? else {
                return Err(format!("no file system named {name}").into());
            };
            let keys = Keys::new(r.id);
            let (lease, mode) = if repair {
                let me = format!("lightstore fs check --repair, pid {}", std::process::id());
                let lease = fs::lease::acquire(cluster.clone(), &keys, &me, force)?;
                (Some(lease), fs::check::Repair::LeakedChunks)
            } else {
                if let Some(h) = fs::lease::live_holder(store, &keys)? {
                    eprintln!(
                        "warning: {name} is mounted ({h}): changes in flight may show as problems"
                    );
                }
                (None, fs::check::Repair::Nothing)
            };
            let report = fs::check::check(store, &r, data || repair, mode);
            // Let go whatever happened, as `volume delete` does.
            if let Some(lease) = lease {
                lease.release()?;
            }
            let report = report?;
            let chunks = report
                .chunks
                .map_or(String::new(), |c| format!(", {c} chunks"));
            let repaired = crate::deleted_note(repair, report.repaired);
            crate::print_check(
                &report.findings,
                &format!(
                    "{name}: {} inodes, {} entries{chunks}, {} pending reclaim, {} leaked chunks{repaired}, {} problems",
                    report.inodes, report.entries, report.pending, report.leaked, report.findings.count
                ),
                &format!("{name} has "),
            )?;
        }
        FsAction::Delete { name, force } => {
            registry::delete(cluster.clone(), &name, force)?;
            println!("deleted {name}");
        }
    }
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread and the threads it starts
/// later, so [`wait_for_stop`] receives them.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_stop(set: &libc::sigset_t) {
    let mut sig = 0;
    // SAFETY: `set` is a valid signal set; sigwait writes the signal number.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
}

/// Whether a signal of `set` arrives within `limit`.
fn stop_within(set: &libc::sigset_t, limit: Duration) -> bool {
    let timeout = libc::timespec {
        tv_sec: limit.as_secs() as libc::time_t,
        tv_nsec: limit.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` and `timeout` are valid for the call; no siginfo is
    // asked for.
    unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &timeout) > 0 }
}

/// `umount2(dir, flags)`.
fn umount(dir: &std::path::Path, flags: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: `path` is a valid NUL-terminated string for the call.
    if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How long a busy mount is tried again after a stop signal before the
/// user is asked to let go of it.
const BUSY_FOR_AT_MOST: Duration = Duration::from_secs(3);

/// Why a mount asked to stop is still there.
enum Busy {
    /// Another stop signal came while the unmount was tried again: the
    /// user wants it detached now.
    SignalledAgain,
    /// The unmount failed this way (still busy, or another error).
    Still(std::io::Error),
}

/// Unmounts `dir` once it is no longer busy, trying again for up to
/// [`BUSY_FOR_AT_MOST`] after the first attempt failed with `first`: a
/// file closed just before the signal can hold the mount for a moment
/// after its `close` returned (seen under load, in CI). Another signal of
/// `signals` meanwhile ends the wait.
fn unmount_when_free(
    dir: &std::path::Path,
    first: std::io::Error,
    signals: &libc::sigset_t,
) -> Result<(), Busy> {
    let deadline = std::time::Instant::now() + BUSY_FOR_AT_MOST;
    let mut err = first;
    while err.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline {
        if stop_within(signals, Duration::from_millis(50)) {
            return Err(Busy::SignalledAgain);
        }
        match umount(dir, 0) {
            Ok(()) => return Ok(()),
            Err(e) => err = e,
        }
    }
    Err(Busy::Still(err))
}

/// Detaches the mount at `dir` (`umount -l`): gone from the tree now, the
/// FUSE session ends when its last user closes.
fn detach(dir: &std::path::Path) {
    if let Err(e) = umount(dir, libc::MNT_DETACH) {
        eprintln!("lightstore mount: cannot detach {}: {e}", dir.display());
    }
}

/// Runs `lightstore mount` in the foreground until unmounted (SIGINT,
/// SIGTERM or `fusermount3 -u`).
pub fn run_mount(args: MountArgs) -> Result<(), Box<dyn std::error::Error>> {
    let signals = block_stop_signals();
    let store: Arc<dyn Store> = Arc::new(Cluster::connect(args.target.config()?)?);
    let name = &args.name;
    let record = match (registry::open(&*store, name)?, args.create) {
        (Some(r), _) => r,
        (None, true) => registry::create(&*store, name, DEFAULT_CHUNK_SIZE)?,
        (None, false) => {
            return Err(format!(
            "no file system named {name}: create it with `lightstore fs create` or give --create"
        )
            .into())
        }
    };
    // A metrics address in use fails the mount before it claims anything.
    let metrics_listener = match &args.metrics {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr)
                .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?,
        ),
        None => None,
    };
    let lease = acquire_mount_lease(&store, &Keys::new(record.id), name, args.force)?;
    let fs = Arc::new(FileSystem::open(store.clone(), &record)?);
    fs.fence_with(lease.fence());
    let writer = match args.write_behind.as_str() {
        "yes" => Some(fs.start_write_behind()?),
        _ => None,
    };
    let reclaimer = fs.start_reclaimer()?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("lightstore:{name}")),
        fuser::MountOption::Subtype("lightstore".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::Dev,
        fuser::MountOption::Suid,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(args.threads.max(1));
    config.clone_fd = true;
    let transport = match args.io_uring.as_str() {
        "yes" => fs::fuse::Transport::IoUring,
        "no" => fs::fuse::Transport::Device,
        _ => fs::fuse::Transport::Auto,
    };
    let fuse_fs = FuseFs::new(fs.clone(), args.writeback_cache == "yes").with_transport(transport);
    let stats = fuse_fs.stats();
    if let Some(listener) = metrics_listener {
        fs::metrics::serve(stats.clone(), listener)?;
    }
    let mut session = match fuser::Session::new(fuse_fs, &args.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            // Let the next mount in at once.
            fs.stop_write_behind();
            let _ = lease.release();
            return Err(format!("cannot mount on {}: {e}", args.mountpoint.display()).into());
        }
    };
    let mut unmounter = session.unmount_callable();
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let step = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(step);
                waited += step;
                if waited >= FLUSH_EVERY {
                    waited = Duration::ZERO;
                    if let Err(e) = fs.flush_all() {
                        tracing::warn!(error = %e, "cannot write back inodes");
                    }
                }
            }
        })
    };
    let mountpoint = args.mountpoint.clone();
    let asked_to_stop = Arc::new(AtomicBool::new(false));
    let asked = asked_to_stop.clone();
    std::thread::spawn(move || {
        wait_for_stop(&signals);
        asked.store(true, Ordering::SeqCst);
        eprintln!("lightstore mount: unmounting {}", mountpoint.display());
        let Err(e) = unmounter.unmount() else {
            return;
        };
        match unmount_when_free(&mountpoint, e, &signals) {
            Ok(()) => {}
            Err(Busy::SignalledAgain) => detach(&mountpoint),
            Err(Busy::Still(e)) => {
                // Open files, a shell inside: a second signal detaches it;
                // the mount ends when the last user lets go.
                eprintln!(
                    "lightstore mount: cannot unmount: {e}; signal again to detach it lazily"
                );
                wait_for_stop(&signals);
                detach(&mountpoint);
            }
        }
    });
    if args.read_ahead > 0 {
        let (mountpoint, bytes) = (args.mountpoint.clone(), args.read_ahead);
        std::thread::spawn(move || {
            match fs::readahead::widen_when_mounted(&mountpoint, bytes, READ_AHEAD_WAIT) {
                Ok(path) => tracing::debug!(path = %path.display(), bytes, "read-ahead set"),
                Err(e) => {
                    tracing::warn!(error = %e, "read-ahead left at the kernel's default (128 KiB)")
                }
            }
        });
    }
    let metrics = args.metrics.as_ref().map_or(String::new(), |m| {
        format!("; metrics on http://{m}/metrics")
    });
    let via = if stats.io_uring() {
        "io_uring"
    } else {
        "/dev/fuse"
    };
    eprintln!(
        "lightstore mount: {name} mounted on {} (FUSE over {via}){metrics}",
        args.mountpoint.display()
    );
    if !stats.io_uring() && transport == fs::fuse::Transport::Auto && io_uring_switched_off() {
        eprintln!(
            "lightstore mount: this kernel can take FUSE requests through io_uring, about 1.7 \
             times as many metadata operations per second; it is off: \
             echo Y > {FUSE_URING_SWITCH} (as root) before mounting"
        );
    }
    let served = session.run();
    stop.store(true, Ordering::Relaxed);
    let _ = flusher.join();
    fs.stop_reclaimer();
    let _ = reclaimer.join();
    fs.unmounted()?;
    fs.flush_all()?;
    fs.stop_write_behind();
    if let Some(w) = writer {
        let _ = w.join();
    }
    // The lease goes whatever the last sync says (every queued change is
    // written by now): a failed sync is reported, not a lease left to expire.
    let synced = fs.sync_all();
    let released = lease.release();
    synced?;
    released?;
    match served {
        Ok(()) => {}
        // The kernel ended the connection on the unmount we asked for: the
        // session's last read fails with ENODEV, or (seen once in CI, with
        // a node restarted under the mount; cause not pinned down)
        // ECONNABORTED. Everything was written back above either way.
        Err(e) if asked_to_stop.load(Ordering::SeqCst) && ends_session(&e) => {
            tracing::debug!(error = %e, "FUSE session ended by the unmount");
        }
        Err(e) => return Err(format!("serving FUSE: {e}").into()),
    }
    eprintln!("lightstore mount: unmounted; every write is durable");
    Ok(())
}

/// Whether `e`, ending a FUSE session, is the kernel closing the
/// connection (`ENODEV`, or `ECONNABORTED` for an aborted one).
fn ends_session(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ECONNABORTED))
}

/// Takes the file system's mount lease. A lease held from this machine
/// while no mount of the file system is left in its mount table belongs
/// to a mount that is finishing (`fusermount3 -u` returns before the
/// mount has written everything back and let go) or died: it is waited
/// for, until released or expired, instead of refused.
fn acquire_mount_lease(
    store: &Arc<dyn Store>,
    keys: &Keys,
    name: &str,
    force: bool,
) -> Result<fs::lease::Lease, Box<dyn std::error::Error>> {
    let me = this_process();
    claim_or_wait(
        &format!(
            "lightstore mount: waiting for the last mount of {name} on this machine to let go"
        ),
        || fs::lease::acquire(store.clone(), keys, &me, force),
        |e| match e {
            fs::FsError::Refused(why) => Some(why.clone()),
            _ => None,
        },
        || {
            // Gone since the attempt (expired, released): try again.
            Ok(fs::lease::live_holding(&**store, keys)?
                .is_none_or(|h| same_machine(&h.holder, &me) && !mounted_here(name)))
        },
    )
}

/// Whether this machine's mount table holds a mount of file system `name`.
fn mounted_here(name: &str) -> bool {
    let fsname = format!("lightstore:{name}");
    std::fs::read_to_string("/proc/self/mounts").map_or(true, |t| {
        t.lines()
            .any(|l| l.split_whitespace().next() == Some(fsname.as_str()))
    })
}
