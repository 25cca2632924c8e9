//! Value reclustering through the node: range reads of values written in
//! random order get their ranges rewritten in key order in the background
//! (INFO engine `recluster_*`), `RECLUSTER` does it on demand, the data
//! reads the same throughout, and `--no-recluster` turns the background
//! work off.

mod node_support;

use std::io::BufReader;
use std::time::{Duration, Instant};

use node_support::{call, Node, Resp};

const KEYS: usize = 2000;

fn key(i: usize) -> Vec<u8> {
    format!("rk{i:05}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("value of {i:05} ").into_bytes();
    v.resize(500, b'a' + (i % 26) as u8);
    v
}

/// Writes every key once, in an order that scatters neighbouring keys
/// over the log (batches of MSET of keys far apart).
fn write_scattered(conn: &mut BufReader<std::net::TcpStream>) {
    let order: Vec<usize> = (0..KEYS).map(|i| (i * 7919) % KEYS).collect();
    for chunk in order.chunks(50) {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = chunk.iter().map(|&i| (key(i), value(i))).collect();
        let mut args: Vec<&[u8]> = vec![b"MSET"];
        for (k, v) in &pairs {
            args.push(k);
            args.push(v);
        }
        assert_eq!(call(conn, &args), Resp::Simple("OK".into()));
    }
}

/// Every pair, read with RANGE pages of 100.
fn read_all(conn: &mut BufReader<std::net::TcpStream>) -> Vec<Resp> {
    let mut out = Vec::new();
    let mut start = Vec::new();
    loop {
        let Resp::Array(page) = call(conn, &[b"RANGE", &start, b"", b"LIMIT", b"100"]) else {
            panic!("RANGE reply");
        };
        let n = page.len();
        if let Some(Resp::Bulk(last)) = page.get(n.saturating_sub(2)) {
            start = last.clone();
            start.push(0);
        }
        out.extend(page);
        if n < 200 {
            return out;
        }
    }
}

fn expected() -> Vec<Resp> {
    (0..KEYS)
        .flat_map(|i| [Resp::Bulk(key(i)), Resp::Bulk(value(i))])
        .collect()
}

fn info_field(n: &Node, field: &str) -> Option<u64> {
    n.cli(&["info", "engine"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
}

/// `RECLUSTER`'s reply as (name, number) pairs.
fn recluster(conn: &mut BufReader<std::net::TcpStream>, args: &[&[u8]]) -> Vec<(String, i64)> {
    let mut req: Vec<&[u8]> = vec![b"RECLUSTER"];
    req.extend_from_slice(args);
    let Resp::Array(fields) = call(conn, &req) else {
        panic!("RECLUSTER reply");
    };
    fields
        .chunks(2)
        .map(|f| match f {
            [Resp::Bulk(name), Resp::Int(v)] => (String::from_utf8_lossy(name).into_owned(), *v),
            other => panic!("RECLUSTER field {other:?}"),
        })
        .collect()
}

fn field(fields: &[(String, i64)], name: &str) -> i64 {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} in {fields:?}"))
        .1
}

#[test]
fn ranges_that_are_read_get_reclustered_in_the_background() {
    let n = Node::start(&[]);
    let mut conn = BufReader::new(n.connect());
    write_scattered(&mut conn);
    let want = expected();
    // Range reads, repeated: one listing in four is handed on.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert_eq!(read_all(&mut conn), want);
        if info_field(&n, "recluster_bytes").unwrap_or(0) > 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(info_field(&n, "recluster_ranges").expect("recluster_ranges") > 0);
    assert!(
        info_field(&n, "recluster_bytes").expect("recluster_bytes") > 0,
        "read ranges were rewritten"
    );
    assert_eq!(read_all(&mut conn), want, "same data after");

    // On demand: the rest, then nothing left to do.
    let all = recluster(&mut conn, &[]);
    // The node's own keys (its run records) are counted too.
    assert!(
        (KEYS as i64..KEYS as i64 + 10).contains(&field(&all, "keys")),
        "{all:?}"
    );
    assert_eq!(field(&all, "stopped_for_space"), 0);
    let again = recluster(&mut conn, &[]);
    assert_eq!(field(&again, "rewritten"), 0, "{again:?}");
    assert_eq!(field(&again, "bytes"), 0);
    let part = recluster(&mut conn, &[&key(100), &key(200)]);
    assert_eq!(field(&part, "keys"), 100);
    assert_eq!(read_all(&mut conn), want);
    match call(&mut conn, &[b"RECLUSTER", b"only-a-start"]) {
        Resp::Error(e) => assert!(e.contains("wrong number of arguments"), "{e}"),
        other => panic!("RECLUSTER with one argument: {other:?}"),
    }
}

/// Multi-gets of keys in ascending order (a volume's chunks read in order)
/// are reclustered too; one of keys far apart only costs a bounded look
/// from its first key, not a rewrite of everything between.
#[test]
fn ordered_multi_gets_get_reclustered_and_sparse_ones_stay_bounded() {
    let n = Node::start(&[]);
    let mut conn = BufReader::new(n.connect());
    write_scattered(&mut conn);
    let mget = |conn: &mut BufReader<std::net::TcpStream>, ks: &[usize]| {
        let keys: Vec<Vec<u8>> = ks.iter().map(|&i| key(i)).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| &k[..]));
        let want: Vec<Resp> = ks.iter().map(|&i| Resp::Bulk(value(i))).collect();
        assert_eq!(call(conn, &args), Resp::Array(want));
    };
    // Sparse: 16 keys spread over the whole key space, four times (one
    // listing in four is handed on).
    let sparse: Vec<usize> = (0..16).map(|i| i * (KEYS / 16)).collect();
    for _ in 0..4 {
        mget(&mut conn, &sparse);
    }
    std::thread::sleep(Duration::from_millis(500));
    let after_sparse = info_field(&n, "recluster_bytes").expect("recluster_bytes");
    // At most a step (256 keys) from the first key, of about 520 bytes each.
    assert!(after_sparse <= 256 * 600, "{after_sparse} bytes rewritten");
    // Dense runs of 64 keys in order, across the store.
    let deadline = Instant::now() + Duration::from_secs(20);
    while info_field(&n, "recluster_bytes").unwrap_or(0) < after_sparse + 100_000 {
        for start in (0..KEYS - 64).step_by(64) {
            let run: Vec<usize> = (start..start + 64).collect();
            mget(&mut conn, &run);
        }
        assert!(
            Instant::now() < deadline,
            "ordered multi-gets were not reclustered"
        );
    }
    assert_eq!(read_all(&mut conn), expected());
}

#[test]
fn no_recluster_turns_the_background_work_off() {
    let n = Node::start(&["--no-recluster"]);
    let mut conn = BufReader::new(n.connect());
    write_scattered(&mut conn);
    for _ in 0..8 {
        assert_eq!(read_all(&mut conn), expected());
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(info_field(&n, "recluster_bytes"), Some(0));
    assert_eq!(info_field(&n, "recluster_ranges"), None);
    // RECLUSTER still works on demand.
    let all = recluster(&mut conn, &[]);
    assert!(field(&all, "rewritten") > 0, "{all:?}");
    assert_eq!(read_all(&mut conn), expected());
}
