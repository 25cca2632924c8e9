//! The shared-memory contract between a cluster client and a node on the
//! same machine (`SHMATTACH`, `VSETSHM`, `MGETSHM`): what the client's
//! memory starts with, how a value in it is named, and where the values of
//! an `MGETSHM` go. The client's side is `client::shm` and
//! `client::landing`, the node's `server::shm`; both take these from here
//! so the two cannot drift apart.

/// The first bytes of a client's shared memory (the token follows).
pub const MAGIC: &[u8; 8] = b"LSSHM1\0\0";
/// Bytes of a value's reference in a `VSETSHM` (offset and length, both
/// little-endian `u64`).
pub const REF_LEN: usize = 16;
/// Values at least this long land in the client's memory (`MGETSHM`);
/// shorter ones travel in the reply.
pub const MIN_LANDED: usize = 1024;
/// Each landed value takes its length rounded up to this, from a multiple
/// of it: the direct-read granularity of a node's device, so a node can
/// read a value straight into its place.
pub const LANDED_ALIGN: usize = 512;
/// What a node that can write the client's memory (and so takes
/// `MGETSHM`) answers `SHMATTACH`; one that cannot answers `+OK`.
pub const ATTACHED_WRITABLE: &str = "OK MGETSHM";

/// Where the values of one `MGETSHM` go in its range of `capacity` bytes:
/// one after another in reply order, each taking its length rounded up to
/// [`LANDED_ALIGN`], while they fit. The node places by it; the client
/// finds each landed value by it.
#[derive(Debug)]
pub struct Placement {
    used: usize,
    capacity: usize,
}

impl Placement {
    /// The placement of an empty range of `capacity` bytes.
    pub fn new(capacity: usize) -> Placement {
        Placement { used: 0, capacity }
    }

    /// Where in the range (from its start) the next value, of `len` bytes,
    /// lands; `None` when it does not (shorter than [`MIN_LANDED`], or no
    /// room left). Asked for every value of the reply in order.
    pub fn place(&mut self, len: usize) -> Option<usize> {
        if len < MIN_LANDED {
            return None;
        }
        let room = len.checked_next_multiple_of(LANDED_ALIGN)?;
        if self.used.checked_add(room)? > self.capacity {
            return None;
        }
        let at = self.used;
        self.used += room;
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_one_after_another_in_granules_while_they_fit() {
        let mut p = Placement::new(3100);
        assert_eq!(p.place(1500), Some(0));
        assert_eq!(p.place(100), None, "short values stay in the reply");
        assert_eq!(p.place(1100), Some(1536));
        assert_eq!(p.place(1100), None, "3072 + 1536 > 3100");
        assert_eq!(p.place(usize::MAX), None);
        let mut exact = Placement::new(2 * 4608);
        assert_eq!(exact.place(4106), Some(0));
        assert_eq!(exact.place(4106), Some(4608));
        assert_eq!(exact.place(4106), None);
    }
}
