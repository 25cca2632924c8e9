//! `lightstore bench`: the paper's workloads against the engine in-process,
//! with throughput, latency percentiles, write amplification, device reads
//! per GET and index DRAM per key.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use engine::flash::{Device, DeviceOp, FileDevice, DEFAULT_PAGE_SIZE};
use engine::{BatchOp, Db, Durability, Options, Stats};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::workload::{encode_key, Op, OpStream, Values, Workload};

/// Arguments of `lightstore bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Workload (LightStore paper, Table 3).
    #[arg(long, value_enum)]
    workload: Workload,
    /// Key size in bytes.
    #[arg(long, default_value_t = 32)]
    key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 8192)]
    value_size: usize,
    /// Number of keys (the key space).
    #[arg(long, default_value_t = 100_000)]
    num: u64,
    /// Number of operations (default: --num). E.g. 2x --num with r-set
    /// overwrites the key space twice.
    #[arg(long)]
    ops: Option<u64>,
    /// Client threads (each has one request in flight: threads = queue depth).
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// Operations per request: each thread sends its next N operations as
    /// one atomic write batch (SETs) and one multi-get (GETs), as a client
    /// pipelining N commands does. Latency is then per request.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Durability: sync, interval, interval:MS or none.
    #[arg(long, default_value = "none")]
    durability: String,
    /// Data directory (holds the device file `lightstore.dev`).
    #[arg(long, default_value = "data/lightstore")]
    path: PathBuf,
    /// Device file size for a new store, e.g. 8G (default: 3x the data set, at least 1G).
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Keytable cache budget, e.g. 512M.
    #[arg(long, value_parser = parse_size)]
    cache_size: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Random seed of the key sequence.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Set every key of the key space once (untimed) before a write
    /// workload, so it overwrites a filled store as a long-running node
    /// does. Read workloads always fill an empty store first.
    #[arg(long)]
    prefill: bool,
    /// Allocate the device file's every block first and keep them, with lazy
    /// GC (as `lightstore node --preallocate`).
    #[arg(long)]
    preallocate: bool,
}

/// Sizes like `4096`, `64K`, `512M`, `8G` (shared with `lightstore node`).
pub use server::parse_size;

/// What one run measured.
#[derive(Serialize, Debug)]
pub struct Report {
    workload: Workload,
    num: u64,
    ops: u64,
    threads: u64,
    key_size: usize,
    value_size: usize,
    durability: String,
    direct_io: bool,
    /// Time until the last operation returned.
    seconds: f64,
    ops_per_sec: f64,
    mb_per_sec: f64,
    /// Time from the last operation to a quiesced, closed store: the
    /// flushes, compactions and GC the run left behind, then the close.
    drain_seconds: f64,
    /// Operations per second over the run and its drain together.
    sustained_ops_per_sec: f64,
    /// Process CPU time (user + system) over the run and its drain.
    cpu_seconds: f64,
    /// CPU seconds per million operations, run and drain together.
    cpu_seconds_per_million_ops: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    gets: u64,
    not_found: u64,
    write_amplification: f64,
    device_reads_per_get: f64,
    index_dram_bytes_per_key: f64,
    dram_index_bytes: u64,
    dram_cache_bytes: u64,
    dram_bloom_bytes: u64,
    gc_segments_reclaimed: u64,
    gc_bytes_relocated: u64,
    garbage_ratio: f64,
    compactions: u64,
    flushes: u64,
    /// Of those, flushes made inside a merge of the runs into L1.
    flushes_during_merges: u64,
    /// Keytable bytes written by flushes and compactions.
    keytable_bytes_written: u64,
    /// Keytable bytes in each level, L1 first.
    level_bytes: Vec<u64>,
    write_throttle_ms: u64,
    /// The slowest device write and sync since the store was opened (prefill
    /// included), microseconds: whether the latency tail is the device's.
    device_write_max_us: u64,
    device_sync_max_us: u64,
    /// Writes already in the store when the timed run started (a reused
    /// store, the fill before a read workload, or `--prefill`).
    writes_before: u64,
}

fn progress(len: u64, label: &str, quiet: bool) -> ProgressBar {
    if quiet || len < 200_000 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.set_message(label.to_string());
    pb
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let durability: Durability = args.durability.parse()?;
    if args.threads == 0 || args.num == 0 || args.key_size == 0 {
        return Err("--threads, --num and --key-size must be positive".into());
    }
    std::fs::create_dir_all(&args.path).map_err(|e| format!("{}: {e}", args.path.display()))?;
    let data_bytes = args.num * (args.key_size + args.value_size + 64) as u64;
    let capacity = args.capacity.unwrap_or((3 * data_bytes).max(1 << 30));
    let dev_path = args.path.join("lightstore.dev");
    let dev = FileDevice::open(&dev_path, Some(capacity), DEFAULT_PAGE_SIZE)
        .map_err(|e| format!("{}: {e}", dev_path.display()))?;
    let direct_io = dev.direct_io();
    if args.preallocate {
        dev.preallocate()
            .map_err(|e| format!("{}: preallocate: {e}", dev_path.display()))?;
    }
    let mut opts = Options {
        durability,
        ..Options::default()
    };
    if let Some(c) = args.cache_size {
        opts.cache_bytes = c as usize;
    }
    let db = Arc::new(Db::open(dev as Arc<dyn Device>, opts).map_err(|e| e.to_string())?);

    if (args.workload.reads() || args.prefill) && db.stats().last_seq == 0 {
        let fill = BenchArgs {
            workload: Workload::SSet,
            threads: args.threads.min(2),
            ..args.clone_for_fill()
        };
        let (_, _, _) = drive(&db, &fill, progress(args.num, "prefill", args.json))?;
        db.sync().map_err(|e| e.to_string())?;
        db.flush().map_err(|e| e.to_string())?;
        db.maintenance().map_err(|e| e.to_string())?;
    }

    let before = db.stats();
    let ops = args.ops.unwrap_or(args.num);
    let cpu_before = process_cpu_seconds();
    let (elapsed, hist, not_found) = drive(&db, &args, progress(ops, "run", args.json))?;
    // The debt: everything the run left for maintenance, then the close
    // (final flush and checkpoint). Only then is the work really done.
    let drain_start = Instant::now();
    db.sync().map_err(|e| e.to_string())?;
    db.maintenance().map_err(|e| e.to_string())?;
    let after = db.stats();
    let db = Arc::try_unwrap(db).map_err(|_| "the benchmark threads still hold the store")?;
    db.close().map_err(|e| e.to_string())?;
    let measured = Measured {
        elapsed,
        hist,
        not_found,
        drain: drain_start.elapsed(),
        cpu_seconds: process_cpu_seconds() - cpu_before,
    };
    let report = make_report(&args, direct_io, &measured, &before, &after);
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else {
        print_report(&report);
    }
    Ok(())
}

/// What a timed run measured.
struct Measured {
    /// Until the last operation returned.
    elapsed: Duration,
    /// Operation latencies, µs.
    hist: Histogram<u64>,
    /// GETs that found nothing.
    not_found: u64,
    /// From the last operation to a quiesced, closed store.
    drain: Duration,
    /// Process CPU time over the run and the drain.
    cpu_seconds: f64,
}

/// User + system CPU time of this process so far, seconds.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

impl BenchArgs {
    fn clone_for_fill(&self) -> BenchArgs {
        BenchArgs {
            workload: self.workload,
            key_size: self.key_size,
            value_size: self.value_size,
            num: self.num,
            ops: None,
            threads: self.threads,
            batch: 1,
            durability: self.durability.clone(),
            path: self.path.clone(),
            capacity: self.capacity,
            cache_size: self.cache_size,
            json: self.json,
            seed: self.seed,
            prefill: false,
            preallocate: self.preallocate,
        }
    }
}

/// Runs the operations on `threads` threads; returns elapsed time, the
/// merged latency histogram (microseconds) and the number of misses.
fn drive(
    db: &Arc<Db>,
    args: &BenchArgs,
    pb: ProgressBar,
) -> Result<(Duration, Histogram<u64>, u64), String> {
    let not_found = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let results: Vec<Result<Histogram<u64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (db, pb, not_found) = (db.clone(), pb.clone(), not_found.clone());
                s.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                        .map_err(|e| e.to_string())?;
                    let values = Values::new(args.value_size, args.seed ^ t);
                    let mut key = Vec::new();
                    let mut done = 0u64;
                    let ops = args.ops.unwrap_or(args.num);
                    let mut stream =
                        OpStream::new(args.workload, args.num, ops, args.threads, t, args.seed);
                    let mut group = Vec::with_capacity(args.batch.max(1));
                    loop {
                        group.clear();
                        group.extend(stream.by_ref().take(args.batch.max(1)));
                        if group.is_empty() {
                            break;
                        }
                        let t0 = Instant::now();
                        let misses = run_group(&db, args, &values, &group, done, &mut key)?;
                        not_found.fetch_add(misses, Ordering::Relaxed);
                        hist.saturating_record(t0.elapsed().as_micros().max(1) as u64);
                        let before = done;
                        done += group.len() as u64;
                        if done / 1024 > before / 1024 {
                            pb.inc(1024);
                        }
                    }
                    Ok(hist)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("benchmark thread panicked".into()))
            })
            .collect()
    });
    let elapsed = start.elapsed();
    pb.finish_and_clear();
    let mut merged =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    for r in results {
        merged.add(r?).map_err(|e| e.to_string())?;
    }
    Ok((elapsed, merged, not_found.load(Ordering::Relaxed)))
}

/// Runs one request: a single operation as itself, several as one write
/// batch of their SETs and one multi-get of their GETs. `done` numbers the
/// thread's operations (it picks the value versions). Returns the misses.
fn run_group(
    db: &Db,
    args: &BenchArgs,
    values: &Values,
    group: &[Op],
    done: u64,
    key: &mut Vec<u8>,
) -> Result<u64, String> {
    if let [op] = group {
        return match *op {
            Op::Get(i) => {
                encode_key(i, args.key_size, key);
                Ok(u64::from(db.get(key).map_err(|e| e.to_string())?.is_none()))
            }
            Op::Set(i) => {
                encode_key(i, args.key_size, key);
                db.put(key, values.get(i, done))
                    .map_err(|e| e.to_string())?;
                Ok(0)
            }
        };
    }
    let mut sets = Vec::new();
    let mut gets: Vec<Vec<u8>> = Vec::new();
    for (n, op) in group.iter().enumerate() {
        match *op {
            Op::Get(i) => {
                encode_key(i, args.key_size, key);
                gets.push(key.clone());
            }
            Op::Set(i) => {
                encode_key(i, args.key_size, key);
                let value = values.get_bytes(i, done + n as u64);
                sets.push(BatchOp::Put(Bytes::copy_from_slice(key), value));
            }
        }
    }
    if !sets.is_empty() {
        db.write_batch(&sets).map_err(|e| e.to_string())?;
    }
    if gets.is_empty() {
        return Ok(0);
    }
    let keys: Vec<&[u8]> = gets.iter().map(Vec::as_slice).collect();
    let found = db.multi_get(&keys).map_err(|e| e.to_string())?;
    Ok(found.iter().filter(|v| v.is_none()).count() as u64)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn make_report(
    args: &BenchArgs,
    direct_io: bool,
    m: &Measured,
    before: &Stats,
    after: &Stats,
) -> Report {
    let (hist, not_found) = (&m.hist, m.not_found);
    let secs = m.elapsed.as_secs_f64().max(1e-9);
    let ops = args.ops.unwrap_or(args.num);
    let total = secs + m.drain.as_secs_f64();
    let writes = after.user_bytes_written - before.user_bytes_written;
    let wa = if writes > 0 {
        ratio(
            after.device_bytes_written - before.device_bytes_written,
            writes,
        )
    } else {
        after.write_amplification
    };
    Report {
        workload: args.workload,
        num: args.num,
        ops,
        threads: args.threads,
        key_size: args.key_size,
        value_size: args.value_size,
        durability: args.durability.clone(),
        direct_io,
        seconds: secs,
        ops_per_sec: ops as f64 / secs,
        mb_per_sec: (ops * (args.key_size + args.value_size) as u64) as f64 / secs / 1e6,
        drain_seconds: m.drain.as_secs_f64(),
        sustained_ops_per_sec: ops as f64 / total,
        cpu_seconds: m.cpu_seconds,
        cpu_seconds_per_million_ops: m.cpu_seconds * 1e6 / ops.max(1) as f64,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        gets: after.gets - before.gets,
        not_found,
        write_amplification: wa,
        device_reads_per_get: ratio(
            after.get_device_reads - before.get_device_reads,
            after.gets - before.gets,
        ),
        index_dram_bytes_per_key: ratio(after.dram_index_bytes, args.num),
        dram_index_bytes: after.dram_index_bytes,
        dram_cache_bytes: after.dram_cache_bytes,
        dram_bloom_bytes: after.dram_bloom_bytes,
        gc_segments_reclaimed: after.gc_segments_reclaimed,
        gc_bytes_relocated: after.gc_bytes_relocated,
        garbage_ratio: after.garbage_ratio,
        compactions: after.compactions,
        flushes: after.flushes - before.flushes,
        flushes_during_merges: after.flushes_during_merges - before.flushes_during_merges,
        keytable_bytes_written: after.compaction_bytes_written - before.compaction_bytes_written,
        level_bytes: after.bytes_per_level.clone(),
        write_throttle_ms: (after.write_throttle_micros - before.write_throttle_micros) / 1000,
        device_write_max_us: device_max_us(after, DeviceOp::Write),
        device_sync_max_us: device_max_us(after, DeviceOp::Sync),
        writes_before: before.last_seq,
    }
}

/// The slowest `op` on the device since the store was opened, microseconds.
fn device_max_us(stats: &Stats, op: DeviceOp) -> u64 {
    stats.device_latency.of(op).map_or(0, |h| h.max_us)
}

fn print_report(r: &Report) {
    println!(
        "{:?}: {} ops on {} keys, {} threads, {} B keys, {} B values, durability {}, direct I/O {}",
        r.workload, r.ops, r.num, r.threads, r.key_size, r.value_size, r.durability, r.direct_io
    );
    println!(
        "  throughput      {:>12.0} ops/s  {:>9.1} MB/s  ({:.2} s)",
        r.ops_per_sec, r.mb_per_sec, r.seconds
    );
    println!(
        "  sustained       {:>12.0} ops/s  (drain to a quiesced, closed store {:.2} s)",
        r.sustained_ops_per_sec, r.drain_seconds
    );
    println!(
        "  CPU             {:.1} s  ({:.1} s per million ops, run and drain)",
        r.cpu_seconds, r.cpu_seconds_per_million_ops
    );
    println!(
        "  latency (us)    p50 {}  p99 {}  p99.9 {}  max {}",
        r.p50_us, r.p99_us, r.p999_us, r.max_us
    );
    println!("  write amp       {:.3}", r.write_amplification);
    println!(
        "  reads per GET   {:.3}  ({} gets, {} not found)",
        r.device_reads_per_get, r.gets, r.not_found
    );
    println!(
        "  DRAM            index {} B ({:.2} B/key), cache {} B, bloom {} B",
        r.dram_index_bytes, r.index_dram_bytes_per_key, r.dram_cache_bytes, r.dram_bloom_bytes
    );
    println!(
        "  GC              {} segments reclaimed, {} B relocated, garbage {:.1} %",
        r.gc_segments_reclaimed,
        r.gc_bytes_relocated,
        100.0 * r.garbage_ratio
    );
    println!(
        "  compactions     {}   write throttle {} ms",
        r.compactions, r.write_throttle_ms
    );
    println!(
        "  device (us)     slowest write {}  slowest sync {}",
        r.device_write_max_us, r.device_sync_max_us
    );
    let mib = |b: u64| b >> 20;
    let levels: Vec<String> = r.level_bytes.iter().map(|&b| mib(b).to_string()).collect();
    println!(
        "  keytables       {} MiB written by {} flushes ({} inside merges) and the compactions; levels {} MiB",
        mib(r.keytable_bytes_written),
        r.flushes,
        r.flushes_during_merges,
        levels.join(" / ")
    );
}
