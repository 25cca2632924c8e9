//! The slow-request log: a request (or pipelined batch) whose time in the
//! node reached `slowlog_ms` is logged at WARN with its phase breakdown, so
//! an operator sees whether protocol work, executor queueing, the engine or
//! the device made it slow.

use std::time::Duration;

use crate::cmd::COMMANDS;
use crate::metrics::{micros, Breakdown, UNKNOWN};

/// Logs a batch of `requests` requests (the first being command `first`)
/// that took `wall` in the node, if `wall` reached `limit_ms` milliseconds.
/// Returns whether it was logged.
pub fn check(
    limit_ms: u64,
    requests: usize,
    first: Option<usize>,
    wall: Duration,
    phases: Breakdown,
) -> bool {
    if wall < Duration::from_millis(limit_ms) {
        return false;
    }
    let command = first
        .and_then(|i| COMMANDS.get(i))
        .map_or(UNKNOWN, |(_, n, _)| *n);
    tracing::warn!(
        target: "lightstore::slowlog",
        command,
        requests,
        total_us = micros(wall),
        protocol_us = phases.protocol_us,
        queue_us = phases.queue_us,
        engine_us = phases.engine_us,
        device_us = phases.device_us,
        "slow request"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_only_at_or_above_the_limit() {
        let b = Breakdown::default();
        assert!(!check(5, 1, Some(0), Duration::from_millis(4), b));
        assert!(check(5, 1, Some(0), Duration::from_millis(5), b));
        assert!(check(0, 3, None, Duration::ZERO, b));
    }
}
