//! Volumes: named, sized block devices stored in the cluster. A volume's
//! metadata is one key under the `{lightstore:volumes}` hash tag (so every
//! volume's record lives on one replica set and listing them is one range
//! read); its data is chunks keyed by `blk/`, the volume id and the chunk
//! index, both big-endian, so a volume's chunks sort together and in order
//! while the hash spreads them over the nodes.
//!
//! The record is text, one `name=value` per line: `id` (16 hex digits,
//! random at creation), `size` and `chunk_size` (bytes), `created` (Unix
//! seconds). Any adapter instance can open a volume by name.

use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use client::lease::{Lease, LeaseError};
use client::Store;

use crate::error::{NbdError, Result};

/// Prefix of every volume record.
const META_PREFIX: &[u8] = b"{lightstore:volumes}/";
/// Prefix of every serving lease: under the records' hash tag, outside
/// their listing (`#` sorts before `/`).
const LEASE_PREFIX: &[u8] = b"{lightstore:volumes}#lease/";
/// Prefix of every chunk key.
const CHUNK_PREFIX: &[u8] = b"blk/";
/// Default chunk size: the block size of the file systems and databases
/// put on a volume, so their writes never read-modify-write (see
/// `docs/block.md` for the measured trade-off).
pub const DEFAULT_CHUNK_SIZE: u32 = 4 << 10;
/// Smallest and largest chunk sizes.
const MIN_CHUNK: u32 = 4096;
const MAX_CHUNK: u32 = 4 << 20;

/// A volume's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Its name (the NBD export name).
    pub name: String,
    /// Random id in its chunk keys.
    pub id: u64,
    /// Size in bytes (a multiple of 512).
    pub size: u64,
    /// Bytes per chunk (a power of two).
    pub chunk_size: u32,
    /// Creation time, Unix seconds.
    pub created: u64,
}

fn meta_key(name: &str) -> Vec<u8> {
    [META_PREFIX, name.as_bytes()].concat()
}

/// The key of the lease of the adapter serving volume `id` (see
/// [`client::lease`]): one adapter serves a volume at a time, since its
/// partial-chunk writes take per-process locks.
pub fn lease_key(id: u64) -> Vec<u8> {
    [LEASE_PREFIX, format!("{id:016x}").as_bytes()].concat()
}

/// Holds volume `vol`'s serving lease while the volume itself changes
/// (deleted, shrunk), so that no adapter starts serving it meanwhile;
/// refused while an adapter serves it, unless `force`.
fn hold_for_change(store: &Arc<dyn Store>, vol: &Volume, force: bool) -> Result<Lease> {
    let holder = format!("lightstore volume, pid {}", std::process::id());
    let what = format!("volume {}", vol.name);
    Lease::acquire(store.clone(), lease_key(vol.id), &holder, &what, force).map_err(|e| match e {
        LeaseError::Held(h) => NbdError::Held(format!(
            "volume {} is being served ({h}); stop that adapter first, or give --force",
            vol.name
        )),
        LeaseError::Client(c) => c.into(),
        LeaseError::Thread(e) => NbdError::Io(e),
    })
}

/// The key of chunk `index` of volume `id`.
pub fn chunk_key(id: u64, index: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(CHUNK_PREFIX.len() + 16);
    k.extend_from_slice(CHUNK_PREFIX);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// The index of the chunk of volume `id` that `key` names, if it names one.
pub fn chunk_index(id: u64, key: &[u8]) -> Option<u64> {
    chunk_of(key)
        .filter(|&(of, _)| of == id)
        .map(|(_, index)| index)
}

/// `(volume id, chunk index)` of a chunk key.
pub fn chunk_of(key: &[u8]) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(CHUNK_PREFIX)?;
    if rest.len() != 16 {
        return None;
    }
    let (id, index) = rest.split_at(8);
    Some((
        u64::from_be_bytes(id.try_into().ok()?),
        u64::from_be_bytes(index.try_into().ok()?),
    ))
}

/// `[start, end)` of every chunk key of every volume.
pub fn all_chunks() -> (Vec<u8>, Vec<u8>) {
    let mut end = CHUNK_PREFIX.to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    (CHUNK_PREFIX.to_vec(), end)
}

fn check_name(name: &str) -> Result<()> {
    client::records::check_name("volume name", name).map_err(NbdError::BadVolume)
}

fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(NbdError::BadVolume(format!(
            "volume size {size}: must be a positive multiple of 512 bytes"
        )));
    }
    Ok(())
}

fn check_chunk(chunk_size: u32) -> Result<()> {
    if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
        return Err(NbdError::BadVolume(format!(
            "chunk size {chunk_size}: must be a power of two from {MIN_CHUNK} to {MAX_CHUNK}"
        )));
    }
    Ok(())
}

impl Volume {
    fn encode(&self) -> String {
        format!(
            "id={:016x}\nsize={}\nchunk_size={}\ncreated={}\n",
            self.id, self.size, self.chunk_size, self.created
        )
    }

    fn decode(name: &str, text: &[u8]) -> Result<Volume> {
        let bad = || NbdError::BadVolume(format!("volume {name}: unreadable record"));
        let text = std::str::from_utf8(text).map_err(|_| bad())?;
        let field = |f: &str| client::records::field(text, f).ok_or_else(bad);
        let vol = Volume {
            name: name.to_string(),
            id: u64::from_str_radix(field("id")?, 16).map_err(|_| bad())?,
            size: field("size")?.parse().map_err(|_| bad())?,
            chunk_size: field("chunk_size")?.parse().map_err(|_| bad())?,
            created: field("created")?.parse().map_err(|_| bad())?,
        };
        check_chunk(vol.chunk_size).map_err(|_| bad())?;
        check_size(vol.size).map_err(|_| bad())?;
        Ok(vol)
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.size.div_ceil(u64::from(self.chunk_size))
    }
}

/// Creates volume `name` of `size` bytes. Fails if it exists, also when
/// another adapter creates it at the same moment (the record is written
/// by compare-and-set).
pub fn create(store: &dyn Store, name: &str, size: u64, chunk_size: u32) -> Result<Volume> {
    check_name(name)?;
    check_size(size)?;
    check_chunk(chunk_size)?;
    let seen = store.get_versioned(&meta_key(name))?;
    if seen.value.is_some() {
        return Err(NbdError::BadVolume(format!("volume {name} exists")));
    }
    let vol = Volume {
        name: name.to_string(),
        id: client::version::unique_id(),
        size,
        chunk_size,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    if store
        .write_if_version(&meta_key(name), seen.version, Some(vol.encode().as_bytes()))?
        .is_none()
    {
        return Err(NbdError::BadVolume(format!(
            "volume {name} was created elsewhere at the same moment"
        )));
    }
    // Durable before it is reported made, whatever the nodes' durability:
    // a node that crashed just after would otherwise forget it.
    store.sync()?;
    Ok(vol)
}

/// Volume `name`, if it exists.
pub fn open(store: &dyn Store, name: &str) -> Result<Option<Volume>> {
    check_name(name)?;
    match store.get(&meta_key(name))? {
        Some(text) => Ok(Some(Volume::decode(name, &text)?)),
        None => Ok(None),
    }
}

/// Chunk keys listed per store call by [`allocated_chunks`].
const ALLOCATED_PAGE: usize = 4096;

/// How many chunks volume `vol` holds (thin provisioning: a chunk never
/// written, or trimmed, takes no space), listed from the store: a cost
/// that follows what the volume holds, not its size. At most: a chunk
/// trimmed a moment ago may still be listed.
pub fn allocated_chunks(store: &dyn Store, vol: &Volume) -> Result<u64> {
    let end = chunk_key(vol.id, vol.chunks());
    let mut from = chunk_key(vol.id, 0);
    let mut held = 0u64;
    loop {
        let page = store.range_keys(&from, &end, ALLOCATED_PAGE)?;
        held += page.len() as u64;
        match page.last() {
            Some(last) if page.len() == ALLOCATED_PAGE => {
                from = last.to_vec();
                from.push(0);
            }
            _ => return Ok(held),
        }
    }
}

/// Every volume, by name.
pub fn list(store: &dyn Store) -> Result<Vec<Volume>> {
    let mut end = META_PREFIX.to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut out = Vec::new();
    let mut start = META_PREFIX.to_vec();
    loop {
        let page = store.range(&start, &end, 1000)?;
        for (k, v) in &page {
            let name = String::from_utf8_lossy(&k[META_PREFIX.len()..]).into_owned();
            out.push(Volume::decode(&name, v)?);
        }
        match page.last() {
            Some((k, _)) if page.len() == 1000 => {
                start = k.to_vec();
                start.push(0);
            }
            _ => return Ok(out),
        }
    }
}

/// Changes a volume's size. Shrinking deletes the chunks past the new end
/// first, so growing again reads zeros there; it is refused while an
/// adapter serves the volume, unless `force`.
pub fn resize(store: &Arc<dyn Store>, name: &str, size: u64, force: bool) -> Result<Volume> {
    check_size(size)?;
    let mut vol = open(&**store, name)?.ok_or_else(|| NbdError::NoVolume(name.to_string()))?;
    let mut held = None;
    if size < vol.size {
        held = Some(hold_for_change(store, &vol, force)?);
        let store = &**store;
        let first_gone = size.div_ceil(u64::from(vol.chunk_size));
        delete_chunks(store, vol.id, first_gone)?;
        // The chunk holding the new end keeps bytes past it: zero them.
        let tail = size % u64::from(vol.chunk_size);
        if tail != 0 {
            let key = chunk_key(vol.id, size / u64::from(vol.chunk_size));
            if let Some(chunk) = store.get(&key)? {
                let mut c = chunk.to_vec();
                c[tail as usize..].fill(0);
                store.put(&key, &c)?;
            }
        }
    }
    vol.size = size;
    store.put(&meta_key(name), vol.encode().as_bytes())?;
    if let Some(lease) = held {
        lease.release()?;
    }
    Ok(vol)
}

/// Deletes a volume: its chunks, then its record, so a delete cut short
/// (a crash, the cluster gone) leaves the volume listed and can be run
/// again, instead of chunks that no record names. Refused while an adapter
/// serves it (its writes would outlive the delete), unless `force`; the
/// lease held meanwhile keeps adapters from serving it half deleted.
pub fn delete(store: &Arc<dyn Store>, name: &str, force: bool) -> Result<()> {
    let vol = open(&**store, name)?.ok_or_else(|| NbdError::NoVolume(name.to_string()))?;
    let lease = hold_for_change(store, &vol, force)?;
    let deleted =
        delete_chunks(&**store, vol.id, 0).and_then(|()| Ok(store.delete(&meta_key(name))?));
    // Let go whatever happened, so that running it again needs no wait.
    let released = lease.release();
    deleted?;
    Ok(released?)
}

/// Deletes the chunks of volume `id` from index `from` on, a page of keys
/// at a time (values are never read).
fn delete_chunks(store: &dyn Store, id: u64, from: u64) -> Result<()> {
    let end = match id.checked_add(1) {
        Some(next) => chunk_key(next, 0),
        None => [CHUNK_PREFIX, &[0xff; 17]].concat(),
    };
    Ok(store.delete_range(&chunk_key(id, from), &end, 1024)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::MemStore;

    #[test]
    fn create_open_list_resize_delete() {
        const CS: u32 = 64 << 10;
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let s = &*store;
        let v = create(s, "vol1", 1 << 20, CS).expect("create");
        assert_eq!(open(s, "vol1").expect("open"), Some(v.clone()));
        assert!(create(s, "vol1", 1 << 20, CS).is_err(), "exists");
        assert!(create(s, "bad name", 1 << 20, CS).is_err());
        assert!(create(s, "v2", 1000, CS).is_err(), "not 512-aligned");
        assert!(
            create(s, "v2", 1 << 20, 3000).is_err(),
            "chunk not a power of two"
        );
        create(s, "v2", 2 << 20, DEFAULT_CHUNK_SIZE).expect("v2");
        let names: Vec<String> = list(s).expect("list").into_iter().map(|v| v.name).collect();
        assert_eq!(names, ["v2", "vol1"]);
        s.put(&chunk_key(v.id, 15), &vec![7u8; CS as usize])
            .expect("chunk");
        s.put(&chunk_key(v.id, 1), &vec![7u8; CS as usize])
            .expect("chunk");
        assert_eq!(allocated_chunks(s, &v).expect("allocated"), 2);
        let v2 = open(s, "v2").expect("open").expect("v2");
        assert_eq!(
            allocated_chunks(s, &v2).expect("allocated"),
            0,
            "another volume's chunks"
        );
        let small = resize(&store, "vol1", 100 << 10, false).expect("shrink");
        assert_eq!(small.size, 100 << 10);
        assert!(
            s.get(&chunk_key(v.id, 15)).expect("get").is_none(),
            "past the end: gone"
        );
        let kept = s
            .get(&chunk_key(v.id, 1))
            .expect("get")
            .expect("chunk 1 kept");
        let tail = (100 << 10) - CS as usize;
        assert!(kept[..tail].iter().all(|&b| b == 7) && kept[tail..].iter().all(|&b| b == 0));
        delete(&store, "vol1", false).expect("delete");
        assert_eq!(open(s, "vol1").expect("open"), None);
        assert!(s.get(&chunk_key(v.id, 1)).expect("get").is_none());
    }

    #[test]
    fn of_simultaneous_creates_of_one_name_one_succeeds() {
        for _ in 0..20 {
            let store = MemStore::new();
            let made: Vec<Result<Volume>> = client::testing::simultaneously(4, |_| {
                create(&store, "v", 1 << 20, DEFAULT_CHUNK_SIZE)
            });
            let won: Vec<u64> = made.iter().flatten().map(|r| r.id).collect();
            assert_eq!(won.len(), 1, "{made:?}");
            let kept = open(&store, "v").expect("open").expect("created");
            assert_eq!(kept.id, won[0], "the record is the winner's");
        }
    }

    #[test]
    fn a_delete_cut_short_leaves_the_volume_listed_and_runs_again() {
        let mem = Arc::new(MemStore::new());
        let store: Arc<dyn Store> = mem.clone();
        let v = create(&*store, "v", 16 << 20, DEFAULT_CHUNK_SIZE).expect("create");
        let chunks: Vec<(Vec<u8>, Vec<u8>)> = (0..3000)
            .map(|c| (chunk_key(v.id, c), vec![1u8; 64]))
            .collect();
        let ops: Vec<client::WriteOp<'_>> =
            chunks.iter().map(|(k, d)| (&k[..], Some(&d[..]))).collect();
        store.write(&ops).expect("chunks");
        // The lease, then one page of chunk deletes; then the cluster goes.
        mem.fail_writes_after(Some(2));
        assert!(delete(&store, "v", false).is_err());
        mem.fail_writes_after(None);
        assert_eq!(
            open(&*store, "v").expect("open"),
            Some(v.clone()),
            "still listed"
        );
        // Its lease could not be released either (the cluster was gone):
        // force past it rather than wait for it to expire.
        delete(&store, "v", true).expect("delete again");
        assert_eq!(open(&*store, "v").expect("open"), None);
        let left = store
            .stored_keys(&chunk_key(v.id, 0), &chunk_key(v.id + 1, 0), 10)
            .expect("list");
        assert!(left.keys.is_empty(), "{} chunks left", left.keys.len());
    }

    #[test]
    fn a_served_volume_is_neither_deleted_nor_shrunk_unless_forced() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let v = create(&*store, "v", 1 << 20, DEFAULT_CHUNK_SIZE).expect("create");
        let serving =
            Lease::acquire(store.clone(), lease_key(v.id), "adapter", "v", false).expect("lease");
        for e in [
            delete(&store, "v", false).map(drop),
            resize(&store, "v", 4096, false).map(drop),
        ] {
            assert!(
                matches!(&e, Err(NbdError::Held(m)) if m.contains("is being served")),
                "{e:?}"
            );
        }
        resize(&store, "v", 2 << 20, false).expect("growing is harmless");
        delete(&store, "v", true).expect("forced");
        assert_eq!(open(&*store, "v").expect("open"), None);
        assert!(
            client::lease::live_holder(&*store, &lease_key(v.id))
                .expect("holder")
                .is_none(),
            "the delete lets go of the lease it took"
        );
        drop(serving);
    }
}
