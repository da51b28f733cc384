//! [`Arena`]: the state of one vmem arena and its algorithms (segment lists, instant-
//! and best-fit search, splitting, coalescing, spans, import and release). Everything
//! here runs under the arena's lock; the module doc of [`super`] states the invariants
//! and [`Arena::check`] re-derives them.

use super::seg::{Hash, Kind, S, SegPool};
use super::{Policy, Source, VmemError};

/// One free list per power of two: list `i` holds free segments of size in `[2^i, 2^(i+1))`.
const FREELISTS: usize = usize::BITS as usize;

/// The index of the highest set bit of `n` (> 0): the free list a segment of size `n`
/// belongs on. (The mask is the identity; it lets the compiler drop the bounds checks,
/// and their formatting panics, from the free-list indexing on the alloc/free paths.)
#[inline]
fn highbit(n: usize) -> usize {
    debug_assert!(n > 0);
    (usize::BITS - 1 - n.leading_zeros()) as usize & (FREELISTS - 1)
}

/// The index of the lowest set bit of `n` (> 0), masked as in [`highbit`].
#[inline]
fn lowbit(n: usize) -> usize {
    n.trailing_zeros() as usize & (FREELISTS - 1)
}

/// Checked placement constraints, in arena units (see `Constraints` for the public form).
#[derive(Clone, Copy, Debug)]
pub(super) struct Fit {
    /// A power of two, at least the quantum.
    pub(super) align: usize,
    /// `< align`, a multiple of the quantum.
    pub(super) phase: usize,
    /// 0, or a power of two with `align <= nocross` and `size <= nocross`.
    pub(super) nocross: usize,
    /// Lowest acceptable address.
    pub(super) min: usize,
    /// One past the highest acceptable end.
    pub(super) max: usize,
}

impl Fit {
    /// No constraint beyond the quantum.
    pub(super) fn simple(quantum: usize) -> Self {
        Self { align: quantum, phase: 0, nocross: 0, min: 0, max: usize::MAX }
    }

    fn is_simple(&self, quantum: usize) -> bool {
        self.align == quantum && self.phase == 0 && self.nocross == 0 && self.min == 0 && self.max == usize::MAX
    }

    /// Whether importing can help (an imported span lands anywhere in the source, so only
    /// alignment and phase can be arranged inside it).
    fn importable(&self) -> bool {
        self.nocross == 0 && self.min == 0 && self.max == usize::MAX
    }

    /// The lowest address in `[base, end)` where `size` units fit the constraints.
    #[inline]
    fn place(&self, base: usize, end: usize, size: usize) -> Option<usize> {
        let lo = base.max(self.min);
        let hi = end.min(self.max);
        if lo >= hi || hi - lo < size {
            return None;
        }
        let mut addr = align_phase(lo, self.align, self.phase)?;
        if self.nocross != 0 {
            let last = addr.checked_add(size - 1)?;
            if (addr ^ last) & !(self.nocross - 1) != 0 {
                // Crosses a boundary: try from the next one.
                let boundary = (addr | (self.nocross - 1)).checked_add(1)?;
                addr = align_phase(boundary, self.align, self.phase)?;
                let last = addr.checked_add(size - 1)?;
                if (addr ^ last) & !(self.nocross - 1) != 0 {
                    return None;
                }
            }
        }
        (addr.checked_add(size)? <= hi).then_some(addr)
    }
}

/// The smallest `a >= x` with `a % align == phase` (`align` a power of two).
#[inline]
fn align_phase(x: usize, align: usize, phase: usize) -> Option<usize> {
    x.checked_add(phase.wrapping_sub(x) & (align - 1))
}

/// Counters kept under the arena lock.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Counters {
    pub(super) allocs: u64,
    pub(super) frees: u64,
    pub(super) failures: u64,
    pub(super) imports: u64,
    pub(super) releases: u64,
}

/// The state of an arena (see the module doc of `vmem` for the invariants).
pub(super) struct Arena {
    quantum: usize,
    /// The sentinel of the circular address list (a record from `pool`).
    seg0: S,
    freelist: [Option<S>; FREELISTS],
    /// Bit `i` is set iff `freelist[i]` is non-empty.
    freemap: usize,
    pub(super) hash: Hash,
    pub(super) pool: SegPool,
    /// Units in spans.
    pub(super) total: usize,
    /// Units in free segments.
    pub(super) free: usize,
    /// Units in allocated segments.
    pub(super) in_use: usize,
    /// Units in imported spans.
    pub(super) imported: usize,
    pub(super) spans: usize,
    pub(super) counters: Counters,
}

// SAFETY: the arena owns its record chunks and hash table outright (every `S` it holds
// points into them and nobody else has one), so moving it to another thread moves that
// ownership with it; it has no thread affinity.
unsafe impl Send for Arena {}

impl Arena {
    pub(super) fn new(quantum: usize) -> Result<Self, VmemError> {
        let mut pool = SegPool::new();
        pool.populate()?;
        let seg0 = pool.get(Kind::Sentinel, 0, 0).ok_or(VmemError::NoRecords)?;
        seg0.set_anext(Some(seg0));
        seg0.set_aprev(Some(seg0));
        let hash = match Hash::new(quantum) {
            Ok(hash) => hash,
            Err(err) => {
                // SAFETY: the only handle, `seg0`, dies here with the pool.
                unsafe { pool.unmap_all() };
                return Err(err);
            }
        };
        Ok(Self {
            quantum,
            seg0,
            freelist: [None; FREELISTS],
            freemap: 0,
            hash,
            pool,
            total: 0,
            free: 0,
            in_use: 0,
            imported: 0,
            spans: 0,
            counters: Counters::default(),
        })
    }

    // --- lists ---

    /// Links `seg` into the address list after `prev`.
    fn link_after(prev: S, seg: S) {
        let next = prev.next();
        seg.set_aprev(Some(prev));
        seg.set_anext(Some(next));
        prev.set_anext(Some(seg));
        next.set_aprev(Some(seg));
    }

    /// Unlinks `seg` from the address list.
    fn unlink(seg: S) {
        let (prev, next) = (seg.prev(), seg.next());
        prev.set_anext(Some(next));
        next.set_aprev(Some(prev));
    }

    /// Puts a free segment on the free list of its size.
    fn freelist_insert(&mut self, seg: S) {
        let i = highbit(seg.size());
        let head = self.freelist[i];
        seg.set_lprev(None);
        seg.set_lnext(head);
        if let Some(head) = head {
            head.set_lprev(Some(seg));
        }
        self.freelist[i] = Some(seg);
        self.freemap |= 1 << i;
    }

    /// Takes a free segment off its free list (call before changing its size).
    fn freelist_remove(&mut self, seg: S) {
        let i = highbit(seg.size());
        match seg.lprev() {
            None => self.freelist[i] = seg.lnext(),
            Some(prev) => prev.set_lnext(seg.lnext()),
        }
        if let Some(next) = seg.lnext() {
            next.set_lprev(seg.lprev());
        }
        seg.set_lnext(None);
        seg.set_lprev(None);
        if self.freelist[i].is_none() {
            self.freemap &= !(1 << i);
        }
    }

    // --- spans ---

    /// Adds the span `[base, base + size)` (checked by the caller: aligned, non-empty,
    /// not overflowing, not overlapping) as one free segment. Needs two records.
    fn add_span(&mut self, base: usize, size: usize, imported: bool) -> Result<S, VmemError> {
        let span = self.pool.get(Kind::Span, base, size).ok_or(VmemError::NoRecords)?;
        let Some(seg) = self.pool.get(Kind::Free, base, size) else {
            self.pool.put(span);
            return Err(VmemError::NoRecords);
        };
        span.set_imported(imported);
        // Spans go at the end of the address list (sorted within spans, not across them).
        let last = self.seg0.prev();
        Self::link_after(last, span);
        Self::link_after(span, seg);
        self.freelist_insert(seg);
        self.total += size;
        self.free += size;
        self.spans += 1;
        if imported {
            self.imported += size;
        }
        Ok(seg)
    }

    /// Whether `[base, end)` overlaps a span of the arena (walks the address list).
    fn overlaps(&self, base: usize, end: usize) -> bool {
        let mut cur = self.seg0.next();
        while cur != self.seg0 {
            if cur.kind() == Kind::Span && cur.base() < end && base < cur.end() {
                return true;
            }
            cur = cur.next();
        }
        false
    }

    /// `Vmem::add`: a new span the arena owns for good.
    pub(super) fn add(&mut self, base: usize, size: usize) -> Result<(), VmemError> {
        let end = base.checked_add(size).ok_or(VmemError::Overflow)?;
        if self.overlaps(base, end) {
            return Err(VmemError::Overlap);
        }
        self.pool.populate()?;
        self.add_span(base, size, false).map(|_| ())
    }

    // --- allocation ---

    /// Allocates `size` units (a non-zero multiple of the quantum) satisfying `fit`,
    /// importing from `source` if needed. On error the arena is unchanged (apart from
    /// records added to its pool, and an imported span left free in it). The caller
    /// counts the outcome with [`count`](Self::count).
    pub(super) fn alloc(
        &mut self,
        size: usize,
        fit: &Fit,
        policy: Policy,
        source: Option<&dyn Source>,
    ) -> Result<usize, VmemError> {
        self.alloc_inner(size, fit, policy, source)
    }

    /// Counts the outcome of an allocation.
    #[inline]
    pub(super) fn count(&mut self, result: &Result<usize, VmemError>) {
        match result {
            Ok(_) => self.counters.allocs += 1,
            Err(_) => self.counters.failures += 1,
        }
    }

    fn alloc_inner(
        &mut self,
        size: usize,
        fit: &Fit,
        policy: Policy,
        source: Option<&dyn Source>,
    ) -> Result<usize, VmemError> {
        self.pool.populate()?;
        if policy == Policy::InstantFit
            && fit.is_simple(self.quantum)
            && let Some(seg) = self.instant_fit(size)
        {
            return self.carve(seg, seg.base(), size);
        }
        if let Some((seg, addr)) = self.search(size, fit, policy) {
            return self.carve(seg, addr, size);
        }
        match source {
            Some(source) if fit.importable() => {
                let seg = self.import(source, size, fit)?;
                let addr = fit.place(seg.base(), seg.end(), size).ok_or(VmemError::Exhausted)?;
                self.carve(seg, addr, size)
            }
            _ => Err(VmemError::Exhausted),
        }
    }

    /// Instant fit: the head of the first non-empty list whose every segment is at least
    /// `size` (constant time: a mask and a count of trailing zeros).
    #[inline]
    fn instant_fit(&self, size: usize) -> Option<S> {
        let first = if size.is_power_of_two() { highbit(size) } else { highbit(size) + 1 };
        if first >= FREELISTS {
            return None;
        }
        let candidates = self.freemap & (usize::MAX << first);
        if candidates == 0 {
            return None;
        }
        self.freelist[lowbit(candidates)]
    }

    /// A search of the free lists from the one `size` belongs on upwards: first fit
    /// (instant-fit's fallback) or best fit (the smallest segment that fits, found in the
    /// lowest list holding any fit, since every segment of a higher list is larger; an
    /// exact fit ends the search at once). Best fit walks whole lists: O(free segments
    /// in one size class) per call.
    fn search(&self, size: usize, fit: &Fit, policy: Policy) -> Option<(S, usize)> {
        let mut lists = self.freemap & (usize::MAX << highbit(size));
        while lists != 0 {
            let i = lowbit(lists);
            lists &= lists - 1;
            let mut best: Option<(S, usize)> = None;
            let mut cur = self.freelist[i];
            while let Some(seg) = cur {
                if let Some(addr) = fit.place(seg.base(), seg.end(), size) {
                    // An exact fit cannot be beaten: best fit stops there too.
                    if policy == Policy::InstantFit || seg.size() == size {
                        return Some((seg, addr));
                    }
                    if best.is_none_or(|(b, _)| seg.size() < b.size()) {
                        best = Some((seg, addr));
                    }
                }
                cur = seg.lnext();
            }
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// Allocates `[addr, addr + size)` out of the free segment `seg`, splitting off the
    /// free remainders before and after. Takes the records it needs before changing
    /// anything, so a failure leaves the arena as it was.
    fn carve(&mut self, seg: S, addr: usize, size: usize) -> Result<usize, VmemError> {
        debug_assert!(seg.kind() == Kind::Free && seg.base() <= addr && addr + size <= seg.end());
        let (base, end) = (seg.base(), seg.end());
        let front = if addr > base { Some(self.pool.get(Kind::Free, base, addr - base)) } else { None };
        let back =
            if addr + size < end { Some(self.pool.get(Kind::Free, addr + size, end - addr - size)) } else { None };
        if matches!(front, Some(None)) || matches!(back, Some(None)) {
            for rec in [front, back].into_iter().flatten().flatten() {
                self.pool.put(rec);
            }
            return Err(VmemError::NoRecords);
        }
        self.freelist_remove(seg);
        if let Some(Some(front)) = front {
            Self::link_after(seg.prev(), front);
            self.freelist_insert(front);
        }
        if let Some(Some(back)) = back {
            Self::link_after(seg, back);
            self.freelist_insert(back);
        }
        seg.set_base(addr);
        seg.set_size(size);
        seg.set_kind(Kind::Alloc);
        self.hash.insert(seg);
        self.hash.maybe_grow();
        self.free -= size;
        self.in_use += size;
        Ok(addr)
    }

    /// Imports a span big enough for `size` units under `fit` (alignment and phase) from
    /// `source`, and returns its free segment.
    #[cold]
    fn import(&mut self, source: &dyn Source, size: usize, fit: &Fit) -> Result<S, VmemError> {
        let slack = fit.align.saturating_sub(self.quantum);
        let granule = self.quantum.max(source.granularity());
        let need = size.checked_add(slack).ok_or(VmemError::Exhausted)?;
        let span_size = need.checked_next_multiple_of(granule).ok_or(VmemError::Exhausted)?;
        let base = source.import(span_size, self.quantum)?;
        let bad = base % self.quantum != 0
            || base.checked_add(span_size).is_none()
            || (cfg!(debug_assertions) && self.overlaps(base, base.saturating_add(span_size)));
        if bad {
            // SAFETY: (1) the span is the one `import` just returned; (2) unused.
            unsafe { source.release(base, span_size) };
            return Err(VmemError::BadSource);
        }
        match self.add_span(base, span_size, true) {
            Ok(seg) => {
                self.counters.imports += 1;
                Ok(seg)
            }
            Err(err) => {
                // SAFETY: as above: just imported, never handed out.
                unsafe { source.release(base, span_size) };
                Err(err)
            }
        }
    }

    // --- free ---

    /// Frees the allocated segment `[addr, addr + size)`: coalesces it with free
    /// neighbours and, if that frees an imported span wholly, returns the span to
    /// `source`. Needs no record, so it cannot fail for want of memory.
    pub(super) fn free(
        &mut self,
        addr: usize,
        size: usize,
        source: Option<&dyn Source>,
        user: bool,
    ) -> Result<(), VmemError> {
        let seg = self.hash.find(addr).ok_or(VmemError::NotAllocated)?;
        if seg.size() != size {
            return Err(VmemError::WrongSize);
        }
        self.hash.remove(seg);
        seg.set_kind(Kind::Free);
        self.in_use -= size;
        self.free += size;
        if user {
            self.counters.frees += 1;
        }
        let mut seg = seg;
        let next = seg.next();
        if next.kind() == Kind::Free {
            self.freelist_remove(next);
            seg.set_size(seg.size() + next.size());
            Self::unlink(next);
            self.pool.put(next);
        }
        let prev = seg.prev();
        if prev.kind() == Kind::Free {
            self.freelist_remove(prev);
            prev.set_size(prev.size() + seg.size());
            Self::unlink(seg);
            self.pool.put(seg);
            seg = prev;
        }
        let span = seg.prev();
        if let Some(source) = source
            && span.kind() == Kind::Span
            && span.imported()
            && span.size() == seg.size()
        {
            let (base, size) = (span.base(), span.size());
            Self::unlink(seg);
            Self::unlink(span);
            self.pool.put(seg);
            self.pool.put(span);
            self.total -= size;
            self.free -= size;
            self.imported -= size;
            self.spans -= 1;
            self.counters.releases += 1;
            // SAFETY: (1) an imported span marker records exactly what `import` returned,
            // and it is released only here or in teardown, after which the marker is
            // gone; (2) every segment of it is free, so no caller holds any of it.
            unsafe { source.release(base, size) };
        } else {
            self.freelist_insert(seg);
        }
        Ok(())
    }

    /// Splits the allocated segment `[addr, addr + size)` into two allocated segments,
    /// `[addr, addr + head)` and `[addr + head, addr + size)` (`0 < head < size`, checked
    /// by the caller, as the quantum multiples). Needs one record, taken before anything
    /// changes, so a failure leaves the arena as it was. The units stay allocated: the
    /// counts do not move.
    pub(super) fn split(&mut self, addr: usize, size: usize, head: usize) -> Result<(), VmemError> {
        debug_assert!(head > 0 && head < size);
        let seg = self.hash.find(addr).ok_or(VmemError::NotAllocated)?;
        if seg.size() != size {
            return Err(VmemError::WrongSize);
        }
        self.pool.populate()?;
        let back = self.pool.get(Kind::Alloc, addr + head, size - head).ok_or(VmemError::NoRecords)?;
        // The front keeps its record and its hash entry (keyed by its unchanged base).
        seg.set_size(head);
        Self::link_after(seg, back);
        self.hash.insert(back);
        self.hash.maybe_grow();
        Ok(())
    }

    /// Joins the allocated segments `[addr, addr + size)` and `[at, at + next)`
    /// (`at = addr + size`), which must lie next to each other in one span, into one
    /// allocated segment; the back's record goes back to the pool. Needs nothing new, so
    /// it cannot fail for want of memory; on error nothing changed. The counts do not
    /// move.
    pub(super) fn join(&mut self, addr: usize, size: usize, at: usize, next: usize) -> Result<(), VmemError> {
        let front = self.hash.find(addr).ok_or(VmemError::NotAllocated)?;
        let back = self.hash.find(at).ok_or(VmemError::NotAllocated)?;
        if front.size() != size || back.size() != next {
            return Err(VmemError::WrongSize);
        }
        // Next in the segment list: no span marker between them (segments never cross
        // a span's end, so an allocated segment right after another in the list is in
        // the same span).
        if front.next() != back {
            return Err(VmemError::NotAdjacent);
        }
        self.hash.remove(back);
        Self::unlink(back);
        self.pool.put(back);
        front.set_size(size + next);
        Ok(())
    }

    /// Whether `[addr, addr + size)` is an allocated segment (a cheap hash lookup).
    pub(super) fn is_allocated(&self, addr: usize, size: usize) -> Result<(), VmemError> {
        match self.hash.find(addr) {
            None => Err(VmemError::NotAllocated),
            Some(seg) if seg.size() != size => Err(VmemError::WrongSize),
            Some(_) => Ok(()),
        }
    }

    /// Returns every imported span to `source` and unmaps the records and the hash.
    pub(super) fn teardown(&mut self, source: Option<&dyn Source>) {
        if let Some(source) = source {
            let mut cur = self.seg0.next();
            while cur != self.seg0 {
                if cur.kind() == Kind::Span && cur.imported() {
                    // SAFETY: (1) as in `free`: the marker records an import not yet
                    // released; (2) the arena is being dropped, so its allocations die
                    // with it (documented on `Vmem`'s Drop).
                    unsafe { source.release(cur.base(), cur.size()) };
                }
                cur = cur.next();
            }
        }
        // SAFETY: the arena is being dropped; none of its handles is used after this.
        unsafe {
            self.hash.unmap();
            self.pool.unmap_all();
        }
    }

    // --- the executable invariant ---

    /// Re-derives every invariant of the module doc; panics with the first one broken.
    /// The caller checks its quantum caches with [`is_allocated`](Self::is_allocated).
    pub(super) fn check(&self) {
        let q = self.quantum;
        let (mut total, mut free, mut in_use, mut imported) = (0usize, 0usize, 0usize, 0usize);
        let (mut nfree_segs, mut nalloc_segs, mut nspans, mut nrecords) = (0usize, 0usize, 0usize, 1usize);
        let mut span: Option<S> = None;
        let mut cursor = 0usize; // where the next segment of `span` must start
        let mut prev = self.seg0;
        let mut cur = self.seg0.next();
        let limit = self.pool.in_use();
        loop {
            assert!(cur.aprev() == Some(prev), "vmem check: address list back link broken");
            if cur == self.seg0 || cur.kind() == Kind::Span {
                if let Some(s) = span {
                    assert!(
                        cursor == s.end(),
                        "vmem check: span [{:#x}, {:#x}) not tiled by its segments",
                        s.base(),
                        s.end()
                    );
                }
                if cur == self.seg0 {
                    break;
                }
                assert!(
                    cur.size() > 0 && cur.base().is_multiple_of(q) && cur.size().is_multiple_of(q),
                    "vmem check: bad span"
                );
                nspans += 1;
                total += cur.size();
                if cur.imported() {
                    imported += cur.size();
                }
                span = Some(cur);
                cursor = cur.base();
            } else {
                let s = span.expect("vmem check: a segment before any span marker");
                assert!(cur.base() == cursor, "vmem check: segment at {:#x}, expected {:#x}", cur.base(), cursor);
                assert!(
                    cur.size() > 0 && cur.size().is_multiple_of(q),
                    "vmem check: bad segment size {:#x}",
                    cur.size()
                );
                assert!(cur.end() <= s.end(), "vmem check: segment runs past its span");
                cursor = cur.end();
                match cur.kind() {
                    Kind::Free => {
                        assert!(
                            prev.kind() != Kind::Free,
                            "vmem check: two adjacent free segments at {:#x}",
                            cur.base()
                        );
                        nfree_segs += 1;
                        free += cur.size();
                    }
                    Kind::Alloc => {
                        nalloc_segs += 1;
                        in_use += cur.size();
                        assert!(self.hash.find(cur.base()) == Some(cur), "vmem check: allocated segment not hashed");
                    }
                    kind => panic!("vmem check: unexpected record kind {kind:?} in a span"),
                }
            }
            nrecords += 1;
            assert!(nrecords <= limit, "vmem check: the address list is longer than the records in use");
            prev = cur;
            cur = cur.next();
        }
        assert!(
            nrecords == self.pool.in_use(),
            "vmem check: {} records in use, {} linked",
            self.pool.in_use(),
            nrecords
        );
        assert!(self.pool.count_free_list() == self.pool.nfree(), "vmem check: pool free count wrong");

        // Free lists: members are free segments of the list's size class, doubly linked,
        // and all free segments are members (count equality, no member twice).
        let mut listed = 0usize;
        for (i, head) in self.freelist.iter().enumerate() {
            assert!((self.freemap >> i) & 1 == usize::from(head.is_some()), "vmem check: freemap bit {i} wrong");
            let mut lprev: Option<S> = None;
            let mut cur = *head;
            while let Some(seg) = cur {
                listed += 1;
                assert!(listed <= nfree_segs, "vmem check: the free lists hold more than the free segments");
                assert!(seg.kind() == Kind::Free, "vmem check: a non-free segment on free list {i}");
                assert!(highbit(seg.size()) == i, "vmem check: segment of size {:#x} on list {i}", seg.size());
                assert!(seg.lprev() == lprev, "vmem check: free list {i} back link broken");
                lprev = cur;
                cur = seg.lnext();
            }
        }
        assert!(listed == nfree_segs, "vmem check: {nfree_segs} free segments, {listed} on free lists");

        // Hash: exactly the allocated segments, each in its own bucket.
        let mut hashed = 0usize;
        self.hash.for_each(|seg, right_bucket| {
            hashed += 1;
            assert!(seg.kind() == Kind::Alloc, "vmem check: a non-allocated segment in the hash");
            assert!(right_bucket, "vmem check: segment at {:#x} in the wrong bucket", seg.base());
        });
        assert!(hashed == nalloc_segs && self.hash.count() == nalloc_segs, "vmem check: hash count wrong");

        assert!(total == self.total, "vmem check: total {} != {}", self.total, total);
        assert!(free == self.free, "vmem check: free {} != {}", self.free, free);
        assert!(in_use == self.in_use, "vmem check: in use {} != {}", self.in_use, in_use);
        assert!(imported == self.imported, "vmem check: imported {} != {}", self.imported, imported);
        assert!(free + in_use == total, "vmem check: free + in use != total");
        assert!(nspans == self.spans, "vmem check: span count");
    }

    /// Records in use, not counting the sentinel.
    pub(super) fn segments(&self) -> usize {
        self.pool.in_use() - 1
    }
}
