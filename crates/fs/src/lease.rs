//! The mount lease: one mount per file system, a [`client::lease::Lease`]
//! under the file system's `L` key (see there for renewal, expiry within
//! [`TTL`], `--force` takeover and fencing). A mount whose lease is lost
//! refuses changes (EROFS) instead of writing next to a new owner.

use std::sync::Arc;

use client::lease::LeaseError;
use client::Store;

pub use client::lease::{Holding, Lease, RENEW, TTL};

use crate::error::{FsError, Result};
use crate::layout::Keys;

/// Who holds an unexpired mount lease on the file system, if anyone.
pub fn live_holder(store: &dyn Store, keys: &Keys) -> Result<Option<String>> {
    Ok(client::lease::live_holder(store, &keys.lease())?)
}

/// The unexpired mount lease on the file system, if any.
pub fn live_holding(store: &dyn Store, keys: &Keys) -> Result<Option<Holding>> {
    Ok(client::lease::live_holding(store, &keys.lease())?)
}

/// Takes the mount lease of the file system `keys` belongs to, as
/// `holder` (shown to a refused mount).
pub fn acquire(store: Arc<dyn Store>, keys: &Keys, holder: &str, force: bool) -> Result<Lease> {
    Lease::acquire(store, keys.lease(), holder, "the mount", force).map_err(|e| match e {
        LeaseError::Held(h) => FsError::Refused(format!(
            "the file system is mounted elsewhere ({h}); unmount it there, or give --force if that mount is dead"
        )),
        LeaseError::Client(c) => c.into(),
        LeaseError::Thread(e) => FsError::Refused(format!("cannot start the lease thread: {e}")),
    })
}
