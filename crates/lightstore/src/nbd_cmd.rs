//! `lightstore nbd` (serve the cluster's volumes over NBD) and
//! `lightstore volume` (create, list, inspect, resize and delete them).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use client::{Cluster, Store};
use nbd::volume::{self, DEFAULT_CHUNK_SIZE};
use nbd::{Holder, NbdServer};

use crate::cluster_cmd::ClusterTarget;
use crate::holder::{claim_or_wait, ended_here, this_process};

/// How long a stopping server waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(30);

/// Flags of `lightstore nbd`.
#[derive(Args, Debug)]
pub struct NbdArgs {
    #[command(flatten)]
    target: ClusterTarget,
    /// TCP address to serve NBD on (default 127.0.0.1:10809 unless --unix is given).
    #[arg(long)]
    listen: Option<String>,
    /// Unix socket to serve NBD on.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// The default export; created with --size if it does not exist.
    #[arg(long)]
    export: Option<String>,
    /// Size of the --export volume when it must be created, e.g. 10G.
    #[arg(long, value_parser = server::parse_size, requires = "export")]
    size: Option<u64>,
    /// Chunk size of a volume created here (power of two, 4K-4M; default
    /// 4K).
    #[arg(long, value_parser = server::parse_size)]
    chunk_size: Option<u64>,
    /// Serve request counters (per command: requests, seconds; bytes,
    /// errors, connections) in the Prometheus format on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Serve volumes whose lease another adapter holds (one that is known
    /// to be dead: two adapters writing one volume can lose writes).
    #[arg(long)]
    force: bool,
}

/// Flags of `lightstore volume`.
#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(flatten)]
    target: ClusterTarget,
    #[command(subcommand)]
    action: VolumeAction,
}

#[derive(Subcommand, Debug)]
enum VolumeAction {
    /// Create a volume: NAME SIZE (e.g. 10G).
    Create {
        name: String,
        #[arg(value_parser = server::parse_size)]
        size: u64,
        #[arg(long, value_parser = server::parse_size)]
        chunk_size: Option<u64>,
    },
    /// List volumes.
    List,
    /// Show a volume's record and the space it takes (chunks held,
    /// listed from the cluster).
    Info { name: String },
    /// Grow or shrink a volume (shrinking drops the data past the new end;
    /// refused while an adapter serves it, unless --force).
    Resize {
        name: String,
        #[arg(value_parser = server::parse_size)]
        size: u64,
        /// Shrink even while an adapter serves the volume.
        #[arg(long)]
        force: bool,
    },
    /// Check every stored chunk against the volume records (read-only):
    /// chunks past a volume's end, chunks of no volume (leaked); exit 1
    /// on problems.
    Check {
        /// Delete the leaked chunks (left by deletes cut short in earlier
        /// builds; nothing else reclaims them).
        #[arg(long)]
        repair: bool,
    },
    /// Delete a volume and its data (refused while an adapter serves it,
    /// unless --force).
    Delete {
        name: String,
        /// Delete even while an adapter serves the volume.
        #[arg(long)]
        force: bool,
    },
}

fn chunk_size(v: Option<u64>) -> Result<u32, Box<dyn std::error::Error>> {
    Ok(match v {
        Some(v) => u32::try_from(v).map_err(|_| format!("chunk size {v} is too large"))?,
        None => DEFAULT_CHUNK_SIZE,
    })
}

fn print_volume(v: &nbd::Volume) {
    println!(
        "{}\tsize {}\tchunk {}\tid {:016x}\tcreated {}",
        v.name, v.size, v.chunk_size, v.id, v.created
    );
}

/// Runs `lightstore volume`.
pub fn run_volume(args: VolumeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let shared: Arc<dyn Store> = Arc::new(Cluster::connect(args.target.config()?)?);
    let store: &dyn Store = &*shared;
    match args.action {
        VolumeAction::Create {
            name,
            size,
            chunk_size: cs,
        } => print_volume(&volume::create(store, &name, size, chunk_size(cs)?)?),
        VolumeAction::List => {
            for v in volume::list(store)? {
                print_volume(&v);
            }
        }
        VolumeAction::Info { name } => match volume::open(store, &name)? {
            Some(v) => {
                print_volume(&v);
                let held = volume::allocated_chunks(store, &v)?;
                let bytes = held.saturating_mul(u64::from(v.chunk_size)).min(v.size);
                println!("allocated {bytes}\t{held} of {} chunks", v.chunks());
            }
            None => return Err(format!("no volume named {name}").into()),
        },
        VolumeAction::Resize { name, size, force } => {
            print_volume(&volume::resize(&shared, &name, size, force)?)
        }
        VolumeAction::Check { repair } => {
            let mode = if repair {
                nbd::check::Repair::Leaked
            } else {
                nbd::check::Repair::Nothing
            };
            let r = nbd::check::check(store, mode)?;
            let deleted = crate::deleted_note(repair, r.repaired);
            crate::print_check(
                &r.findings,
                &format!(
                    "{} volumes, {} chunks, {} leaked{deleted}, {} problems",
                    r.volumes, r.chunks, r.leaked, r.findings.count
                ),
                "",
            )?;
        }
        VolumeAction::Delete { name, force } => {
            volume::delete(&shared, &name, force)?;
            println!("deleted {name}");
        }
    }
    Ok(())
}

/// Runs `lightstore nbd` until SIGINT or SIGTERM.
pub fn run_nbd(args: NbdArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = Arc::new(Cluster::connect(args.target.config()?)?);
    if let Some(name) = &args.export {
        match (volume::open(&*cluster, name)?, args.size) {
            (Some(v), _) => eprintln!("lightstore nbd: export {name}: {} bytes", v.size),
            (None, Some(size)) => {
                let v = volume::create(&*cluster, name, size, chunk_size(args.chunk_size)?)?;
                eprintln!(
                    "lightstore nbd: created volume {name}: {} bytes, {} byte chunks",
                    v.size, v.chunk_size
                );
            }
            (None, None) => {
                return Err(format!("no volume named {name}: give --size to create it").into())
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()?;
    let holder = Holder {
        name: this_process(),
        force: args.force,
    };
    let server = NbdServer::new(cluster.clone(), args.export.clone(), holder);
    // The default export is served from the start: a second adapter for
    // it stops here, with the first one's name, before it touches any
    // socket (binding a Unix socket replaces the file at its path).
    claim_default_export(&server, &*cluster, args.export.as_deref())?;
    let stopper = server.clone();
    let outcome = runtime.block_on(async move {
        let tcp_addr = match (&args.listen, &args.unix) {
            (Some(a), _) => Some(a.clone()),
            (None, None) => Some("127.0.0.1:10809".to_string()),
            (None, Some(_)) => None,
        };
        let tcp = match &tcp_addr {
            Some(a) => Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| format!("cannot listen on {a}: {e}"))?,
            ),
            None => None,
        };
        let unix = match &args.unix {
            Some(p) => {
                let _ = std::fs::remove_file(p);
                Some(
                    tokio::net::UnixListener::bind(p)
                        .map_err(|e| format!("cannot listen on {}: {e}", p.display()))?,
                )
            }
            None => None,
        };
        if let Some(m) = &args.metrics {
            let l = tokio::net::TcpListener::bind(m)
                .await
                .map_err(|e| format!("cannot listen on {m}: {e}"))?;
            tokio::spawn(server.clone().serve_metrics(l));
        }
        let mut serving = Vec::new();
        if let Some(a) = &tcp_addr {
            serving.push(format!("nbd://{a}"));
        }
        if let Some(p) = &args.unix {
            serving.push(format!("nbd+unix:///?socket={}", p.display()));
        }
        if let Some(m) = &args.metrics {
            serving.push(format!("metrics on http://{m}/metrics"));
        }
        eprintln!("lightstore nbd ready: {}", serving.join(" and "));
        let stopped = server.run(tcp, unix, stop_signal(), DRAIN).await;
        if let Some(p) = &args.unix {
            let _ = std::fs::remove_file(p);
        }
        stopped.map_err(|e| format!("stopping: {e}"))?;
        eprintln!("lightstore nbd stopped: every acknowledged write flushed");
        Ok::<(), Box<dyn std::error::Error>>(())
    });
    match outcome {
        Ok(()) => Ok(()),
        Err(e) => {
            // Failed before serving (a socket that would not bind): let the
            // next adapter in at once. (`run` releases them itself after a
            // clean drain.)
            if !stopper.has_served() {
                stopper.release_leases();
            }
            Err(e)
        }
    }
}

/// Takes the default export's lease. One held by an adapter of this
/// machine that has ended (killed, crashed: a restart) is waited for until
/// it expires (at most 15 s, saying so) instead of refused.
fn claim_default_export(
    server: &Arc<NbdServer>,
    store: &dyn Store,
    name: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    claim_or_wait(
        "lightstore nbd: waiting for the lease of an adapter of this machine that has ended to expire",
        || server.claim_default_export(),
        |e| match e {
            nbd::NbdError::Held(why) => Some(why.clone()),
            _ => None,
        },
        || {
            let Some(vol) = name.map(|n| volume::open(store, n)).transpose()?.flatten() else {
                return Ok(false);
            };
            // Gone since the attempt (expired, released): try again.
            Ok(client::lease::live_holding(store, &volume::lease_key(vol.id))?
                .is_none_or(|h| ended_here(&h.holder)))
        },
    )
}

/// Completes on SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
