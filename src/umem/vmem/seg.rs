//! Boundary tags: segment records ([`Seg`], reached through the handle [`S`]), the pool
//! that hands them out ([`SegPool`]), and the address hash of allocated segments
//! ([`struct@Hash`]). All of it lives in memory mapped with `os::map`, never in the managed
//! range (which may be ids, or memory nobody has mapped) and never in the global heap.
//!
//! # The unsafe contract of this module
//!
//! An [`S`] is created only by [`SegPool::get`], from a record inside a chunk the pool
//! has mapped. The pool unmaps its chunks only in [`SegPool::unmap_all`], which the
//! arena calls once, when it is dropped and no `S` is used any more. Every `S`
//! therefore points into live, writable, mapped memory for as long as it is used, and
//! [`S`]'s accessors read and write the record through raw pointers (never references),
//! so they are sound even for a stale handle. Which thread may use them is the arena's
//! business: every `S` is reached only from inside the arena's lock.

use core::mem::size_of;
use core::ptr::NonNull;

use super::VmemError;
use crate::os;

/// What a segment record describes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(super) enum Kind {
    /// The list head of an arena's address list (`seg0`); describes no range.
    Sentinel,
    /// A span marker: `[base, base + size)` belongs to the arena; the segments that
    /// follow it in the address list (up to the next span marker) tile it.
    Span,
    /// A free segment, on the free list of its size.
    Free,
    /// An allocated segment, in the address hash.
    Alloc,
}

/// A boundary tag. `anext`/`aprev` link every record of the arena (span markers and
/// segments) in address order within each span, around the sentinel. `lnext`/`lprev`
/// link a free segment into its free list; `lnext` alone chains an allocated segment
/// into its hash bucket.
#[repr(C)]
pub(super) struct Seg {
    base: usize,
    size: usize,
    anext: Option<S>,
    aprev: Option<S>,
    lnext: Option<S>,
    lprev: Option<S>,
    kind: Kind,
    /// Span markers only: the span came from the source (and goes back when all free).
    imported: bool,
}

/// A handle to a segment record (see the module's unsafe contract).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct S(NonNull<Seg>);

macro_rules! field {
    ($get:ident, $set:ident, $ty:ty) => {
        #[inline]
        pub(super) fn $get(self) -> $ty {
            // SAFETY: the module contract: `self.0` points into a live mapped chunk of
            // the pool; a raw read creates no reference.
            unsafe { (*self.0.as_ptr()).$get }
        }
        #[inline]
        pub(super) fn $set(self, value: $ty) {
            // SAFETY: as in the getter; a raw write creates no reference, and the
            // arena lock makes the caller the only thread touching the record.
            unsafe { (*self.0.as_ptr()).$get = value }
        }
    };
}

impl S {
    field!(base, set_base, usize);
    field!(size, set_size, usize);
    field!(anext, set_anext, Option<S>);
    field!(aprev, set_aprev, Option<S>);
    field!(lnext, set_lnext, Option<S>);
    field!(lprev, set_lprev, Option<S>);
    field!(kind, set_kind, Kind);
    field!(imported, set_imported, bool);

    /// One past the last unit of the segment (never overflows: ranges are checked when
    /// spans are added or imported).
    #[inline]
    pub(super) fn end(self) -> usize {
        self.base() + self.size()
    }

    /// The next record in address order (the list is circular, so there always is one).
    #[inline]
    pub(super) fn next(self) -> S {
        self.anext().unwrap_or(self)
    }

    /// The previous record in address order.
    #[inline]
    pub(super) fn prev(self) -> S {
        self.aprev().unwrap_or(self)
    }
}

/// The first bytes of each mapped chunk of records: the link to the next chunk.
#[repr(C)]
struct ChunkHeader {
    next: Option<NonNull<ChunkHeader>>,
}

/// Records per chunk are laid out after a header of this size (a record's alignment).
const HEADER_SPACE: usize = 64;

/// How many free records an arena keeps before every operation that may consume some:
/// an allocation splits one free segment into at most three (two new records), and an
/// import adds a span marker and its segment (two more). A free consumes none.
pub(super) const RESERVE: usize = 4;

/// The pool of segment records: a free list threaded through `lnext` of unused records,
/// refilled a page-sized chunk at a time from `os::map`. Records return to the pool, not
/// to the kernel; chunks are unmapped when the arena is dropped.
pub(super) struct SegPool {
    free: Option<S>,
    nfree: usize,
    /// Records handed out and not returned (including the arena's sentinel).
    in_use: usize,
    chunks: Option<NonNull<ChunkHeader>>,
    nchunks: usize,
}

impl SegPool {
    pub(super) const fn new() -> Self {
        Self { free: None, nfree: 0, in_use: 0, chunks: None, nchunks: 0 }
    }

    /// The size of one chunk.
    fn chunk_len() -> usize {
        os::page_size().max(HEADER_SPACE + 16 * size_of::<Seg>())
    }

    /// Makes sure that at least [`RESERVE`] records are free, mapping chunks as needed.
    /// On failure nothing has been handed out, so the caller can fail cleanly.
    pub(super) fn populate(&mut self) -> Result<(), VmemError> {
        while self.nfree < RESERVE {
            self.map_chunk()?;
        }
        Ok(())
    }

    #[cold]
    fn map_chunk(&mut self) -> Result<(), VmemError> {
        let len = Self::chunk_len();
        let chunk = os::map(len).map_err(|_| VmemError::NoRecords)?;
        let header = chunk.cast::<ChunkHeader>();
        // SAFETY: `chunk` is a fresh private mapping of `len` bytes, page-aligned, so the
        // header fits at its start and is suitably aligned.
        unsafe { header.as_ptr().write(ChunkHeader { next: self.chunks }) };
        self.chunks = Some(header);
        self.nchunks += 1;
        let count = (len - HEADER_SPACE) / size_of::<Seg>();
        for i in 0..count {
            // SAFETY: HEADER_SPACE + (i + 1) * size_of::<Seg>() <= len, so the record
            // lies inside the chunk; the offset keeps Seg's alignment (64 and the size
            // of Seg are multiples of it).
            let ptr = unsafe { chunk.as_ptr().add(HEADER_SPACE + i * size_of::<Seg>()) }.cast::<Seg>();
            // SAFETY: as above; the memory is ours and unused.
            unsafe { ptr.write(Self::blank()) };
            // The pointer is derived from a non-null mapping.
            let rec = S(NonNull::new(ptr).ok_or(VmemError::NoRecords)?);
            rec.set_lnext(self.free);
            self.free = Some(rec);
            self.nfree += 1;
        }
        Ok(())
    }

    fn blank() -> Seg {
        Seg { base: 0, size: 0, anext: None, aprev: None, lnext: None, lprev: None, kind: Kind::Free, imported: false }
    }

    /// Takes a record from the pool, initialised to `kind` over `[base, base + size)`
    /// with no links. `None` only if the pool is empty, which the reserve prevents on
    /// every path that calls this after [`populate`](Self::populate).
    #[inline]
    pub(super) fn get(&mut self, kind: Kind, base: usize, size: usize) -> Option<S> {
        let rec = self.free?;
        self.free = rec.lnext();
        self.nfree -= 1;
        self.in_use += 1;
        rec.set_base(base);
        rec.set_size(size);
        rec.set_kind(kind);
        rec.set_imported(false);
        rec.set_anext(None);
        rec.set_aprev(None);
        rec.set_lnext(None);
        rec.set_lprev(None);
        Some(rec)
    }

    /// Returns a record to the pool. The caller has unlinked it from every list.
    #[inline]
    pub(super) fn put(&mut self, rec: S) {
        rec.set_kind(Kind::Free);
        rec.set_anext(None);
        rec.set_aprev(None);
        rec.set_lprev(None);
        rec.set_lnext(self.free);
        self.free = Some(rec);
        self.nfree += 1;
        self.in_use -= 1;
    }

    pub(super) fn nfree(&self) -> usize {
        self.nfree
    }

    pub(super) fn in_use(&self) -> usize {
        self.in_use
    }

    /// The length of the free-record list, counted by walking it (for `assert_valid`).
    pub(super) fn count_free_list(&self) -> usize {
        let mut n = 0;
        let mut cur = self.free;
        while let Some(rec) = cur {
            n += 1;
            assert!(n <= self.nfree, "vmem: the record pool's free list is longer than its count");
            cur = rec.lnext();
        }
        n
    }

    /// Unmaps every chunk. Every handle taken from this pool is dead afterwards.
    ///
    /// # Safety
    /// 1. No [`S`] from this pool is used after the call.
    pub(super) unsafe fn unmap_all(&mut self) {
        let len = Self::chunk_len();
        let mut cur = self.chunks.take();
        while let Some(header) = cur {
            // SAFETY: the header was written by `map_chunk` and its chunk is still mapped.
            cur = unsafe { header.as_ptr().read() }.next;
            // SAFETY: the chunk was mapped by `map_chunk` with this length; (1) nothing
            // refers to its records any more.
            unsafe { os::unmap(header.cast(), len) };
        }
        self.free = None;
        self.nfree = 0;
        self.nchunks = 0;
    }
}

/// The initial number of hash buckets (one page of pointers on 64-bit machines).
const HASH_INITIAL_BITS: u32 = 9;
/// The table grows (by 4x) when it holds more than this many segments per bucket.
const HASH_MAX_LOAD: usize = 2;

/// The address hash of allocated segments: buckets of `Option<S>` in mapped memory,
/// chained through `lnext`. Grows by a factor of four when the load exceeds
/// [`HASH_MAX_LOAD`]; if the kernel refuses memory for a bigger table the old one stays
/// (longer chains, still correct). It never shrinks.
pub(super) struct Hash {
    buckets: NonNull<Option<S>>,
    bits: u32,
    count: usize,
    /// log2 of the quantum: addresses are divided by it before hashing.
    shift: u32,
}

impl Hash {
    pub(super) fn new(quantum: usize) -> Result<Self, VmemError> {
        let buckets = Self::map_table(HASH_INITIAL_BITS)?;
        Ok(Self { buckets, bits: HASH_INITIAL_BITS, count: 0, shift: quantum.trailing_zeros() })
    }

    fn table_len(bits: u32) -> usize {
        size_of::<Option<S>>() << bits
    }

    fn map_table(bits: u32) -> Result<NonNull<Option<S>>, VmemError> {
        // Zeroed memory is a table of `None`s (Option<NonNull> has the null niche).
        Ok(os::map(Self::table_len(bits)).map_err(|_| VmemError::NoRecords)?.cast())
    }

    /// The number of buckets.
    pub(super) fn buckets(&self) -> usize {
        1 << self.bits
    }

    /// The number of segments in the table.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    #[inline]
    fn index(&self, addr: usize) -> usize {
        // Fibonacci hashing of the quantum number: the top `bits` bits of the product.
        let key = (addr >> self.shift) as u64;
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    #[inline]
    fn bucket(&self, i: usize) -> *mut Option<S> {
        debug_assert!(i < self.buckets());
        // SAFETY: `i` < the number of buckets, so the slot lies inside the table.
        unsafe { self.buckets.as_ptr().add(i) }
    }

    #[inline]
    fn head(&self, i: usize) -> Option<S> {
        // SAFETY: `bucket` returns a slot of our live mapped table; only the arena's lock
        // holder touches it.
        unsafe { self.bucket(i).read() }
    }

    #[inline]
    fn set_head(&mut self, i: usize, value: Option<S>) {
        // SAFETY: as in `head`.
        unsafe { self.bucket(i).write(value) }
    }

    /// Inserts an allocated segment.
    #[inline]
    pub(super) fn insert(&mut self, seg: S) {
        let i = self.index(seg.base());
        seg.set_lnext(self.head(i));
        self.set_head(i, Some(seg));
        self.count += 1;
    }

    /// The allocated segment that starts at `addr`, if any.
    #[inline]
    pub(super) fn find(&self, addr: usize) -> Option<S> {
        let mut cur = self.head(self.index(addr));
        while let Some(seg) = cur {
            if seg.base() == addr {
                return Some(seg);
            }
            cur = seg.lnext();
        }
        None
    }

    /// Removes `seg`, which is in the table.
    #[inline]
    pub(super) fn remove(&mut self, seg: S) {
        let i = self.index(seg.base());
        let mut prev: Option<S> = None;
        let mut cur = self.head(i);
        while let Some(s) = cur {
            if s == seg {
                match prev {
                    None => self.set_head(i, s.lnext()),
                    Some(p) => p.set_lnext(s.lnext()),
                }
                s.set_lnext(None);
                self.count -= 1;
                return;
            }
            prev = cur;
            cur = s.lnext();
        }
        debug_assert!(false, "vmem: hash remove of a segment not in the table");
    }

    /// Grows the table if the load is above the bound. Best effort: if the kernel refuses
    /// memory the old table stays in use.
    #[inline]
    pub(super) fn maybe_grow(&mut self) {
        if self.count > HASH_MAX_LOAD << self.bits && self.bits + 2 < usize::BITS {
            self.grow();
        }
    }

    #[cold]
    fn grow(&mut self) {
        let new_bits = self.bits + 2;
        let Ok(table) = Self::map_table(new_bits) else { return };
        let old_table = self.buckets;
        let old_bits = self.bits;
        self.buckets = table;
        self.bits = new_bits;
        for i in 0..1usize << old_bits {
            // SAFETY: `i` is a bucket index of the old table, still mapped.
            let mut cur = unsafe { old_table.as_ptr().add(i).read() };
            while let Some(seg) = cur {
                cur = seg.lnext();
                let j = self.index(seg.base());
                seg.set_lnext(self.head(j));
                self.set_head(j, Some(seg));
            }
        }
        // SAFETY: the old table was mapped by `map_table(old_bits)`; nothing refers to it
        // any more (every segment was moved to the new table).
        unsafe { os::unmap(old_table.cast(), Self::table_len(old_bits)) };
    }

    /// Calls `f` with every segment in the table and its bucket index, and whether that
    /// index is the one its base hashes to (for `assert_valid`).
    pub(super) fn for_each(&self, mut f: impl FnMut(S, bool)) {
        let mut seen = 0usize;
        for i in 0..self.buckets() {
            let mut cur = self.head(i);
            while let Some(seg) = cur {
                seen += 1;
                assert!(seen <= self.count, "vmem: the hash holds more segments than its count (a cycle?)");
                f(seg, self.index(seg.base()) == i);
                cur = seg.lnext();
            }
        }
    }

    /// Unmaps the table.
    ///
    /// # Safety
    /// 1. The table is not used after the call.
    pub(super) unsafe fn unmap(&mut self) {
        // SAFETY: mapped by `map_table(self.bits)`; (1) not used again.
        unsafe { os::unmap(self.buckets.cast(), Self::table_len(self.bits)) };
    }
}
