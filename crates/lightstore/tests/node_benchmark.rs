//! A small `redis-benchmark` run against `lightstore node` (a smoke test
//! of pipelining, many clients and MSET — not a measurement).

mod node_support;

use std::process::Command;

use node_support::Node;

#[test]
fn redis_benchmark_smoke() {
    let n = Node::start(&[]);
    let out = Command::new("redis-benchmark")
        .args(["-p", &n.port.to_string()])
        .args(["-t", "set,get,mset", "-d", "8192", "-P", "16", "-c", "50"])
        .args(["-n", "2000", "-q"])
        .output()
        .expect("redis-benchmark is installed (apt-get install redis-tools)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // -q prints progress with carriage returns; the final line per test follows the last one.
    let lines: Vec<&str> = stdout
        .split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .collect();
    for test in ["SET", "GET", "MSET"] {
        assert!(
            lines.iter().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("{test}:")) || l.starts_with(&format!("{test} ("))
            }),
            "no result for {test}: {stdout}"
        );
    }
    let all = format!("{stdout}{stderr}");
    assert!(
        !all.contains("ERR") && !all.to_lowercase().contains("error"),
        "{all}"
    );
    // Every SET landed: the keys redis-benchmark uses exist.
    assert_eq!(n.cli(&["exists", "key:__rand_int__"]), "1");
}
