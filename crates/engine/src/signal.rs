//! How writers and the maintenance thread signal each other: writers raise
//! a wake flag when there is work (a full memtable, low space) and say when
//! one was refused for want of space, the
//! maintenance thread announces each finished flush (and its own failure)
//! to writers waiting for room and whether GC could still clean a segment,
//! and closing raises the stop flag every background thread polls.
//!
//! The flag and both notices share one mutex, so a writer that checks
//! "still behind" and then waits holds it across the check: a flush notice
//! given in between is not lost.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

/// The signals between writers, the maintenance thread and `close`.
pub(crate) struct MaintSignal {
    /// Raised by [`MaintSignal::wake`], cleared when maintenance takes it.
    woken: Mutex<bool>,
    work: Condvar,
    flushed: Condvar,
    stopping: AtomicBool,
    /// Raised by [`MaintSignal::want_space`], cleared when maintenance
    /// takes it.
    space_wanted: AtomicBool,
    /// Published by GC short of space: whether its deep pass (`deeppass.rs`)
    /// found a segment to clean that fits the free segments.
    deep_pass_possible: AtomicBool,
    /// While a deep pass relocates, the free segments below which ordinary
    /// writes wait (0: no pass runs).
    deep_pass_floor: AtomicU32,
}

impl MaintSignal {
    pub(crate) fn new() -> MaintSignal {
        MaintSignal {
            woken: Mutex::new(false),
            work: Condvar::new(),
            flushed: Condvar::new(),
            stopping: AtomicBool::new(false),
            space_wanted: AtomicBool::new(false),
            deep_pass_possible: AtomicBool::new(false),
            deep_pass_floor: AtomicU32::new(0),
        }
    }

    /// GC: a deep pass starts relocating, and ordinary writes must leave
    /// `floor` segments free (0: it ended). Its victim was chosen to fit
    /// the free segments; ordinary writes appended meanwhile could take
    /// that room, and the pass ran out of space half done.
    pub(crate) fn set_deep_pass_floor(&self, floor: u32) {
        self.deep_pass_floor.store(floor, Ordering::Release);
    }

    /// The free segments an ordinary write must leave while a deep pass
    /// relocates (0: none runs); below them it waits as if refused for
    /// room.
    pub(crate) fn deep_pass_floor(&self) -> u32 {
        self.deep_pass_floor.load(Ordering::Acquire)
    }

    /// GC: whether a deep pass could clean a segment now.
    pub(crate) fn set_deep_pass_possible(&self, possible: bool) {
        self.deep_pass_possible.store(possible, Ordering::Release);
    }

    /// A writer refused for room: whether GC last found that a deep pass
    /// could clean a segment (so waiting for it may give room).
    pub(crate) fn deep_pass_possible(&self) -> bool {
        self.deep_pass_possible.load(Ordering::Acquire)
    }

    /// A writer was refused for want of space: maintenance should release
    /// what it can now, however little the memtable holds, and look soon.
    pub(crate) fn want_space(&self) {
        self.space_wanted.store(true, Ordering::Release);
        self.wake();
    }

    /// Maintenance: whether a writer wanted space since the last call.
    pub(crate) fn take_space_wanted(&self) -> bool {
        self.space_wanted.swap(false, Ordering::AcqRel)
    }

    /// Tells maintenance there is work. Wakes coalesce: many before one
    /// round are one round.
    pub(crate) fn wake(&self) {
        let mut w = self.woken.lock();
        *w = true;
        self.work.notify_all();
    }

    /// Maintenance: waits up to `timeout` unless woken since the last call,
    /// and takes the wake.
    pub(crate) fn wait_for_work(&self, timeout: Duration) {
        let mut w = self.woken.lock();
        if !*w {
            self.work.wait_for(&mut w, timeout);
        }
        *w = false;
    }

    /// Asks every background thread to stop, and wakes maintenance so it
    /// sees it.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether [`MaintSignal::stop`] was called.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Maintenance: a flush finished, or maintenance stopped on an error:
    /// writers waiting in [`MaintSignal::wait_flushed`] look again.
    pub(crate) fn flushed(&self) {
        self.flushed.notify_all();
    }

    /// A writer about to wait for a flush: hold this while checking whether
    /// it must wait, then pass it to [`MaintSignal::wait_flushed`].
    pub(crate) fn hold(&self) -> MutexGuard<'_, bool> {
        self.woken.lock()
    }

    /// Waits for the next flush notice, at most `timeout`.
    pub(crate) fn wait_flushed(&self, held: &mut MutexGuard<'_, bool>, timeout: Duration) {
        self.flushed.wait_for(held, timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_wake_before_the_wait_is_not_lost_and_is_taken_once() {
        let s = MaintSignal::new();
        s.wake();
        let t = Instant::now();
        s.wait_for_work(Duration::from_secs(10));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the early wake counted"
        );
        let t = Instant::now();
        s.wait_for_work(Duration::from_millis(30));
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "taken by the first wait"
        );
    }

    #[test]
    fn stop_wakes_maintenance_and_is_seen() {
        let s = Arc::new(MaintSignal::new());
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                while !s.stopping() {
                    s.wait_for_work(Duration::from_secs(10));
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        s.stop();
        waiter.join().expect("maintenance thread");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_flush_notice_wakes_a_held_waiter() {
        let s = Arc::new(MaintSignal::new());
        let mut held = s.hold();
        let notifier = {
            let s = s.clone();
            // Blocks until the waiter releases the lock inside the wait.
            std::thread::spawn(move || {
                let _g = s.hold();
                s.flushed();
            })
        };
        let t = Instant::now();
        s.wait_flushed(&mut held, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        drop(held);
        notifier.join().expect("notifier");
    }
}
