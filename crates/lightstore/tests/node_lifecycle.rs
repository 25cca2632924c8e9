//! Node lifecycle: persistence across `kill -9` with sync durability, the
//! data-directory lock, graceful stop on SIGTERM and SHUTDOWN (exit 0 and
//! data kept), and `requirepass`.

mod node_support;

use std::io::BufReader;
use std::time::Duration;

use node_support::{call, encode, fill_host, Node, Resp, SmallFs};

#[test]
fn sync_writes_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = Node::start_in(tmp.path(), &["--durability", "sync"]).expect("start");
    let mut pipe = Vec::new();
    for i in 0..500 {
        pipe.extend(encode(&[
            b"SET",
            format!("p:{i:03}").as_bytes(),
            format!("v{i}").as_bytes(),
        ]));
    }
    let out = n.cli_output(&["--pipe"], Some(&pipe));
    assert!(String::from_utf8_lossy(&out.stdout).contains("errors: 0, replies: 500"));
    n.child.kill().unwrap(); // SIGKILL: no clean shutdown
    n.child.wait().unwrap();
    drop(n);
    let n = Node::start_in(tmp.path(), &[]).expect("restart");
    let mut c = BufReader::new(n.connect());
    for i in 0..500 {
        assert_eq!(
            call(&mut c, &[b"GET", format!("p:{i:03}").as_bytes()]),
            Resp::Bulk(format!("v{i}").into_bytes()),
            "key p:{i:03} lost"
        );
    }
    let Resp::Array(all) = call(&mut c, &[b"RANGE", b"p:", b"p;", b"LIMIT", b"1000"]) else {
        panic!("RANGE reply");
    };
    assert_eq!(all.len(), 1000);
}

#[test]
fn second_node_on_the_same_directory_fails_with_a_lock_error() {
    let first = Node::start(&[]);
    let started = std::time::Instant::now();
    let err = match Node::start_in(&first.dir, &[]) {
        Ok(_) => panic!("a second node started on a locked data directory"),
        Err(e) => e,
    };
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(err.0, Some(c) if c != 0), "{err:?}");
    assert!(err.1.contains("lock"), "{}", err.1);
    // The first one is unaffected.
    assert_eq!(first.cli(&["ping"]), "PONG");
}

#[test]
fn sigterm_stops_cleanly_and_keeps_data() {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = Node::start_in(tmp.path(), &[]).expect("start");
    assert_eq!(n.cli(&["set", "term", "kept"]), "OK");
    n.stop_cleanly(Duration::from_secs(20));
    drop(n);
    let n = Node::start_in(tmp.path(), &[]).expect("restart");
    assert_eq!(n.cli(&["get", "term"]), "kept");
}

#[test]
fn shutdown_command_stops_cleanly_and_keeps_data() {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = Node::start_in(tmp.path(), &[]).expect("start");
    assert_eq!(n.cli(&["set", "shut", "kept"]), "OK");
    let _ = n.cli_output(&["shutdown", "nosave"], None);
    assert_eq!(n.wait_exit(Duration::from_secs(20)), Some(0));
    let log = n.log.lock().unwrap().join("\n");
    drop(n);
    let n = Node::start_in(tmp.path(), &[]).unwrap_or_else(|e| panic!("restart: {e:?} {log}"));
    assert_eq!(n.cli(&["get", "shut"]), "kept");
}

#[test]
fn requirepass_gates_every_command() {
    let n = Node::start(&["--requirepass", "s3cret"]);
    let mut c = BufReader::new(n.connect());
    let noauth = Resp::Error("NOAUTH Authentication required.".into());
    assert_eq!(call(&mut c, &[b"GET", b"k"]), noauth);
    assert_eq!(call(&mut c, &[b"PING"]), noauth);
    assert!(
        matches!(call(&mut c, &[b"AUTH", b"wrong"]), Resp::Error(e) if e.starts_with("WRONGPASS"))
    );
    assert!(matches!(call(&mut c, &[b"HELLO", b"3"]), Resp::Error(e) if e.starts_with("NOAUTH")));
    assert_eq!(
        call(&mut c, &[b"AUTH", b"s3cret"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        call(&mut c, &[b"SET", b"k", b"v"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        n.cli(&["-a", "s3cret", "--no-auth-warning", "get", "k"]),
        "v"
    );
    let out = n.cli_output(&["get", "k"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOAUTH"));
}

#[test]
fn unix_socket_serves_the_same_data() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("node.sock");
    let data = tmp.path().join("data");
    let n = Node::start_in(&data, &["--unix", sock.to_str().unwrap()]).expect("start");
    assert_eq!(n.cli(&["set", "via", "tcp"]), "OK");
    let out = std::process::Command::new("redis-cli")
        .arg("-s")
        .arg(&sock)
        .args(["get", "via"])
        .output()
        .expect("redis-cli runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "tcp");
}

/// A device full of live data answers SETs with `-ERR NOSPACE …` at once (no
/// wait for a GC that cannot free anything), reads go on working, and a
/// DEL is still accepted.
#[test]
fn full_device_answers_nospace_and_keeps_serving_reads() {
    let n = Node::start(&["--capacity", "64M"]);
    let mut c = BufReader::new(n.connect());
    let value = vec![b'v'; 256 << 10];
    let mut stored = 0;
    let mut refused = None;
    for i in 0..1000 {
        let key = format!("full:{i:04}");
        let started = std::time::Instant::now();
        match call(&mut c, &[b"SET", key.as_bytes(), &value]) {
            Resp::Simple(s) if s == "OK" => stored += 1,
            Resp::Error(e) => {
                refused = Some((e, started.elapsed()));
                break;
            }
            other => panic!("SET {key}: {other:?}"),
        }
    }
    let (err, took) = refused.expect("a 64 MiB device never filled up");
    assert!(err.starts_with("ERR NOSPACE"), "{err}");
    assert!(took < Duration::from_secs(5), "the refusal took {took:?}");
    assert!(stored > 10, "only {stored} values fit");
    assert_eq!(
        call(&mut c, &[b"GET", b"full:0000"]),
        Resp::Bulk(value.clone()),
        "reads keep working"
    );
    assert_eq!(call(&mut c, &[b"DEL", b"full:0001"]), Resp::Int(1));
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
}

/// The cluster's versioned deletes (`VDEL`, what every adapter's delete
/// or TRIM becomes) are accepted on a device full of live data, as plain
/// DELs are, and free it: after deleting three quarters, new versioned
/// writes are accepted again within a bounded time. Meanwhile an adapter's
/// lease stays renewable: a `VCAS` replacing a small record with one no
/// larger is written on the full device (an adapter whose lease lapsed
/// refused the TRIMs that make room), where the same record as a `VSET`
/// is refused.
#[test]
fn versioned_deletes_and_lease_renewals_work_on_a_full_device() {
    let n = Node::start(&["--capacity", "64M"]);
    let mut c = BufReader::new(n.connect());
    let lease = |n: u64| format!("owner adapter-1 expires {n:012}").into_bytes();
    assert_eq!(
        call(&mut c, &[b"VSET", b"lease:vol", b"1", &lease(1)]),
        Resp::Int(1)
    );
    let value = vec![b'v'; 256 << 10];
    let vset = |key: String, value: &[u8]| {
        vec![
            b"VSET".to_vec(),
            key.into_bytes(),
            b"1".to_vec(),
            value.to_vec(),
        ]
    };
    let (stored, e) = until_refused(&mut c, 0, |i| vset(format!("vfull:{i:04}"), &value));
    assert!(e.starts_with("ERR NOSPACE"), "{e}");
    assert!(stored > 10, "only {stored} values fit");
    // Then smaller values until not even those fit: the log's open
    // segment has no room left for a tombstone, nor for the lease record
    // as a VSET.
    for (size, tag) in [(4096usize, "s"), (64, "t"), (8, "u")] {
        let small = vec![b'w'; size];
        let (_, e) = until_refused(&mut c, 0, |j| vset(format!("vfill:{tag}{j}"), &small));
        assert!(e.starts_with("ERR NOSPACE"), "{size}-byte values: {e}");
    }
    match call(&mut c, &[b"VSET", b"lease:vol", b"2", &lease(2)]) {
        Resp::Error(e) => assert!(e.starts_with("ERR NOSPACE"), "{e}"),
        other => panic!("a VSET on a full device: {other:?}"),
    }
    for v in 2..50u64 {
        let (expected, version) = ((v - 1).to_string(), v.to_string());
        let renewal: [&[u8]; 6] = [
            b"VCAS",
            b"lease:vol",
            expected.as_bytes(),
            version.as_bytes(),
            b"SET",
            &lease(v),
        ];
        assert_eq!(
            call(&mut c, &renewal),
            Resp::Int(1),
            "lease renewal {v} on a full device"
        );
    }
    for i in (0..stored).filter(|i| i % 4 != 0) {
        let key = format!("vfull:{i:04}");
        if let Resp::Error(e) = call(&mut c, &[b"VDEL", key.as_bytes(), b"2"]) {
            panic!("VDEL {key} on a full device: {e}");
        }
    }
    when_room(
        &mut c,
        &[b"VSET", b"vfull:new", b"1", &value],
        Duration::from_secs(30),
    );
    for i in (0..stored).step_by(4) {
        let key = format!("vfull:{i:04}");
        assert!(
            matches!(call(&mut c, &[b"GET", key.as_bytes()]), Resp::Bulk(ref b) if b.len() > value.len()),
            "{key} kept"
        );
    }
}

/// Overwriting a few keys over and over, four times the device's size in
/// all, never meets `NOSPACE`: the values each overwrite replaces are
/// garbage GC reclaims, once maintenance has merged the overwrites with
/// them (a SET that finds the device full meanwhile waits for that).
#[test]
fn overwrites_many_times_the_device_are_never_refused() {
    let n = Node::start(&["--capacity", "64M"]);
    let mut c = BufReader::new(n.connect());
    let value = |round: usize| vec![b'a' + (round % 26) as u8; 256 << 10];
    for round in 0..64 {
        for k in 0..16 {
            let key = format!("ow:{k:02}");
            match call(&mut c, &[b"SET", key.as_bytes(), &value(round)]) {
                Resp::Simple(s) if s == "OK" => {}
                other => panic!("round {round}, SET {key}: {other:?}"),
            }
        }
    }
    for k in 0..16 {
        let key = format!("ow:{k:02}");
        assert_eq!(
            call(&mut c, &[b"GET", key.as_bytes()]),
            Resp::Bulk(value(63)),
            "{key}"
        );
    }
}

#[test]
fn preallocate_allocates_the_whole_device_file_and_keeps_data() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--preallocate", "--capacity", "64M"];
    let mut n = Node::start_in(tmp.path(), &flags).expect("start");
    let dev = tmp.path().join("lightstore.dev");
    let allocated = || std::fs::metadata(&dev).map(|m| m.blocks() * 512).unwrap();
    assert!(
        allocated() >= 64 << 20,
        "device file has {} of 64 MiB allocated",
        allocated()
    );
    assert!(n.log_text().contains("preallocated the device file"));
    for i in 0..200 {
        assert_eq!(n.cli(&["set", &format!("k{i}"), &"v".repeat(3000)]), "OK");
    }
    n.stop_cleanly(Duration::from_secs(30));
    drop(n);
    // A second start finds no holes to fill and leaves the data alone.
    let n = Node::start_in(tmp.path(), &flags).expect("restart");
    assert!(!n.log_text().contains("preallocated"), "{}", n.log_text());
    assert_eq!(n.cli(&["get", "k199"]), "v".repeat(3000));
    assert_eq!(n.cli(&["strlen", "k0"]), "3000");
}

/// SETs of `value` under keys `{prefix}:NNNNN` from `from` until one is
/// refused; the number acknowledged and the refusal.
fn set_until_refused(
    c: &mut BufReader<std::net::TcpStream>,
    prefix: &str,
    from: usize,
    value: &[u8],
) -> (usize, String) {
    until_refused(c, from, |key| {
        let key = format!("{prefix}:{key:05}");
        vec![b"SET".to_vec(), key.into_bytes(), value.to_vec()]
    })
}

/// The writes `request(i)` for `i` from `from` until one is refused (any
/// error reply); the index of the refused one and the refusal.
fn until_refused(
    c: &mut BufReader<std::net::TcpStream>,
    from: usize,
    request: impl Fn(usize) -> Vec<Vec<u8>>,
) -> (usize, String) {
    for i in from..from + 100_000 {
        let args = request(i);
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        match call(c, &args) {
            Resp::Error(e) => return (i, e),
            Resp::Simple(_) | Resp::Int(_) => {}
            other => panic!("write {i}: {other:?}"),
        }
    }
    panic!("nothing filled up after 100000 writes");
}

/// The engine section's `host_full` field of INFO.
fn info_host_full(c: &mut BufReader<std::net::TcpStream>) -> String {
    match call(c, &[b"INFO", b"engine"]) {
        Resp::Bulk(b) => String::from_utf8_lossy(&b)
            .lines()
            .find_map(|l| l.strip_prefix("host_full:").map(str::to_string))
            .expect("INFO engine has host_full"),
        other => panic!("INFO: {other:?}"),
    }
}

/// A sparse device file on a host file system that fills up (a 56 MiB
/// tmpfs under a 96 MiB device, other files taking what the node's
/// reserve left): SETs get `-ERR NOSPACE …`, reads go on, a node killed
/// while full restarts and serves its data, and once space is freed on
/// the host (more than the reserve needs back and a segment), writes
/// resume without a restart. Under `sync` durability every acknowledged
/// SET is there at the end.
#[test]
fn a_full_host_file_system_refuses_writes_until_space_is_freed() {
    let Some(fs) = SmallFs::mount(56) else { return };
    let ballast = fs.path().join("ballast");
    let data = fs.path().join("data");
    // Overcommitted on purpose: a device file created before the node
    // starts keeps its size (a new one would be fitted to the tmpfs).
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::File::create(data.join("lightstore.dev"))
        .and_then(|f| f.set_len(96 << 20))
        .expect("sparse device file");
    let flags = ["--capacity", "96M", "--durability", "sync"];
    let mut n = Node::start_in(&data, &flags).expect("start");
    fill_host(&ballast);
    let value = vec![b'h'; 8192];
    let mut c = BufReader::new(n.connect());
    let (acked, err) = set_until_refused(&mut c, "host", 0, &value);
    assert!(err.starts_with("ERR NOSPACE"), "{err}");
    assert!(
        err.contains("file system holding the device is full"),
        "{err}"
    );
    assert!(acked > 100, "only {acked} SETs fit");
    assert_eq!(info_host_full(&mut c), "1");
    assert_eq!(
        call(&mut c, &[b"GET", b"host:00000"]),
        Resp::Bulk(value.clone())
    );
    let last = format!("host:{:05}", acked - 1);
    assert_eq!(
        call(&mut c, &[b"GET", last.as_bytes()]),
        Resp::Bulk(value.clone())
    );
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
    // Killed while full: it restarts (for reads) on the still-full host.
    n.child.kill().unwrap();
    n.child.wait().unwrap();
    drop(n);
    let n = Node::start_in(&data, &flags).expect("restart on a full host");
    let mut c = BufReader::new(n.connect());
    assert_eq!(
        call(&mut c, &[b"GET", last.as_bytes()]),
        Resp::Bulk(value.clone())
    );
    // On the still-full host it takes at most what fits the log segment it
    // opened with (4 MiB here), then refuses again.
    let (took, e) = set_until_refused(&mut c, "again", 0, &value);
    assert!(e.starts_with("ERR NOSPACE"), "{e}");
    assert!(took <= 512, "{took} SETs of 8 KiB on a full host");
    // Space freed on the host: writes resume by themselves.
    std::fs::remove_file(&ballast).expect("remove ballast");
    set_when_room(&mut c, b"more", b"x", Duration::from_secs(20));
    let (more, _) = set_until_refused(&mut c, "host", acked, &value);
    assert!(
        more > acked + 100,
        "only {} more SETs after freeing the ballast",
        more - acked
    );
    // A clean stop on a full host: every acknowledged SET is durable
    // (`sync`), so only the final flush is skipped.
    let mut n = n;
    n.stop_cleanly(Duration::from_secs(30));
    drop(n);
    drop(c);
    // The host is full again: the restart replays the log for reads.
    let n = Node::start_in(&data, &flags).expect("restart");
    let mut c = BufReader::new(n.connect());
    for i in (0..more).step_by(97).chain([more - 1]) {
        let key = format!("host:{i:05}");
        assert_eq!(
            call(&mut c, &[b"GET", key.as_bytes()]),
            Resp::Bulk(value.clone()),
            "{key}"
        );
    }
    assert_eq!(call(&mut c, &[b"GET", b"more"]), Resp::Bulk(b"x".to_vec()));
}

/// DELs every key `fill:NNNNN` below `acked` but each fourth; each must be
/// accepted (`what` names the case in a failure).
fn delete_three_quarters(
    c: &mut BufReader<std::net::TcpStream>,
    n: &Node,
    acked: usize,
    what: &str,
) {
    for i in (0..acked).filter(|i| i % 4 != 0) {
        let key = format!("fill:{i:05}");
        let got = call(c, &[b"DEL", key.as_bytes()]);
        if got != Resp::Int(1) {
            let info = match call(c, &[b"INFO", b"engine"]) {
                Resp::Bulk(b) => String::from_utf8_lossy(&b).replace("\r\n", " "),
                other => format!("{other:?}"),
            };
            panic!("{what}: DEL {key}: {got:?}; INFO: {info}\n{}", n.log_text());
        }
    }
}

/// Each fourth key `fill:NNNNN` below `acked` reads `kept`, the others
/// nothing (`what` names the case in a failure).
fn check_quarter_kept(
    c: &mut BufReader<std::net::TcpStream>,
    acked: usize,
    kept: &[u8],
    what: &str,
) {
    for i in 0..acked {
        let key = format!("fill:{i:05}");
        let want = if i % 4 == 0 {
            Resp::Bulk(kept.to_vec())
        } else {
            Resp::Nil
        };
        assert_eq!(call(c, &[b"GET", key.as_bytes()]), want, "{what}: {key}");
    }
}

/// SETs `value` under keys `more:NNNNN` until `want` are accepted or
/// `limit` has passed, pausing after each NOSPACE; how many were accepted.
fn sets_within(
    c: &mut BufReader<std::net::TcpStream>,
    want: usize,
    value: &[u8],
    limit: Duration,
) -> usize {
    let (mut more, deadline) = (0, std::time::Instant::now() + limit);
    while more < want && std::time::Instant::now() < deadline {
        let key = format!("more:{more:05}");
        match call(c, &[b"SET", key.as_bytes(), value]) {
            Resp::Simple(s) if s == "OK" => more += 1,
            Resp::Error(e) if e.starts_with("ERR NOSPACE") => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("SET {key}: {other:?}"),
        }
    }
    more
}

/// Retries a SET for at most `limit` while it gets NOSPACE: writes must
/// resume by themselves.
fn set_when_room(
    c: &mut BufReader<std::net::TcpStream>,
    key: &[u8],
    value: &[u8],
    limit: Duration,
) {
    when_room(c, &[b"SET", key, value], limit)
}

/// Sends the write `args` until it is taken, for at most `limit`, while it
/// is refused with NOSPACE.
fn when_room(c: &mut BufReader<std::net::TcpStream>, args: &[&[u8]], limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match call(c, args) {
            Resp::Simple(_) | Resp::Int(_) => return,
            Resp::Error(e) if std::time::Instant::now() < deadline => {
                assert!(e.starts_with("ERR NOSPACE"), "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("writes did not resume within {limit:?}: {other:?}"),
        }
    }
}

/// Hardening §1: a node on a small file system, with the default-sized
/// (8G) sparse device. The device is fitted to the file system when it is
/// created, so filling it with 64 KiB values ends in a clear NOSPACE
/// (device full), never a full file system; reads go on, deletes are
/// accepted, and once three quarters are deleted GC makes room and writes
/// resume, without a restart, with every remaining key intact. Under
/// `interval` and `sync` durability, each also with a restart while full
/// (a clean stop under `interval`, kill -9 under `sync`).
#[test]
fn a_node_on_a_small_file_system_fills_then_recovers_after_deletes() {
    // (durability, restart while full: none, SIGTERM, or kill -9 where
    // every acknowledged write is durable)
    for (durability, restart) in [
        ("interval", ""),
        ("sync", ""),
        ("interval", "stop"),
        ("sync", "kill"),
    ] {
        let Some(fs) = SmallFs::mount(48) else { return };
        let data = fs.path().join("data");
        let flags = ["--capacity", "8G", "--durability", durability];
        let mut n = Node::start_in(&data, &flags).expect("start");
        assert!(
            n.log_text().contains("instead of --capacity 8192 MiB"),
            "the fitted capacity is announced:\n{}",
            n.log_text()
        );
        let value = |i: usize| format!("{i:05}").repeat((64 << 10) / 5).into_bytes();
        let mut c = BufReader::new(n.connect());
        let (acked, err) = set_until_refused(&mut c, "fill", 0, &value(0));
        assert!(
            err.starts_with("ERR NOSPACE device full"),
            "{durability}: {err}"
        );
        assert!(acked > 100, "{durability}: only {acked} SETs of 64 KiB fit");
        assert_eq!(info_host_full(&mut c), "0", "the file system never filled");
        for i in (0..acked).step_by(37) {
            let key = format!("fill:{i:05}");
            assert_eq!(
                call(&mut c, &[b"GET", key.as_bytes()]),
                Resp::Bulk(value(0))
            );
        }
        if !restart.is_empty() {
            // Stopped or killed while full: it restarts and serves its data.
            drop(c);
            if restart == "kill" {
                n.child.kill().unwrap();
                n.child.wait().unwrap();
            } else {
                n.stop_cleanly(Duration::from_secs(30));
            }
            drop(n);
            n = Node::start_in(&data, &flags).expect("restart while full");
            c = BufReader::new(n.connect());
        }
        delete_three_quarters(&mut c, &n, acked, &format!("{durability}, full device"));
        set_when_room(&mut c, b"after", &value(1), Duration::from_secs(30));
        check_quarter_kept(&mut c, acked, &value(0), durability);
        // The space GC freed is usable: many more values fit.
        let more = sets_within(&mut c, acked / 4, &value(2), Duration::from_secs(30));
        assert!(
            more >= acked / 4,
            "{durability}: only {more} SETs after freeing 3/4 of {acked}"
        );
        assert_eq!(call(&mut c, &[b"GET", b"after"]), Resp::Bulk(value(1)));
    }
}

/// Hardening §1, the case a fitted device cannot prevent: other files fill
/// the host file system under a node. SETs get `-ERR NOSPACE … the file
/// system holding the device is full`, reads go on, DELs are accepted (the
/// node keeps reserve segments allocated on the host), and once three
/// quarters are deleted GC gives the host room back and writes resume
/// without a restart, every remaining key intact. Under `interval` and
/// `sync` (this one also killed with SIGKILL and restarted while full).
#[test]
fn a_host_filled_by_other_files_takes_deletes_and_recovers_after_them() {
    for durability in ["interval", "sync"] {
        let Some(fs) = SmallFs::mount(48) else { return };
        let data = fs.path().join("data");
        let flags = ["--capacity", "8G", "--durability", durability];
        let mut n = Node::start_in(&data, &flags).expect("start");
        let value = |i: usize| format!("{i:05}").repeat((64 << 10) / 5).into_bytes();
        let mut c = BufReader::new(n.connect());
        // About a third of the device, then other files take the rest.
        for i in 0..200 {
            let key = format!("fill:{i:05}");
            assert_eq!(
                call(&mut c, &[b"SET", key.as_bytes(), &value(0)]),
                Resp::Simple("OK".into())
            );
        }
        fill_host(&fs.path().join("ballast"));
        let (acked, err) = set_until_refused(&mut c, "fill", 200, &value(0));
        assert!(err.starts_with("ERR NOSPACE"), "{durability}: {err}");
        assert!(
            err.contains("file system holding the device is full"),
            "{durability}: {err}"
        );
        assert_eq!(info_host_full(&mut c), "1");
        for i in (0..acked).step_by(13) {
            let key = format!("fill:{i:05}");
            assert_eq!(
                call(&mut c, &[b"GET", key.as_bytes()]),
                Resp::Bulk(value(0))
            );
        }
        if durability == "sync" {
            drop(c);
            n.child.kill().unwrap();
            n.child.wait().unwrap();
            drop(n);
            n = Node::start_in(&data, &flags).expect("restart on a full host");
            c = BufReader::new(n.connect());
        }
        delete_three_quarters(&mut c, &n, acked, &format!("{durability}, full host"));
        set_when_room(&mut c, b"after", &value(1), Duration::from_secs(30));
        // What GC frees refills the reserve first, then goes back to the
        // host: a good part of what was deleted becomes writable again.
        let more = sets_within(&mut c, acked / 4, &value(2), Duration::from_secs(30));
        assert!(
            more >= acked / 4,
            "{durability}: only {more} SETs in 30 s after deleting 3/4 of {acked}; INFO: {}",
            match call(&mut c, &[b"INFO", b"engine"]) {
                Resp::Bulk(b) => String::from_utf8_lossy(&b).replace("\r\n", " "),
                other => format!("{other:?}"),
            }
        );
        check_quarter_kept(&mut c, acked, &value(0), durability);
        assert_eq!(call(&mut c, &[b"GET", b"after"]), Resp::Bulk(value(1)));
    }
}
