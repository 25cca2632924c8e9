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
