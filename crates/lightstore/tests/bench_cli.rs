//! End to end: the real `lightstore bench` binary on a real file device runs
//! every workload and reports sane JSON.

use std::process::Command;

fn bench(dir: &std::path::Path, workload: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args([
            "bench",
            "--workload",
            workload,
            "--num",
            "3000",
            "--value-size",
            "4096",
            "--json",
        ])
        .arg("--path")
        .arg(dir)
        .args(["--capacity", "256M"])
        .args(extra)
        .output()
        .expect("run lightstore");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn all_workloads_run_and_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let set = bench(dir.path(), "s-set", &["--threads", "2"]);
    assert!(set["ops_per_sec"].as_f64().unwrap_or(0.0) > 0.0);
    let wa = set["write_amplification"].as_f64().unwrap_or(0.0);
    assert!((1.0..1.2).contains(&wa), "s-set write amplification {wa}");
    for w in ["s-get", "r-get", "r-mixed"] {
        let r = bench(dir.path(), w, &[]);
        assert_eq!(
            r["not_found"].as_u64(),
            Some(0),
            "{w}: every key was written"
        );
        let reads = r["device_reads_per_get"].as_f64().unwrap_or(0.0);
        assert!(reads <= 1.05, "{w}: device reads per GET {reads}");
    }
    let r = bench(
        dir.path(),
        "r-set",
        &["--threads", "4", "--durability", "sync"],
    );
    for field in [
        "p50_us",
        "p99_us",
        "p999_us",
        "mb_per_sec",
        "index_dram_bytes_per_key",
    ] {
        assert!(r.get(field).is_some(), "missing {field}");
    }
}

#[test]
fn bad_arguments_fail_cleanly() {
    let out = Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args(["bench", "--workload", "r-get", "--durability", "sometimes"])
        .output()
        .expect("run lightstore");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("durability"));
}

#[test]
fn prefill_makes_a_write_workload_overwrite_a_filled_store() {
    let fresh = tempfile::tempdir().expect("tempdir");
    let r = bench(fresh.path(), "r-set", &[]);
    assert_eq!(r["writes_before"].as_u64(), Some(0));
    let filled = tempfile::tempdir().expect("tempdir");
    let r = bench(filled.path(), "r-set", &["--prefill"]);
    assert_eq!(
        r["writes_before"].as_u64(),
        Some(3000),
        "every key set once first"
    );
    assert_eq!(r["ops"].as_u64(), Some(3000), "the timed run is unchanged");
}

#[test]
fn batched_requests_write_and_read_every_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let set = bench(dir.path(), "s-set", &["--threads", "2", "--batch", "16"]);
    assert_eq!(set["ops"].as_u64(), Some(3000));
    // Every key the batched writes set is found by batched (multi-get) reads
    // and by single GETs.
    for batch in ["16", "1"] {
        let r = bench(dir.path(), "r-mixed", &["--threads", "2", "--batch", batch]);
        assert_eq!(r["not_found"].as_u64(), Some(0), "--batch {batch}");
        assert!(r["gets"].as_u64().unwrap_or(0) > 0);
    }
}

#[test]
fn preallocate_allocates_the_device_file_first() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let r = bench(dir.path(), "r-set", &["--preallocate"]);
    assert_eq!(r["ops"].as_u64(), Some(3000));
    let allocated = std::fs::metadata(dir.path().join("lightstore.dev"))
        .map(|m| m.blocks() * 512)
        .expect("device file");
    assert!(
        allocated >= 256 << 20,
        "{allocated} bytes allocated of 256 MiB"
    );
}
