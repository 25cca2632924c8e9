//! Values a client on this machine hands over in its shared memory instead
//! of the socket (the node's side of `client::shm`).
//!
//! `SHMATTACH fd size token` (Unix socket connections only): the node opens
//! descriptor `fd` of the connection's peer process (its pid from the
//! socket's credentials, never from the client) through `/proc`, checks
//! that it is a memory file of `size` bytes sealed against shrinking (so
//! the mapping can never lose pages under the node: no SIGBUS), maps it
//! (read-write if it can open it so, else read-only) and checks that its
//! header holds `LSSHM1` and `token` (hex),
//! which only the process that made it knows. The mapping belongs to the
//! connection: it is dropped with it (and unmapped when the last value
//! sliced from it is gone).
//!
//! `VSETSHM mask key version value-or-ref [key version value-or-ref ...]`
//! is a `VSET` whose values, where `mask` has an `r`, are 16-byte
//! references (offset and length, little-endian `u64`) into the attached
//! memory, and where it has a `v`, are the values themselves. The node
//! turns it into that `VSET` with the values sliced from the mapping; the
//! engine copies them into its log and checksums the copy, so a client
//! changing the memory meanwhile can only spoil its own write. The reply
//! (VSET's) is sent after the copy, so a client may reuse the memory once
//! it has read the reply.
//!
//! `MGETSHM offset capacity key [key ...]` is an `MGET` whose values land
//! in the client's memory instead of the reply: the node writes each value
//! of at least [`protocol::shm::MIN_LANDED`] bytes into `offset..offset +
//! capacity`, one after another, each taking its length rounded up to
//! [`LANDED_ALIGN`], while they fit ([`Placement`]), and answers that
//! value with its length (an integer);
//! shorter values, values that no longer fit and missing keys are answered
//! as `MGET` would (bulk string, null). The client finds value `i` where
//! the lengths before it put it. Values the network thread reads from the
//! device land there straight from the device (see `netread`); the rest
//! are copied. The node writes there only before it replies, and never
//! into the header page. A node that could map the memory only read-only
//! (a file not opened for writing) answers `SHMATTACH` with `+OK` and
//! refuses `MGETSHM`; one that can write it answers `+OK MGETSHM`.
//!
//! The client's memory is treated as volatile on both paths: the node
//! copies out of it and checksums its own copy (`VSETSHM`), or puts values
//! into it and reads back only what it checks against the values'
//! checksums (`MGETSHM`), so a client writing the same bytes meanwhile
//! spoils only its own request.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::Bytes;
use protocol::shm::{Placement, LANDED_ALIGN, MAGIC, REF_LEN};
use protocol::Reply;

/// Bytes of a token.
const TOKEN_LEN: usize = 16;
/// The largest shared memory a connection may attach.
const MAX_SIZE: usize = 1 << 32;
/// The client's header page: never written by `MGETSHM`.
const HEADER_PAGE: usize = 4096;
// Landed values are read from the device straight into their places:
// their granule must be one of direct reads too.
const _: () = assert!(LANDED_ALIGN.is_multiple_of(engine::flash::READ_ALIGN));

/// A client's shared memory, mapped (read-write when the node could open
/// it for writing).
pub struct Mapping {
    base: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: a mapping owned by this value, unmapped only when it is dropped
// (after every slice of it, and every read landing in it, which hold an
// `Arc`). The node writes it only for an `MGETSHM` (`Landing::land`, and
// device reads `netread` lands there), into ranges the client handed over.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `attach`, no longer referenced.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("len", &self.len).finish()
    }
}

impl Mapping {
    /// Whether `MGETSHM` may write into it.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Bytes `off..off + len`, if they lie in the mapping.
    fn slice(self: &Arc<Self>, off: u64, len: u64) -> Option<Bytes> {
        let off = usize::try_from(off).ok()?;
        let len = usize::try_from(len).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        Some(Bytes::from_owner(Slice {
            map: self.clone(),
            off,
            len,
        }))
    }
}

/// Part of a mapping, as the owner of a `Bytes`.
struct Slice {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `off + len <= map.len` (checked in `Mapping::slice`) and
        // the mapping lives as long as `map`.
        unsafe { std::slice::from_raw_parts(self.map.base.add(self.off), self.len) }
    }
}

fn err(msg: impl std::fmt::Display) -> Reply {
    Reply::Error(format!("ERR {msg}"))
}

/// `SHMATTACH fd size token` from the peer process `peer` (`None`: not a
/// Unix socket connection).
pub fn attach(peer: Option<u32>, args: &[Bytes]) -> Result<Arc<Mapping>, Reply> {
    let [_, fd, size, token] = args else {
        return Err(err("wrong number of arguments for 'shmattach' command"));
    };
    let Some(pid) = peer else {
        return Err(err("SHMATTACH needs a Unix socket connection"));
    };
    let number = |b: &Bytes| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
    let (Some(fd), Some(size)) = (number(fd), number(size)) else {
        return Err(err("SHMATTACH fd and size must be unsigned integers"));
    };
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    if size < MAGIC.len() + TOKEN_LEN || size > MAX_SIZE {
        return Err(err(format!("SHMATTACH size {size} out of range")));
    }
    let Some(token) = from_hex(token) else {
        return Err(err("SHMATTACH token must be 32 hex digits"));
    };
    let path = format!("/proc/{pid}/fd/{fd}");
    let (file, writable) = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => (f, true),
        Err(_) => (
            std::fs::File::open(&path)
                .map_err(|e| err(format!("cannot open the client's memory: {e}")))?,
            false,
        ),
    };
    let len = file
        .metadata()
        .map_err(|e| err(format!("cannot stat the client's memory: {e}")))?
        .len();
    if len != size as u64 {
        return Err(err(format!(
            "the client's memory is {len} bytes, not {size}"
        )));
    }
    // SAFETY: fcntl on a descriptor this function owns; checked below.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(err(
            "the client's memory is not a memory file sealed against shrinking",
        ));
    }
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: mapping `size` bytes of a file that is that long and cannot
    // shrink, as it was opened; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        return Err(err(format!("cannot map the client's memory: {e}")));
    }
    let map = Arc::new(Mapping {
        base: base.cast::<u8>(),
        len: size,
        writable,
    });
    let header = map.slice(0, (MAGIC.len() + TOKEN_LEN) as u64);
    let ok = header.is_some_and(|h| h[..MAGIC.len()] == MAGIC[..] && h[MAGIC.len()..] == token);
    if !ok {
        return Err(err("the client's memory does not hold its token"));
    }
    Ok(map)
}

fn from_hex(s: &[u8]) -> Option<[u8; TOKEN_LEN]> {
    if s.len() != 2 * TOKEN_LEN {
        return None;
    }
    let mut out = [0u8; TOKEN_LEN];
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The `VSET` a `VSETSHM` stands for, its values sliced from `map`.
pub fn resolve(map: Option<&Arc<Mapping>>, args: Vec<Bytes>) -> Result<Vec<Bytes>, Reply> {
    let Some(map) = map else {
        return Err(err("VSETSHM without SHMATTACH on this connection"));
    };
    let (Some(mask), rest) = (args.get(1), args.get(2..).unwrap_or_default()) else {
        return Err(err("wrong number of arguments for 'vsetshm' command"));
    };
    if rest.is_empty() || rest.len() != 3 * mask.len() {
        return Err(err("wrong number of arguments for 'vsetshm' command"));
    }
    let mut out = Vec::with_capacity(rest.len() + 1);
    out.push(Bytes::from_static(b"VSET"));
    for (triple, how) in rest.chunks_exact(3).zip(mask.iter()) {
        out.push(triple[0].clone());
        out.push(triple[1].clone());
        let value = match how {
            b'v' => triple[2].clone(),
            b'r' if triple[2].len() == REF_LEN => {
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&triple[2][i..i + 8]);
                    u64::from_le_bytes(w)
                };
                map.slice(word(0), word(8))
                    .ok_or_else(|| err("VSETSHM reference outside the attached memory"))?
            }
            b'r' => return Err(err("VSETSHM reference must be 16 bytes")),
            _ => return Err(err("VSETSHM mask may hold only 'r' and 'v'")),
        };
        out.push(value);
    }
    Ok(out)
}

/// Where an `MGETSHM`'s values land: a range of the client's memory.
#[derive(Debug)]
pub struct Landing {
    map: Arc<Mapping>,
    offset: usize,
    capacity: usize,
}

/// The `MGET` an `MGETSHM` stands for, and where its values land.
pub fn landing(
    map: Option<&Arc<Mapping>>,
    args: Vec<Bytes>,
) -> Result<(Landing, Vec<Bytes>), Reply> {
    let Some(map) = map else {
        return Err(err("MGETSHM without SHMATTACH on this connection"));
    };
    if !map.writable {
        return Err(err("MGETSHM: this node cannot write the client's memory"));
    }
    let [_, offset, capacity, keys @ ..] = &args[..] else {
        return Err(err("wrong number of arguments for 'mgetshm' command"));
    };
    if keys.is_empty() {
        return Err(err("wrong number of arguments for 'mgetshm' command"));
    }
    let number = |b: &Bytes| {
        let n = std::str::from_utf8(b).ok()?.parse::<u64>().ok()?;
        usize::try_from(n).ok()
    };
    let (Some(offset), Some(capacity)) = (number(offset), number(capacity)) else {
        return Err(err("MGETSHM offset and capacity must be unsigned integers"));
    };
    let inside =
        offset >= HEADER_PAGE && offset.checked_add(capacity).is_some_and(|e| e <= map.len);
    if !inside {
        return Err(err("MGETSHM range outside the attached memory"));
    }
    let mut mget = Vec::with_capacity(keys.len() + 1);
    mget.push(Bytes::from_static(b"MGET"));
    mget.extend(keys.iter().cloned());
    let landing = Landing {
        map: map.clone(),
        offset,
        capacity,
    };
    Ok((landing, mget))
}

impl Landing {
    /// Where its values go (see [`Placement`]): each value's offset in the
    /// client's memory, asked for every value of the reply in order.
    pub fn placer(&self) -> impl FnMut(usize) -> Option<usize> + '_ {
        let mut placement = Placement::new(self.capacity);
        move |len| placement.place(len).map(|at| self.offset + at)
    }
}

impl Landing {
    /// The client's memory, for reads to land in directly.
    pub fn space(&self) -> Arc<dyn engine::flash::LandingSpace> {
        self.map.clone()
    }

    /// The `MGETSHM` reply for the `MGET` reply `reply`: values of at least
    /// [`protocol::shm::MIN_LANDED`] bytes written into the landing range
    /// in order (see [`Placement`]), each answered with its length;
    /// everything else as it was (errors too). An integer in `reply` is a value already read
    /// into its place (`netread`): it keeps its place.
    pub fn land(&self, reply: Reply) -> Reply {
        let Reply::Array(items) = reply else {
            return reply;
        };
        let mut place = self.placer();
        let items = items
            .into_iter()
            .map(|item| match item {
                Reply::Integer(n) => {
                    let placed = usize::try_from(n).ok().and_then(&mut place);
                    debug_assert!(placed.is_some(), "a value landed where it does not fit");
                    Reply::Integer(n)
                }
                Reply::Bulk(v) => match place(v.len()) {
                    Some(at) => {
                        // SAFETY: `at + len <= offset + capacity <= map.len`
                        // (`Placement::place`, `landing`): a range of a
                        // writable mapping that lives as long as `self.map`,
                        // which the client handed over until this reply.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                v.as_ptr(),
                                self.map.base.add(at),
                                v.len(),
                            );
                        }
                        Reply::Integer(v.len() as i64)
                    }
                    None => Reply::Bulk(v),
                },
                other => other,
            })
            .collect();
        Reply::Array(items)
    }
}

// SAFETY: the mapping stays mapped while the value lives (`Drop` unmaps
// it); reads land in it only when it is writable (`Landing` is made only
// then), and nothing in the node trusts its bytes beyond their checksums.
unsafe impl engine::flash::LandingSpace for Mapping {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed memory file like a client's: header, token, then `body`.
    fn memfd(token: &[u8; 16], body: &[u8], seal: bool) -> std::fs::File {
        use std::io::Write;
        use std::os::fd::FromRawFd;
        // SAFETY: a valid C string; checked.
        let fd = unsafe { libc::memfd_create(c"test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor owned by the file.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(MAGIC).unwrap();
        f.write_all(token).unwrap();
        f.write_all(body).unwrap();
        if seal {
            // SAFETY: fcntl on our descriptor.
            assert_eq!(
                unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
                0
            );
        }
        f
    }

    fn hex(t: &[u8]) -> Bytes {
        Bytes::from(t.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    fn attach_args(f: &std::fs::File, size: u64, token: &[u8]) -> Vec<Bytes> {
        vec![
            Bytes::from_static(b"SHMATTACH"),
            Bytes::from(f.as_raw_fd().to_string()),
            Bytes::from(size.to_string()),
            hex(token),
        ]
    }

    fn reference(off: u64, len: u64) -> Bytes {
        let mut r = off.to_le_bytes().to_vec();
        r.extend_from_slice(&len.to_le_bytes());
        Bytes::from(r)
    }

    #[test]
    fn attach_checks_peer_seals_size_and_token() {
        let me = Some(std::process::id());
        let token = [7u8; 16];
        let body = b"hello, shared world";
        let f = memfd(&token, body, true);
        let size = (24 + body.len()) as u64;
        let map = attach(me, &attach_args(&f, size, &token)).expect("attached");
        let expect = |r: Result<Arc<Mapping>, Reply>, what: &str| match r {
            Err(Reply::Error(e)) => assert!(e.contains(what), "{e} lacks {what}"),
            _ => panic!("expected an error with {what}"),
        };
        expect(attach(None, &attach_args(&f, size, &token)), "Unix socket");
        expect(attach(me, &attach_args(&f, size, &[8u8; 16])), "token");
        expect(attach(me, &attach_args(&f, size + 1, &token)), "not");
        let unsealed = memfd(&token, body, false);
        expect(attach(me, &attach_args(&unsealed, size, &token)), "sealed");
        let mut bad = attach_args(&f, size, &token);
        bad[3] = Bytes::from_static(b"xyz");
        expect(attach(me, &bad), "hex");
        bad = attach_args(&f, size, &token);
        bad[1] = Bytes::from_static(b"99999");
        expect(attach(me, &bad), "cannot open");

        let args = vec![
            Bytes::from_static(b"VSETSHM"),
            Bytes::from_static(b"rv"),
            Bytes::from_static(b"a"),
            Bytes::from_static(b"1"),
            reference(24, 5),
            Bytes::from_static(b"b"),
            Bytes::from_static(b"2"),
            Bytes::from_static(b"inline"),
        ];
        let vset = resolve(Some(&map), args.clone()).expect("resolved");
        assert_eq!(
            vset,
            [&b"VSET"[..], b"a", b"1", b"hello", b"b", b"2", b"inline"]
        );
        drop(map); // the slices keep the mapping
        assert_eq!(&vset[3][..], b"hello");

        let map = attach(me, &attach_args(&f, size, &token)).expect("attached");
        let mut bad = args.clone();
        bad[4] = reference(size - 2, 3);
        assert!(resolve(Some(&map), bad).is_err(), "past the end");
        bad = args.clone();
        bad[4] = reference(u64::MAX, 2);
        assert!(resolve(Some(&map), bad).is_err(), "overflow");
        bad = args.clone();
        bad[1] = Bytes::from_static(b"rx");
        assert!(resolve(Some(&map), bad).is_err(), "mask");
        bad = args.clone();
        bad[1] = Bytes::from_static(b"r");
        assert!(resolve(Some(&map), bad).is_err(), "mask length");
        bad = args.clone();
        bad[4] = Bytes::from_static(b"short");
        assert!(resolve(Some(&map), bad).is_err(), "reference length");
        assert!(resolve(None, args).is_err(), "not attached");
    }

    #[test]
    fn landing_writes_values_into_the_clients_memory_and_checks_ranges() {
        let me = Some(std::process::id());
        let token = [9u8; 16];
        let size = 3 * HEADER_PAGE;
        let f = memfd(&token, &vec![0u8; size - 24], true);
        let map = attach(me, &attach_args(&f, size as u64, &token)).expect("attached");
        assert!(map.writable(), "the memfd opens for writing");
        let args = |off: usize, cap: usize, keys: &[&[u8]]| {
            let mut a = vec![
                Bytes::from_static(b"MGETSHM"),
                Bytes::from(off.to_string()),
                Bytes::from(cap.to_string()),
            ];
            a.extend(keys.iter().map(|k| Bytes::copy_from_slice(k)));
            a
        };
        let (to, mget) =
            landing(Some(&map), args(HEADER_PAGE, 3100, &[b"a", b"b"])).expect("landing");
        assert_eq!(mget, [&b"MGET"[..], b"a", b"b"]);
        let big = |b: u8, n: usize| Bytes::from(vec![b; n]);
        let reply = Reply::Array(vec![
            Reply::Bulk(big(1, 1500)),
            Reply::Null,
            Reply::Bulk(Bytes::from_static(b"short")),
            Reply::Bulk(big(2, 1100)),
            Reply::Bulk(big(3, 1100)), // no longer fits: 3072 + 1536 > 3100
        ]);
        let landed = to.land(reply);
        assert_eq!(
            landed,
            Reply::Array(vec![
                Reply::Integer(1500),
                Reply::Null,
                Reply::Bulk(Bytes::from_static(b"short")),
                Reply::Integer(1100),
                Reply::Bulk(big(3, 1100)),
            ])
        );
        let mut back = vec![0u8; 3000];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, HEADER_PAGE as u64).unwrap();
        assert!(back[..1500].iter().all(|&b| b == 1));
        assert!(
            back[1536..1536 + 1100].iter().all(|&b| b == 2),
            "64-byte aligned"
        );
        assert!(back[1500..1536].iter().all(|&b| b == 0));
        // Errors pass through untouched.
        let e = Reply::Error("ERR reply too large".into());
        assert_eq!(to.land(e.clone()), e);

        let refused = |r: Result<(Landing, Vec<Bytes>), Reply>, what: &str| match r {
            Err(Reply::Error(e)) => assert!(e.contains(what), "{e} lacks {what}"),
            _ => panic!("expected an error with {what}"),
        };
        refused(landing(Some(&map), args(0, 100, &[b"a"])), "outside");
        refused(
            landing(Some(&map), args(HEADER_PAGE - 1, 100, &[b"a"])),
            "outside",
        );
        refused(
            landing(Some(&map), args(2 * HEADER_PAGE, HEADER_PAGE + 1, &[b"a"])),
            "outside",
        );
        refused(
            landing(Some(&map), args(HEADER_PAGE, usize::MAX, &[b"a"])),
            "outside",
        );
        refused(landing(Some(&map), args(HEADER_PAGE, 10, &[])), "arguments");
        let mut bad = args(HEADER_PAGE, 10, &[b"a"]);
        bad[1] = Bytes::from_static(b"-1");
        refused(landing(Some(&map), bad), "unsigned");
        refused(landing(None, args(HEADER_PAGE, 10, &[b"a"])), "SHMATTACH");
    }
}
