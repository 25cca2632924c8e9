//! SCAN cursors. Clients (redis-py) parse cursors as integers, but the key
//! space is ordered by arbitrary bytes, so the node keeps a bounded table
//! from cursor id to the key the next call starts at; the oldest entries are
//! evicted first. Cursor `0` starts and ends an iteration.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// Most cursors remembered at once.
pub const MAX_CURSORS: usize = 64 * 1024;

/// Bounded map of cursor id → next start key.
#[derive(Debug)]
pub struct CursorTable {
    cap: usize,
    next_id: u64,
    keys: HashMap<u64, Bytes>,
    order: VecDeque<u64>,
}

impl CursorTable {
    /// An empty table holding at most `cap` cursors.
    pub fn new(cap: usize) -> Self {
        CursorTable {
            cap: cap.max(1),
            next_id: 1,
            keys: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Remembers `start` and returns its new, nonzero cursor id.
    pub fn insert(&mut self, start: Bytes) -> u64 {
        while self.keys.len() >= self.cap {
            match self.order.pop_front() {
                Some(old) => {
                    self.keys.remove(&old);
                }
                None => break,
            }
        }
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        self.keys.insert(id, start);
        self.order.push_back(id);
        id
    }

    /// The start key of cursor `id`, if it is still known.
    pub fn get(&self, id: u64) -> Option<Bytes> {
        self.keys.get(&id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_evicts_oldest() {
        let mut t = CursorTable::new(2);
        let a = t.insert(Bytes::from_static(b"a"));
        let b = t.insert(Bytes::from_static(b"b"));
        let c = t.insert(Bytes::from_static(b"c"));
        assert_ne!(a, 0);
        assert!(t.get(a).is_none());
        assert_eq!(t.get(b).as_deref(), Some(&b"b"[..]));
        assert_eq!(t.get(c).as_deref(), Some(&b"c"[..]));
    }
}
