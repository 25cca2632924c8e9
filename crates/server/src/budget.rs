//! The node-wide bound on bytes held by requests still being read.
//!
//! Each connection may hold up to [`ALLOWANCE`] bytes of read buffer and
//! request in progress for free; what it holds beyond that is taken from one
//! shared [`RequestBudget`]. Without it, every connection could hold a
//! request up to `max_request` bytes while its client trickles the rest,
//! and `maxclients` such connections would exhaust memory.
//!
//! Invariant (no two connections wait on each other): only a connection
//! holding nothing waits for the budget. One that has already read more
//! than its allowance of a request and needs more is refused instead
//! ([`Grant::Refused`]), so every holder can always finish its request with
//! what it has or give it back, and every waiter is woken when a holder
//! gives bytes back. Waiters are all woken at once and race for the bytes
//! (no queue): a large request may wait behind a stream of smaller ones,
//! up to the node's wait bound.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Bytes per connection not taken from the budget: normal requests and
/// read buffers stay under it and never touch the shared counter.
pub const ALLOWANCE: usize = 256 << 10;

/// The shared budget.
#[derive(Debug)]
pub struct RequestBudget {
    limit: usize,
    used: AtomicUsize,
    /// Woken whenever bytes are given back.
    freed: Notify,
    /// Times a connection waited for the budget (counted by the caller).
    pub waits: AtomicU64,
    /// Connections refused more bytes in the middle of a request (counted
    /// by the caller).
    pub refusals: AtomicU64,
    /// Connections closed for sending nothing while holding budget
    /// (counted by the caller).
    pub stalls: AtomicU64,
}

/// What [`Hold::adjust`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Grant {
    /// The connection may read.
    Granted,
    /// The connection holds nothing and must wait for bytes to be given back.
    Wait,
    /// The connection holds part of a request and cannot get the rest.
    Refused,
}

impl RequestBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(RequestBudget {
            limit,
            used: AtomicUsize::new(0),
            freed: Notify::new(),
            waits: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
        })
    }

    /// The bound in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes if they fit under the limit.
    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Gives `n` bytes back and wakes every waiter.
    fn give_back(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }

    /// Resolves once bytes are given back after this call began (call it
    /// before the failed attempt it waits after, so no wake-up is lost).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }
}

/// One connection's share of the budget; given back when dropped.
#[derive(Debug)]
pub struct Hold {
    budget: Arc<RequestBudget>,
    held: usize,
}

impl Hold {
    /// A connection holding nothing yet.
    pub fn new(budget: Arc<RequestBudget>) -> Self {
        Hold { budget, held: 0 }
    }

    /// Bytes taken from the budget.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Makes the share match a connection that will hold `bytes` (its read
    /// buffer and request in progress) of which `read` are in memory already
    /// (the request's arguments read so far and the buffer's contents):
    /// gives back what it no longer needs, or takes what it lacks if the
    /// budget allows. If it does not, a connection with no more than
    /// [`ALLOWANCE`] read gives its whole share back and waits (what it held
    /// was for bytes not read yet); one with more read is refused.
    pub fn adjust(&mut self, bytes: usize, read: usize) -> Grant {
        // A lone request never needs more than the whole budget (its buffer
        // may overshoot it by a few bytes of slack).
        let need = bytes.saturating_sub(ALLOWANCE).min(self.budget.limit);
        if need <= self.held {
            self.budget.give_back(self.held - need);
            self.held = need;
            return Grant::Granted;
        }
        if self.budget.try_take(need - self.held) {
            self.held = need;
            return Grant::Granted;
        }
        if read <= ALLOWANCE {
            self.release();
            Grant::Wait
        } else {
            Grant::Refused
        }
    }

    /// Lowers the share to what `bytes` need, never raising it.
    pub fn lower_to(&mut self, bytes: usize) {
        let need = bytes.saturating_sub(ALLOWANCE);
        if need < self.held {
            self.budget.give_back(self.held - need);
            self.held = need;
        }
    }

    /// Gives the whole share back.
    pub fn release(&mut self) {
        self.budget.give_back(self.held);
        self.held = 0;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn small_connections_never_touch_the_budget() {
        let budget = RequestBudget::new(MIB);
        let mut a = Hold::new(budget.clone());
        assert_eq!(a.adjust(ALLOWANCE, ALLOWANCE), Grant::Granted);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn connections_that_read_part_of_a_request_are_refused_others_wait() {
        let budget = RequestBudget::new(2 * MIB);
        let mut a = Hold::new(budget.clone());
        let mut b = Hold::new(budget.clone());
        assert_eq!(a.adjust(ALLOWANCE + MIB, 0), Grant::Granted);
        assert_eq!(b.adjust(ALLOWANCE + MIB, 0), Grant::Granted);
        assert_eq!(budget.used(), 2 * MIB);
        // `a` has read a megabyte of its request: refused, never waits on `b`.
        assert_eq!(a.adjust(ALLOWANCE + 2 * MIB, MIB), Grant::Refused);
        assert_eq!(a.held(), MIB);
        // Having read nothing yet, `a` gives its share back and waits.
        assert_eq!(a.adjust(ALLOWANCE + 2 * MIB, 0), Grant::Wait);
        assert_eq!(a.held(), 0);
        assert_eq!(budget.used(), MIB);
        let mut c = Hold::new(budget.clone());
        assert_eq!(c.adjust(ALLOWANCE + MIB + 1, 0), Grant::Wait);
        // `b` finishes its request: `c` fits now.
        b.lower_to(0);
        assert_eq!(c.adjust(ALLOWANCE + MIB, 0), Grant::Granted);
        c.lower_to(ALLOWANCE + MIB / 2);
        assert_eq!(c.held(), MIB / 2);
        c.lower_to(ALLOWANCE + MIB);
        assert_eq!(c.held(), MIB / 2, "lower_to never raises");
        drop(c);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_waiter_is_woken_when_bytes_are_given_back() {
        let budget = RequestBudget::new(MIB);
        let mut a = Hold::new(budget.clone());
        assert_eq!(a.adjust(ALLOWANCE + MIB, 0), Grant::Granted);
        let waiter = {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut c = Hold::new(budget.clone());
                loop {
                    let freed = budget.freed();
                    tokio::pin!(freed);
                    // Registered before the attempt, so no wake-up is lost.
                    freed.as_mut().enable();
                    match c.adjust(ALLOWANCE + MIB, 0) {
                        Grant::Granted => return c.held(),
                        Grant::Wait => freed.await,
                        Grant::Refused => return 0,
                    }
                }
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(a);
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(held, MIB);
    }
}
