//! What clients can make the node hold before a request runs: one request
//! is bounded by `max_request` whatever its argument count, all requests
//! being read together by `max_request_memory`, and a client that has not
//! authenticated on a node with a password by a few small arguments.

mod node_support;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use node_support::{call, read_reply, Node, Resp};

const MIB: usize = 1 << 20;

/// Node flags for the wait tests: requests of up to 20 MiB, and request
/// memory for one 16 MiB request being read and a smaller one beside it.
const ROOM_FOR_ONE_BIG_REQUEST: [&str; 6] = [
    "--max-bulk",
    "20M",
    "--max-request",
    "21M",
    "--max-request-memory",
    "34M",
];

/// A second connection still works.
fn still_serving(n: &Node) {
    let mut c = BufReader::new(n.connect());
    assert_eq!(
        call(&mut c, &[b"SET", b"k", b"v"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(call(&mut c, &[b"GET", b"k"]), Resp::Bulk(b"v".to_vec()));
}

/// One INFO field as a number.
fn info_field(n: &Node, name: &str) -> u64 {
    let mut c = BufReader::new(n.connect());
    let Resp::Bulk(text) = call(&mut c, &[b"INFO", b"clients"]) else {
        panic!("INFO");
    };
    let text = String::from_utf8(text).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from INFO: {text}"))
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// One `/proc/PID/status` field in KiB (`VmRSS:`, `VmData:`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect(field)
}

/// The head of `SET key <len bytes>`: everything before the value.
fn set_head(key: &str, len: usize) -> Vec<u8> {
    format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${len}\r\n", key.len()).into_bytes()
}

/// The value stored under key number `i` (each 4 KiB marked with its place).
fn value_of(i: usize, len: usize) -> Vec<u8> {
    let mut v = vec![i as u8; len];
    for j in (0..len).step_by(4096) {
        v[j] = (j / 4096 % 251) as u8;
    }
    v
}

#[test]
fn max_request_bounds_one_request_whatever_its_argument_count() {
    let n = Node::start(&["--max-bulk", "1M", "--max-request", "4M"]);
    let value = vec![5u8; 900 << 10];
    let mset = |count: usize| {
        let mut args: Vec<Vec<u8>> = vec![b"MSET".to_vec()];
        for i in 0..count {
            args.push(format!("m{i}").into_bytes());
            args.push(value.clone());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        node_support::encode(&refs)
    };
    // Four values of 900 KiB fit 4 MiB; five do not.
    let mut c = BufReader::new(n.connect());
    c.get_mut().write_all(&mset(4)).unwrap();
    assert_eq!(read_reply(&mut c).unwrap(), Resp::Simple("OK".into()));
    let got = n.send_and_drain(&mset(5));
    assert!(
        got.starts_with("-ERR Protocol error: request larger than the limit of 4194304 bytes"),
        "{got:?}"
    );
    assert_eq!(
        call(&mut c, &[b"EXISTS", b"m4"]),
        Resp::Int(0),
        "nothing of the refused request was written"
    );
    match call(&mut c, &[b"CONFIG", b"GET", b"max-request"]) {
        Resp::Array(v) => assert_eq!(v[1], Resp::Bulk(b"4194304".to_vec())),
        other => panic!("CONFIG GET max-request: {other:?}"),
    }
    still_serving(&n);

    // A request bound below the bulk bound cannot work: refused at start.
    let tmp = tempfile::tempdir().unwrap();
    match Node::start_in(tmp.path(), &["--max-request", "1M"]) {
        Err((code, log)) => {
            assert_ne!(code, Some(0));
            assert!(log.contains("max_request"), "{log}");
        }
        Ok(_) => panic!("a node started with max_request below max_bulk"),
    }
}

#[test]
fn unauthenticated_clients_may_send_only_small_requests() {
    let n = Node::start(&["--requirepass", "secret"]);
    let got = n.send_and_drain(&set_head("k", 100_000));
    assert!(
        got.starts_with("-ERR Protocol error: bulk length 100000 exceeds the limit of 16384"),
        "{got:?}"
    );
    let got = n.send_and_drain(b"*11\r\n");
    assert!(
        got.starts_with("-ERR Protocol error: 11 arguments"),
        "{got:?}"
    );
    // AUTH pipelined in front of a large SET lifts the limits for the SET.
    let value = value_of(1, 100_000);
    let mut wire = node_support::encode(&[b"AUTH", b"secret"]);
    wire.extend(node_support::encode(&[b"SET", b"big", &value]));
    wire.extend(node_support::encode(&[b"GET", b"big"]));
    let mut c = BufReader::new(n.connect());
    c.get_mut().write_all(&wire).unwrap();
    assert_eq!(read_reply(&mut c).unwrap(), Resp::Simple("OK".into()));
    assert_eq!(read_reply(&mut c).unwrap(), Resp::Simple("OK".into()));
    assert_eq!(read_reply(&mut c).unwrap(), Resp::Bulk(value));
    // A wrong password keeps them.
    let mut wire = node_support::encode(&[b"AUTH", b"wrong"]);
    wire.extend(set_head("k", 20_000));
    let got = n.send_and_drain(&wire);
    assert!(got.contains("-ERR Protocol error: bulk length"), "{got:?}");
}

/// Sixteen clients each start a 16 MiB SET, send half of it and stall. With
/// 34 MiB of request memory, the node reads two of them and the rest wait
/// (their bytes stay in the kernel's socket buffers, not in the node); when
/// the clients send the rest, every SET completes and every value is intact.
#[test]
fn requests_being_read_share_a_node_wide_bound() {
    let n = Node::start(&[
        "--max-bulk",
        "16M",
        "--max-request",
        "17M",
        "--max-request-memory",
        "34M",
    ]);
    let pid = n.child.id();
    let before = rss_kib(pid);
    let len = 16 * MIB;
    let clients = 16;
    let mut conns: Vec<TcpStream> = Vec::new();
    let mut senders = Vec::new();
    let mut go = Vec::new();
    for i in 0..clients {
        let s = n.connect();
        let mut w = s.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        go.push(tx);
        senders.push(std::thread::spawn(move || {
            let value = value_of(i, len);
            w.write_all(&set_head(&format!("big{i}"), len)).unwrap();
            // Blocks in the kernel for the connections the node does not read.
            w.write_all(&value[..len / 2]).unwrap();
            rx.recv().unwrap();
            w.write_all(&value[len / 2..]).unwrap();
            w.write_all(b"\r\n").unwrap();
        }));
        conns.push(s);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&n, "request_memory_waits") < (clients - 2) as u64 {
        assert!(Instant::now() < deadline, "connections never waited");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "node grew by {grown} KiB holding 16 half-read 16 MiB requests"
    );
    for tx in go {
        tx.send(()).unwrap();
    }
    for (i, s) in conns.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut r = BufReader::new(s);
        assert_eq!(
            read_reply(&mut r).unwrap(),
            Resp::Simple("OK".into()),
            "SET {i}"
        );
    }
    for t in senders {
        t.join().unwrap();
    }
    let mut c = BufReader::new(n.connect());
    for i in 0..clients {
        let key = format!("big{i}");
        assert!(
            call(&mut c, &[b"GET", key.as_bytes()]) == Resp::Bulk(value_of(i, len)),
            "value {i} differs"
        );
    }
    assert_eq!(info_field(&n, "request_memory_bytes"), 0);
}

/// A connection already holding part of a request that needs more than
/// the budget has left is refused with a clear error, not left waiting on
/// the others (which could be waiting on it); the others complete.
#[test]
fn a_half_read_request_that_cannot_grow_is_refused() {
    let n = Node::start(&[
        "--max-bulk",
        "16M",
        "--max-request",
        "32M",
        "--max-request-memory",
        "32M",
    ]);
    let len = 16 * MIB;
    // B holds most of 16 MiB: it announced a 16 MiB value and sent 1 MiB.
    let mut b = n.connect();
    b.write_all(&set_head("b", len)).unwrap();
    let value_b = value_of(2, len);
    b.write_all(&value_b[..MIB]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&n, "request_memory_bytes") < 15 * MIB as u64 {
        assert!(Instant::now() < deadline, "B never took its share");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A: MSET of two 12 MiB values; the first fits, the second does not.
    let mut a = n.connect();
    let small = 12 * MIB;
    let first = value_of(1, small);
    let mut wire = format!("*5\r\n$4\r\nMSET\r\n$2\r\na1\r\n${small}\r\n").into_bytes();
    wire.extend_from_slice(&first);
    wire.extend_from_slice(format!("\r\n$2\r\na2\r\n${small}\r\n").as_bytes());
    wire.extend_from_slice(&first[..1024]);
    a.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    a.write_all(&wire).unwrap();
    let got = node_support::drain(&mut a);
    assert!(got.starts_with("-ERR request memory exhausted"), "{got:?}");
    assert_eq!(info_field(&n, "request_memory_refusals"), 1);
    // B completes.
    b.write_all(&value_b[MIB..]).unwrap();
    b.write_all(b"\r\n").unwrap();
    let mut r = BufReader::new(b);
    assert_eq!(read_reply(&mut r).unwrap(), Resp::Simple("OK".into()));
    let mut c = BufReader::new(n.connect());
    assert_eq!(call(&mut c, &[b"EXISTS", b"a1"]), Resp::Int(0));
    assert!(call(&mut c, &[b"GET", b"b"]) == Resp::Bulk(value_b));
    still_serving(&n);
}

/// Request memory is given back once requests are done: after a value over
/// the allowance while the connection idles, and while a client that does
/// not read its replies keeps the node waiting on it.
#[test]
fn request_memory_goes_back_when_requests_are_done() {
    let n = Node::start(&[]);
    let mut idle = BufReader::new(n.connect());
    let value = value_of(3, 600 << 10);
    assert_eq!(
        call(&mut idle, &[b"SET", b"mid", &value]),
        Resp::Simple("OK".into())
    );
    assert_eq!(info_field(&n, "request_memory_bytes"), 0, "idle connection");
    // 16 MiB SET and three GETs of it, replies never read.
    let big = value_of(4, 16 * MIB);
    let mut wire = node_support::encode(&[b"SET", b"big", &big]);
    for _ in 0..3 {
        wire.extend(node_support::encode(&[b"GET", b"big"]));
    }
    let mut s = n.connect();
    s.write_all(&wire).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&n, "request_memory_bytes") > 0 {
        assert!(
            Instant::now() < deadline,
            "a client not reading its replies kept request memory"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut r = BufReader::new(s);
    assert_eq!(read_reply(&mut r).unwrap(), Resp::Simple("OK".into()));
    for i in 0..3 {
        assert!(
            read_reply(&mut r).unwrap() == Resp::Bulk(big.clone()),
            "GET {i}"
        );
    }
    assert_eq!(call(&mut idle, &[b"GET", b"mid"]), Resp::Bulk(value));
}

/// A client sending a `len`-byte SET of `key`: 1 MiB at once, then 1 KiB
/// every 100 ms (so that it is not taken for a stalled client) until told
/// to send the rest.
struct Trickler {
    go: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<TcpStream>,
}

impl Trickler {
    fn start(n: &Node, key: &'static str, value: Vec<u8>) -> Trickler {
        let mut s = n.connect();
        let (go, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            s.write_all(&set_head(key, value.len())).unwrap();
            s.write_all(&value[..MIB]).unwrap();
            let mut sent = MIB;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_millis(100))
            {
                let end = (sent + 1024).min(value.len() - 1);
                s.write_all(&value[sent..end]).unwrap();
                sent = end;
            }
            s.write_all(&value[sent..]).unwrap();
            s.write_all(b"\r\n").unwrap();
            s
        });
        Trickler { go, thread }
    }

    /// Sends the rest and returns the connection.
    fn finish(self) -> TcpStream {
        self.go.send(()).unwrap();
        self.thread.join().unwrap()
    }
}

/// Waits until the node has taken at least `bytes` of request memory.
fn wait_for_request_memory(n: &Node, bytes: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(n, "request_memory_bytes") < bytes as u64 {
        assert!(
            Instant::now() < deadline,
            "request memory never reached {bytes}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A wait for request memory is bounded by `--request-memory-wait-ms`, and
/// so is a stall of a client holding request memory.
#[test]
fn waits_and_stalls_are_bounded() {
    let n = Node::start(
        &[
            &ROOM_FOR_ONE_BIG_REQUEST[..],
            &["--request-memory-wait-ms", "1500"],
        ]
        .concat(),
    );
    let len_b = 16 * MIB;
    // D announces 20 MiB while B holds 16: D waits 1.5 s, then is refused.
    let b = Trickler::start(&n, "b", value_of(2, len_b));
    wait_for_request_memory(&n, 15 * MIB);
    let mut d = n.connect();
    d.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    d.write_all(&set_head("d", 20 * MIB)).unwrap();
    let got = node_support::drain(&mut d);
    assert!(
        got.starts_with("-ERR request memory exhausted: waited 1500 ms"),
        "{got:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let b = b.finish();
    let mut b = BufReader::new(b);
    assert_eq!(read_reply(&mut b).unwrap(), Resp::Simple("OK".into()));
    let mut q = BufReader::new(n.connect());
    assert!(call(&mut q, &[b"GET", b"b"]) == Resp::Bulk(value_of(2, len_b)));
    // E sends 1 MiB of a 16 MiB value and stops: closed after 1.5 s, and
    // its request memory is back.
    let mut e = n.connect();
    e.write_all(&set_head("e", len_b)).unwrap();
    e.write_all(&value_of(7, MIB)).unwrap();
    wait_for_request_memory(&n, 15 * MIB);
    e.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let got = node_support::drain(&mut e);
    assert!(
        got.starts_with("-ERR request timed out: no bytes for 1500 ms"),
        "{got:?}"
    );
    assert_eq!(info_field(&n, "request_memory_stalls"), 1);
    assert_eq!(info_field(&n, "request_memory_bytes"), 0);
    assert_eq!(call(&mut q, &[b"EXISTS", b"e"]), Resp::Int(0));
}

/// A connection that has read nothing of its next request waits for room
/// (with the default wait bound: here the wait lasts as long as B takes).
#[test]
fn a_connection_waits_for_room_for_its_next_request() {
    let n = Node::start(&ROOM_FOR_ONE_BIG_REQUEST);
    let len_b = 16 * MIB;
    let b = Trickler::start(&n, "b", value_of(2, len_b));
    wait_for_request_memory(&n, 15 * MIB);
    // C pipelines a 4 MiB SET and the head of a 20 MiB one: the first is
    // read and run, then C waits (having read nothing of the second)
    // until B is done, and both complete.
    let refusals = info_field(&n, "request_memory_refusals");
    let waits = info_field(&n, "request_memory_waits");
    let mut c = n.connect();
    let c1 = value_of(5, 4 * MIB);
    let mut wire = node_support::encode(&[b"SET", b"c1", &c1]);
    wire.extend(set_head("c2", 20 * MIB));
    c.write_all(&wire).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    assert_eq!(read_reply(&mut r).unwrap(), Resp::Simple("OK".into()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&n, "request_memory_waits") == waits {
        assert!(Instant::now() < deadline, "C never waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let b = b.finish();
    let c2 = value_of(6, 20 * MIB);
    c.write_all(&c2).unwrap();
    c.write_all(b"\r\n").unwrap();
    assert_eq!(read_reply(&mut r).unwrap(), Resp::Simple("OK".into()));
    assert_eq!(info_field(&n, "request_memory_refusals"), refusals);
    let mut b = BufReader::new(b);
    assert_eq!(read_reply(&mut b).unwrap(), Resp::Simple("OK".into()));
    let mut q = BufReader::new(n.connect());
    assert!(call(&mut q, &[b"GET", b"c2"]) == Resp::Bulk(c2));
    assert!(call(&mut q, &[b"GET", b"c1"]) == Resp::Bulk(c1));
    assert!(call(&mut q, &[b"GET", b"b"]) == Resp::Bulk(value_of(2, len_b)));
}

/// A request of many tiny arguments, each in its own packet: the node must
/// not keep a read buffer alive per argument (it is charged per byte).
#[test]
fn tiny_arguments_one_per_packet_do_not_pin_buffers() {
    let n = Node::start(&[]);
    let pid = n.child.id();
    // Allocated, not only touched: a buffer kept alive for a few bytes is
    // mostly untouched, but the allocator cannot hand it out again.
    let before = status_kib(pid, "VmData:");
    let mut s = n.connect();
    s.set_nodelay(true).unwrap();
    let count = 2000;
    s.write_all(format!("*{}\r\n$4\r\nMSET\r\n", count * 2 + 1).as_bytes())
        .unwrap();
    for i in 0..count * 2 - 1 {
        s.write_all(format!("$1\r\n{}\r\n", i % 10).as_bytes())
            .unwrap();
        if i % 2 == 0 {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    // The request is still open (one argument missing): what does it hold?
    std::thread::sleep(Duration::from_millis(300));
    let grown = status_kib(pid, "VmData:").saturating_sub(before);
    assert!(
        grown < 24 * 1024,
        "node allocated {grown} KiB more for 4000 one-byte arguments"
    );
    s.write_all(b"$1\r\nx\r\n").unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(read_reply(&mut r).unwrap(), Resp::Simple("OK".into()));
}
