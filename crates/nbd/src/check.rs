//! `volume check`: every stored chunk against the volume records, what
//! `fs check --data` is to file systems. A chunk belongs to a volume
//! whose record exists and lies before that volume's end (a shrink deletes
//! the chunks past the new end before it records the new size). A chunk of
//! no volume is leaked: a delete cut short by a build that removed the
//! record first left it, and nothing else reclaims it; [`Repair::Leaked`]
//! deletes those. Two volumes sharing an id would share their chunks: a
//! problem.
//!
//! Safe while adapters serve volumes: they write chunks only of volumes
//! whose record exists, and a delete removes the record last.

use std::collections::HashMap;

use client::Store;

use crate::error::Result;
use crate::volume::{self, chunk_of, Volume};

/// Keys listed per request.
const PAGE: usize = 1000;
/// Most problems a report lists (the count is always exact).
const MAX_LISTED: usize = 100;

/// What [`check`] may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    /// Nothing: read only.
    Nothing,
    /// Delete leaked chunks.
    Leaked,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    /// Volume records.
    pub volumes: u64,
    /// Chunks stored.
    pub chunks: u64,
    /// Chunks of no volume.
    pub leaked: u64,
    /// Leaked chunks deleted ([`Repair::Leaked`]).
    pub repaired: u64,
    /// Problems, in words (at most [`MAX_LISTED`]).
    pub problems: Vec<String>,
    /// How many problems there were.
    pub problem_count: u64,
}

impl Report {
    fn problem(&mut self, what: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_LISTED {
            self.problems.push(what);
        }
    }

    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problem_count == 0
    }
}

/// Checks every chunk of every volume in `store` (keys only: one listing
/// of all chunks, each confirmed).
pub fn check(store: &dyn Store, repair: Repair) -> Result<Report> {
    let mut report = Report::default();
    let mut by_id: HashMap<u64, Volume> = HashMap::new();
    for v in volume::list(store)? {
        report.volumes += 1;
        if let Some(other) = by_id.insert(v.id, v.clone()) {
            report.problem(format!(
                "volumes {} and {} share the id {:016x}",
                other.name, v.name, v.id
            ));
        }
    }
    let (mut from, end) = volume::all_chunks();
    loop {
        let page = store.stored_keys(&from, &end, PAGE)?;
        let mut leaked: Vec<&[u8]> = Vec::new();
        for key in &page.keys {
            report.chunks += 1;
            let Some((id, index)) = chunk_of(key) else {
                report.problem(format!("unreadable chunk key {key:?}"));
                continue;
            };
            match by_id.get(&id) {
                Some(v) if index >= v.chunks() => report.problem(format!(
                    "chunk {index} of volume {} lies past its end ({} chunks)",
                    v.name,
                    v.chunks()
                )),
                Some(_) => {}
                None => {
                    report.leaked += 1;
                    leaked.push(key);
                }
            }
        }
        if repair == Repair::Leaked && !leaked.is_empty() {
            let ops: Vec<client::WriteOp<'_>> = leaked.iter().map(|k| (*k, None)).collect();
            store.write(&ops)?;
            report.repaired += ops.len() as u64;
        }
        let Some(last) = page.full_at else { break };
        from = last.to_vec();
        from.push(0);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{chunk_key, create, DEFAULT_CHUNK_SIZE};
    use client::MemStore;

    #[test]
    fn leaked_and_out_of_range_chunks_are_found_and_leaks_repaired() {
        let store = MemStore::new();
        let v = create(&store, "v", 64 << 10, DEFAULT_CHUNK_SIZE).expect("create");
        let w = create(&store, "w", 64 << 10, DEFAULT_CHUNK_SIZE).expect("create");
        for (id, index) in [(v.id, 0), (v.id, 15), (w.id, 3)] {
            store.put(&chunk_key(id, index), b"data").expect("put");
        }
        let r = check(&store, Repair::Nothing).expect("check");
        assert!(r.is_clean(), "{:?}", r.problems);
        assert_eq!((r.volumes, r.chunks, r.leaked), (2, 3, 0));
        store
            .put(&chunk_key(v.id, 16), b"past the end")
            .expect("put");
        store
            .put(&chunk_key(12345, 0), b"of no volume")
            .expect("put");
        store
            .put(&chunk_key(12345, 9), b"of no volume")
            .expect("put");
        let r = check(&store, Repair::Nothing).expect("check");
        assert_eq!(r.problem_count, 1, "{:?}", r.problems);
        assert!(r.problems[0].contains("past its end"), "{:?}", r.problems);
        assert_eq!(r.leaked, 2);
        let r = check(&store, Repair::Leaked).expect("repair");
        assert_eq!(r.repaired, 2);
        let r = check(&store, Repair::Nothing).expect("check");
        assert_eq!((r.chunks, r.leaked), (4, 0), "only the leaked chunks went");
    }
}
