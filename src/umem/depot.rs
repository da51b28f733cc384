//! The depot: lock-free stacks of full and empty magazines shared by all CPUs of one
//! cache, with libumem's working-set accounting and contention counting.
//!
//! # Stacks
//!
//! Each list is a Treiber stack whose head word packs the top magazine's address with a
//! 24-bit version tag (8 bits below the 256-byte magazine alignment, 16 bits above the
//! 48-bit user address space). Every successful push and pop increments the tag.
//!
//! - **push(m)**: load head `h` (Relaxed), store `m.next = ptr(h)` (Relaxed), CAS head
//!   from `h` to `pack(m, tag(h) + 1)` (Release: pairs with the Acquire in pop, which
//!   then sees `m.next` and the rounds written into `m` before the push).
//! - **pop**: pin the epoch; load head `h` (Acquire); if `ptr(h)` is null, the list is
//!   empty; read `ptr(h).next`; CAS head from `h` to `pack(next, tag(h) + 1)` (Acquire).
//!
//! **Use after free is excluded by the epoch**: the only magazines ever freed are ones a
//! reaper popped (or took from a stopped CPU slot) and then *retired*
//! ([`Guard::retire`](crate::epoch::Guard::retire), intrusive, no allocation): a popper
//! that loaded `h` while pinned keeps `ptr(h)` alive until it unpins, so reading its
//! `next` is always a read of a live magazine, even if it has been popped since.
//!
//! **ABA is excluded by the tag**: magazines are recycled at once (popped from one list,
//! pushed on the other or back), so a popper could otherwise find the same address on
//! top again with a different `next` and corrupt the list. With the tag, its CAS succeeds
//! only if no push or pop succeeded in between, modulo 2^24 operations on this one list
//! between its load and its CAS (a preempted popper would need 16 million depot
//! operations to complete meanwhile); the epoch alone does not exclude ABA here, because
//! recycling a magazine does not wait for a grace period.
//!
//! # Counts, working set and contention
//!
//! `count` is incremented before a push's CAS and decremented after a pop's, so it is
//! never below the true length. `min` is the lowest count seen since the last
//! [`update`](Depot::update) (libumem's `ml_min`); `update` moves it into `reap_limit`
//! and restarts it at the current count. [`reap`](Depot::reap) frees up to
//! `min(reap_limit, min)` magazines per list: the ones no CPU needed for a whole interval.
//!
//! [`trim_full`](Depot::trim_full) (the object cache's free-time trim) empties full
//! magazines beyond a count right away and recycles them onto the empty list.
//!
//! Every failed CAS (push or pop) adds one to `contention`, and so does every *retried*
//! pop (a magazine popped for a CPU exchange that then failed and was pushed back); the
//! cache turns a rising count into larger magazines (`cpu_cache.rs`).

use core::ptr::NonNull;

use super::magazine::{MAG_ALIGN, Magazine, next_of, set_next};
use crate::epoch;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::util::CachePadded;

/// Low tag bits (below the magazine alignment).
const LOW_BITS: u32 = MAG_ALIGN.trailing_zeros();
const LOW_MASK: usize = MAG_ALIGN - 1;
/// Pointer bits (48-bit user addresses).
const PTR_MASK: usize = ((1 << 48) - 1) & !LOW_MASK;

#[inline]
fn pack(mag: usize, tag: usize) -> usize {
    debug_assert_eq!(mag & !PTR_MASK, 0, "magazine address outside 48 bits or misaligned");
    mag | (tag & LOW_MASK) | ((tag >> LOW_BITS) << 48)
}

#[inline]
fn unpack(word: usize) -> (usize, usize) {
    (word & PTR_MASK, (word & LOW_MASK) | ((word >> 48) << LOW_BITS))
}

/// One list of magazines (all full, or all empty).
pub(crate) struct MagList {
    /// Tagged head (see the module documentation).
    head: CachePadded<AtomicUsize>,
    /// Never below the true length (incremented before a push, decremented after a pop).
    count: AtomicUsize,
    /// Lowest `count` seen this interval.
    min: AtomicUsize,
    /// `min` of the previous interval: what [`reap`](Depot::reap) may free.
    reap_limit: AtomicUsize,
}

impl MagList {
    fn new() -> Self {
        Self {
            head: CachePadded::new(AtomicUsize::new(0)),
            count: AtomicUsize::new(0),
            min: AtomicUsize::new(0),
            reap_limit: AtomicUsize::new(0),
        }
    }

    /// Pushes a magazine the caller owns. Returns the number of failed CAS attempts.
    fn push(&self, mag: NonNull<Magazine>) -> usize {
        // Relaxed: a statistic; never below the true length because it precedes the CAS.
        self.count.fetch_add(1, Ordering::Relaxed);
        let addr = mag.as_ptr().expose_provenance();
        let mut failures = 0;
        // Relaxed: the CAS below validates the value.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let (top, tag) = unpack(head);
            set_next(mag, top);
            // Release: pairs with the Acquire loads in `pop`, publishing `next` and the
            // magazine's rounds. Relaxed on failure: we only retry.
            match self.head.compare_exchange_weak(
                head,
                pack(addr, tag.wrapping_add(1)),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return failures,
                Err(now) => {
                    failures += 1;
                    head = now;
                }
            }
        }
    }

    /// Pops a magazine; the caller owns it afterwards. Also returns the number of failed
    /// CAS attempts.
    fn pop(&self) -> (Option<NonNull<Magazine>>, usize) {
        let guard = epoch::pin();
        let mut failures = 0;
        // Acquire: pairs with the Release CAS of the push that put the top there.
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (top, tag) = unpack(head);
            let Some(mag) = NonNull::new(core::ptr::with_exposed_provenance_mut::<Magazine>(top)) else {
                drop(guard);
                return (None, failures);
            };
            // The magazine is live: we are pinned, and magazines are freed only after
            // being retired (module documentation).
            let next = next_of(mag);
            // Acquire on success: we own `mag` and read its rounds, written before the
            // Release CAS that pushed it. Acquire on failure: the new head is
            // dereferenced in the next iteration.
            match self.head.compare_exchange_weak(
                head,
                pack(next, tag.wrapping_add(1)),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    drop(guard);
                    // Relaxed: statistics (see `count`).
                    let now = self.count.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                    self.min.fetch_min(now, Ordering::Relaxed);
                    return (Some(mag), failures);
                }
                Err(now) => {
                    failures += 1;
                    head = now;
                }
            }
        }
    }

    /// Number of magazines (never below the true number; exact when quiescent).
    fn len(&self) -> usize {
        // Relaxed: a statistic.
        self.count.load(Ordering::Relaxed)
    }

    /// Walks the list (quiescent use only) and checks its count; returns its length.
    fn assert_valid(&self, what: &str) -> usize {
        let _guard = epoch::pin();
        // Acquire: pairs with the pushes' Release CAS (quiescent, so any order would do).
        let (mut top, _) = unpack(self.head.load(Ordering::Acquire));
        let mut len = 0;
        while let Some(mag) = NonNull::new(core::ptr::with_exposed_provenance_mut::<Magazine>(top)) {
            len += 1;
            // SAFETY: quiescent: the magazine is in the list, hence live.
            let cap = unsafe { Magazine::cap(mag) };
            assert!((1..=crate::cpu::rseq::mag_layout::MAX_CAP).contains(&cap), "depot: bad magazine capacity");
            top = next_of(mag);
            assert!(len <= self.len(), "depot {what} list: longer than its count (or a cycle)");
        }
        assert_eq!(len, self.len(), "depot {what} list: count differs from length");
        len
    }

    /// Sets the count to the list's length, in a `fork`ed child. A thread of the parent
    /// can be between a push's count increment and its CAS, or between a pop's CAS and
    /// its decrement, when the process is copied: in the child nobody finishes it, and
    /// the count would stay above the length for good (one per vanished thread).
    ///
    /// # Safety
    /// Called in the child of a `fork`, before it has started any other thread: nothing
    /// else touches the list, and every magazine on it is live (magazines are retired
    /// only after they are popped).
    #[cfg(not(scalemem_loom))]
    unsafe fn recount(&self) {
        // Relaxed (here and below): single-threaded child.
        let (mut top, _) = unpack(self.head.load(Ordering::Relaxed));
        let mut len = 0;
        while let Some(mag) = NonNull::new(core::ptr::with_exposed_provenance_mut::<Magazine>(top)) {
            len += 1;
            top = next_of(mag);
        }
        self.count.store(len, Ordering::Relaxed);
        self.min.store(self.min.load(Ordering::Relaxed).min(len), Ordering::Relaxed);
        self.reap_limit.store(self.reap_limit.load(Ordering::Relaxed).min(len), Ordering::Relaxed);
    }

    fn update(&self) {
        // Relaxed: working-set statistics; a race with a concurrent pop only makes the
        // next reap slightly more or less eager.
        self.reap_limit.store(self.min.load(Ordering::Relaxed), Ordering::Relaxed);
        self.min.store(self.count.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    fn reapable(&self) -> usize {
        // Relaxed: statistics (see update).
        self.reap_limit.load(Ordering::Relaxed).min(self.min.load(Ordering::Relaxed))
    }
}

/// The depot of one cache.
pub(crate) struct Depot {
    pub(crate) full: MagList,
    pub(crate) empty: MagList,
    /// Failed CAS attempts on either list, ever.
    contention: AtomicUsize,
    /// Magazines CPUs took from the depot in exchange for one of theirs, ever.
    exchanges: AtomicUsize,
}

impl Depot {
    pub(crate) fn new() -> Self {
        Self {
            full: MagList::new(),
            empty: MagList::new(),
            contention: AtomicUsize::new(0),
            exchanges: AtomicUsize::new(0),
        }
    }

    /// Counts one magazine a CPU installed from the depot (a full one for an empty, an
    /// empty one for a full).
    pub(crate) fn count_exchange(&self) {
        // Relaxed: a statistic read by `CpuCaches::grow_if_exchanging`.
        self.exchanges.fetch_add(1, Ordering::Relaxed);
    }

    /// Magazines installed from the depot so far.
    pub(crate) fn exchanges(&self) -> usize {
        // Relaxed: a statistic.
        self.exchanges.load(Ordering::Relaxed)
    }

    #[inline]
    fn count_contention(&self, failures: usize) {
        if failures > 0 {
            // Relaxed: a statistic read by `update`.
            self.contention.fetch_add(failures, Ordering::Relaxed);
        }
    }

    /// Counts a *retried* pop: a magazine popped for an exchange that then failed (the
    /// CPU's state moved) and goes back.
    pub(crate) fn count_retry(&self) {
        self.count_contention(1);
    }

    /// Pushes a full magazine the caller owns.
    pub(crate) fn push_full(&self, mag: NonNull<Magazine>) {
        let failures = self.full.push(mag);
        self.count_contention(failures);
    }

    /// Pushes an empty magazine the caller owns.
    pub(crate) fn push_empty(&self, mag: NonNull<Magazine>) {
        let failures = self.empty.push(mag);
        self.count_contention(failures);
    }

    /// Pops a full magazine (all `cap` rounds valid).
    pub(crate) fn pop_full(&self) -> Option<NonNull<Magazine>> {
        let (mag, failures) = self.full.pop();
        self.count_contention(failures);
        mag
    }

    /// Pops an empty magazine.
    pub(crate) fn pop_empty(&self) -> Option<NonNull<Magazine>> {
        let (mag, failures) = self.empty.pop();
        self.count_contention(failures);
        mag
    }

    /// Failed CAS attempts so far.
    pub(crate) fn contention(&self) -> usize {
        // Relaxed: a statistic.
        self.contention.load(Ordering::Relaxed)
    }

    /// (full, empty) magazine counts.
    pub(crate) fn lens(&self) -> (usize, usize) {
        (self.full.len(), self.empty.len())
    }

    /// Panics if a list's length differs from its count or holds a malformed magazine.
    /// Quiescent use only.
    pub(crate) fn assert_valid(&self) {
        self.full.assert_valid("full");
        self.empty.assert_valid("empty");
    }

    /// Makes both lists' counts exact again in a `fork`ed child ([`MagList::recount`]).
    ///
    /// # Safety
    /// As `MagList::recount`.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn recount_after_fork(&self) {
        // SAFETY: the caller's contract.
        unsafe {
            self.full.recount();
            self.empty.recount();
        }
    }

    /// Ends a working-set interval (libumem's `ws_update`).
    pub(crate) fn update(&self) {
        self.full.update();
        self.empty.update();
    }

    /// Idle magazines of the last interval: (full, empty) that [`reap`](Self::reap)
    /// would free.
    pub(crate) fn reapable(&self) -> (usize, usize) {
        (self.full.reapable(), self.empty.reapable())
    }

    /// Frees the magazines idle for a whole interval: rounds of full ones go to `sink`,
    /// the magazines are retired. Returns the number of magazines freed.
    pub(crate) fn reap(&self, sink: &mut dyn FnMut(NonNull<u8>)) -> usize {
        let (full, empty) = self.reapable();
        let freed = self.free_some(full, empty, sink);
        // The reaped magazines no longer count as idle.
        for list in [&self.full, &self.empty] {
            // Relaxed: statistics (see MagList::update).
            list.reap_limit.store(0, Ordering::Relaxed);
        }
        freed
    }

    /// Empties full magazines until at most `keep` are left (counted at the start:
    /// magazines pushed meanwhile stay): their rounds go to `sink`, and each emptied
    /// magazine goes onto the empty list (recycled, not retired: no grace period and no
    /// fence is needed, and the working-set reap frees it later if nobody uses it).
    /// Returns the rounds given to `sink`.
    pub(crate) fn trim_full(&self, keep: usize, sink: &mut dyn FnMut(NonNull<u8>)) -> usize {
        let excess = self.full.len().saturating_sub(keep);
        let mut rounds = 0;
        for _ in 0..excess {
            let Some(mag) = self.pop_full() else { break };
            // SAFETY: popped, so ours alone; a full magazine holds `cap` rounds.
            let cap = unsafe { Magazine::cap(mag) };
            // SAFETY: as above.
            unsafe { Magazine::empty_into(mag, cap, sink) };
            rounds += cap;
            self.push_empty(mag);
        }
        rounds
    }

    /// Frees every magazine in the depot (rounds to `sink`, magazines retired).
    pub(crate) fn purge(&self, sink: &mut dyn FnMut(NonNull<u8>)) -> usize {
        self.free_some(usize::MAX, usize::MAX, sink)
    }

    fn free_some(&self, full: usize, empty: usize, sink: &mut dyn FnMut(NonNull<u8>)) -> usize {
        let guard = epoch::pin();
        let mut freed = 0;
        for _ in 0..full {
            let Some(mag) = self.pop_full() else { break };
            // SAFETY: popped, so ours alone; a full magazine holds `cap` rounds.
            unsafe { Magazine::empty_into(mag, Magazine::cap(mag), sink) };
            // SAFETY: popped (unreachable from the list), retired once; poppers that
            // loaded it earlier are pinned and keep it alive.
            unsafe { Magazine::retire(mag, &guard) };
            freed += 1;
        }
        for _ in 0..empty {
            let Some(mag) = self.pop_empty() else { break };
            // SAFETY: as above.
            unsafe { Magazine::retire(mag, &guard) };
            freed += 1;
        }
        freed
    }
}
