//! Key placement: consistent hashing with virtual nodes.
//!
//! The scheme, exactly (the YCSB binding reimplements it and both are held to
//! the shared vectors in `testdata/ring-vectors.tsv`):
//!
//! 1. Every node has an id, by default its address as written in the
//!    cluster's node list (`"127.0.0.1:7400"`).
//! 2. Each node puts [`VNODES`] points on a ring of `u64`: point `i` (from 0)
//!    is `xxh64(id + "#" + i, seed 0)` with `i` in decimal, over the UTF-8
//!    bytes (`"127.0.0.1:7400#0"`, `"127.0.0.1:7400#1"`, ...).
//! 3. Points are sorted by value, ties broken by the node id's bytes.
//! 4. A key's placement part ([`placement`]) is hashed with
//!    `xxh64(part, seed 0)`. Its replicas are found by starting at the first
//!    point whose value is `>=` the hash (wrapping to the first point) and
//!    walking the ring, taking each node not taken yet, until `replicas`
//!    nodes (or all nodes) are taken. The first is the primary.

use xxhash_rust::xxh64::xxh64;

/// Points per node on the ring.
pub const VNODES: u32 = 160;

/// The part of `key` that decides its placement, as in Redis Cluster: if
/// the key has a `{` followed later by a `}` with at least one byte between
/// them, the bytes between the first `{` and the first `}` after it;
/// otherwise the whole key.
pub fn placement(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The ring position of `key`.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh64(placement(key), 0)
}

/// A consistent-hash ring over node indexes `0..ids.len()`.
#[derive(Clone, Debug)]
pub struct Ring {
    /// (point, node index), sorted by point then node id.
    points: Vec<(u64, usize)>,
    nodes: usize,
}

impl Ring {
    /// Builds the ring of the nodes with these ids (distinct).
    pub fn new<S: AsRef<str>>(ids: &[S]) -> Ring {
        let mut points = Vec::with_capacity(ids.len() * VNODES as usize);
        for (n, id) in ids.iter().enumerate() {
            for i in 0..VNODES {
                let label = format!("{}#{i}", id.as_ref());
                points.push((xxh64(label.as_bytes(), 0), n));
            }
        }
        points.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| ids[a.1].as_ref().cmp(ids[b.1].as_ref()))
        });
        Ring {
            points,
            nodes: ids.len(),
        }
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The `replicas` distinct nodes (fewer if the ring has fewer) that hold
    /// `key`, primary first.
    pub fn replicas(&self, key: &[u8], replicas: usize) -> Vec<usize> {
        self.replicas_of_hash(key_hash(key), replicas)
    }

    /// [`Ring::replicas`] for a precomputed [`key_hash`].
    pub fn replicas_of_hash(&self, hash: u64, replicas: usize) -> Vec<usize> {
        let want = replicas.min(self.nodes);
        let mut out = Vec::with_capacity(want);
        if want == 0 {
            return out;
        }
        let start = self.points.partition_point(|p| p.0 < hash);
        for k in 0..self.points.len() {
            let node = self.points[(start + k) % self.points.len()].1;
            if !out.contains(&node) {
                out.push(node);
                if out.len() == want {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_follow_redis_cluster() {
        assert_eq!(placement(b"user1000"), b"user1000");
        assert_eq!(placement(b"{user1000}.following"), b"user1000");
        assert_eq!(placement(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(placement(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(placement(b"foo{bar}{zap}"), b"bar");
        assert_eq!(placement(b"{"), b"{");
        assert_eq!(placement(b"a}b{c"), b"a}b{c");
    }

    #[test]
    fn xxh64_is_the_reference_function() {
        // Reference values of XXH64 with seed 0.
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
    }

    #[test]
    fn replicas_are_distinct_and_balanced() {
        let ids: Vec<String> = (0..4).map(|i| format!("10.0.0.{i}:7379")).collect();
        let ring = Ring::new(&ids);
        let mut primaries = [0usize; 4];
        for k in 0..40_000u32 {
            let r = ring.replicas(&k.to_be_bytes(), 3);
            assert_eq!(r.len(), 3);
            assert!(r[0] != r[1] && r[1] != r[2] && r[0] != r[2]);
            primaries[r[0]] += 1;
        }
        for p in primaries {
            assert!((7_000..13_000).contains(&p), "{primaries:?}");
        }
        assert_eq!(ring.replicas(b"k", 9).len(), 4);
        assert!(Ring::new::<&str>(&[]).replicas(b"k", 2).is_empty());
    }

    #[test]
    fn adding_a_node_moves_only_its_share() {
        let three: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
        let mut four = three.clone();
        four.push("n3".into());
        let (a, b) = (Ring::new(&three), Ring::new(&four));
        let moved = (0..20_000u32)
            .filter(|k| a.replicas(&k.to_le_bytes(), 1) != b.replicas(&k.to_le_bytes(), 1))
            .count();
        // Ideally a quarter of the keys move, all to the new node.
        assert!((3_500..6_500).contains(&moved), "{moved}");
    }
}
