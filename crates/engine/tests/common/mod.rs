//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use engine::flash::{Device, LossMode, NandConfig, NandDevice};
use engine::{Db, Options};

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

/// Opens a Db on the device.
pub fn open(dev: &Arc<NandDevice>, opts: &Options) -> Db {
    let d: Arc<dyn Device> = dev.clone();
    Db::open(d, opts.clone()).expect("open")
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
