//! The shared ring test vectors (`testdata/ring-vectors.tsv`): key placement
//! that every implementation of the ring (this crate, the YCSB binding in
//! Java) must reproduce byte for byte. `LIGHTSTORE_WRITE_VECTORS=1 cargo
//! test -p client --test vectors` rewrites the file from this crate; the
//! committed file is the contract.

use std::fmt::Write as _;
use std::path::PathBuf;

use client::ring::{key_hash, Ring};

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/ring-vectors.tsv")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The clusters and keys the vectors cover.
fn generate() -> String {
    let clusters: [(&[&str], usize); 4] = [
        (&["127.0.0.1:7401"], 1),
        (&["127.0.0.1:7401", "127.0.0.1:7402"], 2),
        (&["127.0.0.1:7401", "127.0.0.1:7402", "127.0.0.1:7403"], 2),
        (
            &[
                "10.0.0.1:7379",
                "10.0.0.2:7379",
                "10.0.0.3:7379",
                "10.0.0.4:7379",
                "node-5.example:7379",
            ],
            3,
        ),
    ];
    let mut keys: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"a".to_vec(),
        b"hello".to_vec(),
        b"{user1000}.following".to_vec(),
        b"{user1000}.followers".to_vec(),
        b"foo{}{bar}".to_vec(),
        b"foo{{bar}}zap".to_vec(),
        b"foo{bar}{zap}".to_vec(),
        b"{user0000000000000000000000000042}\x00field0".to_vec(),
        b"\x00\x01\x02\xff\xfe".to_vec(),
        "ключ-κλειδί-鍵".as_bytes().to_vec(),
    ];
    for i in 0..40u64 {
        keys.push(
            format!(
                "user{:028}",
                i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 10_000_000_000_000_000_000
            )
            .into_bytes(),
        );
        keys.push(format!("key:{i}").into_bytes());
    }
    let mut out = String::from(
        "# LightStore ring test vectors (see crates/client/src/ring.rs for the scheme).\n\
         # cluster <replicas> <node,node,...>   starts a cluster\n\
         # <key hex> <xxh64 of placement part, 16 hex digits> <replica node indexes, primary first>\n",
    );
    for (nodes, replicas) in clusters {
        let ring = Ring::new(nodes);
        let _ = writeln!(out, "cluster\t{replicas}\t{}", nodes.join(","));
        for k in &keys {
            let r: Vec<String> = ring
                .replicas(k, replicas)
                .iter()
                .map(|i| i.to_string())
                .collect();
            let _ = writeln!(out, "{}\t{:016x}\t{}", hex(k), key_hash(k), r.join(","));
        }
    }
    out
}

#[test]
fn ring_matches_the_shared_vectors() {
    if std::env::var_os("LIGHTSTORE_WRITE_VECTORS").is_some() {
        std::fs::write(path(), generate()).expect("write vectors");
    }
    let text = std::fs::read_to_string(path()).expect("testdata/ring-vectors.tsv");
    let mut ring = None;
    let mut replicas = 0;
    let mut checked = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        if f[0] == "cluster" {
            replicas = f[1].parse().expect("replicas");
            let nodes: Vec<&str> = f[2].split(',').collect();
            ring = Some(Ring::new(&nodes));
            continue;
        }
        let key = unhex(f[0]);
        assert_eq!(format!("{:016x}", key_hash(&key)), f[1], "hash of {}", f[0]);
        let want: Vec<usize> = f[2].split(',').map(|i| i.parse().expect("index")).collect();
        let got = ring
            .as_ref()
            .expect("cluster line first")
            .replicas(&key, replicas);
        assert_eq!(got, want, "replicas of {}", f[0]);
        checked += 1;
    }
    assert!(checked >= 300, "only {checked} vectors");
    assert_eq!(text, generate(), "vectors file is stale: regenerate it");
}

// ---- Write versions and the order of stored copies ----

fn version_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/version-vectors.tsv")
}

/// The version and order cases both clients must agree on.
fn generate_versions() -> String {
    use client::version::next_version;
    use protocol::versioned::{cmp_stored, encode_tombstone, encode_value};
    let mut out = String::from(
        "# LightStore write-version test vectors (see crates/client/src/version.rs).\n\
         # next <last> <now micros> <client id> <version to write>   (unsigned decimal)\n\
         # order <stored copy a, hex> <stored copy b, hex> <-1|0|1: a compared with b>\n",
    );
    let t = 1_790_000_000_123_456u64;
    let cases: [(u64, u64, u16); 9] = [
        (0, t, 0),
        (0, t, 7),
        (0, t, 4095),
        (0, t, 4096 + 5),
        ((t << 12) | 7, t, 7),
        ((t << 12) | 9, t, 7),
        (((t + 3) << 12) | 7, t, 7),
        (t, t, 1),
        (u64::MAX, t, 2),
    ];
    for (last, now, id) in cases {
        let _ = writeln!(
            out,
            "next\t{last}\t{now}\t{id}\t{}",
            next_version(last, now, id)
        );
    }
    let copies = [
        encode_value(5, b"a"),
        encode_value(5, b"b"),
        encode_value(5, b""),
        encode_value(6, b""),
        encode_tombstone(5),
        encode_tombstone(6),
        bytes::Bytes::from_static(b"plain value"),
        encode_value(u64::MAX, b"\xff"),
    ];
    for a in &copies {
        for b in &copies {
            let c = cmp_stored(a, b) as i8;
            let _ = writeln!(out, "order\t{}\t{}\t{c}", hex(a), hex(b));
        }
    }
    out
}

#[test]
fn versions_match_the_shared_vectors() {
    use client::version::next_version;
    use protocol::versioned::cmp_stored;
    if std::env::var_os("LIGHTSTORE_WRITE_VECTORS").is_some() {
        std::fs::write(version_path(), generate_versions()).expect("write vectors");
    }
    let text = std::fs::read_to_string(version_path()).expect("testdata/version-vectors.tsv");
    let mut checked = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        match f[0] {
            "next" => {
                let n = |i: usize| f[i].parse::<u64>().expect("number");
                let id = u16::try_from(n(3)).expect("id");
                assert_eq!(next_version(n(1), n(2), id), n(4), "{line}");
            }
            "order" => {
                let want: i8 = f[3].parse().expect("-1|0|1");
                assert_eq!(cmp_stored(&unhex(f[1]), &unhex(f[2])) as i8, want, "{line}");
            }
            other => panic!("unknown vector kind {other:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 70, "only {checked} vectors");
    assert_eq!(
        text,
        generate_versions(),
        "vectors file is stale: regenerate it"
    );
}
