//! GETs split around their device read, for a caller that serves many
//! clients on one thread and must never wait for the device (the node's
//! network thread). [`Db::try_get`] looks the key up from DRAM alone (the
//! memtables, the level index and Bloom filters, cached keytable blocks) and
//! hands back the value's device read, which the caller runs asynchronously
//! (on a [`flash::ReadQueue`]); [`Db::finish_get`] checks what it read.
//!
//! Whatever cannot go this way is left to [`Db::get`], which may wait: a
//! keytable block not in the cache, a value still in the log's memory tail,
//! a device without direct reads, a read that failed or raced value GC (GC
//! released the segment after the lookup; `get` looks the key up again and
//! finds the relocated value). The split path thus adds no outcome of its
//! own: it answers exactly what `get` would, or hands over to it.

use bytes::Bytes;
use flash::DirectRead;

use crate::db::{Db, DbInner, SuperVersion};
use crate::error::Result;
use crate::stats::Counters;
use crate::types::{Kind, SeqNo};
use crate::version::{Finger, Probe, Source};
use crate::vlog::{PendingValue, ValueLog, ValueStart};

/// How a GET proceeds without waiting (see [`Db::try_get`]).
#[derive(Debug)]
pub enum GetStart {
    /// Answered from DRAM: the value, or `None` when the key is absent.
    Done(Option<Bytes>),
    /// Run this device read, then call [`Db::finish_get`] with its outcome.
    Read(PendingGet, DirectRead),
    /// Only [`Db::get`], which may wait, can answer it.
    Blocking,
}

/// A GET whose value read is running.
#[derive(Debug)]
pub struct PendingGet(PendingValue);

impl PendingGet {
    /// The value's length.
    pub fn value_len(&self) -> usize {
        self.0.value_len()
    }

    /// Whether the value is the read's first bytes (so a read landing at a
    /// place leaves the value exactly there).
    pub fn value_starts_the_read(&self) -> bool {
        self.0.skip() == 0
    }
}

impl Db {
    /// Starts a GET of the current value of `key` that never waits for the
    /// device (only, briefly, for the log's lock when the value is recent).
    /// An error is one [`Db::get`] would report too.
    pub fn try_get(&self, key: &[u8]) -> Result<GetStart> {
        let mut starts = self.inner.try_get_many(&[key])?;
        Ok(starts.pop().unwrap_or(GetStart::Blocking))
    }

    /// [`Db::try_get`] of several keys at one sequence number, as
    /// [`Db::multi_get`] reads them: a batch written together is seen
    /// whole or not at all. One start per key, in order.
    pub fn try_get_many(&self, keys: &[&[u8]]) -> Result<Vec<GetStart>> {
        self.inner.try_get_many(keys)
    }

    /// Completes a GET that [`Db::try_get`] started with `read`, given the
    /// read's `outcome`. `None` when the read failed, or its bytes do not
    /// check out: the caller then asks [`Db::get`] (which retries after a
    /// race with GC, and reports a real error).
    pub fn finish_get(
        &self,
        get: PendingGet,
        read: DirectRead,
        outcome: flash::Result<()>,
    ) -> Option<Bytes> {
        outcome.ok()?;
        let value = ValueLog::finish_read(get.0, read).ok()?;
        let counters = &self.inner.counters;
        Counters::add(&counters.gets, 1);
        Counters::add(&counters.get_device_reads, 1);
        Some(value)
    }
}

impl DbInner {
    fn try_get_many(&self, keys: &[&[u8]]) -> Result<Vec<GetStart>> {
        let (sv, seq) = self.read_view(None);
        let mut out = Vec::with_capacity(keys.len());
        let mut finger = Finger::default();
        for key in keys {
            let entry = match probe_in(self, &sv, key, seq, &mut finger)? {
                Probe::Found(entry) => entry,
                Probe::NeedsRead => {
                    out.push(GetStart::Blocking);
                    continue;
                }
            };
            let start = match entry {
                Some(e) if e.kind == Kind::Put => match self.vlog.start_read(e.ptr, key)? {
                    ValueStart::Ready(v) => GetStart::Done(Some(v)),
                    ValueStart::Device(pending, read) => GetStart::Read(PendingGet(pending), read),
                    ValueStart::Blocking => {
                        out.push(GetStart::Blocking);
                        continue;
                    }
                },
                _ => GetStart::Done(None),
            };
            if matches!(start, GetStart::Done(_)) {
                Counters::add(&self.counters.gets, 1);
            }
            out.push(start);
        }
        Ok(out)
    }
}

/// The newest entry for `key` at or below `seq` in `sv`, from DRAM only.
pub(crate) fn probe_in(
    db: &DbInner,
    sv: &SuperVersion,
    key: &[u8],
    seq: SeqNo,
    finger: &mut Finger,
) -> Result<Probe> {
    let in_memtables = sv
        .mem
        .get(key, seq)
        .or_else(|| sv.imm.as_ref().and_then(|imm| imm.get(key, seq)));
    if let Some(e) = in_memtables {
        return Ok(Probe::Found(Some(e)));
    }
    sv.version
        .probe_near(key, seq, &db.ctx, Source::CacheOnly, finger)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flash::{Device, FileDevice, ReadQueue};

    use super::*;
    use crate::Options;

    fn key(i: u32) -> Vec<u8> {
        format!("key{i:05}").into_bytes()
    }

    fn value(i: u32, version: u8) -> Vec<u8> {
        vec![version ^ (i as u8); 3000]
    }

    /// A store on a temporary 16 MiB file (a device with direct reads).
    fn file_db(opts: Options) -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev: Arc<dyn Device> =
            FileDevice::open(&dir.path().join("dev"), Some(16 << 20), 4096).expect("device");
        (dir, Db::open(dev, opts).expect("open"))
    }

    /// Runs `read` on a fresh queue and returns it with its outcome.
    fn run(read: DirectRead) -> (DirectRead, flash::Result<()>) {
        let mut queue: ReadQueue<()> = ReadQueue::new(1).expect("io_uring");
        queue.submit(read, ()).expect("room");
        for _ in 0..1000 {
            let done = queue.reap_wait(std::time::Duration::from_millis(10)).pop();
            if let Some((_, read, outcome)) = done {
                return (read, outcome);
            }
        }
        panic!("the read did not complete in 10 s");
    }

    fn started(db: &Db, k: &[u8]) -> (PendingGet, DirectRead) {
        match db.try_get(k).expect("try_get") {
            GetStart::Read(pending, read) => (pending, read),
            other => panic!("expected a device read, got {other:?}"),
        }
    }

    #[test]
    fn answers_what_get_answers() {
        if !flash::io_uring_for_tests() {
            return;
        }
        let (_dir, db) = file_db(Options::small_for_tests());
        for i in 0..50 {
            db.put(&key(i), &value(i, 1)).expect("put");
        }
        db.delete(&key(7)).expect("delete");
        db.put(&key(8), b"").expect("put");
        db.sync().expect("sync");
        for i in (0..50).chain([99]) {
            let got = match db.try_get(&key(i)).expect("try_get") {
                GetStart::Done(v) => v,
                GetStart::Read(pending, read) => {
                    let (read, outcome) = run(read);
                    Some(db.finish_get(pending, read, outcome).expect("checks out"))
                }
                GetStart::Blocking => panic!("key {i}: synced, cached, on a file"),
            };
            assert_eq!(got, db.get(&key(i)).expect("get"), "key {i}");
        }
        assert!(matches!(db.try_get(&key(3)), Ok(GetStart::Read(..))));
    }

    #[test]
    fn a_failed_read_is_left_to_get() {
        if !flash::io_uring_for_tests() {
            return;
        }
        let (_dir, db) = file_db(Options::small_for_tests());
        db.put(&key(1), &value(1, 1)).expect("put");
        db.put(&key(2), &value(2, 1)).expect("put");
        db.sync().expect("sync");
        let (pending, read) = started(&db, &key(1));
        let failed = Err(flash::FlashError::Io(std::io::Error::other("injected")));
        assert!(db.finish_get(pending, read, failed).is_none());
        // Another key's bytes (same length) fail the checksum.
        let (pending, _) = started(&db, &key(1));
        let (_, other) = started(&db, &key(2));
        let (other, outcome) = run(other);
        assert!(db.finish_get(pending, other, outcome).is_none());
    }

    /// A lookup that needs a keytable block outside the cache does not read
    /// it: the GET is left to `get`.
    #[test]
    fn an_uncached_keytable_block_is_left_to_get() {
        let opts = Options {
            cache_bytes: 0,
            ..Options::small_for_tests()
        };
        let (_dir, db) = file_db(opts);
        for i in 0..200 {
            db.put(&key(i), &value(i, 1)).expect("put");
        }
        db.flush().expect("flush");
        let before = db
            .inner
            .ctx
            .block_reads
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(db.try_get(&key(5)), Ok(GetStart::Blocking)));
        let after = db
            .inner
            .ctx
            .block_reads
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(before, after, "try_get read a keytable block");
        assert_eq!(db.get(&key(5)).expect("get"), Some(value(5, 1).into()));
    }

    /// The lookup found the value in a segment that value GC then relocated
    /// and released (and the store trimmed and reused) before the read ran:
    /// the read brings other bytes, which must not be answered.
    #[test]
    fn a_read_that_raced_gc_is_left_to_get() {
        if !flash::io_uring_for_tests() {
            return;
        }
        let (_dir, db) = file_db(Options::small_for_tests());
        for i in 0..40 {
            db.put(&key(i), &value(i, 1)).expect("put");
        }
        db.sync().expect("sync");
        let (pending, read) = started(&db, &key(0));
        let ptr = pending.0.ptr;
        let mut rounds = 0;
        while !db.inner.vlog.is_reclaimed(ptr) {
            rounds += 1;
            assert!(rounds < 50, "GC never released the value's segment");
            for i in 0..40 {
                db.put(&key(i), &value(i, 2 + rounds as u8)).expect("put");
            }
            db.flush().expect("flush");
            db.gc().expect("gc");
        }
        // Released segments are trimmed and reused once checkpoints pass.
        for round in 0..5u8 {
            for i in 0..40 {
                db.put(&key(i), &value(i, 100 + round)).expect("put");
            }
            db.flush().expect("flush");
            db.gc().expect("gc");
        }
        db.sync().expect("sync");
        let (read, outcome) = run(read);
        assert!(
            db.finish_get(pending, read, outcome).is_none(),
            "bytes of a reclaimed segment were answered"
        );
        assert_eq!(db.get(&key(0)).expect("get"), Some(value(0, 104).into()));
    }
}
