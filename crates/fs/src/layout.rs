//! Where a file system's objects live in the key space.
//!
//! All metadata of file system `ID` (16 hex digits) shares the hash tag
//! `{lsfs:ID}`, so it sits on one replica set and every metadata change is
//! one atomic batch there (`Store::write_atomic`). After the tag, one byte
//! says what the record is; numbers are big-endian so keys sort in order:
//!
//! | key                              | value                                  |
//! |----------------------------------|----------------------------------------|
//! | `{lsfs:ID}I` ino                 | the inode record ([`crate::inode`])     |
//! | `{lsfs:ID}D` parent name         | the child: ino, kind (a directory entry)|
//! | `{lsfs:ID}X` ino name            | one extended attribute's value          |
//! | `{lsfs:ID}C`                     | the next free inode number (decimal)    |
//! | `{lsfs:ID}O` ino                 | empty: an unlinked inode whose data is still to be reclaimed |
//! | `{lsfs:ID}G` ino                 | empty: a file that may hold data past its recorded size |
//! | `{lsfs:ID}L`                     | the mount lease ([`crate::lease`])      |
//!
//! So `readdir` is one range read of `D parent`, and a file's attributes
//! one point read. File data is spread by inode and chunk instead:
//! `lsfs/` ID ino chunk (all big-endian), fixed-size chunks whose keys sort
//! in file order, so sequential reads are range reads and a file's chunks
//! are spread over all nodes. A chunk holds the file's bytes from its start
//! up to the last byte written, never past the file's size; bytes beyond a
//! stored chunk, and missing chunks, read as zeros.

/// The keys of one file system.
#[derive(Clone, Debug)]
pub struct Keys {
    id: u64,
    tag: Vec<u8>,
}

/// Prefix of every data chunk key.
const DATA_PREFIX: &[u8] = b"lsfs/";

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

impl Keys {
    /// The keys of file system `id`.
    pub fn new(id: u64) -> Keys {
        Keys {
            id,
            tag: format!("{{lsfs:{id:016x}}}").into_bytes(),
        }
    }

    fn meta(&self, kind: u8, parts: &[&[u8]]) -> Vec<u8> {
        let mut k =
            Vec::with_capacity(self.tag.len() + 1 + parts.iter().map(|p| p.len()).sum::<usize>());
        k.extend_from_slice(&self.tag);
        k.push(kind);
        for p in parts {
            k.extend_from_slice(p);
        }
        k
    }

    /// `[start, end)` of every key of kind `kind` whose next 8 bytes are `n`.
    fn under(&self, kind: u8, n: u64) -> (Vec<u8>, Vec<u8>) {
        let start = self.meta(kind, &[&be(n)]);
        // The successor of the 8-byte prefix: the next number's prefix.
        let end = match n.checked_add(1) {
            Some(m) => self.meta(kind, &[&be(m)]),
            None => self.meta(kind + 1, &[]),
        };
        (start, end)
    }

    /// The inode record of `ino`.
    pub fn inode(&self, ino: u64) -> Vec<u8> {
        self.meta(b'I', &[&be(ino)])
    }

    /// The entry `name` of directory `parent`.
    pub fn dentry(&self, parent: u64, name: &[u8]) -> Vec<u8> {
        self.meta(b'D', &[&be(parent), name])
    }

    /// Every entry of directory `parent`.
    pub fn dentries(&self, parent: u64) -> (Vec<u8>, Vec<u8>) {
        self.under(b'D', parent)
    }

    /// The length of a dentry key's prefix before the name.
    pub fn dentry_prefix_len(&self) -> usize {
        self.tag.len() + 1 + 8
    }

    /// Extended attribute `name` of `ino`.
    pub fn xattr(&self, ino: u64, name: &[u8]) -> Vec<u8> {
        self.meta(b'X', &[&be(ino), name])
    }

    /// Every extended attribute of `ino`.
    pub fn xattrs(&self, ino: u64) -> (Vec<u8>, Vec<u8>) {
        self.under(b'X', ino)
    }

    /// The inode counter.
    pub fn counter(&self) -> Vec<u8> {
        self.meta(b'C', &[])
    }

    /// The reclaim mark of unlinked inode `ino`.
    pub fn orphan(&self, ino: u64) -> Vec<u8> {
        self.meta(b'O', &[&be(ino)])
    }

    /// The growth mark of `ino`.
    pub fn growing(&self, ino: u64) -> Vec<u8> {
        self.meta(b'G', &[&be(ino)])
    }

    /// Every key of kind `kind` (`b'O'`, `b'G'`).
    pub fn all_of(&self, kind: u8) -> (Vec<u8>, Vec<u8>) {
        (self.meta(kind, &[]), self.meta(kind + 1, &[]))
    }

    /// The inode number at the end of an `O`, `G` or `I` key.
    pub fn ino_of(&self, key: &[u8]) -> Option<u64> {
        let tail = key.get(self.tag.len() + 1..)?;
        Some(u64::from_be_bytes(tail.try_into().ok()?))
    }

    /// The record kind (`b'I'`, `b'D'`, ...) of metadata key `key` and
    /// what follows it; `None` for a key of another file system.
    pub fn split_meta<'a>(&self, key: &'a [u8]) -> Option<(u8, &'a [u8])> {
        let rest = key.strip_prefix(&self.tag[..])?;
        Some((*rest.first()?, &rest[1..]))
    }

    /// The mount lease.
    pub fn lease(&self) -> Vec<u8> {
        self.meta(b'L', &[])
    }

    /// Every metadata key of the file system.
    pub fn all_meta(&self) -> (Vec<u8>, Vec<u8>) {
        let start = self.tag.clone();
        let mut end = self.tag.clone();
        end.push(0xff);
        (start, end)
    }

    /// Chunk `index` of file `ino`.
    pub fn chunk(&self, ino: u64, index: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(DATA_PREFIX.len() + 24);
        k.extend_from_slice(DATA_PREFIX);
        k.extend_from_slice(&be(self.id));
        k.extend_from_slice(&be(ino));
        k.extend_from_slice(&be(index));
        k
    }

    /// `(ino, index)` of a chunk key of this file system.
    pub fn chunk_of(&self, key: &[u8]) -> Option<(u64, u64)> {
        let rest = key
            .strip_prefix(DATA_PREFIX)?
            .strip_prefix(&be(self.id)[..])?;
        if rest.len() != 16 {
            return None;
        }
        let (ino, index) = rest.split_at(8);
        Some((
            u64::from_be_bytes(ino.try_into().ok()?),
            u64::from_be_bytes(index.try_into().ok()?),
        ))
    }

    /// Chunks `from..` of file `ino`.
    pub fn chunks_from(&self, ino: u64, from: u64) -> (Vec<u8>, Vec<u8>) {
        let end = match ino.checked_add(1) {
            Some(next) => self.chunk(next, 0),
            None => self.all_data().1,
        };
        (self.chunk(ino, from), end)
    }

    /// Every data chunk of the file system.
    pub fn all_data(&self) -> (Vec<u8>, Vec<u8>) {
        let mut start = DATA_PREFIX.to_vec();
        start.extend_from_slice(&be(self.id));
        let end = match self.id.checked_add(1) {
            Some(next) => [DATA_PREFIX, &be(next)].concat(),
            None => b"lsfs0".to_vec(),
        };
        (start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_hold_exactly_their_keys() {
        let k = Keys::new(7);
        let (s, e) = k.dentries(5);
        for name in [&b""[..], b"a", b"\xff\xff\xff"] {
            let d = k.dentry(5, name);
            assert!(s <= d && d < e);
        }
        assert!(k.dentry(6, b"") >= e);
        assert!(k.dentry(4, b"\xff") < s);
        let (s, e) = k.chunks_from(9, 2);
        assert!(k.chunk(9, 1) < s);
        assert!(s <= k.chunk(9, u64::MAX) && k.chunk(9, u64::MAX) < e);
        assert!(k.chunk(10, 0) >= e);
        let (s, e) = k.all_data();
        assert!(s <= k.chunk(0, 0) && k.chunk(u64::MAX, u64::MAX) < e);
        assert!(Keys::new(8).chunk(0, 0) >= e);
        assert_eq!(k.ino_of(&k.orphan(99)), Some(99));
        assert_eq!(k.chunk_of(&k.chunk(3, 42)), Some((3, 42)));
        assert_eq!(Keys::new(8).chunk_of(&k.chunk(3, 42)), None);
        assert_eq!(
            k.split_meta(&k.dentry(5, b"n")).map(|(c, r)| (c, r.len())),
            Some((b'D', 9))
        );
        assert_eq!(Keys::new(8).split_meta(&k.inode(1)), None);
    }

    #[test]
    fn metadata_shares_one_hash_tag_and_data_does_not() {
        let k = Keys::new(0xabc);
        let tag = client::ring::placement(&k.inode(1)).to_vec();
        for key in [
            k.dentry(1, b"x"),
            k.xattr(2, b"user.a"),
            k.counter(),
            k.lease(),
            k.orphan(3),
        ] {
            assert_eq!(client::ring::placement(&key), &tag[..]);
        }
        assert_ne!(client::ring::placement(&k.chunk(1, 0)), &tag[..]);
    }
}
