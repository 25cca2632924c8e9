//! Bloom filters over user keys, one per keytable, so a GET skips keytables
//! that cannot hold its key without touching their blocks.

use xxhash_rust::xxh3::xxh3_64;

/// A Bloom filter with `k` probes by double hashing of one 64-bit hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloom {
    bits: Vec<u8>,
    k: u8,
}

impl Bloom {
    /// Builds a filter for the given key hashes at `bits_per_key`.
    pub fn build(hashes: &[u64], bits_per_key: usize) -> Bloom {
        let nbits = (hashes.len() * bits_per_key).max(64);
        let nbytes = nbits.div_ceil(8);
        let nbits = nbytes * 8;
        // k = ln2 * bits/key, clamped to [1, 30].
        let k = ((bits_per_key as f64) * 0.69).round().clamp(1.0, 30.0) as u8;
        let mut bits = vec![0u8; nbytes];
        for &h in hashes {
            let (mut x, delta) = (h as u32, (h >> 32) as u32 | 1);
            for _ in 0..k {
                let bit = x as usize % nbits;
                bits[bit / 8] |= 1 << (bit % 8);
                x = x.wrapping_add(delta);
            }
        }
        Bloom { bits, k }
    }

    /// Hash of a key as the filter uses it.
    pub fn hash(key: &[u8]) -> u64 {
        xxh3_64(key)
    }

    /// False means the key is certainly absent.
    pub fn may_contain(&self, hash: u64) -> bool {
        let nbits = self.bits.len() * 8;
        if nbits == 0 {
            return true;
        }
        let (mut x, delta) = (hash as u32, (hash >> 32) as u32 | 1);
        for _ in 0..self.k {
            let bit = x as usize % nbits;
            if self.bits[bit / 8] & (1 << (bit % 8)) == 0 {
                return false;
            }
            x = x.wrapping_add(delta);
        }
        true
    }

    /// DRAM used.
    pub fn bytes(&self) -> usize {
        self.bits.len()
    }

    /// Serialized form: k, then the bit array.
    pub fn encode_to(&self, out: &mut Vec<u8>) {
        out.push(self.k);
        out.extend_from_slice(&(self.bits.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.bits);
    }

    /// Parses [`Bloom::encode_to`] output; returns the filter and bytes consumed.
    pub fn decode(b: &[u8]) -> Option<(Bloom, usize)> {
        let k = *b.first()?;
        let len = u32::from_le_bytes(b.get(1..5)?.try_into().ok()?) as usize;
        let bits = b.get(5..5 + len)?.to_vec();
        Some((Bloom { bits, k }, 5 + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let keys: Vec<Vec<u8>> = (0..10_000u32).map(|i| i.to_be_bytes().to_vec()).collect();
        let hashes: Vec<u64> = keys.iter().map(|k| Bloom::hash(k)).collect();
        let f = Bloom::build(&hashes, 10);
        assert!(hashes.iter().all(|&h| f.may_contain(h)));
        let fp = (10_000..20_000u32)
            .filter(|i| f.may_contain(Bloom::hash(&i.to_be_bytes())))
            .count();
        assert!(fp < 300, "false positive rate too high: {fp}/10000");
        let mut enc = Vec::new();
        f.encode_to(&mut enc);
        let (g, used) = Bloom::decode(&enc).expect("decodes");
        assert_eq!(used, enc.len());
        assert_eq!(f, g);
    }
}
