//! Inode records and directory entries, as stored.
//!
//! An inode record is little-endian and fixed-size, then the symlink target:
//! format version (1), kind, flags, permission bits (u16), uid, gid, nlink,
//! rdev (u32 each), size, parent (u64 each), atime, mtime, ctime (i64
//! seconds + u32 nanoseconds each), target bytes. A directory entry's value
//! is the child's inode number (u64, big-endian) and kind.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{FsError, Result};

/// The root directory's inode number.
pub const ROOT: u64 = 1;
const FORMAT: u8 = 1;
const FIXED: usize = 3 + 2 + 4 * 4 + 8 * 2 + 12 * 3;

/// `flags` bit: the inode may have extended attributes.
pub const HAS_XATTRS: u8 = 1;
/// `flags` bit: the file may have holes, so its blocks are counted from
/// the chunks it holds (`blocks.rs`).
pub const MAY_HAVE_HOLES: u8 = 2;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    Fifo = 4,
    Socket = 5,
    CharDevice = 6,
    BlockDevice = 7,
}

impl Kind {
    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDevice,
            7 => Kind::BlockDevice,
            _ => return None,
        })
    }

    /// The kind of a `mknod` mode (`S_IFREG`, ...).
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => return None,
        })
    }
}

/// A point in time, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    /// Now.
    pub fn now() -> Time {
        Time::from_system(SystemTime::now())
    }

    /// `t` as stored.
    pub fn from_system(t: SystemTime) -> Time {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let secs = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                match d.subsec_nanos() {
                    0 => Time { secs, nanos: 0 },
                    n => Time {
                        secs: secs - 1,
                        nanos: 1_000_000_000 - n,
                    },
                }
            }
        }
    }

    /// As a `SystemTime`.
    pub fn to_system(self) -> SystemTime {
        let nanos = std::time::Duration::new(0, self.nanos);
        if self.secs >= 0 {
            UNIX_EPOCH + std::time::Duration::from_secs(self.secs as u64) + nanos
        } else {
            UNIX_EPOCH - std::time::Duration::from_secs(self.secs.unsigned_abs()) + nanos
        }
    }
}

/// One inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub kind: Kind,
    /// [`HAS_XATTRS`].
    pub flags: u8,
    /// Permission bits with set-uid, set-gid and sticky (`mode & 07777`).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev: u32,
    pub size: u64,
    /// A directory's parent (its `..`); 0 for other kinds.
    pub parent: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// A symlink's target.
    pub target: Vec<u8>,
}

impl Inode {
    /// Clears set-user-ID, and set-group-ID when group execution is
    /// allowed (without it the bit means mandatory locking, which a write
    /// keeps), as Linux does when a file is written or truncated by a
    /// caller without `CAP_FSETID`, or its owner changes. Returns whether a
    /// bit was cleared. Directories keep theirs (set-group-ID on a
    /// directory is inheritance, not privilege).
    pub fn drop_set_id(&mut self) -> bool {
        if self.kind == Kind::Dir {
            return false;
        }
        let before = self.perm;
        self.perm &= !(libc::S_ISUID as u16);
        let group_exec = (libc::S_ISGID | libc::S_IXGRP) as u16;
        if self.perm & group_exec == group_exec {
            self.perm &= !(libc::S_ISGID as u16);
        }
        self.perm != before
    }

    /// A new inode made now.
    pub fn new(ino: u64, kind: Kind, perm: u16, uid: u32, gid: u32) -> Inode {
        let now = Time::now();
        Inode {
            ino,
            kind,
            flags: 0,
            perm: perm & 0o7777,
            uid,
            gid,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            rdev: 0,
            size: 0,
            parent: 0,
            atime: now,
            mtime: now,
            ctime: now,
            target: Vec::new(),
        }
    }

    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + self.target.len());
        b.extend([FORMAT, self.kind as u8, self.flags]);
        b.extend(self.perm.to_le_bytes());
        for n in [self.uid, self.gid, self.nlink, self.rdev] {
            b.extend(n.to_le_bytes());
        }
        b.extend(self.size.to_le_bytes());
        b.extend(self.parent.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime] {
            b.extend(t.secs.to_le_bytes());
            b.extend(t.nanos.to_le_bytes());
        }
        b.extend_from_slice(&self.target);
        b
    }

    /// Decodes the record of `ino`.
    pub fn decode(ino: u64, b: &[u8]) -> Result<Inode> {
        let bad = || FsError::Corrupt(format!("inode {ino}: {} bytes", b.len()));
        if b.len() < FIXED || b[0] != FORMAT {
            return Err(bad());
        }
        let kind = Kind::from_code(b[1]).ok_or_else(bad)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let time_at = |i: usize| Time {
            secs: u64_at(i) as i64,
            nanos: u32_at(i + 8),
        };
        Ok(Inode {
            ino,
            kind,
            flags: b[2],
            perm: u16_at(3),
            uid: u32_at(5),
            gid: u32_at(9),
            nlink: u32_at(13),
            rdev: u32_at(17),
            size: u64_at(21),
            parent: u64_at(29),
            atime: time_at(37),
            mtime: time_at(49),
            ctime: time_at(61),
            target: b[FIXED..].to_vec(),
        })
    }
}

/// A directory entry's stored value.
pub fn encode_dentry(ino: u64, kind: Kind) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[..8].copy_from_slice(&ino.to_be_bytes());
    b[8] = kind as u8;
    b
}

/// Decodes a directory entry's value.
pub fn decode_dentry(b: &[u8]) -> Result<(u64, Kind)> {
    let bad = || FsError::Corrupt(format!("directory entry of {} bytes", b.len()));
    if b.len() != 9 {
        return Err(bad());
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    Ok((
        u64::from_be_bytes(a),
        Kind::from_code(b[8]).ok_or_else(bad)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let mut i = Inode::new(42, Kind::Symlink, 0o4755, 1000, 100);
        i.target = b"../x/y".to_vec();
        i.size = u64::MAX - 3;
        i.mtime = Time { secs: -5, nanos: 7 };
        i.flags = HAS_XATTRS;
        assert_eq!(Inode::decode(42, &i.encode()).expect("decode"), i);
        assert!(Inode::decode(1, &i.encode()[..10]).is_err());
        assert_eq!(
            decode_dentry(&encode_dentry(9, Kind::Dir)).expect("dentry"),
            (9, Kind::Dir)
        );
        assert!(decode_dentry(b"short").is_err());
    }

    #[test]
    fn set_id_bits_drop_as_linux_drops_them() {
        let perm_after = |kind, perm| {
            let mut i = Inode::new(2, kind, perm, 0, 0);
            let dropped = i.drop_set_id();
            (i.perm, dropped)
        };
        assert_eq!(perm_after(Kind::File, 0o6755), (0o0755, true));
        assert_eq!(perm_after(Kind::File, 0o4700), (0o0700, true));
        // Set-group-ID without group execution is a locking mark: kept.
        assert_eq!(perm_after(Kind::File, 0o2644), (0o2644, false));
        assert_eq!(perm_after(Kind::File, 0o1755), (0o1755, false));
        assert_eq!(perm_after(Kind::Dir, 0o2775), (0o2775, false));
    }

    #[test]
    fn times_before_the_epoch_round_trip() {
        for t in [
            Time { secs: -1, nanos: 5 },
            Time {
                secs: 3,
                nanos: 999_999_999,
            },
            Time {
                secs: -10,
                nanos: 0,
            },
        ] {
            assert_eq!(Time::from_system(t.to_system()), t);
        }
    }
}
