//! Write-behind of metadata changes: a mount acknowledges a metadata
//! change once its caches hold it and queues the change; one thread writes
//! queued changes in order, several per atomic batch, never splitting one.
//! So after a crash the store holds a prefix of the acknowledged changes,
//! each whole (like ext4's ordered mode); `fsync`, `fsyncdir`, `syncfs` and
//! unmount wait for the queue ([`WriteBehind::settle`]), and so does every
//! read of metadata from the store, so nothing reads around the queue.
//!
//! Each batch is written durably (`Store::write_atomic_durable`: the
//! replicas sync it before they answer, whatever their `--durability`).
//! Otherwise a node that crashed and came back could lose a batch it had
//! acknowledged while the mount, which keeps serving from its caches, went
//! on writing changes that rest on it: a directory's link count counting a
//! subdirectory whose entry was lost. The cost is one device sync per
//! batch, and batches gather many changes.
//!
//! A batch that fails is retried until it lands; meanwhile waiters get the
//! error (EIO for `fsync`), and the caches keep serving what was
//! acknowledged. A waiter that arrives while batches are failing has the
//! writer try again at once and fails only if that try fails too, so the
//! mount answers as soon as its nodes are back, not after the backoff.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use client::Store;
use parking_lot::{Condvar, Mutex};

use crate::error::{Errno, FsError, Result};

/// Whether the writer may write now (the mount's lease, see
/// `FileSystem::write_permit`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Permit {
    Write,
    /// Not now (a lease renewal is late): the changes wait, unwritten and
    /// kept, and the writer asks again.
    Wait,
    /// Never (the lease was taken over): the changes are dropped, not
    /// written next to the new owner's.
    Never,
}

/// One change: its keys' new values (`None`: delete), applied together.
pub(crate) type Change = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// `change` as the store's write operations.
pub(crate) fn write_ops(change: &Change) -> Vec<client::WriteOp<'_>> {
    change.iter().map(|(k, v)| (&k[..], v.as_deref())).collect()
}

/// Most bytes of changes merged into one batch (a change larger than this
/// goes alone).
const BATCH_BYTES: usize = 4 << 20;
/// How long the writer lets changes gather once the first is queued,
/// unless [`GATHER_CHANGES`] are queued sooner or someone waits for them
/// ([`WriteBehind::settle`]). Written as they came, a burst of creates went
/// out one change per batch, and the node's work per batch was most of the
/// cost of a create on two cores. (After a crash of the mount the store
/// holds a prefix of the acknowledged changes, a few milliseconds shorter
/// at most; `fsync` still waits for its changes to be written.)
const GATHER: Duration = Duration::from_millis(2);
const GATHER_CHANGES: usize = 256;

#[derive(Default)]
struct State {
    queue: Vec<Change>,
    /// Changes queued so far, and of those written.
    queued: u64,
    written: u64,
    /// Why the last batch failed, until one succeeds, and the errno its
    /// waiters answer (ENOSPC for a full cluster, else EIO).
    failing: Option<(String, i32)>,
    /// Attempts to write started so far, and the last one that failed (a
    /// waiter fails on an attempt that started after it arrived).
    attempts: u64,
    failed_attempt: u64,
    /// A waiter asks the failing writer to try again now.
    retry_now: bool,
    /// The mount lost its lease: queued changes were dropped, and every
    /// waiter fails.
    lease_lost: bool,
    /// The keys of the changes queued or being written, each with how many
    /// of those changes touch it: a read of other keys need not wait.
    pending: BTreeMap<Vec<u8>, u32>,
    /// Callers of [`WriteBehind::settle`] waiting: the writer does not let
    /// changes gather while there are any.
    waiting: usize,
    stop: bool,
}

/// The queue and its writer.
pub(crate) struct WriteBehind {
    state: Mutex<State>,
    /// Wakes the writer.
    work: Condvar,
    /// Wakes those waiting for changes to be written.
    progress: Condvar,
}

impl WriteBehind {
    pub(crate) fn new() -> Arc<WriteBehind> {
        Arc::new(WriteBehind {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
        })
    }

    /// Queues `change` (call in commit order).
    pub(crate) fn push(&self, change: Change) {
        let mut s = self.state.lock();
        for (key, _) in &change {
            *s.pending.entry(key.clone()).or_insert(0) += 1;
        }
        s.queue.push(change);
        s.queued += 1;
        // The writer waits for a first change, or gathers until enough.
        if s.queue.len() == 1 || s.queue.len() >= GATHER_CHANGES {
            self.work.notify_one();
        }
    }

    /// Returns once every change queued so far is written; fails if the
    /// writer is failing meanwhile.
    pub(crate) fn settle(&self) -> Result<()> {
        let mut s = self.state.lock();
        let target = s.queued;
        let seen = s.attempts;
        s.waiting += 1;
        s.retry_now |= s.failing.is_some();
        self.work.notify_one();
        let outcome = loop {
            let failed = s.lease_lost || s.failed_attempt > seen;
            if let Some((why, errno)) = s.failing.as_ref().filter(|_| failed) {
                tracing::warn!(error = %why, errno, "metadata not yet written: failing a request");
                break Err(FsError::Posix(Errno(*errno)));
            }
            if s.written >= target {
                break Ok(());
            }
            self.progress.wait(&mut s);
        };
        s.waiting -= 1;
        outcome
    }

    /// Returns at once if no change queued or being written touches `keys`
    /// (the store then holds what was acknowledged for them), else as
    /// [`Self::settle`]: a lookup of a file the queue does not touch does
    /// not make the queue write (and wait for it).
    pub(crate) fn settle_keys(&self, keys: &[&[u8]]) -> Result<()> {
        self.settle_if(|pending| keys.iter().any(|k| pending.contains_key(*k)))
    }

    /// [`Self::settle_keys`] for the keys in `[start, end)`.
    pub(crate) fn settle_range(&self, start: &[u8], end: &[u8]) -> Result<()> {
        self.settle_if(|pending| {
            start < end
                && pending
                    .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
                    .next()
                    .is_some()
        })
    }

    fn settle_if(&self, touched: impl Fn(&BTreeMap<Vec<u8>, u32>) -> bool) -> Result<()> {
        {
            let s = self.state.lock();
            if s.failing.is_none() && !touched(&s.pending) {
                return Ok(());
            }
        }
        self.settle()
    }

    /// Writes queued changes until [`WriteBehind::stop`] (after which it
    /// drains the queue and returns). While `may_write` says wait, changes
    /// wait; once it says never (the mount lost its lease) queued changes
    /// are dropped, not written next to the new owner's.
    pub(crate) fn run(&self, store: &dyn Store, may_write: impl Fn() -> Permit) {
        let mut last_logged: Option<(String, std::time::Instant)> = None;
        loop {
            let (changes, upto) = {
                let mut s = self.state.lock();
                while s.queue.is_empty() && !s.stop {
                    self.work.wait(&mut s);
                }
                if s.queue.is_empty() {
                    return;
                }
                let until = std::time::Instant::now() + GATHER;
                while s.queue.len() < GATHER_CHANGES && s.waiting == 0 && !s.stop {
                    if self.work.wait_until(&mut s, until).timed_out() {
                        break;
                    }
                }
                (std::mem::take(&mut s.queue), s.queued)
            };
            let touched: Vec<Vec<u8>> = changes
                .iter()
                .flat_map(|c| c.iter().map(|(k, _)| k.clone()))
                .collect();
            let mut dropped = false;
            for batch in batches(changes) {
                let mut delay = Duration::from_millis(50);
                loop {
                    let attempt = {
                        let mut s = self.state.lock();
                        s.attempts += 1;
                        s.attempts
                    };
                    let outcome = match may_write() {
                        Permit::Never => {
                            tracing::error!(
                                changes = batch.len(),
                                "the mount lost its lease: dropping metadata changes not yet written"
                            );
                            dropped = true;
                            break;
                        }
                        Permit::Wait => Err((
                            "the mount's lease is not confirmed (its nodes do not answer)"
                                .to_string(),
                            libc::EIO,
                        )),
                        Permit::Write => {
                            store.write_atomic_durable(&write_ops(&batch)).map_err(|e| {
                                let e = FsError::from(e);
                                (e.to_string(), e.errno())
                            })
                        }
                    };
                    match outcome {
                        Ok(()) => break,
                        Err(e) => {
                            // Logged when the reason changes, and every 10 s
                            // while it lasts (waiters make the writer retry).
                            let repeat = last_logged.as_ref().is_some_and(
                                |(why, at): &(String, std::time::Instant)| {
                                    *why == e.0 && at.elapsed() < Duration::from_secs(10)
                                },
                            );
                            if !repeat {
                                tracing::error!(error = %e.0, "cannot write metadata changes; retrying");
                                last_logged = Some((e.0.clone(), std::time::Instant::now()));
                            }
                            let mut s = self.state.lock();
                            s.failing = Some(e);
                            s.failed_attempt = attempt;
                            self.progress.notify_all();
                            if !s.retry_now {
                                self.work.wait_for(&mut s, delay);
                            }
                            s.retry_now = false;
                            delay = (delay * 2).min(Duration::from_secs(2));
                        }
                    }
                }
            }
            let mut s = self.state.lock();
            for key in touched {
                if let std::collections::btree_map::Entry::Occupied(mut n) = s.pending.entry(key) {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
            }
            s.written = upto;
            s.lease_lost |= dropped;
            s.failing = s.lease_lost.then(|| {
                (
                    "the mount lost its lease; changes were dropped".to_string(),
                    libc::EIO,
                )
            });
            self.progress.notify_all();
        }
    }

    /// Asks the writer to finish the queue and return.
    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.work.notify_one();
    }
}

/// Consecutive changes merged into batches of about [`BATCH_BYTES`], each
/// with one write per key (the last).
fn batches(changes: Vec<Change>) -> Vec<Change> {
    let mut out = Vec::new();
    let mut batch: Change = Vec::new();
    let mut bytes = 0;
    let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
    for change in changes {
        let size: usize = change
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        if !batch.is_empty() && bytes + size > BATCH_BYTES {
            out.push(std::mem::take(&mut batch));
            at.clear();
            bytes = 0;
        }
        bytes += size;
        for (k, v) in change {
            match at.get(&k) {
                Some(&i) => batch[i].1 = v,
                None => {
                    at.insert(k.clone(), batch.len());
                    batch.push((k, v));
                }
            }
        }
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::MemStore;
    use std::sync::atomic::Ordering;

    /// Runs `f` on a thread; its result if it returns within `wait`.
    fn within<T: Send + 'static>(
        wait: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(wait).ok()
    }

    #[test]
    fn reads_wait_only_for_queued_changes_to_their_keys() {
        let k = |s: &str| s.as_bytes().to_vec();
        let wb = WriteBehind::new();
        // No writer runs yet: the change to "b" stays queued.
        wb.push(vec![(k("b"), Some(k("1")))]);
        let w = wb.clone();
        let other = within(Duration::from_secs(5), move || {
            (
                w.settle_keys(&[b"a", b"c"]).is_ok(),
                w.settle_range(b"c", b"z").is_ok(),
            )
        });
        assert_eq!(other, Some((true, true)), "untouched keys do not wait");
        let w = wb.clone();
        let (tx, done) = crossbeam_channel::bounded(2);
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(w.settle_keys(&[b"b"]).is_ok());
        });
        let w = wb.clone();
        std::thread::spawn(move || {
            let _ = tx2.send(w.settle_range(b"a", b"c").is_ok());
        });
        assert!(
            done.recv_timeout(Duration::from_millis(100)).is_err(),
            "a read of a queued key waits for the writer"
        );
        let store = Arc::new(MemStore::new());
        let (w, st) = (wb.clone(), store.clone());
        let writer = std::thread::spawn(move || w.run(&*st, || Permit::Write));
        for _ in 0..2 {
            assert_eq!(done.recv_timeout(Duration::from_secs(5)), Ok(true));
        }
        assert_eq!(store.get(b"b").ok().flatten().as_deref(), Some(&b"1"[..]));
        wb.stop();
        writer.join().expect("writer");
    }

    #[test]
    fn a_burst_of_changes_goes_out_in_few_batches() {
        let wb = WriteBehind::new();
        let store = Arc::new(MemStore::new());
        let (w, st) = (wb.clone(), store.clone());
        let writer = std::thread::spawn(move || w.run(&*st, || Permit::Write));
        for i in 0..20u32 {
            wb.push(vec![(i.to_be_bytes().to_vec(), Some(vec![1]))]);
            std::thread::sleep(Duration::from_micros(200));
        }
        wb.settle().expect("settle");
        let batches = store.writes.load(Ordering::Relaxed);
        // Written as they came, each change would go alone (20 batches).
        assert!(
            batches <= 10,
            "{batches} batches for a 4 ms burst of 20 changes"
        );
        assert_eq!(store.len(), 20);
        wb.stop();
        writer.join().expect("writer");
    }

    #[test]
    fn a_waiter_has_a_failing_writer_try_again_at_once() {
        let wb = WriteBehind::new();
        let store = Arc::new(MemStore::new());
        store.fail_writes_after(Some(0));
        let (w, st) = (wb.clone(), store.clone());
        let writer = std::thread::spawn(move || w.run(&*st, || Permit::Write));
        wb.push(vec![(b"k".to_vec(), Some(b"v".to_vec()))]);
        // Failed tries back off: 50, 100, 200, 400 ms, then 800 ms.
        std::thread::sleep(Duration::from_millis(900));
        assert!(wb.state.lock().failed_attempt >= 3);
        store.fail_writes_after(None);
        let began = std::time::Instant::now();
        wb.settle()
            .expect("written by the try the waiter asked for");
        assert!(
            began.elapsed() < Duration::from_millis(400),
            "waited {:?}: for the backoff, not a try at once",
            began.elapsed()
        );
        assert_eq!(store.get(b"k").ok().flatten().as_deref(), Some(&b"v"[..]));
        // While the store keeps failing, a waiter gets the error of the
        // try it asked for: EIO, or ENOSPC from a full cluster (an `fsync`
        // on a full node said EIO).
        store.fail_writes_after(Some(0));
        wb.push(vec![(b"k".to_vec(), None)]);
        assert_eq!(wb.settle().map_err(|e| e.errno()).err(), Some(libc::EIO));
        store.fail_writes_after(None);
        store.refuse_writes_as_full(true);
        assert_eq!(wb.settle().map_err(|e| e.errno()).err(), Some(libc::ENOSPC));
        wb.stop();
        store.refuse_writes_as_full(false);
        writer.join().expect("writer");
    }

    #[test]
    fn changes_wait_while_the_lease_is_late_and_are_dropped_once_it_is_lost() {
        use std::sync::atomic::AtomicU8;
        let permit = Arc::new(AtomicU8::new(1));
        let wb = WriteBehind::new();
        let store = Arc::new(MemStore::new());
        let (w, st, p) = (wb.clone(), store.clone(), permit.clone());
        let writer = std::thread::spawn(move || {
            w.run(&*st, || match p.load(Ordering::Relaxed) {
                0 => Permit::Write,
                1 => Permit::Wait,
                _ => Permit::Never,
            })
        });
        wb.push(vec![(b"a".to_vec(), Some(b"1".to_vec()))]);
        assert!(wb.settle().is_err(), "fsync fails while the lease is late");
        assert_eq!(store.len(), 0);
        // A renewal succeeds: the change was kept and lands.
        permit.store(0, Ordering::Relaxed);
        wb.settle().expect("written once the lease is confirmed");
        assert_eq!(store.get(b"a").ok().flatten().as_deref(), Some(&b"1"[..]));
        // Taken over: dropped, and every later wait fails.
        permit.store(2, Ordering::Relaxed);
        wb.push(vec![(b"b".to_vec(), Some(b"2".to_vec()))]);
        assert!(wb.settle().is_err());
        assert!(wb.settle().is_err(), "for good");
        assert_eq!(store.get(b"b").ok().flatten(), None);
        wb.stop();
        writer.join().expect("writer");
    }

    #[test]
    fn batches_keep_the_last_write_per_key_and_never_split_a_change() {
        let k = |s: &str| s.as_bytes().to_vec();
        let changes = vec![
            vec![(k("a"), Some(k("1"))), (k("b"), Some(k("1")))],
            vec![(k("a"), None)],
            vec![(k("c"), Some(vec![0; BATCH_BYTES]))],
            vec![(k("a"), Some(k("3")))],
        ];
        let b = batches(changes);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0], vec![(k("a"), None), (k("b"), Some(k("1")))]);
        assert_eq!(b[1].len(), 1);
        assert_eq!(b[2], vec![(k("a"), Some(k("3")))]);
    }
}
