//! The NBD server: the fixed newstyle handshake, then transmission, on TCP
//! and Unix sockets, every volume of the cluster an export by name.
//!
//! A connection's requests run concurrently (up to [`MAX_IN_FLIGHT`] at
//! once) on blocking threads, since the cluster client blocks; replies go
//! out as each finishes, out of order, through one writer task.
//!
//! `CAN_MULTI_CONN` is advertised because it holds: every connection to an
//! export in this process shares one [`Blocks`] (so one set of chunk locks)
//! and one cluster client. A write is answered only after every replica
//! that is up acknowledged it, and reads ask every replica that is up, so
//! a read on any connection that starts after a write was answered sees it;
//! FLUSH and FUA call [`client::Store::sync`], which makes every write the
//! nodes acknowledged durable, whichever connection sent it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use client::Store;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

use crate::blocks::Blocks;
use crate::error::{errno, NbdError, Result};
use crate::proto::{self, cflag, chunk, cmd, opt, rep, tflag, Request, REQUEST_LEN};
use crate::volume;

/// Requests of one connection running at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Largest READ or WRITE payload (the protocol's interoperable maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option a client may send (export names and queries are short).
const MAX_OPTION: u32 = 64 << 10;
/// Chunks one BLOCK_STATUS looks at (it may answer less than asked).
const MAX_STATUS_CHUNKS: u64 = 16_384;

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
    /// Microseconds spent serving them, by command.
    pub micros: [AtomicU64; 7],
    /// Bytes read and written.
    pub bytes_read: AtomicU64,
    /// See `bytes_read`.
    pub bytes_written: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
}

/// The server: the cluster, the exports opened so far, the default export.
pub struct NbdServer {
    store: Arc<dyn Store>,
    exports: Mutex<HashMap<String, Arc<Blocks>>>,
    default_export: Option<String>,
    /// Counters.
    pub stats: Stats,
    in_flight: AtomicU64,
}

/// What the handshake settled.
struct Session {
    blocks: Arc<Blocks>,
    structured: bool,
    /// `base:allocation` was selected for this export.
    allocation: bool,
}

impl NbdServer {
    /// A server over `store`; `default_export` answers the empty export name.
    pub fn new(store: Arc<dyn Store>, default_export: Option<String>) -> Arc<NbdServer> {
        Arc::new(NbdServer {
            store,
            exports: Mutex::new(HashMap::new()),
            default_export,
            stats: Stats::default(),
            in_flight: AtomicU64::new(0),
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

    /// The export `name` (the default export for ""), opened once.
    fn export(&self, name: &str) -> Result<Option<Arc<Blocks>>> {
        let name = match (name, &self.default_export) {
            ("", Some(d)) => d.as_str(),
            ("", None) => return Ok(None),
            (n, _) => n,
        };
        if let Some(b) = self.exports.lock().get(name) {
            return Ok(Some(b.clone()));
        }
        let store = self.store.clone();
        let Some(vol) = volume::open(&*store, name)? else {
            return Ok(None);
        };
        let blocks = Arc::new(Blocks::new(store, vol));
        Ok(Some(
            self.exports
                .lock()
                .entry(name.to_string())
                .or_insert(blocks)
                .clone(),
        ))
    }

    /// Serves one connection until the client leaves or breaks the protocol.
    pub async fn serve<S>(self: Arc<Self>, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let (mut rd, mut wr) = tokio::io::split(stream);
        let session = match self.clone().handshake(&mut rd, &mut wr).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "handshake ended");
                return;
            }
        };
        if let Err(e) = self.transmission(rd, wr, session).await {
            tracing::debug!(error = %e, "connection ended");
        }
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
                    let Some(blocks) = self.export(&name)? else {
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
                    let vols = tokio::task::spawn_blocking(move || volume::list(&*store))
                        .await
                        .map_err(|e| NbdError::Protocol(e.to_string()))??;
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
                    let this = self.clone();
                    let name = req.name.clone();
                    let found = tokio::task::spawn_blocking(move || this.export(&name))
                        .await
                        .map_err(|e| NbdError::Protocol(e.to_string()))?;
                    let blocks = match found {
                        Ok(Some(b)) => b,
                        Ok(None) => {
                            wr.write_all(&error(
                                rep::ERR_UNKNOWN,
                                &format!("no volume {:?}", req.name),
                            ))
                            .await?;
                            continue;
                        }
                        Err(e) => {
                            wr.write_all(&error(rep::ERR_INVALID, &e.to_string()))
                                .await?;
                            continue;
                        }
                    };
                    let vol = blocks.volume();
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
                    if option == opt::GO {
                        let allocation = allocation_for(&meta, &req.name);
                        return Ok(Some(Session {
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

    /// Serves requests until DISC, a broken stream or a protocol violation.
    async fn transmission<R, W>(
        self: Arc<Self>,
        mut rd: R,
        mut wr: W,
        session: Session,
    ) -> Result<()>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let session = Arc::new(session);
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_IN_FLIGHT);
        let writer = tokio::spawn(async move {
            while let Some(buf) = rx.recv().await {
                if wr.write_all(&buf).await.is_err() {
                    return;
                }
            }
            let _ = wr.flush().await;
            let _ = wr.shutdown().await;
        });
        let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let outcome = loop {
            let mut header = [0u8; REQUEST_LEN];
            match rd.read_exact(&mut header).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
                Err(e) => break Err(e.into()),
            }
            let Some(req) = Request::parse(&header) else {
                break Err(NbdError::Protocol("bad request magic".into()));
            };
            if req.kind == cmd::DISC {
                break Ok(());
            }
            let payload = if req.kind == cmd::WRITE {
                if req.length > MAX_PAYLOAD {
                    break Err(NbdError::Protocol(format!("WRITE of {} bytes", req.length)));
                }
                let mut p = vec![0u8; req.length as usize];
                if let Err(e) = rd.read_exact(&mut p).await {
                    break Err(e.into());
                }
                p
            } else {
                Vec::new()
            };
            let Ok(permit) = limit.clone().acquire_owned().await else {
                break Ok(());
            };
            let (this, session, tx) = (self.clone(), session.clone(), tx.clone());
            this.in_flight.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                let worker = this.clone();
                let reply =
                    tokio::task::spawn_blocking(move || worker.execute(&session, req, payload))
                        .await
                        .unwrap_or_else(|_| proto::simple_reply(errno::EIO, req.handle));
                let _ = tx.send(reply).await;
                this.in_flight.fetch_sub(1, Ordering::AcqRel);
                drop(permit);
            });
        };
        // DISC or end of stream: finish what is running, then close.
        let _ = limit.acquire_many(MAX_IN_FLIGHT as u32).await;
        drop(tx);
        let _ = writer.await;
        outcome
    }

    /// Runs one request (on a blocking thread); its encoded reply.
    fn execute(&self, s: &Session, req: Request, payload: Vec<u8>) -> Vec<u8> {
        let stat = match req.kind {
            cmd::READ => 0,
            cmd::WRITE => 1,
            cmd::FLUSH => 2,
            cmd::TRIM => 3,
            cmd::WRITE_ZEROES => 4,
            cmd::BLOCK_STATUS => 5,
            _ => 6,
        };
        self.stats.requests[stat].fetch_add(1, Ordering::Relaxed);
        let began = std::time::Instant::now();
        let out = self.dispatch(s, &req, payload);
        self.stats.micros[stat].fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
        match out {
            Ok(reply) => reply,
            Err((code, msg)) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(kind = req.kind, error = code, %msg, "request failed");
                if s.structured {
                    proto::error_chunk(req.handle, code, &msg)
                } else {
                    proto::simple_reply(code, req.handle)
                }
            }
        }
    }

    fn dispatch(
        &self,
        s: &Session,
        req: &Request,
        payload: Vec<u8>,
    ) -> std::result::Result<Vec<u8>, (u32, String)> {
        let b = &s.blocks;
        let size = b.volume().size;
        let end = req.offset.checked_add(u64::from(req.length));
        let in_bounds = end.is_some_and(|e| e <= size);
        let fua = req.flags & cflag::FUA != 0;
        let fail = |e: NbdError| (e.errno(), e.to_string());
        let ok = || proto::simple_reply(0, req.handle);
        let known_flags = cflag::FUA | cflag::NO_HOLE | cflag::REQ_ONE | cflag::FAST_ZERO;
        if req.flags & !known_flags != 0 {
            return Err((
                errno::EINVAL,
                format!("unknown command flags {:#x}", req.flags),
            ));
        }
        match req.kind {
            cmd::READ => {
                if req.length > MAX_PAYLOAD {
                    return Err((
                        errno::EINVAL,
                        format!("READ of {} bytes: at most {MAX_PAYLOAD}", req.length),
                    ));
                }
                if !in_bounds {
                    return Err((errno::EINVAL, "READ past the end of the export".into()));
                }
                let data = b.read(req.offset, req.length as usize).map_err(fail)?;
                self.stats
                    .bytes_read
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(if s.structured {
                    if data.is_empty() {
                        proto::chunk_header(chunk::FLAG_DONE, chunk::NONE, req.handle, 0)
                    } else {
                        let mut r = proto::chunk_header(
                            chunk::FLAG_DONE,
                            chunk::OFFSET_DATA,
                            req.handle,
                            8 + data.len() as u32,
                        );
                        r.extend_from_slice(&req.offset.to_be_bytes());
                        r.extend_from_slice(&data);
                        r
                    }
                } else {
                    let mut r = proto::simple_reply(0, req.handle);
                    r.extend_from_slice(&data);
                    r
                })
            }
            cmd::WRITE => {
                if !in_bounds {
                    return Err((errno::ENOSPC, "WRITE past the end of the export".into()));
                }
                b.write(req.offset, &payload, fua).map_err(fail)?;
                self.stats
                    .bytes_written
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                Ok(ok())
            }
            cmd::FLUSH => {
                b.flush().map_err(fail)?;
                Ok(ok())
            }
            cmd::TRIM | cmd::WRITE_ZEROES => {
                if !in_bounds {
                    let code = if req.kind == cmd::TRIM {
                        errno::EINVAL
                    } else {
                        errno::ENOSPC
                    };
                    return Err((code, "request past the end of the export".into()));
                }
                // Zeroing is never slower than writing zeros here (whole
                // chunks are deleted), so FAST_ZERO is honoured as is.
                b.zero(req.offset, req.length as usize, fua).map_err(fail)?;
                Ok(ok())
            }
            cmd::CACHE => {
                if !in_bounds {
                    return Err((errno::EINVAL, "CACHE past the end of the export".into()));
                }
                Ok(ok())
            }
            cmd::BLOCK_STATUS => {
                if !s.structured || !s.allocation {
                    return Err((
                        errno::EINVAL,
                        "BLOCK_STATUS needs base:allocation selected".into(),
                    ));
                }
                if !in_bounds || req.length == 0 {
                    return Err((
                        errno::EINVAL,
                        "BLOCK_STATUS past the end of the export".into(),
                    ));
                }
                let cs = u64::from(b.volume().chunk_size);
                let len = u64::from(req.length).min(MAX_STATUS_CHUNKS * cs - req.offset % cs);
                let mut extents = b.status(req.offset, len).map_err(fail)?;
                if req.flags & cflag::REQ_ONE != 0 {
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
            other => Err((errno::EINVAL, format!("unknown command {other}"))),
        }
    }
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
        let deadline = tokio::time::Instant::now() + drain;
        while self.in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.flush())
            .await
            .map_err(|e| NbdError::Protocol(e.to_string()))?
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
