//! `lightstore nbd` against clients that break the rules, spoken raw over
//! its Unix socket: bad client flags, bad option magic, unknown options,
//! malformed INFO/GO, requests past the end, a 1 GiB read, unknown
//! commands, bad request magic, an oversized write and a client that
//! disconnects mid-write. Each gets the protocol's error or a closed
//! connection; the server never dies and other connections keep working.

mod nbd_support;
mod node_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nbd_support::NbdProc;
use node_support::Node;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const EXPORT_SIZE: u64 = 16 << 20;

fn connect(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).expect("read");
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Whether the server closed the connection (EOF within the timeout).
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Reads the greeting and sends the client flags.
fn greet(s: &mut UnixStream, flags: u32) {
    let g = read_n(s, 18);
    assert_eq!(&g[..8], b"NBDMAGIC");
    s.write_all(&flags.to_be_bytes()).expect("flags");
}

fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).expect("option");
}

/// Reads one option reply: (reply type, data).
fn option_reply(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(
        u64::from_be_bytes(h[..8].try_into().expect("8")),
        REPLY_MAGIC
    );
    let len = u32_at(&h, 16) as usize;
    (u32_at(&h, 12), read_n(s, len))
}

fn go_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

/// A connection in transmission on export `vol1` (simple replies).
fn open(sock: &Path) -> UnixStream {
    let mut s = connect(sock);
    greet(&mut s, 3);
    send_option(&mut s, 7, &go_data("vol1"));
    loop {
        let (kind, _) = option_reply(&mut s);
        if kind == 1 {
            return s;
        }
        assert_eq!(kind, 3, "NBD_REP_INFO before ACK");
    }
}

/// Appends one request (header and payload) to `b`.
fn encode(b: &mut Vec<u8>, kind: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
    b.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(payload);
}

fn request(s: &mut UnixStream, kind: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
    let mut b = Vec::new();
    encode(&mut b, kind, handle, offset, length, payload);
    s.write_all(&b).expect("request");
}

/// Reads a simple reply: (error, handle).
fn simple_reply(s: &mut UnixStream) -> (u32, u64) {
    let h = read_n(s, 16);
    assert_eq!(u32_at(&h, 0), SIMPLE_REPLY_MAGIC);
    (
        u32_at(&h, 4),
        u64::from_be_bytes(h[8..16].try_into().expect("8")),
    )
}

/// The server still serves a well-behaved client: write, read back.
fn still_serves(sock: &Path, tag: u8) {
    let mut s = open(sock);
    request(&mut s, 1, 7, 4096, 512, &[tag; 512]);
    assert_eq!(simple_reply(&mut s), (0, 7));
    request(&mut s, 0, 8, 4096, 512, &[]);
    assert_eq!(simple_reply(&mut s), (0, 8));
    assert_eq!(read_n(&mut s, 512), vec![tag; 512]);
    request(&mut s, 2, 9, 0, 0, &[]);
    assert!(closed(&mut s), "DISC closes");
}

/// Requests and a DISC sent in one write (read by the server in one read
/// call, run as one batch): every request is answered
/// before the connection closes.
fn pipelined_requests_then_disc_are_all_answered(sock: &Path) {
    let mut s = open(sock);
    let mut b = Vec::new();
    encode(&mut b, 1, 20, 8192, 512, &[5; 512]);
    for h in 21..=24u64 {
        encode(&mut b, 0, h, 1 << 20 | (h * 512), 512, &[]);
    }
    encode(&mut b, 2, 25, 0, 0, &[]);
    s.write_all(&b).expect("requests");
    let mut answered = Vec::new();
    for _ in 0..5 {
        let (err, handle) = simple_reply(&mut s);
        assert_eq!(err, 0, "request {handle}");
        if handle != 20 {
            assert_eq!(read_n(&mut s, 512), vec![0; 512], "read {handle}");
        }
        answered.push(handle);
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![20, 21, 22, 23, 24]);
    assert!(closed(&mut s), "DISC closes after the replies");
}

#[test]
fn bad_clients_get_errors_or_closed_connections_and_the_server_lives() {
    let node = Node::start(&[]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("nbd.sock");
    let _nbd = NbdProc::start(
        &format!("127.0.0.1:{}", node.port),
        &sock,
        &["--export", "vol1", "--size", "16M"],
    );
    still_serves(&sock, 1);

    // Unknown client flags: the connection is dropped.
    let mut s = connect(&sock);
    greet(&mut s, 0x80);
    assert!(closed(&mut s), "unknown client flags");

    // Bad option magic: dropped.
    let mut s = connect(&sock);
    greet(&mut s, 1);
    s.write_all(&[0u8; 16]).expect("junk");
    assert!(closed(&mut s), "bad option magic");

    // Unknown option: ERR_UNSUP and parsing goes on; malformed GO:
    // ERR_INVALID; unknown export: ERR_UNKNOWN; then a good GO works.
    let mut s = connect(&sock);
    greet(&mut s, 3);
    send_option(&mut s, 99, &[1, 2, 3, 4, 5]);
    assert_eq!(option_reply(&mut s).0, 0x8000_0001);
    send_option(&mut s, 7, &[0, 0, 0, 200, b'x']);
    assert_eq!(option_reply(&mut s).0, 0x8000_0003);
    send_option(&mut s, 7, &go_data("missing"));
    assert_eq!(option_reply(&mut s).0, 0x8000_0006);
    send_option(&mut s, 10, &[]);
    assert_eq!(
        option_reply(&mut s).0,
        0x8000_0003,
        "SET_META_CONTEXT before structured replies"
    );
    send_option(&mut s, 7, &go_data("vol1"));
    let mut kinds = Vec::new();
    loop {
        let (k, _) = option_reply(&mut s);
        kinds.push(k);
        if k == 1 {
            break;
        }
    }
    assert!(kinds.len() >= 2, "INFO_EXPORT before ACK: {kinds:?}");

    // Requests past the end, a 1 GiB read, an unknown command, BLOCK_STATUS
    // without a context: errors, and the connection goes on.
    request(&mut s, 0, 1, EXPORT_SIZE - 100, 200, &[]);
    assert_eq!(simple_reply(&mut s), (22, 1), "READ past the end: EINVAL");
    request(&mut s, 1, 2, EXPORT_SIZE, 512, &[0; 512]);
    assert_eq!(simple_reply(&mut s), (28, 2), "WRITE past the end: ENOSPC");
    request(&mut s, 0, 3, 0, 1 << 30, &[]);
    assert_eq!(simple_reply(&mut s), (22, 3), "1 GiB READ: EINVAL");
    request(&mut s, 42, 4, 0, 0, &[]);
    assert_eq!(simple_reply(&mut s), (22, 4), "unknown command: EINVAL");
    request(&mut s, 7, 5, 0, 4096, &[]);
    assert_eq!(
        simple_reply(&mut s),
        (22, 5),
        "BLOCK_STATUS without a context"
    );
    request(&mut s, 4, 6, u64::MAX - 10, 100, &[]);
    assert_eq!(simple_reply(&mut s), (22, 6), "TRIM whose end overflows");
    // Unaligned I/O is fine (minimum block size 1).
    request(&mut s, 1, 7, 12345, 3, b"abc");
    assert_eq!(simple_reply(&mut s), (0, 7));
    request(&mut s, 0, 8, 12344, 5, &[]);
    assert_eq!(simple_reply(&mut s), (0, 8));
    assert_eq!(read_n(&mut s, 5), b"\0abc\0");
    // Bad request magic: dropped.
    s.write_all(&[0xffu8; 28]).expect("junk");
    assert!(closed(&mut s), "bad request magic");

    // A WRITE larger than the maximum payload: dropped.
    let mut s = open(&sock);
    request(&mut s, 1, 1, 0, 64 << 20, &[]);
    assert!(closed(&mut s), "64 MiB WRITE");

    // A client that disconnects in the middle of a write's payload.
    let mut s = open(&sock);
    request(&mut s, 1, 1, 0, 1 << 20, &[9; 100_000]);
    drop(s);
    // Handshakes cut short at every step.
    for cut in [0usize, 2, 10, 17] {
        let mut s = connect(&sock);
        let _ = read_n(&mut s, 18);
        let mut flags_and_opt = 3u32.to_be_bytes().to_vec();
        flags_and_opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
        flags_and_opt.extend_from_slice(&7u32.to_be_bytes());
        flags_and_opt.extend_from_slice(&100u32.to_be_bytes());
        s.write_all(&flags_and_opt[..cut.min(flags_and_opt.len())])
            .expect("partial");
    }
    still_serves(&sock, 2);
    pipelined_requests_then_disc_are_all_answered(&sock);
}
