//! The executor pools: fixed sets of threads taking jobs from lock-free
//! (crossbeam) queues. Engine calls block on device reads and group-commit
//! syncs, so they run here and never on the network thread. A job that
//! panics is caught and its result channel dropped; the thread lives on.
//!
//! Read workers also merge work: batches of plain GETs from different
//! connections that wait in the queue together are served by one
//! multi-get, so their values are read in one io_uring submission and one
//! worker wake-up serves many clients.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use protocol::Reply;
use tokio::sync::oneshot;

use crate::data::CallTime;
use crate::state::NodeState;

/// Keys a read worker gathers from waiting GET batches into one multi-get.
const MAX_MERGED_KEYS: usize = 128;

/// A unit of work.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool was shut down; the job was not queued.
#[derive(Debug, thiserror::Error)]
#[error("executor pool is stopped")]
pub struct Stopped;

/// A fixed pool of executor threads.
pub struct Executor {
    tx: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Executor {
    /// Starts `n` threads named `<name>-<i>`.
    pub fn start_named(name: &str, n: usize) -> std::io::Result<Executor> {
        let (tx, rx) = unbounded::<Job>();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            run_caught(job);
                        }
                    })?,
            );
        }
        Ok(Executor {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) -> Result<(), Stopped> {
        match self.tx.lock().as_ref() {
            Some(tx) => tx.send(job).map_err(|_| Stopped),
            None => Err(Stopped),
        }
    }

    /// Stops taking jobs, lets queued ones finish and joins the threads.
    pub fn shutdown(&self) {
        self.tx.lock().take();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Replies of one engine batch with their engine times, how long it
/// waited in the queue, and when it finished (for the hand-back time).
pub type BatchResult = (Vec<(Reply, CallTime)>, Duration, Instant);

/// One connection's pipelined run of plain `GET key`s.
pub struct GetBatch {
    /// The node (every batch of a merged group has the same one).
    pub state: Arc<NodeState>,
    /// The keys, in request order.
    pub keys: Vec<Bytes>,
    /// When it was queued.
    pub submitted: Instant,
    /// Where its replies go.
    pub reply: oneshot::Sender<BatchResult>,
}

/// Work for the read pool.
enum ReadWork {
    Job(Job),
    Gets(GetBatch),
}

/// The node's two pools: writes (a few threads; under `sync` durability
/// enough to fill group commits) and reads (each thread keeps a batch of
/// device reads in flight). A job goes to the write pool if it holds any
/// write, so one connection's batch keeps its order.
pub struct Pools {
    reads: Mutex<Option<Sender<ReadWork>>>,
    read_threads: Mutex<Vec<JoinHandle<()>>>,
    writes: Executor,
}

impl Pools {
    /// Starts both pools.
    pub fn start(read_threads: usize, write_threads: usize) -> std::io::Result<Pools> {
        let (tx, rx) = unbounded::<ReadWork>();
        let mut threads = Vec::with_capacity(read_threads);
        for i in 0..read_threads {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ls-read-{i}"))
                    .spawn(move || read_worker(&rx))?,
            );
        }
        Ok(Pools {
            reads: Mutex::new(Some(tx)),
            read_threads: Mutex::new(threads),
            writes: Executor::start_named("ls-exec", write_threads)?,
        })
    }

    /// Queues a job on the write pool (`writes`) or the read pool.
    pub fn submit(&self, job: Job, writes: bool) -> Result<(), Stopped> {
        if writes {
            self.writes.submit(job)
        } else {
            self.send_read(ReadWork::Job(job))
        }
    }

    /// Queues a run of plain GETs on the read pool.
    pub fn submit_gets(&self, batch: GetBatch) -> Result<(), Stopped> {
        self.send_read(ReadWork::Gets(batch))
    }

    fn send_read(&self, work: ReadWork) -> Result<(), Stopped> {
        match self.reads.lock().as_ref() {
            Some(tx) => tx.send(work).map_err(|_| Stopped),
            None => Err(Stopped),
        }
    }

    /// Stops both pools, letting queued jobs finish.
    pub fn shutdown(&self) {
        self.reads.lock().take();
        for t in std::mem::take(&mut *self.read_threads.lock()) {
            let _ = t.join();
        }
        self.writes.shutdown();
    }
}

/// A read worker: runs jobs; for GET batches, first gathers the GET
/// batches already waiting behind it (up to [`MAX_MERGED_KEYS`] keys).
fn read_worker(rx: &Receiver<ReadWork>) {
    let mut after: Option<Job> = None;
    loop {
        let work = match after.take() {
            Some(job) => ReadWork::Job(job),
            None => match rx.recv() {
                Ok(w) => w,
                Err(_) => return,
            },
        };
        match work {
            ReadWork::Job(job) => run_caught(job),
            ReadWork::Gets(first) => {
                let mut keys = first.keys.len();
                let mut group = vec![first];
                while keys < MAX_MERGED_KEYS {
                    match rx.try_recv() {
                        Ok(ReadWork::Gets(g)) => {
                            keys += g.keys.len();
                            group.push(g);
                        }
                        Ok(ReadWork::Job(job)) => {
                            after = Some(job);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                run_caught(Box::new(move || crate::data::execute_gets(group)));
            }
        }
    }
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
    use std::sync::Arc;

    #[test]
    fn runs_jobs_survives_panics_and_drains_on_shutdown() {
        let ex = Executor::start_named("test", 2).unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        ex.submit(Box::new(|| panic!("boom"))).unwrap();
        for _ in 0..100 {
            let n = n.clone();
            ex.submit(Box::new(move || {
                n.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap();
        }
        ex.shutdown();
        assert_eq!(n.load(Ordering::SeqCst), 100);
        assert!(ex.submit(Box::new(|| {})).is_err());
    }
}
