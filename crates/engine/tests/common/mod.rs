//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use engine::flash::{Device, DirectRead, LossMode, NandConfig, NandDevice, ReadQueue};
use engine::{BatchOp, Db, GetStart, Options};

/// A small emulated NAND device: 4 KiB pages, `mib` MiB.
pub fn nand(mib: u64, loss: LossMode) -> Arc<NandDevice> {
    NandDevice::new(NandConfig {
        page_size: 4096,
        capacity: mib << 20,
        loss,
        ..NandConfig::default()
    })
}

/// Small options that make flush, compaction and GC run often.
pub fn small_opts() -> Options {
    Options::small_for_tests()
}

/// Test options with the background threads (write-behind, interval
/// sync, maintenance) running.
pub fn background_opts(durability: engine::Durability) -> Options {
    Options {
        durability,
        background: true,
        ..small_opts()
    }
}

/// Power cut and power back on, as a crashed host would see the device.
pub fn crash(dev: &Arc<NandDevice>, db: Db, seed: u64) {
    dev.cut_power_now();
    drop(db);
    dev.power_cycle(seed);
}

/// Opens a Db on the device.
pub fn open(dev: &Arc<NandDevice>, opts: &Options) -> Db {
    let d: Arc<dyn Device> = dev.clone();
    Db::open(d, opts.clone()).expect("open")
}

/// Syncs `db`, closes it and opens the store on `dev` again, so nothing it
/// wrote is still in memory and the keytable cache is freshly warmed.
pub fn reopened(dev: &Arc<NandDevice>, db: Db, opts: &Options) -> Db {
    db.sync().expect("sync");
    drop(db);
    open(dev, opts)
}

/// What the device read while something ran.
pub struct Reads {
    /// Bytes read.
    pub bytes: u64,
    /// Read operations.
    pub ops: u64,
}

/// Runs `f` and returns its result with the device reads it caused.
pub fn reads_during<T>(dev: &NandDevice, f: impl FnOnce() -> T) -> (T, Reads) {
    let before = dev.counters();
    let out = f();
    let after = dev.counters();
    let reads = Reads {
        bytes: after.bytes_read - before.bytes_read,
        ops: after.read_ops - before.read_ops,
    };
    (out, reads)
}

/// Deterministic value for (key, version).
pub fn value_for(key: u32, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = (u64::from(key) << 32) ^ version ^ 0x9E37_79B9_7F4A_7C15;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Key bytes for a key number.
pub fn key(k: u32) -> Vec<u8> {
    format!("key{k:06}").into_bytes()
}

/// A write batch of puts (`Some(value)`) and deletes (`None`) of key numbers.
pub fn batch_ops(items: &[(u32, Option<Vec<u8>>)]) -> Vec<BatchOp> {
    items
        .iter()
        .map(|(k, v)| match v {
            Some(v) => BatchOp::Put(key(*k).into(), v.clone().into()),
            None => BatchOp::Delete(key(*k).into()),
        })
        .collect()
}

/// A test device of either backend; `open` opens a Db on it (the file
/// backend reopens the file every time, as a restarted process would).
pub struct TestDevice {
    nand: Option<Arc<NandDevice>>,
    file: Option<(tempfile::TempDir, std::path::PathBuf)>,
    mib: u64,
}

impl TestDevice {
    /// Both backends, `mib` MiB each: emulated NAND and a file with O_DIRECT.
    pub fn both(mib: u64) -> [TestDevice; 2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("device");
        [
            TestDevice {
                nand: Some(nand(mib, LossMode::AllUnsynced)),
                file: None,
                mib,
            },
            TestDevice {
                nand: None,
                file: Some((dir, path)),
                mib,
            },
        ]
    }

    /// Which backend, for messages.
    pub fn name(&self) -> &'static str {
        if self.nand.is_some() {
            "nand"
        } else {
            "file"
        }
    }

    /// Opens a Db on the device.
    pub fn open(&self, opts: &Options) -> Db {
        let dev: Arc<dyn Device> = match (&self.nand, &self.file) {
            (Some(n), _) => n.clone(),
            (None, Some((_, path))) => {
                engine::flash::FileDevice::open(path, Some(self.mib << 20), 4096)
                    .expect("file device")
            }
            (None, None) => unreachable!("a TestDevice has one backend"),
        };
        Db::open(dev, opts.clone()).expect("open")
    }
}

/// A GET through the split path ([`Db::try_get`], the value read on a
/// [`ReadQueue`], [`Db::finish_get`]), falling back to [`Db::get`] as the
/// node does; `pause` runs between the lookup and the read (a busy network
/// thread, or a test widening the window for GC to race the read). Returns
/// the value and whether the device read ran on the queue.
pub fn split_get(
    db: &Db,
    queue: &mut ReadQueue<()>,
    key: &[u8],
    pause: impl FnOnce(),
) -> engine::Result<(Option<bytes::Bytes>, bool)> {
    let (pending, read) = match db.try_get(key)? {
        GetStart::Done(v) => return Ok((v, false)),
        GetStart::Blocking => return Ok((db.get(key)?, false)),
        GetStart::Read(pending, read) => (pending, read),
    };
    pause();
    if let Err((_, ())) = queue.submit(read, ()) {
        return Ok((db.get(key)?, false));
    }
    let (_, read, outcome) = wait_one(queue);
    match db.finish_get(pending, read, outcome) {
        Some(v) => Ok((Some(v), true)),
        None => Ok((db.get(key)?, false)),
    }
}

/// Waits (at most 10 s) for the one read in flight on `queue`.
pub fn wait_one<T>(queue: &mut ReadQueue<T>) -> (T, DirectRead, engine::flash::Result<()>) {
    for _ in 0..1000 {
        if let Some(done) = queue.reap_wait(std::time::Duration::from_millis(10)).pop() {
            return done;
        }
    }
    panic!("a read on the queue did not complete in 10 s");
}
