//! Observability of `lightstore node`: the Prometheus `/metrics` endpoint,
//! INFO commandstats / latency_breakdown, and the slow-request log.

mod node_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use node_support::Node;

/// One HTTP/1.1 GET; returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read response");
    let (head, body) = text.split_once("\r\n\r\n").expect("header/body split");
    let status = head.lines().next().unwrap_or_default().to_string();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("Content-Length");
    assert_eq!(len, body.len(), "Content-Length matches the body");
    (status, body.to_string())
}

/// The value of a sample line `name value`, if present.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_endpoint_and_info_commandstats() {
    // `sync` durability: every SET waits for a device sync, so the device
    // phase cannot be zero.
    let n = Node::start(&["--metrics", "127.0.0.1:0", "--durability", "sync"]);
    let addr = n
        .metrics_addr()
        .expect("ready line names the metrics address");
    const SETS: usize = 5;
    for i in 0..SETS {
        assert_eq!(n.cli(&["set", &format!("k{i}"), "v"]), "OK");
    }
    assert_eq!(n.cli(&["get", "k1"]), "v");
    assert_eq!(n.cli(&["get", "missing"]), "");
    let _ = n.cli_output(&["nosuchcommand"], None);

    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(body.contains("# TYPE lightstore_command_duration_seconds histogram"));
    let set_buckets: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("lightstore_command_duration_seconds_bucket{command=\"set\""))
        .collect();
    assert_eq!(set_buckets.len(), 33, "32 log2 buckets and +Inf");
    let inf = sample(
        &body,
        "lightstore_command_duration_seconds_bucket{command=\"set\",le=\"+Inf\"}",
    )
    .expect("+Inf bucket");
    assert!(inf >= SETS as f64, "{inf} < {SETS}");
    let count = sample(
        &body,
        "lightstore_command_duration_seconds_count{command=\"get\"}",
    );
    assert!(count.unwrap_or(0.0) >= 2.0, "get count {count:?}");
    assert!(body.contains("command=\"unknown\""));
    for phase in ["protocol", "queue", "engine", "device"] {
        let v = sample(
            &body,
            &format!("lightstore_request_phase_seconds_total{{phase=\"{phase}\"}}"),
        );
        assert!(v.is_some_and(|v| v >= 0.0), "phase {phase}: {v:?}");
    }
    let device = sample(
        &body,
        "lightstore_request_phase_seconds_total{phase=\"device\"}",
    );
    assert!(device.is_some_and(|v| v > 0.0), "synced SETs: {device:?}");
    assert!(sample(&body, "lightstore_engine_segments_free").is_some_and(|v| v > 0.0));
    assert!(body.contains("lightstore_engine_dram_bytes{part=\"index\"}"));
    assert!(body.contains("lightstore_engine_write_amplification "));
    // Device operations by kind; the synced SETs above wrote and synced.
    for op in ["write", "sync"] {
        let count = sample(
            &body,
            &format!("lightstore_device_operation_seconds_count{{op=\"{op}\"}}"),
        );
        assert!(count.is_some_and(|c| c >= 1.0), "{op}: {count:?}");
    }

    let (status, _) = http_get(&addr, "/nope");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");

    let info = n.cli(&["info", "commandstats"]);
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_get:"))
        .unwrap_or_else(|| panic!("no cmdstat_get in {info}"));
    assert!(line.starts_with("cmdstat_get:calls=2,usec="), "{line}");
    for k in ["usec_per_call=", "p50=", "p99=", "p999="] {
        assert!(line.contains(k), "{line}");
    }
    // Synced SETs wait for the device: never on the network thread.
    assert_eq!(info_field(&n, "stats", "inline_sets"), Some(0));
    let info = n.cli(&["info", "latency_breakdown"]);
    for k in [
        "requests:",
        "protocol_us:",
        "queue_us_per_request:",
        "engine_us:",
        "device_us:",
    ] {
        assert!(info.contains(k), "{k} missing in {info}");
    }

    // CONFIG RESETSTAT starts the statistics over, as in Redis.
    assert_eq!(n.cli(&["config", "resetstat"]), "OK");
    let info = n.cli(&["info", "commandstats"]);
    assert!(
        info.lines().all(|l| !l.starts_with("cmdstat_get:")),
        "{info}"
    );
    assert_eq!(n.cli(&["get", "k1"]), "v");
    let info = n.cli(&["info", "commandstats"]);
    assert!(
        info.lines().any(|l| l.starts_with("cmdstat_get:calls=1,")),
        "{info}"
    );
    // The CONFIG, INFO and GET calls since (how a call counts itself
    // varies), not the dozen before.
    let total = info_field(&n, "stats", "total_commands_processed");
    assert!(total.is_some_and(|t| (3..=5).contains(&t)), "{total:?}");
}

/// A numeric field of an INFO section.
fn info_field(n: &Node, section: &str, field: &str) -> Option<u64> {
    let info = n.cli(&["info", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn plain_sets_are_written_on_the_network_thread_under_interval_durability() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut n = Node::start_in(dir.path(), &["--durability", "interval"]).expect("node starts");
    for i in 0..3 {
        assert_eq!(n.cli(&["set", &format!("k{i}"), &format!("v{i}")]), "OK");
    }
    assert_eq!(info_field(&n, "stats", "inline_sets"), Some(3));
    // SET NX reads first: it goes through the executor pool.
    assert_eq!(n.cli(&["set", "k0", "x", "nx"]), "");
    assert_eq!(info_field(&n, "stats", "inline_sets"), Some(3));
    assert_eq!(n.cli(&["get", "k2"]), "v2");
    // A clean stop syncs what the network thread wrote.
    n.stop_cleanly(Duration::from_secs(30));
    drop(n);
    let n = Node::start_in(dir.path(), &[]).expect("node restarts");
    for i in 0..3 {
        assert_eq!(n.cli(&["get", &format!("k{i}")]), format!("v{i}"));
    }
}

/// A lone GET whose value is on the device is answered on the network
/// thread (its read on the io_uring queue), with the same bytes; GETs in a
/// pipelined run still go to the executor pool and agree.
#[test]
fn lone_gets_are_read_on_the_network_thread() {
    use node_support::{call, Resp};
    use std::io::BufReader;

    let dir = tempfile::tempdir().expect("tempdir");
    let value = |i: usize| -> Vec<u8> { (0..8192).map(|j| (i * 31 + j * 7) as u8).collect() };
    const KEYS: usize = 40;
    {
        let mut n = Node::start_in(dir.path(), &[]).expect("node starts");
        let mut conn = BufReader::new(n.connect());
        for i in 0..KEYS {
            let key = format!("key{i}");
            let reply = call(&mut conn, &[b"SET", key.as_bytes(), &value(i)]);
            assert_eq!(reply, Resp::Simple("OK".into()));
        }
        assert_eq!(
            call(&mut conn, &[b"SET", b"empty", b""]),
            Resp::Simple("OK".into())
        );
        n.stop_cleanly(Duration::from_secs(30));
    }
    // After a restart every value is on the device.
    let n = Node::start_in(dir.path(), &[]).expect("node restarts");
    let mut conn = BufReader::new(n.connect());
    for i in 0..KEYS {
        let key = format!("key{i}");
        let got = call(&mut conn, &[b"GET", key.as_bytes()]);
        assert_eq!(got, Resp::Bulk(value(i)), "key{i}");
    }
    assert_eq!(call(&mut conn, &[b"GET", b"empty"]), Resp::Bulk(Vec::new()));
    assert_eq!(call(&mut conn, &[b"GET", b"missing"]), Resp::Nil);
    let lone = KEYS as u64 + 2;
    if engine::flash::io_uring_for_tests() {
        assert_eq!(info_field(&n, "stats", "net_gets"), Some(lone));
    }
    // A pipelined run of GETs goes to the pool (unless TCP splits it).
    let mut pipelined = Vec::new();
    for i in 0..KEYS {
        pipelined.extend(node_support::encode(&[
            b"GET",
            format!("key{i}").as_bytes(),
        ]));
    }
    std::io::Write::write_all(conn.get_mut(), &pipelined).expect("write");
    for i in 0..KEYS {
        let got = node_support::read_reply(&mut conn).expect("reply");
        assert_eq!(got, Resp::Bulk(value(i)), "pipelined key{i}");
    }
    if engine::flash::io_uring_for_tests() {
        let net = info_field(&n, "stats", "net_gets").expect("net_gets");
        assert!(net < lone + KEYS as u64, "every pipelined GET ran alone");
    }
    // An MGET of a few keys is answered there too (values on the device,
    // empty and missing, in order), at one sequence number.
    let before = info_field(&n, "stats", "net_gets").unwrap_or(0);
    let mut keys: Vec<Vec<u8>> = (0..KEYS)
        .rev()
        .map(|i| format!("key{i}").into_bytes())
        .collect();
    keys.extend([b"empty".to_vec(), b"missing".to_vec()]);
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys.iter().map(|k| &k[..]));
    let mut want: Vec<Resp> = (0..KEYS).rev().map(|i| Resp::Bulk(value(i))).collect();
    want.extend([Resp::Bulk(Vec::new()), Resp::Nil]);
    assert_eq!(call(&mut conn, &args), Resp::Array(want.clone()));
    if engine::flash::io_uring_for_tests() {
        let net = info_field(&n, "stats", "net_gets").expect("net_gets");
        assert_eq!(
            net,
            before + keys.len() as u64,
            "the MGET ran on the network thread"
        );
    }
    // So is a 1 MiB block read: 256 chunks of 4 KiB.
    let before = info_field(&n, "stats", "net_gets").unwrap_or(0);
    let block: Vec<Vec<u8>> = (0..256)
        .map(|i| format!("key{}", i % KEYS).into_bytes())
        .collect();
    let mut block_args: Vec<&[u8]> = vec![b"MGET"];
    block_args.extend(block.iter().map(|k| &k[..]));
    let block_want: Vec<Resp> = (0..256).map(|i| Resp::Bulk(value(i % KEYS))).collect();
    assert_eq!(call(&mut conn, &block_args), Resp::Array(block_want));
    if engine::flash::io_uring_for_tests() {
        let net = info_field(&n, "stats", "net_gets").expect("net_gets");
        assert_eq!(
            net,
            before + 256,
            "the 256-key MGET ran on the network thread"
        );
    }
    // A value still in the log's memory may send it to the pool: the
    // answer is the same.
    assert_eq!(
        call(&mut conn, &[b"SET", b"fresh", b"in memory"]),
        Resp::Simple("OK".into())
    );
    args.push(b"fresh");
    want.push(Resp::Bulk(b"in memory".to_vec()));
    assert_eq!(call(&mut conn, &args), Resp::Array(want));
    // A range listing with digests is answered there too once its
    // keytable blocks are cached (the first one may warm them on the
    // pool): the same reply either way. Other RANGEs go to the pool.
    let net_ranges = || info_field(&n, "stats", "net_ranges").expect("net_ranges");
    let listing: [&[u8]; 6] = [b"RANGE", b"key1", b"key3", b"LIMIT", b"5", b"DIGESTS"];
    let first = call(&mut conn, &listing);
    let Resp::Array(items) = &first else {
        panic!("RANGE reply {first:?}");
    };
    assert_eq!(items.len(), 10, "five keys, each with its digest");
    let before = net_ranges();
    assert_eq!(call(&mut conn, &listing), first);
    assert_eq!(
        net_ranges(),
        before + 1,
        "the listing ran on the network thread"
    );
    let Resp::Array(keys_only) = call(
        &mut conn,
        &[b"RANGE", b"key1", b"key3", b"LIMIT", b"5", b"KEYSONLY"],
    ) else {
        panic!("RANGE KEYSONLY reply");
    };
    assert_eq!(keys_only.len(), 5);
    assert_eq!(net_ranges(), before + 1, "KEYSONLY went to the pool");
    let long: [&[u8]; 6] = [b"RANGE", b"key1", b"key3", b"LIMIT", b"257", b"DIGESTS"];
    assert!(matches!(call(&mut conn, &long), Resp::Array(_)));
    assert_eq!(
        net_ranges(),
        before + 1,
        "a LIMIT over 256 went to the pool"
    );
    // A lone VMETA (half of a consistent read's requests) is answered on
    // the network thread from the index, the same as the pool answers it.
    assert_eq!(
        call(&mut conn, &[b"VSET", b"v", b"5", b"five"]),
        Resp::Int(1)
    );
    let net_vmetas = || info_field(&n, "stats", "net_vmetas").expect("net_vmetas");
    let before = net_vmetas();
    let Resp::Array(meta) = call(&mut conn, &[b"VMETA", b"v", b"missing", b"key0"]) else {
        panic!("VMETA reply");
    };
    assert_eq!(
        net_vmetas(),
        before + 1,
        "the VMETA ran on the network thread"
    );
    assert_eq!(meta.len(), 3);
    assert_eq!(meta[1], Resp::Nil);
    let Resp::Array(fields) = &meta[0] else {
        panic!("VMETA entry {:?}", meta[0]);
    };
    assert_eq!(fields[0], Resp::Bulk(b"5".to_vec()));
    assert_eq!(fields[2], Resp::Int(14), "10-byte header + 'five'");
    let Resp::Array(plain) = &meta[2] else {
        panic!("VMETA entry {:?}", meta[2]);
    };
    assert_eq!(
        plain[0],
        Resp::Bulk(b"0".to_vec()),
        "a plain value is version 0"
    );
    assert_eq!(plain[2], Resp::Int(value(0).len() as i64));
    // The device reads behind them are timed, like every other device
    // operation since the restart: INFO device.
    let reads = device_stat(&n, "read");
    assert!(reads.0 >= KEYS as u64, "{} device reads timed", reads.0);
    assert!(reads.1 > 0, "slowest device read took 0 µs");
}

/// `(calls, max)` of one operation in INFO device, whose every line holds
/// the same fields as INFO commandstats and the slowest call's time.
fn device_stat(n: &Node, op: &str) -> (u64, u64) {
    let info = n.cli(&["info", "device"]);
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("device_{op}:")))
        .unwrap_or_else(|| panic!("no device_{op} in {info}"));
    let field = |k: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line}"))
    };
    for k in ["usec", "p50", "p99", "p999"] {
        field(k);
    }
    (field("calls"), field("max"))
}

#[test]
fn metrics_are_off_by_default() {
    let n = Node::start(&[]);
    assert_eq!(n.cli(&["ping"]), "PONG");
    assert_eq!(n.metrics_addr(), None);
}

#[test]
fn slowlog_logs_requests_with_their_breakdown() {
    let n = Node::start(&["--slowlog-ms", "0"]);
    assert_eq!(n.cli(&["set", "slow", "v"]), "OK");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = n.log_text();
        if let Some(line) = log
            .lines()
            .find(|l| l.contains("slow request") && l.contains("command=\"set\""))
        {
            for k in [
                "total_us=",
                "protocol_us=",
                "queue_us=",
                "engine_us=",
                "device_us=",
            ] {
                assert!(line.contains(k), "{k} missing in {line}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no slow-request line in:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn slowlog_is_quiet_below_the_threshold() {
    let n = Node::start(&["--slowlog-ms", "60000"]);
    assert_eq!(n.cli(&["set", "fast", "v"]), "OK");
    assert_eq!(n.cli(&["get", "fast"]), "v");
    std::thread::sleep(Duration::from_millis(100));
    assert!(!n.log_text().contains("slow request"));
}
