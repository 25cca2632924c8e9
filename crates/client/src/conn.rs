//! One blocking RESP connection to a node, with a timeout on every call,
//! over TCP (`host:port`) or a Unix socket (`unix:PATH`).

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use protocol::{decode_reply, encode_request, Reply, ReplyError, ReplyScan, RequestSink};

use crate::error::{ClientError, Result};
use crate::landing;
use crate::shm;

/// The Unix socket path of a `unix:PATH` node address.
pub fn unix_path(node: &str) -> Option<&Path> {
    node.strip_prefix("unix:").map(Path::new)
}

/// The socket under a connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }

    /// A non-blocking read: `Ok(0)` once the peer closed the connection,
    /// `WouldBlock` while it is open with nothing to read.
    fn read_now(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let set = |s: &Stream, nonblocking: bool| match s {
            Stream::Tcp(s) => s.set_nonblocking(nonblocking),
            Stream::Unix(s) => s.set_nonblocking(nonblocking),
        };
        set(self, true)?;
        let r = self.read(buf);
        set(self, false)?;
        r
    }

    /// Writes every byte of `bufs`, in as few system calls as the kernel
    /// allows. A write that times out (the peer reads nothing for the
    /// socket's write timeout) goes on if `wait_on()` says so.
    fn write_all_vectored(
        &mut self,
        mut bufs: &mut [IoSlice<'_>],
        mut wait_on: impl FnMut() -> bool,
    ) -> std::io::Result<()> {
        while !bufs.is_empty() {
            match self.write_vectored(bufs) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                        && wait_on() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Requests encoded for one vectored write: RESP framing and short
/// arguments copied into `head`, arguments of [`BORROW_ARG`] bytes or more
/// written from where they lie.
#[derive(Default)]
struct Outgoing<'a> {
    head: BytesMut,
    /// What to write, in order: `head[a..b]`, or an argument as is.
    parts: Vec<Part<'a>>,
    /// Where the part of `head` not yet in `parts` starts.
    from: usize,
}

enum Part<'a> {
    Head(usize, usize),
    Arg(&'a [u8]),
}

impl<'a> RequestSink<'a> for Outgoing<'a> {
    fn put(&mut self, b: &[u8]) {
        self.head.extend_from_slice(b);
    }

    fn put_arg(&mut self, arg: &'a [u8]) {
        if arg.len() < BORROW_ARG {
            return self.put(arg);
        }
        self.parts.push(Part::Head(self.from, self.head.len()));
        self.parts.push(Part::Arg(arg));
        self.from = self.head.len();
    }
}

impl Outgoing<'_> {
    /// Everything encoded, as slices to write in order.
    fn slices(&mut self) -> Vec<IoSlice<'_>> {
        self.parts.push(Part::Head(self.from, self.head.len()));
        self.from = self.head.len();
        let head = &self.head;
        self.parts
            .iter()
            .map(|p| match *p {
                Part::Head(a, b) => IoSlice::new(&head[a..b]),
                Part::Arg(a) => IoSlice::new(a),
            })
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// Reads once from `stream` into the spare capacity of `buf` (at most
/// [`READ_CHUNK`] bytes) and appends what arrived, without zeroing the
/// spare capacity first.
fn read_into_spare(stream: &mut Stream, buf: &mut BytesMut) -> std::io::Result<usize> {
    let spare = buf.chunk_mut();
    let len = spare.len().min(READ_CHUNK);
    // SAFETY: the pointer and length come from `chunk_mut`, which hands out
    // `len` writable bytes of `buf`'s allocation. `read` on a socket only
    // writes into the slice (it never reads it), so its uninitialised
    // contents are never observed; `advance_mut` then exposes exactly the
    // `n <= len` bytes the kernel wrote. This is the pattern tokio's
    // `ReadBuf` uses.
    let dst = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr(), len) };
    let n = stream.read(dst)?;
    assert!(n <= len, "read reported more bytes than it was given");
    // SAFETY: the first `n` bytes of the spare capacity were written above.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

/// A connection to one node. Any error leaves it unusable: the caller drops it.
pub struct Conn {
    stream: Stream,
    node: String,
    timeout: Duration,
    /// Bytes received and not parsed yet. Replies are sliced out of it
    /// without copying, so it is often shared with replies handed out.
    pending: Bytes,
    /// How much the next read makes room for (see [`Conn::read_room`]).
    room: usize,
    /// The size of the reply being received, guessed from its first bytes
    /// ([`protocol::reply_size_hint`]), so a large one gets its
    /// buffer once rather than regrown (and copied) read by read; 0 when
    /// no reply is in progress or its size is unknown.
    expect: usize,
    /// How far the reply being received is known to be whole.
    scan: ReplyScan,
    /// The socket's read and write timeouts as last set (`None`: not set
    /// yet). Each change is a system call, so they change only when they
    /// must (see [`Conn::bound_read`]).
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// The node's run this connection talks to (`RUNID`; 0: unknown).
    pub(crate) run: u64,
    /// How long a call may wait on a node that is slow but answers a
    /// liveness probe (`None`: it fails at the call timeout). See
    /// [`Conn::set_busy_limit`].
    busy_limit: Option<Duration>,
    /// The process's shared memory, when the node attached it: values
    /// lying there go by reference (see [`crate::shm`]).
    shared: Option<&'static shm::Arena>,
    /// Whether the node can also write the arena: sized multi-gets then
    /// land their values there (see [`crate::landing`]).
    landing: bool,
    /// Blocks of it named by requests sent and not all answered yet.
    pins: Vec<shm::Pin>,
    /// Requests sent whose replies were not read yet.
    unanswered: usize,
    /// Per request sent and not answered, in order: where its values land,
    /// if they do.
    landed: VecDeque<Option<Arc<landing::Landed>>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.unanswered > 0 {
            // The node may still be reading what these requests named:
            // those blocks must never be reused (see `crate::shm`).
            std::mem::forget(std::mem::take(&mut self.pins));
        }
    }
}

/// The longest a liveness probe waits for its answer.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Whether `node` answers a `PING` on a fresh connection within `wait`.
/// Any reply counts, an error (`NOAUTH`) included: it shows that the
/// node's network thread serves, whatever its device is doing.
fn node_answers(node: &str, wait: Duration) -> bool {
    match Conn::open(node, wait, None) {
        Ok(mut probe) => matches!(
            probe.call(&[b"PING"]),
            Ok(_) | Err(ClientError::Server { .. })
        ),
        Err(_) => false,
    }
}

/// Whether a call to `node` that started at `started` may wait on: it is
/// within `limit` (`None`: never) and the node answers a probe within
/// `probe_wait`. Free of `Conn` so a write in progress can ask it.
fn busy_not_down(
    node: &str,
    limit: Option<Duration>,
    probe_wait: Duration,
    started: Instant,
) -> bool {
    let Some(limit) = limit else {
        return false;
    };
    if started.elapsed() >= limit || !node_answers(node, probe_wait) {
        return false;
    }
    tracing::debug!(node, waited = ?started.elapsed(), "node slow but alive; the call waits on");
    true
}

/// A read's socket timeout is the time left to the call's deadline rounded
/// down to a multiple of the call timeout over this: a fast call then
/// leaves it as it was, and a read never waits past the deadline (one that
/// times out early is retried with the rest).
const READ_TIMEOUT_STEPS: u32 = 8;

/// Bytes read from the socket per read call, at most.
const READ_CHUNK: usize = 256 * 1024;
/// Bytes read from the socket per read call, at least.
const MIN_READ: usize = 16 * 1024;
/// Largest reply size a buffer is made ready for at once from a size hint
/// (the hint comes from the peer: a bound on what it can make us reserve).
const MAX_EXPECT: usize = 64 << 20;
/// Room to make for the next read when `pending` bytes of a reply are held,
/// the last reads asked for `last` and the reply is expected to be
/// `expect` bytes long (0: unknown).
///
/// A reply of known size gets exactly what it still lacks, so its buffer
/// is allocated once and never regrown: making the usual room instead
/// near the end of a large reply reallocated (and copied) the whole reply
/// for its last few bytes. Past the hint (which guesses every element as
/// long as the first) or without one, as much as is pending (a large
/// reply's buffer doubles, rather than growing by small steps), at least
/// what the last reads asked, within [`MIN_READ`]..=[`READ_CHUNK`].
fn read_room(pending: usize, last: usize, expect: usize) -> usize {
    if expect > pending {
        return expect - pending;
    }
    pending.max(last).clamp(MIN_READ, READ_CHUNK)
}

/// Arguments at least this long are sent from where they are (a vectored
/// write), shorter ones are copied next to their headers.
const BORROW_ARG: usize = 1024;

impl Conn {
    /// Connects to `node` (`host:port` or `unix:PATH`), waiting at most
    /// `timeout`, and authenticates when `password` is set.
    pub fn open(node: &str, timeout: Duration, password: Option<&str>) -> Result<Conn> {
        let stream = Self::connect(node, timeout).map_err(|source| ClientError::Io {
            node: node.to_string(),
            source,
        })?;
        let mut conn = Conn {
            stream,
            node: node.to_string(),
            timeout,
            pending: Bytes::new(),
            room: MIN_READ,
            expect: 0,
            scan: ReplyScan::new(),
            read_timeout: None,
            write_timeout: None,
            run: 0,
            busy_limit: None,
            shared: None,
            landing: false,
            pins: Vec::new(),
            unanswered: 0,
            landed: VecDeque::new(),
        };
        if let Some(pw) = password {
            conn.call(&[&b"AUTH"[..], pw.as_bytes()])?;
        }
        Ok(conn)
    }

    /// Offers `arena` to the node (`SHMATTACH`); values lying in it then
    /// go by reference. A node that cannot map it (an older node, another
    /// user's process) answers an error, and values keep going through
    /// the socket. A node that can also write it (`+OK MGETSHM`) lands
    /// the values of sized multi-gets there (see `landing.rs`).
    pub fn attach_shared(&mut self, arena: Option<&'static shm::Arena>) -> Result<()> {
        self.shared = None;
        self.landing = false;
        let Some(arena) = arena else {
            return Ok(());
        };
        match self.call(&arena.attach_args())? {
            Reply::Error(e) => tracing::debug!(node = %self.node, "no shared memory: {e}"),
            reply => {
                arena.note_attached();
                self.shared = Some(arena);
                self.landing =
                    matches!(&reply, Reply::Status(s) if s == protocol::shm::ATTACHED_WRITABLE);
            }
        }
        Ok(())
    }

    fn connect(node: &str, timeout: Duration) -> std::io::Result<Stream> {
        if let Some(path) = unix_path(node) {
            // A local connect does not wait on the network: it succeeds or
            // fails at once.
            return UnixStream::connect(path).map(Stream::Unix);
        }
        let addrs: Vec<SocketAddr> = node.to_socket_addrs()?.collect();
        let mut last = std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(Stream::Tcp(stream));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether this idle connection is no use any more: its peer closed it
    /// (a node that stopped or restarted) or it failed. An idle connection
    /// has nothing to read, so anything found to read means it is out of
    /// step, and it counts as broken too (the byte read is lost with it).
    pub(crate) fn closed_while_idle(&mut self) -> bool {
        let mut byte = [0u8; 1];
        !matches!(self.stream.read_now(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    /// Sets the timeout of later calls.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Lets later calls wait up to `limit` on a node that is slow but
    /// alive. A call that gets no answer (or cannot write its request)
    /// within the call timeout then probes the node (`node_answers`): if
    /// it answers, its device or engine is busy (a disk that stalls for a
    /// second or two under a burst of writes), the call waits another call
    /// timeout, and so on up to `limit`; if it does not, or at `limit`, the
    /// call fails with [`ClientError::Timeout`] as before. A stopped or
    /// hung node is still given up after the call timeout and one probe.
    pub fn set_busy_limit(&mut self, limit: Option<Duration>) {
        self.busy_limit = limit;
    }

    /// How long a probe waits: half the call timeout, at most [`PROBE_WAIT`].
    fn probe_wait(&self) -> Duration {
        (self.timeout / 2).min(PROBE_WAIT)
    }

    /// Whether a call that started at `started` and has waited a call
    /// timeout may wait on (see [`Conn::set_busy_limit`]).
    fn node_busy_not_down(&self, started: Instant) -> bool {
        busy_not_down(&self.node, self.busy_limit, self.probe_wait(), started)
    }

    /// Sends one request and returns its reply. An error reply is returned
    /// as [`ClientError::Server`].
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Reply> {
        let mut replies = self.pipeline(std::slice::from_ref(&args))?;
        let reply = replies.pop().unwrap_or(Reply::Null);
        self.check(reply)
    }

    /// Sends several requests in one write and reads all their replies, in
    /// order. Error replies are returned as [`Reply::Error`], not as errors.
    pub fn pipeline<R: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, reqs: &[R]) -> Result<Vec<Reply>> {
        self.send(reqs)?;
        self.receive(reqs.len())
    }

    /// Sends several requests in one write and reads their replies; fails
    /// on the first error reply.
    pub fn pipeline_checked<R: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, reqs: &[R]) -> Result<()> {
        let replies = self.pipeline(reqs)?;
        replies
            .into_iter()
            .try_for_each(|r| self.check(r).map(drop))
    }

    /// Sends requests without reading their replies: [`Conn::receive`]
    /// reads them later, so the caller can work while the node does.
    /// Long arguments (values) are written from where they lie, not copied.
    pub fn send<R: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, reqs: &[R]) -> Result<()> {
        let mut out = Outgoing::default();
        let rewritten: Vec<Option<shm::Rewritten>> = match self.shared {
            Some(arena) => reqs
                .iter()
                .map(|r| shm::rewrite(arena, r.as_ref(), &mut self.pins))
                .collect(),
            None => Vec::new(),
        };
        let shared_args: Vec<Option<Vec<&[u8]>>> = rewritten
            .iter()
            .zip(reqs)
            .map(|(rw, r)| rw.as_ref().map(|rw| rw.args(r.as_ref())))
            .collect();
        let landing_arena = self.shared.filter(|_| self.landing);
        let sized: Vec<Option<landing::Rewritten>> = reqs
            .iter()
            .map(|r| landing::rewrite(landing_arena, r.as_ref(), &mut self.pins))
            .collect();
        let sized_args: Vec<Option<Vec<&[u8]>>> = sized
            .iter()
            .zip(reqs)
            .map(|(rw, r)| rw.as_ref().map(|rw| rw.args(r.as_ref())))
            .collect();
        for (i, r) in reqs.iter().enumerate() {
            match (sized_args.get(i), shared_args.get(i)) {
                (Some(Some(args)), _) | (_, Some(Some(args))) => encode_request(args, &mut out),
                _ => encode_request(r.as_ref(), &mut out),
            }
        }
        self.landed.extend(
            sized
                .iter()
                .map(|rw| rw.as_ref().and_then(|rw| rw.landed.clone())),
        );
        self.unanswered += reqs.len();
        let mut slices = out.slices();
        if self.write_timeout != Some(self.timeout) {
            self.stream
                .set_write_timeout(Some(self.timeout))
                .map_err(|e| self.io(e))?;
            self.write_timeout = Some(self.timeout);
        }
        let started = Instant::now();
        let (node, limit, probe_wait) = (&self.node, self.busy_limit, self.probe_wait());
        let wait_on = || busy_not_down(node, limit, probe_wait, started);
        let written = self.stream.write_all_vectored(&mut slices, wait_on);
        written.map_err(|e| self.io(e))
    }

    /// Reads the replies of `n` requests sent before, in order, within the
    /// call timeout (longer for a node that is busy but alive, see
    /// [`Conn::set_busy_limit`]). Error replies are returned as
    /// [`Reply::Error`].
    pub fn receive(&mut self, n: usize) -> Result<Vec<Reply>> {
        let started = Instant::now();
        let mut deadline = started + self.timeout;
        let mut replies = Vec::with_capacity(n);
        while replies.len() < n {
            match self.read_reply(deadline) {
                Ok(reply) => match self.answered() {
                    Some(range) => replies.push(range.values(reply)),
                    None => replies.push(reply),
                },
                // What arrived so far stays pending: reading goes on.
                Err(ClientError::Timeout { .. }) if self.node_busy_not_down(started) => {
                    let limit = self.busy_limit.unwrap_or(self.timeout);
                    deadline = (Instant::now() + self.timeout).min(started + limit);
                }
                Err(ClientError::Timeout { node, .. }) => {
                    return Err(ClientError::Timeout {
                        node,
                        timeout: Duration::from_millis(started.elapsed().as_millis() as u64)
                            .max(self.timeout),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(replies)
    }

    /// Counts one reply read, returning where its request's values landed
    /// if they did; when none is outstanding, the node is done with every
    /// block the requests named.
    fn answered(&mut self) -> Option<Arc<landing::Landed>> {
        self.unanswered = self.unanswered.saturating_sub(1);
        let landed = self.landed.pop_front().flatten();
        if self.unanswered == 0 {
            self.pins.clear();
        }
        debug_assert_eq!(self.landed.len(), self.unanswered);
        landed
    }

    /// Turns an error reply into [`ClientError::Server`].
    pub fn check(&self, reply: Reply) -> Result<Reply> {
        match reply {
            Reply::Error(message) => Err(ClientError::Server {
                node: self.node.clone(),
                message,
            }),
            r => Ok(r),
        }
    }

    fn read_reply(&mut self, deadline: Instant) -> Result<Reply> {
        loop {
            if !self.pending.is_empty() {
                // Decoded once it is whole (the scan resumes at the first
                // top-level element not yet whole, so a multi-get's reply
                // is looked at about once; decoding walks all of it).
                let protocol = |source| ClientError::Protocol {
                    node: self.node.clone(),
                    source,
                };
                if self
                    .scan
                    .advance(&self.pending)
                    .map_err(protocol)?
                    .is_some()
                {
                    let Some((reply, used)) = decode_reply(&self.pending).map_err(protocol)? else {
                        return Err(protocol(ReplyError("a whole reply did not decode".into())));
                    };
                    // Pipelined replies that arrived together stay pending.
                    self.pending.advance(used);
                    self.expect = 0;
                    self.scan = ReplyScan::new();
                    return Ok(reply);
                }
                if self.expect == 0 {
                    self.expect = protocol::reply_size_hint(&self.pending)
                        .unwrap_or(0)
                        .min(MAX_EXPECT);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out());
            }
            self.bound_read(left)?;
            // Append to the pending bytes: in place when no reply handed
            // out shares their buffer, else after copying the part of one
            // reply they hold.
            let mut buf = std::mem::take(&mut self.pending)
                .try_into_mut()
                .unwrap_or_else(|b| BytesMut::from(&b[..]));
            let room = self.read_room(buf.len());
            buf.reserve(room);
            let got = read_into_spare(&mut self.stream, &mut buf);
            if let Ok(n) = got {
                // Reads that fill their room ask for more next time; small
                // replies keep buffers small (a fresh buffer per read when
                // replies hold the last one).
                self.room = if n >= room {
                    (room * 2).min(READ_CHUNK)
                } else {
                    MIN_READ
                };
            }
            self.pending = buf.freeze();
            match got {
                Ok(0) => return Err(self.io(ErrorKind::UnexpectedEof.into())),
                Ok(_) => {}
                // The loop's deadline check decides: a read bounded by a
                // rounded-down timeout may stop before the deadline.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    /// Sets the socket's read timeout so that a read waits at most `left`:
    /// `left` rounded down to a multiple of the call timeout's
    /// [`READ_TIMEOUT_STEPS`]th (exactly `left` below one step). Calls that
    /// finish within a step keep the socket's setting as it is.
    fn bound_read(&mut self, left: Duration) -> Result<()> {
        let step = self.timeout / READ_TIMEOUT_STEPS;
        let want = if step.is_zero() || left < step {
            left
        } else {
            let steps = (left.as_nanos() / step.as_nanos()).min(u128::from(READ_TIMEOUT_STEPS));
            step * steps as u32
        };
        if self.read_timeout != Some(want) {
            self.stream
                .set_read_timeout(Some(want))
                .map_err(|e| self.io(e))?;
            self.read_timeout = Some(want);
        }
        Ok(())
    }

    /// Room to make for the next read when `pending` bytes of a reply are
    /// held (see [`read_room`]).
    fn read_room(&self, pending: usize) -> usize {
        read_room(pending, self.room, self.expect)
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io {
            node: self.node.clone(),
            source,
        }
    }

    fn timed_out(&self) -> ClientError {
        ClientError::Timeout {
            node: self.node.clone(),
            timeout: self.timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::RespVersion;
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A fake node on a Unix socket: reads `expect` bytes, checks them,
    /// then writes `replies` a few bytes at a time.
    fn fake_node(
        path: &Path,
        expect: Vec<u8>,
        replies: Vec<u8>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        let listener = UnixListener::bind(path).expect("bind");
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut got = vec![0u8; expect.len()];
            s.read_exact(&mut got).expect("request bytes");
            for piece in replies.chunks(7001) {
                s.write_all(piece).expect("reply bytes");
                s.flush().expect("flush");
            }
            got
        })
    }

    /// An empty directory for one test's socket, named by `tag`.
    fn fresh_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ls-conn-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn a_reply_of_known_size_gets_its_buffer_once() {
        // An MGET of 64 values of 16,394 bytes: 1,049,861 bytes in all.
        let expect = 5 + 64 * (1 + 5 + 2 + 16_394 + 2);
        // After the first read, room for the whole rest at once ...
        assert_eq!(read_room(MIN_READ, MIN_READ, expect), expect - MIN_READ);
        // ... and near its end only what is missing, however small, where
        // the usual room would regrow (and copy) the whole reply.
        assert_eq!(read_room(1 << 20, READ_CHUNK, expect), expect - (1 << 20));
        // Past a hint that guessed short, or without one, the usual room.
        assert_eq!(read_room(expect + 10, READ_CHUNK, expect), READ_CHUNK);
        assert_eq!(read_room(100, MIN_READ, 0), MIN_READ);
        assert_eq!(read_room(100_000, MIN_READ, 0), 100_000);
    }

    #[test]
    fn requests_are_encoded_as_resp_and_split_replies_are_put_together() {
        let dir = fresh_dir("encode");
        let path = dir.join("node.sock");
        // Short and long arguments (long ones are written in place).
        let big: Vec<u8> = (0..BORROW_ARG * 5).map(|i| i as u8).collect();
        let reqs: Vec<Vec<&[u8]>> = vec![
            vec![b"SET", b"k", &big],
            vec![b"GET", b"k"],
            vec![
                b"MSET",
                &big[..BORROW_ARG],
                b"",
                &big[..BORROW_ARG - 1],
                b"x",
            ],
        ];
        let mut expect = BytesMut::new();
        for r in &reqs {
            encode_request(r, &mut expect);
        }
        // Replies spanning several reads, one larger than a read.
        let huge = Bytes::from(
            (0..READ_CHUNK + 12_345)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        );
        let replies = [
            Reply::Simple("OK"),
            Reply::Bulk(huge.clone()),
            Reply::Array(vec![Reply::Bulk(Bytes::from_static(b"a")), Reply::Null]),
        ];
        let mut wire = BytesMut::new();
        for r in &replies {
            r.encode(RespVersion::V2, &mut wire);
        }
        let node = fake_node(&path, expect.to_vec(), wire.to_vec());
        let addr = format!("unix:{}", path.display());
        let mut conn = Conn::open(&addr, Duration::from_secs(10), None).expect("open");
        let got = conn.pipeline(&reqs).expect("pipeline");
        assert_eq!(
            node.join().expect("node"),
            expect.to_vec(),
            "bytes on the wire"
        );
        assert_eq!(got.len(), 3);
        assert!(
            matches!(&got[0], Reply::Status(s) if s == "OK")
                || matches!(&got[0], Reply::Simple("OK"))
        );
        assert!(matches!(&got[1], Reply::Bulk(b) if *b == huge));
        assert!(matches!(&got[2], Reply::Array(a) if a.len() == 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fake node on `path` whose first connection answers its first
    /// `PING` after `delay`; every other connection (a probe) is answered
    /// at once, or never when `probes_answered` is false. It serves until
    /// `stop` is set.
    fn slow_node(
        path: &Path,
        delay: Duration,
        probes_answered: bool,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let listener = UnixListener::bind(path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            let mut first = true;
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                s.set_nonblocking(false).expect("blocking");
                let answer_after = match (first, probes_answered) {
                    (true, _) => Some(delay),
                    (false, true) => Some(Duration::ZERO),
                    (false, false) => None,
                };
                first = false;
                let stop = stop.clone();
                // Detached: a silent probe's connection stays open until
                // the test is done.
                std::thread::spawn(move || {
                    let mut req = [0u8; 14]; // *1\r\n$4\r\nPING\r\n
                    if s.read_exact(&mut req).is_err() {
                        return;
                    }
                    match answer_after {
                        Some(d) => {
                            std::thread::sleep(d);
                            let _ = s.write_all(b"+PONG\r\n");
                        }
                        None => {
                            while !stop.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                });
            }
        })
    }

    /// A node that answers probes but takes 2.5 call timeouts to answer a
    /// call (its disk stalled) is waited for; without a busy limit the
    /// call fails at the call timeout, as before.
    #[test]
    fn a_busy_node_that_answers_probes_is_waited_for() {
        let dir = fresh_dir("busy");
        let timeout = Duration::from_millis(300);
        let delay = timeout * 5 / 2;
        for limit in [Some(Duration::from_secs(5)), None] {
            let path = dir.join(format!("node-{}.sock", limit.is_some()));
            let stop = Arc::new(AtomicBool::new(false));
            let node = slow_node(&path, delay, true, stop.clone());
            let addr = format!("unix:{}", path.display());
            let mut conn = Conn::open(&addr, timeout, None).expect("open");
            conn.set_busy_limit(limit);
            let start = Instant::now();
            let got = conn.call(&[b"PING"]);
            let took = start.elapsed();
            match limit {
                Some(_) => {
                    assert!(
                        matches!(got, Ok(Reply::Status(ref s)) if *s == "PONG"),
                        "{got:?}"
                    );
                    assert!(took >= delay, "answered after {took:?}");
                }
                None => {
                    assert!(matches!(got, Err(ClientError::Timeout { .. })), "{got:?}");
                    assert!(took < delay, "waited {took:?}");
                }
            }
            stop.store(true, Ordering::Relaxed);
            node.join().expect("node");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A node that answers neither the call nor a probe (stopped, hung) is
    /// given up after the call timeout and one probe, busy limit or not,
    /// and the error says how long the call waited.
    #[test]
    fn a_node_that_answers_no_probe_is_given_up_at_the_call_timeout() {
        let dir = fresh_dir("hung");
        let path = dir.join("node.sock");
        let timeout = Duration::from_millis(300);
        let stop = Arc::new(AtomicBool::new(false));
        let node = slow_node(&path, Duration::from_secs(3), false, stop.clone());
        let addr = format!("unix:{}", path.display());
        let mut conn = Conn::open(&addr, timeout, None).expect("open");
        conn.set_busy_limit(Some(Duration::from_secs(20)));
        let start = Instant::now();
        let err = conn.call(&[b"PING"]).expect_err("no reply");
        let took = start.elapsed();
        assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
        assert!(took >= timeout, "gave up after {took:?}");
        assert!(took < timeout * 2 + timeout / 2, "waited {took:?}");
        stop.store(true, Ordering::Relaxed);
        node.join().expect("node");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A call to a node that stops answering fails after the call timeout,
    /// not before and not much after, however the socket's timeout was
    /// left by the calls before it; a fast call leaves the socket's read
    /// timeout as it was.
    #[test]
    fn a_silent_node_times_out_at_the_call_timeout() {
        let dir = fresh_dir("silent");
        let path = dir.join("node.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let node = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut req = vec![0u8; 14]; // *1\r\n$4\r\nPING\r\n
            for _ in 0..2 {
                s.read_exact(&mut req).expect("ping");
                s.write_all(b"+PONG\r\n").expect("pong");
            }
            // Silent until the test is done.
            let _ = hold_rx.recv();
        });
        let timeout = Duration::from_millis(400);
        let addr = format!("unix:{}", path.display());
        let mut conn = Conn::open(&addr, timeout, None).expect("open");
        conn.call(&[b"PING"]).expect("first ping");
        let set = conn.read_timeout;
        assert!(
            set.is_some_and(|t| t <= timeout && t >= timeout * 6 / 8),
            "{set:?}"
        );
        conn.call(&[b"PING"]).expect("second ping");
        assert_eq!(
            conn.read_timeout, set,
            "a fast call leaves the socket as it was"
        );
        let start = Instant::now();
        let err = conn.call(&[b"PING"]).expect_err("no reply");
        let took = start.elapsed();
        assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
        assert!(took >= timeout, "gave up after {took:?}");
        assert!(took < timeout * 2, "waited {took:?}");
        let _ = hold_tx.send(());
        node.join().expect("node");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
