//! Write versions: which of two writes of a key wins, on every replica.
//!
//! A version is `(microseconds since the Unix epoch) << 12 | client id`:
//! the time orders writes ("last writer wins", across machines as far as
//! their clocks agree), and the 12-bit client id, random per client,
//! keeps two clients writing one key in the same microsecond from
//! picking the same version. Within one client versions strictly
//! increase. Copies with equal versions are still ordered, by their
//! bytes ([`protocol::versioned::cmp_stored`]), so replicas converge even
//! then. The Java client (YCSB binding) computes the same numbers,
//! proven by `testdata/version-vectors.tsv`.
//!
//! Versions written before client ids existed (plain microseconds) are
//! all smaller than any version written now, so older data never wins.

/// Bits of a version that hold the client id.
pub const CLIENT_ID_BITS: u32 = 12;
/// Largest client id.
pub const MAX_CLIENT_ID: u16 = (1 << CLIENT_ID_BITS) - 1;

/// The version to write after `last` (this client's previous version, 0
/// for none) at time `now_micros`, for client `client_id` (at most
/// [`MAX_CLIENT_ID`]; larger ids are masked): the time with the id in the
/// low bits, or, if that would not exceed `last`, the next time step.
pub fn next_version(last: u64, now_micros: u64, client_id: u16) -> u64 {
    let id = u64::from(client_id & MAX_CLIENT_ID);
    let at = |micros: u64| micros.saturating_mul(1 << CLIENT_ID_BITS) | id;
    let now = at(now_micros);
    if now > last {
        now
    } else {
        at((last >> CLIENT_ID_BITS).saturating_add(1))
    }
}

/// A random client id (different for each client created, with high
/// probability), from the standard library's per-process random keys.
pub fn random_client_id() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() & u64::from(MAX_CLIENT_ID)) as u16
}

/// An id that no other call of this function returns, in this process or
/// another, with high probability: the time, the process id and a
/// per-process counter, hashed (for lease owners and volume ids).
pub fn unique_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let seed = [nanos, u64::from(std::process::id()), n];
    let bytes: Vec<u8> = seed.iter().flat_map(|x| x.to_le_bytes()).collect();
    xxhash_rust::xxh64::xxh64(&bytes, 0x004c_534c_4541_5345)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_differ_even_at_one_instant() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| unique_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    #[test]
    fn versions_carry_the_client_id_and_increase() {
        let t = 1_790_000_000_000_000u64; // 2026, in microseconds
        let v1 = next_version(0, t, 7);
        assert_eq!(v1, (t << 12) | 7);
        assert_eq!(v1 & 0xFFF, 7);
        // Same microsecond again, or a clock that went back: next step.
        let v2 = next_version(v1, t, 7);
        assert_eq!(v2, ((t + 1) << 12) | 7);
        assert_eq!(next_version(v2, t - 5, 7), ((t + 2) << 12) | 7);
        // Two clients in the same microsecond differ.
        assert_ne!(next_version(0, t, 1), next_version(0, t, 2));
        // Old plain-microsecond versions are all smaller.
        assert!(v1 > t);
        assert_eq!(next_version(0, t, 0x1FFF), (t << 12) | 0xFFF);
        assert_eq!(next_version(u64::MAX, t, 3), u64::MAX);
    }
}
