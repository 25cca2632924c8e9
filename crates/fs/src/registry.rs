//! The cluster's file systems: `lightstore fs create|list|info|delete`.
//! Each has a record under the `{lightstore:fs}` hash tag (listing them is
//! one range read) in the text form `name=value` per line: `id` (16 hex
//! digits, random at creation; its keys are in `layout.rs`), `chunk_size`
//! (bytes per data chunk) and `created` (Unix seconds).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use client::Store;

use crate::error::{FsError, Result};
use crate::filesystem::for_each_page;
use crate::inode::{Inode, Kind, ROOT};
use crate::layout::Keys;
use crate::lease;

const PREFIX: &[u8] = b"{lightstore:fs}/";
/// Default bytes per data chunk (see docs/file.md for the trade-off).
pub const DEFAULT_CHUNK_SIZE: u32 = 8 << 10;
const MIN_CHUNK: u32 = 4096;
const MAX_CHUNK: u32 = 4 << 20;

/// A file system's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsRecord {
    pub name: String,
    pub id: u64,
    pub chunk_size: u32,
    pub created: u64,
}

fn record_key(name: &str) -> Vec<u8> {
    [PREFIX, name.as_bytes()].concat()
}

fn check_name(name: &str) -> Result<()> {
    client::records::check_name("file system name", name).map_err(FsError::Refused)
}

impl FsRecord {
    fn encode(&self) -> String {
        format!(
            "id={:016x}\nchunk_size={}\ncreated={}\n",
            self.id, self.chunk_size, self.created
        )
    }

    fn decode(name: &str, text: &[u8]) -> Result<FsRecord> {
        let bad = || FsError::Corrupt(format!("file system {name}: unreadable record"));
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let field = |f: &str| client::records::field(text, f).ok_or_else(bad);
        let rec = FsRecord {
            name: name.to_string(),
            id: u64::from_str_radix(field("id")?, 16).map_err(|_| bad())?,
            chunk_size: field("chunk_size")?.parse().map_err(|_| bad())?,
            created: field("created")?.parse().map_err(|_| bad())?,
        };
        if !rec.chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&rec.chunk_size) {
            return Err(bad());
        }
        Ok(rec)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Creates file system `name` with an empty root directory (mode 0755,
/// owned by root). Fails if it exists.
pub fn create(store: &dyn Store, name: &str, chunk_size: u32) -> Result<FsRecord> {
    check_name(name)?;
    if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
        return Err(FsError::Refused(format!(
            "chunk size {chunk_size}: must be a power of two from {MIN_CHUNK} to {MAX_CHUNK}"
        )));
    }
    let seen = store.get_versioned(&record_key(name))?;
    if seen.value.is_some() {
        return Err(FsError::Refused(format!("file system {name} exists")));
    }
    let rec = FsRecord {
        name: name.to_string(),
        id: rand::random(),
        chunk_size,
        created: unix_now(),
    };
    let keys = Keys::new(rec.id);
    let mut root = Inode::new(ROOT, Kind::Dir, 0o755, 0, 0);
    root.parent = ROOT;
    // The root first: the record is what makes the file system exist.
    store.write_atomic(&[(&keys.inode(ROOT), Some(&root.encode()))])?;
    // Only if no one created the name since we looked (compare-and-set):
    // of two creates at one moment, one fails instead of both succeeding
    // and the later record hiding the other's file system.
    if store
        .write_if_version(
            &record_key(name),
            seen.version,
            Some(rec.encode().as_bytes()),
        )?
        .is_none()
    {
        return Err(FsError::Refused(format!(
            "file system {name} was created elsewhere at the same moment"
        )));
    }
    // Durable before it is reported made, whatever the nodes' durability:
    // a node that crashed just after would otherwise forget it.
    store.sync()?;
    Ok(rec)
}

/// The record of `name`, if it exists.
pub fn open(store: &dyn Store, name: &str) -> Result<Option<FsRecord>> {
    check_name(name)?;
    match store.get(&record_key(name))? {
        Some(v) => Ok(Some(FsRecord::decode(name, &v)?)),
        None => Ok(None),
    }
}

/// Every file system, by name.
pub fn list(store: &dyn Store) -> Result<Vec<FsRecord>> {
    let mut end = PREFIX.to_vec();
    *end.last_mut().unwrap_or(&mut 0) += 1;
    store
        .range(PREFIX, &end, 100_000)?
        .into_iter()
        .map(|(k, v)| FsRecord::decode(&String::from_utf8_lossy(&k[PREFIX.len()..]), &v))
        .collect()
}

/// Deletes file system `name` and everything in it. Refused while a mount
/// holds its lease, unless `force`. The record goes last, so a delete cut
/// short can be run again.
pub fn delete(store: Arc<dyn Store>, name: &str, force: bool) -> Result<()> {
    let Some(rec) = open(&*store, name)? else {
        return Err(FsError::Refused(format!("no file system named {name}")));
    };
    let keys = Keys::new(rec.id);
    if !force {
        if let Some(holder) = lease::live_holder(&*store, &keys)? {
            return Err(FsError::Refused(format!(
                "file system {name} is mounted ({holder}); unmount it first or give --force"
            )));
        }
    }
    for (start, end) in [keys.all_data(), keys.all_meta()] {
        for_each_page(
            &start,
            |from, n| store.range_keys(from, &end, n),
            |k| k,
            |page| {
                let ops: Vec<(&[u8], Option<&[u8]>)> =
                    page.iter().map(|k| (&k[..], None)).collect();
                Ok(store.write(&ops)?)
            },
        )?;
    }
    store.delete(&record_key(name))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::MemStore;

    #[test]
    fn of_simultaneous_creates_of_one_name_one_succeeds() {
        for _ in 0..20 {
            let store = MemStore::new();
            let made: Vec<Result<FsRecord>> =
                client::testing::simultaneously(4, |_| create(&store, "f", DEFAULT_CHUNK_SIZE));
            let won: Vec<u64> = made.iter().flatten().map(|r| r.id).collect();
            assert_eq!(won.len(), 1, "{made:?}");
            let kept = open(&store, "f").expect("open").expect("created");
            assert_eq!(kept.id, won[0], "the record is the winner's");
        }
    }
}
