//! The raw page-device abstraction and the aligned I/O buffer.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::ptr::NonNull;

use crate::error::{FlashError, Result};
use crate::stats::DeviceCounters;
use crate::{IO_ALIGN, READ_ALIGN};

/// A raw page device: a linear array of `capacity / page_size` pages.
///
/// All methods take `&self` and are safe to call from many threads at once.
/// Invariant of every implementation: `page_size` is a nonzero multiple of
/// [`IO_ALIGN`] and `capacity` is a multiple of `page_size`.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// Size of the device in bytes.
    fn capacity(&self) -> u64;
    /// Size of one page (the program unit) in bytes.
    fn page_size(&self) -> u32;
    /// Reads `buf.len()` bytes at `offset`; both must be multiples of [`READ_ALIGN`].
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes `data` at `offset`; both must be multiples of the page size.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Makes everything written before this call durable once it returns `Ok`.
    fn sync(&self) -> Result<()>;
    /// Erases/discards `len` bytes at `offset` (page aligned). Best effort on
    /// files: afterwards the range reads as erased bytes or as its old content.
    fn trim(&self, offset: u64, len: u64) -> Result<()>;
    /// Erases `len` bytes at `offset` (page aligned) for rewriting, as
    /// [`Device::trim`] does, but keeps the range's storage: on a regular
    /// file the blocks are allocated (`fallocate`), not punched, so no later
    /// write into the range can fail for want of room on the host file
    /// system. Fails with [`FlashError::HostFull`] when the host lacks the
    /// room (what it did allocate stays allocated). The default, for devices
    /// with no host to fill, is `trim`.
    fn prepare(&self, offset: u64, len: u64) -> Result<()> {
        self.trim(offset, len)
    }
    /// True when the device takes its space from a host file system as it
    /// is written (a regular file), so that other files can leave it no
    /// room; then the store keeps free segments backed (see backing.rs).
    /// False (the default) for devices whose space is their own.
    fn allocates_on_write(&self) -> bool {
        false
    }
    /// Cumulative operation counters.
    fn counters(&self) -> DeviceCounters;
    /// Performs several reads, each with the rules of [`Device::read_at`].
    /// Devices that can overlap I/Os issue them in parallel; the default is
    /// sequential. Returns the first error (in request order).
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (offset, buf) in reqs.iter_mut() {
            self.read_at(*offset, buf)?;
        }
        Ok(())
    }
    /// Performs several writes, each with the rules of [`Device::write_at`].
    /// Devices that can overlap I/Os issue them in parallel; the default
    /// writes them in order and stops at the first error. On error, returns
    /// how many writes, counted from the first, completed before the first
    /// that failed, with that error (later ones may have completed too).
    fn write_many(&self, writes: &[(u64, &[u8])]) -> std::result::Result<(), (usize, FlashError)> {
        for (i, (offset, data)) in writes.iter().enumerate() {
            self.write_at(*offset, data).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// A descriptor on which a read of `len` bytes at `offset` (the rules of
    /// [`Device::read_at`]) may be issued straight into an [`AlignedBuf`] by
    /// a [`crate::ReadQueue`]: `None` (the default) when the device has no
    /// such descriptor or cannot read that range that way.
    fn read_fd(&self, _offset: u64, _len: usize) -> Option<RawFd> {
        None
    }
    /// Counts a read that completed on [`Device::read_fd`]'s descriptor.
    fn note_read(&self, _offset: u64, _len: usize) {}
}

/// Checks the [`Device::read_at`] argument rules against a device of `capacity` bytes.
pub(crate) fn check_read(capacity: u64, offset: u64, len: usize) -> Result<()> {
    let align = READ_ALIGN as u64;
    if !offset.is_multiple_of(align) || !len.is_multiple_of(READ_ALIGN) {
        return Err(FlashError::Misaligned(format!(
            "read at {offset} of {len} bytes is not {READ_ALIGN}-byte aligned"
        )));
    }
    check_range(capacity, offset, len as u64)
}

/// Checks the [`Device::write_at`] / [`Device::trim`] rules: page-aligned and in range.
pub(crate) fn check_page_range(capacity: u64, page_size: u32, offset: u64, len: u64) -> Result<()> {
    let ps = u64::from(page_size);
    if !offset.is_multiple_of(ps) || !len.is_multiple_of(ps) {
        return Err(FlashError::Misaligned(format!(
            "range at {offset} of {len} bytes is not aligned to the {ps}-byte page"
        )));
    }
    check_range(capacity, offset, len)
}

fn check_range(capacity: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(FlashError::OutOfRange(format!(
            "range at {offset} of {len} bytes exceeds device capacity {capacity}"
        ))),
    }
}

/// Heap buffer whose address is [`IO_ALIGN`]-aligned and whose length is a
/// multiple of [`IO_ALIGN`]; usable for O_DIRECT I/O. Zero-filled on creation.
pub struct AlignedBuf {
    /// Start of the buffer. When `len == 0` it is a dangling, aligned pointer
    /// that is never dereferenced or freed; otherwise it was allocated with
    /// `Self::layout(len)`, all its bytes are initialized (zeroed by
    /// `alloc_zeroed`, or written before an [`UninitBuf`] became this), and
    /// it is owned exclusively.
    ptr: NonNull<u8>,
    /// Length in bytes; always a multiple of `IO_ALIGN`.
    len: usize,
}

// SAFETY: `AlignedBuf` exclusively owns its heap memory (like `Vec<u8>`), so
// moving it to or sharing `&AlignedBuf` with another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`; `&AlignedBuf` only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of `len` bytes rounded up to [`IO_ALIGN`].
    ///
    /// # Panics
    /// If the rounded length overflows `isize` (like `Vec`'s capacity overflow).
    pub fn new_zeroed(len: usize) -> AlignedBuf {
        let (ptr, len) = allocate(len, Fill::Zeroed);
        AlignedBuf { ptr, len }
    }

    /// Allocates a buffer holding a copy of `data`, zero padded to [`IO_ALIGN`]
    /// (written once: the copied bytes are not zeroed first).
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut buf = UninitBuf::new(data.len());
        // SAFETY: `buf` has room for `data.len()` bytes (it rounds up) and
        // is a fresh allocation, so the two do not overlap; those bytes are
        // then initialized, which is what `assume_init_prefix` requires.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.as_mut_ptr(), data.len());
            buf.assume_init_prefix(data.len())
        }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, IO_ALIGN).expect("AlignedBuf capacity overflow")
    }

    /// Length in bytes (a multiple of [`IO_ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialized (zeroed) bytes, or
        // dangling-but-aligned with `len == 0`; `&self` guarantees no `&mut` alias.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// What [`allocate`] leaves in the bytes it allocates.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    Zeroed,
    Uninit,
}

/// Allocates `len` bytes rounded up to [`IO_ALIGN`], [`IO_ALIGN`]-aligned
/// (the layout [`AlignedBuf::layout`] frees): the start and the rounded
/// length. A zero length gets an aligned dangling pointer, which is never
/// dereferenced or freed.
///
/// # Panics
/// If the rounded length overflows `isize` (like `Vec`'s capacity overflow).
fn allocate(len: usize, fill: Fill) -> (NonNull<u8>, usize) {
    let len = len
        .checked_next_multiple_of(IO_ALIGN)
        .expect("AlignedBuf capacity overflow");
    if len == 0 {
        let ptr =
            NonNull::new(std::ptr::without_provenance_mut(IO_ALIGN)).expect("IO_ALIGN is nonzero");
        return (ptr, len);
    }
    let layout = AlignedBuf::layout(len);
    // SAFETY: `layout` has a nonzero size (len > 0 here).
    let raw = unsafe {
        match fill {
            Fill::Zeroed => alloc::alloc_zeroed(layout),
            Fill::Uninit => alloc::alloc(layout),
        }
    };
    let Some(ptr) = NonNull::new(raw) else {
        alloc::handle_alloc_error(layout)
    };
    (ptr, len)
}

/// Frees what [`allocate`] returned (nothing for a zero length).
///
/// # Safety
/// `(ptr, len)` came from [`allocate`] and is not freed again.
unsafe fn deallocate(ptr: NonNull<u8>, len: usize) {
    if len != 0 {
        // SAFETY: allocated with exactly this layout (the caller's promise).
        unsafe { alloc::dealloc(ptr.as_ptr(), AlignedBuf::layout(len)) }
    }
}

/// An allocation laid out like an [`AlignedBuf`] whose bytes are not
/// initialized yet: the destination of a device read, which would only
/// overwrite zeros written first (for a random read, zeroing the buffer
/// cost more CPU than checking the value's CRC). It becomes an
/// `AlignedBuf` once its bytes are written ([`UninitBuf::assume_init_prefix`]).
pub struct UninitBuf {
    /// As in [`AlignedBuf`], except that the bytes may be uninitialized;
    /// never exposed as a slice.
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `UninitBuf` exclusively owns its heap memory, like `AlignedBuf`.
unsafe impl Send for UninitBuf {}

impl UninitBuf {
    /// Allocates `len` bytes rounded up to [`IO_ALIGN`], uninitialized.
    ///
    /// # Panics
    /// If the rounded length overflows `isize` (as [`AlignedBuf::new_zeroed`]).
    pub fn new(len: usize) -> UninitBuf {
        let (ptr, len) = allocate(len, Fill::Uninit);
        UninitBuf { ptr, len }
    }

    /// Where the bytes go (for the kernel or a copy to write into).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The buffer as an [`AlignedBuf`], its bytes from `n` on zeroed.
    ///
    /// # Safety
    /// The first `min(n, len)` bytes must have been written.
    pub unsafe fn assume_init_prefix(self, n: usize) -> AlignedBuf {
        let n = n.min(self.len);
        if n < self.len {
            // SAFETY: `n..len` lies inside the allocation.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(n), 0, self.len - n) };
        }
        let buf = AlignedBuf {
            ptr: self.ptr,
            len: self.len,
        };
        // The allocation now belongs to `buf`.
        std::mem::forget(self);
        buf
    }
}

impl Drop for UninitBuf {
    fn drop(&mut self) {
        // SAFETY: from `allocate` in `new`, owned exclusively and not freed
        // before (`assume_init_prefix` forgets what it hands on).
        unsafe { deallocate(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: from `allocate` (in `new_zeroed` or `UninitBuf::new`),
        // owned exclusively and not freed before.
        unsafe { deallocate(self.ptr, self.len) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

/// True when `p` is [`IO_ALIGN`]-aligned.
pub(crate) fn is_io_aligned(p: *const u8) -> bool {
    (p as usize).is_multiple_of(IO_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_partly_read_buffers_are_zero_padded() {
        for len in [0usize, 1, 100, 4095, 4096, 4097, 3 * 4096 + 5] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let b = AlignedBuf::copy_from(&data);
            assert!(is_io_aligned(b.as_ptr()), "len {len}");
            assert_eq!(b.len(), len.next_multiple_of(IO_ALIGN));
            assert_eq!(&b[..len], &data[..]);
            assert!(b[len..].iter().all(|&x| x == 0), "padding of {len}");
        }
        // A read that wrote only part of its buffer: the rest reads as zeros.
        let mut u = UninitBuf::new(2 * IO_ALIGN);
        // SAFETY: 10 bytes inside the allocation.
        unsafe { std::ptr::write_bytes(u.as_mut_ptr(), 0xAB, 10) };
        // SAFETY: the first 10 bytes were written just above.
        let b = unsafe { u.assume_init_prefix(10) };
        assert!(b[..10].iter().all(|&x| x == 0xAB));
        assert!(b[10..].iter().all(|&x| x == 0));
        drop(UninitBuf::new(IO_ALIGN)); // freed unwritten
    }

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_rounded() {
        for len in [1usize, 4095, 4096, 4097, 3 * 4096, 1 << 20] {
            let mut b = AlignedBuf::new_zeroed(len);
            assert!(is_io_aligned(b.as_ptr()), "len {len}");
            assert_eq!(b.len() % IO_ALIGN, 0);
            assert!(b.len() >= len && b.len() < len + IO_ALIGN);
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            assert_eq!(b.as_slice()[len - 1], 7);
        }
        let empty = AlignedBuf::new_zeroed(0);
        assert!(empty.is_empty());
        assert_eq!(empty.as_slice(), &[] as &[u8]);
    }

    #[test]
    fn aligned_buf_copy_from_pads_with_zeroes() {
        let b = AlignedBuf::copy_from(&[1, 2, 3]);
        assert_eq!(b.len(), IO_ALIGN);
        assert_eq!(&b[..4], &[1, 2, 3, 0]);
    }

    #[test]
    fn argument_checks() {
        assert!(check_read(1 << 20, 4096, 4096).is_ok());
        assert!(matches!(
            check_read(1 << 20, 100, 4096),
            Err(FlashError::Misaligned(_))
        ));
        assert!(matches!(
            check_read(1 << 20, 0, 100),
            Err(FlashError::Misaligned(_))
        ));
        assert!(matches!(
            check_read(8192, 4096, 8192),
            Err(FlashError::OutOfRange(_))
        ));
        assert!(matches!(
            check_read(8192, u64::MAX - 4095, 4096),
            Err(FlashError::OutOfRange(_))
        ));
        assert!(check_page_range(1 << 20, 8192, 8192, 16384).is_ok());
        assert!(matches!(
            check_page_range(1 << 20, 8192, 4096, 8192),
            Err(FlashError::Misaligned(_))
        ));
    }
}
