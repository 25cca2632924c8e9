//! A connection's read buffer and its share of request memory: how much
//! room each read gets, when a buffer is replaced, what the connection is
//! charged for (see [`crate::budget`]), and the wait for that charge.
//!
//! Reads within the 256 KiB allowance reuse the buffer's own allocation or
//! get a new one of exactly the room asked; a large pending value gets one
//! buffer of its size, and only once the budget allows it. A small buffer
//! replaced while values still share it is kept node-wide ([`Retired`])
//! and reused once they are gone.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use protocol::{Reply, RequestParser};

use crate::budget::{Grant, Hold, ALLOWANCE};
use crate::state::NodeState;

/// Bytes read per `read` call at first (more when a large bulk string is
/// pending).
pub(crate) const READ_CHUNK: usize = 64 << 10;
/// Most bytes read per `read` call when no large value is pending: the read
/// size doubles from [`READ_CHUNK`] while reads fill it, staying within the
/// connection's free [`ALLOWANCE`] with room for a partial request.
pub(crate) const MAX_READ_ROOM: usize = 192 << 10;
/// Least room a read is given.
pub(crate) const MIN_ROOM: usize = 16 << 10;

/// Makes room for `room` more bytes in `rbuf` (a small read): in its own
/// allocation if that is free, else in a new one of exactly that size. The
/// old allocation lives on while arguments of the request in progress
/// share it, its spare room wasted (`abandoned`): once that waste exceeds
/// what the request itself holds, reads go to the spare room as it is (if
/// at least [`MIN_ROOM`]), so a client sending one tiny argument per packet
/// cannot pin a buffer per argument while it is charged for bytes.
///
/// `poolable` says whether `rbuf`'s allocation may go to `pool` when
/// replaced: false for a large value's buffer (of any size up to the
/// largest request) and for any allocation over [`ALLOWANCE`], which the
/// pool must not keep; set for the replacement.
pub(crate) fn make_small_room(
    rbuf: &mut BytesMut,
    room: usize,
    parser: &RequestParser,
    abandoned: &mut usize,
    (pool, poolable): (&Retired, &mut bool),
) {
    if rbuf.try_reclaim(room) {
        return;
    }
    let spare = rbuf.capacity() - rbuf.len();
    if parser.request_bytes() > 0 {
        if *abandoned > parser.request_bytes() && spare >= MIN_ROOM {
            return;
        }
        *abandoned += spare;
    }
    let mut fresh = pool
        .reuse(rbuf.len() + room)
        .unwrap_or_else(|| BytesMut::with_capacity(rbuf.len() + room));
    fresh.extend_from_slice(rbuf);
    // A buffer's capacity is its whole allocation only while it is fresh:
    // decide now whether the pool may keep it later.
    let fresh_is_small = fresh.capacity() <= ALLOWANCE;
    let old = std::mem::replace(rbuf, fresh);
    if *poolable {
        pool.keep(old);
    }
    *poolable = fresh_is_small;
}

/// Most read buffers [`RETIRED`] keeps: with allocations of at most
/// [`ALLOWANCE`] (see `poolable` in [`make_small_room`]), 16 MiB for the
/// whole node, outside the request budget.
const MAX_RETIRED: usize = 64;

/// The node's retired read buffers.
pub(crate) static RETIRED: Retired = Retired::new(MAX_RETIRED);

/// Read buffers that connections replaced while the values of their
/// requests still shared them (values wait in the memtable and the log's
/// queue until written), kept to be reused once those values are gone.
/// Dropped instead, each went back to the allocator, which under a stream
/// of large writes handed out fresh memory for the next buffer, faulted in
/// and cleared: the largest source of a growing node's page faults
/// (session 35 in `bench/RESULTS.md`). Oldest first; the oldest is let go
/// when full.
pub(crate) struct Retired {
    buffers: Mutex<VecDeque<BytesMut>>,
    max: usize,
}

impl Retired {
    pub(crate) const fn new(max: usize) -> Self {
        Self {
            buffers: Mutex::new(VecDeque::new()),
            max,
        }
    }

    /// Keeps `old` (emptied) for reuse, if it is small enough to pool. Its
    /// capacity is what follows its own start, not its whole allocation:
    /// callers give only buffers they know were allocated small.
    pub(crate) fn keep(&self, mut old: BytesMut) {
        if old.capacity() > ALLOWANCE {
            return;
        }
        old.clear();
        let mut buffers = self.buffers.lock();
        if buffers.len() >= self.max {
            buffers.pop_front();
        }
        buffers.push_back(old);
    }

    /// An empty buffer with room for `room` bytes, if one is kept: its own
    /// spare room (past values that may still share the allocation) when
    /// that is enough, else its whole allocation once nothing shares it.
    pub(crate) fn reuse(&self, room: usize) -> Option<BytesMut> {
        let mut buffers = self.buffers.lock();
        let found = buffers.iter_mut().position(|b| b.try_reclaim(room))?;
        buffers.remove(found)
    }
}

/// A new buffer holding `rbuf`'s bytes with room for exactly `room` more.
pub(crate) fn exact_copy(rbuf: &BytesMut, room: usize) -> BytesMut {
    let mut grown = BytesMut::with_capacity(rbuf.len() + room);
    grown.extend_from_slice(rbuf);
    grown
}

/// Replaces a read buffer grown past [`ALLOWANCE`] once what it holds and
/// the next read fit under it: after a large value the buffer (or, through
/// `try_reclaim`, the value's whole allocation) would otherwise stay with
/// the connection, and on the budget, while it idles.
/// The new buffer may go to the pool later (`poolable`).
pub(crate) fn shrink_read_buffer(rbuf: &mut BytesMut, room: usize, poolable: &mut bool) {
    if rbuf.capacity() > ALLOWANCE && rbuf.len() + room <= ALLOWANCE {
        *rbuf = exact_copy(rbuf, room);
        *poolable = rbuf.capacity() <= ALLOWANCE;
    }
}

/// What a connection holds once `want` more bytes fit its read buffer: the
/// buffer, or the request in progress (its arguments read and the one
/// pending), whichever is more.
pub(crate) fn read_charge(rbuf: &BytesMut, parser: &RequestParser, want: usize) -> usize {
    rbuf.capacity()
        .max(rbuf.len() + want)
        .max(parser.request_bytes())
}

/// How [`take_request_memory`] ended.
pub(crate) enum Taken {
    Yes,
    /// The node is stopping.
    Stopped,
    /// Refused: this error goes to the client, then the connection closes.
    No(Reply),
}

/// Makes `hold` cover `holds` bytes, of which `read` are read already,
/// waiting (bounded by `request_memory_wait_ms`) while other connections
/// hold the budget; see [`crate::budget`].
pub(crate) async fn take_request_memory(
    state: &NodeState,
    hold: &mut Hold,
    holds: usize,
    read: usize,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Taken {
    let budget = &state.request_budget;
    let refused = |hold: &mut Hold, why: String| {
        hold.release();
        budget.refusals.fetch_add(1, Ordering::Relaxed);
        Taken::No(Reply::Error(format!(
            "ERR request memory exhausted: {why} max-request-memory ({} bytes); send large requests one at a time or retry later",
            budget.limit()
        )))
    };
    match hold.adjust(holds, read) {
        Grant::Granted => return Taken::Yes,
        Grant::Refused => {
            return refused(hold, "this request needs more than is left of".into());
        }
        Grant::Wait => {}
    }
    budget.waits.fetch_add(1, Ordering::Relaxed);
    let limit = Duration::from_millis(state.config.request_memory_wait_ms);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let freed = budget.freed();
        tokio::pin!(freed);
        // Registered before the attempt, so no wake-up is lost.
        freed.as_mut().enable();
        if hold.adjust(holds, read) == Grant::Granted {
            return Taken::Yes;
        }
        tokio::select! {
            _ = freed => {}
            _ = tokio::time::sleep_until(deadline) => {
                return refused(
                    hold,
                    format!("waited {} ms for other clients' requests to leave room in", limit.as_millis()),
                );
            }
            _ = stop.changed() => return Taken::Stopped,
        }
    }
}

#[cfg(test)]
mod retired_tests {
    use super::*;

    /// A kept buffer comes back for more room than its own spare only once
    /// no value shares it, in the same allocation, empty.
    #[test]
    fn a_retired_buffer_is_reused_once_its_values_are_gone() {
        let retired = Retired::new(2);
        let mut buf = BytesMut::with_capacity(4096);
        buf.extend_from_slice(b"value bytes");
        let start = buf.as_ptr();
        let value = buf.split_to(5).freeze();
        retired.keep(buf);
        // Its own spare room is smaller than the whole allocation.
        assert!(retired.reuse(4096).is_none(), "a value still shares it");
        drop(value);
        let again = retired.reuse(4096).expect("reused once the value is gone");
        assert_eq!(again.as_ptr(), start, "the same allocation, from its start");
        assert!(again.is_empty() && again.capacity() >= 4096);
        assert!(retired.reuse(1).is_none(), "taken out of the pool");
    }

    /// A replaced read buffer goes to the pool unless it was a large
    /// value's, and its replacement may go later.
    #[test]
    fn only_small_buffers_are_retired() {
        let pool = Retired::new(4);
        let parser = RequestParser::new(protocol::Limits::default());
        let mut abandoned = 0;
        let mut large = BytesMut::with_capacity(64);
        let mut poolable = false; // as if a large value's buffer
        make_small_room(
            &mut large,
            4096,
            &parser,
            &mut abandoned,
            (&pool, &mut poolable),
        );
        assert!(
            pool.buffers.lock().is_empty(),
            "a large value's buffer is not kept"
        );
        assert!(poolable, "its replacement is small");
        let mut small = BytesMut::with_capacity(64);
        make_small_room(
            &mut small,
            4096,
            &parser,
            &mut abandoned,
            (&pool, &mut poolable),
        );
        assert_eq!(pool.buffers.lock().len(), 1, "a small buffer is kept");
    }

    /// The pool holds at most its bound (the oldest goes) and no buffer
    /// larger than the allowance.
    #[test]
    fn the_pool_is_bounded() {
        let retired = Retired::new(2);
        retired.keep(BytesMut::with_capacity(ALLOWANCE + 1));
        assert!(retired.reuse(1).is_none(), "large buffers are not kept");
        for _ in 0..3 {
            retired.keep(BytesMut::with_capacity(1024));
        }
        assert_eq!(retired.buffers.lock().len(), 2);
    }
}
