//! Sequential reading of a value-log segment in large device reads, as GC
//! and recovery do: hands out record-sized windows, keeping only the bytes
//! at and after the cursor in memory.

use flash::{AlignedBuf, FlashStore, SegmentId};

use crate::error::{Error, Result};

/// Bytes fetched per device read.
const READ_BYTES: u64 = 1 << 20;

/// A forward-only reader over one segment.
pub struct SegmentReader<'a> {
    flash: &'a FlashStore,
    seg: SegmentId,
    buf: Vec<u8>,
    buf_start: u64,
    /// Bytes read from the device so far.
    pub bytes_read: u64,
}

impl<'a> SegmentReader<'a> {
    /// A reader over `seg`.
    pub fn new(flash: &'a FlashStore, seg: SegmentId) -> Self {
        SegmentReader {
            flash,
            seg,
            buf: Vec::new(),
            buf_start: 0,
            bytes_read: 0,
        }
    }

    /// The bytes `[off, off + len)`, or fewer if the segment ends first.
    /// `off` must not go backwards between calls.
    pub fn window(&mut self, off: u64, len: usize) -> Result<&[u8]> {
        let seg_end = self.flash.geometry().segment_bytes();
        if off < self.buf_start {
            return Err(Error::Corrupt("segment reader moved backwards".into()));
        }
        let want_end = (off + len as u64).min(seg_end);
        let loaded_end = self.buf_start + self.buf.len() as u64;
        if want_end > loaded_end {
            // Keep the bytes from `off` on, then read forward.
            let keep = off.min(loaded_end);
            self.buf.drain(..(keep - self.buf_start) as usize);
            self.buf_start = keep;
            let align = flash::IO_ALIGN as u64;
            let mut at = self.buf_start + self.buf.len() as u64;
            while at < want_end {
                // Reads start where the buffer ends; keep them aligned by
                // reading from the aligned offset below and skipping the head.
                let a = at / align * align;
                let to = (a + READ_BYTES).max(want_end).div_ceil(align) * align;
                let to = to.min(seg_end);
                let mut buf = AlignedBuf::new_zeroed((to - a) as usize);
                self.flash
                    .read(self.seg, a, &mut buf[..(to - a) as usize])?;
                self.bytes_read += to - a;
                self.buf
                    .extend_from_slice(&buf[(at - a) as usize..(to - a) as usize]);
                at = to;
            }
        }
        let s = (off - self.buf_start) as usize;
        let e = ((want_end - self.buf_start) as usize).min(self.buf.len());
        Ok(&self.buf[s.min(e)..e])
    }
}
