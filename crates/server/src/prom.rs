//! Prometheus text exposition format 0.0.4 of the node's metrics: the
//! per-command and per-device-operation latency histograms, phase time
//! counters and engine gauges.

use std::fmt::Write;

use crate::metrics::{HistogramSnapshot, PhasesSnapshot};

/// Content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders the exposition text.
pub fn render(
    commands: &[(&str, HistogramSnapshot)],
    phases: PhasesSnapshot,
    engine: &engine::Stats,
) -> String {
    let mut out = String::new();
    latency::render_prometheus(
        &mut out,
        "lightstore_command_duration_seconds",
        "Time a request spent in the node, by command.",
        "command",
        commands,
    );
    let device: Vec<(&str, HistogramSnapshot)> = engine
        .device_latency
        .0
        .iter()
        .map(|(op, h)| (op.name(), h.clone()))
        .collect();
    latency::render_prometheus(
        &mut out,
        "lightstore_device_operation_seconds",
        "Time a device operation took, by operation (see INFO device).",
        "op",
        &device,
    );
    header(
        &mut out,
        "lightstore_request_phase_seconds_total",
        "counter",
        "Time spent by requests per phase (engine excludes device I/O).",
    );
    for (phase, us) in [
        ("protocol", phases.protocol_us),
        ("queue", phases.queue_us),
        ("engine", phases.engine_us),
        ("device", phases.device_us),
    ] {
        let _ = writeln!(
            out,
            "lightstore_request_phase_seconds_total{{phase=\"{phase}\"}} {}",
            secs(us)
        );
    }
    header(
        &mut out,
        "lightstore_requests_total",
        "counter",
        "Requests the phase totals cover.",
    );
    let _ = writeln!(out, "lightstore_requests_total {}", phases.requests);
    engine_gauges(&mut out, engine);
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

fn engine_gauges(out: &mut String, s: &engine::Stats) {
    let mut one = |name: &str, kind: &str, help: &str, v: &dyn std::fmt::Display| {
        header(out, name, kind, help);
        let _ = writeln!(out, "{name} {v}");
    };
    one(
        "lightstore_engine_write_amplification",
        "gauge",
        "Device bytes written per user byte.",
        &s.write_amplification,
    );
    one(
        "lightstore_engine_device_reads_per_get",
        "gauge",
        "Device reads per GET.",
        &s.device_reads_per_get,
    );
    one(
        "lightstore_engine_flushes_total",
        "counter",
        "Memtable flushes.",
        &s.flushes,
    );
    one(
        "lightstore_engine_write_throttle_seconds_total",
        "counter",
        "Time writers were held back by backpressure (flushing behind, space short).",
        &secs(s.write_throttle_micros),
    );
    one(
        "lightstore_engine_compactions_total",
        "counter",
        "Compactions.",
        &s.compactions,
    );
    one(
        "lightstore_engine_gc_segments_reclaimed_total",
        "counter",
        "Value-log segments reclaimed by GC.",
        &s.gc_segments_reclaimed,
    );
    one(
        "lightstore_engine_garbage_ratio",
        "gauge",
        "Dead fraction of value-log bytes.",
        &s.garbage_ratio,
    );
    one(
        "lightstore_engine_segments_free",
        "gauge",
        "Free segments on the device.",
        &s.segments_free,
    );
    one(
        "lightstore_engine_host_full",
        "gauge",
        "1 while writes are refused because the host file system holding the device is full.",
        &u8::from(s.host_full),
    );
    one(
        "lightstore_engine_io_error",
        "gauge",
        "1 once a device write or sync failed: writes are refused until the node restarts.",
        &u8::from(s.device_failed.is_some()),
    );
    one(
        "lightstore_engine_dram_budget_bytes",
        "gauge",
        "Configured DRAM budget.",
        &s.dram_budget_bytes,
    );
    header(
        out,
        "lightstore_engine_dram_bytes",
        "gauge",
        "Engine DRAM in use, by part.",
    );
    for (part, v) in [
        ("index", s.dram_index_bytes),
        ("cache", s.dram_cache_bytes),
        ("bloom", s.dram_bloom_bytes),
        ("memtable", s.dram_memtable_bytes),
    ] {
        let _ = writeln!(out, "lightstore_engine_dram_bytes{{part=\"{part}\"}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flash::BUCKETS;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_and_count() {
        let mut buckets = vec![0; BUCKETS];
        buckets[0] = 2;
        buckets[3] = 1;
        let h = HistogramSnapshot {
            buckets,
            count: 3,
            sum_us: 10,
            max_us: 7,
        };
        let text = render(
            &[("get", h)],
            PhasesSnapshot {
                protocol_us: 1_500_000,
                ..PhasesSnapshot::default()
            },
            &engine::Stats::default(),
        );
        assert!(text.contains(
            "lightstore_command_duration_seconds_bucket{command=\"get\",le=\"0.000001\"} 2\n"
        ));
        assert!(text.contains(
            "lightstore_command_duration_seconds_bucket{command=\"get\",le=\"0.000008\"} 3\n"
        ));
        assert!(text.contains(
            "lightstore_command_duration_seconds_bucket{command=\"get\",le=\"+Inf\"} 3\n"
        ));
        assert!(text.contains("lightstore_command_duration_seconds_count{command=\"get\"} 3\n"));
        assert!(text.contains("lightstore_request_phase_seconds_total{phase=\"protocol\"} 1.5\n"));
        assert!(text.contains("lightstore_engine_dram_bytes{part=\"bloom\"} 0\n"));
        assert!(text.contains("# TYPE lightstore_engine_segments_free gauge\n"));
        assert!(text.contains("lightstore_engine_write_throttle_seconds_total 0\n"));
    }
}
