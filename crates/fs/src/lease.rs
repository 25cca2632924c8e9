//! The mount lease: one mount per file system. A mount writes a lease
//! record (`{lsfs:ID}L`: owner, expiry, holder) and renews it every
//! [`RENEW`]; another mount is refused while a lease not its own has not
//! expired. A crashed mount's lease expires within [`TTL`]; `--force`
//! takes over a lease known to be dead. Two mounts racing both write and
//! then read back: the cluster orders the two writes, so exactly one reads
//! its own and proceeds.
//!
//! Fencing: the lease is [`Lease::valid`] only while this mount knows it
//! holds it. A renewal that finds another owner (a `--force` takeover), or
//! no successful renewal for longer than [`TTL`] minus a margin (another
//! mount may take over once it expires), clears it, and the file system
//! then refuses changes (EROFS) instead of writing next to a new owner.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use client::Store;

use crate::error::{FsError, Result};
use crate::layout::Keys;

/// How long a lease lasts without renewal.
pub const TTL: Duration = Duration::from_secs(15);
/// How often a mount renews its lease.
pub const RENEW: Duration = Duration::from_secs(5);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Record {
    owner: String,
    expires_ms: u64,
    holder: String,
}

impl Record {
    fn encode(&self) -> String {
        format!(
            "owner={}\nexpires={}\nholder={}\n",
            self.owner, self.expires_ms, self.holder
        )
    }

    fn decode(b: &[u8]) -> Option<Record> {
        let text = std::str::from_utf8(b).ok()?;
        let field = |f: &str| client::records::field(text, f);
        Some(Record {
            owner: field("owner")?.to_string(),
            expires_ms: field("expires")?.parse().ok()?,
            holder: field("holder")?.to_string(),
        })
    }
}

fn read(store: &dyn Store, keys: &Keys) -> Result<Option<Record>> {
    Ok(store.get(&keys.lease())?.and_then(|v| Record::decode(&v)))
}

/// Who holds an unexpired lease on the file system, if anyone.
pub fn live_holder(store: &dyn Store, keys: &Keys) -> Result<Option<String>> {
    Ok(read(store, keys)?
        .filter(|r| r.expires_ms > now_ms())
        .map(|r| {
            let left = r.expires_ms.saturating_sub(now_ms()) / 1000;
            format!("by {}, lease valid for {left} s more", r.holder)
        }))
}

/// Renews the lease if it is still `owner`'s: false if another took it.
fn renew(
    store: &dyn Store,
    keys: &Keys,
    owner: &str,
    record: &dyn Fn(&str) -> Record,
) -> Result<bool> {
    if read(store, keys)?.is_some_and(|r| r.owner != owner) {
        return Ok(false);
    }
    store.put(&keys.lease(), record(owner).encode().as_bytes())?;
    Ok(true)
}

/// A held lease, renewed in the background until released or dropped.
pub struct Lease {
    store: Arc<dyn Store>,
    keys: Keys,
    owner: String,
    stop: Arc<AtomicBool>,
    valid: Arc<AtomicBool>,
    renewer: Option<JoinHandle<()>>,
}

/// How long before expiry a mount that could not renew stops writing.
const MARGIN: Duration = Duration::from_secs(3);

impl Lease {
    /// Takes the lease of the file system `keys` belongs to, as `holder`
    /// (shown to a refused mount).
    pub fn acquire(store: Arc<dyn Store>, keys: Keys, holder: &str, force: bool) -> Result<Lease> {
        if !force {
            if let Some(h) = live_holder(&*store, &keys)? {
                return Err(FsError::Refused(format!(
                    "the file system is mounted elsewhere ({h}); unmount it there, or give --force if that mount is dead"
                )));
            }
        }
        let owner = format!("{:016x}", rand::random::<u64>());
        let holder = holder.to_string();
        let record = move |owner: &str| Record {
            owner: owner.to_string(),
            expires_ms: now_ms() + TTL.as_millis() as u64,
            holder: holder.clone(),
        };
        store.put(&keys.lease(), record(&owner).encode().as_bytes())?;
        match read(&*store, &keys)? {
            Some(r) if r.owner == owner => {}
            other => {
                return Err(FsError::Refused(format!(
                    "another mount took the file system at the same moment ({})",
                    other.map_or("unknown".into(), |r| r.holder)
                )))
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let valid = Arc::new(AtomicBool::new(true));
        let renewer = {
            let (store, keys, owner, stop, valid) = (
                store.clone(),
                keys.clone(),
                owner.clone(),
                stop.clone(),
                valid.clone(),
            );
            std::thread::Builder::new()
                .name("fs-lease".into())
                .spawn(move || {
                    let step = Duration::from_millis(100);
                    let mut waited = Duration::ZERO;
                    let mut renewed = std::time::Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(step);
                        waited += step;
                        if renewed.elapsed() > TTL - MARGIN && valid.swap(false, Ordering::Relaxed) {
                            tracing::error!("the mount lease could not be renewed in time: refusing changes until it is");
                        }
                        if waited < RENEW {
                            continue;
                        }
                        waited = Duration::ZERO;
                        match renew(&*store, &keys, &owner, &record) {
                            Ok(true) => {
                                renewed = std::time::Instant::now();
                                if !valid.swap(true, Ordering::Relaxed) {
                                    tracing::warn!("the mount lease is renewed: changes accepted again");
                                }
                            }
                            Ok(false) => {
                                tracing::error!("another mount took this file system over (--force): refusing changes; unmount here");
                                valid.store(false, Ordering::Relaxed);
                                return;
                            }
                            Err(e) => tracing::error!(error = %e, "cannot renew the mount lease"),
                        }
                    }
                })
                .map_err(|e| FsError::Refused(format!("cannot start the lease thread: {e}")))?
        };
        Ok(Lease {
            store,
            keys,
            owner,
            stop,
            valid,
            renewer: Some(renewer),
        })
    }

    /// True while this mount knows it holds the lease (see the module
    /// doc); the file system refuses changes while it is false.
    pub fn valid(&self) -> Arc<AtomicBool> {
        self.valid.clone()
    }

    /// Stops renewing and deletes the lease (if still ours).
    pub fn release(mut self) -> Result<()> {
        self.stop_renewing();
        if read(&*self.store, &self.keys)?.is_some_and(|r| r.owner == self.owner) {
            self.store.delete(&self.keys.lease())?;
        }
        Ok(())
    }

    fn stop_renewing(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}
