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

use bytes::Bytes;
use client::Store;

use crate::error::Result;
use crate::volume::{self, chunk_of, Volume};

/// Keys listed per request.
const PAGE: usize = 1000;

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
    /// What is wrong.
    pub findings: client::findings::Findings,
}

/// Checks every chunk of every volume in `store` (keys only: one listing
/// of all chunks, each confirmed).
pub fn check(store: &dyn Store, repair: Repair) -> Result<Report> {
    let mut report = Report::default();
    let mut by_id: HashMap<u64, Volume> = HashMap::new();
    for v in volume::list(store)? {
        report.volumes += 1;
        if let Some(other) = by_id.insert(v.id, v.clone()) {
            report.findings.problem(format!(
                "volumes {} and {} share the id {:016x}",
                other.name, v.name, v.id
            ));
        }
    }
    let (start, end) = volume::all_chunks();
    let mut visit = |keys: &[Bytes]| {
        let mut leaked = Vec::new();
        for key in keys {
            report.chunks += 1;
            let Some((id, index)) = chunk_of(key) else {
                report
                    .findings
                    .problem(format!("unreadable chunk key {key:?}"));
                continue;
            };
            match by_id.get(&id) {
                Some(v) if index >= v.chunks() => report.findings.problem(format!(
                    "chunk {index} of volume {} lies past its end ({} chunks)",
                    v.name,
                    v.chunks()
                )),
                Some(_) => {}
                None => {
                    report.leaked += 1;
                    leaked.push(key.clone());
                }
            }
        }
        if repair == Repair::Leaked {
            leaked
        } else {
            Vec::new()
        }
    };
    let repaired = store.sweep(&start, &end, PAGE, &mut visit)?;
    report.repaired = repaired;
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
        assert!(r.findings.is_clean(), "{:?}", r.findings.problems);
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
        assert_eq!(r.findings.count, 1, "{:?}", r.findings.problems);
        assert!(
            r.findings.problems[0].contains("past its end"),
            "{:?}",
            r.findings.problems
        );
        assert_eq!(r.leaked, 2);
        let r = check(&store, Repair::Leaked).expect("repair");
        assert_eq!(r.repaired, 2);
        let r = check(&store, Repair::Nothing).expect("check");
        assert_eq!((r.chunks, r.leaked), (4, 0), "only the leaked chunks went");
    }
}
