//! Helpers shared by the engine's unit tests.

use std::sync::Arc;

use flash::{LossMode, NandConfig, NandDevice};

use crate::tag::Tagging;
use crate::types::{Entry, Kind, ValuePtr};
use crate::{Db, Options};

/// A put of `key` at `seq` with an empty pointer and no tag known.
pub(crate) fn put_entry(key: &str, seq: u64) -> Entry {
    put_at(key.as_bytes(), seq, 0)
}

/// A put of `key` at `seq` whose pointer says only `offset`, no tag known.
pub(crate) fn put_at(key: &[u8], seq: u64, offset: u32) -> Entry {
    Entry {
        key: bytes::Bytes::copy_from_slice(key),
        seq,
        kind: Kind::Put,
        ptr: ValuePtr {
            offset,
            ..ValuePtr::default()
        },
        tag: Tagging::Unknown,
    }
}

/// A 16 MiB emulated NAND device with 4 KiB pages; a power cut loses every
/// unsynced page.
pub(crate) fn nand_device() -> Arc<NandDevice> {
    NandDevice::new(NandConfig {
        page_size: 4096,
        capacity: 16 << 20,
        loss: LossMode::AllUnsynced,
        ..NandConfig::default()
    })
}

/// A store with the test options on a fresh [`nand_device`].
pub(crate) fn small_db() -> Db {
    Db::open(nand_device(), Options::small_for_tests()).expect("open")
}
