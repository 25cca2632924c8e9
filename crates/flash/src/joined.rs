//! Joined writes: adjacent writes of one [`crate::Device::write_many`] call
//! issued as one `pwritev`, so the disk sees fewer, larger requests.
//!
//! The value log hands the device its sealed 1 MiB chunks a group at a
//! time, and consecutive chunks of a segment are adjacent on the device.
//! Written one `pwrite` each, a disk that takes direct writes at a rate
//! growing with the request size (virtual disks, which forward each
//! request to a host) sees only 1 MiB requests; joined, it sees requests of
//! up to [`MAX_JOINED_BYTES`] (`bench/RESULTS.md`, session 49).

use std::fs::File;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::os::fd::AsRawFd;

use crate::device::is_io_aligned;
use crate::IO_ALIGN;

/// Most bytes one joined write carries.
pub(crate) const MAX_JOINED_BYTES: usize = 4 << 20;
/// Most buffers one joined write gathers (well under `IOV_MAX`).
const MAX_JOINED_PARTS: usize = 64;

/// Splits `writes` (in call order) into runs to issue as one write each: a
/// run is a maximal sequence of writes, each starting where the one before
/// it ends, of at most [`MAX_JOINED_BYTES`] and [`MAX_JOINED_PARTS`] in
/// all. Under direct I/O a write whose buffer is not [`IO_ALIGN`]-aligned
/// (in address and length) runs alone: only a single write may go through
/// a bounce buffer. The runs cover every index once, in order.
pub(crate) fn plan_runs(writes: &[(u64, &[u8])], direct: bool) -> Vec<Range<usize>> {
    let joinable = |data: &[u8]| {
        !direct || (is_io_aligned(data.as_ptr()) && data.len().is_multiple_of(IO_ALIGN))
    };
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut run_end = 0u64; // device offset just past the current run
    let mut run_bytes = 0usize;
    for (i, &(offset, data)) in writes.iter().enumerate() {
        let extends = match runs.last() {
            Some(run) => {
                joinable(data)
                    && joinable(writes[run.start].1)
                    && offset == run_end
                    && run_bytes + data.len() <= MAX_JOINED_BYTES
                    && run.len() < MAX_JOINED_PARTS
            }
            None => false,
        };
        match runs.last_mut() {
            Some(run) if extends => {
                run.end = i + 1;
                run_bytes += data.len();
            }
            _ => {
                runs.push(i..i + 1);
                run_bytes = data.len();
            }
        }
        run_end = offset + data.len() as u64;
    }
    runs
}

/// Writes `parts` back to back at `offset` with `pwritev`, resuming after
/// short writes (`IoSlice::advance_slices`, as the client's sockets do),
/// until every byte is written.
pub(crate) fn write_all_vectored_at(
    file: &File,
    mut offset: u64,
    parts: &[&[u8]],
) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let mut left: &mut [IoSlice<'_>] = &mut slices;
    IoSlice::advance_slices(&mut left, 0); // drops leading empty parts
    while !left.is_empty() {
        let count = left.len().min(MAX_JOINED_PARTS) as libc::c_int;
        let at = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "write offset too large"))?;
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix;
        // `left` holds at least `count` of them, each pointing into a slice
        // of `parts`, borrowed (and not mutated) for the call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                left.as_ptr().cast::<libc::iovec>(),
                count,
                at,
            )
        };
        match n {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n if n > 0 => {
                offset += n as u64;
                IoSlice::advance_slices(&mut left, n as usize);
            }
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;
    use std::os::unix::fs::FileExt;

    const MIB: usize = 1 << 20;

    fn bufs(n: usize, len: usize) -> Vec<AlignedBuf> {
        (0..n)
            .map(|i| {
                let mut b = AlignedBuf::new_zeroed(len);
                b.iter_mut().for_each(|x| *x = i as u8 + 1);
                b
            })
            .collect()
    }

    #[test]
    fn adjacent_writes_join_up_to_the_limit() {
        let b = bufs(10, MIB);
        // Ten adjacent 1 MiB writes: runs of four, four and two.
        let writes: Vec<(u64, &[u8])> = (0..10).map(|i| ((i * MIB) as u64, &b[i][..])).collect();
        assert_eq!(plan_runs(&writes, true), vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn gaps_and_misaligned_buffers_break_runs() {
        let b = bufs(4, MIB);
        let unaligned = vec![7u8; MIB + 1];
        let writes: Vec<(u64, &[u8])> = vec![
            (0, &b[0][..]),
            (MIB as u64, &b[1][..]),
            // a gap of one MiB
            (3 * MIB as u64, &b[2][..]),
            (4 * MIB as u64, &unaligned[1..]),
            (5 * MIB as u64, &b[3][..]),
        ];
        assert_eq!(plan_runs(&writes, true), vec![0..2, 2..3, 3..4, 4..5]);
        // Without direct I/O any buffer joins.
        assert_eq!(plan_runs(&writes, false), vec![0..2, 2..5]);
        assert!(plan_runs(&[], true).is_empty());
    }

    #[test]
    fn a_write_that_does_not_follow_starts_a_run() {
        let b = bufs(3, MIB);
        // Same offsets twice (not adjacent) and a write before its predecessor.
        let writes: Vec<(u64, &[u8])> = vec![
            (2 * MIB as u64, &b[0][..]),
            (2 * MIB as u64, &b[1][..]),
            (MIB as u64, &b[2][..]),
        ];
        assert_eq!(plan_runs(&writes, true), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn vectored_write_lands_every_part_in_order() {
        let dir = std::env::temp_dir().join(format!("ls-joined-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("f");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let b = bufs(3, 8192);
        let parts: Vec<&[u8]> = vec![&b[0][..], &[][..], &b[1][..4096], &b[2][..]];
        write_all_vectored_at(&file, 4096, &parts).expect("pwritev");
        let mut back = vec![0u8; 4096 + 8192 + 4096 + 8192];
        file.read_exact_at(&mut back, 0).expect("read back");
        assert!(back[..4096].iter().all(|&x| x == 0));
        assert!(back[4096..12288].iter().all(|&x| x == 1));
        assert!(back[12288..16384].iter().all(|&x| x == 2));
        assert!(back[16384..].iter().all(|&x| x == 3));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
