//! INFO: server, clients, stats, commandstats (calls, time and log2-bucket
//! percentiles in microseconds per command), latency_breakdown (protocol,
//! queue and engine time), engine, device (the same per device operation,
//! with the slowest one), handoff (hints kept for other nodes,
//! see `hints.rs`) and keyspace sections as
//! `name:value` lines (verbatim text in RESP3).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use protocol::Reply;

use crate::cmd::COMMANDS;
use crate::state::NodeState;

const SECTIONS: &[&str] = &[
    "server",
    "clients",
    "stats",
    "commandstats",
    "latency_breakdown",
    "engine",
    "device",
    "handoff",
    "keyspace",
];

/// INFO [section ...] (`all`, `everything` and `default` mean every section).
pub fn info(state: &NodeState, args: &[Bytes]) -> Reply {
    let wanted: Vec<String> = args[1..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| matches!(w.as_str(), "all" | "everything" | "default"));
    let mut out = String::new();
    for section in SECTIONS {
        if all || wanted.iter().any(|w| w == section) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            render(state, section, &mut out);
        }
    }
    Reply::Verbatim(out)
}

/// `calls=…,usec=…,usec_per_call=…,p50=…,p99=…,p999=…` (microseconds; the
/// percentiles are log2 bucket bounds), as Redis's `INFO commandstats`.
fn latency_fields(h: &flash::HistogramSnapshot) -> String {
    let per_call = h.sum_us as f64 / h.count.max(1) as f64;
    format!(
        "calls={},usec={},usec_per_call={per_call:.2},p50={},p99={},p999={}",
        h.count,
        h.sum_us,
        h.quantile_us(0.5),
        h.quantile_us(0.99),
        h.quantile_us(0.999)
    )
}

fn render(state: &NodeState, section: &str, out: &mut String) {
    let c = &state.counters;
    let _ = writeln!(out, "# {}\r", capitalize(section));
    let mut line = |k: &str, v: &dyn std::fmt::Display| {
        let _ = write!(out, "{k}:{v}\r\n");
    };
    match section {
        "server" => {
            line("lightstore_version", &env!("CARGO_PKG_VERSION"));
            line("redis_mode", &"standalone");
            line("process_id", &std::process::id());
            line("run_id", &state.run.id);
            line(
                "run_ids_safe",
                &format!("{}-{}", state.run.safe_from, state.run.safe_to),
            );
            line("previous_stop", &state.run.previous.name());
            line("tcp_port", &state.tcp_port);
            line("uptime_in_seconds", &state.started.elapsed().as_secs());
            line("io_threads", &1);
            line("executor_threads", &state.config.write_threads());
            line("read_threads", &state.config.read_threads());
            line("durability", &state.config.durability);
            line("data_dir", &state.config.data_dir.display());
        }
        "clients" => {
            line("connected_clients", &c.clients.load(Ordering::Relaxed));
            line("maxclients", &state.config.maxclients);
            let budget = &state.request_budget;
            line("request_memory_bytes", &budget.used());
            line("max_request_memory", &budget.limit());
            line(
                "request_memory_waits",
                &budget.waits.load(Ordering::Relaxed),
            );
            line(
                "request_memory_refusals",
                &budget.refusals.load(Ordering::Relaxed),
            );
            line(
                "request_memory_stalls",
                &budget.stalls.load(Ordering::Relaxed),
            );
        }
        "stats" => {
            let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            line("total_connections_received", &get(&c.connections_received));
            line("total_commands_processed", &get(&c.commands));
            line("rejected_connections", &get(&c.rejected_connections));
            line("rejected_protected_mode", &get(&c.rejected_protected));
            line("reply_timeouts", &get(&c.reply_timeouts));
            line("inline_sets", &get(&c.inline_sets));
            line("net_gets", &get(&c.net_gets));
            line("net_vmetas", &get(&c.net_vmetas));
            line("net_ranges", &get(&c.net_ranges));
            line("landed_reads", &get(&c.landed_reads));
            for ((_, name, _), calls) in COMMANDS.iter().zip(&c.calls) {
                let n = get(calls);
                if n > 0 {
                    line(&format!("cmdstat_{name}"), &format!("calls={n}"));
                }
            }
        }
        "commandstats" => {
            for (name, h) in state.metrics.commands() {
                line(&format!("cmdstat_{name}"), &latency_fields(&h));
            }
        }
        "device" => {
            for (op, h) in state.db.stats().device_latency.0 {
                line(
                    &format!("device_{}", op.name()),
                    &format!("{},max={}", latency_fields(&h), h.max_us),
                );
            }
        }
        "latency_breakdown" => {
            let p = state.metrics.phases();
            let n = p.requests.max(1) as f64;
            line("requests", &p.requests);
            for (phase, us) in [
                ("protocol", p.protocol_us),
                ("queue", p.queue_us),
                ("engine", p.engine_us),
                ("device", p.device_us),
            ] {
                line(&format!("{phase}_us"), &us);
                line(
                    &format!("{phase}_us_per_request"),
                    &format!("{:.2}", us as f64 / n),
                );
            }
        }
        "engine" => {
            let s = state.db.stats();
            line(
                "write_amplification",
                &format!("{:.3}", s.write_amplification),
            );
            line(
                "device_reads_per_get",
                &format!("{:.3}", s.device_reads_per_get),
            );
            line("log_bytes", &s.log_bytes);
            line("log_live_bytes", &s.log_live_bytes);
            line("user_bytes_written", &s.user_bytes_written);
            line("device_bytes_written", &s.device_bytes_written);
            line("dram_index_bytes", &s.dram_index_bytes);
            line("dram_cache_bytes", &s.dram_cache_bytes);
            line("dram_bloom_bytes", &s.dram_bloom_bytes);
            line("dram_memtable_bytes", &s.dram_memtable_bytes);
            line("dram_budget_bytes", &s.dram_budget_bytes);
            line("memtable_entries", &s.memtable_entries);
            line("memtable_runs", &s.memtable_runs);
            line("flushed_runs", &s.flushed_runs);
            let per_level: Vec<String> = s
                .keytables_per_level
                .iter()
                .map(|n| n.to_string())
                .collect();
            line("keytables_per_level", &per_level.join(","));
            line("flushes", &s.flushes);
            line("flushes_during_merges", &s.flushes_during_merges);
            line("write_throttle_micros", &s.write_throttle_micros);
            line("compactions", &s.compactions);
            line("gc_runs", &s.gc_runs);
            line("gc_deep_passes", &s.gc_deep_passes);
            line("gc_segments_reclaimed", &s.gc_segments_reclaimed);
            line("gc_bytes_relocated", &s.gc_bytes_relocated);
            line("recluster_bytes", &s.recluster_bytes);
            if let Some(r) = &state.recluster {
                line("recluster_ranges", &r.ranges.load(Ordering::Relaxed));
                line("recluster_dropped", &r.dropped.load(Ordering::Relaxed));
            }
            line("garbage_ratio", &format!("{:.3}", s.garbage_ratio));
            line("segments_free", &s.segments_free);
            line("segments_backed", &s.segments_backed);
            line("segments_total", &s.segments_total);
            line("segment_bytes", &s.segment_bytes);
            line("segments_log", &s.segments_log);
            line("last_seq", &s.last_seq);
            line("host_full", &u8::from(s.host_full));
            line("io_error", &u8::from(s.device_failed.is_some()));
            if let Some(why) = &s.device_failed {
                // One line: INFO fields end at the line's end.
                line("io_error_reason", &why.replace(['\r', '\n'], " "));
            }
        }
        "handoff" => {
            let h = &state.hints;
            let targets = h.pending();
            line("hints_pending", &targets.values().sum::<u64>());
            let targets: Vec<String> = targets.iter().map(|(t, n)| format!("{t}={n}")).collect();
            line("hints_targets", &targets.join(","));
            line("hints_delivered", &h.delivered.load(Ordering::Relaxed));
            let errors = h.last_error.lock();
            if let Some((t, why)) = errors.iter().next() {
                line("hints_last_error", &format!("{t}: {why}"));
            }
        }
        "keyspace" => match crate::data::dbsize(state) {
            Ok(n) => line(
                "db0",
                &format!(
                    "keys={n},expires=0,avg_ttl=0,approximate={}",
                    u8::from(n >= crate::data::DBSIZE_CAP)
                ),
            ),
            Err(e) => line("db0_error", &e),
        },
        _ => {}
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}
