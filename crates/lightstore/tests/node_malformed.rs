//! Malformed and hostile RESP streams over raw TCP: the node answers
//! `-ERR Protocol error` (or an ordinary error) and closes, never panics,
//! and keeps serving other connections.

mod node_support;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use node_support::{call, Node, Resp};

/// A second connection still works.
fn still_serving(n: &Node) {
    let mut c = BufReader::new(n.connect());
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
    assert_eq!(
        call(&mut c, &[b"SET", b"k", b"v"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(call(&mut c, &[b"GET", b"k"]), Resp::Bulk(b"v".to_vec()));
}

#[test]
fn protocol_errors_close_only_that_connection() {
    let n = Node::start(&[]);
    for (input, want) in [
        (&b"*-5\r\n*1\r\n$4\r\nPING\r\nQUIT\r\n"[..], "+PONG"), // *-N: empty request
        (b"*1\r\n$-3\r\n", "-ERR Protocol error: invalid bulk length"),
        (b"*99999999999\r\n", "-ERR Protocol error"),
        (b"*1\r\n$99999999999\r\n", "-ERR Protocol error"),
        (b"*x\r\n", "-ERR Protocol error: invalid multibulk length"),
        (b"*2\r\n:1\r\n", "-ERR Protocol error: expected '$'"),
        (b"*1\r\n$4\r\nPINGxx\r\n", "-ERR Protocol error"),
        (
            b"set \"unbalanced\r\n",
            "-ERR Protocol error: unbalanced quotes",
        ),
    ] {
        let got = n.send_and_drain(input);
        assert!(
            got.starts_with(want),
            "{:?}: got {got:?}",
            String::from_utf8_lossy(input)
        );
        still_serving(&n);
    }
}

#[test]
fn garbage_and_truncated_frames() {
    let n = Node::start(&[]);
    // Truncated frames: the client goes away mid-request.
    for input in [
        &b"*3\r\n$3\r\nSET\r\n$1\r\nk"[..],
        b"*2\r\n$3\r\nGET",
        b"$",
        b"*",
    ] {
        let mut s = n.connect();
        s.write_all(input).unwrap();
        drop(s);
    }
    // Random garbage, including bytes that look like RESP type markers.
    let mut seed = 0x2545f4914f6cdd1du64;
    for _ in 0..20 {
        let garbage: Vec<u8> = (0..4096)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        let mut s = n.connect();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let _ = s.write_all(&garbage);
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
    }
    // An inline line longer than the limit (64 KiB).
    let long = vec![b'a'; 100 << 10];
    let got = n.send_and_drain(&long);
    assert!(got.starts_with("-ERR Protocol error"), "{got:?}");
    still_serving(&n);
}

#[test]
fn hundred_thousand_argument_request() {
    let n = Node::start(&[]);
    let mut req = b"*100000\r\n".to_vec();
    for _ in 0..100_000 {
        req.extend_from_slice(b"$1\r\nx\r\n");
    }
    let mut s = BufReader::new(n.connect());
    s.get_mut().write_all(&req).unwrap();
    let r = node_support::read_reply(&mut s).expect("a reply");
    assert!(
        matches!(&r, Resp::Error(e) if e.starts_with("ERR unknown command 'x'")),
        "{r:?}"
    );
    // A known command with a huge argument list works too.
    let mut req = b"*50001\r\n$6\r\nEXISTS\r\n".to_vec();
    for _ in 0..50_000 {
        req.extend_from_slice(b"$1\r\nk\r\n");
    }
    s.get_mut().write_all(&req).unwrap();
    assert_eq!(node_support::read_reply(&mut s).unwrap(), Resp::Int(0));
    assert_eq!(
        node_support::call(&mut s, &[b"PING"]),
        Resp::Simple("PONG".into())
    );
    still_serving(&n);
}

#[test]
fn many_clients_and_maxclients() {
    let n = Node::start(&["--maxclients", "3"]);
    let held: Vec<TcpStream> = (0..3).map(|_| n.connect()).collect();
    // The accept of the third may race the check; a ping makes sure all are counted.
    for s in &held {
        let mut c = BufReader::new(s.try_clone().unwrap());
        assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
    }
    let got = n.send_and_drain(b"PING\r\n");
    assert!(
        got.starts_with("-ERR max number of clients reached"),
        "{got:?}"
    );
    drop(held);
    // Slots free up once the clients leave.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = send_and_drain_ping(&n);
        if got.starts_with("+PONG") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{got:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn send_and_drain_ping(n: &Node) -> String {
    let mut s = n.connect();
    let _ = s.write_all(b"PING\r\nQUIT\r\n");
    node_support::drain(&mut s)
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A client pipelines 300 GETs of a 2 MiB value (600 MiB of replies) and
/// reads nothing: the node holds a bounded part of that, not all of it.
/// Once the client reads, every reply arrives, in order and intact, and
/// memory goes back. An MGET whose values exceed the reply bound is refused.
#[test]
fn slow_reader_of_large_values_cannot_make_the_node_buffer_them_all() {
    let n = Node::start(&[]);
    let value: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut c = BufReader::new(n.connect());
    assert_eq!(
        call(&mut c, &[b"SET", b"big", &value]),
        Resp::Simple("OK".into())
    );
    let pid = n.child.id();
    let before = rss_kib(pid);
    let mut s = n.connect();
    let count = 300;
    s.write_all(&b"GET big\r\n".repeat(count)).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let stalled = rss_kib(pid);
    assert!(
        stalled < before + 128 * 1024,
        "node grew from {before} KiB to {stalled} KiB for an unread pipeline"
    );
    let mut r = BufReader::new(s);
    for i in 0..count {
        match node_support::read_reply(&mut r).expect("reply") {
            Resp::Bulk(v) => assert!(v == value, "reply {i} differs"),
            other => panic!("reply {i}: {other:?}"),
        }
    }
    let after = rss_kib(pid);
    assert!(
        after < before + 128 * 1024,
        "node kept {after} KiB after serving, {before} KiB before"
    );
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(std::iter::repeat_n(&b"big"[..], 129)); // 258 MiB > 256 MiB
    match call(&mut c, &args) {
        Resp::Error(e) => assert!(e.starts_with("ERR reply too large"), "{e}"),
        other => panic!("MGET over the bound: {other:?}"),
    }
    still_serving(&n);
}

/// `max_reply` bounds MGET and RANGE replies (refused with a clear error,
/// nothing else changes); below it both answer in full; SCAN lists keys
/// whatever their values' size; CONFIG GET reports the bound.
#[test]
fn max_reply_bounds_mget_and_range_replies() {
    let n = Node::start(&["--max-reply", "1M"]);
    let mut c = BufReader::new(n.connect());
    let value = vec![7u8; 300 << 10];
    for k in [&b"r1"[..], b"r2", b"r3", b"r4"] {
        assert_eq!(
            call(&mut c, &[b"SET", k, &value]),
            Resp::Simple("OK".into())
        );
    }
    let refused = |r: Resp, what: &str| match r {
        Resp::Error(e) => assert!(e.starts_with("ERR reply too large"), "{what}: {e}"),
        other => panic!("{what} over max-reply: {other:?}"),
    };
    refused(call(&mut c, &[b"MGET", b"r1", b"r2", b"r3", b"r4"]), "MGET");
    refused(call(&mut c, &[b"RANGE", b"r", b"s"]), "RANGE");
    match call(&mut c, &[b"MGET", b"r1", b"r2", b"r3"]) {
        Resp::Array(v) => assert_eq!(v.len(), 3),
        other => panic!("MGET within max-reply: {other:?}"),
    }
    match call(&mut c, &[b"RANGE", b"r", b"s", b"LIMIT", b"3"]) {
        Resp::Array(v) => assert_eq!(v.len(), 6),
        other => panic!("RANGE within max-reply: {other:?}"),
    }
    match call(&mut c, &[b"RANGE", b"r", b"s", b"KEYSONLY"]) {
        Resp::Array(v) => assert_eq!(v.len(), 4),
        other => panic!("RANGE KEYSONLY: {other:?}"),
    }
    match call(&mut c, &[b"SCAN", b"0", b"MATCH", b"r*", b"COUNT", b"100"]) {
        Resp::Array(v) => assert_eq!(
            v[1],
            Resp::Array(
                (1..=4)
                    .map(|i| Resp::Bulk(format!("r{i}").into_bytes()))
                    .collect()
            )
        ),
        other => panic!("SCAN: {other:?}"),
    }
    // Keys count too: 130 keys of 8 KiB exceed 1 MiB even without values.
    for i in 0..130u32 {
        let mut k = vec![b'z'; 8192];
        k[8188..].copy_from_slice(&i.to_be_bytes());
        assert_eq!(call(&mut c, &[b"SET", &k, b"v"]), Resp::Simple("OK".into()));
    }
    refused(
        call(
            &mut c,
            &[b"RANGE", b"z", b"", b"KEYSONLY", b"LIMIT", b"1000"],
        ),
        "RANGE KEYSONLY",
    );
    match call(
        &mut c,
        &[b"RANGE", b"z", b"", b"KEYSONLY", b"LIMIT", b"100"],
    ) {
        Resp::Array(v) => assert_eq!(v.len(), 100),
        other => panic!("RANGE KEYSONLY within max-reply: {other:?}"),
    }
    match call(&mut c, &[b"CONFIG", b"GET", b"max-reply"]) {
        Resp::Array(v) => assert_eq!(v[1], Resp::Bulk(b"1048576".to_vec())),
        other => panic!("CONFIG GET max-reply: {other:?}"),
    }
    still_serving(&n);
}

/// A client that asks for replies and never reads them is closed once a
/// reply write has made no progress for `--reply-timeout-ms`, rather than
/// kept for good; a client that reads slowly but steadily is not.
#[test]
fn a_client_that_never_reads_its_replies_is_closed() {
    let n = Node::start(&["--reply-timeout-ms", "500"]);
    let value = vec![b'r'; 2 << 20];
    let mut c = BufReader::new(n.connect());
    assert_eq!(
        call(&mut c, &[b"SET", b"big", &value]),
        Resp::Simple("OK".into())
    );
    let info = |c: &mut BufReader<std::net::TcpStream>, field: &str| -> u64 {
        match call(c, &[b"INFO"]) {
            Resp::Bulk(b) => String::from_utf8_lossy(&b)
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:"))?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{field} not in INFO")),
            other => panic!("INFO: {other:?}"),
        }
    };
    // 200 MiB of replies, far more than the sockets' buffers hold.
    let mut mute = n.connect();
    mute.write_all(&b"GET big\r\n".repeat(100)).unwrap();
    // A slow reader beside it: 40 replies, one every 200 ms.
    let mut slow = BufReader::new(n.connect());
    slow.get_mut()
        .write_all(&b"GET big\r\n".repeat(40))
        .unwrap();
    let started = Instant::now();
    for i in 0..40 {
        std::thread::sleep(Duration::from_millis(200));
        match node_support::read_reply(&mut slow).expect("the slow reader is served") {
            Resp::Bulk(v) => assert!(v == value, "reply {i} differs"),
            other => panic!("reply {i}: {other:?}"),
        }
    }
    assert!(started.elapsed() > Duration::from_secs(8));
    assert_eq!(
        info(&mut c, "reply_timeouts"),
        1,
        "the mute client was closed"
    );
    assert_eq!(
        info(&mut c, "connected_clients"),
        2,
        "c and the slow reader remain"
    );
    // The closed client reads what was sent before the close, then the end.
    mute.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = mute.read_to_end(&mut got);
    assert!(
        got.len() < 100 * value.len(),
        "all {} bytes arrived",
        got.len()
    );
}

/// Every command the node knows (and some it refuses or does not know),
/// with random arguments drawn from values that parse and values that do
/// not (numbers at and past their limits, reserved keys, binary, large),
/// seeded: each request gets a reply, the node never closes the
/// connection or dies, and it serves normally afterwards. `SHUTDOWN`,
/// `QUIT`, `HELLO` (RESP3) and `CONFIG SET` are left out: they end the
/// connection, change its protocol or the node's settings on purpose.
#[test]
fn every_command_with_random_arguments_gets_a_reply() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    const COMMANDS: &[&str] = &[
        "PING", "ECHO", "AUTH", "CLIENT", "SELECT", "COMMAND", "CONFIG", "SET", "GET", "MSET",
        "MGET", "DEL", "EXISTS", "STRLEN", "GETRANGE", "SCAN", "RANGE", "VSET", "VDEL", "VBATCH",
        "VCAS", "VMETA", "FSYNC", "HINT", "DBSIZE", "INFO", "EXPIRE", "INCR", "HSET", "NOSUCH",
    ];
    let big = vec![b'x'; 100_000];
    let words: Vec<&[u8]> = vec![
        b"k",
        b"k2",
        b"",
        b"0",
        b"1",
        b"-1",
        b"7",
        b"18446744073709551615",
        b"18446744073709551616",
        b"-9223372036854775809",
        b"SET",
        b"DEL",
        b"NX",
        b"XX",
        b"GET",
        b"MATCH",
        b"COUNT",
        b"LIMIT",
        b"KEYSONLY",
        b"DIGESTS",
        b"*",
        b"a*",
        b"[",
        b"GETNAME",
        b"SETNAME",
        b"ID",
        b"stats",
        b"engine",
        b"RESETSTAT",
        b"\xff\xff\xff\xfflightstore/h",
        b"127.0.0.1:1",
        b"\x00\xff\r\n",
        &big,
    ];
    let n = Node::start(&[]);
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(26);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut c = BufReader::new(n.connect());
    let mut errors = 0;
    for i in 0..3000 {
        let cmd = COMMANDS[rng.gen_range(0..COMMANDS.len())].as_bytes();
        let mut args: Vec<&[u8]> = vec![cmd];
        for _ in 0..rng.gen_range(0..7) {
            args.push(words[rng.gen_range(0..words.len())]);
        }
        if cmd == b"CONFIG" && args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(b"SET")) {
            continue;
        }
        c.get_mut()
            .write_all(&node_support::encode(&args))
            .expect("write");
        let reply = node_support::read_reply(&mut c);
        if matches!(reply, Ok(Resp::Error(_))) {
            errors += 1;
        }
        if let Err(e) = reply {
            let shown: Vec<String> = args
                .iter()
                .map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned())
                .collect();
            panic!("seed {seed}, request {i} {shown:?}: no reply ({e})");
        }
    }
    assert!(
        errors < 2700,
        "{errors} of 3000 replies were errors: arguments too wild"
    );
    still_serving(&n);
    let log = n.log_text();
    assert!(
        !log.contains("panicked"),
        "seed {seed}: a command panicked:\n{log}"
    );
}
