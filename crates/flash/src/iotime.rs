//! Per-thread accounting of time spent waiting for the device.
//!
//! The node's request breakdown (the LightStore paper's Figure 10) separates
//! device I/O from the rest of an engine call. The store charges every read,
//! batched read and sync to the calling thread here, and layers above charge
//! waits that stand for device work (a writer waiting on another thread's
//! group-commit sync). A caller measures one call with [`take`] before and
//! after it. Background threads accumulate too and simply never take.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    static SPENT_NS: Cell<u64> = const { Cell::new(0) };
}

/// Returns the device time charged to this thread since the last `take`,
/// and resets it.
pub fn take() -> Duration {
    Duration::from_nanos(SPENT_NS.with(|c| c.replace(0)))
}

/// Charges `d` of device time to this thread.
pub fn charge(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    SPENT_NS.with(|c| c.set(c.get().saturating_add(ns)));
}

/// Runs `f` and charges its duration to this thread.
pub fn timed<T>(f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    charge(start.elapsed());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_returns_and_resets_the_charged_time() {
        let _ = take();
        charge(Duration::from_micros(5));
        charge(Duration::from_micros(7));
        assert_eq!(take(), Duration::from_micros(12));
        assert_eq!(take(), Duration::ZERO);
        timed(|| std::thread::sleep(Duration::from_millis(2)));
        assert!(take() >= Duration::from_millis(2));
    }

    #[test]
    fn threads_are_accounted_separately() {
        let _ = take();
        charge(Duration::from_micros(3));
        std::thread::spawn(|| charge(Duration::from_secs(1)))
            .join()
            .expect("thread");
        assert_eq!(take(), Duration::from_micros(3));
    }
}
