//! Hinted handoff, the delivery: a background thread that gives each
//! node named by a hint (`hints.rs`) this node's current copy of the keys
//! it missed, so a node that was down or unreachable catches up without an
//! operator and without any client staying alive.
//!
//! Each round walks the hints in key order, target by target, in batches:
//! it reads this node's copies of the batch's keys, sends them to the
//! target as `VSET`/`VDEL` at the versions they carry (the target only ever
//! moves a key forward, so a late or repeated delivery is harmless), and
//! once the target has answered deletes each hint whose version is not
//! newer than the copy sent (a hint raised meanwhile stays for the next
//! round). A reader thread reads the next batch's copies while this one
//! sends and the target stores the batches before. A target that cannot be
//! reached or refuses is skipped for [`BACKOFF`] (a refused connection only
//! until the next round); rounds run every [`ROUND`], or at once when a
//! `HINT` arrives.
//!
//! The thread connects to peers with this node's own password
//! (`requirepass`): the nodes of one cluster share one.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use client::Conn;
use engine::{BatchOp, ValueMeta};
use protocol::versioned::Versioned;

use crate::hints::{after_target, hints_end, hints_start, parse_hint_key};
use crate::state::NodeState;

/// Time between rounds when nothing wakes the thread: how soon a node that
/// answers again starts getting its writes.
const ROUND: Duration = Duration::from_millis(100);
/// Hints read per batch, and most copy bytes sent in one batch.
const BATCH_HINTS: usize = 1024;
const BATCH_BYTES: usize = 16 << 20;
/// Batches sent to a target before the oldest one's replies are read.
const IN_FLIGHT: usize = 2;
/// Timeouts of the connection to a target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the handoff thread; it stops when the node's shutdown is asked
/// and [`crate::hints::HintState::wake`] is called.
pub fn start(state: Arc<NodeState>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ls-handoff".into())
        .spawn(move || run(&state))
}

fn stopping(state: &NodeState) -> bool {
    *state.shutdown.borrow()
}

fn run(state: &NodeState) {
    let mut conns: HashMap<Vec<u8>, Conn> = HashMap::new();
    let mut failed_at = HashMap::new();
    while !stopping(state) {
        if !state.config.hinted_handoff {
            state.hints.wait(ROUND);
            continue;
        }
        if let Err(e) = round(state, &mut conns, &mut failed_at) {
            tracing::warn!(error = %e, "hinted handoff round failed");
        }
        state.hints.wait(ROUND);
    }
}

/// How long a target that failed is left alone, unless it refused the
/// connection: a refusal is answered at once (the host is up, its node is
/// not listening yet), so trying again next round costs this thread
/// nothing and a restarted node gets its writes within a round.
const BACKOFF: Duration = Duration::from_secs(1);

/// Why delivery to a target stopped, and how soon to try it again.
struct Failure {
    why: String,
    retry_after: Duration,
}

impl From<String> for Failure {
    fn from(why: String) -> Self {
        Failure {
            why,
            retry_after: BACKOFF,
        }
    }
}

/// One pass over every hint, target by target; targets whose last failure
/// asked to be left alone longer are skipped.
fn round(
    state: &NodeState,
    conns: &mut HashMap<Vec<u8>, Conn>,
    failed_at: &mut HashMap<Vec<u8>, (std::time::Instant, Duration)>,
) -> engine::Result<()> {
    let end = hints_end();
    let mut start = hints_start();
    while !stopping(state) {
        let Some(first) = state.db.scan_keys(&start, &end, 1)?.pop() else {
            return Ok(());
        };
        let Some((target, _)) = parse_hint_key(&first) else {
            // Not a hint key: clear it, it can never be delivered.
            state.db.delete(&first)?;
            continue;
        };
        let target = target.to_vec();
        if failed_at
            .get(&target)
            .is_some_and(|(at, wait)| at.elapsed() < *wait)
        {
            start = after_target(&target);
            continue;
        }
        let name = String::from_utf8_lossy(&target).into_owned();
        let began = std::time::Instant::now();
        let mut delivered = 0;
        let outcome = deliver_target(state, conns, &target, first.to_vec(), &mut delivered);
        if delivered > 0 {
            tracing::info!(target = %name, writes = delivered, seconds = began.elapsed().as_secs_f64(), "handed off missed writes");
        }
        match outcome {
            Ok(()) => {
                failed_at.remove(&target);
            }
            Err(Failure { why, retry_after }) => {
                failed_at.insert(target.clone(), (std::time::Instant::now(), retry_after));
                conns.remove(&target);
                let mut errors = state.hints.last_error.lock();
                if errors.get(&name) != Some(&why) {
                    tracing::info!(target = %name, reason = %why, "hinted writes wait for their node");
                }
                errors.insert(name, why);
            }
        }
        start = after_target(&target);
    }
    Ok(())
}

/// A batch of hints for one target, its copies sent, its replies awaited.
struct InFlight {
    /// The hint keys and, per hint, the version it is settled by: the copy
    /// sent or the hint's own version, whichever is newer.
    settled: Vec<(Bytes, u64)>,
    /// Requests sent (their replies to read).
    requests: usize,
}

/// A batch of hints with the requests that hand off their keys' copies.
struct Prepared {
    /// As [`InFlight::settled`].
    settled: Vec<(Bytes, u64)>,
    requests: Vec<Vec<Bytes>>,
}

/// Delivers every hint for `target` from `start` on. A reader thread reads
/// this node's copies batch by batch ([`read_batches`]) while this thread
/// sends the previous batch and the target stores the ones before it (up
/// to [`IN_FLIGHT`] unanswered). Counts the hints settled into
/// `delivered`, also when it fails part way.
fn deliver_target(
    state: &NodeState,
    conns: &mut HashMap<Vec<u8>, Conn>,
    target: &[u8],
    start: Vec<u8>,
    delivered: &mut u64,
) -> Result<(), Failure> {
    // Reach the target before reading any copy for it: a node still down
    // costs this thread one refused connection, not a batch of reads.
    connect(state, conns, target)?;
    let end = after_target(target);
    let (batches, ready) = std::sync::mpsc::sync_channel(1);
    std::thread::scope(|scope| {
        let _reader = std::thread::Builder::new()
            .name("ls-handoff-read".into())
            .spawn_scoped(scope, || read_batches(state, start, end, batches))
            .map_err(|e| Failure::from(format!("starting the handoff reader: {e}")))?;
        let mut in_flight: std::collections::VecDeque<InFlight> = Default::default();
        // Ends when the reader has nothing more (it drops its sender); on
        // an error `ready` is dropped, which stops the reader at its next
        // batch.
        for batch in ready {
            let Prepared { settled, requests } = batch?;
            if in_flight.len() >= IN_FLIGHT {
                if let Some(done) = in_flight.pop_front() {
                    *delivered += finish(state, conns, target, done)?;
                }
            }
            if !requests.is_empty() {
                connect(state, conns, target)?
                    .send(&requests)
                    .map_err(|e| Failure::from(e.to_string()))?;
            }
            in_flight.push_back(InFlight {
                settled,
                requests: requests.len(),
            });
        }
        while let Some(done) = in_flight.pop_front() {
            *delivered += finish(state, conns, target, done)?;
        }
        Ok(())
    })
}

/// Reads the copies for the hints in `[start, end)` into batches for
/// [`deliver_target`], until there are no more hints, the node stops, or
/// the receiving end is gone.
fn read_batches(
    state: &NodeState,
    mut start: Vec<u8>,
    end: Vec<u8>,
    batches: std::sync::mpsc::SyncSender<Result<Prepared, String>>,
) {
    while !stopping(state) {
        // Hints with what the index holds of them (their versions): no
        // second lookup per hint.
        let hints = match state
            .db
            .scan_meta_bounded(&start, &end, BATCH_HINTS, usize::MAX)
        {
            Ok(hints) if hints.is_empty() => return,
            Ok(hints) => hints,
            Err(e) => {
                let _ = batches.send(Err(format!("listing hints: {e}")));
                return;
            }
        };
        let batch = prepare(state, &hints).map(|(settled, requests)| {
            if let Some((last, _)) = settled.last() {
                start = last.to_vec();
                start.push(0);
            }
            Prepared { settled, requests }
        });
        let failed = batch.is_err();
        if batches.send(batch).is_err() || failed {
            return;
        }
    }
}

/// The key a hint names (empty for a key that is not a hint).
fn hinted_key(hint: &[u8]) -> &[u8] {
    parse_hint_key(hint).map_or(&hint[..0], |(_, k)| k)
}

/// Reads this node's copies of the keys `hints` name (as far as
/// [`BATCH_BYTES`] allows, at least one) and builds the `VSET`/`VDEL`
/// requests that hand them off: the hints covered (a prefix of `hints`)
/// with the versions sent, and the requests.
#[allow(clippy::type_complexity)]
fn prepare(
    state: &NodeState,
    hints: &[(Bytes, ValueMeta)],
) -> Result<(Vec<(Bytes, u64)>, Vec<Vec<Bytes>>), String> {
    let keys: Vec<&[u8]> = hints.iter().map(|(h, _)| hinted_key(h)).collect();
    let copies = state
        .db
        .multi_get(&keys)
        .map_err(|e| format!("reading local copies: {e}"))?;
    // Each hint's own version, from the index (hints are tagged values).
    let hint_versions: Vec<u64> = hints
        .iter()
        .map(|(_, m)| crate::vcmd::version_from_index(m.tag, m.value_len as usize).unwrap_or(0))
        .collect();
    let mut vset: Vec<Bytes> = vec![Bytes::from_static(b"VSET")];
    let mut vdel: Vec<Bytes> = vec![Bytes::from_static(b"VDEL")];
    let mut settled = Vec::with_capacity(hints.len());
    let mut bytes = 0;
    for (i, copy) in copies.into_iter().enumerate() {
        let key = Bytes::copy_from_slice(keys[i]);
        // Settled once delivered: the hint as read now, or the copy sent if
        // newer. A copy older than the hint (a plain SET or DEL replaced the
        // write here) has nothing newer to give: the hint is settled too.
        let hinted = hint_versions.get(i).copied().unwrap_or(0);
        let Some(copy) = copy.filter(|_| !key.is_empty()) else {
            // No copy here any more (a plain DEL): nothing to hand off.
            settled.push((hints[i].0.clone(), hinted));
            continue;
        };
        let size = key.len() + copy.len();
        if i > 0 && bytes + size > BATCH_BYTES {
            break;
        }
        bytes += size;
        let v = Versioned::decode(copy);
        let version = Bytes::from(v.version.to_string());
        match v.value {
            Some(value) => vset.extend([key, version, value]),
            None => vdel.extend([key, version]),
        }
        settled.push((hints[i].0.clone(), v.version.max(hinted)));
    }
    let reqs = [vset, vdel].into_iter().filter(|r| r.len() > 1).collect();
    Ok((settled, reqs))
}

/// Reads a batch's replies and deletes its hints, each unless a newer
/// hint for its key arrived meanwhile; how many it deleted.
fn finish(
    state: &NodeState,
    conns: &mut HashMap<Vec<u8>, Conn>,
    target: &[u8],
    done: InFlight,
) -> Result<u64, Failure> {
    if done.requests > 0 {
        let conn = connect(state, conns, target)?;
        for r in conn
            .receive(done.requests)
            .map_err(|e| Failure::from(e.to_string()))?
        {
            conn.check(r).map_err(|e| Failure::from(e.to_string()))?;
        }
    }
    let ops: Vec<BatchOp> = done
        .settled
        .iter()
        .map(|(hint, _)| BatchOp::Delete(hint.clone()))
        .collect();
    let deleted = state
        .db
        .write_batch_if(&ops, |j, current| {
            Ok(current.exists() && crate::vcmd::stored_version(current)? <= done.settled[j].1)
        })
        .map_err(|e| Failure::from(format!("clearing delivered hints: {e}")))?;
    let n = deleted.iter().filter(|&&d| d).count() as u64;
    state.hints.delivered(&String::from_utf8_lossy(target), n);
    Ok(n)
}

/// A connection to `target`, opened (and authenticated with this node's
/// password) when none is cached.
fn connect<'c>(
    state: &NodeState,
    conns: &'c mut HashMap<Vec<u8>, Conn>,
    target: &[u8],
) -> Result<&'c mut Conn, Failure> {
    if !conns.contains_key(target) {
        let addr = std::str::from_utf8(target).map_err(|_| "target is not UTF-8".to_string())?;
        let mut conn = Conn::open(addr, CONNECT_TIMEOUT, state.config.requirepass.as_deref())
            .map_err(|e| {
                let refused = matches!(&e, client::ClientError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::ConnectionRefused);
                Failure {
                    why: e.to_string(),
                    retry_after: if refused { ROUND } else { BACKOFF },
                }
            })?;
        conn.set_timeout(CALL_TIMEOUT);
        conns.insert(target.to_vec(), conn);
    }
    conns
        .get_mut(target)
        .ok_or_else(|| Failure::from("connection vanished".to_string()))
}
