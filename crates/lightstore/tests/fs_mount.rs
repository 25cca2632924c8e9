//! The file adapter end to end: `lightstore fs create` and `lightstore
//! mount` against real nodes, driven with unmodified tools (tar, diff, git,
//! dd, pjdfstest). Needs root and /dev/fuse; under `CI=true` a missing
//! facility or tool fails the test instead of skipping it.

mod nbd_support;
mod node_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nbd_support::have_tools;
use node_support::cluster::TestCluster;
use node_support::lightstore;

/// Whether FUSE mounts are possible here (root, /dev/fuse, fusermount3);
/// under `CI=true` they must be.
fn can_mount() -> bool {
    if !have_tools(&["fusermount3", "tar", "diff", "git"]) {
        return false;
    }
    let ok = unsafe { libc::geteuid() } == 0 && Path::new("/dev/fuse").exists();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "needs root and /dev/fuse"
        );
        eprintln!("skipped: needs root and /dev/fuse");
    }
    ok
}

/// Each thread of process `pid`: its name, where it sleeps and its kernel
/// stack (root reads it), for a test that found the process stuck.
fn thread_stacks(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
        out += &format!(
            "{} {} wchan={}\n{}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan").trim(),
            read("stack")
        );
    }
    out
}

/// Aborts the FUSE connection mounted on `dir`, if any, through
/// `/sys/fs/fuse/connections/N/abort` (N from the mount's device number),
/// mounting the FUSE control file system there first where nothing did.
fn abort_fuse_connection(dir: &Path) {
    let want = dir.to_string_lossy().to_string();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) != Some(&want.as_str()) {
            continue;
        }
        let Some((major, minor)) = fields.get(2).and_then(|d| d.split_once(':')) else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse::<u64>(), minor.parse::<u64>()) else {
            continue;
        };
        let connection = PathBuf::from(format!(
            "/sys/fs/fuse/connections/{}",
            (major << 20) | minor
        ));
        if !connection.exists() {
            let _ = Command::new("mount")
                .args(["-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"])
                .status();
        }
        let _ = std::fs::write(connection.join("abort"), "1");
    }
}

fn is_mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// A running `lightstore mount`; unmounted and stopped when dropped.
struct Mount {
    child: Child,
    dir: PathBuf,
}

impl Mount {
    fn start(nodes: &str, fs: &str, dir: &Path, extra: &[&str]) -> Mount {
        let child = Mount::spawn(nodes, fs, dir, extra);
        let mut m = Mount {
            child,
            dir: dir.to_path_buf(),
        };
        // A mount may first wait up to the lease's lifetime (15 s) for the
        // last mount of its file system on this machine to let go.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(dir) {
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!("lightstore mount exited ({status}): {}", m.stderr());
            }
            assert!(Instant::now() < deadline, "not mounted in time");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn spawn(nodes: &str, fs: &str, dir: &Path, extra: &[&str]) -> Child {
        std::fs::create_dir_all(dir).expect("mountpoint");
        Command::new(env!("CARGO_BIN_EXE_lightstore"))
            .args(["mount", "--nodes", nodes, "--fs", fs])
            .arg(dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lightstore mount")
    }

    fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(e) = self.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Waits up to `limit` for the mount process to exit: its status, or
    /// `None` if it still runs.
    fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM; waits (bounded) for a clean exit. Returns the mount's log.
    fn stop(mut self) -> String {
        self.signal(libc::SIGTERM);
        if let Some(status) = self.exited_within(Duration::from_secs(20)) {
            let log = self.stderr();
            assert!(status.success(), "mount exited with {status}: {log}");
            assert!(!is_mounted(&self.dir), "still mounted after SIGTERM");
            return log;
        }
        let threads = thread_stacks(self.child.id());
        let mounted = is_mounted(&self.dir);
        // Unstick whatever waits on the connection (an unmount in the
        // kernel would keep the process from dying), then end it; its log
        // only once it has exited (the pipe stays open while it lives).
        abort_fuse_connection(&self.dir);
        let _ = self.child.kill();
        let log = match self.exited_within(Duration::from_secs(10)) {
            Some(_) => self.stderr(),
            None => "(still alive 10 s after SIGKILL)".to_string(),
        };
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        panic!(
            "mount did not stop on SIGTERM (still mounted: {mounted})\n\
             its log:\n{log}\nits threads:\n{threads}"
        );
    }

    /// SIGKILL, then detach the dead mount.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.dir)
            .status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.dir) {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.dir)
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(script: &str) -> Output {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A deterministic tree with files of varied sizes (a few over 1 MiB and
/// sparse ones), directories, symlinks and hard links.
fn make_tree(root: &Path, files: usize) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..files {
        let dir = root.join(format!("d{}/e{}", i % 7, i % 3));
        std::fs::create_dir_all(&dir).expect("dir");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 20_000) as usize + if i % 40 == 0 { 1 << 20 } else { 0 };
        let data: Vec<u8> = (0..len).map(|j| (j as u64 ^ x) as u8).collect();
        std::fs::write(dir.join(format!("f{i}")), &data).expect("file");
        if i % 25 == 0 {
            std::os::unix::fs::symlink(format!("f{i}"), dir.join(format!("l{i}")))
                .expect("symlink");
            std::fs::hard_link(dir.join(format!("f{i}")), dir.join(format!("h{i}"))).expect("link");
        }
    }
    let f = std::fs::File::create(root.join("sparse")).expect("sparse");
    f.set_len(10 << 20).expect("set_len");
}

/// A temp dir holding a generated tree of `files` files in `src` and its
/// tarball `src.tar`.
fn tree_and_tarball(files: usize) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempdir();
    let src = tmp.path().join("src");
    make_tree(&src, files);
    sh(&format!(
        "tar -C '{}' -cf '{}/src.tar' .",
        src.display(),
        tmp.path().display()
    ));
    (tmp, src)
}

/// A one-node cluster, and a temp dir with its mountpoint `mnt`.
struct OneNode {
    tc: TestCluster,
    nodes: String,
    tmp: tempfile::TempDir,
    mnt: PathBuf,
}

/// File system `fs` created on a one-node cluster and mounted.
fn mount_on_one_node(fs: &str) -> (OneNode, Mount) {
    mount_on_one_node_with(fs, &["--create"])
}

/// [`mount_on_one_node`] with the mount's arguments `args`.
fn mount_on_one_node_with(fs: &str, args: &[&str]) -> (OneNode, Mount) {
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, fs, &mnt, args);
    (
        OneNode {
            tc,
            nodes,
            tmp,
            mnt,
        },
        m,
    )
}

/// `lightstore fs check --data` of file system `name`, which must find no
/// problem; its summary line.
fn fs_check(nodes: &str, name: &str) -> String {
    let out = lightstore(&["fs", "check", "--data", "--nodes", nodes, name]);
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && said.contains(", 0 problems"),
        "fs check {name}: {said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

/// Runs the Python `script` (saved in `tmp` as `name`) with `dir` as its
/// argument; its standard output.
fn python_in(name: &str, script: &str, tmp: &Path, dir: &Path) -> String {
    let path = tmp.join(name);
    std::fs::write(&path, script).expect("script");
    let out = sh(&format!("python3 '{}' '{}'", path.display(), dir.display()));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (bounded) until `path` exists: an unpack is under way.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn tree_equal(a: &Path, b: &Path) {
    sh(&format!(
        "diff -r --no-dereference '{}' '{}'",
        a.display(),
        b.display()
    ));
}

/// A world-searchable temp dir (pjdfstest switches to other users, who
/// must reach the mount).
fn tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    t
}

#[test]
fn a_tree_unpacks_survives_a_remount_and_hosts_git() {
    if !can_mount() {
        return;
    }
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let out = lightstore(&["fs", "create", "--nodes", &nodes, "t1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lightstore(&["fs", "create", "--nodes", &nodes, "t1"]);
    assert!(!out.status.success(), "a second create must fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));

    let tmp = tempdir();
    let src = tmp.path().join("src");
    make_tree(&src, 300);
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, "t1", &mnt, &[]);
    // The kernel's 128 KiB read-ahead for FUSE is widened to the default 4 MiB.
    let window = {
        use std::os::unix::fs::MetadataExt;
        fs::readahead::sysfs_path(std::fs::metadata(&mnt).expect("stat mount").dev())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kb = std::fs::read_to_string(&window).unwrap_or_default();
        if kb.trim() == "4096" {
            break;
        }
        assert!(Instant::now() < deadline, "{}: {kb}", window.display());
        std::thread::sleep(Duration::from_millis(20));
    }

    // One mount per file system.
    let mut second = Mount::spawn(&nodes, "t1", &tmp.path().join("mnt2"), &[]);
    let status = second.wait().expect("second mount");
    let mut err = String::new();
    use std::io::Read;
    second
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(
        !status.success() && err.contains("mounted elsewhere"),
        "{err}"
    );
    let listed = lightstore(&["fs", "list", "--nodes", &nodes]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("mounted by"));

    sh(&format!(
        "tar -C '{}' -cf - . | tar -C '{}' -xf - && mkdir '{}/tree' && tar -C '{}' -cf - . | tar -C '{}/tree' -xf -",
        src.display(), mnt.display(), mnt.display(), src.display(), mnt.display()
    ));
    tree_equal(&src, &mnt.join("tree"));
    // df shows the node's device, not a made-up size.
    let df = sh(&format!("stat -f -c '%b %S %f' '{}'", mnt.display()));
    let f: Vec<u64> = String::from_utf8_lossy(&df.stdout)
        .split_whitespace()
        .map(|x| x.parse().expect("number"))
        .collect();
    let (total, free) = (f[0] * f[1], f[2] * f[1]);
    assert!(total > 0 && total < 1 << 45 && free <= total, "df: {f:?}");
    sh(&format!(
        "cd '{}' && git init -q g && cd g && cp -r ../d0 . && git add -A && \
         git -c user.email=a@b -c user.name=t commit -qm one && echo x >> d0/e0/f0 && \
         git -c user.email=a@b -c user.name=t commit -qam two && git gc -q && git fsck --strict",
        mnt.display()
    ));
    // rename over, hard links and unlink of open files through the kernel.
    sh(&format!(
        "cd '{}' && echo a > x && echo b > y && mv x y && test \"$(cat y)\" = a && ln y z && \
         test \"$(stat -c %h y)\" = 2 && exec 3<y && rm y z && test \"$(cat <&3)\" = a",
        mnt.display()
    ));
    m.stop();

    let m = Mount::start(&nodes, "t1", &mnt, &[]);
    tree_equal(&src, &mnt.join("tree"));
    sh(&format!(
        "cd '{}/g' && git fsck --strict && git log --oneline | wc -l | grep -q 2",
        mnt.display()
    ));
    // fusermount3 -u ends the mount process cleanly too, and a mount
    // started at once waits for it to let go instead of being refused.
    sh(&format!("fusermount3 -u '{}'", mnt.display()));
    let again = Mount::start(&nodes, "t1", &mnt, &[]);
    let mut m = m;
    let status = m
        .exited_within(Duration::from_secs(20))
        .expect("mount did not exit after fusermount3 -u");
    assert!(status.success(), "exit after fusermount3 -u: {status}");
    tree_equal(&src, &mnt.join("tree"));
    again.stop();
    let out = lightstore(&["fs", "delete", "--nodes", &nodes, "t1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = lightstore(&["fs", "list", "--nodes", &nodes]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("t1"));
}

/// A missing name is remembered by the kernel (a negative entry) for the
/// entry timeout: probing it again asks neither the mount nor the node,
/// and creating it through the mount makes it appear at once.
#[test]
fn missing_names_are_remembered_until_created() {
    if !can_mount() {
        return;
    }
    let (s, m) = mount_on_one_node("neg");
    let (tc, mnt) = (&s.tc, &s.mnt);
    let node = tc.nodes[0].as_ref().expect("node up");
    assert_eq!(node.cli(&["config", "resetstat"]), "OK");
    let missing = mnt.join("missing");
    for _ in 0..200 {
        assert!(std::fs::symlink_metadata(&missing).is_err());
    }
    let reads = node_mgets(node);
    assert!(reads < 20, "{reads} reads for 200 probes of one name");
    std::fs::write(&missing, b"now here").expect("create");
    assert_eq!(std::fs::read(&missing).expect("read"), b"now here");
    std::fs::remove_file(&missing).expect("remove");
    assert!(std::fs::symlink_metadata(&missing).is_err());
    m.stop();
}

/// Node `MGET` calls counted since the last `CONFIG RESETSTAT`.
fn node_mgets(node: &node_support::Node) -> u64 {
    node.calls_of("mget")
}

/// `rm -rf` of a directory on a freshly started mount (nothing cached):
/// the inodes of each listing page are read in one multi-get, not one
/// node read per name looked up, and everything is gone afterwards.
#[test]
fn a_cold_rm_rf_reads_the_listed_inodes_by_page() {
    if !can_mount() {
        return;
    }
    const FILES: usize = 2000;
    let (s, m) = mount_on_one_node("rmrf");
    let dir = s.mnt.join("d");
    std::fs::create_dir(&dir).expect("mkdir");
    for i in 0..FILES {
        std::fs::write(dir.join(format!("file-{i:05}")), b"").expect("create");
    }
    m.stop();
    let m = Mount::start(&s.nodes, "rmrf", &s.mnt, &[]);
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    let node = s.tc.nodes[0].as_ref().expect("node up");
    assert_eq!(node.cli(&["config", "resetstat"]), "OK");
    let out = sh(&format!("rm -rf '{}'", dir.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reads = node_mgets(node);
    assert!(!dir.exists());
    assert!(
        reads < FILES as u64 / 4,
        "{reads} node reads to remove {FILES} files"
    );
    m.stop();
}

/// A seeded random sequence of namespace and data operations (mkdir,
/// rmdir, create, write, unlink, rename with and without
/// RENAME_NOREPLACE / RENAME_EXCHANGE, link, symlink, readlink, chmod,
/// truncate, listing, stat) on up to three levels of four names, each
/// printed with its result or errno, then the whole tree (kinds, modes,
/// link counts, sizes, content hashes, link targets). `n` = 0 prints the
/// tree only; a fourth argument `notree` leaves the tree out.
const NAMESPACE_WORKLOAD: &str = r#"
import errno, hashlib, os, random, stat, sys
d, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
names = ["a", "b", "c", "d"]
def path():
    depth = r.choice((1, 1, 2, 2, 3))
    return os.path.join(d, *[r.choice(names) for _ in range(depth)])
def data():
    return r.randbytes(r.choice((0, 1, 100, 5000, 70000)))
def create(p):
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, data()); os.close(fd)
def write(p):
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, data(), r.choice((0, 10, 4096, 66000))); os.close(fd)
def rename_noreplace(a, b):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 1) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
def exchange(a, b):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
OPS = [
    ("mkdir", 1, lambda p: os.mkdir(p, 0o755)),
    ("rmdir", 1, os.rmdir),
    ("create", 1, create),
    ("write", 1, write),
    ("unlink", 1, os.unlink),
    ("rename", 2, os.rename),
    ("rename_noreplace", 2, rename_noreplace),
    ("exchange", 2, exchange),
    ("link", 2, os.link),
    ("symlink", 2, lambda a, b: os.symlink(os.path.relpath(a, d), b)),
    ("readlink", 1, os.readlink),
    ("chmod", 1, lambda p: os.chmod(p, r.choice((0o600, 0o755, 0o1777, 0o2750)))),
    ("truncate", 1, lambda p: os.truncate(p, r.choice((0, 3, 5000, 100000)))),
    ("listdir", 1, lambda p: sorted(os.listdir(p))),
    ("stat", 1, lambda p: stat.filemode(os.lstat(p).st_mode)),
]
for i in range(n):
    name, argc, fn = r.choice(OPS)
    args = [path() for _ in range(argc)]
    try:
        out = fn(*args)
        res = "ok" if out is None else repr(out)
    except OSError as e:
        res = errno.errorcode.get(e.errno, str(e.errno))
    shown = " ".join(os.path.relpath(a, d) for a in args)
    print(f"{i} {name} {shown}: {res}")
if sys.argv[4:] == ["notree"]:
    sys.exit(0)
for root, dirs, files in os.walk(d):
    dirs.sort()
    for x in sorted(dirs + files):
        p = os.path.join(root, x); st = os.lstat(p)
        rel = os.path.relpath(p, d)
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
            print(f"{rel} {stat.filemode(st.st_mode)} n{st.st_nlink} {st.st_size} {h}")
        elif stat.S_ISLNK(st.st_mode):
            print(f"{rel} link -> {os.readlink(p)}")
        else:
            print(f"{rel} {stat.filemode(st.st_mode)} n{st.st_nlink}")
"#;

/// The namespace workload gives the same transcript and the same tree on
/// the mount as on a local directory (the local file system is the
/// oracle), and the tree is the same again after a remount.
#[test]
fn random_namespace_operations_match_a_local_directory() {
    if !can_mount() || !have_tools(&["python3"]) {
        return;
    }
    // Through /dev/fuse first, then (the default) io_uring where offered.
    let (s, m) = mount_on_one_node_with("ns", &["--create", "--io-uring", "no"]);
    let run = |dir: &Path, n: usize| {
        std::fs::create_dir_all(dir).expect("dir");
        let path = s.tmp.path().join("ns.py");
        std::fs::write(&path, NAMESPACE_WORKLOAD).expect("script");
        let out = sh(&format!(
            "python3 '{}' '{}' 7 {n}",
            path.display(),
            dir.display()
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let local = run(&s.tmp.path().join("local"), 1500);
    assert!(local.lines().count() > 1500, "{local}");
    assert_eq!(run(&s.mnt.join("t"), 1500), local);
    m.stop();
    let m = Mount::start(&s.nodes, "ns", &s.mnt, &[]);
    let tree = run(&s.tmp.path().join("local"), 0);
    assert!(!tree.is_empty());
    assert_eq!(run(&s.mnt.join("t"), 0), tree, "after a remount");
    m.stop();
    fs_check(&s.nodes, "ns");
}

/// A directory listed through a handle opened before a rename does not
/// bring the renamed directory back to its old name: the kernel links every
/// entry a READDIRPLUS returns into its dentry cache, and the listing
/// taken at opendir was stale (the old name then stat'ed fine, and a
/// concurrent rename made walks fail with ESTALE).
#[test]
fn a_listing_taken_before_a_rename_does_not_resurrect_the_old_name() {
    if !can_mount() || !have_tools(&["python3"]) {
        return;
    }
    let (s, m) = mount_on_one_node("stale");
    let d = s.mnt.display();
    let out = sh(&format!(
        r#"python3 - <<'PY'
import os
root = "{d}"
os.makedirs(root + "/p/moved/inner")
os.makedirs(root + "/q")
for i in range(20):
    open(root + "/p/f%02d" % i, "w").close()
fd = os.open(root + "/p", os.O_RDONLY | os.O_DIRECTORY)
os.rename(root + "/p/moved", root + "/q/moved")
# Entries renamed after opendir may be listed or not (POSIX leaves it
# open); what matters is what the kernel's dentry cache learns.
listed = sorted(os.listdir(fd))
os.close(fd)
print("old-exists", os.path.exists(root + "/p/moved"))
print("new-exists", os.path.isdir(root + "/q/moved/inner"))
PY"#
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("old-exists False"), "{text}");
    assert!(text.contains("new-exists True"), "{text}");
    m.stop();
    fs_check(&s.nodes, "stale");
}

/// Four processes run the namespace workload at once on the same names
/// (renames across each other's directories, links, removals racing):
/// no operation fails with an error a local file system would not give
/// (EIO, ESTALE, ...), and the tree left is consistent (`fs check`).
#[test]
fn concurrent_namespace_operations_leave_a_consistent_tree() {
    if !can_mount() || !have_tools(&["python3"]) {
        return;
    }
    let (s, m) = mount_on_one_node("nsc");
    let path = s.tmp.path().join("ns.py");
    std::fs::write(&path, NAMESPACE_WORKLOAD).expect("script");
    let dir = s.mnt.join("t");
    std::fs::create_dir(&dir).expect("dir");
    // One log per process: lines written to one pipe at once interleave.
    let logs = s.tmp.path().display().to_string();
    let out = sh(&format!(
        "for seed in 41 42 43 44; do python3 '{}' '{}' $seed 1500 notree > \"{logs}/ns-$seed.txt\" & done; wait",
        path.display(),
        dir.display()
    ));
    let transcript: String = (41..=44)
        .map(|seed| std::fs::read_to_string(format!("{logs}/ns-{seed}.txt")).expect("log"))
        .collect();
    assert_eq!(
        transcript.lines().count(),
        6000,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = [
        "ok",
        "ENOENT",
        "ENOTDIR",
        "EEXIST",
        "EISDIR",
        "ELOOP",
        "EINVAL",
        "ENOTEMPTY",
        "EPERM",
    ];
    for line in transcript.lines() {
        let result = line.rsplit(": ").next().unwrap_or("");
        assert!(
            expected.contains(&result)
                || result.starts_with('[')
                || result.starts_with('\'')
                || result.starts_with('-'),
            "unexpected result: {line}"
        );
    }
    m.stop();
    fs_check(&s.nodes, "nsc");
}

/// Writes, truncations, fallocate and owner changes on files with set-user-ID and
/// set-group-ID bits, by an unprivileged user (uid 65534, without
/// `CAP_FSETID`) and by root; prints each file's mode afterwards.
const SET_ID_WORKLOAD: &str = r#"
import os, sys
d, user = sys.argv[1], 65534
def as_user(uid, fn):
    pid = os.fork()
    if pid == 0:
        os.setresgid(user, user, user); os.setresuid(uid, uid, uid); fn(); os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
def make(name, mode):
    p = os.path.join(d, name)
    with open(p, "wb") as f: f.write(b"x" * 5000)
    os.chown(p, user, user); os.chmod(p, mode)
    return p
def write(p):
    with open(p, "r+b") as f: f.seek(100); f.write(b"y" * 10)
def fallocate(p):
    fd = os.open(p, os.O_RDWR); os.posix_fallocate(fd, 0, 100000); os.close(fd)
def open_truncate(p):
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
ops = (("write", write), ("truncate", lambda p: os.truncate(p, 10)),
       ("fallocate", fallocate), ("O_TRUNC", open_truncate))
for who, uid in (("user", user), ("root", 0)):
    for mode in (0o4755, 0o2775, 0o2644, 0o6711):
        for op, fn in ops:
            p = make(f"{who}-{op}-{mode:o}", mode)
            as_user(uid, lambda: fn(p))
            print(f"{op} by {who} of {mode:o}: {os.stat(p).st_mode & 0o7777:o}")
for mode in (0o4755, 0o2775, 0o2644, 0o6755):
    p = make(f"chown-{mode:o}", mode); os.chown(p, 0, -1)
    print(f"chown by root of {mode:o}: {os.stat(p).st_mode & 0o7777:o}")
    p = make(f"chown-same-{mode:o}", mode); os.chown(p, -1, -1)
    print(f"chown -1 -1 by root of {mode:o}: {os.stat(p).st_mode & 0o7777:o}")
    p = make(f"chown-same-user-{mode:o}", mode); as_user(user, lambda: os.chown(p, -1, -1))
    print(f"chown -1 -1 by user of {mode:o}: {os.stat(p).st_mode & 0o7777:o}")
"#;

/// The mount clears set-user-ID and set-group-ID bits where a local file
/// system does (it tells the kernel it does, `FUSE_HANDLE_KILLPRIV_V2`,
/// so that writes are not each preceded by a `security.capability`
/// lookup).
#[test]
fn set_id_bits_clear_as_on_a_local_disk() {
    if !can_mount() || !have_tools(&["python3"]) {
        return;
    }
    let (s, m) = mount_on_one_node("setid");
    let run = |dir: &Path| {
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        python_in("setid.py", SET_ID_WORKLOAD, s.tmp.path(), dir)
    };
    let local = run(&s.tmp.path().join("local"));
    for line in [
        "write by user of 4755: 755",
        "truncate by user of 2775: 775",
        "write by user of 2644: 2644",
        "fallocate by user of 4755: 755",
        "O_TRUNC by user of 2775: 775",
        "write by root of 6711: 6711",
        "chown by root of 6755: 755",
        "chown -1 -1 by user of 4755: 755",
    ] {
        assert!(
            local.contains(line),
            "local disk: {line} expected in\n{local}"
        );
    }
    assert_eq!(run(&s.mnt.join("t")), local);
    m.stop();
}

/// `copy_file_range` on the mount (copied by the adapter), with the
/// source's last writes still in the kernel's page cache, at unaligned
/// offsets and past the source's end; the same copies on a local
/// directory give the same bytes. `cp` too.
const COPY_WORKLOAD: &str = r#"
import hashlib, os, random, sys
d = sys.argv[1]
r = random.Random(7)
src, dst = os.path.join(d, "src"), os.path.join(d, "dst")
with open(src, "wb") as f:
    f.write(r.randbytes(9 << 20))
    f.seek(12 << 20); f.write(b"after a hole")
# Rewritten while open: still dirty in the page cache when copied.
writer = open(src, "r+b", buffering=0)
writer.seek(4 << 20); writer.write(r.randbytes(100_000))
fi, fo = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDWR | os.O_CREAT, 0o644)
copied = []
for off_in, off_out, n in ((0, 0, 5 << 20), (12345, (5 << 20) + 7, 3 << 20), ((12 << 20) - 100, 20 << 20, 1 << 20)):
    done = 0
    while done < n:
        k = os.copy_file_range(fi, fo, n - done, off_in + done, off_out + done)
        if k == 0:
            break
        done += k
    copied.append(done)
os.close(fi); os.close(fo); writer.close()
print(copied, os.stat(dst).st_size, hashlib.sha256(open(dst, "rb").read()).hexdigest())
"#;

#[test]
fn copy_file_range_copies_inside_the_mount() {
    if !can_mount() || !have_tools(&["python3", "cp", "cmp"]) {
        return;
    }
    let (s, m) = mount_on_one_node("copy");
    let run = |dir: &Path| {
        std::fs::create_dir_all(dir).expect("dir");
        python_in("copy.py", COPY_WORKLOAD, s.tmp.path(), dir)
    };
    let local = run(&s.tmp.path().join("local"));
    assert!(local.starts_with("[5242880, 3145728, 112]"), "{local}");
    assert_eq!(run(&s.mnt), local);
    sh(&format!(
        "cp '{m}/src' '{m}/copy' && cmp '{m}/src' '{m}/copy'",
        m = s.mnt.display()
    ));
    // A sparse 64 GiB file copies in a few calls, its holes punched, not
    // written (through the kernel that was 64 GiB of zeros).
    let sparse = sh(&format!(
        "timeout 60 python3 -c '
import os
d = \"{m}\"
with open(d + \"/sparse\", \"wb\") as f:
    f.truncate(64 << 30); f.seek(1 << 30); f.write(b\"one\"); f.seek((64 << 30) - 3); f.write(b\"end\")
with open(d + \"/sparse-copy\", \"wb\") as f:
    f.write(b\"x\" * (3 << 20))
fi, fo = os.open(d + \"/sparse\", os.O_RDONLY), os.open(d + \"/sparse-copy\", os.O_WRONLY)
done, calls = 0, 0
while done < 64 << 30:
    done += os.copy_file_range(fi, fo, (64 << 30) - done, done, done); calls += 1
with open(d + \"/sparse-copy\", \"rb\") as f:
    f.seek(0); a = f.read(4); f.seek((1 << 30) - 1); b = f.read(5); f.seek((64 << 30) - 4); c = f.read(8)
print(calls, a, b, c, os.stat(d + \"/sparse-copy\").st_size)
'",
        m = s.mnt.display()
    ));
    let text = String::from_utf8_lossy(&sparse.stdout);
    assert!(
        text.trim_end()
            .ends_with(r"b'\x00\x00\x00\x00' b'\x00one\x00' b'\x00end' 68719476736"),
        "{text}"
    );
    m.stop();
}

/// `lseek(SEEK_DATA / SEEK_HOLE)` through the kernel finds a sparse file's
/// data, written through the page cache a moment before (the kernel
/// writes it back before it asks), and its holes, as on a local disk.
#[test]
fn seek_data_and_seek_hole_find_a_sparse_files_data() {
    if !can_mount() || !have_tools(&["python3"]) {
        return;
    }
    let (s, m) = mount_on_one_node("seek");
    let out = sh(&format!(
        "timeout 60 python3 -c '
import errno, os
p = \"{m}/sparse\"
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, b\"a\" * 65536, 1 << 20)
os.pwrite(fd, b\"b\" * 65536, 5 << 20)
os.ftruncate(fd, 16 << 20)
def seek(at, how):
    try:
        return os.lseek(fd, at, how)
    except OSError as e:
        return errno.errorcode[e.errno]
print([seek(0, os.SEEK_DATA), seek(1 << 20, os.SEEK_HOLE), seek((1 << 20) + 65536, os.SEEK_DATA),
       seek(5 << 20, os.SEEK_HOLE), seek((5 << 20) + 65536, os.SEEK_DATA), seek(16 << 20, os.SEEK_HOLE)])
'",
        m = s.mnt.display()
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim_end(),
        "[1048576, 1114112, 5242880, 5308416, 'ENXIO', 'ENXIO']",
        "{text}"
    );
    // The file takes the blocks of its data (`du`), so `cp` out of the
    // mount looks for holes (only where `st_blocks` is below the size) and
    // finds them by seeking: each of the two holds its 128 KiB.
    let du = sh(&format!(
        "cp '{m}/sparse' '{t}/copy' && cmp '{m}/sparse' '{t}/copy' && du -k '{m}/sparse' '{t}/copy' | awk '{{s += $1}} END {{print s}}'",
        m = s.mnt.display(),
        t = s.tmp.path().display()
    ));
    let kib: u64 = String::from_utf8_lossy(&du.stdout)
        .trim()
        .parse()
        .expect("du");
    assert!(
        kib < 1024,
        "16 MiB files holding 128 KiB take {kib} KiB together"
    );
    m.stop();
}

/// `--metrics` serves the mount's counters: the operations a small
/// workload asked for, their errors and the bytes it wrote and read.
#[test]
fn metrics_count_the_mounts_requests() {
    if !can_mount() {
        return;
    }
    let metrics = format!("127.0.0.1:{}", node_support::free_port());
    let (s, m) = mount_on_one_node_with("metrics", &["--create", "--metrics", &metrics]);
    let mnt = &s.mnt;
    std::fs::write(mnt.join("f"), vec![7u8; 100_000]).expect("write");
    let back = std::fs::read(mnt.join("f")).expect("read");
    assert_eq!(back.len(), 100_000);
    assert!(std::fs::metadata(mnt.join("missing")).is_err());
    std::fs::create_dir_all(mnt.join("d/e")).expect("mkdir");
    assert!(std::fs::remove_dir(mnt.join("d")).is_err(), "ENOTEMPTY");
    let text = scrape(&metrics);
    let value = |key: &str| metric(&text, key);
    for op in ["lookup", "create", "write", "mkdir"] {
        let key = format!("lightstore_fs_requests_total{{op=\"{op}\"}} ");
        assert!(value(&key) > 0.0, "no {op} counted:\n{text}");
    }
    assert!(
        value("lightstore_fs_posix_errors_total{op=\"rmdir\"} ") >= 1.0,
        "{text}"
    );
    assert!(
        value("lightstore_fs_written_bytes_total ") >= 100_000.0,
        "{text}"
    );
    m.stop();
}

/// The text of a mount's `--metrics` endpoint.
fn scrape(addr: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).expect("metrics");
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.0\r\n\r\n").expect("get");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut conn, &mut text).expect("read");
    text
}

/// The value of the sample `key` (name and labels, then a space) in a
/// scrape, 0 when absent.
fn metric(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Whether the kernel offers FUSE over io_uring (Linux 6.14+ with the
/// switch the test script sets); under `CI=true` it must.
fn io_uring_offered() -> bool {
    let on = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y");
    if !on {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "needs /sys/module/fuse/parameters/enable_uring set to Y (scripts/test.sh sets it)"
        );
        eprintln!("skipped: FUSE over io_uring is not enabled");
    }
    on
}

/// Taken for writing by a test that denies this machine's processes
/// io_uring (`kernel.io_uring_disabled`), for reading by those that need
/// it; other mounts just fall back to `/dev/fuse` meanwhile.
static IO_URING_SWITCH: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `kernel.io_uring_disabled` set to a value until dropped, then restored.
struct IoUringDenied {
    before: String,
}

impl IoUringDenied {
    const SYSCTL: &'static str = "/proc/sys/kernel/io_uring_disabled";

    fn set(value: &str) -> IoUringDenied {
        let before = std::fs::read_to_string(Self::SYSCTL).expect("read io_uring_disabled");
        std::fs::write(Self::SYSCTL, value).expect("set io_uring_disabled");
        IoUringDenied { before }
    }
}

impl Drop for IoUringDenied {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::SYSCTL, self.before.trim());
    }
}

/// The kernel offers FUSE over io_uring but the process may not make
/// io_uring instances (`kernel.io_uring_disabled=2`, as a hardened host or
/// a seccomp profile has it): `--io-uring auto` serves through `/dev/fuse`
/// and says why, `--io-uring yes` refuses to mount and names the setting.
/// Negotiating io_uring there hung the mount (the kernel holds every
/// request until each CPU's queue has an entry).
#[test]
fn a_process_denied_io_uring_mounts_through_dev_fuse() {
    if !can_mount() || !io_uring_offered() {
        return;
    }
    let _alone = IO_URING_SWITCH
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !Path::new(IoUringDenied::SYSCTL).exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "needs {}",
            IoUringDenied::SYSCTL
        );
        return;
    }
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let mnt = tmp.path().join("mnt");
    let denied = IoUringDenied::set("2");
    let metrics = format!("127.0.0.1:{}", node_support::free_port());
    let m = Mount::start(
        &nodes,
        "denied",
        &mnt,
        &["--create", "--io-uring", "auto", "--metrics", &metrics],
    );
    assert_eq!(metric(&scrape(&metrics), "lightstore_fs_io_uring "), 0.0);
    std::fs::create_dir(mnt.join("d")).expect("mkdir");
    std::fs::write(mnt.join("d/f"), b"through /dev/fuse").expect("write");
    assert_eq!(
        std::fs::read(mnt.join("d/f")).expect("read"),
        b"through /dev/fuse"
    );
    let log = m.stop();
    assert!(log.contains("using /dev/fuse"), "{log}");

    let mut refused = Mount {
        child: Mount::spawn(&nodes, "denied", &mnt, &["--io-uring", "yes"]),
        dir: mnt.clone(),
    };
    let Some(status) = refused.exited_within(Duration::from_secs(30)) else {
        // Dropping `refused` kills it and detaches the mount.
        abort_fuse_connection(&mnt);
        panic!("--io-uring yes neither mounted nor refused in 30 s");
    };
    let said = refused.stderr();
    assert!(!status.success(), "mounted without io_uring: {said}");
    assert!(said.contains("io_uring_disabled"), "{said}");
    assert!(!is_mounted(&mnt), "a refused mount left a mount behind");
    drop(refused);

    drop(denied);
    let m = Mount::start(&nodes, "denied", &mnt, &["--io-uring", "yes"]);
    assert_eq!(
        std::fs::read(mnt.join("d/f")).expect("read back over io_uring"),
        b"through /dev/fuse"
    );
    m.stop();
    fs_check(&nodes, "denied");
}

/// A FUSE connection aborted under a writer (`echo 1 >
/// /sys/fs/fuse/connections/N/abort`, what an operator does to a hung
/// mount) ends the mount process by itself in bounded time, over either
/// transport; what was fsynced before is there when the file system is
/// mounted again, and its tree is consistent.
#[test]
fn an_aborted_connection_ends_the_mount_and_loses_nothing_synced() {
    if !can_mount() {
        return;
    }
    let _io_uring_allowed = IO_URING_SWITCH
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (s, first) = mount_on_one_node_with("aborted", &["--create"]);
    first.stop();
    for transport in ["no", "auto"] {
        let mut m = Mount::start(&s.nodes, "aborted", &s.mnt, &["--io-uring", transport]);
        let kept = s.mnt.join(format!("kept-{transport}"));
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&kept).expect("create");
            f.write_all(transport.as_bytes()).expect("write");
            f.sync_all().expect("fsync");
        }
        let dir = s.mnt.join(format!("w-{transport}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let writer = std::thread::spawn(move || {
            for n in 0..200_000 {
                if std::fs::write(dir.join(format!("f{n}")), b"x").is_err() {
                    return n;
                }
            }
            200_000
        });
        std::thread::sleep(Duration::from_millis(300));
        abort_fuse_connection(&s.mnt);
        let written = writer.join().expect("writer");
        assert!(written < 200_000, "the writer never saw the abort");
        if m.exited_within(Duration::from_secs(20)).is_none() {
            let threads = thread_stacks(m.child.id());
            panic!("{transport}: the mount outlived its aborted connection:\n{threads}");
        }
        let _ = Command::new("fusermount3").arg("-uz").arg(&s.mnt).status();
        drop(m);
        let m = Mount::start(&s.nodes, "aborted", &s.mnt, &[]);
        assert_eq!(
            std::fs::read(&kept).expect("the fsynced file"),
            transport.as_bytes()
        );
        m.stop();
    }
    fs_check(&s.nodes, "aborted");
}

/// The two ways the kernel hands requests over serve one tree: through
/// io_uring (`--io-uring yes`: large writes parsed where the kernel put
/// them, 1 MiB reads replied into the ring's buffer, metadata from the
/// caller's CPU) and through `/dev/fuse` (`--io-uring no`), each reading
/// back what the other wrote after a remount.
#[test]
fn both_fuse_transports_serve_one_tree() {
    if !can_mount() || !io_uring_offered() {
        return;
    }
    let _io_uring_allowed = IO_URING_SWITCH
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let pattern = |seed: u8, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
            .collect()
    };
    let metrics = format!("127.0.0.1:{}", node_support::free_port());
    let (s, m) = mount_on_one_node_with(
        "transports",
        &["--create", "--io-uring", "yes", "--metrics", &metrics],
    );
    assert_eq!(metric(&scrape(&metrics), "lightstore_fs_io_uring "), 1.0);
    let mnt = s.mnt.clone();
    std::fs::write(mnt.join("big"), pattern(1, 3 << 20)).expect("write big");
    std::fs::create_dir_all(mnt.join("d")).expect("mkdir");
    for i in 0..200 {
        std::fs::write(mnt.join(format!("d/f{i}")), format!("{i}")).expect("small");
    }
    std::fs::rename(mnt.join("d/f0"), mnt.join("d/renamed")).expect("rename");
    std::os::unix::fs::symlink("big", mnt.join("link")).expect("symlink");
    m.stop();

    let plain = format!("127.0.0.1:{}", node_support::free_port());
    let m = Mount::start(
        &s.nodes,
        "transports",
        &mnt,
        &["--io-uring", "no", "--metrics", &plain],
    );
    assert_eq!(metric(&scrape(&plain), "lightstore_fs_io_uring "), 0.0);
    assert!(std::fs::read(mnt.join("big")).expect("read big") == pattern(1, 3 << 20));
    assert_eq!(std::fs::read_dir(mnt.join("d")).expect("list").count(), 200);
    assert_eq!(
        std::fs::read_to_string(mnt.join("d/renamed")).expect("renamed"),
        "0"
    );
    std::fs::write(mnt.join("big2"), pattern(2, 5 << 20)).expect("write big2");
    std::fs::remove_file(mnt.join("d/f1")).expect("unlink");
    m.stop();

    let m = Mount::start(&s.nodes, "transports", &mnt, &["--io-uring", "yes"]);
    assert!(std::fs::read(mnt.join("big2")).expect("read big2") == pattern(2, 5 << 20));
    assert!(std::fs::read(mnt.join("link")).expect("through the link") == pattern(1, 3 << 20));
    assert!(!mnt.join("d/f1").exists());
    assert_eq!(std::fs::read_dir(mnt.join("d")).expect("list").count(), 199);
    m.stop();
    fs_check(&s.nodes, "transports");
}

/// The workload SQLite puts on a file system: a database in WAL mode
/// (a shared-memory index mapped from the `-shm` file) and one with a
/// rollback journal, then VACUUM; prints each mode's integrity check and
/// row count and sum, which must match the same run on a local directory.
const SQLITE_WORKLOAD: &str = r#"
import os, random, sqlite3, sys
root, reopen = sys.argv[1], sys.argv[2] == "reopen"
for mode in ["wal", "delete"]:
    p = os.path.join(root, "t-%s.db" % mode)
    c = sqlite3.connect(p)
    if not reopen:
        c.execute("pragma journal_mode=%s" % mode)
        c.execute("create table t(id integer primary key, v text, n int)")
        r = random.Random(1)
        for b in range(40):
            with c:
                c.executemany("insert into t(v, n) values(?, ?)",
                              [("x" * r.randint(1, 3000), i) for i in range(200)])
                c.execute("update t set n = n + 1 where id % 7 = ?", (b % 7,))
                c.execute("delete from t where id % 13 = ?", (b % 13,))
        if mode == "delete":
            c.execute("vacuum")
    print(mode, c.execute("pragma integrity_check").fetchone()[0],
          c.execute("select count(*), sum(n) from t").fetchone())
    c.close()
"#;

/// rsync into the mount and SQLite on it, as on a local disk; both still
/// hold after a remount.
#[test]
fn rsync_and_sqlite_work_and_survive_a_remount() {
    if !can_mount() || !have_tools(&["rsync", "python3"]) {
        return;
    }
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let src = tmp.path().join("src");
    make_tree(&src, 300);
    let (mnt, local) = (tmp.path().join("mnt"), tmp.path().join("local"));
    std::fs::create_dir_all(&local).expect("local dir");
    let script = tmp.path().join("sqlite.py");
    std::fs::write(&script, SQLITE_WORKLOAD).expect("script");
    let sqlite = |dir: &Path, pass: &str| {
        let out = sh(&format!(
            "python3 '{}' '{}' {pass}",
            script.display(),
            dir.display()
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let want = sqlite(&local, "create");
    assert_eq!(want.matches(" ok (").count(), 2, "{want}");
    let rsync_changes = |args: &str| {
        let out = sh(&format!(
            "rsync -ai {args} '{}/' '{}/copy/'",
            src.display(),
            mnt.display()
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let m = Mount::start(&nodes, "rs", &mnt, &["--create"]);
    rsync_changes("-H");
    tree_equal(&src, &mnt.join("copy"));
    // A second pass finds nothing to send, by times and sizes or by
    // checksums.
    assert_eq!(rsync_changes("-H"), "", "second rsync pass");
    assert_eq!(rsync_changes("-H -c --dry-run"), "", "checksum pass");
    assert_eq!(sqlite(&mnt, "create"), want);
    m.stop();

    let m = Mount::start(&nodes, "rs", &mnt, &[]);
    assert_eq!(rsync_changes("-H -c --dry-run"), "", "after the remount");
    assert_eq!(sqlite(&mnt, "reopen"), want);
    m.stop();
}

#[test]
fn fsynced_data_survives_kill_9_of_the_adapter() {
    if !can_mount() {
        return;
    }
    let (s, m) = mount_on_one_node("k");
    let (nodes, tmp, mnt) = (&s.nodes, &s.tmp, &s.mnt);
    sh(&format!(
        "cd '{0}' && mkdir -p a/b && head -c 3000000 /dev/urandom > ../want && \
         dd if=../want of=a/b/f bs=64k conv=fsync status=none && mv a/b/f a/g && \
         python3 -c 'import os; fd=os.open(\"a\", os.O_RDONLY); os.fsync(fd)'",
        mnt.display()
    ));
    m.kill();
    // The dead mount's lease is still valid: a mount without --force waits
    // for it to expire (the dead one was on this machine and is gone from
    // its mount table) instead of being refused; --force takes over now.
    let mut waiting = Mount::spawn(nodes, "k", mnt, &[]);
    let stderr = waiting.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let said = std::io::BufRead::lines(std::io::BufReader::new(stderr))
            .map_while(|l| l.ok())
            .find(|l| l.contains("waiting for the last mount") || l.contains("mounted elsewhere"));
        let _ = tx.send(said);
    });
    let said = rx.recv_timeout(Duration::from_secs(20)).ok().flatten();
    assert!(
        said.as_deref()
            .is_some_and(|l| l.contains("waiting for the last mount")),
        "{said:?}"
    );
    let _ = waiting.kill();
    let _ = waiting.wait();
    let m = Mount::start(nodes, "k", mnt, &["--force"]);
    // A busy mount: the first SIGTERM cannot unmount, the second detaches.
    let mut busy = Command::new("sleep")
        .arg("30")
        .current_dir(mnt)
        .spawn()
        .expect("busy");
    m.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(is_mounted(mnt), "unmounted while busy");
    m.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mounted(mnt) {
        assert!(
            Instant::now() < deadline,
            "not detached after a second SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = busy.kill();
    let _ = busy.wait();
    m.stop();
    let m = Mount::start(nodes, "k", mnt, &[]);
    sh(&format!(
        "cmp '{}/a/g' '{}/want' && test ! -e '{}/a/b/f'",
        mnt.display(),
        tmp.path().display(),
        mnt.display()
    ));
    // Busy for a moment only: the first SIGTERM waits for it to end and
    // unmounts, without asking for a second signal.
    let mut brief = Command::new("sleep")
        .arg("1")
        .current_dir(mnt)
        .spawn()
        .expect("brief");
    let log = m.stop();
    let _ = brief.wait();
    assert!(!log.contains("cannot unmount"), "{log}");
}

#[test]
fn a_node_killed_during_an_unpack_loses_nothing() {
    if !can_mount() {
        return;
    }
    let mut tc = TestCluster::start(3);
    let nodes = tc.addrs.join(",");
    let (tmp, src) = tree_and_tarball(1500);
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, "r", &mnt, &["--create"]);
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&mnt)
        .arg("-xf")
        .arg(tmp.path().join("src.tar"))
        .spawn()
        .expect("tar");
    // Kill as soon as the unpack is under way.
    wait_for(&mnt.join("d3"));
    assert!(
        tar.try_wait().expect("tar").is_none(),
        "the unpack ended before the kill"
    );
    tc.kill(1);
    assert!(
        tar.wait().expect("tar").success(),
        "tar failed with a node down"
    );
    sh(&format!("sync -f '{}'", mnt.display()));
    tree_equal(&src, &mnt);
    m.stop();
    tc.restart(1);
    let m = Mount::start(&nodes, "r", &mnt, &[]);
    tree_equal(&src, &mnt);
    m.stop();
    fs_check(&nodes, "r");
}

#[test]
fn pjdfstest_passes() {
    if !can_mount() || !have_tools(&["pjdfstest"]) {
        return;
    }
    let (s, m) = mount_on_one_node("pjd");
    let mnt = &s.mnt;
    let t = mnt.join("t");
    std::fs::create_dir(&t).expect("dir");
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = Command::new("timeout")
        .args(["900", "pjdfstest", "-p"])
        .arg(&t)
        .current_dir(&t)
        .output()
        .expect("pjdfstest");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let Some(summary) = text.lines().find(|l| l.starts_with("Summary:")) else {
        panic!(
            "pjdfstest gave no summary (it needs the users nobody and tests, which \
             scripts/test.sh creates):\n{}",
            text.lines().take(20).collect::<Vec<_>>().join("\n")
        );
    };
    eprintln!("pjdfstest: {summary}");
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("FAILED")).collect();
    assert!(
        summary.contains(" 0 failed"),
        "{summary}\n{}",
        failed.join("\n")
    );
    m.stop();
}

#[test]
fn fsx_dbench_stress_ng_and_fio_verify_run_clean() {
    if !can_mount() || !have_tools(&["fsx", "dbench", "stress-ng", "fio"]) {
        return;
    }
    let (s, m) = mount_on_one_node("tools");
    let mnt = &s.mnt;
    let d = mnt.display();
    // fsx: random reads, writes, mmap reads and writes, truncations and
    // reopens of one file, each checked against its own copy.
    let fsx = sh(&format!(
        "cd '{d}' && timeout 300 fsx -N 5000 -S 11 '{d}/fsx.dat' 2>&1"
    ));
    assert!(String::from_utf8_lossy(&fsx.stdout).contains("A-OK"));
    // dbench: a file server's mix of creates, writes, renames, unlinks and
    // directory scans from 4 clients.
    let db = sh(&format!(
        "mkdir -p '{d}/dbench' && timeout 120 dbench -t 8 -D '{d}/dbench' -c /usr/share/dbench/client.txt 4 2>&1"
    ));
    let text = String::from_utf8_lossy(&db.stdout);
    assert!(
        text.contains("Throughput") && !text.contains("ERROR"),
        "{text}"
    );
    // stress-ng's file system class with verification (binderfs needs a
    // kernel module, not a file system). The `io` stressor runs first and
    // on its own: its syncfs reports every writeback error of the whole
    // file system, including those the kernel makes for the files of
    // stressors that stress-ng kills (docs/file.md).
    for class in ["--io 2", "--class filesystem --all 1 --exclude binderfs,io"] {
        let sng = sh(&format!(
            "mkdir -p '{d}/sng' && cd '{d}/sng' && timeout 300 stress-ng {class} \
             --verify -t 3 --temp-path '{d}/sng' 2>&1"
        ));
        let text = String::from_utf8_lossy(&sng.stdout);
        assert!(
            !text.contains("fail:") && text.contains("successful run"),
            "{text}"
        );
    }
    // fio writes with crc32c verification, sequential and random, through
    // the page cache and with O_DIRECT (16 in flight at once).
    for rw in ["write", "randwrite"] {
        for io in [
            "--ioengine=psync",
            "--ioengine=libaio --iodepth=16 --direct=1",
        ] {
            sh(&format!(
                "timeout 300 fio --name=v --filename='{d}/fio-{rw}.dat' --rw={rw} --bs=8k --size=24M \
                 {io} --verify=crc32c --do_verify=1 --output=/dev/null"
            ));
        }
    }
    // O_DIRECT and the page cache see each other's writes.
    let mixed = sh(&format!(
        "cd '{d}' && head -c 8M /dev/urandom > ref && cp ref mixed && \
         dd if=/dev/urandom of=patch bs=64k count=3 status=none && \
         dd if=patch of=ref bs=64k seek=5 conv=notrunc status=none && \
         dd if=patch of=mixed bs=64k seek=5 conv=notrunc oflag=direct status=none && \
         cmp ref mixed && dd if=mixed bs=1M iflag=direct status=none | cmp - ref && echo same"
    ));
    assert!(String::from_utf8_lossy(&mixed.stdout).contains("same"));
    m.stop();
}

#[test]
fn a_forced_takeover_fences_the_old_mount() {
    if !can_mount() {
        return;
    }
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = Mount::start(&nodes, "f", &a_dir, &["--create"]);
    sh(&format!("echo one > '{}/x'", a_dir.display()));
    let b = Mount::start(&nodes, "f", &b_dir, &["--force"]);
    // Within a lease renewal the old mount learns it was replaced and
    // refuses changes instead of writing next to the new owner.
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let out = Command::new("sh")
            .args(["-c", &format!("echo two > '{}/y'", a_dir.display())])
            .output()
            .expect("sh");
        if !out.status.success() {
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("Read-only"),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        assert!(Instant::now() < deadline, "the old mount kept writing");
        std::thread::sleep(Duration::from_millis(500));
    }
    sh(&format!(
        "cat '{}/x' && echo three > '{}/z'",
        b_dir.display(),
        b_dir.display()
    ));
    a.kill();
    b.stop();
}

/// Walks `root` and checks what a crash must never break: every entry
/// stats, every directory's link count is 2 + its subdirectories, every
/// file's link count is the number of names it has. Returns the number of
/// entries.
fn check_tree(root: &Path) -> usize {
    let script = r#"
import os, sys, collections
root = sys.argv[1]
names = collections.Counter()
links = {}
n = 0
for dirpath, dirs, files in os.walk(root):
    st = os.lstat(dirpath)
    assert st.st_nlink == 2 + len(dirs), f"{dirpath}: nlink {st.st_nlink}, {len(dirs)} subdirectories"
    for f in files:
        s = os.lstat(os.path.join(dirpath, f))
        names[s.st_ino] += 1
        links[s.st_ino] = s.st_nlink
        n += 1
    n += len(dirs)
for ino, count in names.items():
    assert links[ino] == count, f"inode {ino}: nlink {links[ino]}, {count} names"
print(n)
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(root)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "tree check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("count")
}

#[test]
fn a_killed_adapter_leaves_a_consistent_tree() {
    if !can_mount() {
        return;
    }
    let tc = TestCluster::start(1);
    let nodes = tc.addrs.join(",");
    let (tmp, src) = tree_and_tarball(1500);
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, "c", &mnt, &["--create"]);
    // Renames, links and removals under way while the adapter dies.
    let mut work = Command::new("sh")
        .args([
            "-c",
            &format!(
                "cd '{}' && tar -xf '{}/src.tar' && for d in d0 d1 d2 d3; do mv $d $d.moved; done && \
                 rm -rf d4 && for i in $(seq 1 200); do ln d5/e0/f5 d5/link$i; done",
                mnt.display(),
                tmp.path().display()
            ),
        ])
        .spawn()
        .expect("work");
    wait_for(&mnt.join("d3"));
    std::thread::sleep(Duration::from_millis(700));
    m.kill();
    let _ = work.wait();
    // As the crash left it, before a mount repairs anything: consistent.
    let said = fs_check(&nodes, "c");
    eprintln!("fs check after the kill: {said}");
    // Repairing needs the mount lease: refused while the dead mount's
    // lease lasts, unless forced.
    let out = lightstore(&["fs", "check", "--repair", "--nodes", &nodes, "c"]);
    assert!(!out.status.success(), "repair while the lease is held");
    assert!(String::from_utf8_lossy(&out.stderr).contains("mounted elsewhere"));
    let out = lightstore(&["fs", "check", "--repair", "--force", "--nodes", &nodes, "c"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("deleted)") && said.contains(", 0 problems"),
        "{said}"
    );
    let m = Mount::start(&nodes, "c", &mnt, &["--force"]);
    let n = check_tree(&mnt);
    eprintln!("after the kill: {n} entries, consistent");
    // And it stays usable: the whole tree unpacks over it.
    sh(&format!(
        "cd '{}' && mkdir again && tar -C again -xf '{}/src.tar'",
        mnt.display(),
        tmp.path().display()
    ));
    tree_equal(&src, &mnt.join("again"));
    check_tree(&mnt);
    m.stop();
    let said = fs_check(&nodes, "c");
    assert!(
        said.contains("0 pending reclaim"),
        "after a clean unmount: {said}"
    );
}

/// Retries `write` every 0.5 s until it succeeds: deleted data is
/// reclaimed in the background, and room must come back within 60 s.
fn until_room_after_rm(mut write: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(why) = write() {
        assert!(Instant::now() < deadline, "no room after rm: {why}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Hardening §1 under the file adapter: a node on a file system that
/// another file fills. The next file fails with ENOSPC (at `fsync` at the
/// latest), the files before read back, `rm` works on the full file
/// system (its deletes use the node's reserve), and GC of what it removed
/// gives room back within a bounded time, without a restart; `fs check`
/// finds nothing wrong.
#[test]
fn a_host_filled_by_other_files_takes_rm_and_gives_room_back() {
    if !can_mount() {
        return;
    }
    let Some(small) = node_support::SmallFs::mount(64) else {
        return;
    };
    let node =
        node_support::Node::start_in(&small.path().join("data"), &[]).expect("node on the tmpfs");
    let nodes = format!("127.0.0.1:{}", node.port);
    let tmp = tempdir();
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, "full", &mnt, &["--create"]);
    let write = |name: &str| {
        sh(&format!(
            "head -c 4194304 /dev/urandom > '{t}/src' && \
             dd if='{t}/src' of='{m}/{name}' bs=1M conv=fsync status=none 2>'{t}/err' && \
             sha1sum < '{t}/src' | cut -c1-40 > '{t}/{name}.sum' || cat '{t}/err'",
            t = tmp.path().display(),
            m = mnt.display()
        ))
    };
    for i in 0..4 {
        let out = write(&format!("f{i}"));
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    node_support::fill_host(&small.path().join("ballast"));
    let mut written = 4;
    let said = loop {
        let out = write(&format!("f{written}"));
        if !out.stdout.is_empty() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        written += 1;
        assert!(written < 40, "the node never ran out of room");
    };
    assert!(said.contains("No space left on device"), "{said}");
    for i in 0..written {
        let want = std::fs::read_to_string(tmp.path().join(format!("f{i}.sum"))).expect("sum");
        let got = sh(&format!(
            "sha1sum < '{}' | cut -c1-40",
            mnt.join(format!("f{i}")).display()
        ));
        assert_eq!(String::from_utf8_lossy(&got.stdout), want, "f{i}");
    }
    let rm = sh(&format!("rm -f '{}'/f*", mnt.display()));
    assert!(
        rm.status.success(),
        "rm on a full host: {}",
        String::from_utf8_lossy(&rm.stderr)
    );
    until_room_after_rm(|| {
        let out = write("again");
        if out.stdout.is_empty() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    });
    m.stop();
    fs_check(&nodes, "full");
    drop(node);
}

/// A new file system `fs` mounted on a lone node under `--durability
/// interval` (which acknowledges writes before they are on its device):
/// the cluster, its address, the directory holding the mount point, the
/// mount point and the mount.
fn mount_on_an_interval_node(fs: &str) -> (TestCluster, String, tempfile::TempDir, PathBuf, Mount) {
    let tc = TestCluster::start_with(1, &["--durability", "interval"]);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, fs, &mnt, &["--create"]);
    (tc, nodes, tmp, mnt, m)
}

/// The first change of a mount allocates inode numbers: the counter's new
/// limit must be durable before the inode the change makes, or a node
/// that restarts between the two keeps the inode and loses the counter,
/// and a later mount hands its number out again (the mount reported the
/// loss at unmount instead). A node killed right after the first mkdir.
#[test]
fn a_node_restarted_after_the_first_change_keeps_the_inode_counter() {
    if !can_mount() {
        return;
    }
    let (mut tc, nodes, _tmp, mnt, m) = mount_on_an_interval_node("c");
    std::fs::create_dir(mnt.join("first")).expect("mkdir");
    tc.kill(0);
    tc.restart(0);
    std::fs::create_dir(mnt.join("second")).expect("mkdir after the restart");
    m.stop();
    let m = Mount::start(&nodes, "c", &mnt, &[]);
    std::fs::create_dir(mnt.join("third")).expect("mkdir after a remount");
    let ino =
        |n: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(mnt.join(n)).expect(n));
    let inos = [ino("first"), ino("second"), ino("third")];
    assert!(
        inos[0] != inos[1] && inos[1] != inos[2] && inos[0] != inos[2],
        "{inos:?}"
    );
    m.stop();
    fs_check(&nodes, "c");
}

/// A lone node under `--durability interval` killed with SIGKILL right
/// after a burst of metadata changes loses its unsynced log tail; the
/// mount, which acknowledged those changes from its caches, must neither
/// lose them nor write later changes that rest on them (before the
/// write-behind's batches were synced, the restarted node held the root's
/// new link count without the directories it counted). And the first
/// change after the restart works at once (the pooled connections to the
/// dead node are not handed to it).
#[test]
fn a_restarted_node_loses_no_acknowledged_change_of_the_mount() {
    if !can_mount() {
        return;
    }
    let (mut tc, nodes, _tmp, mnt, m) = mount_on_an_interval_node("k");
    const DIRS: usize = 20;
    for i in 0..DIRS {
        std::fs::create_dir(mnt.join(format!("d{i}"))).expect("mkdir");
        std::fs::File::create(mnt.join(format!("d{i}/f"))).expect("create");
    }
    tc.kill(0);
    tc.restart(0);
    std::fs::create_dir(mnt.join("after")).expect("the first change after the restart");
    std::fs::write(mnt.join("after/f"), b"more").expect("a write after the restart");
    m.stop();
    let said = fs_check(&nodes, "k");
    eprintln!("after the node's restart: {said}");
    let m = Mount::start(&nodes, "k", &mnt, &[]);
    for i in 0..DIRS {
        assert!(
            mnt.join(format!("d{i}/f")).is_file(),
            "d{i}/f lost with the node's unsynced tail"
        );
    }
    assert_eq!(std::fs::read(mnt.join("after/f")).expect("read"), b"more");
    m.stop();
}

/// A file system on a node whose device fills: the write that does not fit
/// fails with ENOSPC (at `fsync` at the latest), every file written and
/// synced before reads back, and once the
/// files are removed the space comes back and writes work again, all
/// without a restart; `fs check` finds nothing wrong.
#[test]
fn a_full_node_gives_enospc_and_room_again_after_rm() {
    if !can_mount() {
        return;
    }
    let tc = TestCluster::start_with(1, &["--capacity", "96M"]);
    let nodes = tc.addrs.join(",");
    let tmp = tempdir();
    let mnt = tmp.path().join("mnt");
    let m = Mount::start(&nodes, "full", &mnt, &["--create"]);
    let said = String::from_utf8_lossy(
        &sh(&format!(
            "cd '{m}' && i=0; while [ $i -lt 100 ]; do i=$((i+1)); \
         head -c 4194304 /dev/urandom > '{t}/src'; \
         if ! dd if='{t}/src' of=f$i bs=1M conv=fsync status=none 2>'{t}/err'; then \
         echo \"failed at $i: $(cat '{t}/err')\"; break; fi; \
         sha1sum < '{t}/src' | cut -c1-40 > \"{t}/f$i.sum\"; done",
            m = mnt.display(),
            t = tmp.path().display()
        ))
        .stdout,
    )
    .into_owned();
    assert!(
        said.starts_with("failed at ") && said.contains("No space left on device"),
        "{said}"
    );
    let failed_at: usize = said
        .trim_start_matches("failed at ")
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("file number");
    assert!(
        failed_at > 8,
        "only {} files of 4 MiB fit 96 MiB",
        failed_at - 1
    );
    for i in 1..failed_at {
        let want = std::fs::read_to_string(tmp.path().join(format!("f{i}.sum"))).expect("sum");
        let got = sh(&format!(
            "sha1sum < '{}' | cut -c1-40",
            mnt.join(format!("f{i}")).display()
        ));
        assert_eq!(
            String::from_utf8_lossy(&got.stdout),
            want,
            "f{i} after the device filled"
        );
    }
    sh(&format!("rm -f '{}'/f*", mnt.display()));
    // Deleted data is reclaimed in the background: writes come back
    // within a bounded time.
    until_room_after_rm(|| {
        let out = Command::new("dd")
            .arg("if=/dev/urandom")
            .arg(format!("of={}", mnt.join("again").display()))
            .args(["bs=1M", "count=8", "conv=fsync", "status=none"])
            .output()
            .expect("dd");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    m.stop();
    fs_check(&nodes, "full");
}
