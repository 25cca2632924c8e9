//! Values handed to nodes on this machine through shared memory instead
//! of their sockets.
//!
//! A process that writes large values (the block adapter: every NBD WRITE
//! payload) receives them into a [`Payload`], whose bytes lie in one
//! memory file (`memfd`) per process, the [`Arena`]. A connection to a
//! node over a Unix socket attaches the arena (`SHMATTACH`, answered by
//! the node mapping the file), and from then on a `VSET` whose
//! values lie in the arena goes out as `VSETSHM`: each such value as a
//! 16-byte reference (offset and length) instead of its bytes. The node
//! copies the value once, from its mapping into its log; the socket
//! copies (the client's send, the node's receive) are gone. Reads come
//! back the other way through the same arena (`client::landing`).
//!
//! Contract (what keeps the node from reading bytes the client reused):
//! - The arena is `BLOCKS` blocks of `BLOCK` bytes after a header page
//!   holding a random token (the node checks it, so a reused process id
//!   cannot make it map another process's file). A block is handed out
//!   again only when no [`Payload`] in it and no `Pin` on it is left.
//! - A connection pins every block a request it sent names, and unpins
//!   only when every request it sent was answered: the node has then
//!   finished with them (it answers a `VSETSHM` after its engine copied
//!   the values). A connection dropped with requests unanswered (an error,
//!   a timeout) leaks its pins: the node may still be reading, so those
//!   blocks are never reused; the arena shrinks by them and, once no
//!   block is free, payloads fall back to the heap.
//! - The file is sealed against shrinking and growing before anyone sees
//!   it: a node's mapping can never lose its pages (which would be a
//!   SIGBUS in the node).
//!
//! The arena exists only on Linux and not when `LIGHTSTORE_SHM=off`;
//! without it every value travels through the socket as before.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use protocol::shm::LANDED_ALIGN;
pub use protocol::shm::{MAGIC, REF_LEN};

/// Bytes of one block: the largest payload the arena takes.
pub const BLOCK: usize = 4 << 20;
/// Blocks in the arena.
const BLOCKS: usize = 16;
/// The header page before the blocks: [`MAGIC`] and the token.
const HEADER: usize = 4096;
/// Room in a block is handed out in multiples of this, so every payload
/// and landing range starts aligned for a node's direct reads into it.
const GRANULE: usize = LANDED_ALIGN;
/// Values at least this long are worth a reference.
const MIN_REF_VALUE: usize = 1024;
/// The environment variable that turns the arena off (`off`).
pub const SHM_ENV: &str = "LIGHTSTORE_SHM";

/// One process's shared memory for values (see the module docs).
pub struct Arena {
    base: *mut u8,
    len: usize,
    fd: OwnedFd,
    token: [u8; 16],
    /// Per block: live payloads in it, pins on it, and 1 while it is the
    /// block payloads are being cut from.
    refs: Box<[AtomicU32]>,
    /// The block payloads are cut from and how much of it is used.
    cursor: Mutex<(usize, usize)>,
    /// Whether some node attached it: until then payloads stay on the
    /// heap (a client of remote nodes only never touches the arena).
    attached: AtomicBool,
}

// SAFETY: the mapping is owned by the arena and lives as long as it (the
// process, for the global one). Bytes are written only through a
// `Payload`, which owns its range exclusively; everything else reads, or
// counts references with atomics.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are the mapping made in `Arena::new`; no
        // payload outlives the arena (they borrow it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Arena {
    /// The process's arena, made on first use; `None` when it is off or
    /// the system cannot make one.
    pub fn global() -> Option<&'static Arena> {
        static ARENA: OnceLock<Option<Arena>> = OnceLock::new();
        ARENA
            .get_or_init(|| {
                if std::env::var(SHM_ENV).is_ok_and(|v| v == "off" || v == "0") {
                    return None;
                }
                match Arena::new(BLOCKS) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::debug!("no shared memory for values: {e}");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// A sealed memory file of `blocks` blocks, mapped.
    pub fn new(blocks: usize) -> std::io::Result<Arena> {
        let len = HEADER + blocks * BLOCK;
        let name = c"lightstore-values";
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd.try_clone()?);
        file.set_len(len as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own; the result is checked.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: mapping `len` bytes of a file that is exactly that long
        // and can no longer shrink; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut token = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut token)?;
        let base = base.cast::<u8>();
        // SAFETY: the header page is ours and nothing else refers to it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), base, MAGIC.len());
            std::ptr::copy_nonoverlapping(token.as_ptr(), base.add(MAGIC.len()), token.len());
        }
        let refs = (0..blocks)
            .map(|i| AtomicU32::new(u32::from(i == 0)))
            .collect();
        Ok(Arena {
            base,
            len,
            fd,
            token,
            refs,
            cursor: Mutex::new((0, 0)),
            attached: AtomicBool::new(false),
        })
    }

    /// The arguments of `SHMATTACH` naming this arena: its descriptor in
    /// this process, its size, its token in hex.
    pub fn attach_args(&self) -> [Vec<u8>; 4] {
        let hex: String = self.token.iter().map(|b| format!("{b:02x}")).collect();
        [
            b"SHMATTACH".to_vec(),
            self.fd.as_raw_fd().to_string().into_bytes(),
            self.len.to_string().into_bytes(),
            hex.into_bytes(),
        ]
    }

    /// Records that a node attached it (see [`Payload::with_capacity`]).
    pub(crate) fn note_attached(&self) {
        self.attached.store(true, Ordering::Release);
    }

    /// Blocks no payload or pin holds (the one being cut from counts as held).
    pub fn free_blocks(&self) -> usize {
        self.refs
            .iter()
            .filter(|r| r.load(Ordering::Acquire) == 0)
            .count()
    }

    /// Room for `cap` bytes in one block, or `None` when it is larger than
    /// a block or no block is free: the block (held once more until
    /// [`Arena::release`]) and the room's offset in the arena.
    pub(crate) fn reserve(&self, cap: usize) -> Option<(usize, usize)> {
        let cap = cap.checked_next_multiple_of(GRANULE)?;
        if cap > BLOCK || cap == 0 {
            return None;
        }
        let mut cursor = self.cursor.lock();
        let (block, used) = *cursor;
        if used + cap > BLOCK {
            // A free block other than this one, else this one again when
            // only the cursor holds it.
            let next = (1..=self.refs.len())
                .map(|i| (block + i) % self.refs.len())
                .find(|&b| {
                    let want = if b == block { 1 } else { 0 };
                    self.refs[b]
                        .compare_exchange(want, 1, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })?;
            if next != block {
                self.refs[block].fetch_sub(1, Ordering::AcqRel);
            }
            *cursor = (next, 0);
        }
        let (block, used) = *cursor;
        self.refs[block].fetch_add(1, Ordering::AcqRel);
        cursor.1 = used + cap;
        Some((block, HEADER + block * BLOCK + used))
    }

    /// Pins the block holding `value` if it lies in the arena: its offset
    /// in the arena and the pin.
    pub(crate) fn pin(&'static self, value: &[u8]) -> Option<(u64, Pin)> {
        let at = (value.as_ptr() as usize).checked_sub(self.base as usize + HEADER)?;
        let block = at / BLOCK;
        let last = (at + value.len().max(1) - 1) / BLOCK;
        if block >= self.refs.len() || last != block {
            return None;
        }
        // The caller holds the payload `value` is in, so the block is held
        // and cannot be handed out while this adds to its count.
        self.refs[block].fetch_add(1, Ordering::AcqRel);
        Some(((HEADER + at) as u64, Pin { arena: self, block }))
    }

    /// Pins `block`, which the caller holds (so it cannot be handed out
    /// while this adds to its count).
    pub(crate) fn pin_block(&'static self, block: usize) -> Pin {
        self.refs[block].fetch_add(1, Ordering::AcqRel);
        Pin { arena: self, block }
    }

    /// The start of the mapping.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Lets go of one hold on `block` (a payload's, a pin's, a landed
    /// range's).
    pub(crate) fn release(&self, block: usize) {
        let before = self.refs[block].fetch_sub(1, Ordering::AcqRel);
        assert!(
            before > 0,
            "arena block {block} released more often than held"
        );
    }
}

/// A reference that keeps a block from being reused (see the module docs).
pub(crate) struct Pin {
    arena: &'static Arena,
    block: usize,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.arena.release(self.block);
    }
}

/// A `VSET` rewritten as `VSETSHM mask key version value-or-ref ...`.
pub(crate) struct Rewritten {
    /// `r` where the value goes by reference, `v` where it is inline.
    mask: Vec<u8>,
    refs: Vec<[u8; REF_LEN]>,
}

impl Rewritten {
    /// The rewritten request's arguments, over the original ones.
    pub(crate) fn args<'a, A: AsRef<[u8]>>(&'a self, original: &'a [A]) -> Vec<&'a [u8]> {
        let mut out = Vec::with_capacity(original.len() + 1);
        out.push(&b"VSETSHM"[..]);
        out.push(&self.mask[..]);
        let mut refs = self.refs.iter();
        for (i, a) in original.iter().enumerate().skip(1) {
            let a = a.as_ref();
            if i.is_multiple_of(3) && self.mask[i / 3 - 1] == b'r' {
                let r = refs.next().expect("one reference per `r` in the mask");
                out.push(&r[..]);
            } else {
                out.push(a);
            }
        }
        out
    }
}

/// `args` as a `VSETSHM` when it is a `VSET` with a value in `arena`,
/// pinning the blocks it names into `pins`; `None` to send it as it is.
pub(crate) fn rewrite<A: AsRef<[u8]>>(
    arena: &'static Arena,
    args: &[A],
    pins: &mut Vec<Pin>,
) -> Option<Rewritten> {
    if args.len() < 4 || !(args.len() - 1).is_multiple_of(3) || args[0].as_ref() != b"VSET" {
        return None;
    }
    let mut mask = Vec::with_capacity(args.len() / 3);
    let mut refs = Vec::new();
    // The values: `VSET key version value [key version value ...]`.
    for value in args.iter().skip(3).step_by(3) {
        let a = value.as_ref();
        match (a.len() >= MIN_REF_VALUE).then(|| arena.pin(a)).flatten() {
            Some((offset, pin)) => {
                let mut r = [0u8; REF_LEN];
                r[..8].copy_from_slice(&offset.to_le_bytes());
                r[8..].copy_from_slice(&(a.len() as u64).to_le_bytes());
                refs.push(r);
                mask.push(b'r');
                if pins.last().is_none_or(|p| p.block != pin.block) {
                    pins.push(pin);
                }
            }
            None => mask.push(b'v'),
        }
    }
    (!refs.is_empty()).then_some(Rewritten { mask, refs })
}

/// A buffer for an incoming value, in the process's [`Arena`] when there
/// is room (so it can go to local nodes by reference), else on the heap.
/// Filled by appending; read as a slice.
pub struct Payload {
    at: Place,
    len: usize,
}

enum Place {
    Heap(Vec<u8>),
    Shared {
        arena: &'static Arena,
        start: usize,
        cap: usize,
    },
}

impl Payload {
    /// An empty payload with room for `cap` bytes: in the process's arena
    /// when a node attached it and it has a free block, else on the heap.
    pub fn with_capacity(cap: usize) -> Payload {
        let arena = Arena::global().filter(|a| a.attached.load(Ordering::Acquire));
        Self::in_arena(arena, cap)
    }

    /// An empty payload with no room, on the heap (no allocation).
    pub fn empty() -> Payload {
        Self::in_arena(None, 0)
    }

    /// An empty payload with room for `cap` bytes in `arena` if it has
    /// room, else on the heap.
    pub fn in_arena(arena: Option<&'static Arena>, cap: usize) -> Payload {
        let at = match arena.and_then(|a| a.reserve(cap).map(|r| (a, r))) {
            Some((arena, (_, start))) => Place::Shared { arena, start, cap },
            None => Place::Heap(Vec::with_capacity(cap)),
        };
        Payload { at, len: 0 }
    }

    /// Whether its bytes lie in shared memory.
    pub fn is_shared(&self) -> bool {
        matches!(self.at, Place::Shared { .. })
    }

    /// Bytes in it.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends bytes.
    ///
    /// # Panics
    /// When they do not fit in the capacity it was made with.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let wrote = self.append_with(n, |spare| {
            // SAFETY: `spare` is `n` bytes long (`append_with`'s `want`)
            // and cannot overlap `bytes`, which the caller borrows.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), spare.as_mut_ptr().cast(), n) };
            Ok::<_, std::convert::Infallible>(n)
        });
        assert!(matches!(wrote, Ok(w) if w == n), "payload overflow");
    }

    /// Appends what `fill` writes into the first `want` bytes of the spare
    /// room it is given (at most `want`, and never more than it has room
    /// for), returning how many it wrote; a `fill` error is returned.
    ///
    /// # Panics
    /// When `want` exceeds the room left or `fill` claims more than it was
    /// given.
    pub fn append_with<E>(
        &mut self,
        want: usize,
        fill: impl FnOnce(&mut [MaybeUninit<u8>]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let spare: &mut [MaybeUninit<u8>] = match &mut self.at {
            Place::Heap(v) => {
                debug_assert_eq!(v.len(), self.len);
                &mut v.spare_capacity_mut()[..want]
            }
            Place::Shared { arena, start, cap } => {
                assert!(self.len + want <= *cap, "payload overflow");
                // SAFETY: `start..start + cap` lies in the mapping and
                // belongs to this payload alone (`Arena::reserve`); no
                // other reference to it exists while `self` is borrowed
                // mutably. Its bytes are initialized (file memory).
                unsafe {
                    std::slice::from_raw_parts_mut(
                        arena.base.add(*start + self.len).cast::<MaybeUninit<u8>>(),
                        want,
                    )
                }
            }
        };
        let n = fill(spare)?;
        assert!(n <= want, "fill claimed more bytes than it was given");
        if let Place::Heap(v) = &mut self.at {
            // SAFETY: `fill` initialized the first `n <= want` spare bytes.
            unsafe { v.set_len(v.len() + n) };
        }
        self.len += n;
        Ok(n)
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.at {
            Place::Heap(v) => v,
            // SAFETY: the first `len` bytes of the payload's range were
            // written by `append_with`; the range is this payload's.
            Place::Shared { arena, start, .. } => unsafe {
                std::slice::from_raw_parts(arena.base.add(*start), self.len)
            },
        }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        if let Place::Shared { arena, start, .. } = self.at {
            arena.release((start - HEADER) / BLOCK);
        }
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena(blocks: usize) -> &'static Arena {
        Box::leak(Box::new(Arena::new(blocks).expect("memfd")))
    }

    #[test]
    fn payloads_reuse_a_block_only_when_nothing_holds_it() {
        let a = arena(2);
        let p1 = Payload::in_arena(Some(a), BLOCK - 64);
        assert!(p1.is_shared());
        let p2 = Payload::in_arena(Some(a), BLOCK);
        assert!(p2.is_shared(), "second block");
        // Both blocks held: the next payload goes to the heap.
        assert!(!Payload::in_arena(Some(a), 4096).is_shared());
        let mut pins = Vec::new();
        let mut v = Payload::in_arena(None, 4096);
        v.extend_from_slice(&[7; 4096]);
        drop(p1);
        // Block 0 is free again, but a pin on block 1 keeps block 1.
        let (_, pin) = a.pin(&p2[..0]).expect("in the arena");
        pins.push(pin);
        drop(p2);
        let p3 = Payload::in_arena(Some(a), BLOCK);
        assert!(p3.is_shared());
        assert!(
            !Payload::in_arena(Some(a), 64).is_shared(),
            "block 1 pinned"
        );
        drop(pins);
        drop(p3);
        assert!(Payload::in_arena(Some(a), 64).is_shared());
    }

    #[test]
    fn a_leaked_pin_keeps_its_block_for_good() {
        let a = arena(1);
        let mut p = Payload::in_arena(Some(a), 8192);
        p.extend_from_slice(&[1; 8192]);
        let mut pins = Vec::new();
        let args: Vec<&[u8]> = vec![b"VSET", b"k", b"1", &p[..]];
        let rw = rewrite(a, &args, &mut pins).expect("rewritten");
        assert_eq!(rw.mask, b"r");
        std::mem::forget(pins);
        drop(p);
        // The block's rest is still cut from, but it never starts over.
        assert!(Payload::in_arena(Some(a), 64).is_shared());
        assert!(!Payload::in_arena(Some(a), BLOCK).is_shared());
        assert_eq!(a.free_blocks(), 0);
    }

    #[test]
    fn rewrite_names_arena_values_and_keeps_the_rest() {
        let a = arena(1);
        let mut p = Payload::in_arena(Some(a), 16 << 10);
        for i in 0..(16 << 10) {
            p.extend_from_slice(&[(i % 251) as u8]);
        }
        let heap = vec![9u8; 4096];
        let args: Vec<&[u8]> = vec![
            b"VSET",
            b"a",
            b"1",
            &p[4096..8192],
            b"b",
            b"2",
            &heap,
            b"c",
            b"3",
            b"short",
        ];
        let mut pins = Vec::new();
        let rw = rewrite(a, &args, &mut pins).expect("rewritten");
        assert_eq!(rw.mask, b"rvv");
        assert_eq!(pins.len(), 1);
        let out = rw.args(&args);
        assert_eq!(out.len(), args.len() + 1);
        assert_eq!(out[0], b"VSETSHM");
        assert_eq!(out[1], b"rvv");
        assert_eq!(out[2], b"a");
        let off = u64::from_le_bytes(out[4][..8].try_into().unwrap()) as usize;
        let len = u64::from_le_bytes(out[4][8..].try_into().unwrap()) as usize;
        assert_eq!(len, 4096);
        // SAFETY: reading the test's own mapping within its length.
        let named = unsafe { std::slice::from_raw_parts(a.base.add(off), len) };
        assert_eq!(named, &p[4096..8192]);
        assert_eq!(out[7], &heap[..]);
        assert_eq!(out[10], b"short");
        // Not a VSET, or no value in the arena: unchanged.
        assert!(rewrite(a, &[&b"GET"[..], b"a"], &mut pins).is_none());
        assert!(rewrite(a, &[&b"VSET"[..], b"a", b"1", &heap], &mut pins).is_none());
    }

    #[test]
    fn heap_payloads_fill_like_shared_ones() {
        for arena in [None, Some(arena(1))] {
            let mut p = Payload::in_arena(arena, 100);
            p.extend_from_slice(b"hello ");
            let n = p
                .append_with(50, |spare| {
                    spare[..5].iter_mut().zip(b"world").for_each(|(d, s)| {
                        d.write(*s);
                    });
                    Ok::<_, ()>(5)
                })
                .unwrap();
            assert_eq!(n, 5);
            assert_eq!(&p[..], b"hello world");
            assert_eq!(p.is_shared(), arena.is_some());
        }
    }
}
