//! One blocking RESP connection to a node, with a timeout on every call,
//! over TCP (`host:port`) or a Unix socket (`unix:PATH`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protocol::{decode_reply, encode_request, Reply};

use crate::error::{ClientError, Result};

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

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf),
            Stream::Unix(s) => s.write_all(buf),
        }
    }
}

/// A connection to one node. Any error leaves it unusable: the caller drops it.
pub struct Conn {
    stream: Stream,
    node: String,
    timeout: Duration,
    rbuf: BytesMut,
    scratch: Box<[u8]>,
}

/// Bytes read from the socket per read call.
const READ_CHUNK: usize = 256 * 1024;

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
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        };
        if let Some(pw) = password {
            conn.call(&[&b"AUTH"[..], pw.as_bytes()])?;
        }
        Ok(conn)
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

    /// Sets the timeout of later calls.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
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
    pub fn send<R: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, reqs: &[R]) -> Result<()> {
        let mut out = BytesMut::new();
        for r in reqs {
            encode_request(r.as_ref(), &mut out);
        }
        self.stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| self.io(e))?;
        self.stream.write_all(&out).map_err(|e| self.io(e))
    }

    /// Reads the replies of `n` requests sent before, in order, within the
    /// call timeout. Error replies are returned as [`Reply::Error`].
    pub fn receive(&mut self, n: usize) -> Result<Vec<Reply>> {
        let deadline = Instant::now() + self.timeout;
        let mut replies = Vec::with_capacity(n);
        while replies.len() < n {
            replies.push(self.read_reply(deadline)?);
        }
        Ok(replies)
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
            if !self.rbuf.is_empty() {
                let buf: Bytes = self.rbuf.split().freeze();
                let parsed = decode_reply(&buf).map_err(|source| ClientError::Protocol {
                    node: self.node.clone(),
                    source,
                })?;
                match parsed {
                    Some((reply, used)) => {
                        // Pipelined replies that arrived together stay buffered.
                        self.rbuf.extend_from_slice(&buf[used..]);
                        return Ok(reply);
                    }
                    // Incomplete: take the buffer back, without a copy when
                    // nothing else holds it.
                    None => {
                        self.rbuf = buf
                            .try_into_mut()
                            .unwrap_or_else(|b| BytesMut::from(&b[..]));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.timed_out());
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.io(e))?;
            match self.stream.read(&mut self.scratch) {
                Ok(0) => return Err(self.io(ErrorKind::UnexpectedEof.into())),
                Ok(n) => self.rbuf.extend_from_slice(&self.scratch[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timed_out());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
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
