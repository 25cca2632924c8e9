//! `lightstore nbd` driven by unmodified NBD clients against a real node:
//! nbdinfo, qemu-io patterns, qemu-img convert/compare/map, nbdcopy both
//! ways, nbdsh scripts for FUA and the multi-conn contract, fio's nbd
//! engine with verification; and a clean stop that flushes.

mod nbd_support;
mod node_support;

use std::time::Duration;

use nbd_support::{have_tools, run, stdout, NbdProc};
use node_support::Node;

struct Setup {
    node: Node,
    nbd: NbdProc,
    tmp: tempfile::TempDir,
}

fn setup(size: &str) -> Setup {
    setup_with(size, &[])
}

fn setup_with(size: &str, extra: &[&str]) -> Setup {
    let node = Node::start(&["--capacity", "2G"]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut flags = vec!["--export", "vol1", "--size", size];
    flags.extend_from_slice(extra);
    let nbd = NbdProc::start(
        &format!("127.0.0.1:{}", node.port),
        &tmp.path().join("nbd.sock"),
        &flags,
    );
    Setup { node, nbd, tmp }
}

#[test]
fn nbdinfo_shows_size_block_sizes_and_flags() {
    if !have_tools(&["nbdinfo"]) {
        return;
    }
    let s = setup("64M");
    let json = stdout(&run("nbdinfo", &["--json", &s.nbd.uri("vol1")]));
    for want in [
        "\"export-size\": 67108864",
        "\"block_size_minimum\": 1",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 33554432",
        "\"can_multi_conn\": true",
        "\"can_fua\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"can_flush\": true",
        "\"is_read_only\": false",
        "base:allocation",
    ] {
        assert!(json.contains(want), "{want} missing from:\n{json}");
    }
    for flag in [
        "multi-conn",
        "fua",
        "trim",
        "zero",
        "flush",
        "cache",
        "fast-zero",
    ] {
        run("nbdinfo", &["--can", flag, &s.nbd.uri("vol1")]);
    }
    let list = stdout(&run("nbdinfo", &["--list", &s.nbd.uri("")]));
    assert!(list.contains("vol1"), "{list}");
    // An unknown export is refused cleanly.
    let out = std::process::Command::new("nbdinfo")
        .arg(s.nbd.uri("nope"))
        .output()
        .expect("nbdinfo");
    assert!(!out.status.success());
}

#[test]
fn qemu_io_patterns_zeroes_discards_and_flushes() {
    if !have_tools(&["qemu-io"]) {
        return;
    }
    let metrics = format!("127.0.0.1:{}", node_support::free_port());
    let s = setup_with("64M", &["--metrics", &metrics]);
    let uri = s.nbd.uri("vol1");
    let io = |cmds: &[&str]| {
        let mut args = vec!["-f", "raw"];
        for c in cmds {
            args.extend(["-c", c]);
        }
        args.push(&uri);
        let out = stdout(&run("qemu-io", &args));
        assert!(
            !out.contains("Pattern verification failed") && !out.contains("failed"),
            "{cmds:?}:\n{out}"
        );
        out
    };
    io(&[
        "write -P 0xab 0 1M",
        "write -P 0xcd 1000 3000",
        "write -P 0x11 65000 200000",
        "flush",
    ]);
    io(&[
        "read -P 0xab 0 1000",
        "read -P 0xcd 1000 3000",
        "read -P 0xab 4000 61000",
        "read -P 0x11 65000 200000",
        "read -P 0xab 265000 783576",
    ]);
    io(&[
        "write -z 0 128k",
        "discard 512k 512k",
        "write -z 1000000 5000",
    ]);
    io(&[
        "read -P 0 0 128k",
        "read -P 0x11 131072 133928",
        "read -P 0 512k 512k",
        "read -P 0xab 265000 235000",
    ]);
    io(&["write -P 0x5a -f 2M 64k", "read -P 0x5a 2M 64k"]);
    // The counters saw it.
    let mut conn = std::net::TcpStream::connect(&metrics).expect("metrics");
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.0\r\n\r\n").expect("get");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut conn, &mut text).expect("read");
    let count = |cmd: &str| -> u64 {
        let key = format!("lightstore_nbd_requests_total{{command=\"{cmd}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for cmd in ["read", "write", "flush", "trim", "write_zeroes"] {
        assert!(count(cmd) > 0, "no {cmd} counted:\n{text}");
        let timed = format!("lightstore_nbd_request_duration_seconds_count{{command=\"{cmd}\"}} ");
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&timed))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert_eq!(
            n,
            count(cmd),
            "{cmd}: a latency sample per request:\n{text}"
        );
    }
    assert!(
        text.contains("lightstore_nbd_written_bytes_total "),
        "{text}"
    );
}

#[test]
fn qemu_img_convert_compare_map_and_nbdcopy_both_ways() {
    if !have_tools(&["qemu-img", "nbdcopy"]) {
        return;
    }
    let s = setup("256M");
    let uri = s.nbd.uri("vol1");
    let img = s.tmp.path().join("img");
    // 64 MiB random, 64 MiB hole, 64 MiB random, 64 MiB hole.
    let mut data = vec![0u8; 256 << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for (i, b) in data.iter_mut().enumerate() {
        if (i >> 26) % 2 == 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    std::fs::write(&img, &data).expect("image");
    let img_s = img.to_str().expect("path");
    convert_onto_and_compare(img_s, &uri);
    let map = stdout(&run(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", &uri],
    ));
    let hole_bytes: u64 = map
        .lines()
        .filter(|l| l.contains("\"data\": false"))
        .filter_map(|l| {
            l.split("\"length\": ")
                .nth(1)?
                .split(',')
                .next()?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(hole_bytes >= 128 << 20, "holes {hole_bytes}:\n{map}");
    let back = s.tmp.path().join("back");
    run("nbdcopy", &[&uri, back.to_str().expect("path")]);
    assert!(
        std::fs::read(&back).expect("back") == data,
        "nbdcopy export -> file differs"
    );
    // And the other way, flushed.
    for b in data.iter_mut().step_by(4096) {
        *b = b.wrapping_add(1);
    }
    std::fs::write(&img, &data).expect("image 2");
    run("nbdcopy", &["--flush", img_s, &uri]);
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", img_s, &uri],
    );
}

/// `mkfs` discards the whole device first and `qemu-img map` asks about
/// all of it: on a 1 TiB volume holding 3 MiB both must cost what the
/// volume holds (a probe per 4 KiB chunk took minutes).
#[test]
fn a_large_volume_is_trimmed_and_mapped_at_the_cost_of_what_it_holds() {
    if !have_tools(&["nbdsh", "qemu-img"]) {
        return;
    }
    let s = setup_with("1T", &[]);
    let script = r#"
import sys, time, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
began = time.monotonic()
marks = [0, 300 << 30, size - (1 << 20)]
for m in marks:
    h.pwrite(b"\x5a" * (1 << 20), m)
step = (4 << 30) - (1 << 20)
off = 1 << 20
while off < size - (1 << 20):
    n = min(step, size - (1 << 20) - off)
    h.trim(n, off)
    off += n
    # Bounded: a probe per chunk took minutes; this takes well under one.
    assert time.monotonic() - began < 120, "trimming 1 TiB is too slow"
assert h.pread(1 << 20, 0) == b"\x5a" * (1 << 20), "before the trim"
assert h.pread(4096, 300 << 30) == bytes(4096), "inside the trim"
assert h.pread(1 << 20, size - (1 << 20)) == b"\x5a" * (1 << 20), "after it"
h.shutdown()
print("ok")
"#;
    let path = s.tmp.path().join("trim.py");
    std::fs::write(&path, script).expect("script");
    let uri = s.nbd.uri("vol1");
    let out = run("/usr/bin/python3", &[path.to_str().expect("path"), &uri]);
    assert!(stdout(&out).contains("ok"));
    let map = stdout(&run(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", &uri],
    ));
    let data: Vec<&str> = map
        .lines()
        .filter(|l| l.contains("\"data\": true"))
        .collect();
    assert_eq!(data.len(), 2, "data at both ends only:\n{map}");
    // Every probe of chunks (VMETA) on the node: a handful per listing,
    // not one per 8 MiB of the volume (131,072).
    let stats = s.node.cli(&["info", "commandstats"]);
    let probes = node_support::command_calls(&stats, "vmeta");
    // Some (the stored chunks are confirmed), but few.
    assert!(
        probes.is_some_and(|n| n < 1000),
        "{probes:?} VMETA calls:\n{stats}"
    );
}

#[test]
fn nbdsh_fua_and_flush_are_visible_on_every_connection() {
    if !have_tools(&["nbdsh"]) {
        return;
    }
    let s = setup("64M");
    let script = r#"
import os, sys, nbd
u = sys.argv[1]
conns = []
for i in range(3):
    h = nbd.NBD()
    h.connect_uri(u)
    conns.append(h)
a, b, c = conns
assert a.can_multi_conn() and a.can_fua()
for i in range(300):
    buf = os.urandom(1 + (i * 997) % 70000)
    off = (i * 7919 % 900) * 65536 + (i % 3) * 333
    if i % 2 == 0:
        a.pwrite(buf, off, nbd.CMD_FLAG_FUA)
    else:
        a.pwrite(buf, off)
        a.flush()
    assert b.pread(len(buf), off) == buf, "not visible on connection b"
    assert c.pread(len(buf), off) == buf, "not visible on connection c"
# Two connections writing the two halves of one chunk, interleaved.
chunk = a.get_block_size(nbd.SIZE_PREFERRED)
half = chunk // 2
for i in range(50):
    x = bytes([i]) * half
    y = bytes([i + 100]) * half
    a.aio_pwrite(x, 0)
    b.aio_pwrite(y, half)
    while a.aio_in_flight() > 0 or b.aio_in_flight() > 0:
        a.poll(1)
        b.poll(1)
    assert c.pread(chunk, 0) == x + y, "a half was lost"
for h in conns:
    h.shutdown()
print("ok")
"#;
    let path = s.tmp.path().join("mc.py");
    std::fs::write(&path, script).expect("script");
    let out = run(
        "/usr/bin/python3",
        &[path.to_str().expect("path"), &s.nbd.uri("vol1")],
    );
    assert!(stdout(&out).contains("ok"));
}

/// A seeded random mix of writes (some with FUA), reads, trims, zeroings
/// (with and without FAST_ZERO), flushes and block-status queries over two
/// connections, against a byte-array model: every read equals the model,
/// every extent reported as a hole is zeros in the model, and a fresh
/// connection reads back the whole model.
const NBD_MODEL_WORKLOAD: &str = r#"
import os, random, sys, nbd
uri, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
hs = []
for _ in range(2):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    hs.append(h)
size = hs[0].get_size()
align = max(hs[0].get_block_size(nbd.SIZE_MINIMUM), 1)
chunk = hs[0].get_block_size(nbd.SIZE_PREFERRED)
model = bytearray(size)
def span():
    # Mostly near chunk boundaries, sometimes long, always aligned.
    off = r.randrange(0, size // align) * align
    ln = r.choice((align, chunk // 2, chunk, 3 * chunk + align, 64 * chunk, 300 * chunk))
    ln = max(align, min(ln, size - off) // align * align)
    return off, ln
counts = {}
for i in range(n):
    h = r.choice(hs)
    op = r.choice(("write", "write", "read", "trim", "zero", "zero_fast", "flush", "status"))
    off, ln = span()
    counts[op] = counts.get(op, 0) + 1
    if op == "write":
        buf = r.randbytes(ln)
        h.pwrite(buf, off, nbd.CMD_FLAG_FUA if r.random() < 0.3 else 0)
        model[off:off + ln] = buf
    elif op == "read":
        assert h.pread(ln, off) == bytes(model[off:off + ln]), f"op {i}: read {off}+{ln}"
    elif op == "trim":
        h.trim(ln, off)
        model[off:off + ln] = bytes(ln)  # this server's TRIM reads back zeros
    elif op in ("zero", "zero_fast"):
        try:
            h.zero(ln, off, nbd.CMD_FLAG_FAST_ZERO if op == "zero_fast" else 0)
            model[off:off + ln] = bytes(ln)
        except nbd.Error as e:
            assert op == "zero_fast", f"op {i}: zero failed: {e}"
    elif op == "flush":
        h.flush()
    else:
        seen = []
        def cb(meta, offset, entries, err):
            if meta == nbd.CONTEXT_BASE_ALLOCATION:
                seen.append((offset, list(entries)))
        h.block_status(ln, off, cb)
        for start, entries in seen:
            at = start
            for k in range(0, len(entries), 2):
                length, flags = entries[k], entries[k + 1]
                if flags & nbd.STATE_HOLE:
                    assert not any(model[at:at + length]), f"op {i}: a hole at {at}+{length} holds data"
                at += length
for h in hs:
    h.shutdown()
h = nbd.NBD()
h.connect_uri(uri)
step = 4 << 20
for off in range(0, size, step):
    assert h.pread(min(step, size - off), off) == bytes(model[off:off + step]), f"final read at {off}"
h.shutdown()
print("ok", sorted(counts.items()))
"#;

#[test]
fn random_requests_match_a_byte_model() {
    if !have_tools(&["nbdsh"]) {
        return;
    }
    for (size, extra) in [("32M", &[][..]), ("32M", &["--chunk-size", "64K"][..])] {
        let s = setup_with(size, extra);
        let path = s.tmp.path().join("model.py");
        std::fs::write(&path, NBD_MODEL_WORKLOAD).expect("script");
        let out = run(
            "/usr/bin/python3",
            &[
                path.to_str().expect("path"),
                &s.nbd.uri("vol1"),
                "11",
                "700",
            ],
        );
        assert!(stdout(&out).starts_with("ok"), "{}", stdout(&out));
        // Every chunk the requests left belongs to the volume, before its end.
        let nodes = format!("127.0.0.1:{}", s.node.port);
        let out = run(
            env!("CARGO_BIN_EXE_lightstore"),
            &["volume", "--nodes", &nodes, "check"],
        );
        assert!(
            stdout(&out).contains("0 leaked, 0 problems"),
            "{}",
            stdout(&out)
        );
    }
}

#[test]
fn fio_nbd_engine_verifies_sequential_and_random_writes() {
    if !have_tools(&["fio"]) {
        return;
    }
    let s = setup("128M");
    fio_verifies(&s.nbd.uri("vol1"));
}

/// fio writes sequentially (1 MiB) and at random (8 KiB, 4 KiB) with
/// crc32c verification through `uri`.
fn fio_verifies(uri: &str) {
    for (rw, bs) in [("write", "1M"), ("randwrite", "8k"), ("randwrite", "4k")] {
        let out = stdout(&run(
            "fio",
            &[
                "--name=v",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                "--size=32M",
                "--iodepth=16",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                // No verify state file left in the working directory.
                "--verify_state_save=0",
            ],
        ));
        assert!(out.contains("err= 0"), "{rw} {bs}:\n{out}");
    }
}

/// `qemu-img convert` of the raw image `image` onto the export at `uri`,
/// then `qemu-img compare` of the two.
fn convert_onto_and_compare(image: &str, uri: &str) {
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", image, uri],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image, uri],
    );
}

/// Over a node's Unix socket the adapter hands WRITE payloads to the node
/// in shared memory (`VSETSHM`, see `client::shm`) and the node puts READ
/// data there (`MGETSHM`, `client::landing`): fio's verified writes and
/// qemu-img's copy of a random image read back exactly, and the node
/// counted the writes that went by reference. The default 4 KiB chunks are
/// stored unaligned (`engine::vlog::is_aligned_value`), so the node copies
/// them into place; a volume of 8 KiB chunks is stored sector-aligned, and
/// its reads land from the device straight into the adapter's memory.
#[test]
fn a_node_on_its_unix_socket_takes_payloads_from_shared_memory() {
    if !have_tools(&["fio", "qemu-img"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("node.sock");
    let sock_arg = sock.to_str().expect("utf-8 path");
    let node = Node::start(&["--capacity", "2G", "--unix", sock_arg]);
    let nbd = NbdProc::start(
        &format!("unix:{sock_arg}"),
        &tmp.path().join("nbd.sock"),
        &["--export", "vol1", "--size", "128M"],
    );
    fio_verifies(&nbd.uri("vol1"));
    let image = tmp.path().join("random.img");
    let mut data = vec![0u8; 48 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&image, &data).expect("image");
    convert_onto_and_compare(image.to_str().expect("utf-8 path"), &nbd.uri("vol1"));
    let info = node.cli(&["info", "commandstats"]);
    let calls = node_support::command_calls(&info, "vsetshm");
    assert!(calls.is_some_and(|n| n > 0), "no VSETSHM in:\n{info}");
    let calls = node_support::command_calls(&info, "mgetshm");
    assert!(calls.is_some_and(|n| n > 0), "no MGETSHM in:\n{info}");
    let created = std::process::Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args(["volume", "--nodes", &format!("unix:{sock_arg}")])
        .args(["create", "--chunk-size", "8K", "vol2", "64M"])
        .output()
        .expect("lightstore volume create");
    assert!(created.status.success(), "{created:?}");
    fio_verifies(&nbd.uri("vol2"));
    let stats = node.cli(&["info", "stats"]);
    let landed = node_support::info_number(&stats, "landed_reads");
    assert!(
        landed.is_some_and(|n| n > 0),
        "no landed reads in:\n{stats}"
    );
}

/// SIGTERM drains and flushes: the server exits 0, and what it
/// acknowledged reads back through a new server.
#[test]
fn sigterm_stops_cleanly_and_keeps_the_data() {
    if !have_tools(&["qemu-io"]) {
        return;
    }
    let mut s = setup("16M");
    let uri = s.nbd.uri("vol1");
    run("qemu-io", &["-f", "raw", "-c", "write -P 0x42 0 4M", &uri]);
    assert_eq!(
        s.nbd.stop(Duration::from_secs(10)),
        Some(0),
        "{}",
        s.nbd.log_text()
    );
    assert!(s.nbd.log_text().contains("flushed"), "{}", s.nbd.log_text());
    let again = NbdProc::start(
        &format!("127.0.0.1:{}", s.node.port),
        &s.tmp.path().join("nbd2.sock"),
        &["--export", "vol1"],
    );
    run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x42 0 4M", &again.uri("vol1")],
    );
}

/// One adapter serves a volume (partial-chunk writes lock per process):
/// a second is refused with the first one's name, at start for its
/// default export and at the handshake for others; a served volume is
/// not deleted or shrunk; a clean stop, or the last connection to a
/// volume other than the default export ending, lets the next in at once.
#[test]
fn one_adapter_serves_a_volume_at_a_time() {
    if !have_tools(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let mut s = setup("16M");
    let nodes = format!("127.0.0.1:{}", s.node.port);
    run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x17 0 1M", &s.nbd.uri("vol1")],
    );
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_lightstore"))
        .args(["nbd", "--nodes", &nodes, "--unix"])
        .arg(s.tmp.path().join("second.sock"))
        .args(["--export", "vol1"])
        .output()
        .expect("second adapter");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second adapter started");
    assert!(err.contains("served by another adapter"), "{err}");
    // Without a default export it starts, and refuses vol1 to clients.
    let other = NbdProc::start(&nodes, &s.tmp.path().join("other.sock"), &[]);
    let refused = std::process::Command::new("nbdinfo")
        .arg(other.uri("vol1"))
        .output()
        .expect("nbdinfo");
    assert!(!refused.status.success(), "vol1 served twice");
    let volume = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_lightstore"))
            .args(["volume", "--nodes", &nodes])
            .args(args)
            .output()
            .expect("lightstore volume")
    };
    // `info` shows the space a volume takes: the 1 MiB written of 16.
    let info = volume(&["info", "vol1"]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("allocated 1048576\t"),
        "{text}{}",
        String::from_utf8_lossy(&info.stderr)
    );
    // Listing and describing exports claims nothing: only serving does.
    assert!(volume(&["create", "vol2", "1M"]).status.success());
    let listed = run("nbdinfo", &["--list", &other.uri("")]);
    assert!(stdout(&listed).contains("vol2"), "{}", stdout(&listed));
    let out = volume(&["delete", "vol2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [&["delete", "vol1"][..], &["resize", "vol1", "1M"]] {
        let out = volume(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} went through");
        assert!(err.contains("is being served"), "{args:?}: {err}");
    }
    assert_eq!(
        s.nbd.stop(Duration::from_secs(10)),
        Some(0),
        "{}",
        s.nbd.log_text()
    );
    run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x17 0 1M", &other.uri("vol1")],
    );
    // Its last connection gone, the adapter lets go of vol1 (it is not its
    // default export): the volume can be deleted while it still runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let out = volume(&["delete", "vol1"]);
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(other);
}

/// An adapter restarted after a SIGKILL (a supervisor's restart) waits for
/// the dead one's lease to expire, since it was on this machine, instead
/// of being refused; then it serves what the dead one acknowledged.
#[test]
fn a_killed_adapter_restarts_once_its_lease_expires() {
    if !have_tools(&["qemu-io"]) {
        return;
    }
    let mut s = setup("16M");
    run(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 0x33 0 1M", &s.nbd.uri("vol1")],
    );
    let _ = s.nbd.child.kill();
    let _ = s.nbd.child.wait();
    let again = NbdProc::start_within(
        &format!("127.0.0.1:{}", s.node.port),
        &s.tmp.path().join("again.sock"),
        &["--export", "vol1"],
        Duration::from_secs(30),
    );
    assert!(
        again.log_text().contains("waiting for the lease"),
        "{}",
        again.log_text()
    );
    run(
        "qemu-io",
        &["-f", "raw", "-c", "read -P 0x33 0 1M", &again.uri("vol1")],
    );
}

/// Many connections at once (more than the tokio blocking pool would hold
/// if each kept threads from it), a new one still served, and a SIGTERM
/// with all of them open drains, flushes and exits 0.
#[test]
fn many_open_connections_and_a_stop_while_they_are_open() {
    if !have_tools(&["nbdinfo", "nbdsh", "qemu-io"]) {
        return;
    }
    let mut s = setup("16M");
    let script = r#"
import sys, time, nbd
u = sys.argv[1]
hs = []
for i in range(24):
    h = nbd.NBD()
    h.connect_uri(u)
    h.pwrite(bytes([i + 1]) * 4096, i * 4096, nbd.CMD_FLAG_FUA)
    hs.append(h)
print("open", flush=True)
time.sleep(30)
"#;
    let path = s.tmp.path().join("many.py");
    std::fs::write(&path, script).expect("script");
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .arg(&path)
        .arg(s.nbd.uri("vol1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line.trim(), "open");
    run("nbdinfo", &["--size", &s.nbd.uri("vol1")]);
    assert_eq!(
        s.nbd.stop(Duration::from_secs(10)),
        Some(0),
        "{}",
        s.nbd.log_text()
    );
    let _ = holder.kill();
    let _ = holder.wait();
    let again = NbdProc::start(
        &format!("127.0.0.1:{}", s.node.port),
        &s.tmp.path().join("nbd2.sock"),
        &["--export", "vol1"],
    );
    for i in 0..24u32 {
        run(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                &format!("read -P {} {} 4096", i + 1, i * 4096),
                &again.uri("vol1"),
            ],
        );
    }
}

/// A `FLUSH` never vouches for writes the node lost: with one `interval`
/// node, data written and not flushed, the node SIGKILLed and restarted,
/// the next FLUSH on the same connection answers EIO (once), the one
/// after succeeds, and what was flushed before reads back.
#[test]
fn a_flush_after_the_node_lost_unflushed_writes_fails_once() {
    if !have_tools(&["nbdsh"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("node");
    let addr = format!("127.0.0.1:{}", node_support::free_port());
    let flags = ["--durability", "interval"];
    let node = Node::start_at(&data, &addr, &flags).expect("node");
    let nbd = NbdProc::start(
        &addr,
        &tmp.path().join("nbd.sock"),
        &["--export", "v", "--size", "16M"],
    );
    let script = r#"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x01" * 65536, 0)
h.flush()
h.pwrite(b"\x02" * 65536, 65536)
print("written", flush=True)
sys.stdin.readline()
try:
    h.flush()
    print("first flush ok", flush=True)
except nbd.Error as e:
    print("first flush failed", e.errno, flush=True)
h.flush()
print("second flush ok", flush=True)
assert h.pread(65536, 0) == b"\x01" * 65536
print("flushed data reads back", flush=True)
"#;
    let path = tmp.path().join("lost.py");
    std::fs::write(&path, script).expect("script");
    let mut py = std::process::Command::new("/usr/bin/python3")
        .arg(&path)
        .arg(nbd.uri("v"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = std::io::BufReader::new(py.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read");
    assert_eq!(line.trim(), "written");
    drop(node); // SIGKILL
    let _node = Node::start_at(&data, &addr, &flags).expect("restart");
    std::thread::sleep(Duration::from_millis(50));
    std::io::Write::write_all(py.stdin.as_mut().expect("stdin"), b"go\n").expect("go");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read");
    assert!(py.wait().expect("wait").success(), "{rest}");
    assert_eq!(
        rest.lines().collect::<Vec<_>>(),
        [
            "first flush failed EIO",
            "second flush ok",
            "flushed data reads back"
        ],
        "{}",
        nbd.log_text()
    );
}

/// A volume larger than its node's device: writes past what the device
/// holds answer ENOSPC, everything acknowledged before reads back, and
/// once a quarter of it is trimmed, writes are taken again.
#[test]
fn a_full_node_answers_enospc_and_takes_writes_after_a_trim() {
    if !have_tools(&["nbdsh"]) {
        return;
    }
    let node = Node::start(&["--capacity", "96M"]);
    let full_at = fill_trim_and_write_again(&node, None);
    assert!(full_at >= 32, "only {full_at} MiB fit a 96 MiB device");
}

/// Hardening §1 under the block adapter: the file system under the node's
/// device is filled by another file after 8 MiB. Writes answer ENOSPC,
/// what was acknowledged reads back, a TRIM is taken (its deletes use the
/// node's reserve) and, once GC has reclaimed what it freed, writes are
/// taken again, without a restart.
#[test]
fn a_host_filled_by_other_files_takes_a_trim_and_writes_again() {
    if !have_tools(&["nbdsh"]) {
        return;
    }
    let Some(small) = node_support::SmallFs::mount(64) else {
        return;
    };
    let node = Node::start_in(&small.path().join("data"), &[]).expect("node on the tmpfs");
    let full_at = fill_trim_and_write_again(&node, Some(&small.path().join("ballast")));
    assert!(full_at >= 8, "only {full_at} MiB before the host filled");
}

/// Writes 1 MiB blocks with FUA to a 256 MiB volume on `node` until one
/// answers ENOSPC (after 8 MiB, another file fills `ballast`'s file system
/// when given), checks what was written, trims the first three quarters,
/// and within 30 s writes again; returns the MiB written before ENOSPC.
fn fill_trim_and_write_again(node: &Node, ballast: Option<&std::path::Path>) -> usize {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nbd = NbdProc::start(
        &format!("127.0.0.1:{}", node.port),
        &tmp.path().join("nbd.sock"),
        &["--export", "v", "--size", "256M"],
    );
    let script = r#"
import sys, os, time, hashlib, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
ballast = sys.argv[2] if len(sys.argv) > 2 else None
MiB = 1 << 20
written = {}
for i in range(256):
    if i == 8 and ballast:
        with open(ballast, "wb") as f:
            try:
                while True:
                    f.write(b"x" * MiB)
                    f.flush()
            except OSError:
                pass
    buf = os.urandom(MiB)
    try:
        h.pwrite(buf, i * MiB, nbd.CMD_FLAG_FUA)
    except nbd.Error as e:
        print("full after", i, "MiB:", e.errno)
        break
    written[i] = hashlib.sha1(buf).digest()
else:
    print("never full")
bad = [i for i, d in written.items() if hashlib.sha1(h.pread(MiB, i * MiB)).digest() != d]
print("bad", len(bad))
# Trim the first three quarters; the last quarter stays.
keep = len(written) // 4
first_kept = len(written) - keep
h.trim(first_kept * MiB, 0)
deadline = time.time() + 30
while True:
    try:
        h.pwrite(os.urandom(MiB), 255 * MiB, nbd.CMD_FLAG_FUA)
        print("written after trim")
        break
    except nbd.Error as e:
        if time.time() > deadline:
            print("still refused:", e.errno)
            break
        time.sleep(0.2)
bad = [i for i in range(first_kept, len(written)) if hashlib.sha1(h.pread(MiB, i * MiB)).digest() != written[i]]
print("kept bad", len(bad))
print("trimmed reads zeros", h.pread(MiB, 0) == bytes(MiB))
"#;
    let path = tmp.path().join("full.py");
    std::fs::write(&path, script).expect("script");
    let uri = nbd.uri("v");
    let mut args = vec![path.to_str().expect("path"), uri.as_str()];
    if let Some(b) = ballast {
        args.push(b.to_str().expect("ballast path"));
    }
    let out = run("/usr/bin/python3", &args);
    let said = stdout(&out);
    let lines: Vec<&str> = said.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("full after") && l.ends_with("ENOSPC")),
        "{said}"
    );
    let full_at: usize = lines[0]
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .expect("MiB count");
    assert_eq!(
        &lines[1..],
        [
            "bad 0",
            "written after trim",
            "kept bad 0",
            "trimmed reads zeros True"
        ],
        "{said}\n{}",
        nbd.log_text()
    );
    full_at
}
