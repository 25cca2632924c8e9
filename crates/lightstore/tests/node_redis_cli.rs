//! `lightstore node` driven by the stock redis-cli: commands, SCAN,
//! INFO, errors that leave the connection usable, `--pipe` pipelining,
//! binary-safe data and a 16 MiB value.

mod node_support;

use std::io::BufReader;
use std::time::Duration;

use node_support::{call, encode, read_reply, Node, Resp};

#[test]
fn redis_cli_basic_commands() {
    let n = Node::start(&[]);
    assert_eq!(n.cli(&["set", "hello", "world"]), "OK");
    assert_eq!(n.cli(&["get", "hello"]), "world");
    assert_eq!(n.cli(&["get", "missing"]), "");
    assert_eq!(n.cli(&["mset", "a", "1", "b", "2", "c", "3"]), "OK");
    assert_eq!(n.cli(&["mget", "a", "missing", "c"]), "1\n\n3");
    assert_eq!(n.cli(&["exists", "a", "b", "missing", "a"]), "3");
    assert_eq!(n.cli(&["del", "a", "b", "missing", "a"]), "2");
    assert_eq!(n.cli(&["exists", "a", "b", "c"]), "1");
    assert_eq!(n.cli(&["strlen", "hello"]), "5");
    assert_eq!(n.cli(&["strlen", "missing"]), "0");
    assert_eq!(n.cli(&["getrange", "hello", "1", "3"]), "orl");
    assert_eq!(n.cli(&["getrange", "hello", "-3", "-1"]), "rld");
    assert_eq!(n.cli(&["getrange", "hello", "4", "2"]), "");
    assert_eq!(n.cli(&["set", "hello", "x", "NX"]), "");
    assert_eq!(n.cli(&["set", "hello", "there", "XX", "GET"]), "world");
    assert_eq!(n.cli(&["get", "hello"]), "there");
    assert_eq!(n.cli(&["set", "new", "v", "XX"]), "");
    assert_eq!(n.cli(&["exists", "new"]), "0");
    assert_eq!(n.cli(&["ping"]), "PONG");
    assert_eq!(n.cli(&["echo", "hi there"]), "hi there");
    assert_eq!(n.cli(&["select", "0"]), "OK");
    assert!(n.cli(&["select", "1"]).contains("DB index is out of range"));
    assert_eq!(n.cli(&["dbsize"]), "2");
    assert_eq!(n.cli(&["fsync"]), "OK");
    assert!(n
        .cli(&["fsync", "extra"])
        .contains("wrong number of arguments"));
    assert_eq!(n.cli(&["range", "a", "z"]), "c\n3\nhello\nthere");
    assert_eq!(n.cli(&["range", "d", ""]), "hello\nthere");
    assert_eq!(n.cli(&["range", "", "", "LIMIT", "1"]), "c\n3");
    assert_eq!(n.cli(&["range", "", "", "KEYSONLY"]), "c\nhello");
    assert_eq!(n.cli(&["range", "", "", "keysonly", "limit", "1"]), "c");
    assert!(n.cli(&["range", "", "", "LIMIT"]).contains("ERR"));
    assert!(n.cli(&["range", "", "", "BOGUS"]).contains("ERR"));
    assert!(n.cli(&["config", "get", "appendonly"]).contains("no"));
    assert!(n.cli(&["info"]).contains("write_amplification:"));
    let info = n.cli(&["info", "engine"]);
    assert!(info.contains("device_reads_per_get:"), "{info}");
    assert!(!info.contains("# Server"), "{info}");
    assert!(n.cli(&["info", "keyspace"]).contains("db0:keys=2"));
    assert!(n.cli(&["info", "stats"]).contains("cmdstat_set:calls="));
    // HELLO 3 switches the protocol; the reply is a map.
    let hello = n.cli(&["-3", "hello", "3"]);
    assert!(
        hello.contains("lightstore") && hello.contains("proto"),
        "{hello}"
    );
}

#[test]
fn errors_keep_the_connection_usable() {
    let n = Node::start(&[]);
    let mut c = BufReader::new(n.connect());
    let r = call(&mut c, &[b"FOO", b"bar"]);
    assert!(
        matches!(&r, Resp::Error(e) if e.starts_with("ERR unknown command 'FOO'")),
        "{r:?}"
    );
    let r = call(&mut c, &[b"get"]);
    assert_eq!(
        r,
        Resp::Error("ERR wrong number of arguments for 'get' command".into())
    );
    let r = call(&mut c, &[b"expire", b"k", b"10"]);
    assert_eq!(
        r,
        Resp::Error(
            "ERR LightStore stores plain keys and values: 'EXPIRE' is not supported".into()
        )
    );
    let r = call(&mut c, &[b"set", b"", b"v"]);
    assert!(matches!(r, Resp::Error(_)), "{r:?}");
    assert_eq!(
        call(&mut c, &[b"set", b"k", b"v"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(call(&mut c, &[b"get", b"k"]), Resp::Bulk(b"v".to_vec()));
    // The same through redis-cli: the error is printed, the next command works.
    let out = n.cli_output(&["nosuchcommand"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("unknown command"));
    assert_eq!(n.cli(&["get", "k"]), "v");
}

#[test]
fn scan_with_pattern_finds_exactly_the_matching_keys() {
    let n = Node::start(&[]);
    let mut pipe = Vec::new();
    for i in 0..300 {
        pipe.extend(encode(&[b"SET", format!("user:{i}").as_bytes(), b"x"]));
        pipe.extend(encode(&[b"SET", format!("item:{i}").as_bytes(), b"y"]));
    }
    let out = n.cli_output(&["--pipe"], Some(&pipe));
    assert!(String::from_utf8_lossy(&out.stdout).contains("errors: 0, replies: 600"));
    let found = n.cli(&["--scan", "--pattern", "user:1?"]);
    let mut keys: Vec<&str> = found.lines().collect();
    keys.sort();
    let mut want: Vec<String> = (10..20).map(|i| format!("user:{i}")).collect();
    want.sort();
    assert_eq!(keys, want);
    let all = n.cli(&["--scan", "--pattern", "item:*"]);
    assert_eq!(all.lines().count(), 300);
    let everything = n.cli(&["--scan"]);
    assert_eq!(everything.lines().count(), 600);
    let bad = n.cli_output(&["scan", "123456789"], None);
    assert!(String::from_utf8_lossy(&bad.stdout).contains("cursor"));
}

#[test]
fn pipe_of_ten_thousand_sets() {
    let n = Node::start(&[]);
    let mut pipe = Vec::new();
    for i in 0..10_000 {
        pipe.extend(encode(&[
            b"SET",
            format!("key:{i}").as_bytes(),
            format!("value:{i}").as_bytes(),
        ]));
    }
    let out = n.cli_output(&["--pipe"], Some(&pipe));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("errors: 0, replies: 10000"), "{text}");
    assert_eq!(n.cli(&["get", "key:9999"]), "value:9999");
    assert_eq!(n.cli(&["get", "key:0"]), "value:0");
    assert_eq!(n.cli(&["mget", "key:1", "key:5000"]), "value:1\nvalue:5000");
}

#[test]
fn binary_safe_keys_and_values() {
    let n = Node::start(&[]);
    let value: Vec<u8> = (0..=255u8).chain(b"\r\n\0end".iter().copied()).collect();
    // redis-cli -x takes the value from stdin, byte for byte.
    let out = n.cli_output(&["-x", "set", "bin"], Some(&value));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    let mut c = BufReader::new(n.connect());
    assert_eq!(call(&mut c, &[b"get", b"bin"]), Resp::Bulk(value.clone()));
    let key = b"k\r\n\0\xff\x01";
    assert_eq!(
        call(&mut c, &[b"set", key, &value]),
        Resp::Simple("OK".into())
    );
    assert_eq!(call(&mut c, &[b"get", key]), Resp::Bulk(value.clone()));
    assert_eq!(
        call(&mut c, &[b"strlen", key]),
        Resp::Int(value.len() as i64)
    );
}

#[test]
fn sixteen_mib_value_through_pipe() {
    let n = Node::start(&[]);
    let value: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    let out = n.cli_output(&["--pipe"], Some(&encode(&[b"SET", b"big", &value])));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("errors: 0, replies: 1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(n.cli(&["strlen", "big"]), (16u32 << 20).to_string());
    let mut c = BufReader::new(n.connect());
    assert_eq!(call(&mut c, &[b"get", b"big"]), Resp::Bulk(value));
}

#[test]
fn pipeline_keeps_reply_order_across_local_and_engine_commands() {
    use std::io::{Read, Write};
    let n = Node::start(&[]);
    let mut s = n.connect();
    let mut req = Vec::new();
    for args in [
        &[&b"SET"[..], b"a", b"1"][..],
        &[b"PING"],
        &[b"GET", b"a"],
        &[b"ECHO", b"x"],
        &[b"GET", b"missing"],
        &[b"HELLO", b"3"],
        &[b"GET", b"missing"],
        &[b"QUIT"],
        &[b"GET", b"a"], // after QUIT: not answered
    ] {
        req.extend(encode(args));
    }
    s.write_all(&req).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.starts_with("+OK\r\n+PONG\r\n$1\r\n1\r\n$1\r\nx\r\n$-1\r\n%7\r\n"),
        "{text:?}"
    );
    assert!(text.ends_with("_\r\n+OK\r\n"), "{text:?}");
}

#[test]
fn grouped_gets_and_sets_keep_per_command_replies() {
    use std::io::{Read, Write};
    let n = Node::start(&[]);
    let mut s = n.connect();
    let mut req = Vec::new();
    // A run of plain SETs with an invalid (empty) key in the middle, then a
    // run of GETs over present and missing keys: replies stay per command.
    for args in [
        &[&b"SET"[..], b"a", b"1"][..],
        &[b"SET", b"", b"2"],
        &[b"SET", b"c", b"3"],
        &[b"GET", b"a"],
        &[b"GET", b"missing"],
        &[b"GET", b"c"],
        &[b"QUIT"],
    ] {
        req.extend(encode(args));
    }
    s.write_all(&req).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert_eq!(lines[0], "+OK", "{text:?}");
    assert!(
        lines[1].starts_with("-ERR"),
        "empty key must fail alone: {text:?}"
    );
    assert_eq!(
        &lines[2..9],
        ["+OK", "$1", "1", "$-1", "$1", "3", "+OK"],
        "{text:?}"
    );
}

/// VSET/VDEL (the cluster client's versioned writes): a replica only moves
/// to a newer version, tombstones are versions too, plain values count as 0.
#[test]
fn versioned_writes_only_move_forward() {
    let n = Node::start(&[]);
    let mut c = BufReader::new(n.connect());
    let header = |kind: u8, v: u64| {
        let mut h = vec![0xF1, kind];
        h.extend_from_slice(&v.to_be_bytes());
        h
    };
    let stored = |c: &mut BufReader<std::net::TcpStream>, k: &[u8]| match call(c, &[b"GET", k]) {
        Resp::Bulk(b) => Some(b),
        _ => None,
    };
    assert_eq!(call(&mut c, &[b"VSET", b"k", b"5", b"five"]), Resp::Int(1));
    assert_eq!(call(&mut c, &[b"VSET", b"k", b"4", b"four"]), Resp::Int(0));
    assert_eq!(call(&mut c, &[b"VSET", b"k", b"5", b"again"]), Resp::Int(0));
    let mut want = header(1, 5);
    want.extend_from_slice(b"five");
    assert_eq!(stored(&mut c, b"k"), Some(want));
    // VMETA: version, checksum and length of what a replica holds.
    let Resp::Array(meta) = call(&mut c, &[b"VMETA", b"k", b"missing"]) else {
        panic!("VMETA reply");
    };
    assert_eq!(meta[1], Resp::Nil);
    let Resp::Array(fields) = &meta[0] else {
        panic!("VMETA entry {:?}", meta[0]);
    };
    assert_eq!(fields[0], Resp::Bulk(b"5".to_vec()));
    assert!(matches!(fields[1], Resp::Int(_)));
    assert_eq!(fields[2], Resp::Int(14), "10-byte header + 'five'");
    // One call: the newest duplicate wins; a plain value is version 0.
    assert_eq!(
        call(&mut c, &[b"SET", b"p", b"plain"]),
        Resp::Simple("OK".into())
    );
    let r = call(
        &mut c,
        &[
            b"VSET", b"k", b"9", b"nine", b"k", b"7", b"seven", b"p", b"1", b"one",
        ],
    );
    assert_eq!(r, Resp::Int(2));
    let Resp::Array(meta) = call(&mut c, &[b"VMETA", b"k"]) else {
        panic!("VMETA reply");
    };
    let Resp::Array(fields) = &meta[0] else {
        panic!("VMETA entry {:?}", meta[0]);
    };
    assert_eq!(fields[0], Resp::Bulk(b"9".to_vec()), "the newest version");
    assert_eq!(fields[2], Resp::Int(14));
    assert_eq!(
        stored(&mut c, b"k").map(|v| v[10..].to_vec()),
        Some(b"nine".to_vec())
    );
    assert_eq!(
        stored(&mut c, b"p").map(|v| v[10..].to_vec()),
        Some(b"one".to_vec())
    );
    // Tombstones: older ones are ignored, newer ones replace the value.
    assert_eq!(call(&mut c, &[b"VDEL", b"k", b"8"]), Resp::Int(0));
    assert_eq!(
        call(&mut c, &[b"VDEL", b"k", b"10", b"gone", b"3"]),
        Resp::Int(2)
    );
    assert_eq!(stored(&mut c, b"k"), Some(header(2, 10)));
    assert_eq!(call(&mut c, &[b"VSET", b"k", b"10", b"x"]), Resp::Int(0));
    assert_eq!(call(&mut c, &[b"VSET", b"k", b"11", b"x"]), Resp::Int(1));
    // Two writers that picked one version: the copies are ordered by their
    // bytes, so replicas that get them in opposite orders converge.
    assert_eq!(call(&mut c, &[b"VSET", b"r1", b"20", b"bbb"]), Resp::Int(1));
    assert_eq!(call(&mut c, &[b"VSET", b"r1", b"20", b"aaa"]), Resp::Int(0));
    assert_eq!(call(&mut c, &[b"VSET", b"r2", b"20", b"aaa"]), Resp::Int(1));
    assert_eq!(call(&mut c, &[b"VSET", b"r2", b"20", b"bbb"]), Resp::Int(1));
    assert_eq!(stored(&mut c, b"r1"), stored(&mut c, b"r2"));
    // RANGE ... DIGESTS lists each key with its VMETA digest, tombstones
    // and plain values included, in key order.
    let Resp::Array(listed) = call(&mut c, &[b"RANGE", b"", b"", b"DIGESTS"]) else {
        panic!("RANGE DIGESTS reply");
    };
    let keys: Vec<&Resp> = listed.iter().step_by(2).collect();
    let bulk = |b: &[u8]| Resp::Bulk(b.to_vec());
    assert_eq!(
        keys,
        [
            &bulk(b"gone"),
            &bulk(b"k"),
            &bulk(b"p"),
            &bulk(b"r1"),
            &bulk(b"r2")
        ]
    );
    let Resp::Array(gone) = &listed[1] else {
        panic!("digest of gone: {:?}", listed[1]);
    };
    assert_eq!(gone[0], bulk(b"3"));
    assert_eq!(gone[3], Resp::Int(1), "a tombstone");
    let Resp::Array(k) = &listed[3] else {
        panic!("digest of k: {:?}", listed[3]);
    };
    assert_eq!(
        (&k[0], &k[2], &k[3]),
        (&bulk(b"11"), &Resp::Int(11), &Resp::Int(0))
    );
    let Resp::Array(one) = call(&mut c, &[b"RANGE", b"k", b"r", b"DIGESTS", b"LIMIT", b"1"]) else {
        panic!("RANGE DIGESTS LIMIT 1 reply");
    };
    assert_eq!((one.len(), &one[0]), (2, &bulk(b"k")));
    assert!(matches!(
        call(&mut c, &[b"RANGE", b"", b"", b"DIGESTS", b"KEYSONLY"]),
        Resp::Error(_)
    ));
    // Bad input gets an error and the connection stays usable.
    assert!(matches!(
        call(&mut c, &[b"VSET", b"k", b"-1", b"x"]),
        Resp::Error(_)
    ));
    assert!(matches!(
        call(&mut c, &[b"VSET", b"k", b"1", b"x", b"y"]),
        Resp::Error(_)
    ));
    assert!(matches!(call(&mut c, &[b"VDEL", b"k"]), Resp::Error(_)));
    assert_eq!(call(&mut c, &[b"PING"]), Resp::Simple("PONG".into()));
}

/// Read workers merge GET batches of many connections into one multi-get;
/// every connection must still get exactly its own values, in order, also
/// for missing keys. 24 clients pipeline GET runs of 1 to 24 keys over a
/// shared key space at once (two read threads, so merging happens).
#[test]
fn merged_gets_of_many_connections_answer_each_its_own() {
    use std::io::Write;
    let n = Node::start(&["--read-threads", "2"]);
    let value = |k: usize| format!("value-{k}-{}", "x".repeat(k % 300)).into_bytes();
    let mut setup = BufReader::new(n.connect());
    for k in (0..600).filter(|k| k % 7 != 0) {
        let key = format!("k{k}");
        assert_eq!(
            call(&mut setup, &[b"SET", key.as_bytes(), &value(k)]),
            Resp::Simple("OK".into())
        );
    }
    std::thread::scope(|scope| {
        for client in 0..24usize {
            let n = &n;
            scope.spawn(move || {
                let mut conn = BufReader::new(n.connect());
                for round in 0..40usize {
                    let run = 1 + (client + round) % 24;
                    let keys: Vec<usize> = (0..run)
                        .map(|i| (client * 31 + round * 17 + i * 13) % 600)
                        .collect();
                    let mut req = Vec::new();
                    for k in &keys {
                        req.extend(encode(&[b"GET", format!("k{k}").as_bytes()]));
                    }
                    conn.get_mut().write_all(&req).expect("write");
                    for k in &keys {
                        let want = if k % 7 == 0 {
                            Resp::Nil
                        } else {
                            Resp::Bulk(value(*k))
                        };
                        assert_eq!(
                            read_reply(&mut conn).expect("reply"),
                            want,
                            "client {client} key {k}"
                        );
                    }
                }
            });
        }
    });
}

/// Write workers merge the plain-SET runs of many connections into one
/// batch. Every SET must still get its own reply (an invalid one fails
/// alone, also when it rode in a merged batch) and every acknowledged SET
/// must be readable afterwards.
#[test]
fn merged_sets_of_many_connections_answer_each_its_own() {
    use std::io::Write;
    let n = Node::start(&["--durability", "sync"]);
    let value =
        |c: usize, r: usize, i: usize| format!("v{c}.{r}.{i}-{}", "y".repeat((c * r + i) % 500));
    // Each round's run length, and where client 3 puts an invalid (empty)
    // key in the middle of some runs.
    let shape = |client: usize, round: usize| {
        let run = 1 + (client + round) % 16;
        (
            run,
            (client == 3 && round.is_multiple_of(4)).then_some(run / 2),
        )
    };
    std::thread::scope(|scope| {
        for client in 0..16usize {
            let n = &n;
            scope.spawn(move || {
                let mut conn = BufReader::new(n.connect());
                for round in 0..30usize {
                    let (run, bad) = shape(client, round);
                    let mut req = Vec::new();
                    for i in 0..run {
                        let key = if bad == Some(i) {
                            String::new()
                        } else {
                            format!("c{client}-r{round}-i{i}")
                        };
                        req.extend(encode(&[
                            b"SET",
                            key.as_bytes(),
                            value(client, round, i).as_bytes(),
                        ]));
                    }
                    conn.get_mut().write_all(&req).expect("write");
                    for i in 0..run {
                        let reply = read_reply(&mut conn).expect("reply");
                        if bad == Some(i) {
                            assert!(
                                matches!(reply, Resp::Error(_)),
                                "client {client} round {round}: {reply:?}"
                            );
                        } else {
                            assert_eq!(
                                reply,
                                Resp::Simple("OK".into()),
                                "client {client} round {round} set {i}"
                            );
                        }
                    }
                }
            });
        }
    });
    let mut conn = BufReader::new(n.connect());
    for client in 0..16usize {
        for round in 0..30usize {
            let (run, bad) = shape(client, round);
            for i in (0..run).filter(|i| bad != Some(*i)) {
                let key = format!("c{client}-r{round}-i{i}");
                assert_eq!(
                    call(&mut conn, &[b"GET", key.as_bytes()]),
                    Resp::Bulk(value(client, round, i).into_bytes()),
                    "{key}"
                );
            }
        }
    }
}

/// A pipelined run of VSET/VDEL is one conditional batch on the node, with
/// the same replies as one command at a time: later commands see earlier
/// ones, and a malformed command gets its own error.
#[test]
fn pipelined_versioned_writes_answer_as_if_one_by_one() {
    let n = Node::start(&[]);
    let mut c = BufReader::new(n.connect());
    let pipeline = |c: &mut BufReader<std::net::TcpStream>, cmds: &[&[&[u8]]]| {
        let mut bytes = Vec::new();
        for cmd in cmds {
            bytes.extend(node_support::encode(cmd));
        }
        std::io::Write::write_all(c.get_mut(), &bytes).expect("write");
        cmds.iter()
            .map(|_| node_support::read_reply(c).expect("reply"))
            .collect::<Vec<_>>()
    };
    let replies = pipeline(
        &mut c,
        &[
            &[b"VSET", b"a", b"5", b"x"],
            &[b"VSET", b"a", b"4", b"y"],
            &[b"VSET", b"a", b"6", b"z", b"b", b"1", b"w"],
            &[b"VDEL", b"a", b"7"],
            &[b"VSET", b"a", b"7", b"late"],
        ],
    );
    assert_eq!(
        replies,
        [
            Resp::Int(1),
            Resp::Int(0),
            Resp::Int(2),
            Resp::Int(1),
            Resp::Int(0)
        ]
    );
    let mut tombstone = vec![0xF1, 2];
    tombstone.extend_from_slice(&7u64.to_be_bytes());
    assert_eq!(call(&mut c, &[b"GET", b"a"]), Resp::Bulk(tombstone));
    let replies = pipeline(
        &mut c,
        &[
            &[b"VSET", b"c", b"1", b"x"],
            &[b"VSET", b"c", b"bad", b"y"],
            &[b"VSET", b"c", b"2", b"z"],
        ],
    );
    assert_eq!(replies[0], Resp::Int(1));
    assert!(matches!(&replies[1], Resp::Error(e) if e.contains("version")));
    assert_eq!(replies[2], Resp::Int(1));
}

/// `HINT` records writes another node missed in the node's reserved key
/// range: they show in INFO, never in SCAN, RANGE or DBSIZE, and no client
/// write may touch that range. User keys on both sides of it still list.
/// The counts in INFO follow each hint created (not a raised one) and are
/// counted again from the store when the node restarts.
#[test]
fn hints_stay_out_of_the_user_key_space() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut n = Node::start_in(tmp.path(), &["--hinted-handoff", "no"]).expect("node starts");
    let mut c = BufReader::new(n.connect());
    let reserved: &[u8] = b"\xff\xff\xff\xfflightstore/hint/x";
    let after: &[u8] = b"\xff\xff\xff\xfflightstore0";
    assert_eq!(
        call(&mut c, &[b"SET", b"a", b"1"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        call(&mut c, &[b"SET", after, b"2"]),
        Resp::Simple("OK".into())
    );
    for req in [
        &[&b"SET"[..], reserved, b"v"][..],
        &[b"MSET", b"b", b"1", reserved, b"v"],
        &[b"DEL", b"a", reserved],
        &[b"VSET", reserved, b"5", b"v"],
        &[b"VDEL", b"b", b"5", reserved, b"6"],
        &[b"GET", reserved],
        &[b"MGET", b"a", reserved],
        &[b"HINT", b"127.0.0.1:1", reserved, b"5"],
    ] {
        match call(&mut c, req) {
            Resp::Error(e) => assert!(e.contains("reserved"), "{e}"),
            other => panic!("{req:?}: {other:?}"),
        }
    }
    assert_eq!(
        call(&mut c, &[b"HINT", b"127.0.0.1:1", b"a", b"7", b"b", b"8"]),
        Resp::Int(2)
    );
    assert_eq!(
        call(&mut c, &[b"HINT", b"127.0.0.1:1", b"a", b"6"]),
        Resp::Int(0),
        "a hint only moves to a newer version"
    );
    // A key with no room left for the hint prefix is skipped, the rest kept.
    let long = vec![b'k'; 8190];
    assert_eq!(
        call(&mut c, &[b"HINT", b"127.0.0.1:2", &long, b"9", b"c", b"9"]),
        Resp::Int(1)
    );
    assert!(matches!(
        call(&mut c, &[b"HINT", b"", b"a", b"1"]),
        Resp::Error(_)
    ));
    assert!(matches!(
        call(&mut c, &[b"HINT", b"h:1", b"a", b"x"]),
        Resp::Error(_)
    ));
    assert!(matches!(
        call(&mut c, &[b"HINT", b"h:1", b"a"]),
        Resp::Error(_)
    ));
    let bulk = |b: &[u8]| Resp::Bulk(b.to_vec());
    assert_eq!(call(&mut c, &[b"DBSIZE"]), Resp::Int(2));
    assert_eq!(
        call(&mut c, &[b"RANGE", b"", b"", b"KEYSONLY"]),
        Resp::Array(vec![bulk(b"a"), bulk(after)])
    );
    assert_eq!(
        call(&mut c, &[b"RANGE", b"", b"", b"LIMIT", b"1"]),
        Resp::Array(vec![bulk(b"a"), bulk(b"1")])
    );
    let Resp::Array(scan) = call(&mut c, &[b"SCAN", b"0", b"COUNT", b"100"]) else {
        panic!("scan reply");
    };
    assert_eq!(scan[1], Resp::Array(vec![bulk(b"a"), bulk(after)]));
    let hints_kept = |c: &mut BufReader<std::net::TcpStream>, when: &str| {
        let Resp::Bulk(info) = call(c, &[b"INFO", b"handoff"]) else {
            panic!("info reply");
        };
        let info = String::from_utf8_lossy(&info).to_string();
        assert!(info.contains("hints_pending:3"), "{when}: {info}");
        assert!(
            info.contains("hints_targets:127.0.0.1:1=2,127.0.0.1:2=1"),
            "{when}: {info}"
        );
    };
    hints_kept(&mut c, "as written");
    drop(c);
    n.stop_cleanly(Duration::from_secs(10));
    let n = Node::start_in(tmp.path(), &["--hinted-handoff", "no"]).expect("node restarts");
    hints_kept(&mut BufReader::new(n.connect()), "after a restart");
}
