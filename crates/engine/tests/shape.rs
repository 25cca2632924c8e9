//! The shape of the levels as the data grows: levels are sized from the
//! bottom up and new ones start on top (`shape.rs`), so the bottom level
//! holds most of the keytable bytes at every size; and whatever the shape,
//! every key reads back, also after a power cut.

mod common;

use common::*;
use engine::flash::LossMode;

/// Keys written per round, in a scattered order.
const PER_ROUND: u32 = 400;
const ROUNDS: u32 = 12;

fn key_of(i: u32) -> u32 {
    // A bijection on 0..PER_ROUND * ROUNDS that scatters neighbours.
    (i * 7919) % (PER_ROUND * ROUNDS)
}

#[test]
fn the_bottom_level_holds_most_keys_as_the_data_grows() {
    let opts = small_opts();
    let dev = nand(64, LossMode::AllUnsynced);
    let mut db = open(&dev, &opts);
    let mut most_levels = 0;
    for round in 0..ROUNDS {
        for i in round * PER_ROUND..(round + 1) * PER_ROUND {
            let k = key_of(i);
            db.put(&key(k), &value_for(k, 1, 100)).expect("put");
            if i % 25 == 24 {
                // A flush (and whatever compaction is due) per small batch.
                db.maintenance().expect("maintenance");
            }
        }
        let s = db.stats();
        let sorted: Vec<u64> = s.bytes_per_level[s.flushed_runs..].to_vec();
        most_levels = most_levels.max(sorted.len());
        let total: u64 = sorted.iter().sum();
        if sorted.len() > 1 {
            let bottom = *sorted.last().unwrap_or(&0);
            assert!(
                2 * bottom >= total,
                "round {round}: the bottom holds under half the bytes: {sorted:?}"
            );
        }
        if round % 4 == 3 {
            db.sync().expect("sync");
            crash(&dev, db, u64::from(round));
            db = open(&dev, &opts);
        }
        for i in 0..(round + 1) * PER_ROUND {
            let k = key_of(i);
            assert_eq!(
                db.get(&key(k)).expect("get").map(|v| v.to_vec()),
                Some(value_for(k, 1, 100)),
                "key {k} after round {round}"
            );
        }
    }
    assert!(
        most_levels >= 3,
        "the data grew through several levels (at most {most_levels})"
    );
}
