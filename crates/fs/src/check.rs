//! `fs check`: a read-only check of a file system as stored, what
//! `e2fsck -n` is to ext4. It states the metadata guarantees (see
//! `docs/file.md`) as checks, so that crash tests can assert them:
//!
//! - every directory entry names an inode that exists, of the kind the
//!   entry records;
//! - a file's link count is the number of entries naming it; a directory
//!   is named by exactly one entry (the root by none), its parent field is
//!   that entry's directory, and its link count is 2 plus its
//!   subdirectories;
//! - an inode no entry names has no links and a reclaim mark: an unlinked
//!   file whose data is still to go (pending, not a problem);
//! - every inode number is below the inode counter, and every extended
//!   attribute, reclaim mark and growth mark belongs to an inode (a
//!   reclaim mark may outlive its inode while the data is still to go);
//! - with `data`: every chunk of an inode that exists belongs to a regular
//!   file and starts before its size, unless a growth mark (data written
//!   past the recorded size, dropped at the next mount) or a reclaim mark
//!   covers it. Chunks of an inode that does not exist are counted as
//!   leaked, not as a problem: data is written before the metadata that
//!   names it, so a crash between the two leaves chunks no file names
//!   (space lost, nothing wrong to see).
//!
//! Run it on an unmounted file system: a mount's changes in flight (its
//! write-behind queue) may show as problems.
//!
//! [`Repair::LeakedChunks`] deletes the leaked chunks as it finds them
//! (nothing else reclaims them: no record names them). The caller must
//! hold the mount lease, since a mount's data can be stored before the
//! inode that names it. Pending work is left to the next mount, which
//! finishes it when it opens the file system.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use client::Store;

use crate::error::Result;
use crate::filesystem::for_each_page;
use crate::inode::{decode_dentry, Inode, Kind, ROOT};
use crate::layout::Keys;
use crate::registry::FsRecord;

/// Data keys listed per request.
const PAGE: usize = 1000;

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    /// Inodes stored.
    pub inodes: u64,
    /// Directory entries stored.
    pub entries: u64,
    /// Data chunks stored (with `data`).
    pub chunks: Option<u64>,
    /// Unlinked inodes and data past a file's size still to be reclaimed
    /// (normal after a crash; the next mount finishes them).
    pub pending: u64,
    /// Chunks of inodes that do not exist (with `data`): left by a crash
    /// between a file's data and its metadata.
    pub leaked: u64,
    /// Leaked chunks deleted ([`Repair::LeakedChunks`]).
    pub repaired: u64,
    /// What is wrong.
    pub findings: client::findings::Findings,
}

/// What [`check`] may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    /// Nothing: read only.
    Nothing,
    /// Delete leaked chunks (needs `data`; hold the mount lease).
    LeakedChunks,
}

/// The metadata of one file system, as read.
#[derive(Default)]
struct Meta {
    inodes: BTreeMap<u64, Inode>,
    /// (parent, name, child, kind) of every entry.
    entries: Vec<(u64, Vec<u8>, u64, Kind)>,
    xattr_owners: HashSet<u64>,
    orphans: HashSet<u64>,
    growing: HashSet<u64>,
    counter: Option<u64>,
}

/// Checks file system `rec` in `store` (see the module doc); `data` also
/// lists every data chunk (keys only), which costs a read per chunk.
pub fn check(store: &dyn Store, rec: &FsRecord, data: bool, repair: Repair) -> Result<Report> {
    let keys = Keys::new(rec.id);
    let mut report = Report::default();
    let meta = read_meta(store, &keys, &mut report)?;
    report.inodes = meta.inodes.len() as u64;
    report.entries = meta.entries.len() as u64;
    check_links(&meta, &mut report);
    check_marks(&meta, &mut report);
    if data {
        check_chunks(store, &keys, rec, &meta, repair, &mut report)?;
    }
    Ok(report)
}

fn read_meta(store: &dyn Store, keys: &Keys, report: &mut Report) -> Result<Meta> {
    let mut meta = Meta::default();
    let (start, end) = keys.all_meta();
    for_each_page(
        &start,
        |from, n| store.range(from, &end, n),
        |(k, _)| k,
        |page| {
            for (key, value) in page {
                let Some((kind, rest)) = keys.split_meta(&key) else {
                    report
                        .findings
                        .problem(format!("unreadable metadata key {key:?}"));
                    continue;
                };
                let ino = rest
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes);
                match (kind, ino) {
                    (b'I', Some(ino)) => match Inode::decode(ino, &value) {
                        Ok(inode) => {
                            meta.inodes.insert(ino, inode);
                        }
                        Err(e) => report.findings.problem(format!("inode {ino}: {e}")),
                    },
                    (b'D', Some(parent)) => match decode_dentry(&value) {
                        Ok((child, kind)) => {
                            meta.entries.push((parent, rest[8..].to_vec(), child, kind))
                        }
                        Err(e) => report.findings.problem(format!(
                            "entry {:?} of {parent}: {e}",
                            String::from_utf8_lossy(&rest[8..])
                        )),
                    },
                    (b'X', Some(ino)) => {
                        meta.xattr_owners.insert(ino);
                    }
                    (b'O', Some(ino)) => {
                        meta.orphans.insert(ino);
                    }
                    (b'G', Some(ino)) => {
                        meta.growing.insert(ino);
                    }
                    (b'C', _) => {
                        meta.counter = std::str::from_utf8(&value)
                            .ok()
                            .and_then(|t| t.parse().ok());
                        if meta.counter.is_none() {
                            report
                                .findings
                                .problem("the inode counter is unreadable".into());
                        }
                    }
                    (b'L', _) => {}
                    _ => report
                        .findings
                        .problem(format!("unknown metadata key {key:?}")),
                }
            }
            Ok(())
        },
    )?;
    Ok(meta)
}

fn name(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

/// Entries against inodes: existence, kinds, link counts, parents.
fn check_links(meta: &Meta, report: &mut Report) {
    let mut named: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut dir_parents: HashMap<u64, Vec<u64>> = HashMap::new();
    for (parent, entry, child, kind) in &meta.entries {
        let entry = name(entry);
        match meta.inodes.get(parent) {
            Some(p) if p.kind == Kind::Dir => {}
            Some(_) => report
                .findings
                .problem(format!("entry {entry:?} is in {parent}, not a directory")),
            None => report.findings.problem(format!(
                "entry {entry:?} is in {parent}, which does not exist"
            )),
        }
        match meta.inodes.get(child) {
            None => report.findings.problem(format!(
                "entry {entry:?} of {parent} names inode {child}, which does not exist"
            )),
            Some(i) if i.kind != *kind => report.findings.problem(format!(
                "entry {entry:?} of {parent} says {kind:?}, inode {child} is {:?}",
                i.kind
            )),
            Some(_) => {}
        }
        *named.entry(*child).or_default() += 1;
        if *kind == Kind::Dir {
            *subdirs.entry(*parent).or_default() += 1;
            dir_parents.entry(*child).or_default().push(*parent);
        }
    }
    for (&ino, inode) in &meta.inodes {
        let refs = named.get(&ino).copied().unwrap_or(0);
        if inode.kind == Kind::Dir {
            let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if inode.nlink != want {
                report.findings.problem(format!(
                    "directory {ino} has link count {}, its entries make {want}",
                    inode.nlink
                ));
            }
            let parents = dir_parents.get(&ino).map_or(&[][..], |p| &p[..]);
            match (ino == ROOT, parents) {
                (true, []) if inode.parent == ROOT => {}
                (true, _) => report
                    .findings
                    .problem("the root is named by an entry or has another parent".into()),
                (false, [p]) if *p == inode.parent => {}
                (false, [p]) => report.findings.problem(format!(
                    "directory {ino} is in {p} but records parent {}",
                    inode.parent
                )),
                (false, []) => report
                    .findings
                    .problem(format!("directory {ino} is named by no entry")),
                (false, _) => report.findings.problem(format!(
                    "directory {ino} is named by {} entries",
                    parents.len()
                )),
            }
        } else if refs == 0 && inode.nlink == 0 && meta.orphans.contains(&ino) {
            report.pending += 1; // unlinked, data still to be reclaimed
        } else if inode.nlink != refs {
            report.findings.problem(format!(
                "{:?} {ino} has link count {}, {refs} entries name it",
                inode.kind, inode.nlink
            ));
        }
        if inode.nlink == 0 && !meta.orphans.contains(&ino) && inode.kind != Kind::Dir {
            report
                .findings
                .problem(format!("inode {ino} has no links and no reclaim mark"));
        }
    }
    if !meta.inodes.contains_key(&ROOT) {
        report
            .findings
            .problem("the root directory is missing".into());
    }
}

/// The counter, extended attributes and marks against the inodes.
fn check_marks(meta: &Meta, report: &mut Report) {
    if let (Some(counter), Some((&last, _))) = (meta.counter, meta.inodes.last_key_value()) {
        if last >= counter {
            report.findings.problem(format!(
                "inode {last} is not below the inode counter {counter}"
            ));
        }
    }
    for &ino in &meta.xattr_owners {
        if !meta.inodes.contains_key(&ino) && !meta.orphans.contains(&ino) {
            report.findings.problem(format!(
                "extended attributes of inode {ino}, which does not exist"
            ));
        }
    }
    for &ino in &meta.orphans {
        if !meta.inodes.contains_key(&ino) {
            report.pending += 1; // its data still to go, then the mark
        }
    }
    for &ino in &meta.growing {
        if meta.inodes.get(&ino).is_none_or(|i| i.kind != Kind::File) {
            report
                .findings
                .problem(format!("growth mark of inode {ino}, which is not a file"));
        }
    }
}

/// Data chunks against the files they belong to.
fn check_chunks(
    store: &dyn Store,
    keys: &Keys,
    rec: &FsRecord,
    meta: &Meta,
    repair: Repair,
    report: &mut Report,
) -> Result<()> {
    let cs = u64::from(rec.chunk_size);
    let (start, end) = keys.all_data();
    let mut chunks = 0u64;
    let mut visit = |page: &[Bytes]| {
        let mut leaked = Vec::new();
        for key in page {
            chunks += 1;
            let Some((ino, index)) = keys.chunk_of(key) else {
                report
                    .findings
                    .problem(format!("unreadable data key {key:?}"));
                continue;
            };
            let covered = meta.orphans.contains(&ino) || meta.growing.contains(&ino);
            match meta.inodes.get(&ino) {
                Some(i) if i.kind != Kind::File => report
                    .findings
                    .problem(format!("chunk {index} of {:?} {ino}", i.kind)),
                Some(i) if index.saturating_mul(cs) >= i.size && !covered => {
                    report.findings.problem(format!(
                        "chunk {index} of file {ino} lies past its size {}",
                        i.size
                    ))
                }
                None if !covered => {
                    report.leaked += 1;
                    leaked.push(key.clone());
                }
                Some(i) if index.saturating_mul(cs) >= i.size => report.pending += 1,
                None => report.pending += 1,
                Some(_) => {}
            }
        }
        if repair == Repair::LeakedChunks {
            leaked
        } else {
            Vec::new()
        }
    };
    // Listed and confirmed: a listing alone shows deleted keys too.
    report.repaired = store.sweep(&start, &end, PAGE, &mut visit)?;
    report.chunks = Some(chunks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use client::MemStore;

    use crate::attrs::XattrMode;
    use crate::namespace::{Caller, NewNode};
    use crate::registry;
    use crate::FileSystem;

    const ME: Caller = Caller { uid: 0, gid: 0 };

    fn node(kind: Kind, target: &'static [u8]) -> NewNode<'static> {
        NewNode {
            kind,
            perm: 0o755,
            rdev: 0,
            target,
        }
    }

    /// A small tree with every kind of object, hard links, an extended
    /// attribute and an unlinked file still open.
    fn populated() -> (Arc<MemStore>, FsRecord, FileSystem) {
        let store = Arc::new(MemStore::new());
        let rec = registry::create(&*store, "t", 4096).expect("create");
        let fs = FileSystem::open(store.clone(), &rec).expect("open");
        let d = fs
            .make(ME, ROOT, b"d", node(Kind::Dir, b""))
            .expect("d")
            .ino;
        let e = fs.make(ME, d, b"e", node(Kind::Dir, b"")).expect("e").ino;
        let f = fs.make(ME, d, b"f", node(Kind::File, b"")).expect("f").ino;
        fs.write(f, 0, &[7u8; 10_000]).expect("write");
        fs.flush_inode(f).expect("flush");
        fs.link(f, e, b"f2").expect("link");
        fs.make(ME, ROOT, b"s", node(Kind::Symlink, b"d/f"))
            .expect("s");
        fs.setxattr(f, b"user.a", b"1", XattrMode::Any)
            .expect("xattr");
        let g = fs
            .make(ME, ROOT, b"g", node(Kind::File, b""))
            .expect("g")
            .ino;
        fs.write(g, 0, b"open and unlinked").expect("write");
        fs.flush_inode(g).expect("flush");
        fs.opened(g);
        fs.unlink(ROOT, b"g").expect("unlink");
        fs.settle().expect("settle");
        (store, rec, fs)
    }

    #[test]
    fn a_consistent_tree_is_clean_and_an_unlinked_open_file_is_pending() {
        let (store, rec, _fs) = populated();
        let r = check(&*store, &rec, true, Repair::Nothing).expect("check");
        assert!(r.findings.is_clean(), "{:?}", r.findings.problems);
        assert_eq!(r.pending, 1, "the unlinked open file");
        assert_eq!(r.inodes, 6);
        assert_eq!(r.entries, 5);
        assert_eq!(r.chunks, Some(4));
        assert_eq!(r.leaked, 0);
        store
            .put(&Keys::new(rec.id).chunk(999_999, 0), b"no file names it")
            .expect("put");
        let r = check(&*store, &rec, true, Repair::Nothing).expect("check");
        assert!(r.findings.is_clean(), "{:?}", r.findings.problems);
        assert_eq!(r.leaked, 1);
        let r = check(&*store, &rec, true, Repair::LeakedChunks).expect("repair");
        assert_eq!((r.leaked, r.repaired), (1, 1));
        let r = check(&*store, &rec, true, Repair::Nothing).expect("check");
        assert_eq!(
            (r.leaked, r.chunks),
            (0, Some(4)),
            "the leaked chunk is gone, the rest kept"
        );
    }

    /// `d/f` of [`populated`].
    fn file_f(fs: &FileSystem) -> Inode {
        fs.lookup(ROOT, b"d")
            .and_then(|d| fs.lookup(d.ino, b"f"))
            .expect("d/f")
    }

    /// Breaks the stored file system in one way.
    type Damage = fn(&MemStore, &Keys, &FileSystem);

    #[test]
    fn each_kind_of_damage_is_reported() {
        let keys = |rec: &FsRecord| Keys::new(rec.id);
        let damage: [(&str, Damage); 7] = [
            ("does not exist", |s, k, fs| {
                let f = file_f(fs);
                s.delete(&k.inode(f.ino)).expect("delete");
            }),
            ("entries name it", |s, k, fs| {
                let extra = crate::inode::encode_dentry(file_f(fs).ino, Kind::File);
                s.put(&k.dentry(ROOT, b"extra"), &extra).expect("put");
            }),
            ("named by 2 entries", |s, k, fs| {
                let d = fs.lookup(ROOT, b"d").expect("d").ino;
                let again = crate::inode::encode_dentry(d, Kind::Dir);
                s.put(&k.dentry(ROOT, b"again"), &again).expect("put");
            }),
            ("link count", |_, _, fs| {
                let d = fs.lookup(ROOT, b"d").expect("d");
                let (_ns, mut txn) = fs.begin();
                txn.get(d.ino).expect("d").nlink = 9;
                txn.commit().expect("commit");
            }),
            ("chunk 0 of Dir", |s, k, fs| {
                let d = fs.lookup(ROOT, b"d").expect("d");
                s.put(&k.chunk(d.ino, 0), b"data of a directory")
                    .expect("put");
            }),
            ("past its size", |s, k, fs| {
                let f = file_f(fs);
                s.put(&k.chunk(f.ino, 50), b"late").expect("put");
            }),
            ("not below the inode counter", |s, k, _| {
                s.put(&k.counter(), b"2").expect("put");
            }),
        ];
        for (want, hurt) in damage {
            let (store, rec, fs) = populated();
            hurt(&store, &keys(&rec), &fs);
            fs.settle().expect("settle");
            let r = check(&*store, &rec, true, Repair::Nothing).expect("check");
            assert!(
                r.findings.problems.iter().any(|p| p.contains(want)),
                "{want:?} not in {:?}",
                r.findings.problems
            );
        }
    }
}
