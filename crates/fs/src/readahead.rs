//! The kernel's read-ahead window for a mount.
//!
//! FUSE caps a mount's read-ahead at what the kernel offered in `INIT`:
//! the backing device's default of 128 KiB, whatever the file system asks
//! for. A sequential reader then has one 128 KiB read in flight at a time,
//! each a round trip through the adapter and the cluster, and waits for
//! latency rather than bandwidth. The window can only be widened after
//! `INIT`, through the mount's backing-device entry in sysfs
//! (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, writable by root), which is
//! what [`widen_when_mounted`] does.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often [`widen_when_mounted`] looks whether the mount answers.
const POLL: Duration = Duration::from_millis(20);

/// The sysfs file holding the read-ahead window of the device `dev`
/// (a `st_dev`), in KiB.
pub fn sysfs_path(dev: u64) -> PathBuf {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    PathBuf::from(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
}

/// Waits (at most `timeout`) until `mountpoint` is a mount that answers,
/// a file system other than its parent's, then sets its read-ahead window
/// to `bytes` (rounded down to KiB). Returns the sysfs file written.
///
/// Must run beside the FUSE session, not before it: the mount answers only
/// once the session has replied to `INIT`, and the kernel's `INIT` handling
/// would cap a window set earlier.
pub fn widen_when_mounted(mountpoint: &Path, bytes: u64, timeout: Duration) -> io::Result<PathBuf> {
    let parent = match mountpoint.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let outside = std::fs::metadata(parent)?.dev();
    let deadline = Instant::now() + timeout;
    let dev = loop {
        // A stat of the mount goes through FUSE: it returns once INIT is done.
        match std::fs::metadata(mountpoint) {
            Ok(m) if m.dev() != outside => break m.dev(),
            _ if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} was not mounted within {timeout:?}",
                        mountpoint.display()
                    ),
                ))
            }
            _ => std::thread::sleep(POLL),
        }
    };
    let path = sysfs_path(dev);
    std::fs::write(&path, format!("{}\n", bytes / 1024))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_names_the_device_by_major_and_minor() {
        let dev = libc::makedev(0, 39);
        assert_eq!(
            sysfs_path(dev),
            PathBuf::from("/sys/class/bdi/0:39/read_ahead_kb")
        );
    }

    #[test]
    fn a_directory_that_is_not_a_mount_times_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("m");
        std::fs::create_dir(&sub).expect("mkdir");
        let err =
            widen_when_mounted(&sub, 4 << 20, Duration::from_millis(60)).expect_err("not a mount");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
