//! A memtable's versions in entry order ([`crate::types::entry_order`]):
//! what scans, flushes and reads of older versions walk. Point lookups of
//! a key's newest version go through the hash index
//! ([`crate::memindex`]) instead.
//!
//! The versions are kept as sorted runs, in the manner of the logarithmic
//! method: an insert goes to a short unsorted tail; a full tail is sorted
//! into a run; and the two newest runs are merged while the older is at
//! most twice as long as the newer (up to [`MAX_RUN`] versions). Each
//! version is moved a few times, through sequential memory, where a
//! skiplist insert searched some forty scattered nodes (a third of the CPU
//! of a random fill of small values), and a flush reads runs back to back
//! instead of chasing a pointer per version.
//!
//! Runs stop growing at [`MAX_RUN`] on the writer's path, so a full
//! memtable of small values holds dozens, and a scan seeks and merges
//! every one. When scans have sought through more than [`MANY_RUNS`] runs
//! often enough to pay for it ([`VERSIONS_PER_SEEK`]), background
//! maintenance merges adjacent long runs of similar length
//! ([`SortedRuns::tidy`]) off the writer's path, which leaves about
//! log2(versions / [`MAX_RUN`]) of them. A rare scan (a node's periodic
//! probe of a reserved range under a write-only load) asks for nothing:
//! tidying copies every version again into fresh memory, which would cost
//! such a load more than all its scans' seeks.
//!
//! Contract:
//! - Inserts come from one writer at a time (the value log's lock orders
//!   them); a second concurrent writer waits, so correctness never rests on
//!   that.
//! - A [`Snapshot`] (or [`SortedRuns::search`]) taken after an insert
//!   returned sees that version.
//! - Of two inserts of one `(key, seq)` (a GC relocation re-inserting a
//!   version with its new pointer), readers see the later one only.
//! - Runs are ordered oldest first and never overlap in time: merging
//!   adjacent runs keeps "later insert" decidable by run position.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;

use crate::tag::Tagging;
use crate::types::{Entry, Kind, SeqNo, ValuePtr};

/// Versions in the unsorted tail before it becomes a run: small enough that
/// sorting it (under the lock readers take) and a reader's sorted copy of
/// it cost a few microseconds.
const TAIL: usize = 64;
/// Longest run made by merging: bounds the work of one merge, which runs
/// under the value log's lock (a few hundred microseconds), at the price
/// of more runs for a scan to merge in a full memtable.
const MAX_RUN: usize = 16 * 1024;

/// Runs a snapshot may hold before it counts towards tidying them (see
/// [`SortedRuns::tidy`]).
const MANY_RUNS: usize = 8;
/// Tidying is asked for once the snapshots of a memtable of many runs have
/// made one run seek (each snapshot seeks every run it holds) per this many
/// versions in its runs. A tidy moves each version a few times, about what
/// one seek's comparisons cost per few dozen versions, so it pays once
/// the scans would make that many seeks through runs it removes; a scan
/// heavy load (YCSB workload E) gets there within a fraction of a second,
/// a probe every 100 ms of a memtable of a few hundred thousand versions
/// not in the memtable's lifetime.
const VERSIONS_PER_SEEK: usize = 32;

/// Merged-away runs whose memory is kept for later merges, of those up to
/// half of [`MAX_RUN`] long (longer ones are all kept: see
/// [`trim_spares`]).
const SPARES: usize = 8;

/// Bytes of a key kept inline in its [`Item`]. Keys often share a long
/// prefix (a table or volume name, then a number), so the head covers 32
/// bytes: the adapters' chunk and metadata keys and the usual
/// `user1234…` keys fit whole, and a comparison then never leaves the item
/// to read key bytes (which lie elsewhere, in insertion order).
const HEAD_LEN: usize = 32;

/// A key's first [`HEAD_LEN`] bytes, zero-padded, as big-endian words:
/// comparing heads orders keys like comparing their first 32 bytes.
type KeyHead = [u64; HEAD_LEN / 8];

fn head_of(key: &[u8]) -> KeyHead {
    let mut b = [0u8; HEAD_LEN];
    let n = key.len().min(HEAD_LEN);
    b[..n].copy_from_slice(&key[..n]);
    let mut head = [0u64; HEAD_LEN / 8];
    for (word, bytes) in head.iter_mut().zip(b.chunks_exact(8)) {
        *word = u64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
    }
    head
}

/// A key as the comparisons see it: its head, its length, and the bytes
/// past the head (empty for a key of at most [`HEAD_LEN`] bytes).
type KeyAt<'a> = (&'a KeyHead, usize, &'a [u8], SeqNo);

/// The bytes of `key` past its head.
fn tail_of(key: &[u8]) -> &[u8] {
    key.get(HEAD_LEN..).unwrap_or(&[])
}

/// Orders `(key, seq)` pairs as [`crate::types::entry_order`] does, heads
/// first.
///
/// Equal heads mean the keys agree on their first 32 bytes, except that a
/// shorter key is zero-padded. If either key is at most 32 bytes long, the
/// shorter key is then a prefix of the longer (or they are equal), so the
/// lengths decide; otherwise the tails decide.
fn order(a: KeyAt, b: KeyAt) -> Ordering {
    a.0.cmp(b.0)
        .then_with(|| {
            if a.1.min(b.1) <= HEAD_LEN {
                a.1.cmp(&b.1)
            } else {
                a.2.cmp(b.2)
            }
        })
        .then(b.3.cmp(&a.3))
}

/// One version, its key in its head when the key fits there.
///
/// A key of at most [`HEAD_LEN`] bytes (the adapters' keys, the usual
/// `user1234…` keys) is held whole by the head, so copying an item in a
/// merge is a plain copy. Items used to hold the key's `Bytes`, shared with
/// the point index: every merge then added and dropped a reference, two
/// atomic operations per version per merge (`bench/RESULTS.md`, session
/// 46). Only longer keys keep their bytes, in `long`.
#[derive(Clone, Debug)]
struct Item {
    head: KeyHead,
    key_len: u32,
    /// The whole key, for a key longer than [`HEAD_LEN`] bytes.
    long: Option<Bytes>,
    seq: SeqNo,
    kind: Kind,
    ptr: ValuePtr,
    tag: Tagging,
}

impl Item {
    fn new(entry: &Entry) -> Self {
        Item {
            head: head_of(&entry.key),
            // Keys are bounded far below 4 GiB (`Options::max_key_size`).
            key_len: u32::try_from(entry.key.len()).unwrap_or(u32::MAX),
            long: (entry.key.len() > HEAD_LEN).then(|| entry.key.clone()),
            seq: entry.seq,
            kind: entry.kind,
            ptr: entry.ptr,
            tag: entry.tag,
        }
    }

    fn tail(&self) -> &[u8] {
        self.long.as_deref().map_or(&[], tail_of)
    }

    fn at(&self) -> KeyAt<'_> {
        (&self.head, self.key_len as usize, self.tail(), self.seq)
    }

    fn cmp(&self, o: &Item) -> Ordering {
        order(self.at(), o.at())
    }

    /// Whether its key is `key`, whose head is `head`.
    fn has_key(&self, head: &KeyHead, key: &[u8]) -> bool {
        self.head == *head && self.key_len as usize == key.len() && self.tail() == tail_of(key)
    }

    /// The key's bytes: shared for a long key, copied out of the head
    /// for a short one.
    fn key(&self) -> Bytes {
        match &self.long {
            Some(key) => key.clone(),
            None => {
                let mut bytes = [0u8; HEAD_LEN];
                for (out, word) in bytes.chunks_exact_mut(8).zip(self.head) {
                    out.copy_from_slice(&word.to_be_bytes());
                }
                Bytes::copy_from_slice(&bytes[..self.key_len as usize])
            }
        }
    }

    fn entry(&self) -> Entry {
        Entry {
            key: self.key(),
            seq: self.seq,
            kind: self.kind,
            ptr: self.ptr,
            tag: self.tag,
        }
    }
}

/// Every how many items a run keeps its item's head in [`RunData::fences`].
const FENCE: usize = 16;

/// A sorted run: strictly increasing in entry order (no `(key, seq)`
/// twice).
type Run = Arc<RunData>;

/// A run's items, and every [`FENCE`]th item's key head in an array of its
/// own: a seek searches those first (a few kilobytes, in cache after the
/// first seeks) and then at most a few items, where a search of the items
/// alone missed the cache at almost every step (an item is about a hundred
/// bytes and a full run over a megabyte). A cluster scan's listing seeks
/// every run of the memtable.
struct RunData {
    items: Vec<Item>,
    fences: Vec<KeyHead>,
}

impl RunData {
    fn new(items: Vec<Item>) -> Self {
        let fences = items.iter().step_by(FENCE).map(|it| it.head).collect();
        RunData { items, fences }
    }
}

impl std::ops::Deref for RunData {
    type Target = [Item];

    fn deref(&self) -> &[Item] {
        &self.items
    }
}

/// Sorts inserts of one tail into a run, in place: stable, so that of
/// equal `(key, seq)` pairs the last inserted is the one kept.
fn sorted(mut items: Vec<Item>) -> Vec<Item> {
    items.sort_by(Item::cmp);
    // `dedup_by` drops the later of two equal items: keep its contents.
    items.dedup_by(|later, kept| {
        let equal = later.cmp(kept) == Ordering::Equal;
        if equal {
            std::mem::swap(later, kept);
        }
        equal
    });
    items
}

/// Merges two adjacent runs into `out` (empty); of equal `(key, seq)`
/// pairs, `newer`'s wins.
fn merge_two(older: &[Item], newer: &[Item], mut out: Vec<Item>) -> Vec<Item> {
    debug_assert!(out.is_empty());
    out.reserve(older.len() + newer.len());
    let (mut i, mut j) = (0, 0);
    while i < older.len() && j < newer.len() {
        match older[i].cmp(&newer[j]) {
            Ordering::Less => {
                out.push(older[i].clone());
                i += 1;
            }
            Ordering::Greater => {
                out.push(newer[j].clone());
                j += 1;
            }
            Ordering::Equal => {
                out.push(newer[j].clone());
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&older[i..]);
    out.extend_from_slice(&newer[j..]);
    out
}

/// Position of the first item at or after `(key, seq)` in a run.
fn seek(run: &RunData, head: &KeyHead, key: &[u8], seq: SeqNo) -> usize {
    // Heads never decrease along a run. The fence before the first one
    // not below `head` is below it, so is every item up to that fence; a
    // fence above `head` is above the target, so is every item from it.
    let first_not_below = run.fences.partition_point(|h| h < head);
    let first_above =
        first_not_below + run.fences[first_not_below..].partition_point(|h| h == head);
    let lo = first_not_below.saturating_sub(1) * FENCE;
    let hi = (first_above * FENCE).min(run.items.len());
    let at = (head, key.len(), tail_of(key), seq);
    lo + run.items[lo..hi].partition_point(|it| order(it.at(), at) == Ordering::Less)
}

/// Keeps, of emptied run vectors, every one with room for more than half
/// a full run (`max_run` versions: a run that long is no longer merged but
/// with a shorter one, so a memtable keeps most of them to the end) and
/// the [`SPARES`] largest of the others. A full memtable is mostly such
/// runs, each made by a merge into a vector of its own; kept only eight,
/// the next memtable took the rest fresh from the allocator, and a node
/// overwriting a block volume faulted in (and cleared) a sixth of its new
/// memory for them (session 36 in `bench/RESULTS.md`). The long ones are
/// bounded by what one memtable held, since only a dropped memtable gives
/// them back. Vectors of runs longer than the writer makes (merged by
/// [`SortedRuns::tidy`]) are dropped: no writer's merge would use them, and
/// kept, each level of a tidying would stay allocated.
fn trim_spares(spares: &mut Vec<Vec<Item>>, max_run: usize) {
    spares.retain(|v| v.capacity() <= 2 * max_run);
    // Largest first: the long ones, then the short ones to keep.
    spares.sort_unstable_by_key(|v| std::cmp::Reverse(v.capacity()));
    let long = spares.iter().take_while(|v| is_long(v, max_run)).count();
    spares.truncate(long + SPARES);
}

/// Whether `v` has room for more than half a full run (see [`trim_spares`]).
fn is_long(v: &Vec<Item>, max_run: usize) -> bool {
    v.capacity() > max_run / 2
}

/// Emptied run vectors a dropped memtable leaves for the next one's merges
/// (see [`SortedRuns::into_spares`]).
#[derive(Default)]
pub(crate) struct SpareRuns(Vec<Vec<Item>>);

#[derive(Default)]
struct State {
    /// Sorted runs, oldest first.
    runs: Vec<Run>,
    /// The newest inserts, unsorted, fewer than [`TAIL`].
    tail: Vec<Item>,
}

/// The ordered versions of one memtable (see the module doc).
pub(crate) struct SortedRuns {
    /// Held by the writer for a whole insert, merges included.
    writer: Mutex<()>,
    /// What readers copy; held briefly.
    state: Mutex<State>,
    /// Memory of merged-away runs, for the writer's next merges.
    spares: Mutex<Vec<Vec<Item>>>,
    inserted: AtomicUsize,
    /// Run seeks made by snapshots of more than [`MANY_RUNS`] runs since
    /// the last [`SortedRuns::tidy`].
    seeks: AtomicUsize,
    /// Set when those seeks reached one per [`VERSIONS_PER_SEEK`]
    /// versions; cleared by [`SortedRuns::tidy`].
    tidy_wanted: AtomicBool,
    tail_len: usize,
    max_run: usize,
}

impl Default for SortedRuns {
    fn default() -> Self {
        Self::with_limits(TAIL, MAX_RUN)
    }
}

impl SortedRuns {
    /// Empty, with a tail of `tail` versions and merged runs of at most
    /// `max_run` (tests use small ones to make every path run).
    fn with_limits(tail: usize, max_run: usize) -> Self {
        assert!(tail >= 1 && max_run >= tail);
        SortedRuns {
            writer: Mutex::new(()),
            state: Mutex::new(State::default()),
            spares: Mutex::new(Vec::new()),
            inserted: AtomicUsize::new(0),
            seeks: AtomicUsize::new(0),
            tidy_wanted: AtomicBool::new(false),
            tail_len: tail,
            max_run,
        }
    }

    /// Empty, its merges drawing first on the vectors an earlier
    /// memtable's runs left ([`Self::into_spares`]).
    pub(crate) fn with_spares(spares: SpareRuns) -> Self {
        let runs = Self::default();
        *runs.spares.lock() = spares.0;
        runs
    }

    /// Drops every version, keeping the runs' vectors (and the spares) for
    /// another memtable's merges, as [`trim_spares`] allows. A run a reader
    /// still holds is left to that reader.
    pub(crate) fn into_spares(self) -> SpareRuns {
        let max_run = self.max_run;
        let mut spares = self.spares.into_inner();
        for run in self.state.into_inner().runs {
            if let Ok(RunData { items: mut v, .. }) = Arc::try_unwrap(run) {
                v.clear();
                spares.push(v);
            }
        }
        trim_spares(&mut spares, max_run);
        SpareRuns(spares)
    }

    /// Adds one version.
    pub(crate) fn insert(&self, entry: &Entry) {
        let _writer = self.writer.lock();
        self.inserted.fetch_add(1, AtomicOrdering::Relaxed);
        {
            let mut st = self.state.lock();
            st.tail.push(Item::new(entry));
            if st.tail.len() < self.tail_len {
                return;
            }
            let run = sorted(std::mem::replace(
                &mut st.tail,
                Vec::with_capacity(self.tail_len),
            ));
            st.runs.push(Arc::new(RunData::new(run)));
        }
        self.merge_newest();
    }

    /// Merges the two newest runs while the older is at most twice the
    /// newer's length, outside the readers' lock. Called by the writer only.
    fn merge_newest(&self) {
        loop {
            let (older, newer) = {
                let st = self.state.lock();
                let [.., a, b] = st.runs.as_slice() else {
                    return;
                };
                if a.len() > 2 * b.len() || a.len() + b.len() > self.max_run {
                    return;
                }
                (a.clone(), b.clone())
            };
            let out = self.spare_for(older.len() + newer.len());
            let merged = Arc::new(RunData::new(merge_two(&older, &newer, out)));
            {
                let mut st = self.state.lock();
                let n = st.runs.len();
                // Only the writer, which holds `writer`, changes the runs.
                assert!(
                    n >= 2
                        && Arc::ptr_eq(&st.runs[n - 2], &older)
                        && Arc::ptr_eq(&st.runs[n - 1], &newer),
                    "memtable runs changed under their writer"
                );
                st.runs.truncate(n - 2);
                st.runs.push(merged);
            }
            self.recycle(older);
            self.recycle(newer);
        }
    }

    /// An empty vector for a merge of `len` versions: a recycled one when
    /// one fits (at most twice the room needed), else a new one. Merges
    /// into fresh memory spent most of their time on page faults.
    fn spare_for(&self, len: usize) -> Vec<Item> {
        let mut spares = self.spares.lock();
        let fit = spares
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len && v.capacity() <= 2 * len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match fit {
            Some(i) => spares.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps a merged-away run's memory for the next merge, unless a reader
    /// still holds the run (then it is freed when the reader lets go).
    fn recycle(&self, run: Run) {
        let Ok(RunData { items: mut v, .. }) = Arc::try_unwrap(run) else {
            return;
        };
        v.clear();
        let mut spares = self.spares.lock();
        spares.push(v);
        trim_spares(&mut spares, self.max_run);
    }

    /// Vectors kept for merges.
    #[cfg(test)]
    pub(crate) fn spares(&self) -> usize {
        self.spares.lock().len()
    }

    /// Versions inserted (a relocated version counts twice).
    pub(crate) fn inserted(&self) -> usize {
        self.inserted.load(AtomicOrdering::Relaxed)
    }

    /// The newest version of `key` at or below `seq`.
    pub(crate) fn search(&self, key: &[u8], seq: SeqNo) -> Option<Entry> {
        let head = head_of(key);
        let st = self.state.lock();
        // The tail is newer than every run: its match wins a tie.
        let mut best: Option<&Item> = None;
        for it in &st.tail {
            if it.has_key(&head, key) && it.seq <= seq && best.is_none_or(|b| it.seq >= b.seq) {
                best = Some(it);
            }
        }
        for run in st.runs.iter().rev() {
            let Some(it) = run.get(seek(run, &head, key, seq)) else {
                continue;
            };
            if it.has_key(&head, key) && best.is_none_or(|b| it.seq > b.seq) {
                best = Some(it);
            }
        }
        best.map(Item::entry)
    }

    /// Every version inserted so far, as of now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.state.lock();
        if st.runs.len() > MANY_RUNS {
            let seeks = self.seeks.fetch_add(st.runs.len(), AtomicOrdering::Relaxed);
            let versions: usize = st.runs.iter().map(|r| r.items.len()).sum();
            if (seeks + st.runs.len()).saturating_mul(VERSIONS_PER_SEEK) >= versions {
                self.tidy_wanted.store(true, AtomicOrdering::Relaxed);
            }
        }
        let mut runs = st.runs.clone();
        if !st.tail.is_empty() {
            let tail = st.tail.clone();
            drop(st);
            runs.push(Arc::new(RunData::new(sorted(tail))));
        }
        Snapshot { runs }
    }
}

impl SortedRuns {
    /// Sorted runs (the unsorted tail not counted).
    pub(crate) fn runs(&self) -> usize {
        self.state.lock().runs.len()
    }

    /// Whether snapshots of more than [`MANY_RUNS`] runs have sought
    /// through them enough since the last [`SortedRuns::tidy`] to pay for
    /// one ([`VERSIONS_PER_SEEK`]).
    pub(crate) fn wants_tidying(&self) -> bool {
        self.tidy_wanted.load(AtomicOrdering::Relaxed)
    }

    /// Merges adjacent runs of similar length (neither over twice the
    /// other), shortest pair first, until no such pair is left; returns
    /// how many merges it made. For maintenance, off the writer's path:
    /// each merge runs without a lock, and its result replaces the pair
    /// only if the pair is still there, briefly holding the writer's lock
    /// (so the writer never finds its newest runs changed under it).
    /// Readers keep the runs their snapshots hold. The newest two runs
    /// are the writer's to merge and are left alone. Stops early, between
    /// merges, once `worth_it` says no (the memtable was frozen for a
    /// flush, which makes the work moot).
    pub(crate) fn tidy(&self, worth_it: impl Fn() -> bool) -> usize {
        self.tidy_wanted.store(false, AtomicOrdering::Relaxed);
        self.seeks.store(0, AtomicOrdering::Relaxed);
        let mut merges = 0;
        while let Some((older, newer)) = self.pair_to_tidy() {
            if !worth_it() {
                break;
            }
            let out = self.spare_for(older.len() + newer.len());
            let merged = Arc::new(RunData::new(merge_two(&older, &newer, out)));
            {
                let _writer = self.writer.lock();
                let mut st = self.state.lock();
                let at = st.runs.iter().position(|r| Arc::ptr_eq(r, &older));
                match at {
                    Some(i) if st.runs.get(i + 1).is_some_and(|r| Arc::ptr_eq(r, &newer)) => {
                        st.runs.splice(i..i + 2, [merged]);
                    }
                    // The writer merged one of them meanwhile.
                    _ => continue,
                }
            }
            // A run the writer made keeps its vector for later merges; one
            // an earlier tidying made is freed (see `trim_spares`).
            for run in [older, newer] {
                if run.len() <= self.max_run {
                    self.recycle(run);
                }
            }
            merges += 1;
        }
        merges
    }

    /// The adjacent runs, below the newest two, of similar length with
    /// the fewest versions together.
    fn pair_to_tidy(&self) -> Option<(Run, Run)> {
        let st = self.state.lock();
        let n = st.runs.len();
        let settled = &st.runs[..n.saturating_sub(2)];
        settled
            .windows(2)
            .filter(|w| w[0].len() <= 2 * w[1].len() && w[1].len() <= 2 * w[0].len())
            .min_by_key(|w| w[0].len() + w[1].len())
            .map(|w| (w[0].clone(), w[1].clone()))
    }
}

/// The runs of a memtable at one moment, oldest first.
pub(crate) struct Snapshot {
    runs: Vec<Run>,
}

impl Snapshot {
    /// The versions ordered at or after `(from, SeqNo::MAX)`, in entry order.
    pub(crate) fn iter_from(self, from: &[u8]) -> Merged {
        let head = head_of(from);
        let pos: Vec<usize> = self
            .runs
            .iter()
            .map(|r| seek(r, &head, from, SeqNo::MAX))
            .collect();
        let mut m = Merged {
            runs: self.runs,
            pos,
            heap: Vec::new(),
        };
        for r in 0..m.runs.len() {
            if m.pos[r] < m.runs[r].len() {
                m.push(r);
            }
        }
        m
    }
}

/// A merge of sorted runs: a binary min-heap of run numbers ordered by
/// each run's next item, and of equal items the newer run's first.
pub(crate) struct Merged {
    runs: Vec<Run>,
    pos: Vec<usize>,
    heap: Vec<usize>,
}

impl Merged {
    fn head(&self, r: usize) -> &Item {
        &self.runs[r][self.pos[r]]
    }

    /// Whether run `a`'s next item comes out before run `b`'s.
    fn before(&self, a: usize, b: usize) -> bool {
        match self.head(a).cmp(self.head(b)) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a > b,
        }
    }

    fn push(&mut self, r: usize) {
        self.heap.push(r);
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.before(self.heap[i], self.heap[parent]) {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    /// Moves the top run to its next item (dropping it when done) and
    /// restores the heap.
    fn advance_top(&mut self) {
        let top = self.heap[0];
        self.pos[top] += 1;
        if let Some(next) = self.runs[top].get(self.pos[top]) {
            // A long key's bytes lie elsewhere, in insertion order: fetch
            // them now, while the other runs' items come out, rather than
            // when the consumer reads this key.
            if let Some(key) = &next.long {
                prefetch(key.as_ptr());
            }
        } else {
            let last = self.heap.len() - 1;
            self.heap.swap(0, last);
            self.heap.pop();
        }
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut best = i;
            if l < self.heap.len() && self.before(self.heap[l], self.heap[best]) {
                best = l;
            }
            if r < self.heap.len() && self.before(self.heap[r], self.heap[best]) {
                best = r;
            }
            if best == i {
                return;
            }
            self.heap.swap(i, best);
            i = best;
        }
    }
}

/// Hints the CPU to bring the cache line at `p` in (no effect elsewhere).
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint that never faults and reads nothing
    // into the program, whatever `p` points at; SSE is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Iterator for Merged {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        let &top = self.heap.first()?;
        let item = self.head(top).clone();
        self.advance_top();
        // Older inserts of the same version (they come out next).
        while let Some(&r) = self.heap.first() {
            if self.head(r).cmp(&item) != Ordering::Equal {
                break;
            }
            self.advance_top();
        }
        Some(item.entry())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::Just;

    use super::*;
    use crate::test_support::put_at;
    use crate::types::entry_order;

    /// The model: `(key, seq)` to the last pointer inserted, in entry order
    /// (key ascending, then seq descending).
    type Model = BTreeMap<(Vec<u8>, std::cmp::Reverse<SeqNo>), u32>;

    fn check(runs: &SortedRuns, model: &Model, keys: &[Vec<u8>]) {
        let all: Vec<(Vec<u8>, SeqNo, u32)> = runs
            .snapshot()
            .iter_from(&[])
            .map(|e| (e.key.to_vec(), e.seq, e.ptr.offset))
            .collect();
        let want: Vec<(Vec<u8>, SeqNo, u32)> = model
            .iter()
            .map(|((k, s), &o)| (k.clone(), s.0, o))
            .collect();
        assert_eq!(all, want);
        for k in keys {
            let from: Vec<_> = runs.snapshot().iter_from(k).map(|e| e.seq).collect();
            let want: Vec<_> = model
                .range((k.clone(), std::cmp::Reverse(SeqNo::MAX))..)
                .map(|((_, s), _)| s.0)
                .collect();
            assert_eq!(from, want, "from {k:?}");
            for seq in 0..12 {
                let got = runs.search(k, seq).map(|e| (e.seq, e.ptr.offset));
                let want = model
                    .range((k.clone(), std::cmp::Reverse(seq))..)
                    .next()
                    .filter(|((mk, _), _)| mk == k)
                    .map(|((_, s), &o)| (s.0, o));
                assert_eq!(got, want, "{k:?} at {seq}");
            }
        }
    }

    /// A dropped memtable's full runs are all kept for the next one (each
    /// would otherwise be fresh memory again), and of the shorter vectors
    /// only the largest few.
    #[test]
    fn every_full_run_is_kept_for_the_next_memtable() {
        let (tail, max_run) = (4, 64);
        let runs = SortedRuns::with_limits(tail, max_run);
        let n = 20 * max_run + 3 * tail;
        for i in 0..n as u32 {
            runs.insert(&put_at(&i.to_be_bytes(), u64::from(i) + 1, i));
        }
        let full = runs
            .state
            .lock()
            .runs
            .iter()
            .filter(|r| r.len() > max_run / 2)
            .count();
        assert!(full > 2 * SPARES, "{full} long runs");
        let spares = runs.into_spares().0;
        let kept_full = spares.iter().filter(|v| is_long(v, max_run)).count();
        assert!(kept_full >= full, "{kept_full} of {full} long runs kept");
        let short = spares.iter().filter(|v| !is_long(v, max_run)).count();
        assert!(short <= SPARES, "{short} short vectors kept");
        assert!(spares.iter().all(Vec::is_empty));
        // The next memtable's merges draw on them.
        let next = SortedRuns::with_limits(tail, max_run);
        *next.spares.lock() = spares;
        for i in 0..n as u32 {
            next.insert(&put_at(&i.to_be_bytes(), 1, i));
        }
        let left = next
            .spares
            .lock()
            .iter()
            .filter(|v| is_long(v, max_run))
            .count();
        assert!(left < kept_full, "the full vectors were used again");
    }

    /// A memtable of many full runs that a scan found asks to be tidied;
    /// tidying leaves about log2(runs) of them, each version once and in
    /// order, and asks no more.
    #[test]
    fn tidying_leaves_logarithmically_many_runs() {
        let (tail, max_run) = (4, 64);
        let runs = SortedRuns::with_limits(tail, max_run);
        let mut model = Model::new();
        // Keys in a random-looking order, a few inserted twice: every run
        // spans the key space, as a random fill's do.
        let n: u32 = 40 * max_run as u32;
        for i in 0..n {
            let k = (i.wrapping_mul(2_654_435_761) % 997).to_be_bytes();
            runs.insert(&put_at(&k, u64::from(i % 7), i));
            model.insert((k.to_vec(), std::cmp::Reverse(u64::from(i % 7))), i);
        }
        let before = runs.state.lock().runs.len();
        assert!(before > MANY_RUNS, "{before} runs");
        assert!(!runs.wants_tidying(), "only snapshots ask");
        let held = runs.snapshot();
        assert!(!runs.wants_tidying(), "one scan does not pay for a tidy");
        // Snapshots ask once they have made a run seek per
        // VERSIONS_PER_SEEK versions, not before.
        let mut snapshots = 1;
        while !runs.wants_tidying() {
            drop(runs.snapshot());
            snapshots += 1;
            assert!(snapshots <= 1000, "snapshots never asked for tidying");
        }
        let seeks = snapshots * before;
        assert!(
            seeks * VERSIONS_PER_SEEK >= n as usize,
            "asked after {seeks} seeks"
        );
        assert!(
            (seeks - before) * VERSIONS_PER_SEEK < n as usize,
            "asked late: {snapshots}"
        );
        let merges = runs.tidy(|| true);
        assert!(merges > 0);
        assert!(!runs.wants_tidying());
        let after = runs.state.lock().runs.len();
        let log = (before as f64).log2().ceil() as usize;
        assert!(after <= log + 3, "{before} runs tidied to {after}");
        let keys: Vec<Vec<u8>> = model.keys().map(|(k, _)| k.clone()).collect();
        check(&runs, &model, &keys);
        // A snapshot taken before still reads what it held.
        assert_eq!(held.iter_from(&[]).count(), model.len());
        // Only vectors a writer's merge can use are kept for later: room
        // for about one memtable's versions, not one per level of tidying.
        let spares = runs.into_spares().0;
        assert!(spares.iter().all(|v| v.capacity() <= 2 * max_run));
        let room: usize = spares.iter().map(Vec::capacity).sum();
        assert!(
            room <= 3 * n as usize,
            "{room} items of room kept for {n} versions"
        );
    }

    /// Tidying stops between merges once it is no longer worth it (the
    /// memtable was frozen), and a later tidying finishes the work.
    #[test]
    fn tidying_stops_when_told_and_resumes_later() {
        let runs = SortedRuns::with_limits(4, 64);
        for i in 0..40 * 64u32 {
            runs.insert(&put_at(&i.to_be_bytes(), 1, i));
        }
        let before = runs.runs();
        let asked = AtomicUsize::new(0);
        let merges = runs.tidy(|| asked.fetch_add(1, AtomicOrdering::Relaxed) < 3);
        assert_eq!(merges, 3);
        assert_eq!(runs.runs(), before - 3);
        assert!(runs.tidy(|| true) > 0);
        assert!(runs.pair_to_tidy().is_none(), "nothing left to tidy");
        let all: Vec<SeqNo> = runs.snapshot().iter_from(&[]).map(|e| e.seq).collect();
        assert_eq!(all.len(), 40 * 64);
    }

    /// The writer inserting while maintenance tidies and readers scan:
    /// nothing is lost, doubled or reordered, and the writer never finds
    /// its newest runs changed under it (it would panic).
    #[test]
    fn tidying_while_the_writer_inserts_loses_nothing() {
        const N: u64 = 20_000;
        let runs = Arc::new(SortedRuns::with_limits(8, 256));
        let done = Arc::new(AtomicUsize::new(0));
        // Merges the tidier made so far: the writer waits halfway for the
        // first, so that a busy machine that schedules the tidier late
        // still has it tidy while the writer inserts.
        let merged = Arc::new(AtomicUsize::new(0));
        let tidier = {
            let (runs, done, merged) = (runs.clone(), done.clone(), merged.clone());
            std::thread::spawn(move || {
                let mut merges = 0;
                while done.load(AtomicOrdering::Acquire) < N as usize {
                    merges += runs.tidy(|| true);
                    merged.store(merges, AtomicOrdering::Release);
                }
                merges
            })
        };
        let reader = {
            let (runs, done) = (runs.clone(), done.clone());
            std::thread::spawn(move || loop {
                let before = done.load(AtomicOrdering::Acquire) as u64;
                let seen: Vec<SeqNo> = runs.snapshot().iter_from(&[]).map(|e| e.seq).collect();
                assert!(seen.len() as u64 >= before);
                // Key order is reverse insert order: seqs count down to 0.
                let last = seen.len() as u64;
                assert!(seen
                    .iter()
                    .enumerate()
                    .all(|(i, &s)| s + 1 + i as u64 == last));
                if before == N {
                    return;
                }
            })
        };
        // Keys in reverse of insert order (each run spans what came
        // before it in key space), seqs in insert order.
        for seq in 0..N {
            runs.insert(&put_at(&(N - seq).to_be_bytes(), seq, 0));
            done.store(seq as usize + 1, AtomicOrdering::Release);
            if seq == N / 2 {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while merged.load(AtomicOrdering::Acquire) == 0
                    && std::time::Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
            }
        }
        assert!(tidier.join().expect("tidier") > 0, "the tidier merged runs");
        reader.join().expect("reader");
        let all: Vec<SeqNo> = runs.snapshot().iter_from(&[]).map(|e| e.seq).collect();
        assert_eq!(all, (0..N).rev().collect::<Vec<_>>());
    }

    proptest::proptest! {
        /// Scans and searches agree with an ordered map after
        /// any inserts (repeated `(key, seq)` pairs included), with limits
        /// small enough that tails, runs and merges all come into play.
        #[test]
        fn runs_read_like_an_ordered_map(
            ops in proptest::collection::vec(
                (proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..36),
                 0u64..10, 0u32..1000),
                1..300),
            tail in 1usize..6,
            max_run in 6usize..40,
            tidy_every in 0usize..60,
        ) {
            let runs = SortedRuns::with_limits(tail, max_run);
            let mut model = Model::new();
            let mut keys = vec![Vec::new()];
            for (i, (key, seq, offset)) in ops.iter().enumerate() {
                runs.insert(&put_at(key, *seq, *offset));
                model.insert((key.clone(), std::cmp::Reverse(*seq)), *offset);
                keys.push(key.clone());
                if tidy_every > 0 && i % tidy_every == 0 {
                    runs.tidy(|| true);
                }
                if i % 50 == 0 {
                    check(&runs, &model, &keys);
                }
            }
            check(&runs, &model, &keys);
            proptest::prop_assert_eq!(runs.inserted(), ops.len());
        }

        /// The head shortcut orders entries exactly as `entry_order` does,
        /// and an item's key (whole in its head, or kept when longer)
        /// compares and reads back as the key: keys around the 32-byte
        /// head, prefixes of each other, with zero bytes (which pad short
        /// heads) and equal heads.
        #[test]
        fn key_order_is_entry_order(
            a in proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..40),
            b_tail in proptest::collection::vec(proptest::prop_oneof![Just(0u8), Just(1u8), Just(255u8)], 0..40),
            cut in 0usize..40,
            sa in 0u64..3,
            sb in 0u64..3,
        ) {
            // b shares a prefix of a (often its whole head), then differs.
            let mut b = a[..cut.min(a.len())].to_vec();
            b.extend_from_slice(&b_tail);
            let (ia, ib) = (Item::new(&put_at(&a, sa, 0)), Item::new(&put_at(&b, sb, 0)));
            proptest::prop_assert_eq!(ia.cmp(&ib), entry_order(&a, sa, &b, sb));
            proptest::prop_assert_eq!(ib.cmp(&ia), entry_order(&b, sb, &a, sa));
            // An item gives its key back whole, and knows it from others.
            proptest::prop_assert_eq!(ia.key().to_vec(), a.clone());
            proptest::prop_assert_eq!(ia.has_key(&head_of(&b), &b), a == b);
            proptest::prop_assert!(ib.has_key(&head_of(&b), &b));
        }
    }

    /// Readers taking snapshots while the writer inserts see every version
    /// inserted before the snapshot, in order, each once.
    #[test]
    fn snapshots_hold_every_earlier_insert() {
        const N: u64 = 30_000;
        let runs = Arc::new(SortedRuns::default());
        let done = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (runs, done) = (runs.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut checked = 0;
                    loop {
                        let before = done.load(AtomicOrdering::Acquire) as u64;
                        let seen: Vec<SeqNo> =
                            runs.snapshot().iter_from(&[]).map(|e| e.seq).collect();
                        // Keys are the seqs' big-endian bytes: entry order
                        // is seq order, and each insert is a new key.
                        assert!(seen.windows(2).all(|w| w[0] < w[1]));
                        assert!(seen.len() as u64 >= before);
                        assert!(seen.iter().enumerate().all(|(i, &s)| s == i as u64));
                        checked += 1;
                        if before == N {
                            return checked;
                        }
                    }
                })
            })
            .collect();
        for seq in 0..N {
            runs.insert(&put_at(&seq.to_be_bytes(), seq, 0));
            done.store(seq as usize + 1, AtomicOrdering::Release);
        }
        for r in readers {
            assert!(r.join().expect("reader") > 0);
        }
    }
}
