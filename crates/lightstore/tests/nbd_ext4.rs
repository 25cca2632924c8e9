//! A file system on a volume: the export exposed as a file with `nbdfuse`,
//! attached with `losetup`, `mkfs.ext4`, mounted with the kernel's ext4;
//! a tree copied in over a 3-node cluster with 2 replicas while one node is
//! killed with SIGKILL halfway; unmount, `e2fsck -fn` clean, mount again,
//! every file equal. Needs root, /dev/fuse and loop devices.

mod nbd_support;
mod node_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nbd_support::{have_tools, run, NbdProc};
use node_support::cluster::TestCluster;

/// Undoes the mounts and devices whatever happens.
struct Mounted {
    fuse_dir: PathBuf,
    mnt: PathBuf,
    loopdev: Option<String>,
    nbdfuse: Child,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        if let Some(l) = &self.loopdev {
            let _ = Command::new("losetup").args(["-d", l]).status();
        }
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.fuse_dir)
            .status();
        let _ = self.nbdfuse.kill();
        let _ = self.nbdfuse.wait();
    }
}

/// A deterministic tree: `files` files of varied sizes in nested folders.
fn make_tree(root: &Path, files: usize) -> u64 {
    let mut total = 0;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..files {
        let dir = root.join(format!("d{}/e{}", i % 17, i % 5));
        std::fs::create_dir_all(&dir).expect("dir");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 60_000) as usize + if i % 50 == 0 { 1 << 20 } else { 0 };
        let data: Vec<u8> = (0..len).map(|j| (j as u64 ^ x) as u8).collect();
        std::fs::write(dir.join(format!("f{i}.bin")), &data).expect("file");
        total += len as u64;
    }
    total
}

/// `(relative path, contents)` of every file under `root`, sorted.
fn read_tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "lost+found") {
                    continue;
                }
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).expect("prefix").to_path_buf();
                out.push((rel, std::fs::read(&p).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn ext4_on_a_volume_survives_a_node_killed_mid_copy() {
    if !have_tools(&["nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fusermount3"]) {
        return;
    }
    let root_ok = unsafe { libc::geteuid() } == 0 && Path::new("/dev/fuse").exists();
    if !root_ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "needs root and /dev/fuse"
        );
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let mut tc = TestCluster::start(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("nbd.sock");
    let nbd = NbdProc::start(
        &tc.addrs.join(","),
        &sock,
        &["--export", "disk", "--size", "384M"],
    );
    let src = tmp.path().join("src");
    let bytes = make_tree(&src, 1200);
    assert!(bytes > 40 << 20, "{bytes}");

    let fuse_dir = tmp.path().join("fuse");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&fuse_dir).expect("fuse dir");
    std::fs::create_dir_all(&mnt).expect("mnt");
    let nbdfuse = Command::new("nbdfuse")
        .arg(fuse_dir.join("disk"))
        .arg("--unix")
        .arg(&sock)
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdfuse");
    let mut m = Mounted {
        fuse_dir: fuse_dir.clone(),
        mnt: mnt.clone(),
        loopdev: None,
        nbdfuse,
    };
    let disk = fuse_dir.join("disk");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !disk.exists() {
        assert!(Instant::now() < deadline, "nbdfuse did not expose the disk");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run("losetup", &["-f", "--show", disk.to_str().expect("path")]);
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    m.loopdev = Some(loopdev.clone());
    run("mkfs.ext4", &["-F", "-q", &loopdev]);
    let mnt_s = mnt.to_str().expect("path");
    run("mount", &["-t", "ext4", &loopdev, mnt_s]);

    // Copy and write back; kill node 1 while that runs (the page cache
    // takes the copy at once, the writeback to the volume takes seconds).
    let mut cp = Command::new("sh")
        .args([
            "-c",
            &format!("cp -a '{}' '{mnt_s}/tree' && sync", src.display()),
        ])
        .spawn()
        .expect("cp");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        cp.try_wait().expect("cp").is_none(),
        "the copy ended before the kill"
    );
    tc.kill(1);
    let status = cp.wait().expect("cp");
    assert!(
        status.success(),
        "cp failed; adapter log:\n{}",
        nbd.log_text()
    );
    run("sync", &[]);
    run("umount", &[mnt_s]);
    let fsck = Command::new("e2fsck")
        .args(["-fn", &loopdev])
        .output()
        .expect("e2fsck");
    assert!(
        fsck.status.success(),
        "e2fsck:\n{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    run("mount", &["-t", "ext4", &loopdev, mnt_s]);
    let want = read_tree(&src);
    let got = read_tree(&mnt.join("tree"));
    assert_eq!(got.len(), want.len(), "file count");
    for ((wp, wd), (gp, gd)) in want.iter().zip(&got) {
        assert_eq!(wp, gp);
        assert!(wd == gd, "{} differs", wp.display());
    }
    eprintln!(
        "ext4: {} files, {} MiB copied; node 1 killed during the copy",
        want.len(),
        bytes >> 20
    );
    drop(m);
}
