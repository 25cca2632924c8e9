//! The executor pools: fixed sets of threads taking work from lock-free
//! (crossbeam) queues. Engine calls block on device reads and group-commit
//! syncs, so they run here and never on the network thread. A job that
//! panics is caught and its result channel dropped; the thread lives on.
//!
//! Workers also merge work of different connections that waits in the
//! queue together: runs of plain GETs become one multi-get (their values
//! are read in one io_uring submission), runs of plain SETs one atomic
//! write batch (one log append, one sync under `sync` durability). One
//! worker wake-up then serves many clients.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use protocol::Reply;
use tokio::sync::oneshot;

use crate::cmd::Cmd;
use crate::data::CallTime;
use crate::state::NodeState;

/// Keys a read worker gathers from waiting GET runs into one multi-get.
const MAX_MERGED_GETS: usize = 128;
/// SETs a write worker gathers from waiting SET runs into one batch, and
/// their largest total size (keys and values).
const MAX_MERGED_SETS: usize = 256;
const MAX_MERGED_SET_BYTES: usize = 4 << 20;

/// A unit of work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Replies of one engine batch with their engine times, how long it
/// waited in the queue, when it finished (for the hand-back time), and
/// the commands it left for later: a batch is answered as far as its
/// replies fit the reply budget (see [`crate::data::REPLY_BUDGET`]).
pub type BatchResult = (
    Vec<(Reply, CallTime)>,
    Duration,
    Instant,
    Vec<(Cmd, Vec<Bytes>)>,
);

/// One connection's pipelined run of engine commands that a worker may
/// merge with other connections' runs of the same kind: all plain
/// `GET key` ([`Pools::submit_gets`]) or all plain `SET key value`
/// ([`Pools::submit_sets`]).
pub struct Run {
    /// The node (every run of a merged group has the same one).
    pub state: Arc<NodeState>,
    /// The commands, in request order.
    pub cmds: Vec<(Cmd, Vec<Bytes>)>,
    /// When it was queued.
    pub submitted: Instant,
    /// Where its replies go.
    pub reply: oneshot::Sender<BatchResult>,
}

impl Run {
    /// Bytes of its arguments (for the merge size limit).
    fn bytes(&self) -> usize {
        self.cmds
            .iter()
            .map(|(_, args)| args.iter().map(|a| a.len()).sum::<usize>())
            .sum()
    }
}

/// Work for a pool.
enum Work {
    Job(Job),
    Gets(Run),
    Sets(Run),
}

/// The pool was shut down; the job was not queued.
#[derive(Debug, thiserror::Error)]
#[error("executor pool is stopped")]
pub struct Stopped;

/// A fixed pool of executor threads sharing one queue.
struct Pool {
    tx: Mutex<Option<Sender<Work>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// Starts `n` threads named `<name>-<i>`.
    fn start(name: &str, n: usize) -> std::io::Result<Pool> {
        let (tx, rx) = unbounded::<Work>();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || worker(&rx))?,
            );
        }
        Ok(Pool {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    fn send(&self, work: Work) -> Result<(), Stopped> {
        match self.tx.lock().as_ref() {
            Some(tx) => tx.send(work).map_err(|_| Stopped),
            None => Err(Stopped),
        }
    }

    /// Stops taking work, lets queued work finish and joins the threads.
    fn shutdown(&self) {
        self.tx.lock().take();
        for t in std::mem::take(&mut *self.threads.lock()) {
            let _ = t.join();
        }
    }
}

/// The node's two pools: writes (a few threads; under `sync` durability
/// enough to fill group commits) and reads (each thread keeps a batch of
/// device reads in flight). A job goes to the write pool if it holds any
/// write, so one connection's batch keeps its order.
pub struct Pools {
    reads: Pool,
    writes: Pool,
}

impl Pools {
    /// Starts both pools.
    pub fn start(read_threads: usize, write_threads: usize) -> std::io::Result<Pools> {
        Ok(Pools {
            reads: Pool::start("ls-read", read_threads)?,
            writes: Pool::start("ls-exec", write_threads)?,
        })
    }

    /// Queues a job on the write pool (`writes`) or the read pool.
    pub fn submit(&self, job: Job, writes: bool) -> Result<(), Stopped> {
        let pool = if writes { &self.writes } else { &self.reads };
        pool.send(Work::Job(job))
    }

    /// Queues a run of plain GETs on the read pool.
    pub fn submit_gets(&self, run: Run) -> Result<(), Stopped> {
        self.reads.send(Work::Gets(run))
    }

    /// Queues a run of plain SETs on the write pool.
    pub fn submit_sets(&self, run: Run) -> Result<(), Stopped> {
        self.writes.send(Work::Sets(run))
    }

    /// Stops both pools, letting queued work finish.
    pub fn shutdown(&self) {
        self.reads.shutdown();
        self.writes.shutdown();
    }
}

/// A worker: runs jobs; for a mergeable run, first gathers the runs of the
/// same kind already waiting behind it, within the merge limits.
fn worker(rx: &Receiver<Work>) {
    let mut next: Option<Work> = None;
    loop {
        let work = match next.take() {
            Some(w) => w,
            None => match rx.recv() {
                Ok(w) => w,
                Err(_) => return,
            },
        };
        match work {
            Work::Job(job) => run_caught(job),
            Work::Gets(first) => {
                let take = |w| match w {
                    Work::Gets(run) => Ok(run),
                    other => Err(other),
                };
                let group;
                (group, next) = gather(rx, first, MAX_MERGED_GETS, usize::MAX, take);
                run_caught(Box::new(move || crate::data::execute_gets(group)));
            }
            Work::Sets(first) => {
                let take = |w| match w {
                    Work::Sets(run) => Ok(run),
                    other => Err(other),
                };
                let group;
                (group, next) = gather(rx, first, MAX_MERGED_SETS, MAX_MERGED_SET_BYTES, take);
                run_caught(Box::new(move || crate::data::execute_sets(group)));
            }
        }
    }
}

/// Takes from the queue, without waiting, the runs `take` accepts until
/// the group holds `max_cmds` commands or `max_bytes` bytes. Returns the
/// group and the first item of another kind, which ends the gathering.
fn gather(
    rx: &Receiver<Work>,
    first: Run,
    max_cmds: usize,
    max_bytes: usize,
    take: impl Fn(Work) -> Result<Run, Work>,
) -> (Vec<Run>, Option<Work>) {
    let (mut cmds, mut bytes) = (first.cmds.len(), first.bytes());
    let mut group = vec![first];
    while cmds < max_cmds && bytes < max_bytes {
        let Ok(work) = rx.try_recv() else { break };
        match take(work) {
            Ok(run) => {
                cmds += run.cmds.len();
                bytes += run.bytes();
                group.push(run);
            }
            Err(other) => return (group, Some(other)),
        }
    }
    (group, None)
}

fn run_caught(job: Job) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        tracing::error!("an executor job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_jobs_survives_panics_and_drains_on_shutdown() {
        let pools = Pools::start(2, 2).unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        pools.submit(Box::new(|| panic!("boom")), false).unwrap();
        pools.submit(Box::new(|| panic!("boom")), true).unwrap();
        for i in 0..100 {
            let n = n.clone();
            pools
                .submit(
                    Box::new(move || {
                        n.fetch_add(1, Ordering::SeqCst);
                    }),
                    i % 2 == 0,
                )
                .unwrap();
        }
        pools.shutdown();
        assert_eq!(n.load(Ordering::SeqCst), 100);
        assert!(pools.submit(Box::new(|| {}), false).is_err());
        assert!(pools.submit(Box::new(|| {}), true).is_err());
    }
}
