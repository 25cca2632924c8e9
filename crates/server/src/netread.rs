//! GETs served on the network thread, without the executor: the engine's
//! split GET ([`engine::Db::try_get`]) looks the key up from DRAM, the
//! value's device read runs on an io_uring [`ReadQueue`] whose completion
//! eventfd the network runtime polls, and [`engine::Db::finish_get`] checks
//! the bytes. A GET then costs no thread hand-off in either direction: the
//! two wake-ups and context switches that made up most of a lone GET's CPU
//! outside the device (LightStore paper §4.2: the server and the engine
//! exchange requests without copies or blocking).
//!
//! A GET the split path cannot answer (a keytable block to read, a value
//! still in the log's memory, a full queue, a failed or raced read) goes to
//! the executor pool as before, so answers are the same either way.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::flash::{DirectRead, LandingSpace, ReadQueue, MAX_MERGED_READ, MAX_READ_GAP};
use engine::{GetStart, PendingGet};
use parking_lot::Mutex;
use protocol::Reply;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, Notify};

use crate::data::CallTime;
use crate::shm::Landing;
use crate::state::NodeState;

/// Reads the network thread keeps in flight at most; GETs beyond go to
/// the executor pool.
const QUEUE_DEPTH: u32 = 256;
/// How often the reaper looks at the queue when the kernel refused a
/// submission for the moment (it normally wakes only on completions).
const RESUBMIT_EVERY: Duration = Duration::from_millis(1);

/// A finished read: the read back, and whether it succeeded.
type Finished = (DirectRead, engine::flash::Result<()>);

/// The network thread's read queue.
pub struct NetReads {
    queue: Mutex<ReadQueue<oneshot::Sender<Finished>>>,
    /// Set when the queue can no longer be polled: no new GETs start here.
    disabled: AtomicBool,
    /// Wakes the flusher: reads were queued.
    queued: Notify,
}

/// A descriptor of the queue's eventfd (a duplicate, so that it stays open
/// as long as tokio polls it, whichever of the two is dropped first).
struct EventFd(OwnedFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl NetReads {
    /// Creates the queue and starts its reaper task on the current tokio
    /// runtime. `None` where io_uring cannot be used: GETs then all go to
    /// the executor pool.
    pub fn start() -> Option<Arc<NetReads>> {
        let queue = match ReadQueue::new(QUEUE_DEPTH) {
            Ok(q) => q,
            Err(e) => {
                tracing::info!("GETs go through the executor pool: no io_uring read queue ({e})");
                return None;
            }
        };
        let event = queue
            .event_fd()
            .try_clone_to_owned()
            .map_err(|e| e.to_string())
            .and_then(|fd| {
                // SAFETY: `EventFd` owns the descriptor, so it stays open and
                // the same for as long as the `AsyncFd` holds it.
                unsafe { AsyncFd::register_with_interest(EventFd(fd), Interest::READABLE) }
                    .map_err(|e| e.to_string())
            });
        let event = match event {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(
                    "GETs go through the executor pool: cannot poll the read queue ({e})"
                );
                return None;
            }
        };
        let reads = Arc::new(NetReads {
            queue: Mutex::new(queue),
            disabled: AtomicBool::new(false),
            queued: Notify::new(),
        });
        tokio::spawn(reap(reads.clone(), event));
        tokio::spawn(flush(reads.clone()));
        Some(reads)
    }

    /// Answers a run of plain `GET key`s of one connection on this thread,
    /// in order: `None` for each GET that must go to the executor pool
    /// instead (all of them when the queue is out of service). The run
    /// shares its time equally among its GETs, as on the pool.
    pub async fn gets(&self, state: &NodeState, keys: &[&[u8]]) -> Vec<Option<(Reply, CallTime)>> {
        if self.disabled.load(Ordering::Relaxed) {
            return (0..keys.len()).map(|_| None).collect();
        }
        let clock = Instant::now();
        let starts: Vec<Option<GetStart>> = keys.iter().map(|k| state.db.try_get(k).ok()).collect();
        self.finish(state, starts, None, clock).await
    }

    /// Answers `MGET keys` on this thread: the value (or nil) of every key,
    /// read at one sequence number as the executor's MGET reads them.
    /// `None` when the executor must answer it instead: some key cannot be
    /// read without waiting, a read failed, the queue is out of service,
    /// or the values may add up to more than `max_bytes` (the executor then
    /// gives the exact answer or the error).
    ///
    /// With `landing` (an `MGETSHM`), values read from the device that
    /// the log holds aligned are read straight into their places in the
    /// client's memory and answered with their lengths, as
    /// [`Landing::land`] places them; it copies the rest.
    pub async fn mget(
        &self,
        state: &NodeState,
        keys: &[&[u8]],
        max_bytes: usize,
        landing: Option<&Landing>,
    ) -> Option<(Reply, CallTime)> {
        if self.disabled.load(Ordering::Relaxed) {
            return None;
        }
        let clock = Instant::now();
        let starts = state.db.try_get_many(keys).ok()?;
        let mut bytes = 0usize;
        for s in &starts {
            bytes += match s {
                GetStart::Done(v) => v.as_ref().map_or(0, |v| v.len()),
                // The read's length bounds the value's.
                GetStart::Read(_, read) => read.len(),
                GetStart::Blocking => return None,
            };
        }
        if bytes > max_bytes {
            return None;
        }
        let places = landing.map(|to| (to.space(), places_of(to, &starts)));
        let answers = self
            .finish(state, starts.into_iter().map(Some).collect(), places, clock)
            .await;
        let mut items = Vec::with_capacity(answers.len());
        let mut time = CallTime::default();
        for a in answers {
            let (reply, t) = a?;
            items.push(reply);
            time.total += t.total;
            time.device += t.device;
        }
        Some((Reply::Array(items), time))
    }

    /// Completes started GETs: answers those done, queues the device reads
    /// (neighbouring extents as one read, all with one submission) and
    /// waits for them. `None` for a GET that could not start or whose read
    /// failed. With `places`, a value whose place in that memory is given
    /// is read straight into it (where its read allows) and answered with
    /// its length.
    async fn finish(
        &self,
        state: &NodeState,
        starts: Vec<Option<GetStart>>,
        places: Option<Places>,
        clock: Instant,
    ) -> Vec<Option<(Reply, CallTime)>> {
        let place = |i: usize| {
            places
                .as_ref()
                .and_then(|(_, p)| p.get(i).copied().flatten())
        };
        let mut out: Vec<Option<(Reply, CallTime)>> = (0..starts.len()).map(|_| None).collect();
        let mut reads: Vec<Member> = Vec::new();
        for (i, start) in starts.into_iter().enumerate() {
            match start {
                Some(GetStart::Done(value)) => {
                    out[i] = Some((crate::data::get_reply(value), CallTime::default()));
                }
                Some(GetStart::Read(pending, read)) => reads.push((i, pending, read)),
                Some(GetStart::Blocking) | None => {}
            }
        }
        let mut waits = Vec::new();
        {
            let mut queue = self.queue.lock();
            for mut group in neighbours(reads) {
                let (tx, rx) = oneshot::channel();
                if group.len() == 1 {
                    if let Some((i, pending, mut read)) = group.pop() {
                        if let (Some((space, _)), Some(at)) = (&places, place(i)) {
                            read.land_in(Arc::clone(space), at);
                        }
                        if queue.push(read, tx).is_ok() {
                            waits.push(Wait::One(i, pending, rx));
                        }
                    }
                    continue;
                }
                let parts: Vec<&DirectRead> = group.iter().map(|(_, _, r)| r).collect();
                if let Some(mut cover) = DirectRead::covering(&parts) {
                    if let (Some((space, _)), Some(at)) = (&places, lands_together(&group, place)) {
                        cover.land_in(Arc::clone(space), at);
                    }
                    if queue.push(cover, tx).is_ok() {
                        waits.push(Wait::Group(group, rx));
                    }
                }
            }
        }
        let io = Instant::now();
        if !waits.is_empty() {
            self.queued.notify_one();
        }
        // A value read into its place is answered with its length; one
        // that came to be elsewhere (it cannot, but its bytes would be the
        // client's memory) with a copy of it.
        let space_at = |at: usize| {
            places
                .as_ref()
                .map(|(space, _)| space.as_mut_ptr().wrapping_add(at).cast_const())
        };
        let mut landed = 0u64;
        let mut answer = |i: usize, landed_read: bool, value: bytes::Bytes| {
            let reply = match place(i) {
                Some(at) if landed_read && space_at(at) == Some(value.as_ptr()) => {
                    landed += 1;
                    Reply::Integer(value.len() as i64)
                }
                _ if landed_read => Reply::Bulk(bytes::Bytes::copy_from_slice(&value)),
                _ => Reply::Bulk(value),
            };
            out[i] = Some((reply, CallTime::default()));
        };
        for wait in waits {
            match wait {
                Wait::One(i, pending, rx) => {
                    let Ok((read, outcome)) = rx.await else {
                        continue;
                    };
                    let lands = read.lands();
                    if let Some(value) = state.db.finish_get(pending, read, outcome) {
                        answer(i, lands, value);
                    }
                }
                Wait::Group(group, rx) => {
                    // A failed read leaves its GETs to the pool, which
                    // retries them and reports a real error.
                    let Ok((cover, Ok(()))) = rx.await else {
                        continue;
                    };
                    let lands = cover.lands();
                    for (i, pending, mut part) in group {
                        part.fill_from(&cover);
                        if let Some(value) = state.db.finish_get(pending, part, Ok(())) {
                            answer(i, lands, value);
                        }
                    }
                }
            }
        }
        if landed > 0 {
            state
                .counters
                .landed_reads
                .fetch_add(landed, Ordering::Relaxed);
        }
        let served = out.iter().filter(|r| r.is_some()).count();
        if served > 0 {
            let call = CallTime {
                total: clock.elapsed(),
                device: io.elapsed(),
            }
            .share(served);
            state
                .counters
                .net_gets
                .fetch_add(served as u64, Ordering::Relaxed);
            for (_, time) in out.iter_mut().flatten() {
                *time = call;
            }
        }
        out
    }
}

/// A client's memory and where in it each GET's value goes, if it lands
/// there (see [`NetReads::mget`]).
type Places = (Arc<dyn LandingSpace>, Vec<Option<usize>>);

/// A GET waiting for its device read: its index in the request, the
/// engine's half of it, the read.
type Member = (usize, PendingGet, DirectRead);

/// A device read in flight and the GETs it serves.
enum Wait {
    /// A read of one GET's value.
    One(usize, PendingGet, oneshot::Receiver<Finished>),
    /// A read covering several GETs' values (see [`neighbours`]).
    Group(Vec<Member>, oneshot::Receiver<Finished>),
}

/// Where each of an `MGETSHM`'s values lands in the client's memory, by
/// key: as [`Landing::land`] places them (every value in order, by length);
/// `None` for a value that does not land, or that is not read from the
/// device as its read's first bytes (so it could not be read into its
/// place: it is copied there later).
fn places_of(to: &Landing, starts: &[GetStart]) -> Vec<Option<usize>> {
    let mut place = to.placer();
    starts
        .iter()
        .map(|s| match s {
            GetStart::Done(v) => {
                v.as_ref().and_then(|v| place(v.len()));
                None
            }
            GetStart::Read(pending, _) => {
                place(pending.value_len()).filter(|_| pending.value_starts_the_read())
            }
            GetStart::Blocking => None,
        })
        .collect()
}

/// Where a read covering `group` lands so that each member's value is in
/// its place: the first member's place, if every member has one and they
/// lie as far apart in the client's memory as on the device.
fn lands_together(group: &[Member], place: impl Fn(usize) -> Option<usize>) -> Option<usize> {
    let (first, _, first_read) = group.first()?;
    let at = place(*first)?;
    group
        .iter()
        .all(|(i, _, read)| {
            place(*i).is_some_and(|p| {
                p.checked_sub(at).map(|d| d as u64)
                    == read.offset().checked_sub(first_read.offset())
            })
        })
        .then_some(at)
}

/// `reads` in groups of neighbours on one device, each group to be served
/// by one read covering it: values written together (the chunks of one
/// block write, the fields of one record) are read together, as the
/// executor's multi-get reads them.
fn neighbours(mut reads: Vec<Member>) -> Vec<Vec<Member>> {
    reads.sort_by_key(|(_, _, r)| r.offset());
    let mut groups: Vec<Vec<Member>> = Vec::new();
    let mut span = (0u64, 0u64); // the last group's start and end
    for m in reads {
        let (a, z) = (m.2.offset(), m.2.end());
        let joins = groups.last().is_some_and(|g| {
            g[0].2.same_device(&m.2)
                && a <= span.1 + MAX_READ_GAP
                && z.max(span.1) - span.0 <= MAX_MERGED_READ
        });
        match groups.last_mut() {
            Some(g) if joins => {
                span.1 = span.1.max(z);
                g.push(m);
            }
            _ => {
                span = (a, z);
                groups.push(vec![m]);
            }
        }
    }
    groups
}

/// Hands queued reads to the kernel. It runs after the connections that
/// were ready together with the one that queued first (a yield puts it
/// behind them), so their reads start with one system call (and one
/// doorbell of a virtual disk) instead of one each.
async fn flush(reads: Arc<NetReads>) {
    loop {
        reads.queued.notified().await;
        tokio::task::yield_now().await;
        reads.queue.lock().flush();
    }
}

/// Bytes of finished reads handed to their GETs between two looks at the
/// sockets (see [`reap`]).
const DELIVER_BYTES: usize = 256 * 1024;

/// Hands finished reads to the GETs waiting for them, whenever the queue's
/// eventfd signals. Runs until the runtime stops.
///
/// Finished reads are handed out about [`DELIVER_BYTES`] at a time, with a
/// yield between: the runtime looks at its sockets before the next share,
/// so a request that arrived meanwhile starts its device reads before the
/// remaining GETs are checked and answered. Handed out all at once, the
/// reads a burst of requests started together finished together, their
/// checks and replies took the thread for milliseconds, the next requests
/// waited behind them, and the device idled until they came (a 1 MiB
/// sequential read of a mount: device and thread took turns, each idle
/// half the time).
async fn reap(reads: Arc<NetReads>, event: AsyncFd<EventFd>) {
    // Set if polling the eventfd failed: then the queue is checked on a
    // timer instead (slower, but no GET in flight is left waiting).
    let mut polling = false;
    let mut finished: VecDeque<FinishedRead> = VecDeque::new();
    loop {
        if finished.is_empty() {
            wait_for_completions(&reads, &event, &mut polling).await;
        } else {
            tokio::task::yield_now().await;
        }
        finished.extend(reads.queue.lock().reap());
        let share = share_len(
            finished.iter().map(|(_, read, _)| read.len()),
            DELIVER_BYTES,
        );
        for (waiter, read, outcome) in finished.drain(..share) {
            let _ = waiter.send((read, outcome));
        }
    }
}

/// How many of the reads, of `sizes` bytes in order, make the next share
/// handed out: the first ones until they add up to `budget` bytes, at
/// least one (a read larger than the budget goes alone).
fn share_len(sizes: impl Iterator<Item = usize>, budget: usize) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for size in sizes {
        if n > 0 && bytes >= budget {
            break;
        }
        bytes += size;
        n += 1;
    }
    n
}

/// A finished read as the queue gives it back: who waits for it, the read,
/// its outcome.
type FinishedRead = (
    oneshot::Sender<Finished>,
    DirectRead,
    engine::flash::Result<()>,
);

/// Waits until the queue's eventfd signals completions (or, while reads
/// wait to be submitted or the eventfd cannot be polled, a short tick).
async fn wait_for_completions(reads: &NetReads, event: &AsyncFd<EventFd>, polling: &mut bool) {
    let retry = reads.queue.lock().has_unsubmitted();
    let ready = if retry || *polling {
        tokio::time::timeout(RESUBMIT_EVERY, event.readable()).await
    } else {
        Ok(event.readable().await)
    };
    match ready {
        Ok(Ok(mut guard)) => guard.clear_ready(),
        Ok(Err(e)) => {
            if !*polling {
                tracing::error!("read queue poll failed: {e}; GETs go to the executor pool");
                *polling = true;
                reads.disabled.store(true, Ordering::Relaxed);
            }
            tokio::time::sleep(RESUBMIT_EVERY).await;
        }
        Err(_) => {} // the resubmission tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reads of a burst of 1 MiB multi-gets (256 KiB each) are handed
    /// out one at a time, a burst of small GETs' reads a budget's worth at
    /// a time, and a read larger than the budget still goes.
    #[test]
    fn finished_reads_are_handed_out_a_budget_at_a_time() {
        const KIB: usize = 1024;
        let budget = 256 * KIB;
        assert_eq!(share_len([256 * KIB; 16].into_iter(), budget), 1);
        assert_eq!(share_len([8 * KIB; 64].into_iter(), budget), 32);
        assert_eq!(share_len([8 * KIB; 3].into_iter(), budget), 3);
        assert_eq!(share_len([1024 * KIB, 8 * KIB].into_iter(), budget), 1);
        assert_eq!(
            share_len(
                [100 * KIB, 100 * KIB, 100 * KIB, 8 * KIB].into_iter(),
                budget
            ),
            3
        );
        assert_eq!(share_len(std::iter::empty(), budget), 0);
    }
}
