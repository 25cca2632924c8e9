//! redis-py (the `redis` package) against `lightstore node`: RESP3 and
//! RESP2 connections, pipelines, scan_iter, RANGE, INFO, binary and 16 MiB
//! values. The checks live in `tests/py/node_client.py`.

mod node_support;

use std::process::Command;

use node_support::Node;

#[test]
fn redis_py_resp3_and_resp2() {
    let n = Node::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/node_client.py");
    let python = std::env::var("LIGHTSTORE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(script)
        .arg(n.port.to_string())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python client failed (is the redis package installed?):\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("python client checks passed"), "{stdout}");
}
