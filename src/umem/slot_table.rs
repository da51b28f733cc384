//! The table through which the global heap publishes each size class's per-CPU slots to
//! its hit paths.
//!
//! `malloc`'s and `free`'s magazine hits must reach the current CPU's slot of a class
//! without asking whether the class's cache exists, which mode it runs in, or where its
//! layer lives: one load of a table entry gives the slots' base (a null entry sends the
//! caller out of line). A [`SlotTable`] holds those entries three ways, each published
//! once per class by the thread that makes the class's cache:
//!
//! - **by tag** (`by_tag[class + 1]`): what a run's pages copy into their *tag word* when
//!   the run is taken ([`word_for_run`]), so that `free` finds the slots from the pointer;
//! - **by size** (`by8[size.div_ceil(8)]`, `by16[size.div_ceil(16)]`): what `malloc` and
//!   `GlobalAlloc::alloc` load from the request size, one load instead of the class
//!   lookup and then the tag's entry;
//! - the **slot count** `ncpus`, shared by every class's layer (one slot per possible CPU).
//!
//! # Protocol
//!
//! 1. Publication ([`SlotTable::publish`]) runs under the heap's set-up lock, so there is
//!    one publisher at a time. It stores `ncpus` if it is not set yet (Relaxed), and then
//!    the base into the tag's entry and into each size entry of the class (Release). The
//!    base names slots the publisher initialised before the call.
//! 2. A hit path loads an entry with Acquire ([`SlotTable::slots_at`]); if it is
//!    non-null, it reads `ncpus` Relaxed: the Acquire load synchronised with the Release
//!    store of that entry, which the store of `ncpus` preceded, so the count is the one
//!    published, and so is everything the slots hold.
//! 3. A run taken with tag `t` copies `by_tag[t]` into its pages' tag words, loaded with
//!    Acquire ([`word_for_run`]) under the region manager's lock, before the run's objects
//!    are handed out. `free` reads a page's word Relaxed and then `ncpus` Relaxed
//!    ([`SlotTable::ncpus`]): the caller's contract (it holds a block it learnt of after
//!    the block was handed out) orders the run's Acquire load before its reads.
//!
//! # Invariants
//!
//! - An entry is null or a base published with the table's one `ncpus`; once non-null it
//!   never changes (the global heap never destroys a class's cache), and every size entry
//!   of a class equals the class's tag entry once both are set.
//! - `ncpus` is 0 until the first publication, then never changes.
//! - A publication whose slot count differs from the table's changes nothing.
//!
//! The loom model `loom-tests/tests/slot_table.rs` checks points 2 and 3 against a
//! publisher, with the slots' memory an `UnsafeCell` that loom checks for races. Under
//! loom the table's atomics are loom's (the global heap, whose static table this is, is
//! not built there).

use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// A class's published slots: the base of its layer's slot array and the slot count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The base of the slot array (non-null).
    pub base: *mut u8,
    /// How many slots the array has.
    pub ncpus: usize,
}

/// Per-class slot bases by page tag (`TAGS` entries) and by request size (`BY8` and
/// `BY16` entries), plus the shared slot count (module documentation).
pub struct SlotTable<const TAGS: usize, const BY8: usize, const BY16: usize> {
    /// The slot count of every published layer; 0 before the first publication.
    ncpus: AtomicUsize,
    /// Slot bases by page tag (class + 1); what runs copy into their tag words.
    by_tag: [AtomicPtr<u8>; TAGS],
    /// Slot bases by `size.div_ceil(8)`, for requests aligned to at most 8.
    by8: [AtomicPtr<u8>; BY8],
    /// Slot bases by `size.div_ceil(16)`, for requests aligned to at most 16.
    by16: [AtomicPtr<u8>; BY16],
}

impl<const TAGS: usize, const BY8: usize, const BY16: usize> SlotTable<TAGS, BY8, BY16> {
    /// An empty table (every entry null): usable in a static.
    #[cfg(not(scalemem_loom))]
    pub const fn new() -> Self {
        Self {
            ncpus: AtomicUsize::new(0),
            by_tag: [const { AtomicPtr::new(core::ptr::null_mut()) }; TAGS],
            by8: [const { AtomicPtr::new(core::ptr::null_mut()) }; BY8],
            by16: [const { AtomicPtr::new(core::ptr::null_mut()) }; BY16],
        }
    }

    /// An empty table (every entry null); loom's atomics have no `const` constructor.
    #[cfg(scalemem_loom)]
    pub fn new() -> Self {
        let null = |_| AtomicPtr::new(core::ptr::null_mut());
        Self {
            ncpus: AtomicUsize::new(0),
            by_tag: core::array::from_fn(null),
            by8: core::array::from_fn(null),
            by16: core::array::from_fn(null),
        }
    }

    /// Publishes `base`, the slots of the class whose page tag is `tag`, with slot count
    /// `ncpus`: under the tag, and under every size entry `i` for which `in_class8(i)`
    /// (of `by8`) or `in_class16(i)` (of `by16`) holds. Returns false, publishing
    /// nothing, if `tag` is out of range, `base` is null, `ncpus` is 0 or differs from
    /// the count already published.
    ///
    /// The caller holds the lock that serialises publications, has initialised the slots
    /// at `base` and keeps them alive (and unchanged but by the hit paths' own protocol)
    /// for as long as the table is reachable.
    pub fn publish(
        &self,
        tag: u8,
        base: *mut u8,
        ncpus: usize,
        in_class8: impl Fn(usize) -> bool,
        in_class16: impl Fn(usize) -> bool,
    ) -> bool {
        let Some(entry) = self.by_tag.get(usize::from(tag)) else { return false };
        if base.is_null() || ncpus == 0 {
            return false;
        }
        // Relaxed: the publisher's own earlier store, if any (publications are serialised
        // by the caller's lock); readers see it through a base's Release store below.
        let published = self.ncpus.load(Ordering::Relaxed);
        if published == 0 {
            // Relaxed: published by the Release stores of the bases below (protocol 1).
            self.ncpus.store(ncpus, Ordering::Relaxed);
        } else if published != ncpus {
            return false;
        }
        // Release: pairs with the Acquire loads in `slots_at` and `word_for_run`: the
        // slots and the count are seen by whoever sees the base.
        entry.store(base, Ordering::Release);
        for (i, entry) in self.by8.iter().enumerate() {
            if in_class8(i) {
                // Release: as above.
                entry.store(base, Ordering::Release);
            }
        }
        for (i, entry) in self.by16.iter().enumerate() {
            if in_class16(i) {
                // Release: as above.
                entry.store(base, Ordering::Release);
            }
        }
        true
    }

    /// The published slots of an entry of this table, if any (protocol 2).
    #[inline(always)]
    pub fn slots_at(&self, entry: &AtomicPtr<u8>) -> Option<Published> {
        // Acquire: pairs with the Release store in `publish`: the slots are initialised,
        // and `ncpus` (stored before) is seen.
        let base = entry.load(Ordering::Acquire);
        // Relaxed: ordered after the Acquire above.
        (!base.is_null()).then(|| Published { base, ncpus: self.ncpus.load(Ordering::Relaxed) })
    }

    /// The entry for page tag `tag`, if in range.
    #[inline(always)]
    pub fn by_tag(&self, tag: usize) -> Option<&AtomicPtr<u8>> {
        self.by_tag.get(tag)
    }

    /// The entry for page tag `tag`, unchecked.
    ///
    /// # Safety
    /// `tag < TAGS`.
    #[inline(always)]
    pub unsafe fn by_tag_unchecked(&self, tag: usize) -> &AtomicPtr<u8> {
        // SAFETY: the caller's contract.
        unsafe { self.by_tag.get_unchecked(tag) }
    }

    /// The `by8` entry for a request of `size` bytes (aligned to at most 8), unchecked.
    ///
    /// # Safety
    /// `size.div_ceil(8) < BY8`.
    #[inline(always)]
    pub unsafe fn by8_unchecked(&self, size: usize) -> &AtomicPtr<u8> {
        // SAFETY: the caller's contract.
        unsafe { self.by8.get_unchecked(size.div_ceil(8)) }
    }

    /// The `by16` entry for a request of `size` bytes (aligned to at most 16), unchecked.
    ///
    /// # Safety
    /// `size.div_ceil(16) < BY16`.
    #[inline(always)]
    pub unsafe fn by16_unchecked(&self, size: usize) -> &AtomicPtr<u8> {
        // SAFETY: the caller's contract.
        unsafe { self.by16.get_unchecked(size.div_ceil(16)) }
    }

    /// The entries by size, for checks: `(by8, by16)`.
    #[cfg(test)]
    pub fn by_size(&self) -> (&[AtomicPtr<u8>; BY8], &[AtomicPtr<u8>; BY16]) {
        (&self.by8, &self.by16)
    }

    /// The entries by tag: the table a region manager copies tag words from
    /// ([`word_for_run`]).
    pub fn tag_words(&self) -> &[AtomicPtr<u8>; TAGS] {
        &self.by_tag
    }

    /// The published slot count, 0 before the first publication. Relaxed: meaningful
    /// only to a caller ordered after an Acquire load that found a base (directly, or
    /// through a tag word: protocol 3).
    #[inline(always)]
    pub fn ncpus(&self) -> usize {
        // Relaxed: see above.
        self.ncpus.load(Ordering::Relaxed)
    }
}

impl<const TAGS: usize, const BY8: usize, const BY16: usize> Default for SlotTable<TAGS, BY8, BY16> {
    fn default() -> Self {
        Self::new()
    }
}

/// The word a run taken with `tag` gives its pages: `words[tag]` as published now, null
/// if none (or `tag` out of range). Called under the region manager's lock, before the
/// run's objects are handed out (protocol 3).
#[inline]
pub fn word_for_run(words: &[AtomicPtr<u8>], tag: u8) -> *mut u8 {
    // Acquire: pairs with the Release store in `SlotTable::publish`: what the entry names
    // is initialised before a reader of the page word (ordered after this run is handed
    // out) follows it.
    words.get(usize::from(tag)).map_or(core::ptr::null_mut(), |w| w.load(Ordering::Acquire))
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// A publication fills the tag's entry and exactly the size entries it names, fixes
    /// the count, and a later one with another count, a null base, a zero count or a tag
    /// past the table changes nothing; `word_for_run` copies the tag's entry, null for a
    /// tag without one or past the table.
    #[test]
    fn publish_fills_the_named_entries_and_refuses_what_does_not_fit() {
        let table = SlotTable::<4, 3, 3>::new();
        let (mut a, mut b) = (0u64, 0u64);
        let (pa, pb) = (core::ptr::from_mut(&mut a).cast::<u8>(), core::ptr::from_mut(&mut b).cast::<u8>());
        assert_eq!(table.ncpus(), 0);
        assert!(table.publish(1, pa, 2, |i| i == 1, |i| i == 2));
        let found = Some(Published { base: pa, ncpus: 2 });
        assert_eq!(table.slots_at(table.by_tag(1).unwrap()), found);
        let (by8, by16) = table.by_size();
        let filled8: Vec<bool> = by8.iter().map(|e| table.slots_at(e).is_some()).collect();
        let filled16: Vec<bool> = by16.iter().map(|e| table.slots_at(e).is_some()).collect();
        assert_eq!(
            (filled8.as_slice(), filled16.as_slice()),
            ([false, true, false].as_slice(), [false, false, true].as_slice())
        );
        // SAFETY: 8.div_ceil(8) = 1 < 3 and 17.div_ceil(16) = 2 < 3.
        let (e8, e16) = unsafe { (table.by8_unchecked(8), table.by16_unchecked(17)) };
        assert_eq!((table.slots_at(e8), table.slots_at(e16)), (found, found));
        assert!(!table.publish(2, pb, 3, |_| true, |_| true), "another count");
        assert!(!table.publish(2, core::ptr::null_mut(), 2, |_| true, |_| true), "a null base");
        assert!(!table.publish(2, pb, 0, |_| true, |_| true), "a zero count");
        assert!(!table.publish(4, pb, 2, |_| true, |_| true), "a tag past the table");
        assert_eq!(table.slots_at(table.by_tag(2).unwrap()), None);
        assert!(by8.iter().chain(by16).all(|e| table.slots_at(e).is_none_or(|s| s.base == pa)));
        assert_eq!(table.ncpus(), 2);
        assert!(table.publish(2, pb, 2, |i| i == 0, |_| false));
        assert_eq!(table.slots_at(table.by_tag(2).unwrap()), Some(Published { base: pb, ncpus: 2 }));
        assert_eq!(word_for_run(table.tag_words(), 2), pb);
        assert!(word_for_run(table.tag_words(), 3).is_null());
        assert!(word_for_run(table.tag_words(), 200).is_null());
        assert!(table.by_tag(4).is_none());
    }
}
