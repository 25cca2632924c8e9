//! Where new keytables go on flash: the keytable segment being filled, the
//! id of the next keytable, the free segments a keytable write must leave,
//! and the buffers one keytable's build hands on to the next (a 2 MiB
//! keytable built in fresh memory each time spent as much time in page
//! faults as in copying its bytes).
//!
//! Owned by the maintenance state (`MaintState::kt`), so only the
//! maintenance lock's holder writes keytables.

use std::sync::Arc;

use flash::{AlignedBuf, FlashStore, Purpose, SegmentId};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::keytable::KeytableBuilder;
use crate::maint::SEGMENT_KIND_KEYTABLE;
use crate::version::SegmentRef;

/// Appends keytables to keytable segments, one device write each.
pub(crate) struct KeytableWriter {
    /// Id the next keytable gets (recorded in the manifest).
    pub(crate) next_id: u64,
    /// Keytable segment being filled and the next free page in it.
    pub(crate) seg: Option<(Arc<SegmentRef>, u32)>,
    /// Free segments a new keytable segment must leave (see
    /// `maint::kt_reserve`): set by each kind of work before it writes.
    pub(crate) keep_free: u32,
    /// A written keytable's bytes, whose memory the next builder reuses.
    spare: Vec<u8>,
    /// The aligned buffer device writes are staged in (direct I/O needs
    /// aligned memory), kept between writes.
    staging: Option<AlignedBuf>,
}

impl KeytableWriter {
    /// A writer whose next keytable gets id `next_id`.
    pub(crate) fn new(next_id: u64) -> Self {
        KeytableWriter {
            next_id,
            seg: None,
            keep_free: 0,
            spare: Vec::new(),
            staging: None,
        }
    }

    /// A builder for the next keytable (its id taken from the counter).
    pub(crate) fn builder(&mut self, page: usize, bloom_bits_per_key: usize) -> KeytableBuilder {
        let id = self.next_id;
        self.next_id += 1;
        KeytableBuilder::reusing(
            id,
            page,
            bloom_bits_per_key,
            std::mem::take(&mut self.spare),
        )
    }

    /// Gives a written keytable's bytes back for the next builder.
    pub(crate) fn recycle(&mut self, bytes: Vec<u8>) {
        if bytes.capacity() > self.spare.capacity() {
            self.spare = bytes;
        }
    }

    /// The keytable segment being filled, if any.
    pub(crate) fn current_segment(&self) -> Option<SegmentId> {
        self.seg.as_ref().map(|(r, _)| r.seg())
    }

    /// Leaves the segment being filled: the next keytable opens a new one.
    /// The old one is released once no keytable in it is live.
    pub(crate) fn start_new_segment(&mut self) {
        self.seg = None;
    }

    /// Pages left in the keytable segment being filled (0 without one).
    pub(crate) fn room_pages(&self, pages_per_segment: u32) -> u32 {
        self.seg
            .as_ref()
            .map_or(0, |(_, next)| pages_per_segment.saturating_sub(*next))
    }

    /// Appends whole pages (`bytes.len()` a multiple of `page`) to the
    /// current keytable segment in one device write, opening a new segment
    /// when they do not fit; `Error::NoSpace` (`HostFull` while the host
    /// file system is full) if that would leave fewer than
    /// [`Self::keep_free`] free segments. Returns the segment and the first
    /// page written.
    pub(crate) fn place(
        &mut self,
        flash: &FlashStore,
        release_queue: &Arc<Mutex<Vec<SegmentId>>>,
        page: usize,
        bytes: &[u8],
    ) -> Result<(Arc<SegmentRef>, u32)> {
        debug_assert_eq!(bytes.len() % page, 0, "keytables are whole pages");
        let pages = (bytes.len() / page) as u32;
        let seg_pages = flash.geometry().pages_per_segment;
        if pages > seg_pages {
            return Err(Error::InvalidOptions(format!(
                "keytable of {pages} pages does not fit a {seg_pages}-page segment"
            )));
        }
        let fits = self
            .seg
            .as_ref()
            .is_some_and(|(_, next)| next + pages <= seg_pages);
        if !fits {
            let (seg, _) =
                flash.allocate_for(Purpose::MakesRoom, SEGMENT_KIND_KEYTABLE, self.keep_free)?;
            self.seg = Some((SegmentRef::new(seg, release_queue.clone()), 0));
        }
        let mut staging = match self.staging.take() {
            Some(buf) if buf.len() >= bytes.len() => buf,
            _ => AlignedBuf::new_zeroed(bytes.len()),
        };
        staging[..bytes.len()].copy_from_slice(bytes);
        let Some((seg_ref, next)) = self.seg.as_mut() else {
            return Err(Error::Corrupt("no keytable segment".into()));
        };
        let first_page = *next;
        let written = flash.write(seg_ref.seg(), first_page, &staging[..bytes.len()]);
        self.staging = Some(staging);
        written?;
        *next += pages;
        Ok((seg_ref.clone(), first_page))
    }
}
