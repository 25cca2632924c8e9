//! The shape of the sorted levels below the flushed runs: how many bytes
//! each level may hold before compaction moves its keytables down, and
//! when a new level starts.
//!
//! Levels are sized from the bottom up, as RocksDB's dynamic level sizes
//! are, and new levels start at the top, so the bottom level (nearly all
//! the data) is never moved wholesale:
//! - With `n` sorted levels whose bottom holds `B` bytes, the ratio between
//!   adjacent levels is `x = (B / base)^(1/n)` (at least 1), and level `i`
//!   (L1 = 1) may hold `base · x^i` bytes; the bottom has no limit.
//! - When `x` would exceed `max_ratio`, the next merge of the flushed runs
//!   writes them as a new L1 above the others instead of into L1.
//!
//! Why: with fixed targets (L1 = base, each level ten times the one above)
//! the level above the bottom filled up to ten times L1 before the bottom
//! grew, so every keytable moved into it rewrote about ten times its size,
//! and a small-value fill's keytable writes grew 3.7 and 2.7 times as the
//! keys doubled (10 → 20 → 40 M). Equal ratios between all levels, kept small, minimize the sum
//! of the per-level rewrite costs (`1 + ratio` each) for a given number of
//! levels; `bench/RESULTS.md` (session 20) has the measurements.

/// The limit on each sorted level's bytes, L1 first: `None` for the bottom
/// level (and for a lone level), which grows without a limit.
///
/// `sizes` are the levels' bytes, L1 first; `base` is the first level's
/// limit when the bottom is no larger than it.
pub(crate) fn targets(sizes: &[u64], base: u64) -> Vec<Option<u64>> {
    let n = sizes.len();
    if n == 0 {
        return Vec::new();
    }
    let x = ratio(sizes, base);
    let mut out: Vec<Option<u64>> = (1..n)
        .map(|i| Some((base as f64 * x.powi(i as i32)) as u64))
        .collect();
    out.push(None);
    debug_assert!(out.windows(2).all(|w| match (w[0], w[1]) {
        (Some(a), Some(b)) => a <= b,
        _ => true,
    }));
    out
}

/// Whether the next merge of the flushed runs should start a new L1 above
/// the current levels rather than merge into L1: the ratio between levels
/// is past `max_ratio`. Never when L1 is empty (the merge fills it).
pub(crate) fn wants_new_level(sizes: &[u64], base: u64, max_ratio: u64) -> bool {
    match sizes.first() {
        Some(&l1) if l1 > 0 => ratio(sizes, base) > max_ratio as f64,
        _ => false,
    }
}

/// `(bottom / base)^(1/n)`, at least 1.
fn ratio(sizes: &[u64], base: u64) -> f64 {
    let (Some(&bottom), n) = (sizes.last(), sizes.len()) else {
        return 1.0;
    };
    let scaled = bottom as f64 / base.max(1) as f64;
    scaled.powf(1.0 / n as f64).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_lone_level_has_no_limit() {
        assert_eq!(targets(&[5000 * MIB], 128 * MIB), vec![None]);
        assert!(targets(&[], 128 * MIB).is_empty());
    }

    #[test]
    fn levels_grow_by_one_ratio_from_base_to_the_bottom() {
        // Bottom 128 MiB · 9: two levels, ratio 3 → L1 may hold 384 MiB.
        let t = targets(&[10 * MIB, 9 * 128 * MIB], 128 * MIB);
        assert_eq!(t.len(), 2);
        let l1 = t[0].expect("L1 has a limit");
        assert!((383 * MIB..=385 * MIB).contains(&l1), "{l1}");
        assert_eq!(t[1], None);
        // Three levels, bottom base · 64: ratio 4 → 512 MiB, 2 GiB.
        let t = targets(&[MIB, MIB, 64 * 128 * MIB], 128 * MIB);
        let (a, b) = (t[0].expect("L1"), t[1].expect("L2"));
        assert!((511 * MIB..=513 * MIB).contains(&a), "{a}");
        assert!((2047 * MIB..=2049 * MIB).contains(&b), "{b}");
    }

    #[test]
    fn a_small_bottom_drains_the_levels_above_to_base() {
        // After deletes: the bottom is below base, upper levels hold more.
        let t = targets(&[900 * MIB, 800 * MIB, MIB], 128 * MIB);
        assert_eq!(t, vec![Some(128 * MIB), Some(128 * MIB), None]);
    }

    #[test]
    fn a_new_level_starts_past_the_largest_ratio() {
        let base = 128 * MIB;
        // One level: a second one starts once it holds over 4 · base.
        assert!(!wants_new_level(&[4 * base], base, 4));
        assert!(wants_new_level(&[4 * base + MIB], base, 4));
        // Two levels: once the bottom is over 16 · base.
        assert!(!wants_new_level(&[base, 16 * base], base, 4));
        assert!(wants_new_level(&[base, 17 * base], base, 4));
        // Never above an empty L1, nor without levels.
        assert!(!wants_new_level(&[0, 100 * base], base, 4));
        assert!(!wants_new_level(&[], base, 4));
    }
}
