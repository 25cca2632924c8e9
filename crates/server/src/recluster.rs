//! Scan-driven value reclustering: ranges that clients read (range
//! listings, and multi-gets of keys in ascending order such as a block
//! volume's chunks) are handed to
//! a background thread (`ls-recluster`) that asks the engine to rewrite
//! their small values in key order where they are scattered
//! ([`engine::Db::recluster`]), so the next range reads of them read a few
//! long runs of the device instead of one page per value.
//!
//! Only ranges that are read get rewritten: a node that serves point reads
//! and writes only does none of this work. A listed range goes to the
//! thread when it names at least [`MIN_KEYS`] keys, one listing in
//! [`SAMPLE_ONE_IN`] (hot ranges are listed often, so sampling still finds
//! them), and only while the queue has room: the read path never waits for
//! it. The engine leaves a range already in key order as it is, so a range
//! costs one index walk once it is clustered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::state::NodeState;

/// Listings of fewer keys are not worth a look.
pub const MIN_KEYS: usize = 16;
/// One qualifying listing in this many is handed on.
pub const SAMPLE_ONE_IN: u64 = 4;
/// Ranges waiting at most; more are dropped.
const QUEUE: usize = 16;
/// Failures are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How often the thread looks for a stop request while idle.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// A range to look at: start, end (exclusive), most keys to examine.
type Range = (Vec<u8>, Vec<u8>, u64);

/// The queue between the read path and the `ls-recluster` thread.
#[derive(Default)]
pub struct Reclusterer {
    queue: Mutex<VecDeque<Range>>,
    ready: Condvar,
    listings: AtomicU64,
    /// Ranges handed to the engine (INFO `recluster_ranges`).
    pub ranges: AtomicU64,
    /// Ranges dropped for a full queue (INFO `recluster_dropped`).
    pub dropped: AtomicU64,
}

impl Reclusterer {
    /// Notes that a read took `keys` keys from `first` to `last`
    /// (inclusive, in key order): a range listing, or a multi-get of keys
    /// in ascending order. The thread examines at most twice that many
    /// keys from `first`, so a multi-get of keys far apart costs a step,
    /// not a rewrite of everything between them. Never blocks.
    pub fn listed(&self, first: &[u8], last: &[u8], keys: usize) {
        if keys < MIN_KEYS
            || !self
                .listings
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SAMPLE_ONE_IN)
        {
            return;
        }
        let mut q = self.queue.lock();
        if q.len() >= QUEUE {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut end = last.to_vec();
        end.push(0);
        q.push_back((first.to_vec(), end, 2 * keys as u64));
        drop(q);
        self.ready.notify_one();
    }

    /// The next range, or `None` after `IDLE_WAIT` without one.
    fn next(&self) -> Option<Range> {
        let mut q = self.queue.lock();
        if q.is_empty() {
            self.ready.wait_for(&mut q, IDLE_WAIT);
        }
        q.pop_front()
    }

    /// Wakes the thread (to see a stop request).
    pub fn wake(&self) {
        self.ready.notify_all();
    }
}

/// Starts the `ls-recluster` thread; it ends once the node is asked to stop.
pub fn start(state: Arc<NodeState>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ls-recluster".into())
        .spawn(move || run(&state))
}

fn run(state: &NodeState) {
    let Some(work) = state.recluster.as_ref() else {
        return;
    };
    let mut last_warning: Option<Instant> = None;
    while !*state.shutdown.borrow() {
        let Some((start, end, max_keys)) = work.next() else {
            continue;
        };
        work.ranges.fetch_add(1, Ordering::Relaxed);
        match state.db.recluster_at_most(&start, &end, max_keys) {
            Ok(s) if s.rewritten > 0 => {
                tracing::debug!(keys = s.keys, rewritten = s.rewritten, "range reclustered")
            }
            Ok(_) => {}
            // A failed device fails every range: say so now and then.
            Err(e) if last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) => {
                tracing::warn!(error = %e, "reclustering a range failed");
                last_warning = Some(Instant::now());
            }
            Err(_) => {}
        }
    }
}
