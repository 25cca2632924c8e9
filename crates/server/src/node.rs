//! Node lifecycle: open the device (taking its lock) and the engine, start
//! the executor pool and the one-thread network runtime, listen on TCP (and
//! optionally a Unix socket), stop on SIGINT/SIGTERM/SHUTDOWN, drain
//! connections, and close the engine cleanly.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::flash::{FileDevice, FlashError, DEFAULT_PAGE_SIZE};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};

use crate::budget::RequestBudget;
use crate::config::Config;
use crate::error::ServerError;
use crate::exec::Pools;
use crate::state::NodeState;

/// How long in-flight requests get to finish after a stop is requested.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens the engine on the configured device.
fn open_engine(config: &Config) -> Result<engine::Db, ServerError> {
    let dir = config.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(|source| ServerError::DataDir {
        dir: dir.clone(),
        source,
    })?;
    let capacity = capacity_for_new_device(config);
    let device = FileDevice::open(&config.device_path(), Some(capacity), DEFAULT_PAGE_SIZE)
        .map_err(|e| match e {
            FlashError::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                ServerError::Locked { dir: dir.clone() }
            }
            FlashError::Io(source) => ServerError::DataDir {
                dir: dir.clone(),
                source,
            },
            other => ServerError::Engine(other.into()),
        })?;
    device.set_punch_holes(!config.keep_file_blocks);
    if config.preallocate {
        let started = std::time::Instant::now();
        let filled = device
            .preallocate()
            .map_err(|source| ServerError::Preallocate {
                path: config.device_path(),
                source,
            })?;
        if filled > 0 {
            eprintln!(
                "lightstore node: preallocated the device file {}: {} MiB filled in {:.1} s",
                config.device_path().display(),
                filled >> 20,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let mut opts = engine::Options {
        durability: config.durability()?,
        // The cluster's deletes (VDEL) may use the delete reserve of a
        // full device, as plain DELs do.
        tombstone_tag: Some(protocol::versioned::KIND_TOMBSTONE),
        ..engine::Options::default()
    };
    if let Some(cache) = config.cache_size {
        opts.cache_bytes = usize::try_from(cache.0).unwrap_or(usize::MAX);
        opts.dram_budget = opts
            .dram_budget
            .max(opts.cache_bytes.saturating_add(256 << 20));
    }
    Ok(engine::Db::open(device, opts)?)
}

/// The capacity to create a new device file with: `--capacity`, clamped
/// (with a warning) to what the data directory's file system can hold, so
/// the node meets a full device (deletes and GC make room) rather than a
/// full file system under a sparse file. An existing device file keeps its
/// size: to run a sparse device larger than its file system (one that will
/// grow), create the file first (`truncate -s SIZE …/lightstore.dev`).
fn capacity_for_new_device(config: &Config) -> u64 {
    let requested = config.capacity.0;
    match FileDevice::fitting_capacity(&config.device_path(), requested) {
        Some((fits, free)) if fits < requested => {
            let msg = format!(
                "the device file {} is created with {} MiB instead of --capacity {} MiB: its \
                 file system has {} MiB free, and a sparse device larger than its file system \
                 would wedge when the file system fills (to overcommit on purpose, create the \
                 file first with truncate -s)",
                config.device_path().display(),
                fits >> 20,
                requested >> 20,
                free >> 20
            );
            tracing::warn!("{msg}");
            eprintln!("WARNING: {msg}");
            fits
        }
        _ => requested,
    }
}

/// Runs a node until it is told to stop; returns after the engine is closed.
pub fn run(config: Config) -> Result<(), ServerError> {
    config.validate()?;
    let db = open_engine(&config)?;
    let limits = config.limits_for(db.max_value_size())?;
    let request_budget = RequestBudget::new(config.max_request_memory_for(&limits)?);
    let exec = Arc::new(
        Pools::start(config.read_threads(), config.write_threads())
            .map_err(ServerError::Runtime)?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ls-net")
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let tcp = runtime.block_on(async {
        TcpListener::bind(&config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: config.listen.clone(),
                source,
            })
    })?;
    let addr = tcp.local_addr().map_err(ServerError::Runtime)?;
    let unix = match &config.unix_socket {
        Some(path) => {
            if std::fs::symlink_metadata(path).is_ok() {
                let _ = std::fs::remove_file(path);
            }
            let _guard = runtime.enter();
            Some(
                UnixListener::bind(path).map_err(|source| ServerError::Bind {
                    addr: path.display().to_string(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let metrics = match &config.metrics_listen {
        Some(m) => Some(runtime.block_on(async {
            TcpListener::bind(m)
                .await
                .map_err(|source| ServerError::Bind {
                    addr: m.clone(),
                    source,
                })
        })?),
        None => None,
    };
    let metrics_addr = match &metrics {
        Some(l) => Some(l.local_addr().map_err(ServerError::Runtime)?),
        None => None,
    };
    if !addr.ip().is_loopback() && config.requirepass.is_none() {
        let msg = if config.protected_mode {
            format!(
                "listening on {addr} in protected mode: no password is set, so only loopback \
                 and Unix-socket clients are served and others are refused (set --requirepass, \
                 or --protected-mode no on a trusted network)"
            )
        } else {
            format!(
                "listening on non-loopback address {addr} WITHOUT a password and with protected \
                 mode off: anyone who can reach this port can read and overwrite all data"
            )
        };
        tracing::warn!("{msg}");
        eprintln!("WARNING: {msg}");
    }
    let run = crate::run::begin(&db, config.durability()?).map_err(ServerError::Engine)?;
    let mut state = NodeState::new(db, config.clone(), limits, request_budget, addr.port());
    state.run = run;
    // Before anyone is served or anything delivered: from here on the
    // counts follow every hint written or deleted.
    let counting = Instant::now();
    let pending = crate::hints::count_stored(&state.db).map_err(ServerError::Engine)?;
    let kept: u64 = pending.values().sum();
    if kept > 0 {
        tracing::info!(
            hints = kept,
            seconds = counting.elapsed().as_secs_f64(),
            "hints kept for other nodes"
        );
    }
    state.hints = crate::hints::HintState::with_pending(pending);
    state.net_reads = {
        let _guard = runtime.enter();
        crate::netread::NetReads::start()
    };
    let state = Arc::new(state);
    let handoff = crate::handoff::start(state.clone()).map_err(ServerError::Runtime)?;
    let recluster = crate::recluster::start(state.clone()).map_err(ServerError::Runtime)?;
    let unix_note = config
        .unix_socket
        .as_ref()
        .map(|p| format!(" and {}", p.display()))
        .unwrap_or_default();
    let metrics_note = metrics_addr
        .map(|m| format!(", metrics on http://{m}/metrics"))
        .unwrap_or_default();
    eprintln!(
        "lightstore node ready: listening on {addr}{unix_note} (data {}){metrics_note}",
        config.data_dir.display()
    );
    if let Some(l) = metrics {
        runtime.spawn(crate::metrics_http::serve(l, state.clone()));
    }
    runtime.block_on(serve(state.clone(), exec.clone(), tcp, unix, addr));
    state.request_shutdown();
    state.hints.wake();
    if handoff.join().is_err() {
        tracing::warn!("the hinted handoff thread panicked");
    }
    if let Some(r) = &state.recluster {
        r.wake();
    }
    if recluster.join().is_err() {
        tracing::warn!("the recluster thread panicked");
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    exec.shutdown();
    if let Some(path) = &config.unix_socket {
        let _ = std::fs::remove_file(path);
    }
    // No write arrives any more: every acknowledged one is synced and the
    // run vouched for, so clients trust what it acknowledged. (If that
    // fails, closing below reports the engine's error.)
    if let Err(e) = crate::run::end(&state.db, state.run) {
        tracing::warn!(error = %e, "cannot sync at stop");
    }
    match Arc::try_unwrap(state) {
        Ok(state) => state.db.close()?,
        Err(state) => {
            tracing::warn!("connections still hold the engine; syncing instead of closing");
            state.db.sync()?;
        }
    }
    tracing::info!("node stopped");
    Ok(())
}

/// Accepts connections until a stop is requested, then drains them.
async fn serve(
    state: Arc<NodeState>,
    exec: Arc<Pools>,
    tcp: TcpListener,
    unix: Option<UnixListener>,
    addr: SocketAddr,
) {
    tokio::spawn(watch_signals(state.clone()));
    let mut stop = state.shutdown.subscribe();
    tracing::info!(%addr, "accepting connections");
    loop {
        tokio::select! {
            r = tcp.accept() => match r {
                Ok((s, peer)) => {
                    if state.config.refuses_peer(peer.ip()) {
                        refuse_protected(&state, s);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    admit(&state, &exec, s, None);
                }
                Err(e) => accept_failed(e).await,
            },
            r = accept_unix(unix.as_ref()) => match r {
                Ok(s) => {
                    let pid = s.peer_cred().ok().and_then(|c| c.pid()).and_then(|p| u32::try_from(p).ok());
                    admit(&state, &exec, s, pid)
                }
                Err(e) => accept_failed(e).await,
            },
            _ = stop.changed() => break,
        }
    }
    drop(tcp);
    drop(unix);
    tracing::info!("stopping: draining connections");
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while state.counters.clients.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Accepts from the Unix listener, or never if there is none.
async fn accept_unix(l: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Accept errors (e.g. out of descriptors) are logged and retried after a pause.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!("accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// What a client refused by protected mode reads before the connection closes.
pub const PROTECTED_MODE_ERROR: &str = "-DENIED LightStore is running in protected mode: no \
password is set and this connection does not come from the loopback interface, so it is \
refused. Either set a password (--requirepass, requirepass in the config file, or the \
LIGHTSTORE_REQUIREPASS environment variable) and give it with AUTH, or, on a trusted network \
only, start the node with --protected-mode no. Restart the node after the change.\r\n";

/// Tells a client refused by protected mode why, then closes its connection.
fn refuse_protected(state: &Arc<NodeState>, mut stream: tokio::net::TcpStream) {
    let c = &state.counters;
    c.connections_received.fetch_add(1, Ordering::Relaxed);
    c.rejected_connections.fetch_add(1, Ordering::Relaxed);
    c.rejected_protected.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        let write = stream.write_all(PROTECTED_MODE_ERROR.as_bytes());
        let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
        let _ = stream.shutdown().await;
    });
}

/// Starts serving a new connection, or refuses it when `maxclients` are connected.
fn admit<S>(state: &Arc<NodeState>, exec: &Arc<Pools>, mut stream: S, peer_pid: Option<u32>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let c = &state.counters;
    c.connections_received.fetch_add(1, Ordering::Relaxed);
    if c.clients.load(Ordering::Acquire) >= state.config.maxclients {
        c.rejected_connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let _ = stream
                .write_all(b"-ERR max number of clients reached\r\n")
                .await;
            let _ = stream.shutdown().await;
        });
        return;
    }
    c.clients.fetch_add(1, Ordering::AcqRel);
    let guard = ClientGuard(state.clone());
    let (state, exec) = (state.clone(), exec.clone());
    tokio::spawn(async move {
        let _guard = guard;
        crate::conn::serve(stream, state, exec, peer_pid).await;
    });
}

/// Decrements the client count when a connection task ends (or is dropped).
struct ClientGuard(Arc<NodeState>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.counters.clients.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Requests a stop on SIGINT or SIGTERM.
async fn watch_signals(state: Arc<NodeState>) {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
            state.request_shutdown();
        }
        _ => tracing::warn!("cannot install signal handlers; use SHUTDOWN to stop"),
    }
}
