//! Values a client on this machine hands over in its shared memory instead
//! of the socket (the node's side of `client::shm`).
//!
//! `SHMATTACH fd size token` (Unix socket connections only): the node opens
//! descriptor `fd` of the connection's peer process (its pid from the
//! socket's credentials, never from the client) through `/proc`, checks
//! that it is a memory file of `size` bytes sealed against shrinking (so
//! the mapping can never lose pages under the node: no SIGBUS), maps it
//! read-only and checks that its header holds `LSSHM1` and `token` (hex),
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

use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::Bytes;
use protocol::Reply;

/// The header a client's shared memory starts with.
const MAGIC: &[u8; 8] = b"LSSHM1\0\0";
/// Bytes of a token.
const TOKEN_LEN: usize = 16;
/// Bytes of a value's reference.
const REF_LEN: usize = 16;
/// The largest shared memory a connection may attach.
const MAX_SIZE: usize = 1 << 32;

/// A client's shared memory, mapped read-only.
pub struct Mapping {
    base: *const u8,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value, unmapped only when it
// is dropped (after every slice of it, which hold an `Arc`).
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
    let file = std::fs::File::open(format!("/proc/{pid}/fd/{fd}"))
        .map_err(|e| err(format!("cannot open the client's memory: {e}")))?;
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
    // SAFETY: mapping `size` bytes of a file that is that long and cannot
    // shrink, read-only; the result is checked.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
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
}
