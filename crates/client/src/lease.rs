//! Leases: one holder at a time for something kept in the cluster (a
//! mounted file system, a served volume). A holder writes a lease record
//! under the thing's lease key (owner, expiry, holder) and renews it every
//! [`RENEW`]; another is refused while a lease not its own has not
//! expired. A crashed holder's lease expires within [`TTL`]; `force`
//! takes over a lease known to be dead.
//!
//! Taking, renewing and releasing are compare-and-sets on the lease key
//! ([`Store::write_if_version`]): each reads the record with its version
//! and writes only if no one wrote since. Of two takers that both found
//! the lease free, at most one succeeds; a renewal racing a forced
//! takeover fails and the old holder learns it lost the lease at once,
//! instead of overwriting the new owner's record. (When the two land on
//! different replicas first, both may fail: the next attempt reads again.)
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
/// How many times a forced takeover reads and writes again when the
/// record changed in between (a renewal of the lease it takes over).
const TAKEOVER_ATTEMPTS: usize = 5;

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

    /// Whether the lease is gone for good (taken over, or let go), as
    /// opposed to not holding for now (a renewal is late: its node does
    /// not answer, and a later renewal may still succeed).
    pub fn revoked(&self) -> bool {
        self.0.lost.load(Ordering::Acquire)
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
    Ok(read_versioned(store, key)?.1)
}

/// The lease record under `key` (if any) and the version it was written
/// at, for a compare-and-set.
fn read_versioned(store: &dyn Store, key: &[u8]) -> Result<(u64, Option<Record>), ClientError> {
    let v = store.get_versioned(key)?;
    Ok((v.version, v.value.and_then(|b| Record::decode(&b))))
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
    Ok(live_holding(store, key)?.map(|h| describe(&h)))
}

fn describe(h: &Holding) -> String {
    format!(
        "by {}, lease valid for {} s more",
        h.holder,
        h.left.as_secs()
    )
}

/// Writes `owner`'s record under `key` as a compare-and-set: if the lease
/// is free or expired, or whoever holds it when `force`. Returns the
/// version written.
fn take(
    store: &dyn Store,
    key: &[u8],
    owner: &str,
    record: &dyn Fn(&str) -> Record,
    force: bool,
) -> Result<u64, LeaseError> {
    for _ in 0..TAKEOVER_ATTEMPTS {
        let (version, current) = read_versioned(store, key)?;
        let now = now_ms();
        if let Some(r) = current.filter(|r| !force && r.expires_ms > now) {
            return Err(LeaseError::Held(describe(&Holding {
                holder: r.holder,
                left: Duration::from_millis(r.expires_ms - now),
            })));
        }
        let mine = record(owner).encode();
        if let Some(v) = store.write_if_version(key, version, Some(mine.as_bytes()))? {
            return Ok(v);
        }
        if !force {
            let who = read(store, key)?.filter(|r| r.owner != owner);
            return Err(LeaseError::Held(format!(
                "taken at the same moment by {}",
                who.map_or("someone unknown".into(), |r| r.holder)
            )));
        }
    }
    Err(LeaseError::Held(
        "the lease changed at every attempt to take it over; try again".into(),
    ))
}

/// Renews `owner`'s lease written at `version`: the new version, or
/// `None` if another took the lease.
fn renew(
    store: &dyn Store,
    key: &[u8],
    owner: &str,
    version: u64,
    record: &dyn Fn(&str) -> Record,
) -> Result<Option<u64>, ClientError> {
    let mine = record(owner).encode();
    if let Some(v) = store.write_if_version(key, version, Some(mine.as_bytes()))? {
        return Ok(Some(v));
    }
    // Changed since our last write: still ours only if the record says so
    // (our own earlier write, seen at another version); then once more.
    match read_versioned(store, key)? {
        (now, Some(r)) if r.owner == owner => {
            store.write_if_version(key, now, Some(mine.as_bytes()))
        }
        _ => Ok(None),
    }
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
        let owner = format!("{:016x}", crate::version::unique_id());
        let holder = holder.to_string();
        let record = move |owner: &str| Record {
            owner: owner.to_string(),
            expires_ms: now_ms() + TTL.as_millis() as u64,
            holder: holder.clone(),
        };
        let mut version = take(&*store, &key, &owner, &record, force)?;
        // Durable before anything relies on it, whatever the nodes'
        // durability: a node that crashed just after would otherwise come
        // back with the record from before the take, and the first renewal
        // would take that for a takeover. If it cannot be made durable,
        // the record goes again (best effort) so no one, this holder
        // retrying included, waits out a lease nobody renews.
        if let Err(e) = store.sync() {
            let _ = store.write_if_version(&key, version, None);
            return Err(e.into());
        }
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
                        match renew(&*store, &key, &owner, version, &record) {
                            Ok(Some(v)) => {
                                version = v;
                                fence.renewed_at(started);
                                if warned && fence.holds() {
                                    tracing::warn!("the lease of {what} is renewed: changes accepted again");
                                    warned = false;
                                }
                            }
                            Ok(None) => {
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
        // Deleted only if still ours, and only if no one wrote it since
        // we read it (a takeover at that moment keeps its record).
        if let (version, Some(r)) = read_versioned(&*self.store, &self.key)? {
            if r.owner == self.owner {
                self.store.write_if_version(&self.key, version, None)?;
            }
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

    /// A store where a rival's record lands just before our read (`at_read`)
    /// or between our read and our write (`!at_read`).
    struct Rival {
        inner: MemStore,
        at_read: bool,
        rival: Vec<u8>,
        done: AtomicBool,
    }

    impl Rival {
        fn strike(&self, key: &[u8]) -> crate::Result<()> {
            if !self.done.swap(true, Ordering::SeqCst) {
                self.inner.put(key, &self.rival)?;
            }
            Ok(())
        }
    }

    impl Store for Rival {
        fn mget(&self, keys: &[&[u8]]) -> crate::Result<Vec<Option<bytes::Bytes>>> {
            self.inner.mget(keys)
        }
        fn mget_sized(
            &self,
            keys: &[&[u8]],
            value_len: usize,
        ) -> crate::Result<Vec<Option<bytes::Bytes>>> {
            self.inner.mget_sized(keys, value_len)
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
        fn get_versioned(&self, key: &[u8]) -> crate::Result<crate::Versioned> {
            if self.at_read {
                self.strike(key)?;
            }
            self.inner.get_versioned(key)
        }
        fn write_if_version(
            &self,
            key: &[u8],
            expected: u64,
            value: Option<&[u8]>,
        ) -> crate::Result<Option<u64>> {
            if !self.at_read {
                self.strike(key)?;
            }
            self.inner.write_if_version(key, expected, value)
        }
    }

    #[test]
    fn a_rival_that_writes_first_wins_and_we_back_off() {
        let rival = Record {
            owner: "r1".into(),
            expires_ms: now_ms() + 60_000,
            holder: "rival".into(),
        }
        .encode()
        .into_bytes();
        for at_read in [true, false] {
            let store = Arc::new(Rival {
                inner: MemStore::new(),
                at_read,
                rival: rival.clone(),
                done: AtomicBool::new(false),
            });
            match Lease::acquire(store.clone(), b"lease/x".to_vec(), "a", "x", false) {
                Err(LeaseError::Held(who)) if at_read => {
                    assert!(who.starts_with("by rival,"), "{who}")
                }
                Err(LeaseError::Held(who)) => assert_eq!(who, "taken at the same moment by rival"),
                other => panic!("rival at_read={at_read}: got {:?}", other.map(|_| ())),
            }
            let left = read(&*store, b"lease/x").expect("read").expect("a record");
            assert_eq!(left.owner, "r1", "the rival's record stands");
        }
    }

    fn record_of(holder: &'static str) -> impl Fn(&str) -> Record {
        move |owner: &str| Record {
            owner: owner.to_string(),
            expires_ms: now_ms() + TTL.as_millis() as u64,
            holder: holder.to_string(),
        }
    }

    #[test]
    fn a_renewal_after_a_forced_takeover_fails_and_leaves_the_new_record() {
        let store = MemStore::new();
        let key = b"lease/x";
        let (a, c) = (record_of("a"), record_of("c"));
        let va = take(&store, key, "oa", &a, false).expect("a takes it");
        let va = renew(&store, key, "oa", va, &a)
            .expect("renew")
            .expect("still a's");
        let vc = take(&store, key, "oc", &c, true).expect("c forces it");
        assert_eq!(renew(&store, key, "oa", va, &a).expect("renew"), None);
        assert_eq!(
            read(&store, key).expect("read").expect("record").owner,
            "oc"
        );
        assert!(renew(&store, key, "oc", vc, &c).expect("renew").is_some());
        // A renewal that finds its own record at another version (its
        // earlier write seen late) adopts it.
        let seen = store.get_versioned(key).expect("read").version;
        assert!(renew(&store, key, "oc", seen - 1, &c)
            .expect("renew")
            .is_some());
    }

    #[test]
    fn of_many_simultaneous_takers_exactly_one_wins() {
        for _ in 0..20 {
            let store = MemStore::new();
            let won = crate::testing::simultaneously(8, |i| {
                take(&store, b"lease/x", &format!("o{i}"), &record_of("t"), false).is_ok()
            })
            .into_iter()
            .filter(|&won| won)
            .count();
            assert_eq!(won, 1);
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
