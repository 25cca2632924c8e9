//! The NBD server: the fixed newstyle handshake, then transmission, on TCP
//! and Unix sockets, every volume of the cluster an export by name.
//!
//! The handshake runs on the async runtime; then each connection gets its
//! own blocking threads, since the cluster client blocks: `THREADS`
//! threads that take turns reading the requests that have arrived and
//! running them as one batch, each writing its batch's replies itself, out
//! of order (see `NbdServer::transmission`).
//!
//! `CAN_MULTI_CONN` is advertised because it holds: every connection to an
//! export in this process shares one [`Blocks`] (so one set of chunk locks)
//! and one cluster client. A write is answered only after every replica
//! that is up acknowledged it, and reads ask every replica that is up, so
//! a read on any connection that starts after a write was answered sees it;
//! FLUSH and FUA call [`client::Store::sync`], which makes every write the
//! nodes acknowledged durable, whichever connection sent it.

use client::shm::Payload;
use std::collections::HashMap;
use std::io::{BufRead, IoSlice, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use client::lease::{Fence, Lease, LeaseError};
use client::Store;
use parking_lot::Mutex;
use socket2::Socket;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::blocks::{Blocks, Patch};
use crate::error::{errno, NbdError, Result};
use crate::proto::{self, cflag, chunk, cmd, opt, rep, tflag, Request, REQUEST_LEN};
use crate::volume::{self, Volume};

/// Requests of one connection run as one batch, at most (see
/// `NbdServer::read_batch`).
pub const MAX_BATCH_REQUESTS: usize = 64;
/// Largest READ or WRITE payload (the protocol's interoperable maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option a client may send (export names and queries are short).
const MAX_OPTION: u32 = 64 << 10;

/// Names of the commands counted in [`Stats`], in order.
pub const COMMAND_NAMES: [&str; 7] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "other",
];

/// Request counters, for `--metrics` and logs.
#[derive(Default)]
pub struct Stats {
    /// Requests by command (see [`COMMAND_NAMES`]).
    pub requests: [AtomicU64; 7],
    /// Microseconds spent serving them, by command (a batch's time shared
    /// among its requests).
    pub micros: [AtomicU64; 7],
    /// By command, the time from when a request's batch began to when its
    /// replies were ready.
    pub latency: [latency::Histogram; 7],
    /// Bytes read and written.
    pub bytes_read: AtomicU64,
    /// See `bytes_read`.
    pub bytes_written: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
}

/// Who serves: the name a refused adapter is shown, and whether to take
/// the default export over from an adapter that holds its lease.
#[derive(Clone, Debug)]
pub struct Holder {
    /// Shown to an adapter refused a volume this one serves.
    pub name: String,
    /// Take the default export's lease whoever holds it (`--force`).
    pub force: bool,
}

/// The server: the cluster, the exports opened so far, the default export.
pub struct NbdServer {
    store: Arc<dyn Store>,
    exports: Mutex<HashMap<String, Arc<Blocks>>>,
    /// The serving lease of every volume being served, by volume id.
    leases: Mutex<HashMap<u64, Held>>,
    holder: Holder,
    default_export: Option<String>,
    /// Counters.
    pub stats: Stats,
    in_flight: Arc<AtomicU64>,
    /// Set to stop reading every connection's requests (shutdown).
    stop: tokio::sync::watch::Sender<bool>,
    /// Connections being served now.
    connections: AtomicU64,
}

/// A volume's lease as this server holds it.
struct Held {
    lease: Lease,
    /// Connections serving the volume now.
    users: usize,
    /// The default export: held until the server stops.
    pinned: bool,
}

/// One connection's use of a volume: when the last one ends, the lease
/// of a volume other than the default export is let go, so another
/// adapter may serve it.
struct VolumeUse {
    server: Arc<NbdServer>,
    id: u64,
}

impl Drop for VolumeUse {
    fn drop(&mut self) {
        self.server.unuse(self.id);
    }
}

/// What the handshake settled.
struct Session {
    /// Keeps the volume's lease while the connection lasts.
    _use: VolumeUse,
    blocks: Arc<Blocks>,
    structured: bool,
    /// `base:allocation` was selected for this export.
    allocation: bool,
}

impl NbdServer {
    /// A server over `store`; `default_export` answers the empty export
    /// name. It serves a volume only while it holds the volume's lease,
    /// taken as `holder` while connections serve the volume (see
    /// `use_volume`).
    pub fn new(
        store: Arc<dyn Store>,
        default_export: Option<String>,
        holder: Holder,
    ) -> Arc<NbdServer> {
        Arc::new(NbdServer {
            store,
            exports: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            holder,
            default_export,
            stats: Stats::default(),
            in_flight: Arc::new(AtomicU64::new(0)),
            stop: tokio::sync::watch::channel(false).0,
            connections: AtomicU64::new(0),
        })
    }

    /// Requests being served now, over all connections.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Makes every acknowledged write durable (at shutdown).
    pub fn flush(&self) -> Result<()> {
        Ok(self.store.sync()?)
    }

    /// Whether any connection was accepted.
    pub fn has_served(&self) -> bool {
        self.stats.connections.load(Ordering::Relaxed) > 0
    }

    /// Lets go of every volume's lease (at shutdown, after the last
    /// request; or when the server could not start), so another adapter
    /// may serve them at once.
    pub fn release_leases(&self) {
        for (_, held) in self.leases.lock().drain() {
            release(held.lease);
        }
    }

    /// A connection serving volume `id` ended: with no other left, the
    /// lease goes (under the lock, so a connection opening the volume
    /// meanwhile takes it anew rather than finding it still ours).
    fn unuse(&self, id: u64) {
        let mut leases = self.leases.lock();
        let Some(h) = leases.get_mut(&id) else {
            return;
        };
        h.users = h.users.saturating_sub(1);
        if h.users == 0 && !h.pinned {
            if let Some(held) = leases.remove(&id) {
                release(held.lease);
            }
        }
    }

    /// The fence of volume `vol`'s lease, taking the lease first if this
    /// server does not hold it yet, with one more connection counted as
    /// serving the volume (under the same lock, so the lease cannot be let
    /// go in between). A lease found lost (taken over, or not renewed in
    /// time) is let go and taken again, or refused like any other.
    /// `--force` applies to the default export only: it names the one
    /// volume known to be abandoned.
    fn use_volume(self: &Arc<Self>, vol: &Volume) -> Result<(Fence, VolumeUse)> {
        let using = || VolumeUse {
            server: self.clone(),
            id: vol.id,
        };
        let mut leases = self.leases.lock();
        if let Some(h) = leases.get_mut(&vol.id) {
            let fence = h.lease.fence();
            if fence.holds() {
                h.users += 1;
                return Ok((fence, using()));
            }
            leases.remove(&vol.id);
        }
        let default = self.default_export.as_deref() == Some(vol.name.as_str());
        let force = self.holder.force && default;
        let lease = Lease::acquire(
            self.store.clone(),
            volume::lease_key(vol.id),
            &self.holder.name,
            &format!("volume {}", vol.name),
            force,
        )
        .map_err(|e| match e {
            LeaseError::Held(h) => NbdError::Held(format!(
                "volume {} is served by another adapter ({h}); stop it there, or start this one with --force if it is dead",
                vol.name
            )),
            LeaseError::Client(c) => c.into(),
            LeaseError::Thread(e) => NbdError::Io(e),
        })?;
        let fence = lease.fence();
        let held = Held {
            lease,
            users: 1,
            pinned: default,
        };
        leases.insert(vol.id, held);
        Ok((fence, using()))
    }

    /// The volume export `name` names (the default export for ""), if
    /// any: what `NBD_OPT_INFO` describes, without serving it.
    fn volume_of(&self, name: &str) -> Result<Option<Volume>> {
        let name = match (name, &self.default_export) {
            ("", Some(d)) => d.as_str(),
            ("", None) => return Ok(None),
            (n, _) => n,
        };
        volume::open(&*self.store, name)
    }

    /// The export `name` (the default export for ""), opened for serving:
    /// this server holds the volume's lease while the returned use lasts
    /// (the default export's, until it stops).
    fn export(self: &Arc<Self>, name: &str) -> Result<Option<(Arc<Blocks>, VolumeUse)>> {
        // The record is read again on every open: a volume deleted and
        // created again, or resized, since it was last served gets a fresh
        // `Blocks` (the old one keeps serving the connections that have it).
        let store = self.store.clone();
        let Some(vol) = self.volume_of(name)? else {
            self.exports.lock().remove(name);
            return Ok(None);
        };
        let (fence, using) = self.use_volume(&vol)?;
        let name = vol.name.clone();
        let mut exports = self.exports.lock();
        if let Some(b) = exports.get(&name) {
            if *b.volume() == vol && b.holds_lease() {
                return Ok(Some((b.clone(), using)));
            }
        }
        let blocks = Arc::new(Blocks::fenced(store, vol, fence));
        exports.insert(name, blocks.clone());
        Ok(Some((blocks, using)))
    }

    /// Takes the lease of the default export (at start: a second adapter
    /// for it stops there, with the first one's name); held until the
    /// server stops.
    pub fn claim_default_export(self: &Arc<Self>) -> Result<()> {
        match &self.default_export {
            Some(name) => self.export(name).map(drop),
            None => Ok(()),
        }
    }

    /// [`Self::volume_of`] on the blocking pool.
    async fn volume_off_runtime(self: &Arc<Self>, name: &str) -> Result<Result<Option<Volume>>> {
        let (this, name) = (self.clone(), name.to_string());
        off_runtime(move || this.volume_of(&name)).await
    }

    /// [`Self::export`] on the blocking pool.
    async fn export_off_runtime(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<Result<Option<(Arc<Blocks>, VolumeUse)>>> {
        let (this, name) = (self.clone(), name.to_string());
        off_runtime(move || this.export(&name)).await
    }

    /// Serves one connection until the client leaves or breaks the protocol.
    pub async fn serve<S: Transport>(self: Arc<Self>, stream: S) {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        self.connections.fetch_add(1, Ordering::AcqRel);
        let this = self.clone();
        this.serve_connection(stream).await;
        self.connections.fetch_sub(1, Ordering::AcqRel);
    }

    /// The handshake on the runtime, then the transmission phase on the
    /// connection's own blocking threads.
    async fn serve_connection<S: Transport>(self: Arc<Self>, stream: S) {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let session = match self.clone().handshake(&mut rd, &mut wr).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "handshake ended");
                return;
            }
        };
        let sock = match rd.unsplit(wr).into_socket() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "could not hand a connection to its threads");
                return;
            }
        };
        // Shutdown stops a connection's leader by shutting the socket's
        // read side: it sees the end of the stream, and what was read is
        // still answered.
        let stopper = match sock.try_clone() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "could not clone a connection's socket");
                return;
            }
        };
        let mut stop = self.stop.subscribe();
        let watcher = tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
            let _ = stopper.shutdown(std::net::Shutdown::Read);
        });
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let spawned = std::thread::Builder::new()
            .name("ls-nbd-conn".into())
            .spawn(move || {
                let outcome = this.transmission(&sock, session);
                let _ = done_tx.send(outcome);
            });
        match spawned {
            Ok(_) => match done_rx.await {
                Ok(Err(e)) => tracing::debug!(error = %e, "connection ended"),
                Ok(Ok(())) => {}
                Err(_) => tracing::error!("a connection's thread ended without a word"),
            },
            Err(e) => tracing::warn!(error = %e, "could not start a connection's thread"),
        }
        watcher.abort();
    }

    /// The option haggling; the session to serve, or `None` when the client
    /// aborted or chose nothing.
    async fn handshake<R, W>(self: Arc<Self>, rd: &mut R, wr: &mut W) -> Result<Option<Session>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&proto::NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        hello
            .extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
        wr.write_all(&hello).await?;
        let client_flags = rd.read_u32().await?;
        if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
            return Err(NbdError::Protocol(format!(
                "unknown client flags {client_flags:#x}"
            )));
        }
        let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
        let mut structured = false;
        // The export and whether base:allocation was selected for it.
        let mut meta: Option<(String, bool)> = None;
        loop {
            if rd.read_u64().await? != proto::IHAVEOPT {
                return Err(NbdError::Protocol("bad option magic".into()));
            }
            let option = rd.read_u32().await?;
            let len = rd.read_u32().await?;
            if len > MAX_OPTION {
                return Err(NbdError::Protocol(format!("option of {len} bytes")));
            }
            let mut data = vec![0u8; len as usize];
            rd.read_exact(&mut data).await?;
            let reply = |kind: u32, d: &[u8]| proto::option_reply(option, kind, d);
            let error = |kind: u32, msg: &str| proto::option_reply(option, kind, msg.as_bytes());
            match option {
                opt::EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).into_owned();
                    let Some((blocks, using)) = self.export_off_runtime(&name).await?? else {
                        return Err(NbdError::Protocol(format!("no export {name:?}")));
                    };
                    let mut b = blocks.volume().size.to_be_bytes().to_vec();
                    b.extend_from_slice(&export_flags().to_be_bytes());
                    if !no_zeroes {
                        b.extend_from_slice(&[0u8; 124]);
                    }
                    wr.write_all(&b).await?;
                    let allocation = allocation_for(&meta, &name);
                    return Ok(Some(Session {
                        _use: using,
                        blocks,
                        structured,
                        allocation,
                    }));
                }
                opt::ABORT => {
                    wr.write_all(&reply(rep::ACK, &[])).await?;
                    return Ok(None);
                }
                opt::LIST => {
                    if !data.is_empty() {
                        wr.write_all(&error(rep::ERR_INVALID, "LIST takes no data"))
                            .await?;
                        continue;
                    }
                    let store = self.store.clone();
                    let vols = match off_runtime(move || volume::list(&*store)).await? {
                        Ok(v) => v,
                        Err(e) => {
                            wr.write_all(&error(
                                rep::ERR_INVALID,
                                &format!("listing volumes: {e}"),
                            ))
                            .await?;
                            continue;
                        }
                    };
                    for v in vols {
                        wr.write_all(&reply(rep::SERVER, &proto::rep_server(&v.name)))
                            .await?;
                    }
                    wr.write_all(&reply(rep::ACK, &[])).await?;
                }
                opt::STARTTLS => {
                    wr.write_all(&error(
                        rep::ERR_POLICY,
                        "TLS is not offered; use a trusted network or a Unix socket",
                    ))
                    .await?;
                }
                opt::INFO | opt::GO => {
                    let Some(req) = proto::parse_info(&data) else {
                        wr.write_all(&error(rep::ERR_INVALID, "malformed INFO/GO request"))
                            .await?;
                        continue;
                    };
                    // INFO describes the volume; only GO serves it (and
                    // takes its lease: `nbdinfo --list` claims nothing).
                    let opened = if option == opt::GO {
                        self.export_off_runtime(&req.name)
                            .await?
                            .map(|b| b.map(|(b, using)| (b.volume().clone(), Some((b, using)))))
                    } else {
                        self.volume_off_runtime(&req.name)
                            .await?
                            .map(|v| v.map(|v| (v, None)))
                    };
                    let (vol, blocks) = match opened {
                        Ok(Some(opened)) => opened,
                        Ok(None) => {
                            wr.write_all(&error(
                                rep::ERR_UNKNOWN,
                                &format!("no volume {:?}", req.name),
                            ))
                            .await?;
                            continue;
                        }
                        Err(e) => {
                            let code = match e {
                                NbdError::Held(_) => rep::ERR_POLICY,
                                _ => rep::ERR_INVALID,
                            };
                            wr.write_all(&error(code, &e.to_string())).await?;
                            continue;
                        }
                    };
                    let infos = [
                        proto::info_export(vol.size, export_flags()),
                        proto::info_block_size(1, vol.chunk_size, MAX_PAYLOAD),
                    ];
                    for i in infos {
                        wr.write_all(&reply(rep::INFO, &i)).await?;
                    }
                    if req.requests.contains(&proto::info::NAME) {
                        wr.write_all(&reply(rep::INFO, &proto::info_name(&vol.name)))
                            .await?;
                    }
                    wr.write_all(&reply(rep::ACK, &[])).await?;
                    if let Some((blocks, using)) = blocks {
                        let allocation = allocation_for(&meta, &req.name);
                        return Ok(Some(Session {
                            _use: using,
                            blocks,
                            structured,
                            allocation,
                        }));
                    }
                }
                opt::STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        wr.write_all(&error(rep::ERR_INVALID, "STRUCTURED_REPLY takes no data"))
                            .await?;
                        continue;
                    }
                    structured = true;
                    wr.write_all(&reply(rep::ACK, &[])).await?;
                }
                opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                    let set = option == opt::SET_META_CONTEXT;
                    if set && !structured {
                        meta = None;
                        wr.write_all(&error(
                            rep::ERR_INVALID,
                            "negotiate structured replies first",
                        ))
                        .await?;
                        continue;
                    }
                    let Some(req) = proto::parse_meta(&data) else {
                        if set {
                            meta = None;
                        }
                        wr.write_all(&error(rep::ERR_INVALID, "malformed meta context request"))
                            .await?;
                        continue;
                    };
                    let wanted = req.queries.iter().any(|q| q == proto::BASE_ALLOCATION)
                        || (!set
                            && (req.queries.is_empty()
                                || req.queries.iter().any(|q| q == "base:")));
                    if wanted {
                        let id = if set { proto::BASE_ALLOCATION_ID } else { 0 };
                        wr.write_all(&reply(
                            rep::META_CONTEXT,
                            &proto::rep_meta_context(id, proto::BASE_ALLOCATION),
                        ))
                        .await?;
                    }
                    if set {
                        meta = Some((req.name, wanted));
                    }
                    wr.write_all(&reply(rep::ACK, &[])).await?;
                }
                _ => {
                    wr.write_all(&error(rep::ERR_UNSUP, "unknown option"))
                        .await?;
                }
            }
        }
    }

    /// Serves requests until DISC, a broken stream or a protocol violation,
    /// on [`THREADS`] blocking threads (the cluster client blocks) that take
    /// turns as leader and follower: the leader reads the requests that have
    /// arrived (see [`Self::read_batch`]), hands the socket's read side to
    /// the next thread, runs them as one batch ([`Self::execute_batch`]) and
    /// writes their replies itself, out of order, then waits for its next
    /// turn. A request so reaches the thread that runs it without a hand-off
    /// (a reader thread queueing requests for batchers cost a wake-up on
    /// every request's path, which on a virtual machine's idle CPU takes as
    /// long as a device read); the next leader's wake-up happens while this
    /// batch runs. While every thread runs a batch, nothing is read: requests
    /// wait in the socket, the client is held back, and the next leader
    /// takes all of them.
    fn transmission(self: &Arc<Self>, sock: &Socket, session: Session) -> Result<()> {
        // A client that reads no reply for this long is disconnected, so
        // that it cannot hold the threads (and its requests' memory).
        sock.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let out = Replies {
            sock: Mutex::new(sock.try_clone()?),
            broken: std::sync::atomic::AtomicBool::new(false),
        };
        let intake = Mutex::new(Intake {
            rd: std::io::BufReader::with_capacity(READ_BUFFER, sock),
            after_large_write: false,
            ended: None,
        });
        std::thread::scope(|scope| {
            let (s, out, intake) = (&session, &out, &intake);
            for _ in 1..THREADS {
                let spawned = std::thread::Builder::new()
                    .name("ls-nbd-conn".into())
                    .spawn_scoped(scope, move || self.take_turns(s, intake, out));
                // The threads that started serve the connection (one is
                // enough, only slower).
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "could not start a connection thread");
                }
            }
            self.take_turns(s, intake, out);
        });
        // Every thread has returned, so the stream has ended.
        let _ = out.sock.lock().shutdown(std::net::Shutdown::Both);
        intake.into_inner().ended.unwrap_or(Ok(()))
    }

    /// One of a connection's threads: leads (reads a batch, then runs it)
    /// whenever its turn comes, until the stream has ended. A batch read
    /// before the end is run and answered all the same.
    fn take_turns(&self, s: &Session, intake: &Mutex<Intake<'_>>, out: &Replies) {
        loop {
            let batch = {
                let mut intake = intake.lock();
                if intake.ended.is_some() {
                    return;
                }
                let intake = &mut *intake;
                let (batch, end) =
                    self.read_batch(&mut intake.rd, &mut intake.after_large_write, out);
                intake.ended = end;
                batch
            };
            if batch.is_empty() {
                continue;
            }
            if out.broken.load(Ordering::Acquire) {
                continue; // nobody to answer: drop the requests
            }
            // A panic must not leave requests without replies: answer the
            // batch with EIO then.
            let replies = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.execute_batch(s, &batch)
            }))
            .unwrap_or_else(|_| {
                tracing::error!("a request batch panicked; answering EIO");
                batch
                    .iter()
                    .map(|j| whole(proto::simple_reply(errno::EIO, j.0.handle)))
                    .collect()
            });
            out.send(&replies);
        }
    }

    /// Reads the next batch: the first request (waiting for it), then those
    /// already received behind it, while the batch holds fewer than
    /// [`MAX_BATCH_REQUESTS`] requests and about [`MAX_BATCH_BYTES`], and
    /// fewer READs than its share ([`read_share`]). Under load a batch so
    /// holds many small requests, so many reads become one multi-get and
    /// many writes one cluster write (the cluster round trips per request
    /// drop with the depth), while large requests keep the threads working
    /// in parallel. With the batch, the stream's outcome if it ended (DISC,
    /// end of stream, shutdown, a broken reply stream, a protocol
    /// violation).
    fn read_batch(
        &self,
        rd: &mut std::io::BufReader<&Socket>,
        after_large_write: &mut bool,
        out: &Replies,
    ) -> (Vec<Job>, Option<Result<()>>) {
        let mut batch: Vec<Job> = Vec::new();
        let mut bytes = 0usize;
        let mut reads = 0usize;
        let mut share = usize::MAX;
        let end = loop {
            let mut header = [0u8; REQUEST_LEN];
            let got = if *after_large_write && rd.buffer().is_empty() {
                let mut sock: &Socket = rd.get_ref();
                sock.read_exact(&mut header)
            } else {
                rd.read_exact(&mut header)
            };
            match got {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Some(Ok(())),
                Err(e) => break Some(Err(e.into())),
            }
            let Some(req) = Request::parse(&header) else {
                break Some(Err(NbdError::Protocol("bad request magic".into())));
            };
            if req.kind == cmd::DISC {
                break Some(Ok(()));
            }
            if req.kind == cmd::WRITE && req.length > MAX_PAYLOAD {
                let e = NbdError::Protocol(format!("WRITE of {} bytes", req.length));
                break Some(Err(e));
            }
            *after_large_write = req.kind == cmd::WRITE && req.length >= LARGE_WRITE;
            let payload = if req.kind == cmd::WRITE {
                match read_payload(rd, req.length as usize) {
                    Ok(p) => p,
                    Err(e) => break Some(Err(e.into())),
                }
            } else {
                Payload::empty()
            };
            if out.broken.load(Ordering::Acquire) {
                break Some(Ok(()));
            }
            if batch.is_empty() {
                // This request and those whose headers are already here
                // (WRITE payloads make it an overestimate).
                share = read_share(1 + rd.buffer().len() / REQUEST_LEN);
            }
            reads += usize::from(req.kind == cmd::READ);
            let job = (req, payload, InFlight::new(&self.in_flight));
            bytes += job_bytes(&job);
            batch.push(job);
            let more_read = rd.buffer().len() >= REQUEST_LEN;
            if !more_read
                || batch.len() >= MAX_BATCH_REQUESTS
                || bytes >= MAX_BATCH_BYTES
                || reads >= share
            {
                break None;
            }
        };
        (batch, end)
    }

    /// Runs a batch: writes and zeroings together (one [`Blocks::apply_many`]),
    /// then one sync if any of them had FUA or a FLUSH is in the batch, then
    /// the reads together (one [`Blocks::read_many`]), then the rest one by
    /// one. Requests in flight together have no order among them (NBD), so
    /// this order is free to choose; it lets a FLUSH cover the batch's
    /// writes. Returns the encoded replies.
    fn execute_batch(&self, s: &Session, batch: &[Job]) -> Vec<Reply> {
        let began = std::time::Instant::now();
        let mut replies: Vec<Option<Reply>> = vec![None; batch.len()];
        let mut ops: Vec<Option<Op<'_>>> = Vec::with_capacity(batch.len());
        for (i, (req, payload, _)) in batch.iter().enumerate() {
            self.stats.requests[stat_index(req.kind)].fetch_add(1, Ordering::Relaxed);
            match self.validate(s, req, payload) {
                Ok(op) => ops.push(Some(op)),
                Err(e) => {
                    replies[i] = Some(whole(self.error_reply(s, req, e)));
                    ops.push(None);
                }
            }
        }
        let fail_all = |replies: &mut Vec<Option<Reply>>, idx: &[usize], e: &NbdError| {
            for &i in idx {
                let r = self.error_reply(s, &batch[i].0, (e.errno(), e.to_string()));
                replies[i] = Some(whole(r));
            }
        };
        // Writes and zeroings.
        let mut patches = Vec::new();
        let mut patch_idx = Vec::new();
        let mut want_sync = false;
        for (i, op) in ops.iter().enumerate() {
            match op {
                Some(Op::Patch(p, fua)) => {
                    patches.push(*p);
                    patch_idx.push(i);
                    want_sync |= *fua;
                }
                Some(Op::Flush) => want_sync = true,
                _ => {}
            }
        }
        let mut patched = true;
        if !patches.is_empty() {
            if let Err(e) = s.blocks.apply_many(&patches) {
                fail_all(&mut replies, &patch_idx, &e);
                patched = false;
            } else {
                let written: u64 = patches
                    .iter()
                    .filter(|p| p.data.is_some())
                    .map(|p| p.len as u64)
                    .sum();
                self.stats
                    .bytes_written
                    .fetch_add(written, Ordering::Relaxed);
            }
        }
        let synced = if want_sync { s.blocks.flush() } else { Ok(()) };
        for (i, op) in ops.iter().enumerate() {
            let done = match op {
                Some(Op::Patch(_, fua)) if patched => {
                    Some(if *fua { synced.as_ref().err() } else { None })
                }
                Some(Op::Flush) => Some(synced.as_ref().err()),
                _ => None,
            };
            match done {
                Some(None) => replies[i] = Some(whole(proto::simple_reply(0, batch[i].0.handle))),
                Some(Some(e)) => {
                    let r = self.error_reply(s, &batch[i].0, (e.errno(), e.to_string()));
                    replies[i] = Some(whole(r));
                }
                None => {}
            }
        }
        // Reads.
        let read_idx: Vec<usize> = (0..ops.len())
            .filter(|&i| matches!(ops[i], Some(Op::Read(..))))
            .collect();
        if !read_idx.is_empty() {
            let ranges: Vec<(u64, usize)> = read_idx
                .iter()
                .filter_map(|&i| match ops[i] {
                    Some(Op::Read(o, l)) => Some((o, l)),
                    _ => None,
                })
                .collect();
            match s.blocks.read_many_parts(&ranges) {
                Ok(parts) => {
                    for ((&i, &(_, len)), data) in read_idx.iter().zip(&ranges).zip(parts) {
                        self.stats
                            .bytes_read
                            .fetch_add(batch[i].0.length.into(), Ordering::Relaxed);
                        replies[i] = Some(read_reply(s, &batch[i].0, len, data));
                    }
                }
                Err(e) => fail_all(&mut replies, &read_idx, &e),
            }
        }
        // The rest.
        for (i, op) in ops.iter().enumerate() {
            let r = match op {
                Some(Op::Cache) => Ok(proto::simple_reply(0, batch[i].0.handle)),
                Some(Op::BigZero(o, l, fua, keep)) => s
                    .blocks
                    .zero(*o, *l, *fua, *keep)
                    .map(|()| proto::simple_reply(0, batch[i].0.handle))
                    .map_err(|e| (e.errno(), e.to_string())),
                Some(Op::Status(o, l, one)) => self.block_status(s, &batch[i].0, *o, *l, *one),
                _ => continue,
            };
            replies[i] = Some(whole(
                r.unwrap_or_else(|e| self.error_reply(s, &batch[i].0, e)),
            ));
        }
        let took = latency::micros(began.elapsed());
        let per = took / batch.len().max(1) as u64;
        for (req, _, _) in batch {
            let i = stat_index(req.kind);
            self.stats.micros[i].fetch_add(per, Ordering::Relaxed);
            self.stats.latency[i].record_us(took);
        }
        replies
            .into_iter()
            .zip(batch)
            .map(|(r, (req, _, _))| {
                r.unwrap_or_else(|| whole(proto::simple_reply(errno::EIO, req.handle)))
            })
            .collect()
    }

    /// An error reply in the session's reply style.
    fn error_reply(&self, s: &Session, req: &Request, (code, msg): (u32, String)) -> Vec<u8> {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(kind = req.kind, error = code, %msg, "request failed");
        if s.structured {
            proto::error_chunk(req.handle, code, &msg)
        } else {
            proto::simple_reply(code, req.handle)
        }
    }

    /// Checks a request against the export and the protocol; what to do.
    fn validate<'a>(
        &self,
        s: &Session,
        req: &Request,
        payload: &'a [u8],
    ) -> std::result::Result<Op<'a>, (u32, String)> {
        let size = s.blocks.volume().size;
        let in_bounds = req
            .offset
            .checked_add(u64::from(req.length))
            .is_some_and(|e| e <= size);
        let fua = req.flags & cflag::FUA != 0;
        let known_flags = cflag::FUA | cflag::NO_HOLE | cflag::REQ_ONE | cflag::FAST_ZERO;
        if req.flags & !known_flags != 0 {
            return Err((
                errno::EINVAL,
                format!("unknown command flags {:#x}", req.flags),
            ));
        }
        let len = req.length as usize;
        match req.kind {
            cmd::READ if req.length > MAX_PAYLOAD => Err((
                errno::EINVAL,
                format!("READ of {} bytes: at most {MAX_PAYLOAD}", req.length),
            )),
            cmd::READ if !in_bounds => {
                Err((errno::EINVAL, "READ past the end of the export".into()))
            }
            cmd::READ => Ok(Op::Read(req.offset, len)),
            cmd::WRITE if !in_bounds => {
                Err((errno::ENOSPC, "WRITE past the end of the export".into()))
            }
            cmd::WRITE => Ok(Op::Patch(
                Patch {
                    offset: req.offset,
                    len: payload.len(),
                    data: Some(payload),
                    keep: false,
                },
                fua,
            )),
            cmd::FLUSH => Ok(Op::Flush),
            cmd::TRIM if !in_bounds => {
                Err((errno::EINVAL, "TRIM past the end of the export".into()))
            }
            cmd::WRITE_ZEROES if !in_bounds => Err((
                errno::ENOSPC,
                "WRITE_ZEROES past the end of the export".into(),
            )),
            // Zeroing is never slower than writing zeros here (whole chunks
            // are deleted), so FAST_ZERO is honoured as is.
            // Long zeroings run alone, in windows (Blocks::zero).
            cmd::TRIM | cmd::WRITE_ZEROES if len > MAX_BATCH_BYTES => Ok(Op::BigZero(
                req.offset,
                len,
                fua,
                req.flags & cflag::NO_HOLE != 0,
            )),
            cmd::TRIM | cmd::WRITE_ZEROES => Ok(Op::Patch(
                Patch {
                    offset: req.offset,
                    len,
                    data: None,
                    keep: req.kind == cmd::WRITE_ZEROES && req.flags & cflag::NO_HOLE != 0,
                },
                fua,
            )),
            cmd::CACHE if !in_bounds => {
                Err((errno::EINVAL, "CACHE past the end of the export".into()))
            }
            cmd::CACHE => Ok(Op::Cache),
            cmd::BLOCK_STATUS if !s.structured || !s.allocation => Err((
                errno::EINVAL,
                "BLOCK_STATUS needs base:allocation selected".into(),
            )),
            cmd::BLOCK_STATUS if !in_bounds || req.length == 0 => Err((
                errno::EINVAL,
                "BLOCK_STATUS past the end of the export".into(),
            )),
            cmd::BLOCK_STATUS => Ok(Op::Status(
                req.offset,
                u64::from(req.length),
                req.flags & cflag::REQ_ONE != 0,
            )),
            other => Err((errno::EINVAL, format!("unknown command {other}"))),
        }
    }

    /// A BLOCK_STATUS reply for `base:allocation`.
    fn block_status(
        &self,
        s: &Session,
        req: &Request,
        offset: u64,
        len: u64,
        req_one: bool,
    ) -> std::result::Result<Vec<u8>, (u32, String)> {
        let mut extents = s
            .blocks
            .status(offset, len)
            .map_err(|e| (e.errno(), e.to_string()))?;
        if req_one {
            extents.truncate(1);
        }
        let mut body = proto::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        for e in &extents {
            let flags = if e.hole {
                proto::STATE_HOLE | proto::STATE_ZERO
            } else {
                0
            };
            body.extend_from_slice(&(e.len as u32).to_be_bytes());
            body.extend_from_slice(&flags.to_be_bytes());
        }
        let mut r = proto::chunk_header(
            chunk::FLAG_DONE,
            chunk::BLOCK_STATUS,
            req.handle,
            body.len() as u32,
        );
        r.extend_from_slice(&body);
        Ok(r)
    }
}

/// A request read and not yet answered: header, WRITE payload and its
/// count in the server's requests in flight (released once its reply is
/// written).
type Job = (Request, Payload, InFlight);

/// A connection's read side, taken by one thread at a time (the leader).
struct Intake<'s> {
    rd: std::io::BufReader<&'s Socket>,
    /// Whether the last request read was a WRITE of at least
    /// [`LARGE_WRITE`] bytes: the next header is then read on its own, so
    /// that the next payload goes from the socket straight into its
    /// [`Payload`] rather than through the reader's buffer (a buffered read
    /// took up to [`READ_BUFFER`] of it, copied once more).
    after_large_write: bool,
    /// How the stream ended, once it has: no request is read after that.
    ended: Option<Result<()>>,
}

/// The bytes a request moves: its payload, or what it reads.
fn job_bytes((req, payload, _): &Job) -> usize {
    payload.len().max(req.length as usize)
}

/// Where a connection's threads write their replies.
struct Replies {
    sock: Mutex<Socket>,
    /// Set when a write failed: the connection is done.
    broken: std::sync::atomic::AtomicBool,
}

impl Replies {
    /// Writes `replies` in one go (one system call while the socket takes
    /// them). A failed or timed-out write breaks the connection: both
    /// directions are shut, so the leader's read ends too.
    fn send(&self, replies: &[Reply]) {
        let mut slices: Vec<IoSlice<'_>> = replies
            .iter()
            .flatten()
            .map(|part| IoSlice::new(part))
            .collect();
        let mut bufs = &mut slices[..];
        let sock = self.sock.lock();
        while !bufs.is_empty() && !self.broken.load(Ordering::Acquire) {
            // The kernel takes at most IOV_MAX pieces per call.
            let n = bufs.len().min(MAX_IOV);
            match sock.send_vectored(&bufs[..n]) {
                Ok(0) => self.break_off(&sock, "the client stopped taking replies".into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => self.break_off(&sock, e.to_string()),
            }
        }
    }

    fn break_off(&self, sock: &Socket, why: String) {
        tracing::debug!(error = %why, "writing replies failed; closing the connection");
        self.broken.store(true, Ordering::Release);
        let _ = sock.shutdown(std::net::Shutdown::Both);
    }
}

/// One request counted in [`NbdServer::in_flight`] until dropped.
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    fn new(counter: &Arc<AtomicU64>) -> InFlight {
        counter.fetch_add(1, Ordering::AcqRel);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A batch stops gathering requests once it holds this many bytes (read
/// or written).
const MAX_BATCH_BYTES: usize = 1 << 20;
/// READs of at least this many bytes are answered from the values as they
/// are (see [`read_reply`]).
const BORROW_READ: usize = 64 << 10;
/// Pieces one vectored write takes at most (Linux's IOV_MAX).
const MAX_IOV: usize = 1024;
/// Threads per connection (see [`NbdServer::transmission`]).
const THREADS: usize = 4;
/// READs a batch takes at least, when that many are waiting (see
/// [`read_share`]).
const MIN_READ_SHARE: usize = 4;

/// How many READs a leader takes into its batch when `waiting` requests
/// have arrived: an equal share for every thread of the connection, and at
/// least [`MIN_READ_SHARE`]. Reads wait on the device, so a multi-get is as
/// slow as its slowest read and holds its thread meanwhile: one leader
/// taking all sixteen reads of a queue-depth-16 client kept about one
/// multi-get (five reads) on the node at a time while the others' threads
/// idled, and the device saw half the queue depth qemu-nbd gives it. Split
/// into shares, the reads reach the node as several multi-gets at once on
/// the threads' own connections. The floor keeps batches worth a round
/// trip; writes have no share (one cluster write is one log append, and
/// batching them is what makes them cheap).
fn read_share(waiting: usize) -> usize {
    MIN_READ_SHARE.max(waiting.div_ceil(THREADS))
}
/// Bytes the leader takes from the socket per read call, at most (many
/// small requests arrive in one).
const READ_BUFFER: usize = 256 << 10;
/// WRITEs at least this long are followed by an unbuffered header read
/// (see `Intake::after_large_write`).
const LARGE_WRITE: u32 = 64 << 10;
/// A client that takes no reply bytes for this long is disconnected.
const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A stream whose transmission phase the connection's blocking threads
/// serve: the runtime's TCP and Unix sockets.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The socket, out of the runtime, in blocking mode.
    fn into_socket(self) -> std::io::Result<Socket>;
}

impl Transport for tokio::net::TcpStream {
    fn into_socket(self) -> std::io::Result<Socket> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s.into())
    }
}

impl Transport for tokio::net::UnixStream {
    fn into_socket(self) -> std::io::Result<Socket> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s.into())
    }
}

/// What a valid request does.
enum Op<'a> {
    Read(u64, usize),
    /// A write or zeroing, and its FUA flag.
    Patch(Patch<'a>, bool),
    Flush,
    Cache,
    /// A zeroing too long for a batch: offset, length, FUA, NO_HOLE.
    BigZero(u64, usize, bool, bool),
    /// Offset, length, REQ_ONE.
    Status(u64, u64, bool),
}

/// The counter slot of a command (see [`COMMAND_NAMES`]).
fn stat_index(kind: u16) -> usize {
    match kind {
        cmd::READ => 0,
        cmd::WRITE => 1,
        cmd::FLUSH => 2,
        cmd::TRIM => 3,
        cmd::WRITE_ZEROES => 4,
        cmd::BLOCK_STATUS => 5,
        _ => 6,
    }
}

/// Reads a WRITE's `len` payload bytes: what the leader has buffered,
/// then straight from the socket into the payload's spare room, which is
/// never zeroed first (`read_to_end` through a `BufReader` zeroed each
/// payload before the kernel overwrote it: 3 % of a sequential write's
/// CPU). The payload lies in the process's shared memory when it has room,
/// so its chunks reach nodes on this machine by reference
/// ([`client::shm`]).
fn read_payload(rd: &mut std::io::BufReader<&Socket>, len: usize) -> std::io::Result<Payload> {
    let mut p = Payload::with_capacity(len);
    let buffered = rd.buffer().len().min(len);
    p.extend_from_slice(&rd.buffer()[..buffered]);
    rd.consume(buffered);
    while p.len() < len {
        let want = len - p.len();
        let got = p.append_with(want, |spare| match rd.get_ref().recv(spare) {
            // `recv` returns how many bytes it wrote, at most `want`.
            Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => Ok(n.min(want)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        });
        got?;
    }
    Ok(p)
}

/// A successful READ reply of `len` bytes, whose data is `data` (pieces in
/// order), in the session's style. A large read goes out as its header and
/// the pieces as they are (no copy); a small one is joined into one buffer,
/// which costs less than a vectored write of a few small pieces.
fn read_reply(s: &Session, req: &Request, len: usize, data: Vec<Bytes>) -> Reply {
    let mut head = if !s.structured {
        proto::simple_reply(0, req.handle)
    } else if len == 0 {
        return whole(proto::chunk_header(
            chunk::FLAG_DONE,
            chunk::NONE,
            req.handle,
            0,
        ));
    } else {
        let mut r = proto::chunk_header(
            chunk::FLAG_DONE,
            chunk::OFFSET_DATA,
            req.handle,
            8 + len as u32,
        );
        r.extend_from_slice(&req.offset.to_be_bytes());
        r
    };
    if len < BORROW_READ {
        head.reserve_exact(len);
        for part in &data {
            head.extend_from_slice(part);
        }
        return whole(head);
    }
    let mut parts = Vec::with_capacity(1 + data.len());
    parts.push(Bytes::from(head));
    parts.extend(data);
    parts
}

/// One encoded reply, in pieces written back to back (see [`read_reply`]).
type Reply = Vec<Bytes>;

/// A reply held in one buffer.
fn whole(bytes: Vec<u8>) -> Reply {
    vec![Bytes::from(bytes)]
}

/// Runs a call that may block (the cluster client) on tokio's blocking
/// pool, keeping the runtime's threads free for the sockets.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NbdError::Protocol(format!("a blocking task failed: {e}")))
}

/// The transmission flags of every export.
fn export_flags() -> u16 {
    tflag::HAS_FLAGS
        | tflag::SEND_FLUSH
        | tflag::SEND_FUA
        | tflag::SEND_TRIM
        | tflag::SEND_WRITE_ZEROES
        | tflag::CAN_MULTI_CONN
        | tflag::SEND_CACHE
        | tflag::SEND_FAST_ZERO
}

/// Whether `base:allocation` was selected, last, for export `name`.
fn allocation_for(meta: &Option<(String, bool)>, name: &str) -> bool {
    matches!(meta, Some((n, true)) if n == name)
}

impl NbdServer {
    /// Accepts connections on `tcp` and `unix` until `stop` completes, then
    /// waits (at most `drain`) for the requests being served and makes
    /// every acknowledged write durable.
    pub async fn run(
        self: Arc<Self>,
        tcp: Option<tokio::net::TcpListener>,
        unix: Option<tokio::net::UnixListener>,
        stop: impl std::future::Future<Output = ()>,
        drain: std::time::Duration,
    ) -> Result<()> {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                r = accept_tcp(tcp.as_ref()) => match r {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        tokio::spawn(self.clone().serve(s));
                    }
                    Err(e) => accept_failed(e).await,
                },
                r = accept_unix(unix.as_ref()) => match r {
                    Ok(s) => { tokio::spawn(self.clone().serve(s)); }
                    Err(e) => accept_failed(e).await,
                },
                _ = &mut stop => break,
            }
        }
        drop(tcp);
        drop(unix);
        // Readers stop taking requests; what they took is answered, then
        // every acknowledged write is made durable.
        self.stop.send_replace(true);
        let deadline = tokio::time::Instant::now() + drain;
        while (self.in_flight() > 0 || self.connections.load(Ordering::Acquire) > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let drained = self.in_flight() == 0 && self.connections.load(Ordering::Acquire) == 0;
        let this = self.clone();
        off_runtime(move || this.flush()).await??;
        // A connection still open past the drain may yet write: then the
        // leases are left to expire instead.
        if drained {
            let this = self.clone();
            off_runtime(move || this.release_leases()).await?;
        }
        Ok(())
    }
}

async fn accept_tcp(l: Option<&tokio::net::TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn accept_unix(
    l: Option<&tokio::net::UnixListener>,
) -> std::io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Deletes a lease's record (the next holder gets in at once); a failure
/// leaves it to expire.
fn release(lease: Lease) {
    if let Err(e) = lease.release() {
        tracing::warn!(error = %e, "could not release a volume's lease (it expires by itself)");
    }
}

/// An accept error (out of file descriptors, say): log it and pause, so a
/// persistent one does not spin.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

impl NbdServer {
    /// The counters in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write;
        let st = &self.stats;
        let mut o = String::new();
        let _ = writeln!(o, "# TYPE lightstore_nbd_requests_total counter");
        for (i, name) in COMMAND_NAMES.iter().enumerate() {
            let n = st.requests[i].load(Ordering::Relaxed);
            let _ = writeln!(o, "lightstore_nbd_requests_total{{command=\"{name}\"}} {n}");
        }
        let _ = writeln!(o, "# TYPE lightstore_nbd_request_seconds_total counter");
        for (i, name) in COMMAND_NAMES.iter().enumerate() {
            let s = st.micros[i].load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                o,
                "lightstore_nbd_request_seconds_total{{command=\"{name}\"}} {s:.6}"
            );
        }
        let series: Vec<(&str, latency::HistogramSnapshot)> = COMMAND_NAMES
            .iter()
            .zip(&st.latency)
            .map(|(name, h)| (*name, h.snapshot()))
            .collect();
        latency::render_prometheus(
            &mut o,
            "lightstore_nbd_request_duration_seconds",
            "Time from when a request's batch began to when its replies were ready, by command.",
            "command",
            &series,
        );
        for (name, v) in [
            ("lightstore_nbd_read_bytes_total", &st.bytes_read),
            ("lightstore_nbd_written_bytes_total", &st.bytes_written),
            ("lightstore_nbd_errors_total", &st.errors),
            ("lightstore_nbd_connections_total", &st.connections),
        ] {
            let _ = writeln!(
                o,
                "# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            o,
            "# TYPE lightstore_nbd_in_flight gauge\nlightstore_nbd_in_flight {}",
            self.in_flight()
        );
        o
    }

    /// Serves [`NbdServer::metrics_text`] over HTTP on `listener` (any
    /// path), one request per connection, until the task is dropped.
    pub async fn serve_metrics(self: Arc<Self>, listener: tokio::net::TcpListener) {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                // The request line is enough; the body (none) is ignored.
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf)).await;
                let body = this.metrics_text();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn request(kind: u16, handle: u64, length: u32) -> Vec<u8> {
        let req = Request {
            flags: 0,
            kind,
            handle,
            offset: 0,
            length,
        };
        let mut b = req.encode().to_vec();
        if kind == cmd::WRITE {
            b.resize(REQUEST_LEN + length as usize, (handle % 251) as u8);
        }
        b
    }

    /// The kinds of the batches `bytes` are read as, in order.
    fn batches_of(bytes: &[u8]) -> Vec<Vec<u16>> {
        let server = NbdServer::new(
            Arc::new(client::MemStore::new()),
            None,
            Holder {
                name: "test".into(),
                force: false,
            },
        );
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        let bytes = bytes.to_vec();
        let writer = std::thread::spawn(move || {
            let mut a = a;
            std::io::Write::write_all(&mut a, &bytes).expect("write requests");
        });
        let sock = Socket::from(std::os::fd::OwnedFd::from(b));
        let out = Replies {
            sock: Mutex::new(sock.try_clone().expect("clone")),
            broken: std::sync::atomic::AtomicBool::new(false),
        };
        let mut rd = std::io::BufReader::with_capacity(READ_BUFFER, &sock);
        let mut batches = Vec::new();
        let mut after_large_write = false;
        loop {
            let (batch, end) = server.read_batch(&mut rd, &mut after_large_write, &out);
            if !batch.is_empty() {
                for (req, payload, _) in &batch {
                    if req.kind == cmd::WRITE {
                        let want = (req.handle % 251) as u8;
                        assert_eq!(payload.len(), req.length as usize);
                        assert!(
                            payload.iter().all(|&b| b == want),
                            "payload of {}",
                            req.handle
                        );
                    }
                }
                batches.push(batch.iter().map(|(r, _, _)| r.kind).collect());
            }
            if end.is_some() {
                writer.join().expect("writer");
                return batches;
            }
        }
    }

    /// After a large WRITE the next header is read on its own (so the
    /// next payload comes straight from the socket): large and small
    /// requests still arrive whole and in order.
    #[test]
    fn large_writes_and_small_requests_interleave_whole() {
        let mut bytes = Vec::new();
        for h in 0..6 {
            let len = if h % 2 == 0 { 300 << 10 } else { 4096 };
            bytes.extend(request(cmd::WRITE, h, len));
            bytes.extend(request(cmd::READ, 100 + h, 4096));
        }
        let kinds = batches_of(&bytes).concat();
        let want: Vec<u16> = (0..6).flat_map(|_| [cmd::WRITE, cmd::READ]).collect();
        assert_eq!(kinds, want);
    }

    /// Reads are split among the connection's threads: a share each of
    /// those waiting, at least four; writes ride along without a share.
    #[test]
    fn waiting_reads_are_shared_among_the_threads() {
        assert_eq!(read_share(1), MIN_READ_SHARE);
        assert_eq!(read_share(16), MIN_READ_SHARE);
        assert_eq!(read_share(64), 64 / THREADS);
        assert_eq!(read_share(65), 64 / THREADS + 1);
        let reads =
            |n: u64| -> Vec<u8> { (0..n).flat_map(|h| request(cmd::READ, h, 4096)).collect() };
        // Sixteen waiting: four batches of four.
        assert_eq!(batches_of(&reads(16)), vec![vec![cmd::READ; 4]; 4]);
        // Sixty-four waiting: shares of sixteen.
        let got = batches_of(&reads(64));
        assert_eq!(got[0].len(), 16, "{got:?}");
        assert_eq!(got.iter().map(Vec::len).sum::<usize>(), 64);
        // Writes are not counted against the share.
        let mut mixed: Vec<u8> = (0..6).flat_map(|h| request(cmd::WRITE, h, 4)).collect();
        mixed.extend(reads(6));
        let got = batches_of(&mixed);
        let mut want = vec![cmd::WRITE; 6];
        want.extend([cmd::READ; 4]);
        assert_eq!(got[0], want);
        assert_eq!(got[1], vec![cmd::READ; 2]);
    }

    /// A batch of replies with more pieces than one vectored write takes
    /// (IOV_MAX) arrives whole and in order.
    #[test]
    fn replies_of_many_pieces_arrive_whole() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        let replies: Vec<Reply> = (0..3)
            .map(|r| {
                (0..1000u32)
                    .map(|i| Bytes::from(format!("{r}:{i};").into_bytes()))
                    .collect()
            })
            .collect();
        let want: Vec<u8> = replies.iter().flatten().flat_map(|p| p.to_vec()).collect();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut b = b;
            b.read_to_end(&mut got).expect("read");
            got
        });
        let out = Replies {
            sock: Mutex::new(Socket::from(std::os::fd::OwnedFd::from(a))),
            broken: std::sync::atomic::AtomicBool::new(false),
        };
        out.send(&replies);
        assert!(!out.broken.load(Ordering::Acquire));
        drop(out);
        assert_eq!(reader.join().expect("reader"), want);
    }
}
