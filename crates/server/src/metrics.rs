//! Request metrics: per-command latency histograms and the paper's
//! Figure 10 breakdown of where a request's time goes.
//!
//! Everything here is lock-free (relaxed atomics), so the network thread and
//! the executor threads record without contention beyond cache lines.
//!
//! Phases of a request:
//! - **protocol**: parsing and reply encoding on the network thread, plus
//!   commands answered there (PING, HELLO, ...). A pipelined batch's parse
//!   and encode time is shared equally among its requests.
//! - **queue**: time an executor job waited in the executor queue (stamped
//!   at submit, read when a thread starts it) plus the hand-back of its
//!   replies to the network thread (job end until the connection task runs
//!   again). Every engine request of a pipelined batch waited that long.
//! - **engine**: time the executor spent running the request's engine call
//!   (index search, keytable lookups in cache, value-log append), without
//!   its device time.
//! - **device**: the part of the engine call spent waiting for the device:
//!   reads, batched reads, log writes and syncs, including waits for another
//!   writer's group-commit sync ([`flash::iotime`] accounts it per thread).
//!
//! A request's recorded latency is its service time inside the node:
//! its protocol share + queue wait (engine commands) + its own engine time.
//! Time a pipelined request spends waiting for the requests before it in the
//! same job is not counted in its own latency.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cmd::COMMANDS;

/// The log2 latency histogram, shared with the device's and the adapters'
/// (the `latency` crate).
pub use latency::{micros, Histogram, HistogramSnapshot};

/// Name under which requests for unknown or refused commands are recorded.
pub const UNKNOWN: &str = "unknown";

/// Cumulative time per phase, microseconds, and requests counted.
#[derive(Default)]
pub struct Phases {
    /// Parse, encode and network-thread commands.
    pub protocol_us: AtomicU64,
    /// Executor queue wait (per request of each job).
    pub queue_us: AtomicU64,
    /// Executor time of engine calls, without device time.
    pub engine_us: AtomicU64,
    /// Device time of engine calls.
    pub device_us: AtomicU64,
    /// Requests these totals cover.
    pub requests: AtomicU64,
}

/// A copy of [`Phases`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhasesSnapshot {
    /// See [`Phases::protocol_us`].
    pub protocol_us: u64,
    /// See [`Phases::queue_us`].
    pub queue_us: u64,
    /// See [`Phases::engine_us`].
    pub engine_us: u64,
    /// See [`Phases::device_us`].
    pub device_us: u64,
    /// See [`Phases::requests`].
    pub requests: u64,
}

/// The phase breakdown of one request or one pipelined batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// Protocol time, microseconds.
    pub protocol_us: u64,
    /// Queue time, microseconds.
    pub queue_us: u64,
    /// Engine time without device time, microseconds.
    pub engine_us: u64,
    /// Device time, microseconds.
    pub device_us: u64,
}

impl Breakdown {
    /// Sum of the phases.
    pub fn total_us(&self) -> u64 {
        self.protocol_us
            .saturating_add(self.queue_us)
            .saturating_add(self.engine_us)
            .saturating_add(self.device_us)
    }
}

/// All request metrics of a node.
pub struct Metrics {
    /// One histogram per entry of [`COMMANDS`], then one for unknown commands.
    commands: Vec<Histogram>,
    /// Phase totals.
    pub phases: Phases,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            commands: (0..=COMMANDS.len()).map(|_| Histogram::default()).collect(),
            phases: Phases::default(),
        }
    }
}

impl Metrics {
    /// Records one request: `index` is its [`COMMANDS`] index or `None` for
    /// an unknown command; the latency is the sum of `b`'s phases.
    pub fn record(&self, index: Option<usize>, b: Breakdown) {
        let i = index
            .filter(|i| *i < COMMANDS.len())
            .unwrap_or(COMMANDS.len());
        self.commands[i].record_us(b.total_us());
        let p = &self.phases;
        p.protocol_us.fetch_add(b.protocol_us, Ordering::Relaxed);
        p.queue_us.fetch_add(b.queue_us, Ordering::Relaxed);
        p.engine_us.fetch_add(b.engine_us, Ordering::Relaxed);
        p.device_us.fetch_add(b.device_us, Ordering::Relaxed);
        p.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Command names with their histograms, known commands first, then
    /// [`UNKNOWN`]; only commands with at least one call.
    pub fn commands(&self) -> Vec<(&'static str, HistogramSnapshot)> {
        COMMANDS
            .iter()
            .map(|(_, n, _)| *n)
            .chain(std::iter::once(UNKNOWN))
            .zip(&self.commands)
            .map(|(n, h)| (n, h.snapshot()))
            .filter(|(_, s)| s.count > 0)
            .collect()
    }

    /// Zeroes every histogram and phase total (`CONFIG RESETSTAT`). A
    /// request recorded meanwhile may be counted in part.
    pub fn reset(&self) {
        for h in &self.commands {
            h.reset();
        }
        let p = &self.phases;
        for a in [
            &p.protocol_us,
            &p.queue_us,
            &p.engine_us,
            &p.device_us,
            &p.requests,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// A copy of the phase totals.
    pub fn phases(&self) -> PhasesSnapshot {
        let p = &self.phases;
        PhasesSnapshot {
            protocol_us: p.protocol_us.load(Ordering::Relaxed),
            queue_us: p.queue_us.load(Ordering::Relaxed),
            engine_us: p.engine_us.load(Ordering::Relaxed),
            device_us: p.device_us.load(Ordering::Relaxed),
            requests: p.requests.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_per_command_recording() {
        let m = Metrics::default();
        let set = COMMANDS.iter().position(|(_, n, _)| *n == "set");
        for _ in 0..98 {
            m.record(
                set,
                Breakdown {
                    protocol_us: 1,
                    queue_us: 1,
                    engine_us: 6,
                    device_us: 2,
                },
            );
        }
        for us in [3000, 100_000] {
            m.record(
                set,
                Breakdown {
                    engine_us: us,
                    ..Breakdown::default()
                },
            );
        }
        m.record(None, Breakdown::default());
        let cmds = m.commands();
        assert_eq!(cmds.len(), 2);
        let (name, s) = &cmds[0];
        assert_eq!(*name, "set");
        assert_eq!(s.count, 100);
        assert_eq!(s.sum_us, 98 * 10 + 103_000);
        assert_eq!(s.quantile_us(0.5), 16);
        assert_eq!(s.quantile_us(0.99), 4096);
        assert_eq!(s.quantile_us(0.999), 131_072);
        assert_eq!(cmds[1].0, UNKNOWN);
        let p = m.phases();
        assert_eq!(p.requests, 101);
        assert_eq!(p.protocol_us, 98);
        assert_eq!(p.engine_us, 98 * 6 + 103_000);
        assert_eq!(p.device_us, 98 * 2);
        assert_eq!(HistogramSnapshot::default().quantile_us(0.5), 0);
    }
}
