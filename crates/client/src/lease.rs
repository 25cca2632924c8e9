//! Leases: one holder at a time for something kept in the cluster (a
//! mounted file system, a served volume). A holder writes a lease record
//! under the thing's lease key (owner, expiry, holder) and renews it every
//! [`RENEW`]; another is refused while a lease not its own has not
//! expired. A crashed holder's lease expires within [`TTL`]; `force`
//! takes over a lease known to be dead.
//!
//! The cluster has no compare-and-set, so taking a lease is check, write,
//! read back, and read again [`SETTLE`] later. Two takers that both found
//! the lease free each write theirs; the later write wins everywhere. The
//! read back catches a rival that wrote before it, the second read a
//! rival that checked before our write and wrote after our read back (its
//! write follows its check by one round trip, far less than `SETTLE`).
//! Only a rival stalled longer than that between its check and its write
//! slips through, and its record then ends our lease at our next renewal
//! (within [`RENEW`]).
//!
//! Fencing: the lease's [`Fence`] holds only while its holder knows it
//! holds it. A renewal that finds another owner (a forced takeover), or no
//! successful renewal for longer than [`TTL`] minus a margin (another may
//! take over once it expires), clears it, and the holder must then refuse
//! changes instead of writing next to a new owner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::ClientError;
use crate::store::Store;

/// How long a lease lasts without renewal.
pub const TTL: Duration = Duration::from_secs(15);
/// How often a holder renews its lease.
pub const RENEW: Duration = Duration::from_secs(5);
/// How long before expiry a holder that could not renew stops writing.
const MARGIN: Duration = Duration::from_secs(3);
/// How long a new holder waits before reading its lease record a second
/// time (see the module doc).
pub const SETTLE: Duration = Duration::from_millis(200);

/// What a holder checks before each change: whether it still holds its
/// lease, that is, no one took it over and its last renewal is recent
/// enough that the lease cannot have expired for others (a renewal stuck
/// on an unreachable node counts as none). Clones share one state.
#[derive(Clone, Debug)]
pub struct Fence(Arc<FenceState>);

#[derive(Debug)]
struct FenceState {
    since: Instant,
    /// Milliseconds from `since` to the start of the last successful
    /// renewal (or of the acquisition).
    renewed_ms: AtomicU64,
    lost: AtomicBool,
    /// False for a fence that holds until revoked ([`Fence::held`]).
    expires: bool,
}

impl Fence {
    /// A fence that holds until [`Fence::revoke`]d: for a holder with no
    /// lease to renew, and for tests.
    pub fn held() -> Fence {
        Fence::new(false)
    }

    fn new(expires: bool) -> Fence {
        Fence(Arc::new(FenceState {
            since: Instant::now(),
            renewed_ms: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            expires,
        }))
    }

    /// Whether the holder may still change what the lease guards.
    pub fn holds(&self) -> bool {
        let f = &*self.0;
        if f.lost.load(Ordering::Acquire) {
            return false;
        }
        let since_renewal = (f.since.elapsed().as_millis() as u64)
            .saturating_sub(f.renewed_ms.load(Ordering::Acquire));
        !f.expires || since_renewal < (TTL - MARGIN).as_millis() as u64
    }

    /// From now on it does not hold (the lease was taken over).
    pub fn revoke(&self) {
        self.0.lost.store(true, Ordering::Release);
    }

    /// A renewal that started at `at` succeeded.
    fn renewed_at(&self, at: Instant) {
        let ms = at.duration_since(self.0.since).as_millis() as u64;
        self.0.renewed_ms.fetch_max(ms, Ordering::AcqRel);
    }
}

/// Why a lease was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else holds it (the text says who, and for how long).
    #[error("{0}")]
    Held(String),
    /// The cluster failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The renewing thread could not start.
    #[error("cannot start the lease thread: {0}")]
    Thread(std::io::Error),
}

/// An id no other lease owner has: the time, the process and a counter,
/// hashed.
fn unique_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let seed = [nanos, u64::from(std::process::id()), n];
    let bytes: Vec<u8> = seed.iter().flat_map(|x| x.to_le_bytes()).collect();
    xxhash_rust::xxh64::xxh64(&bytes, 0x004c_534c_4541_5345)
}

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
        let field = |f: &str| crate::records::field(text, f);
        Some(Record {
            owner: field("owner")?.to_string(),
            expires_ms: field("expires")?.parse().ok()?,
            holder: field("holder")?.to_string(),
        })
    }
}

fn read(store: &dyn Store, key: &[u8]) -> Result<Option<Record>, ClientError> {
    Ok(store.get(key)?.and_then(|v| Record::decode(&v)))
}

/// An unexpired lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The holder's name, as it gave it to [`Lease::acquire`].
    pub holder: String,
    /// How long the lease lasts unless renewed.
    pub left: Duration,
}

/// The unexpired lease under `key`, if any.
pub fn live_holding(store: &dyn Store, key: &[u8]) -> Result<Option<Holding>, ClientError> {
    let now = now_ms();
    Ok(read(store, key)?
        .filter(|r| r.expires_ms > now)
        .map(|r| Holding {
            holder: r.holder,
            left: Duration::from_millis(r.expires_ms - now),
        }))
}

/// Who holds an unexpired lease under `key`, if anyone, in words: the
/// holder's name and how long the lease has left.
pub fn live_holder(store: &dyn Store, key: &[u8]) -> Result<Option<String>, ClientError> {
    Ok(live_holding(store, key)?.map(|h| {
        format!(
            "by {}, lease valid for {} s more",
            h.holder,
            h.left.as_secs()
        )
    }))
}

/// Reads the lease record under `key` after `wait`: Ok if it is still
/// `owner`'s, else who took it.
fn ours_after(
    store: &dyn Store,
    key: &[u8],
    owner: &str,
    wait: Duration,
) -> Result<(), LeaseError> {
    std::thread::sleep(wait);
    match read(store, key)? {
        Some(r) if r.owner == owner => Ok(()),
        other => Err(LeaseError::Held(format!(
            "taken at the same moment by {}",
            other.map_or("someone unknown".into(), |r| r.holder)
        ))),
    }
}

/// Renews the lease if it is still `owner`'s: false if another took it.
fn renew(
    store: &dyn Store,
    key: &[u8],
    owner: &str,
    record: &dyn Fn(&str) -> Record,
) -> Result<bool, ClientError> {
    if read(store, key)?.is_some_and(|r| r.owner != owner) {
        return Ok(false);
    }
    store.put(key, record(owner).encode().as_bytes())?;
    Ok(true)
}

/// A held lease, renewed in the background until released or dropped.
pub struct Lease {
    store: Arc<dyn Store>,
    key: Vec<u8>,
    owner: String,
    stop: Arc<AtomicBool>,
    fence: Fence,
    renewer: Option<JoinHandle<()>>,
}

impl Lease {
    /// Takes the lease under `key` as `holder` (a name shown to whoever is
    /// refused); `force` takes it whoever holds it. `what` names the thing
    /// in log lines ("the mount", "volume vol1").
    pub fn acquire(
        store: Arc<dyn Store>,
        key: Vec<u8>,
        holder: &str,
        what: &str,
        force: bool,
    ) -> Result<Lease, LeaseError> {
        if !force {
            if let Some(h) = live_holder(&*store, &key)? {
                return Err(LeaseError::Held(h));
            }
        }
        let owner = format!("{:016x}", unique_id());
        let holder = holder.to_string();
        let record = move |owner: &str| Record {
            owner: owner.to_string(),
            expires_ms: now_ms() + TTL.as_millis() as u64,
            holder: holder.clone(),
        };
        store.put(&key, record(&owner).encode().as_bytes())?;
        ours_after(&*store, &key, &owner, Duration::ZERO)?;
        ours_after(&*store, &key, &owner, SETTLE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let fence = Fence::new(true);
        let renewer = {
            let (store, key, owner, stop, fence) = (
                store.clone(),
                key.clone(),
                owner.clone(),
                stop.clone(),
                fence.clone(),
            );
            let what = what.to_string();
            std::thread::Builder::new()
                .name("lease".into())
                .spawn(move || {
                    let step = Duration::from_millis(100);
                    let mut waited = Duration::ZERO;
                    let mut warned = false;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(step);
                        waited += step;
                        if !fence.holds() && !warned && !stop.load(Ordering::Relaxed) {
                            tracing::error!("the lease of {what} could not be renewed in time: refusing changes until it is");
                            warned = true;
                        }
                        if waited < RENEW {
                            continue;
                        }
                        waited = Duration::ZERO;
                        let started = Instant::now();
                        match renew(&*store, &key, &owner, &record) {
                            Ok(true) => {
                                fence.renewed_at(started);
                                if warned && fence.holds() {
                                    tracing::warn!("the lease of {what} is renewed: changes accepted again");
                                    warned = false;
                                }
                            }
                            Ok(false) => {
                                tracing::error!("{what} was taken over elsewhere (--force): refusing changes here");
                                fence.revoke();
                                return;
                            }
                            Err(e) => tracing::error!(error = %e, "cannot renew the lease of {what}"),
                        }
                    }
                })
                .map_err(LeaseError::Thread)?
        };
        Ok(Lease {
            store,
            key,
            owner,
            stop,
            fence,
            renewer: Some(renewer),
        })
    }

    /// What the holder checks before each change (see [`Fence`]).
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops renewing and deletes the lease (if still ours), so the next
    /// holder gets in at once.
    pub fn release(mut self) -> Result<(), ClientError> {
        self.stop_renewing();
        if read(&*self.store, &self.key)?.is_some_and(|r| r.owner == self.owner) {
            self.store.delete(&self.key)?;
        }
        Ok(())
    }

    /// Stops renewing; then the fence no longer holds (the holder let go).
    fn stop_renewing(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
        self.fence.revoke();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn one_holder_at_a_time_until_released_or_forced() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let key = b"lease/x".to_vec();
        let a = Lease::acquire(store.clone(), key.clone(), "a", "x", false).expect("first");
        match Lease::acquire(store.clone(), key.clone(), "b", "x", false) {
            Err(LeaseError::Held(who)) => assert!(who.starts_with("by a,"), "{who}"),
            other => panic!("a second holder got {:?}", other.map(|_| ())),
        }
        assert!(live_holder(&*store, &key).expect("holder").is_some());
        a.release().expect("release");
        assert!(live_holder(&*store, &key).expect("holder").is_none());
        let b = Lease::acquire(store.clone(), key.clone(), "b", "x", false).expect("after release");
        let c = Lease::acquire(store.clone(), key.clone(), "c", "x", true).expect("forced");
        assert!(b.fence().holds(), "b learns of it at its next renewal");
        // b's release must not delete c's lease.
        b.release().expect("release b");
        assert!(live_holder(&*store, &key)
            .expect("holder")
            .is_some_and(|h| h.starts_with("by c,")));
        drop(c);
    }

    /// A store that, at its `at`-th read, first writes `rival` under the
    /// same key: a rival taker whose write lands just then.
    struct Rival {
        inner: MemStore,
        reads: AtomicU64,
        at: u64,
        rival: Vec<u8>,
    }

    impl Store for Rival {
        fn mget(&self, keys: &[&[u8]]) -> crate::Result<Vec<Option<bytes::Bytes>>> {
            if self.reads.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
                self.inner.put(keys[0], &self.rival)?;
            }
            self.inner.mget(keys)
        }
        fn exists(&self, keys: &[&[u8]]) -> crate::Result<Vec<bool>> {
            self.inner.exists(keys)
        }
        fn write(&self, ops: &[crate::WriteOp<'_>]) -> crate::Result<()> {
            self.inner.write(ops)
        }
        fn write_atomic(&self, ops: &[crate::WriteOp<'_>]) -> crate::Result<()> {
            self.inner.write_atomic(ops)
        }
        fn range(
            &self,
            start: &[u8],
            end: &[u8],
            limit: usize,
        ) -> crate::Result<Vec<(bytes::Bytes, bytes::Bytes)>> {
            self.inner.range(start, end, limit)
        }
        fn sync(&self) -> crate::Result<()> {
            self.inner.sync()
        }
    }

    #[test]
    fn a_rival_that_writes_after_our_read_back_wins_and_we_back_off() {
        let rival = Record {
            owner: "r1".into(),
            expires_ms: now_ms() + 60_000,
            holder: "rival".into(),
        }
        .encode()
        .into_bytes();
        // Reads: 1 the check, 2 the read back, 3 the second read. A rival
        // write before read 2 or before read 3 must both be seen.
        for at in [2, 3] {
            let store = Arc::new(Rival {
                inner: MemStore::new(),
                reads: AtomicU64::new(0),
                at,
                rival: rival.clone(),
            });
            match Lease::acquire(store, b"lease/x".to_vec(), "a", "x", false) {
                Err(LeaseError::Held(who)) => {
                    assert_eq!(
                        who, "taken at the same moment by rival",
                        "rival at read {at}"
                    )
                }
                other => panic!("rival at read {at}: got {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_fence_lets_go_when_renewals_stop_and_holds_again_after_one() {
        let Some(since) = Instant::now().checked_sub(TTL) else {
            return; // a machine up for less than the lease's lifetime
        };
        let fence = Fence(Arc::new(FenceState {
            since,
            renewed_ms: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            expires: true,
        }));
        assert!(!fence.holds(), "no renewal for a whole lease");
        fence.renewed_at(Instant::now());
        assert!(fence.holds(), "renewed just now");
        fence.revoke();
        assert!(!fence.holds(), "taken over");
        let manual = Fence::held();
        assert!(manual.holds());
        manual.revoke();
        assert!(!manual.holds());
    }
}
