//! A small fixed pool of I/O threads used to overlap device operations
//! (striped large writes, batched reads).
//!
//! Jobs own everything they touch (`'static`), so no borrowed caller memory
//! ever crosses a thread boundary: callers copy data into owned buffers. Each
//! job reports through its own one-shot channel; a job that panics drops its
//! sender, which its waiter sees as an error instead of hanging.

use std::panic::{self, AssertUnwindSafe};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::error::{FlashError, Result};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Fixed set of worker threads consuming a shared job queue.
pub(crate) struct IoPool {
    /// Job queue; `None` only while dropping (closing it stops the workers).
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

/// Handle to the result of one submitted job.
pub(crate) struct Pending<T> {
    rx: Receiver<T>,
}

impl<T> Pending<T> {
    /// Blocks until the job has run and returns its result.
    pub(crate) fn wait(self) -> Result<T> {
        self.rx.recv().map_err(|_| {
            FlashError::Io(std::io::Error::other(
                "I/O worker failed before completing the request",
            ))
        })
    }
}

impl IoPool {
    /// Starts `threads` workers named `{name}-{i}`.
    pub(crate) fn new(name: &str, threads: usize) -> Result<IoPool> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    // Runs until the queue is closed (the pool is dropped).
                    for job in rx.iter() {
                        // A panicking job only drops its result sender; the worker survives.
                        let _ = panic::catch_unwind(AssertUnwindSafe(job));
                    }
                })?;
            workers.push(handle);
        }
        Ok(IoPool {
            tx: Some(tx),
            workers,
        })
    }

    /// Queues `f` and returns a handle to wait for its result.
    pub(crate) fn submit<T, F>(&self, f: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (result_tx, rx) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move || {
            // The waiter may have gone away; nothing to do then.
            let _ = result_tx.send(f());
        });
        if let Some(tx) = &self.tx {
            // Sending fails only if every worker is gone; the job (and its
            // result sender) is then dropped and `wait` reports an error.
            let _ = tx.send(job);
        }
        Pending { rx }
    }

    /// Runs all jobs on the pool, waits for every one, and returns their
    /// results in submission order, or the first error in that order.
    pub(crate) fn run_all<T, F>(&self, jobs: impl IntoIterator<Item = F>) -> Result<Vec<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let pending: Vec<Pending<Result<T>>> = jobs.into_iter().map(|f| self.submit(f)).collect();
        // Wait for all jobs before reporting, so no job outlives the call.
        let results: Vec<Result<T>> = pending
            .into_iter()
            .map(|p| p.wait().and_then(|r| r))
            .collect();
        results.into_iter().collect()
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoPool")
            .field("threads", &self.workers.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_all_returns_results_in_order() {
        let pool = IoPool::new("test-io", 3).unwrap();
        let out = pool.run_all((0..20u32).map(|i| move || Ok(i * 2))).unwrap();
        assert_eq!(out, (0..20u32).map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn run_all_reports_first_error_in_order() {
        let pool = IoPool::new("test-io", 2).unwrap();
        let jobs = (0..6u32).map(|i| {
            move || {
                if i >= 3 {
                    Err(FlashError::InvalidArgument(format!("job {i}")))
                } else {
                    Ok(i)
                }
            }
        });
        match pool.run_all(jobs) {
            Err(FlashError::InvalidArgument(m)) => assert_eq!(m, "job 3"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn panicking_job_reports_error_and_pool_survives() {
        let pool = IoPool::new("test-io", 1).unwrap();
        let p = pool.submit(|| -> u32 { panic!("boom") });
        assert!(matches!(p.wait(), Err(FlashError::Io(_))));
        assert_eq!(pool.submit(|| 5u32).wait().unwrap(), 5);
    }
}
