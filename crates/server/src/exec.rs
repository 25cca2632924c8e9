//! The executor pool: a fixed set of threads taking jobs from one lock-free
//! (crossbeam) queue. Engine calls block on device reads and group-commit
//! syncs, so they run here and never on the network thread. A job that
//! panics is caught and its result channel dropped; the thread lives on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};
use parking_lot::Mutex;

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
                            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                                tracing::error!("an executor job panicked");
                            }
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

/// The node's two pools: writes (a few threads; under `sync` durability
/// enough to fill group commits) and reads (many threads: each waits for the
/// device, so their number is the device queue depth). A job goes to the
/// write pool if it holds any write, so one connection's batch keeps its order.
pub struct Pools {
    reads: Executor,
    writes: Executor,
}

impl Pools {
    /// Starts both pools.
    pub fn start(read_threads: usize, write_threads: usize) -> std::io::Result<Pools> {
        Ok(Pools {
            reads: Executor::start_named("ls-read", read_threads)?,
            writes: Executor::start_named("ls-exec", write_threads)?,
        })
    }

    /// Queues a job on the write pool (`writes`) or the read pool.
    pub fn submit(&self, job: Job, writes: bool) -> Result<(), Stopped> {
        if writes {
            self.writes.submit(job)
        } else {
            self.reads.submit(job)
        }
    }

    /// Stops both pools, letting queued jobs finish.
    pub fn shutdown(&self) {
        self.reads.shutdown();
        self.writes.shutdown();
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
