//! The keytable cache: decoded keytable blocks kept in DRAM up to a byte
//! budget, evicted by CLOCK (second chance). With the default budget every
//! keytable fits, so a GET reads the device only for its value.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::keytable::Block;

const SHARDS: usize = 16;

type BlockKey = (u64, u32);

struct Shard {
    map: HashMap<BlockKey, (Arc<Block>, bool)>,
    clock: VecDeque<BlockKey>,
    bytes: usize,
}

/// A sharded CLOCK cache of keytable blocks.
pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    budget_per_shard: AtomicUsize,
    used: AtomicUsize,
}

impl BlockCache {
    /// A cache holding at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        BlockCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        clock: VecDeque::new(),
                        bytes: 0,
                    })
                })
                .collect(),
            budget_per_shard: AtomicUsize::new(budget / SHARDS),
            used: AtomicUsize::new(0),
        }
    }

    /// Changes the budget; the excess is evicted as blocks are inserted.
    pub fn set_budget(&self, budget: usize) {
        self.budget_per_shard
            .store(budget / SHARDS, Ordering::Relaxed);
    }

    fn shard(&self, k: BlockKey) -> &Mutex<Shard> {
        let h = (k.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(k.1)) as usize;
        &self.shards[h % SHARDS]
    }

    /// Looks a block up, marking it recently used.
    pub fn get(&self, kt: u64, block: u32) -> Option<Arc<Block>> {
        let mut s = self.shard((kt, block)).lock();
        let slot = s.map.get_mut(&(kt, block))?;
        slot.1 = true;
        Some(slot.0.clone())
    }

    /// Inserts a block, evicting others beyond the budget.
    pub fn insert(&self, kt: u64, block: u32, b: Arc<Block>) {
        let size = b.dram_bytes();
        let budget = self.budget_per_shard.load(Ordering::Relaxed);
        if size > budget {
            return;
        }
        let mut s = self.shard((kt, block)).lock();
        if let Some(old) = s.map.insert((kt, block), (b, false)) {
            s.bytes -= old.0.dram_bytes();
            self.used.fetch_sub(old.0.dram_bytes(), Ordering::Relaxed);
        } else {
            s.clock.push_back((kt, block));
        }
        s.bytes += size;
        self.used.fetch_add(size, Ordering::Relaxed);
        while s.bytes > budget {
            let Some(k) = s.clock.pop_front() else { break };
            match s.map.get_mut(&k) {
                Some(slot) if slot.1 => {
                    slot.1 = false;
                    s.clock.push_back(k);
                }
                Some(_) => {
                    if let Some((b, _)) = s.map.remove(&k) {
                        s.bytes -= b.dram_bytes();
                        self.used.fetch_sub(b.dram_bytes(), Ordering::Relaxed);
                    }
                }
                None => {}
            }
        }
    }

    /// Drops every block of keytable `kt` (which has `blocks` blocks).
    pub fn remove_keytable(&self, kt: u64, blocks: u32) {
        for i in 0..blocks {
            let mut s = self.shard((kt, i)).lock();
            if let Some((b, _)) = s.map.remove(&(kt, i)) {
                s.bytes -= b.dram_bytes();
                self.used.fetch_sub(b.dram_bytes(), Ordering::Relaxed);
            }
            // Stale clock slots are skipped on eviction; compact them away
            // once they dominate so the queue stays proportional to the map.
            if s.clock.len() > 2 * s.map.len() + 64 {
                let Shard { map, clock, .. } = &mut *s;
                clock.retain(|k| map.contains_key(k));
            }
        }
    }

    /// Bytes cached.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}
