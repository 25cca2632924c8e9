//! What this client knows of each node's runs (its processes, see the
//! node's `run.rs`), so that a sync never vouches for writes that died with
//! a node.
//!
//! A node under `interval` durability acknowledges a write before it is on
//! its device. If the node dies and restarts before a sync, the write is
//! gone, and the `FSYNC` the new process answers covers only what the new
//! process took. Like Linux's writeback errors (a failed writeback is
//! reported by the next `fsync` of each file open at the time), the next
//! sync then fails, once per [`LossCursor`] (each volume an adapter serves
//! keeps one; [`crate::Cluster::sync`] uses the client's own), saying which
//! node lost what it acknowledged.
//!
//! Contract:
//! - Each new connection asks `RUNID` (the run's id and the range of
//!   earlier runs known to have lost nothing they acknowledged) before it
//!   is used, and tells the ledger ([`RunLedger::connected`]); ids of one
//!   node only grow.
//! - Only writes a node took as their only replica count
//!   ([`RunLedger::acked_alone`]): a write another replica also holds is
//!   not lost with one node (reads take the newest copy and repair).
//! - A run newer than the one that acknowledged unsynced writes, whose
//!   safe range does not hold that run, means those writes may be lost:
//!   the next sync of each cursor reports it ([`RunLedger::loss_after`]).
//! - Writes that several replicas took are not tracked: a loss needs all of
//!   them to restart uncleanly before a sync (a power cut of the whole
//!   cluster under `interval`), which this does not detect.
//! - Nodes that do not answer `RUNID` (older ones) are not tracked.

/// One node's ledger.
#[derive(Debug, Default)]
pub(crate) struct RunLedger {
    /// The newest run seen (0: none yet).
    run: u64,
    /// The earlier runs `run` vouches for: `safe.0..=safe.1`.
    safe: (u64, u64),
    /// Writes `run` acknowledged as their only replica, and of those the
    /// ones a sync of `run` covered.
    acked: u64,
    synced: u64,
    /// Losses seen so far (writes acknowledged by an earlier run that may
    /// be gone), and why the last one.
    losses: u64,
    last_loss: String,
}

/// Which losses of each node a writer has been told of (like Linux's
/// `errseq_t` sampled when a file is opened): a sync with it reports each
/// later loss once. Nodes are in cluster order; missing ones count 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LossCursor(Vec<u64>);

impl LossCursor {
    /// A cursor told of the first `seen[i]` losses of node `i` (for
    /// `Store` implementations).
    pub fn new(seen: Vec<u64>) -> LossCursor {
        LossCursor(seen)
    }

    /// Losses of node `i` already reported.
    pub fn seen(&self, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }

    /// Records that node `i`'s losses up to `n` were reported.
    pub fn set(&mut self, i: usize, n: u64) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] = self.0[i].max(n);
    }

    /// Takes in what `other` has been told too (a writer that synced with
    /// a copy of its cursor).
    fn advance_to(&mut self, other: &LossCursor) {
        for (i, &n) in other.0.iter().enumerate() {
            self.set(i, n);
        }
    }
}

/// A writer's [`LossCursor`] shared by the threads that sync for it (the
/// connections of one volume, the handles of one file): each sync works on
/// a copy, so none waits for another's device sync, and what it was told
/// is merged back. Two syncs at once may both report one loss; none is
/// missed.
#[derive(Debug, Default)]
pub struct WriterLosses(parking_lot::Mutex<LossCursor>);

impl WriterLosses {
    /// A writer told of the losses `seen` already (from
    /// `Store::loss_cursor`: those before it started).
    pub fn new(seen: LossCursor) -> WriterLosses {
        WriterLosses(parking_lot::Mutex::new(seen))
    }

    /// Runs `sync_with` (a `Store::sync_with`) on a copy of the cursor
    /// and keeps what it was told.
    pub fn sync(
        &self,
        sync_with: impl FnOnce(&mut LossCursor) -> crate::Result<()>,
    ) -> crate::Result<()> {
        let mut cursor = self.0.lock().clone();
        let outcome = sync_with(&mut cursor);
        self.0.lock().advance_to(&cursor);
        outcome
    }
}

/// Where a sync of one node started: which run and how many of its writes
/// it covers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncMark {
    run: u64,
    acked: u64,
}

impl RunLedger {
    /// Whether `run` is one the current run vouches for.
    fn vouched(&self, run: u64) -> bool {
        run != 0 && self.safe.0 <= run && run <= self.safe.1
    }

    /// A connection to `run` opened; its `RUNID` vouched for the earlier
    /// runs `safe.0..=safe.1`.
    pub(crate) fn connected(&mut self, run: u64, safe: (u64, u64)) {
        if run == 0 || run <= self.run {
            return;
        }
        let earlier = self.run;
        self.safe = safe;
        if earlier != 0 && self.unsynced() > 0 && !self.vouched(earlier) {
            self.note_loss(format!(
                "restarted (run {} after {}) without a clean stop, after acknowledging {} \
                 write(s) not yet synced that no other replica took: they may be lost",
                run,
                earlier,
                self.unsynced()
            ));
        }
        self.run = run;
        self.acked = 0;
        self.synced = 0;
    }

    /// `run` acknowledged `n` writes as their only replica.
    pub(crate) fn acked_alone(&mut self, run: u64, n: u64) {
        if run == 0 || n == 0 {
            return;
        }
        if run == self.run {
            self.acked += n;
        } else if run < self.run && !self.vouched(run) {
            // Acknowledged by a run that had already died without a clean
            // stop (the reply was read late).
            self.note_loss(format!(
                "acknowledged {n} write(s) in run {run}, which ended without a clean stop \
                 before they were synced: they may be lost"
            ));
        }
    }

    /// Where a sync that starts now begins.
    pub(crate) fn mark(&self) -> SyncMark {
        SyncMark {
            run: self.run,
            acked: self.acked,
        }
    }

    /// A sync that began at `mark` was answered by `run`: the writes it
    /// covers are durable.
    pub(crate) fn synced(&mut self, mark: SyncMark, run: u64) {
        if run != 0 && run == self.run && mark.run == run {
            self.synced = self.synced.max(mark.acked);
        }
    }

    fn note_loss(&mut self, why: String) {
        self.losses += 1;
        self.last_loss = why;
    }

    /// Losses seen so far.
    pub(crate) fn losses(&self) -> u64 {
        self.losses
    }

    /// Why writes may be lost, if a loss came after the first `seen`.
    pub(crate) fn loss_after(&self, seen: u64) -> Option<&str> {
        (self.losses > seen).then_some(self.last_loss.as_str())
    }

    /// Writes the current run acknowledged alone and no sync covered yet.
    pub(crate) fn unsynced(&self) -> u64 {
        self.acked - self.synced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sync of `run` now: what it reports to a writer that was told of
    /// the ledger's first `seen` losses (then told of all).
    fn sync(l: &mut RunLedger, seen: &mut u64, run: u64) -> Option<String> {
        let m = l.mark();
        l.synced(m, run);
        let why = l.loss_after(*seen).map(str::to_string);
        *seen = l.losses();
        why
    }

    #[test]
    fn each_writer_is_told_of_a_loss_once() {
        let mut l = RunLedger::default();
        l.connected(10, (0, 0));
        l.acked_alone(10, 1);
        let (mut a, mut b) = (0, 0);
        l.connected(20, (0, 0));
        assert!(sync(&mut l, &mut a, 20).is_some());
        assert!(sync(&mut l, &mut a, 20).is_none(), "a was told");
        assert!(sync(&mut l, &mut b, 20).is_some(), "b was not yet");
        // A writer that starts after the loss is not told of it.
        let mut c = l.losses();
        assert!(sync(&mut l, &mut c, 20).is_none());
    }

    #[test]
    fn an_unclean_restart_after_unsynced_writes_fails_the_next_sync_once() {
        let mut l = RunLedger::default();
        let mut seen = 0;
        l.connected(10, (0, 0));
        l.acked_alone(10, 3);
        assert_eq!(l.unsynced(), 3);
        assert_eq!(sync(&mut l, &mut seen, 10), None);
        assert_eq!(l.unsynced(), 0);
        l.acked_alone(10, 2);
        // The node restarts without a clean stop.
        l.connected(20, (0, 0));
        let e = sync(&mut l, &mut seen, 20).expect("2 writes may be lost");
        assert!(e.contains("2 write(s)"), "{e}");
        assert_eq!(sync(&mut l, &mut seen, 20), None, "reported once");
    }

    #[test]
    fn synced_writes_a_clean_stop_and_an_older_connection_lose_nothing() {
        let mut l = RunLedger::default();
        let mut seen = 0;
        l.connected(10, (0, 0));
        l.acked_alone(10, 3);
        assert_eq!(sync(&mut l, &mut seen, 10), None);
        l.connected(20, (0, 0));
        assert_eq!(sync(&mut l, &mut seen, 20), None, "everything was synced");
        l.acked_alone(20, 1);
        l.connected(30, (20, 20));
        assert_eq!(sync(&mut l, &mut seen, 30), None, "run 20 stopped cleanly");
        // A connection opened to run 20 before it stopped reports late.
        l.connected(20, (0, 0));
        l.acked_alone(20, 1);
        assert_eq!(
            sync(&mut l, &mut seen, 30),
            None,
            "run 20 vouched for itself"
        );
        // Writes acknowledged after the sync began stay unsynced.
        l.acked_alone(30, 1);
        let m = l.mark();
        l.acked_alone(30, 1);
        l.synced(m, 30);
        assert_eq!(l.unsynced(), 1);
        l.connected(40, (0, 0));
        assert!(
            sync(&mut l, &mut seen, 40).is_some(),
            "one write was not covered"
        );
    }

    #[test]
    fn clean_runs_the_client_never_saw_lose_nothing() {
        let mut l = RunLedger::default();
        let mut seen = 0;
        l.connected(10, (0, 0));
        l.acked_alone(10, 2);
        // 10, 11 and 12 stopped cleanly; the client meets 13 only.
        l.connected(13, (10, 12));
        assert_eq!(sync(&mut l, &mut seen, 13), None);
        l.acked_alone(13, 1);
        // 13 crashed, 14 started unrecorded (a full device) and crashed:
        // 15 vouches for the chain ending at 13 only, not for 14.
        l.connected(14, (0, 0));
        assert!(
            sync(&mut l, &mut seen, 14).is_some(),
            "13 crashed with a write"
        );
        l.acked_alone(14, 1);
        l.connected(15, (13, 13));
        assert!(
            sync(&mut l, &mut seen, 15).is_some(),
            "14 is not vouched for"
        );
    }

    #[test]
    fn a_late_reply_from_a_dead_run_counts_as_lost() {
        let mut l = RunLedger::default();
        let mut seen = 0;
        l.connected(10, (0, 0));
        l.connected(20, (0, 0));
        l.acked_alone(10, 1);
        assert!(sync(&mut l, &mut seen, 20).is_some());
        // A sync answered by another run than it began with covers nothing.
        l.acked_alone(20, 1);
        let m = l.mark();
        l.connected(30, (20, 20));
        l.synced(m, 30);
        assert_eq!(l.unsynced(), 0, "run 30 started over");
        // Untracked nodes (no RUNID) never fail a sync.
        let mut u = RunLedger::default();
        let mut useen = 0;
        u.acked_alone(0, 5);
        u.connected(0, (0, 0));
        assert_eq!(sync(&mut u, &mut useen, 0), None);
    }
}
