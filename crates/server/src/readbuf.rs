//! A connection's read buffer and its share of request memory: how much
//! room each read gets, when a buffer is replaced, what the connection is
//! charged for (see [`crate::budget`]), and the wait for that charge.
//!
//! Reads within the 256 KiB allowance reuse the buffer's own allocation or
//! get a new one of exactly the room asked; a large pending value gets one
//! buffer of its size, and only once the budget allows it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
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
pub(crate) fn make_small_room(
    rbuf: &mut BytesMut,
    room: usize,
    parser: &RequestParser,
    abandoned: &mut usize,
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
    *rbuf = exact_copy(rbuf, room);
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
pub(crate) fn shrink_read_buffer(rbuf: &mut BytesMut, room: usize) {
    if rbuf.capacity() > ALLOWANCE && rbuf.len() + room <= ALLOWANCE {
        *rbuf = exact_copy(rbuf, room);
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
