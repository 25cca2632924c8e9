//! Conditional batches: write each operation of a batch only where a
//! predicate on its key's current value holds, atomically per key with
//! respect to every other conditional batch, without a store-wide lock.
//!
//! Keys hash onto a fixed table of stripe locks ([`KeyLocks`]). A
//! conditional batch locks its keys' stripes in ascending order (so two
//! batches never wait on each other in a cycle), looks the keys up (their
//! values' tags and sizes, from the index: see `tag.rs`; a value itself is
//! read only when the predicate asks for it), keeps the operations the
//! predicate accepts and appends them as
//! one atomic batch; it releases the stripes once the records are appended
//! (and visible) and only then waits for durability. Batches on other keys
//! run at the same time and share device syncs (group commit); a batch on
//! the same key waits for an append, never for a sync.
//!
//! Contract:
//! - Per key, conditional batches are linearizable: the predicate sees the
//!   value the previous conditional batch on that key left (or a plain
//!   write that completed before this batch began).
//! - Within one batch, operations on the same key apply in order: the
//!   predicate of a later one sees what an earlier accepted one wrote.
//! - Plain writes (`put`, `write_batch`) do not take the stripes: one that
//!   races a conditional batch on the same key may be overwritten as if it
//!   had come first.
//! - On return, what the decisions were based on is as durable as the
//!   options promise: under `sync`, even a batch that wrote nothing waits
//!   until the values it compared against are on the device (another
//!   batch may have appended them and still be waiting for its sync).

use parking_lot::{Mutex, MutexGuard};

use crate::db::{batch_records, BatchOp, Db, Wait};
use crate::error::{Error, Result};
use crate::tag::Current;

/// Stripe locks of the key space. More stripes, fewer false conflicts
/// between unrelated keys; each is one byte.
const STRIPES: usize = 4096;

/// The stripe locks conditional batches take (see the module doc).
pub(crate) struct KeyLocks {
    stripes: Box<[Mutex<()>]>,
}

impl KeyLocks {
    pub(crate) fn new() -> KeyLocks {
        KeyLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn stripe_of(key: &[u8]) -> usize {
        (xxhash_rust::xxh3::xxh3_64(key) % STRIPES as u64) as usize
    }

    /// Locks the stripes of `keys`, each once, in ascending order.
    fn lock<'a>(&'a self, keys: impl Iterator<Item = &'a [u8]>) -> Vec<MutexGuard<'a, ()>> {
        let mut ids: Vec<usize> = keys.map(Self::stripe_of).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|i| self.stripes[i].lock()).collect()
    }
}

/// The largest value a [`Room::SmallReplacements`] batch may write into
/// the delete reserve.
pub const SMALL_REPLACEMENT: usize = 1024;

/// Where on a nearly full device a conditional batch may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// Where ordinary writes may (deletes alone also into the delete
    /// reserve, as for every write).
    Ordinary,
    /// Also into the delete reserve when every operation kept replaces a
    /// value the key holds with one of at most [`SMALL_REPLACEMENT`] bytes
    /// (or deletes it): such a batch adds at most a little to what the
    /// device holds. For coordination records that must stay writable on
    /// a full device, such as the lease an adapter renews while its user
    /// deletes data to make room; ordinary writes otherwise.
    SmallReplacements,
}

/// Bytes an operation writes as its value (none for a delete).
fn written_len(op: &BatchOp) -> usize {
    match op {
        BatchOp::Put(_, v) => v.len(),
        BatchOp::PutParts { head, body, .. } => head.len() + body.len(),
        BatchOp::Delete(_) => 0,
    }
}

fn key_of(op: &BatchOp) -> &[u8] {
    match op {
        BatchOp::Put(k, _) | BatchOp::PutParts { key: k, .. } | BatchOp::Delete(k) => k,
    }
}

impl Db {
    /// Applies the operations of `ops` that `keep` accepts as one atomic
    /// batch, deciding each from its key's current value, atomically per
    /// key with respect to other conditional batches (see the module doc
    /// for the exact contract). `keep(i, current)` is called once per
    /// operation, in order, with what its key holds at that point (absent
    /// when deleted); it may decide from the tag alone or read the value.
    /// Returns which operations were written.
    ///
    /// On error nothing was written, unless the error came from waiting
    /// for durability (as for [`Db::write_batch`]).
    pub fn write_batch_if(
        &self,
        ops: &[BatchOp],
        keep: impl FnMut(usize, &mut Current<'_>) -> Result<bool>,
    ) -> Result<Vec<bool>> {
        self.write_batch_if_in(ops, Room::Ordinary, keep)
    }

    /// [`Self::write_batch_if`], writing where `room` allows when the
    /// device is nearly full.
    pub fn write_batch_if_in(
        &self,
        ops: &[BatchOp],
        room: Room,
        mut keep: impl FnMut(usize, &mut Current<'_>) -> Result<bool>,
    ) -> Result<Vec<bool>> {
        let guards = self.key_locks.lock(ops.iter().map(key_of));
        // The batch's distinct keys in order, and each operation's place
        // among them (sorted once; no hashing per operation).
        let mut by_key: Vec<(&[u8], usize)> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| (key_of(op), i))
            .collect();
        by_key.sort_unstable();
        let mut distinct: Vec<&[u8]> = Vec::with_capacity(by_key.len());
        let mut slot_of = vec![0usize; ops.len()];
        for (key, i) in by_key {
            if distinct.last() != Some(&key) {
                distinct.push(key);
            }
            slot_of[i] = distinct.len() - 1;
        }
        let metas = self.multi_get_meta(&distinct)?;
        debug_assert_eq!(metas.len(), distinct.len(), "one meta per key");
        // What each key holds as the batch is applied in order.
        let mut current: Vec<Current<'_>> = distinct
            .iter()
            .zip(metas)
            .map(|(&k, m)| Current::stored(self, k, m))
            .collect();
        let mut kept = Vec::with_capacity(ops.len());
        let mut written = Vec::with_capacity(ops.len());
        // Whether every kept operation is a small replacement (see `Room`).
        let mut small_replacements = true;
        for (i, op) in ops.iter().enumerate() {
            let slot = &mut current[slot_of[i]];
            let accept = keep(i, slot)?;
            if accept {
                small_replacements &= slot.exists() && written_len(op) <= SMALL_REPLACEMENT;
                slot.set_written(op);
                kept.push(op);
            }
            written.push(accept);
        }
        let delete_reserve = room == Room::SmallReplacements && small_replacements;
        let lsn = if kept.is_empty() {
            // Nothing to write, but what was compared against may still
            // be waiting for its sync in another batch.
            self.inner.visible_lsn()
        } else {
            // `Wait::Allowed` appends or fails; `None` would be a bug.
            self.inner
                .append_ops(&batch_records(kept), Wait::Allowed, delete_reserve)?
                .ok_or_else(|| Error::Stopped("a conditional batch was not appended".into()))?
        };
        drop(guards);
        self.inner.wait_durable(lsn)?;
        Ok(written)
    }
}
