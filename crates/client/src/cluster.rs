//! The cluster handle: nodes with connection pools and health, the ring,
//! the write-version clock, and fan-out of calls to several nodes at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use protocol::versioned::Versioned;
use protocol::Reply;

use crate::config::ClusterConfig;
use crate::conn::Conn;
use crate::error::{ClientError, Result};
use crate::ring::Ring;

/// A node's replies with the run of the node that sent them (`runs.rs`).
pub(crate) type RunReplies = (u64, Vec<Reply>);

/// Per-node outcomes with the runs dropped.
fn without_runs(results: Vec<(usize, Result<RunReplies>)>) -> Vec<(usize, Result<Vec<Reply>>)> {
    results
        .into_iter()
        .map(|(node, r)| (node, r.map(|(_, replies)| replies)))
        .collect()
}

/// Idle connections kept per node.
const MAX_IDLE: usize = 64;
/// A pooled connection idle this long is checked before use (see
/// [`Conn::closed_while_idle`]): its node may have restarted meanwhile.
/// The check is one non-blocking `recv`; a connection back-to-back calls
/// reuse skips it. The window must be shorter than a node can be killed
/// and started again (spawn, open the device, recover, listen), or the
/// first call after a quick restart fails on the dead connection: a
/// 10 ms window was not (CI saw a restart within it).
const CHECK_IDLE_AFTER: Duration = Duration::from_micros(500);
/// One node of the cluster as this client sees it.
pub(crate) struct NodeHandle {
    pub(crate) addr: String,
    /// Idle connections, each with when it was returned.
    pool: Mutex<Vec<(Conn, Instant)>>,
    /// The node's runs as this client saw them (`runs.rs`).
    pub(crate) runs: Mutex<crate::runs::RunLedger>,
    up: AtomicBool,
}

pub(crate) struct Inner {
    pub(crate) config: ClusterConfig,
    pub(crate) nodes: Vec<NodeHandle>,
    pub(crate) ring: Ring,
    pub(crate) replicas: usize,
    clock: AtomicU64,
    /// This client's id in the low bits of its versions (see `version.rs`).
    client_id: u16,
    /// Copies written back by read repair (see `read.rs`).
    pub(crate) read_repairs: AtomicU64,
    /// The losses [`Cluster::sync`] has reported (`runs.rs`).
    pub(crate) losses_reported: crate::runs::WriterLosses,
}

/// A client of a LightStore cluster. Cheap to share between threads
/// (`&Cluster` is enough); dropping it stops its background health checks.
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
    _stop_health: mpsc::Sender<()>,
}

impl Cluster {
    /// Builds the client. It does not need any node to be up: nodes that do
    /// not answer are marked down when first used and retried in the
    /// background.
    pub fn connect(config: ClusterConfig) -> Result<Cluster> {
        config.validate()?;
        let ring = Ring::new(&config.nodes);
        let nodes = config
            .nodes
            .iter()
            .map(|addr| NodeHandle {
                addr: addr.clone(),
                pool: Mutex::new(Vec::new()),
                runs: Mutex::new(Default::default()),
                up: AtomicBool::new(true),
            })
            .collect();
        let inner = Arc::new(Inner {
            replicas: config.replica_count(),
            config,
            nodes,
            ring,
            clock: AtomicU64::new(0),
            client_id: crate::version::random_client_id(),
            read_repairs: AtomicU64::new(0),
            losses_reported: Default::default(),
        });
        let (stop, stopped) = mpsc::channel();
        let weak = Arc::downgrade(&inner);
        let every = Duration::from_millis(inner.config.retry_interval_ms.max(10));
        std::thread::Builder::new()
            .name("ls-health".into())
            .spawn(move || loop {
                match stopped.recv_timeout(every) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                match weak.upgrade() {
                    Some(inner) => inner.retry_down_nodes(),
                    None => return,
                }
            })
            .map_err(|e| ClientError::Config(format!("cannot start health thread: {e}")))?;
        Ok(Cluster {
            inner,
            _stop_health: stop,
        })
    }

    /// The node addresses, in configuration order (node indexes refer to it).
    pub fn nodes(&self) -> Vec<String> {
        self.inner.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// Copies kept of each key.
    pub fn replica_count(&self) -> usize {
        self.inner.replicas
    }

    /// Indexes of the nodes holding `key`, primary first.
    pub fn replicas_of(&self, key: &[u8]) -> Vec<usize> {
        self.inner.ring.replicas(key, self.inner.replicas)
    }

    /// Whether node `i` is currently considered up.
    pub fn is_up(&self, i: usize) -> bool {
        self.inner.nodes[i].up.load(Ordering::Acquire)
    }

    /// Sends one command to node `i` (for tools: status, tests).
    pub fn call_node<A: AsRef<[u8]>>(&self, i: usize, args: &[A]) -> Result<Reply> {
        self.inner.with_conn(i, |c| c.call(args))
    }

    /// Checks every node now (instead of waiting for the background retry)
    /// and returns which are up.
    pub fn check_nodes(&self) -> Vec<bool> {
        (0..self.inner.nodes.len())
            .map(|i| self.inner.with_conn(i, |c| c.call(&[&b"PING"[..]])).is_ok())
            .collect()
    }
}

impl Inner {
    /// Runs `f` on a pooled connection to node `i`. A node failure marks the
    /// node down and drops the connection.
    pub(crate) fn with_conn<T>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.checkout(i)?;
        let r = f(&mut conn);
        self.checkin(i, conn, r.as_ref().err());
        r
    }

    /// A pooled connection to node `i`, or a new one (a failure to connect
    /// marks the node down).
    fn checkout(&self, i: usize) -> Result<Conn> {
        loop {
            let pooled = self.nodes[i].pool.lock().pop();
            let Some((mut conn, idle_since)) = pooled else {
                return self.open(i).inspect_err(|e| self.mark_down(i, e));
            };
            // A connection to a node that restarted while it sat idle would
            // fail its first call, and fail it for the caller though the
            // node is up: it is dropped and the next one taken.
            if idle_since.elapsed() < CHECK_IDLE_AFTER || !conn.closed_while_idle() {
                return Ok(conn);
            }
        }
    }

    /// Returns `conn` to node `i`'s pool after a call that ended with
    /// `failure` (`None`: success): a node failure drops it and marks the
    /// node down.
    fn checkin(&self, i: usize, conn: Conn, failure: Option<&ClientError>) {
        match failure {
            None => {
                self.mark_up(i);
                let mut pool = self.nodes[i].pool.lock();
                if pool.len() < MAX_IDLE {
                    pool.push((conn, Instant::now()));
                }
            }
            Some(e) if e.is_node_failure() => self.mark_down(i, e),
            Some(_) => self.nodes[i].pool.lock().push((conn, Instant::now())),
        }
    }

    /// Sends every node its requests, all of them before any reply is
    /// read, then reads each node's replies in turn: the nodes work in
    /// parallel without a thread per node. Per node, in job order, its
    /// replies (error replies as [`Reply::Error`]) or the failure that
    /// ended its connection (which marks the node down). Connections are
    /// opened one after another: a node that must be connected to afresh
    /// and does not answer delays the others by up to the connect timeout
    /// (pooled connections, and refused connects, do not wait).
    pub(crate) fn pipeline_all<R: AsRef<[A]>, A: AsRef<[u8]>>(
        &self,
        jobs: &[(usize, Vec<R>)],
    ) -> Vec<(usize, Result<Vec<Reply>>)> {
        without_runs(self.pipeline_all_runs(jobs))
    }

    /// [`Inner::pipeline_all`], each node's replies with the run of the
    /// node that sent them (`runs.rs`).
    pub(crate) fn pipeline_all_runs<R: AsRef<[A]>, A: AsRef<[u8]>>(
        &self,
        jobs: &[(usize, Vec<R>)],
    ) -> Vec<(usize, Result<RunReplies>)> {
        let sent: Vec<Result<Conn>> = jobs
            .iter()
            .map(|(node, reqs)| {
                let mut conn = self.checkout(*node)?;
                match conn.send(reqs) {
                    Ok(()) => Ok(conn),
                    Err(e) => {
                        self.checkin(*node, conn, Some(&e));
                        Err(e)
                    }
                }
            })
            .collect();
        jobs.iter()
            .zip(sent)
            .map(|((node, reqs), conn)| {
                let replies = conn.and_then(|mut c| {
                    let run = c.run;
                    let r = c.receive(reqs.len());
                    self.checkin(*node, c, r.as_ref().err());
                    r.map(|replies| (run, replies))
                });
                (*node, replies)
            })
            .collect()
    }

    /// [`Inner::pipeline_all`] where an error reply fails its node's
    /// outcome ([`ClientError::Server`]).
    pub(crate) fn pipeline_all_checked<R: AsRef<[A]>, A: AsRef<[u8]>>(
        &self,
        jobs: &[(usize, Vec<R>)],
    ) -> Vec<(usize, Result<Vec<Reply>>)> {
        without_runs(self.pipeline_all_checked_runs(jobs))
    }

    /// [`Inner::pipeline_all_checked`] with each node's run, as
    /// [`Inner::pipeline_all_runs`].
    pub(crate) fn pipeline_all_checked_runs<R: AsRef<[A]>, A: AsRef<[u8]>>(
        &self,
        jobs: &[(usize, Vec<R>)],
    ) -> Vec<(usize, Result<RunReplies>)> {
        self.pipeline_all_runs(jobs)
            .into_iter()
            .map(|(node, r)| {
                let checked = r.and_then(|(run, replies)| {
                    replies
                        .into_iter()
                        .map(|reply| match reply {
                            Reply::Error(message) => Err(self.server_error(node, message)),
                            other => Ok(other),
                        })
                        .collect::<Result<Vec<_>>>()
                        .map(|replies| (run, replies))
                });
                (node, checked)
            })
            .collect()
    }

    /// Node `node`'s error reply `message` as an error.
    pub(crate) fn server_error(&self, node: usize, message: String) -> ClientError {
        ClientError::Server {
            node: self.nodes[node].addr.clone(),
            message,
        }
    }

    fn open(&self, i: usize) -> Result<Conn> {
        let mut c = Conn::open(
            &self.nodes[i].addr,
            self.config.connect_timeout(),
            self.config.password.as_deref(),
        )?;
        // A connection is used with the call timeout from here on, and
        // waits longer on a node that is busy but alive.
        c.set_timeout(self.config.timeout());
        c.set_busy_limit(self.config.busy_limit());
        // Which run of the node it reaches, before any use (`runs.rs`); a
        // node that does not know RUNID is not tracked.
        match c.call(&[&b"RUNID"[..]]) {
            Ok(Reply::Array(ids)) => {
                if let [Reply::Integer(run), Reply::Integer(from), Reply::Integer(to)] = ids[..] {
                    let id = |n: i64| u64::try_from(n).unwrap_or(0);
                    c.run = id(run);
                    self.nodes[i]
                        .runs
                        .lock()
                        .connected(c.run, (id(from), id(to)));
                    // Serving, and its run in the ledger: up from now, not
                    // only once the call this connection was opened for
                    // returns (a sync in between found every node down and
                    // failed where it should have reported what the
                    // restart lost). Other answers wait for that call.
                    self.mark_up(i);
                }
            }
            Err(e) if e.is_node_failure() => return Err(e),
            _ => {}
        }
        // A node on this machine reads values from the process's shared
        // memory (`crate::shm`).
        if crate::conn::unix_path(&self.nodes[i].addr).is_some() {
            c.attach_shared(crate::shm::Arena::global())?;
        }
        Ok(c)
    }

    fn mark_down(&self, i: usize, why: &ClientError) {
        let node = &self.nodes[i];
        if node.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(node = %node.addr, error = %why, "node marked down");
        }
        node.pool.lock().clear();
    }

    fn mark_up(&self, i: usize) {
        let node = &self.nodes[i];
        if !node.up.swap(true, Ordering::AcqRel) {
            tracing::info!(node = %node.addr, "node is up again");
        }
    }

    pub(crate) fn is_up(&self, i: usize) -> bool {
        self.nodes[i].up.load(Ordering::Acquire)
    }

    /// Asks every node marked down whether it is back (a `PING`), marking
    /// up those that answer.
    pub(crate) fn retry_down_nodes(&self) {
        for i in 0..self.nodes.len() {
            if self.is_up(i) {
                continue;
            }
            // A node that answers is marked up by `with_conn`.
            let _ = self.with_conn(i, |c| c.call(&[&b"PING"[..]]));
        }
    }

    /// A new write version (see `version.rs`): the time in microseconds
    /// with this client's id in the low bits, strictly increasing within
    /// this client. Clients on different machines rely on their clocks
    /// being in sync for "last writer wins".
    pub(crate) fn next_version(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let mut last = self.clock.load(Ordering::Relaxed);
        loop {
            let next = crate::version::next_version(last, now, self.client_id);
            match self
                .clock
                .compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// A new write version greater than `floor` as well (a compare-and-set
    /// must write a version newer than the one it expects).
    pub(crate) fn next_version_after(&self, floor: u64) -> u64 {
        self.clock.fetch_max(floor, Ordering::AcqRel);
        self.next_version()
    }

    /// The replicas of a key in the order reads should try them: those up
    /// first (primary first), then those marked down as a last resort.
    pub(crate) fn read_order(&self, key: &[u8]) -> Vec<usize> {
        let mut r = self.ring.replicas(key, self.replicas);
        r.sort_by_key(|&i| !self.is_up(i));
        r
    }

    /// Runs `f(node, job)` for every job, jobs for different nodes in
    /// parallel (one scoped thread per job beyond the first). Results come
    /// back in job order.
    pub(crate) fn fan_out<J: Send, T: Send>(
        &self,
        jobs: Vec<(usize, J)>,
        f: impl Fn(usize, J) -> Result<T> + Sync,
    ) -> Vec<(usize, Result<T>)> {
        if jobs.len() <= 1 {
            return jobs.into_iter().map(|(i, j)| (i, f(i, j))).collect();
        }
        std::thread::scope(|s| {
            let mut jobs = jobs.into_iter();
            let first = jobs.next();
            let f = &f;
            let handles: Vec<_> = jobs.map(|(i, j)| (i, s.spawn(move || f(i, j)))).collect();
            let mut out = Vec::with_capacity(handles.len() + 1);
            if let Some((i, j)) = first {
                out.push((i, f(i, j)));
            }
            for (i, h) in handles {
                let r = h.join().unwrap_or_else(|_| {
                    Err(ClientError::Unavailable("a fan-out thread panicked".into()))
                });
                out.push((i, r));
            }
            out
        })
    }
}

/// Writes stored copies (`key`, versioned bytes) with VSET/VDEL at the
/// versions they carry, in one round trip.
pub(crate) fn send_stored(c: &mut Conn, copies: &[(Bytes, Bytes)]) -> Result<()> {
    c.pipeline_checked(&stored_requests(copies))
}

/// The `VSET` and `VDEL` requests that write stored copies (`key`,
/// versioned bytes) at the versions they carry.
pub(crate) fn stored_requests(copies: &[(Bytes, Bytes)]) -> Vec<Vec<Bytes>> {
    let mut vset: Vec<Bytes> = vec![Bytes::from_static(b"VSET")];
    let mut vdel: Vec<Bytes> = vec![Bytes::from_static(b"VDEL")];
    for (key, stored) in copies {
        let v = Versioned::decode(stored.clone());
        let version = Bytes::from(v.version.to_string());
        match v.value {
            Some(value) => vset.extend([key.clone(), version, value]),
            None => vdel.extend([key.clone(), version]),
        }
    }
    [vset, vdel].into_iter().filter(|r| r.len() > 1).collect()
}
