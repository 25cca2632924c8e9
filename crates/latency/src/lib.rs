//! Latency histograms shared by the node and the adapters: log2 buckets of
//! microseconds, lock-free, with the exact maximum, and their rendering in
//! the Prometheus text format. The device's own histograms
//! (`flash::DeviceLatency`), the node's per-command ones and the block and
//! file adapters' per-request ones are all of this kind, so their buckets
//! line up.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Number of log2 buckets; bucket `i` counts latencies `<= 2^i` microseconds
/// (and above `2^(i-1)`); the last bucket also takes everything larger.
pub const BUCKETS: usize = 32;

/// Microseconds in `d`, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Bucket index of a latency of `us` microseconds.
pub fn bucket_of(us: u64) -> usize {
    if us <= 1 {
        return 0;
    }
    // ceil(log2(us)): the smallest i with us <= 2^i.
    let i = (64 - (us - 1).leading_zeros()) as usize;
    i.min(BUCKETS - 1)
}

/// Upper bound of bucket `i` in microseconds (`le` label).
pub fn bucket_bound_us(i: usize) -> u64 {
    1u64 << i.min(63)
}

/// A fixed log2-bucket latency histogram in microseconds.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }
}

/// A point-in-time copy of a [`Histogram`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Non-cumulative counts per bucket.
    pub buckets: Vec<u64>,
    /// Recorded values.
    pub count: u64,
    /// Sum of recorded values, microseconds.
    pub sum_us: u64,
    /// The largest value recorded, microseconds.
    pub max_us: u64,
}

impl HistogramSnapshot {
    /// Upper bound (microseconds) of the bucket holding quantile `q` (0..=1),
    /// or 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_bound_us(i);
            }
        }
        bucket_bound_us(BUCKETS - 1)
    }
}

impl Histogram {
    /// Records one latency.
    pub fn record_us(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Back to no samples.
    pub fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.sum_us.store(0, Ordering::Relaxed);
        self.max_us.store(0, Ordering::Relaxed);
    }

    /// Copies the counters (not atomically as a whole; good enough for reports).
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            count: self.count.load(Ordering::Relaxed),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// Appends one Prometheus histogram `name` (with its `# HELP` and `# TYPE`
/// lines) to `out`: a series per `(label value, histogram)` under the label
/// `label`, bucket bounds in seconds.
pub fn render_prometheus(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    series: &[(&str, HistogramSnapshot)],
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let secs = |us: u64| us as f64 / 1e6;
    for (value, h) in series {
        let mut cumulative = 0;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = secs(bucket_bound_us(i));
            let _ = writeln!(
                out,
                "{name}_bucket{{{label}=\"{value}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{label}=\"{value}\",le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(out, "{name}_sum{{{label}=\"{value}\"}} {}", secs(h.sum_us));
        let _ = writeln!(out, "{name}_count{{{label}=\"{value}\"}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_upper_bounds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 2);
        assert_eq!(bucket_of(5), 3);
        assert_eq!(bucket_of(1024), 10);
        assert_eq!(bucket_of(1025), 11);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for us in [1u64, 7, 100, 4096, 1 << 20] {
            assert!(us <= bucket_bound_us(bucket_of(us)));
        }
    }

    #[test]
    fn a_histogram_keeps_count_sum_quantiles_and_the_exact_max() {
        let h = Histogram::default();
        for us in [3, 3, 3, 100, 1_935_000] {
            h.record_us(us);
        }
        let s = h.snapshot();
        assert_eq!((s.count, s.sum_us, s.max_us), (5, 1_935_109, 1_935_000));
        assert_eq!(s.quantile_us(0.5), 4);
        assert_eq!(s.quantile_us(0.8), 128);
        assert_eq!(s.quantile_us(1.0), 1 << 21);
        h.reset();
        assert_eq!(
            h.snapshot(),
            HistogramSnapshot {
                buckets: vec![0; BUCKETS],
                ..HistogramSnapshot::default()
            }
        );
    }
}

#[cfg(test)]
mod render_tests {
    use super::*;

    #[test]
    fn a_rendered_histogram_is_cumulative_and_ends_with_inf_sum_and_count() {
        let h = Histogram::default();
        h.record_us(3);
        h.record_us(100);
        let mut out = String::new();
        render_prometheus(
            &mut out,
            "x_seconds",
            "Help.",
            "op",
            &[("read", h.snapshot())],
        );
        assert!(out.starts_with("# HELP x_seconds Help.\n# TYPE x_seconds histogram\n"));
        assert!(
            out.contains("x_seconds_bucket{op=\"read\",le=\"0.000004\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{op=\"read\",le=\"0.000128\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{op=\"read\",le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_sum{op=\"read\"} 0.000103\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{op=\"read\"} 2\n"), "{out}");
    }
}
