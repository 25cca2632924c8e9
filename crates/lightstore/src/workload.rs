//! The paper's workloads (Table 3) and the key encoding they use.

use bytes::Bytes;
use clap::ValueEnum;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A workload of the LightStore paper (Table 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Set keys 0..num in order.
    SSet,
    /// Get keys 0..num in order.
    SGet,
    /// Set num random keys (overwrites possible).
    RSet,
    /// Get num random keys.
    RGet,
    /// num random operations, 9 gets : 1 set.
    RMixed,
}

impl Workload {
    /// True if the workload reads a pre-filled key space.
    pub fn reads(self) -> bool {
        matches!(self, Workload::SGet | Workload::RGet | Workload::RMixed)
    }
}

/// One operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Get key index.
    Get(u64),
    /// Set key index.
    Set(u64),
}

/// Generates the operations of one thread: thread `t` of `threads` does the
/// `t`-th share of `num` operations.
pub struct OpStream {
    workload: Workload,
    next: u64,
    end: u64,
    num: u64,
    rng: SmallRng,
}

impl OpStream {
    /// The stream for thread `t`: its share of `ops` operations on `num` keys.
    pub fn new(workload: Workload, num: u64, ops: u64, threads: u64, t: u64, seed: u64) -> Self {
        let per = ops / threads;
        let start = per * t;
        let end = if t + 1 == threads { ops } else { start + per };
        OpStream {
            workload,
            next: start,
            end,
            num,
            rng: SmallRng::seed_from_u64(seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }
}

impl Iterator for OpStream {
    type Item = Op;
    fn next(&mut self) -> Option<Op> {
        if self.next >= self.end {
            return None;
        }
        let i = self.next % self.num;
        self.next += 1;
        let random = self.rng.gen_range(0..self.num);
        Some(match self.workload {
            Workload::SSet => Op::Set(i),
            Workload::SGet => Op::Get(i),
            Workload::RSet => Op::Set(random),
            Workload::RGet => Op::Get(random),
            Workload::RMixed => {
                if self.rng.gen_range(0..10) == 0 {
                    Op::Set(random)
                } else {
                    Op::Get(random)
                }
            }
        })
    }
}

/// Writes key `i` (< 10^19) as exactly `size` bytes: "k" then 19
/// zero-padded decimal digits (so keys sort in index order), padded with
/// '.' or cut from the left to `size`.
pub fn encode_key(i: u64, size: usize, out: &mut Vec<u8>) {
    // "k" + 19 zero-padded digits, written by hand (this runs once per op).
    let mut digits = [b'0'; 20];
    digits[0] = b'k';
    let mut n = i;
    for d in digits[1..].iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.clear();
    if size >= digits.len() {
        out.extend_from_slice(&digits);
        out.resize(size, b'.');
    } else {
        out.extend_from_slice(&digits[digits.len() - size..]);
    }
}

/// Incompressible value bytes: a random buffer that values are sliced from
/// at varying offsets (as db_bench does), so generating a value costs nothing.
pub struct Values {
    buf: Bytes,
    size: usize,
}

impl Values {
    /// A source of `size`-byte values.
    pub fn new(size: usize, seed: u64) -> Values {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut buf = vec![0u8; (1 << 20) + size];
        rng.fill(&mut buf[..]);
        Values {
            buf: Bytes::from(buf),
            size,
        }
    }

    /// The value for key `i`, write `version`.
    pub fn get(&self, i: u64, version: u64) -> &[u8] {
        let at = self.offset(i, version);
        &self.buf[at..at + self.size]
    }

    /// The same value as [`Values::get`], shared without a copy.
    pub fn get_bytes(&self, i: u64, version: u64) -> Bytes {
        let at = self.offset(i, version);
        self.buf.slice(at..at + self.size)
    }

    fn offset(&self, i: u64, version: u64) -> usize {
        let span = (self.buf.len() - self.size) as u64;
        (i.wrapping_mul(7919)
            .wrapping_add(version.wrapping_mul(104_729))
            % span) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_k_and_nineteen_digits() {
        let mut k = Vec::new();
        encode_key(1234567, 32, &mut k);
        assert_eq!(&k[..20], b"k0000000000001234567");
        assert!(k[20..].iter().all(|&c| c == b'.'));
    }

    #[test]
    fn keys_sort_in_index_order_and_have_the_size() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        encode_key(9, 32, &mut a);
        encode_key(10, 32, &mut b);
        assert_eq!(a.len(), 32);
        assert!(a < b);
        encode_key(123, 8, &mut a);
        assert_eq!(a.len(), 8);
    }

    #[test]
    fn streams_split_the_work() {
        let total: usize = (0..3)
            .map(|t| OpStream::new(Workload::SSet, 100, 100, 3, t, 1).count())
            .sum();
        assert_eq!(total, 100);
        let mixed: Vec<Op> = OpStream::new(Workload::RMixed, 10_000, 10_000, 1, 0, 1).collect();
        let sets = mixed.iter().filter(|o| matches!(o, Op::Set(_))).count();
        assert!((800..1200).contains(&sets), "about 10% sets: {sets}");
    }
}
