//! What the adapters (block, file) need of a key-value store, as one trait
//! with two implementations: the cluster ([`Cluster`]) and an in-memory
//! model ([`MemStore`]), so adapter logic is tested fast without nodes and
//! end to end with them.
//!
//! Contract (both implementations): a write that returned is seen by every
//! later read of any caller; `write` is atomic per key (not across keys);
//! `sync` returns once every write that returned before it is durable.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use protocol::versioned::Versioned;

use crate::cluster::Cluster;
use crate::error::Result;

/// One write of a batch: `Some(value)` stores, `None` deletes.
pub type WriteOp<'a> = (&'a [u8], Option<&'a [u8]>);

/// A page of stored keys ([`Store::stored_keys`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredKeys {
    /// The listed keys that hold a value, in key order.
    pub keys: Vec<Bytes>,
    /// When the page was full: the last key listed (more may follow it).
    pub full_at: Option<Bytes>,
}

/// Space of a store for user data, in bytes (what `df` shows): the
/// devices' total and free bytes divided by the copies kept of each key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes in all.
    pub total: u64,
    /// Bytes free.
    pub free: u64,
}

/// A key-value store as the adapters use it.
pub trait Store: Send + Sync {
    /// The values of `keys` (`None`: absent or deleted).
    fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>>;
    /// [`Store::mget`] of values about `value_len` bytes long (a hint a
    /// store may use to place them, see `Cluster::mget_sized`).
    fn mget_sized(&self, keys: &[&[u8]], value_len: usize) -> Result<Vec<Option<Bytes>>> {
        let _ = value_len;
        self.mget(keys)
    }
    /// Whether each key holds a value, without reading values.
    fn exists(&self, keys: &[&[u8]]) -> Result<Vec<bool>>;
    /// Stores and deletes, each atomic per key.
    fn write(&self, ops: &[WriteOp<'_>]) -> Result<()>;
    /// Stores and deletes as one batch that a crash leaves whole or absent
    /// on each replica. All keys must share their replicas (one hash tag)
    /// and fit one request, else nothing is written and an error says why.
    fn write_atomic(&self, ops: &[WriteOp<'_>]) -> Result<()>;
    /// [`Store::write_atomic`], durable on the replicas that took it when
    /// it returns (with every write they took before it), whatever the
    /// nodes' durability setting; never acknowledged on the word of a node
    /// that restarted before the batch was durable.
    fn write_atomic_durable(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        self.write_atomic(ops)?;
        self.sync()
    }
    /// Up to `limit` pairs with `start <= key < end` (empty `end`: no
    /// bound), in key order.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>>;
    /// Up to `limit` keys with `start <= key < end` in key order, without
    /// their values; may include keys deleted recently (for finding what
    /// to delete, not what exists).
    fn range_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        Ok(self
            .range(start, end, limit)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }
    /// One page of up to `limit` keys listed in `[start, end)`, without
    /// those deleted recently (which a listing may still show): each
    /// listed key is confirmed with [`Store::exists`].
    fn stored_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<StoredKeys> {
        let listed = self.range_keys(start, end, limit)?;
        let full_at = (listed.len() == limit)
            .then(|| listed.last().cloned())
            .flatten();
        let refs: Vec<&[u8]> = listed.iter().map(|k| &k[..]).collect();
        let held = if refs.is_empty() {
            Vec::new()
        } else {
            self.exists(&refs)?
        };
        let keys = listed
            .into_iter()
            .zip(held)
            .filter_map(|(k, held)| held.then_some(k))
            .collect();
        Ok(StoredKeys { keys, full_at })
    }
    /// Makes every write that returned so far durable.
    fn sync(&self) -> Result<()>;
    /// A cursor over losses of acknowledged writes from now on (see
    /// [`Store::sync_with`]).
    fn loss_cursor(&self) -> crate::LossCursor {
        crate::LossCursor::default()
    }
    /// [`Store::sync`], reporting each loss of acknowledged writes (a node
    /// that restarted without a clean stop, `ClientError::LostWrites`) once
    /// to each cursor rather than once to the whole client: a writer keeps
    /// its own, as a Linux file does its writeback error.
    fn sync_with(&self, cursor: &mut crate::LossCursor) -> Result<()> {
        let _ = cursor;
        self.sync()
    }
    /// The value under `key` with the version it was written at (version
    /// 0 and no value: never written; a version and no value: deleted).
    fn get_versioned(&self, key: &[u8]) -> Result<Versioned>;
    /// Stores `value` (`None`: deletes) under `key` only if its version is
    /// still `expected` (from [`Store::get_versioned`]): the new version
    /// if written, `None` if someone wrote the key since. After `None` the
    /// write may still have landed on some replicas (see the cluster's
    /// `cas.rs`): read again before deciding anything.
    fn write_if_version(
        &self,
        key: &[u8],
        expected: u64,
        value: Option<&[u8]>,
    ) -> Result<Option<u64>>;
    /// The store's space, if it knows it.
    fn capacity(&self) -> Result<Option<Capacity>> {
        Ok(None)
    }

    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.mget(&[key])?.pop().flatten())
    }
    /// Stores `value` under `key`.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(&[(key, Some(value))])
    }
    /// Deletes `key`.
    fn delete(&self, key: &[u8]) -> Result<()> {
        self.write(&[(key, None)])
    }
    /// Deletes every key in `[start, end)` that holds a value, listing
    /// them `page` keys at a time (no value is read; a key the listing
    /// shows but already deleted gets no second tombstone), so memory and
    /// requests stay bounded whatever the range holds.
    fn delete_range(&self, start: &[u8], end: &[u8], page: usize) -> Result<()> {
        self.sweep(start, end, page, &mut |keys| keys.to_vec())
            .map(drop)
    }
    /// Visits every key that holds a value in `[start, end)`, `page` keys
    /// at a time ([`Store::stored_keys`]); `pick` returns which keys of a
    /// page to delete, and they are deleted before the next page is
    /// listed. Returns how many were deleted.
    fn sweep(
        &self,
        start: &[u8],
        end: &[u8],
        page: usize,
        pick: &mut dyn FnMut(&[Bytes]) -> Vec<Bytes>,
    ) -> Result<u64> {
        let mut from = start.to_vec();
        let mut deleted = 0;
        loop {
            let listed = self.stored_keys(&from, end, page)?;
            let doomed = pick(&listed.keys);
            if !doomed.is_empty() {
                let ops: Vec<WriteOp<'_>> = doomed.iter().map(|k| (&k[..], None)).collect();
                self.write(&ops)?;
                deleted += ops.len() as u64;
            }
            // Pages on from the last key listed: a listing that shows
            // deleted keys again still moves forward.
            let Some(last) = listed.full_at else {
                return Ok(deleted);
            };
            from = last.to_vec();
            from.push(0);
        }
    }
}

impl Store for Cluster {
    fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        Cluster::mget(self, keys)
    }
    fn mget_sized(&self, keys: &[&[u8]], value_len: usize) -> Result<Vec<Option<Bytes>>> {
        Cluster::mget_sized(self, keys, value_len)
    }
    fn exists(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        Cluster::exists(self, keys)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        self.inner.write(ops.to_vec())
    }
    fn write_atomic(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        Cluster::write_atomic(self, ops)
    }
    fn write_atomic_durable(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        Cluster::write_atomic_durable(self, ops)
    }
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        Cluster::range(self, start, end, limit)
    }
    fn range_keys(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Bytes>> {
        Cluster::range_keys(self, start, end, limit)
    }
    fn sync(&self) -> Result<()> {
        Cluster::sync(self)
    }
    fn loss_cursor(&self) -> crate::LossCursor {
        Cluster::loss_cursor(self)
    }
    fn sync_with(&self, cursor: &mut crate::LossCursor) -> Result<()> {
        Cluster::sync_with(self, cursor)
    }
    fn capacity(&self) -> Result<Option<Capacity>> {
        Ok(Cluster::capacity(self))
    }
    fn get_versioned(&self, key: &[u8]) -> Result<Versioned> {
        Cluster::get_versioned(self, key)
    }
    fn write_if_version(
        &self,
        key: &[u8],
        expected: u64,
        value: Option<&[u8]>,
    ) -> Result<Option<u64>> {
        Cluster::write_if_version(self, key, expected, value)
    }
}

/// An in-memory [`Store`]: a sorted map behind a lock. Counts its calls, so
/// adapter tests can check what reached the store.
#[derive(Default)]
pub struct MemStore {
    map: Mutex<BTreeMap<Vec<u8>, Bytes>>,
    /// Each key's last write version (deleted keys keep theirs); taken
    /// after `map` when both are held.
    versions: Mutex<std::collections::HashMap<Vec<u8>, u64>>,
    clock: AtomicU64,
    /// Calls to `write` so far.
    pub writes: AtomicU64,
    /// Calls to `sync` so far.
    pub syncs: AtomicU64,
    /// Calls to `range` (and `range_keys`) so far.
    pub ranges: AtomicU64,
    /// Calls to `mget` (and `get`) so far.
    pub mgets: AtomicU64,
    /// Keys asked of `exists` so far.
    pub exists_keys: AtomicU64,
    /// Most keys one `write` (or `write_atomic`) call held so far.
    pub largest_write: AtomicU64,
    /// Writes still allowed before every write fails (a crash or an
    /// unreachable cluster halfway through a change); `None`: unlimited.
    writes_left: Mutex<Option<u64>>,
    /// Writes fail as a full node refuses them ([`MemStore::refuse_writes_as_full`]).
    full: AtomicBool,
    /// Losses of acknowledged writes modelled so far
    /// ([`MemStore::lose_unsynced_writes`]).
    losses: AtomicU64,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Models a node that restarted without a clean stop after it alone
    /// acknowledged writes not yet synced (the data itself stays: only
    /// the report is modelled): every cursor's next `sync_with` fails
    /// once.
    pub fn lose_unsynced_writes(&self) {
        self.losses.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }

    /// From now on, lets `n` more writes through and fails every one after
    /// them (`None`: none fail again), as a cluster that went away halfway
    /// through a multi-step change would.
    pub fn fail_writes_after(&self, n: Option<u64>) {
        *self.writes_left.lock() = n;
    }

    /// From now on (until called with `false`), fails every write the way
    /// a node whose device is full refuses it (`NOSPACE`).
    pub fn refuse_writes_as_full(&self, full: bool) {
        self.full.store(full, Ordering::Relaxed);
    }

    /// Counts one write against [`MemStore::fail_writes_after`].
    fn admit_write(&self) -> Result<()> {
        if self.full.load(Ordering::Relaxed) {
            return Err(crate::ClientError::Server {
                node: "memstore".into(),
                message: "NOSPACE device full (injected)".into(),
            });
        }
        match &mut *self.writes_left.lock() {
            Some(0) => Err(crate::ClientError::Unavailable(
                "injected: the store refuses writes".into(),
            )),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl Store for MemStore {
    fn mget(&self, keys: &[&[u8]]) -> Result<Vec<Option<Bytes>>> {
        self.mgets.fetch_add(1, Ordering::Relaxed);
        let map = self.map.lock();
        Ok(keys.iter().map(|k| map.get(*k).cloned()).collect())
    }
    fn exists(&self, keys: &[&[u8]]) -> Result<Vec<bool>> {
        self.exists_keys
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let map = self.map.lock();
        Ok(keys.iter().map(|k| map.contains_key(*k)).collect())
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        self.admit_write()?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.largest_write
            .fetch_max(ops.len() as u64, Ordering::Relaxed);
        let mut map = self.map.lock();
        let mut versions = self.versions.lock();
        let version = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        for (k, v) in ops {
            match v {
                Some(v) => map.insert(k.to_vec(), Bytes::copy_from_slice(v)),
                None => map.remove(*k),
            };
            versions.insert(k.to_vec(), version);
        }
        Ok(())
    }
    fn get_versioned(&self, key: &[u8]) -> Result<Versioned> {
        let map = self.map.lock();
        let version = self.versions.lock().get(key).copied().unwrap_or(0);
        Ok(Versioned {
            version,
            value: map.get(key).cloned(),
        })
    }
    fn write_if_version(
        &self,
        key: &[u8],
        expected: u64,
        value: Option<&[u8]>,
    ) -> Result<Option<u64>> {
        self.admit_write()?;
        let mut map = self.map.lock();
        let mut versions = self.versions.lock();
        if versions.get(key).copied().unwrap_or(0) != expected {
            return Ok(None);
        }
        let version = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
        match value {
            Some(v) => map.insert(key.to_vec(), Bytes::copy_from_slice(v)),
            None => map.remove(key),
        };
        versions.insert(key.to_vec(), version);
        Ok(Some(version))
    }
    fn write_atomic(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        // One lock hold: atomic for every reader.
        self.write(ops)
    }
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Bytes, Bytes)>> {
        self.ranges.fetch_add(1, Ordering::Relaxed);
        let map = self.map.lock();
        let upper = if end.is_empty() {
            std::ops::Bound::Unbounded
        } else {
            std::ops::Bound::Excluded(end.to_vec())
        };
        Ok(map
            .range((std::ops::Bound::Included(start.to_vec()), upper))
            .take(limit)
            .map(|(k, v)| (Bytes::copy_from_slice(k), v.clone()))
            .collect())
    }
    fn sync(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn loss_cursor(&self) -> crate::LossCursor {
        crate::LossCursor::new(vec![self.losses.load(Ordering::Relaxed)])
    }
    fn sync_with(&self, cursor: &mut crate::LossCursor) -> Result<()> {
        self.sync()?;
        let losses = self.losses.load(Ordering::Relaxed);
        if losses > cursor.seen(0) {
            cursor.set(0, losses);
            return Err(crate::ClientError::LostWrites {
                node: "memory".into(),
                why: "injected: a node lost writes it had acknowledged".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_behaves_like_a_sorted_map() {
        let s = MemStore::new();
        s.write(&[(b"b", Some(b"2")), (b"a", Some(b"1")), (b"c", Some(b"3"))])
            .expect("write");
        s.delete(b"c").expect("delete");
        assert_eq!(s.get(b"a").expect("get").as_deref(), Some(&b"1"[..]));
        assert_eq!(s.exists(&[b"a", b"c"]).expect("exists"), [true, false]);
        let r = s.range(b"a", b"", 10).expect("range");
        assert_eq!(r.len(), 2);
        assert_eq!(s.range(b"a", b"b", 10).expect("range").len(), 1);
        s.sync().expect("sync");
        assert_eq!(s.syncs.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_range_is_deleted_page_by_page_and_nothing_outside_it() {
        let s = MemStore::new();
        for k in [&b"a"[..], b"b1", b"b2", b"b3", b"b4", b"b5", b"c"] {
            s.put(k, b"v").expect("put");
        }
        s.delete_range(b"b", b"c", 2).expect("delete range");
        let left: Vec<Bytes> = s
            .range(b"", b"", 10)
            .expect("range")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(left, [&b"a"[..], b"c"]);
        assert_eq!(
            s.ranges.load(Ordering::Relaxed),
            4,
            "three pages of two, then the check"
        );
    }
}
