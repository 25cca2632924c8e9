//! The file system's logic against the in-memory store: namespace rules,
//! link counts, file contents against an oracle, and recovery after a
//! crash of the adapter (the `FileSystem` dropped without a flush).

use std::sync::Arc;

use client::{MemStore, Store};
use fs::attrs::SetAttr;
use fs::inode::{Kind, ROOT};
use fs::namespace::{Caller, NewNode};
use fs::{registry, FileSystem, FsError};
use proptest::prelude::*;

const ME: Caller = Caller { uid: 0, gid: 0 };

fn new_fs(chunk: u32) -> (Arc<MemStore>, FileSystem, fs::FsRecord) {
    let store = Arc::new(MemStore::new());
    let rec = registry::create(&*store, "t", chunk).expect("create");
    let fs = FileSystem::open(store.clone(), &rec).expect("open");
    (store, fs, rec)
}

/// A deterministic generator of numbers below `n` (xorshift64).
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

fn node(kind: Kind) -> NewNode<'static> {
    NewNode {
        kind,
        perm: 0o644,
        rdev: 0,
        target: b"",
    }
}

fn errno<T: std::fmt::Debug>(r: fs::Result<T>) -> i32 {
    match r {
        Err(FsError::Posix(e)) => e.0,
        other => panic!("expected an errno, got {other:?}"),
    }
}

#[test]
fn names_follow_posix() {
    let (_s, fs, _) = new_fs(4096);
    let d = fs.make(ME, ROOT, b"d", node(Kind::Dir)).expect("mkdir");
    assert_eq!(fs.inode(ROOT).expect("root").nlink, 3);
    let f = fs.make(ME, d.ino, b"f", node(Kind::File)).expect("create");
    assert_eq!(
        errno(fs.make(ME, d.ino, b"f", node(Kind::File))),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.make(ME, f.ino, b"x", node(Kind::File))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.make(ME, ROOT, &[b'a'; 256], node(Kind::File))),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(fs.rmdir(ROOT, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.unlink(ROOT, b"d")), libc::EISDIR);
    assert_eq!(errno(fs.rmdir(d.ino, b"f")), libc::ENOTDIR);
    assert_eq!(errno(fs.lookup(ROOT, b"nope")), libc::ENOENT);

    // Hard links count, and the last unlink removes the inode.
    fs.link(f.ino, ROOT, b"g").expect("link");
    assert_eq!(fs.inode(f.ino).expect("f").nlink, 2);
    fs.unlink(d.ino, b"f").expect("unlink");
    assert_eq!(fs.lookup(ROOT, b"g").expect("g").nlink, 1);
    fs.unlink(ROOT, b"g").expect("unlink");
    assert_eq!(errno(fs.inode(f.ino)), libc::ENOENT);

    // A directory cannot move below itself.
    let sub = fs.make(ME, d.ino, b"sub", node(Kind::Dir)).expect("mkdir");
    assert_eq!(
        errno(fs.rename(ROOT, b"d", sub.ino, b"x", false, false)),
        libc::EINVAL
    );
    // Moving a directory moves its `..` and link counts.
    fs.rename(d.ino, b"sub", ROOT, b"sub2", false, false)
        .expect("rename");
    assert_eq!(fs.inode(sub.ino).expect("sub").parent, ROOT);
    assert_eq!(fs.inode(d.ino).expect("d").nlink, 2);
    assert_eq!(fs.inode(ROOT).expect("root").nlink, 4);
    fs.rmdir(ROOT, b"sub2").expect("rmdir");
    fs.rmdir(ROOT, b"d").expect("rmdir");
    assert_eq!(fs.inode(ROOT).expect("root").nlink, 2);
    assert!(fs.list_dir(ROOT).expect("ls").is_empty());
}

#[test]
fn rename_replaces_refuses_and_exchanges() {
    let (_s, fs, _) = new_fs(4096);
    let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("a");
    let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("b");
    let d = fs.make(ME, ROOT, b"d", node(Kind::Dir)).expect("d");
    assert_eq!(
        errno(fs.rename(ROOT, b"a", ROOT, b"b", true, false)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.rename(ROOT, b"a", ROOT, b"d", false, false)),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs.rename(ROOT, b"d", ROOT, b"a", false, false)),
        libc::ENOTDIR
    );
    fs.rename(ROOT, b"a", ROOT, b"b", false, true)
        .expect("exchange");
    assert_eq!(fs.lookup(ROOT, b"a").expect("a").ino, b.ino);
    assert_eq!(fs.lookup(ROOT, b"b").expect("b").ino, a.ino);
    fs.rename(ROOT, b"a", ROOT, b"b", false, false)
        .expect("replace");
    assert_eq!(fs.lookup(ROOT, b"b").expect("b").ino, b.ino);
    assert_eq!(errno(fs.inode(a.ino)), libc::ENOENT);
    // Exchanging a file and a directory across directories.
    fs.rename(ROOT, b"b", d.ino, b"b", false, false)
        .expect("move");
    let e = fs.make(ME, ROOT, b"e", node(Kind::Dir)).expect("e");
    fs.rename(d.ino, b"b", ROOT, b"e", false, true)
        .expect("exchange");
    assert_eq!(fs.inode(e.ino).expect("e").parent, d.ino);
    assert_eq!(fs.inode(d.ino).expect("d").nlink, 3);
    assert_eq!(fs.inode(ROOT).expect("root").nlink, 3);
    // Renaming onto itself (a hard link of the same inode) does nothing.
    fs.link(b.ino, ROOT, b"b2").expect("link");
    fs.rename(ROOT, b"e", ROOT, b"b2", false, false)
        .expect("same inode");
    assert_eq!(fs.inode(b.ino).expect("b").nlink, 2);
}

#[test]
fn unlinked_open_files_keep_their_data_until_released() {
    let (store, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.opened(f.ino);
    fs.write(f.ino, 0, &[7u8; 10_000]).expect("write");
    fs.unlink(ROOT, b"f").expect("unlink");
    assert_eq!(fs.read(f.ino, 0, 10).expect("read"), [7u8; 10]);
    let before = store.len();
    fs.released(f.ino).expect("release");
    assert_eq!(errno(fs.inode(f.ino)), libc::ENOENT);
    assert!(store.len() < before - 2, "chunks reclaimed");
}

#[test]
fn an_unlinked_file_the_kernel_still_knows_is_reclaimed_at_forget() {
    let (store, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.pin(f.ino, 2); // two lookups
    fs.write(f.ino, 0, &[5u8; 9000]).expect("write");
    fs.flush_inode(f.ino).expect("flush");
    fs.unlink(ROOT, b"f").expect("unlink");
    // A write-back after close still lands.
    fs.write(f.ino, 9000, b"late").expect("late write");
    fs.unpin(f.ino, 1).expect("forget one");
    assert!(fs.inode(f.ino).is_ok());
    let before = store.len();
    fs.unpin(f.ino, 1).expect("forget the last");
    assert_eq!(errno(fs.inode(f.ino)), libc::ENOENT);
    assert!(store.len() < before);
}

/// A directory this mount made, or listed whole once, lists from the
/// mount's cache without a store read (the mount owns the file system);
/// another mount lists the same names from the store.
#[test]
fn whole_directories_list_from_the_cache() {
    let (store, fs, rec) = new_fs(4096);
    let d = fs.make(ME, ROOT, b"d", node(Kind::Dir)).expect("d");
    for n in [&b"b"[..], b"a", b"c"] {
        fs.make(ME, d.ino, n, node(Kind::File)).expect("file");
    }
    fs.unlink(d.ino, b"c").expect("unlink");
    let names = |fs: &FileSystem| -> Vec<Vec<u8>> {
        fs.list_dir(d.ino)
            .expect("list")
            .into_iter()
            .map(|e| e.0)
            .collect()
    };
    let ranges = || store.ranges.load(std::sync::atomic::Ordering::Relaxed);
    let before = ranges();
    assert_eq!(names(&fs), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(ranges(), before, "listed from the cache");
    fs.flush_all().expect("flush");
    let other = FileSystem::open(store.clone(), &rec).expect("reopen");
    assert_eq!(names(&other), [b"a".to_vec(), b"b".to_vec()]);
    let read = ranges();
    assert!(read > before, "a new mount reads the store");
    other.make(ME, d.ino, b"e", node(Kind::File)).expect("e");
    assert_eq!(names(&other).len(), 3);
    assert_eq!(ranges(), read, "listed whole once, then from the cache");
}

/// A listing's inodes come from the cache, and those it lacks from one
/// multi-get (READDIRPLUS), equal to what single lookups give; a name
/// whose inode is gone comes back empty.
#[test]
fn a_listings_inodes_take_one_store_read() {
    let (store, fs, rec) = new_fs(4096);
    let inos: Vec<u64> = (0..50)
        .map(|i| {
            fs.make(ME, ROOT, format!("f{i}").as_bytes(), node(Kind::File))
                .expect("file")
                .ino
        })
        .collect();
    fs.flush_all().expect("flush");
    let mgets = || store.mgets.load(std::sync::atomic::Ordering::Relaxed);
    let before = mgets();
    let cached = fs.inodes(&inos).expect("inodes");
    assert_eq!(mgets(), before, "all cached");
    let other = FileSystem::open(store.clone(), &rec).expect("reopen");
    let mut asked = inos.clone();
    asked.push(u64::MAX - 1); // never made
    let before = mgets();
    let fetched = other.inodes(&asked).expect("inodes");
    assert_eq!(mgets(), before + 1, "one multi-get for the whole window");
    assert_eq!(fetched.last(), Some(&None));
    for ((ino, a), b) in inos.iter().zip(&cached).zip(&fetched) {
        let (a, b) = (a.as_ref().expect("cached"), b.as_ref().expect("fetched"));
        assert_eq!(a.ino, *ino);
        assert_eq!(a, b);
    }
    let before = mgets();
    other.inodes(&inos).expect("inodes");
    assert_eq!(mgets(), before, "now cached");
}

/// Writers on one file run at the same time, some on the same chunks,
/// some growing the file: every byte ends as one of the writes left it,
/// in the order each chunk's writes ran, and the size is the furthest end.
#[test]
fn concurrent_writes_to_one_file_lose_nothing() {
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("create");
    const WRITERS: u64 = 6;
    const ROUNDS: u64 = 200;
    // Writer w owns bytes w*100..w*100+100 of every 1000-byte stride: its
    // writes share chunks with the others' but never bytes.
    std::thread::scope(|scope| {
        for w in 0..WRITERS {
            let fs = &fs;
            scope.spawn(move || {
                for r in 0..ROUNDS {
                    let stride = (r * 7 + w) % ROUNDS;
                    let at = stride * 1000 + w * 100;
                    fs.write(f.ino, at, &[w as u8 + 1; 100]).expect("write");
                }
            });
        }
    });
    let size = fs.inode(f.ino).expect("inode").size;
    assert_eq!(size, (ROUNDS - 1) * 1000 + (WRITERS - 1) * 100 + 100);
    let data = fs.read(f.ino, 0, size as u32).expect("read");
    for (i, &b) in data.iter().enumerate() {
        let (within, owner) = (i as u64 % 1000, i as u64 % 1000 / 100);
        let want = if within < WRITERS * 100 {
            owner as u8 + 1
        } else {
            0
        };
        assert_eq!(b, want, "byte {i}");
    }
}

#[test]
fn sparse_files_and_truncation_read_zeros() {
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.write(f.ino, 10_000, b"end").expect("write");
    let all = fs.read(f.ino, 0, 20_000).expect("read");
    assert_eq!(all.len(), 10_003);
    assert!(all[..10_000].iter().all(|&b| b == 0));
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(10_001),
            ..Default::default()
        },
    )
    .expect("truncate");
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(20_000),
            ..Default::default()
        },
    )
    .expect("grow");
    let all = fs.read(f.ino, 0, 30_000).expect("read");
    assert_eq!(&all[10_000..10_003], b"e\0\0");
}

#[test]
fn set_id_bits_drop_when_asked_and_survive_a_remount() {
    let (store, fs, rec) = new_fs(4096);
    let mut new = node(Kind::File);
    new.perm = 0o6755;
    let f = fs.make(ME, ROOT, b"f", new).expect("f");
    let chown = SetAttr {
        uid: Some(7),
        drop_set_id: true,
        ..Default::default()
    };
    assert_eq!(fs.setattr(f.ino, &chown).expect("chown").perm, 0o755);
    // An explicit mode in the same call wins.
    let both = SetAttr {
        mode: Some(0o4711),
        drop_set_id: true,
        ..Default::default()
    };
    assert_eq!(fs.setattr(f.ino, &both).expect("chmod").perm, 0o4711);
    // A write by a caller without CAP_FSETID.
    fs.drop_set_id(f.ino).expect("drop");
    fs.write(f.ino, 0, b"data").expect("write");
    assert_eq!(fs.inode(f.ino).expect("stat").perm, 0o711);
    fs.flush_all().expect("flush");
    drop(fs);
    let fs = FileSystem::open(store, &rec).expect("reopen");
    assert_eq!(fs.inode(f.ino).expect("stat").perm, 0o711);
}

#[test]
fn copy_range_copies_data_and_holes_and_stops_at_the_end() {
    let (_s, fs, _) = new_fs(4096);
    let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("a");
    let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("b");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    fs.write(a.ino, 0, &data).expect("write");
    fs.write(a.ino, 30_000, b"tail").expect("write past a hole");
    // Unaligned, across a hole, to another file's middle.
    assert_eq!(
        fs.copy_range(a.ino, 1_000, b.ino, 5, 40_000).expect("copy"),
        30_004 - 1_000,
        "stops at the source's end"
    );
    let mut want = vec![0u8; 5];
    let mut src = data.clone();
    src.resize(30_000, 0);
    src.extend_from_slice(b"tail");
    want.extend_from_slice(&src[1_000..]);
    assert_eq!(fs.read(b.ino, 0, 100_000).expect("read"), want);
    assert_eq!(fs.inode(b.ino).expect("stat").size, want.len() as u64);
    // Within one file, not overlapping; from past the end nothing.
    assert_eq!(
        fs.copy_range(a.ino, 0, a.ino, 50_000, 100).expect("copy"),
        100
    );
    assert_eq!(fs.read(a.ino, 50_000, 100).expect("read"), &data[..100]);
    assert_eq!(fs.copy_range(a.ino, 60_000, b.ino, 0, 10).expect("copy"), 0);
    // Large enough for several pieces copied at once.
    let big: Vec<u8> = (0..(9 << 20) + 5u32).map(|i| (i % 253) as u8).collect();
    let c = fs.make(ME, ROOT, b"c", node(Kind::File)).expect("c");
    fs.write(c.ino, 0, &big).expect("write big");
    let d = fs.make(ME, ROOT, b"d", node(Kind::File)).expect("d");
    let n = fs
        .copy_range(c.ino, 3, d.ino, 1, u64::MAX)
        .expect("copy big");
    assert_eq!(n, big.len() as u64 - 3);
    let copy = fs.read(d.ino, 1, u32::MAX).expect("read big");
    assert!(copy == big[3..], "the pieces landed in order");
}

#[test]
fn copy_range_matches_a_byte_copy_on_random_sparse_files() {
    let mut rand = xorshift(0x9e37_79b9_7f4a_7c15u64);
    for round in 0..12 {
        let (_s, fs, _) = new_fs(4096);
        let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("a");
        let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("b");
        let mut want_a = Vec::new();
        let mut want_b = Vec::new();
        for (ino, want) in [(a.ino, &mut want_a), (b.ino, &mut want_b)] {
            for _ in 0..6 {
                let at = rand(3 << 20);
                let len = 1 + rand(300_000);
                let byte = 1 + rand(250) as u8;
                fs.write(ino, at, &vec![byte; len as usize]).expect("write");
                let end = (at + len) as usize;
                if want.len() < end {
                    want.resize(end, 0);
                }
                want[at as usize..end].fill(byte);
            }
        }
        let (from_at, to_at, len) = (rand(3 << 20), rand(3 << 20), rand(4 << 20));
        let n = fs
            .copy_range(a.ino, from_at, b.ino, to_at, len)
            .expect("copy");
        let copied = len.min((want_a.len() as u64).saturating_sub(from_at));
        assert_eq!(n, copied, "round {round}");
        if copied > 0 {
            let end = (to_at + copied) as usize;
            if want_b.len() < end {
                want_b.resize(end, 0);
            }
            let src = &want_a[from_at as usize..(from_at + copied) as usize];
            want_b[to_at as usize..end].copy_from_slice(src);
        }
        let got = fs.read(b.ino, 0, u32::MAX).expect("read");
        assert!(
            got == want_b,
            "round {round}: copy of {len} from {from_at} to {to_at}"
        );
    }
}

#[test]
fn copy_range_keeps_holes_and_punches_them_into_the_destination() {
    let (store, fs, _) = new_fs(4096);
    let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("a");
    // 1 TiB, data only at 1 MiB and at the end.
    let size = 1u64 << 40;
    fs.write(a.ino, 1 << 20, b"one").expect("write");
    fs.write(a.ino, size - 3, b"end").expect("write");
    let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("b");
    // The destination has data where the source has a hole.
    fs.write(b.ino, 5 << 20, &[7u8; 10_000]).expect("old data");
    fs.flush_all().expect("flush");
    let mut off = 0;
    while off < size {
        let n = fs
            .copy_range(a.ino, off, b.ino, off, size - off)
            .expect("copy");
        assert!(n > 0, "progress at {off}");
        off += n;
    }
    assert_eq!(fs.inode(b.ino).expect("stat").size, size);
    assert_eq!(fs.read(b.ino, (1 << 20) - 1, 5).expect("read"), b"\0one\0");
    assert_eq!(fs.read(b.ino, 5 << 20, 10).expect("read"), vec![0u8; 10]);
    assert_eq!(fs.read(b.ino, size - 4, 10).expect("read"), b"\0end");
    // Only the chunks with data were written: the store holds a handful.
    let (start, end) = (b"".as_slice(), b"\xff\xff\xff\xff".as_slice());
    let keys = store.range_keys(start, end, 100_000).expect("keys").len();
    assert!(keys < 50, "{keys} keys after copying a sparse TiB");
}

#[test]
fn files_reach_the_kernels_size_limit() {
    // The kernel caches writes up to MAX_LFS_FILESIZE (i64::MAX) before
    // the adapter sees them, so the adapter must take all of them.
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    let last = i64::MAX as u64 - 1;
    fs.write(f.ino, 1 << 62, b"mid").expect("write at 4 EiB");
    fs.write(f.ino, last, b"z").expect("write the last byte");
    assert_eq!(fs.inode(f.ino).expect("stat").size, i64::MAX as u64);
    assert_eq!(fs.read(f.ino, last - 1, 10).expect("read"), b"\0z");
    assert_eq!(errno(fs.write(f.ino, last, b"zz")), libc::EFBIG);
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(3),
            ..Default::default()
        },
    )
    .expect("truncate");
    assert_eq!(fs.read(f.ino, 0, 10).expect("read"), b"\0\0\0");
}

#[test]
fn fallocate_grows_and_punches_holes() {
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.write(f.ino, 0, &[9u8; 20_000]).expect("write");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f.ino, 1000, 10_000, punch).expect("punch");
    let all = fs.read(f.ino, 0, 30_000).expect("read");
    assert_eq!(all.len(), 20_000);
    assert!(all[..1000].iter().all(|&b| b == 9));
    assert!(all[1000..11_000].iter().all(|&b| b == 0));
    assert!(all[11_000..].iter().all(|&b| b == 9));
    fs.fallocate(f.ino, 0, 50_000, libc::FALLOC_FL_KEEP_SIZE)
        .expect("keep size");
    assert_eq!(fs.inode(f.ino).expect("f").size, 20_000);
    fs.fallocate(f.ino, 40_000, 10_000, 0).expect("grow");
    assert_eq!(fs.inode(f.ino).expect("f").size, 50_000);
    assert!(fs
        .read(f.ino, 20_000, 30_000)
        .expect("read")
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        errno(fs.fallocate(f.ino, 0, 1, libc::FALLOC_FL_COLLAPSE_RANGE)),
        libc::EOPNOTSUPP
    );
}

/// SEEK_DATA and SEEK_HOLE follow the chunks a file holds: a held chunk
/// is data whole, a chunk never written or punched out is a hole, the end
/// is a hole, and past the end is ENXIO.
#[test]
fn seek_finds_the_chunks_a_file_holds() {
    use fs::seek::Seek::{Data, Hole};
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    // Chunks 2 and 3 (written from the middle of 2), 10 (partly), size
    // 100,000 (chunk 24's middle).
    fs.write(f.ino, 8195, &[1u8; 8000]).expect("write 2-3");
    fs.write(f.ino, 40_960, &[2u8; 100]).expect("write 10");
    fs.fallocate(f.ino, 99_999, 1, 0).expect("grow");
    let seek = |at, to| fs.seek(f.ino, at, to);
    assert_eq!(seek(0, Data).expect("data from 0"), 8192);
    assert_eq!(seek(0, Hole).expect("hole at 0"), 0);
    assert_eq!(seek(8192, Data).expect("inside data"), 8192);
    assert_eq!(seek(9000, Hole).expect("hole after 3"), 16_384);
    assert_eq!(seek(16_384, Data).expect("data at 10"), 40_960);
    assert_eq!(seek(41_000, Hole).expect("hole after 10"), 45_056);
    assert_eq!(errno(seek(45_056, Data)), libc::ENXIO, "only holes follow");
    assert_eq!(seek(99_000, Hole).expect("inside the last hole"), 99_000);
    assert_eq!(errno(seek(100_000, Data)), libc::ENXIO);
    assert_eq!(errno(seek(100_000, Hole)), libc::ENXIO);
    // A punched chunk is a hole; a partly punched one stays data.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f.ino, 12_288, 4096, punch).expect("punch 3");
    fs.fallocate(f.ino, 8192, 10, punch)
        .expect("punch part of 2");
    assert_eq!(seek(8192, Hole).expect("hole at 3"), 12_288);
    assert_eq!(seek(0, Data).expect("2 is still data"), 8192);
    // A file of data throughout has its one hole at the end.
    let g = fs.make(ME, ROOT, b"g", node(Kind::File)).expect("g");
    fs.write(g.ino, 0, &[3u8; 10_000]).expect("write g");
    assert_eq!(seek_of(&fs, g.ino, 0, Hole), 10_000);
    assert_eq!(seek_of(&fs, g.ino, 9_999, Data), 9_999);
    let d = fs.make(ME, ROOT, b"d", node(Kind::Dir)).expect("d");
    assert_eq!(errno(fs.seek(d.ino, 0, Data)), libc::EISDIR);
}

fn seek_of(fs: &FileSystem, ino: u64, at: u64, to: fs::seek::Seek) -> u64 {
    fs.seek(ino, at, to).expect("seek")
}

/// Whatever a file's holes, a copier that reads from each SEEK_DATA to the
/// next SEEK_HOLE and skips the rest misses no byte of data, and each
/// answer lies inside the file.
#[test]
fn copying_by_seek_data_and_seek_hole_misses_no_data() {
    use fs::seek::Seek::{Data, Hole};
    let mut rand = xorshift(0x2545_f491_4f6c_dd1du64);
    for round in 0..20 {
        let (_s, fs, _) = new_fs(4096);
        let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
        for _ in 0..1 + rand(8) {
            // Half the ranges start and end on chunk boundaries.
            let aligned = rand(2) == 0;
            let (mut at, mut len) = (rand(1 << 20), 1 + rand(40_000));
            if aligned {
                (at, len) = (at / 4096 * 4096, len.div_ceil(4096) * 4096);
            }
            if rand(3) == 0 {
                let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                fs.fallocate(f.ino, at, len, punch).expect("punch");
            } else {
                fs.write(f.ino, at, &vec![1 + rand(250) as u8; len as usize])
                    .expect("write");
            }
        }
        let size = fs.inode(f.ino).expect("f").size;
        let want = fs.read(f.ino, 0, u32::MAX).expect("read");
        let mut copy = vec![0u8; size as usize];
        let mut at = 0;
        while at < size {
            let data = match fs.seek(f.ino, at, Data) {
                Ok(d) => d,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENXIO, "round {round}");
                    break;
                }
            };
            let hole = fs.seek(f.ino, data, Hole).expect("hole");
            assert!(at <= data && data < hole && hole <= size, "round {round}");
            copy[data as usize..hole as usize].copy_from_slice(&want[data as usize..hole as usize]);
            at = hole;
        }
        assert!(copy == want, "round {round}: seeking skipped data");
    }
}

/// `st_blocks` is the size for a dense file and the chunks held for one
/// that may have holes, whether it was just written or counted afresh by
/// the next mount; never fewer than the data takes.
#[test]
fn blocks_count_what_a_sparse_file_holds() {
    let (store, fs, rec) = new_fs(4096);
    let blocks = |fs: &FileSystem, ino| fs.blocks(&fs.inode(ino).expect("inode"));
    let f = fs.make(ME, ROOT, b"dense", node(Kind::File)).expect("f");
    fs.write(f.ino, 0, &[1u8; 100_000]).expect("write");
    assert_eq!(blocks(&fs, f.ino), 196, "dense: the size");

    let s = fs.make(ME, ROOT, b"sparse", node(Kind::File)).expect("s");
    fs.write(s.ino, 1 << 20, &[2u8; 4096])
        .expect("write past the end");
    assert_eq!(blocks(&fs, s.ino), 8, "one chunk of 257");
    fs.write(s.ino, 0, &[3u8; 100]).expect("write into a hole");
    assert_eq!(blocks(&fs, s.ino), 16, "two chunks");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(s.ino, 0, 4096, punch).expect("punch");
    assert_eq!(blocks(&fs, s.ino), 8, "counted again after the punch");

    let t = fs.make(ME, ROOT, b"grown", node(Kind::File)).expect("t");
    let grow = SetAttr {
        size: Some(1 << 30),
        ..Default::default()
    };
    fs.setattr(t.ino, &grow).expect("truncate up");
    assert_eq!(blocks(&fs, t.ino), 0, "all holes");
    fs.write(t.ino, 5 << 20, b"x").expect("write one byte");
    assert_eq!(blocks(&fs, t.ino), 8);

    // The next mount counts from the store what this one kept.
    fs.flush_all().expect("flush");
    drop(fs);
    let fs = FileSystem::open(store, &rec).expect("reopen");
    assert_eq!(blocks(&fs, f.ino), 196);
    assert_eq!(blocks(&fs, s.ino), 8);
    assert_eq!(blocks(&fs, t.ino), 8);
}

/// A large file's count is kept as an upper bound after a punched range
/// (no listing of every chunk after each discard); the next mount counts
/// it afresh.
#[test]
fn a_large_files_count_stays_an_upper_bound_after_a_punch() {
    let (store, fs, rec) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"big", node(Kind::File)).expect("f");
    let grow = SetAttr {
        size: Some(20 << 20),
        ..Default::default()
    };
    fs.setattr(f.ino, &grow)
        .expect("truncate up: may have holes");
    fs.write(f.ino, 0, &vec![5u8; 20 << 20])
        .expect("write 5,120 chunks");
    let blocks = |fs: &FileSystem| fs.blocks(&fs.inode(f.ino).expect("f"));
    assert_eq!(blocks(&fs), 40_960);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    fs.fallocate(f.ino, 0, 1 << 20, punch).expect("punch 1 MiB");
    assert_eq!(blocks(&fs), 40_960, "kept, not listed again");
    fs.flush_all().expect("flush");
    drop(fs);
    let fs = FileSystem::open(store, &rec).expect("reopen");
    assert_eq!(blocks(&fs), 38_912, "counted afresh");
}

/// Over random writes, punches and truncations, the blocks a mount keeps
/// for a file are never fewer than a fresh count of what it holds (and
/// never more than its size), so no tool takes data for holes.
#[test]
fn kept_block_counts_never_fall_below_what_is_held() {
    let mut rand = xorshift(0x51_7cc1_b727_220au64);
    for round in 0..20 {
        let (store, fs, rec) = new_fs(4096);
        let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
        let mut kept = Vec::new();
        for _ in 0..1 + rand(10) {
            let (at, len) = (rand(2 << 20), 1 + rand(30_000));
            match rand(5) {
                0 => {
                    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    fs.fallocate(f.ino, at, len, punch).expect("punch");
                }
                1 => {
                    let size = SetAttr {
                        size: Some(at),
                        ..Default::default()
                    };
                    fs.setattr(f.ino, &size).expect("truncate");
                }
                _ => fs
                    .write(f.ino, at, &vec![7u8; len as usize])
                    .expect("write"),
            }
            kept.push(fs.blocks(&fs.inode(f.ino).expect("f")));
        }
        let i = fs.inode(f.ino).expect("f");
        let last = *kept.last().expect("a block count");
        fs.flush_all().expect("flush");
        drop(fs);
        let fresh = FileSystem::open(store, &rec).expect("reopen");
        let counted = fresh.blocks(&fresh.inode(f.ino).expect("f"));
        assert!(
            counted <= last && last <= i.size.div_ceil(512),
            "round {round}: kept {last}, counted {counted}, size {}",
            i.size
        );
        let data = fresh.read(f.ino, 0, u32::MAX).expect("read");
        assert!(
            counted > 0 || data.iter().all(|&b| b == 0),
            "round {round}: data in a file of no blocks"
        );
    }
}

#[test]
fn holes_punched_through_large_sparse_files_cost_what_they_hold() {
    use std::sync::atomic::Ordering;
    let (store, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    // A 1 TiB file holding a few chunks (268 million chunks of 4 KiB).
    let size = 1u64 << 40;
    let marks = [5000u64, 3 << 30, (1 << 39) + 77, size - 10];
    for &at in &marks {
        fs.write(f.ino, at, b"data").expect("write");
    }
    fs.fsync(f.ino).expect("fsync");
    assert_eq!(fs.inode(f.ino).expect("f").size, size - 6);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // Through the middle two marks, from inside the first chunk to inside
    // the last: the ends are rewritten, everything between deleted.
    fs.fallocate(f.ino, 5002, size - 5002 - 9, punch)
        .expect("punch");
    assert_eq!(fs.read(f.ino, 5000, 4).expect("read"), b"da\0\0");
    assert_eq!(fs.read(f.ino, size - 10, 4).expect("read"), b"\0ata");
    for &at in &marks[1..3] {
        assert_eq!(fs.read(f.ino, at, 4).expect("read"), [0; 4], "at {at}");
    }
    assert!(
        store.largest_write.load(Ordering::Relaxed) <= 1000,
        "{} keys in one write",
        store.largest_write.load(Ordering::Relaxed)
    );
    // Truncating it away lists what is left instead of naming every chunk.
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .expect("truncate");
    assert!(store.largest_write.load(Ordering::Relaxed) <= 1000);
    assert_eq!(fs.read(f.ino, 0, 10).expect("read"), b"");
}

#[test]
fn a_crash_drops_unflushed_growth_and_keeps_what_was_flushed() {
    let (store, fs, rec) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.write(f.ino, 0, &[1u8; 5000]).expect("write");
    fs.fsync(f.ino).expect("fsync");
    // Grows past the stored size; the crash comes before a flush.
    fs.write(f.ino, 5000, &[2u8; 5000]).expect("write");
    drop(fs);
    let fs = FileSystem::open(store.clone(), &rec).expect("reopen");
    assert_eq!(fs.inode(f.ino).expect("f").size, 5000);
    assert_eq!(fs.read(f.ino, 0, 5000).expect("read"), vec![1u8; 5000]);
    // Growing again shows zeros, not the lost bytes.
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(10_000),
            ..Default::default()
        },
    )
    .expect("grow");
    assert!(fs
        .read(f.ino, 5000, 5000)
        .expect("read")
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_crash_before_reclaim_is_finished_at_the_next_open() {
    let (store, fs, rec) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    fs.opened(f.ino);
    fs.write(f.ino, 0, &[3u8; 9000]).expect("write");
    fs.unlink(ROOT, b"f").expect("unlink");
    let with_data = store.len();
    drop(fs); // crashed while the file was open
    let fs = FileSystem::open(store.clone(), &rec).expect("reopen");
    assert_eq!(errno(fs.inode(f.ino)), libc::ENOENT);
    assert!(store.len() < with_data);
}

#[test]
fn xattrs_create_replace_list_remove() {
    let (_s, fs, _) = new_fs(4096);
    use fs::attrs::XattrMode;
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    assert_eq!(errno(fs.getxattr(f.ino, b"user.a")), libc::ENODATA);
    assert_eq!(
        errno(fs.setxattr(f.ino, b"user.a", b"1", XattrMode::Replace)),
        libc::ENODATA
    );
    fs.setxattr(f.ino, b"user.a", b"1", XattrMode::Create)
        .expect("set");
    assert_eq!(
        errno(fs.setxattr(f.ino, b"user.a", b"2", XattrMode::Create)),
        libc::EEXIST
    );
    fs.setxattr(f.ino, b"user.b", b"2", XattrMode::Any)
        .expect("set");
    assert_eq!(
        fs.listxattr(f.ino).expect("list"),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    fs.removexattr(f.ino, b"user.a").expect("remove");
    assert_eq!(errno(fs.removexattr(f.ino, b"user.a")), libc::ENODATA);
    assert_eq!(fs.getxattr(f.ino, b"user.b").expect("get"), b"2");
}

#[test]
fn a_lost_lease_fences_every_change() {
    let (_s, fs, _) = new_fs(4096);
    let f = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f");
    let fence = client::lease::Fence::held();
    fence.revoke();
    fs.fence_with(fence);
    assert_eq!(
        errno(fs.make(ME, ROOT, b"g", node(Kind::File))),
        libc::EROFS
    );
    assert_eq!(errno(fs.write(f.ino, 0, b"x")), libc::EROFS);
    assert_eq!(errno(fs.unlink(ROOT, b"f")), libc::EROFS);
    assert_eq!(
        errno(fs.setattr(
            f.ino,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )),
        libc::EROFS
    );
    assert!(fs.lookup(ROOT, b"f").is_ok(), "reads still work");
    // Held again (renewed, or taken again at a remount).
    fs.fence_with(client::lease::Fence::held());
    fs.write(f.ino, 0, b"x").expect("writable again");
}

#[test]
fn write_behind_keeps_order_and_fsync_waits_for_it() {
    let store = Arc::new(MemStore::new());
    let rec = registry::create(&*store, "t", 4096).expect("create");
    let fs = Arc::new(FileSystem::open(store.clone(), &rec).expect("open"));
    let writer = fs.start_write_behind().expect("start");
    let d = fs.make(ME, ROOT, b"d", node(Kind::Dir)).expect("mkdir");
    for i in 0..200u32 {
        let f = fs
            .make(ME, d.ino, format!("f{i}").as_bytes(), node(Kind::File))
            .expect("create");
        fs.write(f.ino, 0, &i.to_le_bytes()).expect("write");
        fs.flush_inode(f.ino).expect("close");
        if i % 2 == 0 {
            fs.rename(
                d.ino,
                format!("f{i}").as_bytes(),
                ROOT,
                format!("g{i}").as_bytes(),
                false,
                false,
            )
            .expect("rename");
        }
    }
    // Reads of the store wait for the queue: the listing is complete.
    assert_eq!(fs.list_dir(d.ino).expect("ls").len(), 100);
    fs.sync_all().expect("sync");
    fs.stop_write_behind();
    writer.join().expect("writer");
    drop(fs);
    let fs = FileSystem::open(store.clone(), &rec).expect("reopen");
    assert_eq!(fs.list_dir(ROOT).expect("ls").len(), 101);
    let g = fs.lookup(ROOT, b"g42").expect("g42");
    assert_eq!(fs.read(g.ino, 0, 4).expect("read"), 42u32.to_le_bytes());
    assert_eq!(fs.inode(d.ino).expect("d").nlink, 2);
}

#[test]
fn inode_numbers_survive_a_restart() {
    let (store, fs, rec) = new_fs(4096);
    let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("a");
    drop(fs);
    let fs = FileSystem::open(store.clone(), &rec).expect("reopen");
    let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("b");
    assert!(b.ino > a.ino);
    assert!(store.get(b"nothing").expect("get").is_none());
}

#[derive(Clone, Debug)]
enum Op {
    Write(u64, Vec<u8>),
    Truncate(u64),
    Flush,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..40_000, prop::collection::vec(any::<u8>(), 1..9000)).prop_map(|(o, d)| Op::Write(o, d)),
        1 => (0u64..50_000).prop_map(Op::Truncate),
        1 => Just(Op::Flush),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// File contents match a byte-vector oracle through writes,
    /// truncations and crashes; a crash returns the file to what it held at
    /// its last flush.
    #[test]
    fn contents_match_the_oracle(ops in prop::collection::vec(op(), 1..30)) {
        let (store, mut fs, rec) = new_fs(4096);
        let ino = fs.make(ME, ROOT, b"f", node(Kind::File)).expect("f").ino;
        let mut live: Vec<u8> = Vec::new();
        let mut flushed: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Write(o, d) => {
                    fs.write(ino, o, &d).expect("write");
                    let end = o as usize + d.len();
                    if live.len() < end { live.resize(end, 0); }
                    live[o as usize..end].copy_from_slice(&d);
                }
                Op::Truncate(n) => {
                    fs.setattr(ino, &SetAttr { size: Some(n), ..Default::default() }).expect("truncate");
                    live.resize(n as usize, 0);
                    // Truncation writes the inode: it is flushed.
                    flushed = live.clone();
                }
                Op::Flush => {
                    fs.flush_inode(ino).expect("flush");
                    flushed = live.clone();
                }
                Op::Crash => {
                    drop(fs);
                    fs = FileSystem::open(store.clone(), &rec).expect("reopen");
                    // Bytes written in place below the stored size may
                    // survive (data before metadata); the size is the
                    // flushed one. Compare the size, then adopt what is
                    // there below it as the new truth.
                    prop_assert_eq!(fs.inode(ino).expect("f").size, flushed.len() as u64);
                    live = fs.read(ino, 0, 1 << 20).expect("read");
                    flushed = live.clone();
                }
            }
            let got = fs.read(ino, 0, 1 << 20).expect("read");
            prop_assert_eq!(got.len(), live.len());
            prop_assert!(got == live, "contents differ");
            // Growing exposes zeros only.
            let _ = &store;
        }
        let end = live.len() as u64;
        fs.setattr(ino, &SetAttr { size: Some(end + 10_000), ..Default::default() }).expect("grow");
        prop_assert!(fs.read(ino, end, 10_000).expect("read").iter().all(|&b| b == 0));
    }
}

/// A loss of acknowledged writes (a node that restarted without a clean
/// stop) is reported once to each file open at the time, at its next
/// `fsync`, as Linux reports a writeback error to each file: the file
/// whose data was lost hears of it even if another file synced first, and
/// a file opened afterwards does not.
#[test]
fn each_open_file_hears_of_a_loss_once_at_fsync() {
    let (store, fs, _) = new_fs(4096);
    let a = fs.make(ME, ROOT, b"a", node(Kind::File)).expect("create");
    let b = fs.make(ME, ROOT, b"b", node(Kind::File)).expect("create");
    fs.opened(a.ino);
    fs.opened(b.ino);
    fs.write(a.ino, 0, b"data").expect("write");
    store.lose_unsynced_writes();
    assert!(fs.fsync(b.ino).is_err(), "b hears of it");
    assert!(fs.fsync(a.ino).is_err(), "and so does a");
    fs.fsync(a.ino).expect("once");
    fs.fsync(b.ino).expect("once");
    let c = fs.make(ME, ROOT, b"c", node(Kind::File)).expect("create");
    fs.opened(c.ino);
    fs.fsync(c.ino).expect("opened after the loss");
    // Closed and opened again after the loss: not told again either.
    fs.released(a.ino).expect("release");
    fs.opened(a.ino);
    fs.fsync(a.ino).expect("reopened");
}
