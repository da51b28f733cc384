//! [`PercpuRef`]: Linux's `percpu_ref` in Rust: a reference count whose get and put touch
//! only the current CPU's counter while the owner keeps the object alive, and that turns
//! into an ordinary atomic count (with exact zero detection) once it is killed.
//!
//! # State
//!
//! - `mode`: a shared, read-mostly word with the flags `ATOMIC`, `DEAD` and `RELEASED`.
//!   `DEAD` implies `ATOMIC`. Per-CPU mode is `ATOMIC` clear.
//! - `count`: the atomic count. In per-CPU mode it carries a bias of `2^63`, so that it
//!   cannot reach zero while per-CPU parts are not yet summed into it.
//! - One slot per CPU with two words that are never written the same way (see
//!   [`PerCpuCounter`](crate::cpu::PerCpuCounter)): `rseq`, changed only by the
//!   conditional rseq section ([`rseq::add_if_clear_in`](crate::cpu::rseq::add_if_clear_in)),
//!   and `atomic`, changed only by compare-exchange. `atomic` holds `2 * part | SEALED`;
//!   a sealed word takes no more updates.
//!
//! The true count is `count - bias + Σ rseq + Σ (unsealed atomic parts)`; every get or
//! put lands in exactly one of these places. Each per-CPU part may be negative (a
//! reference taken on one CPU and dropped on another); only the sum means anything.
//!
//! # Fast path (per-CPU mode)
//!
//! `get`/`put` run [`rseq::add_if_clear_in`](crate::cpu::rseq::add_if_clear_in): "add
//! `±n` to this CPU's `rseq` word if `mode & ATOMIC == 0`", where the test of the mode is
//! inside the restartable section and the commit is the single `add`. No atomic
//! instruction, no shared write: about as cheap as
//! [`PerCpuCounter`](crate::cpu::PerCpuCounter). The mode word sits in a small block with
//! the address and number of the `rseq` words, so the section reads what it needs from
//! the one line a get reads anyway (and the slot stride is a constant). A thread
//! without rseq (or any thread, where the process lacks rseq or the rseq fence) instead
//! compare-exchanges its CPU's `atomic` word, failing over to `count` if the word is
//! sealed. Neither path pins an epoch.
//!
//! # Switching to atomic mode: why no count is lost
//!
//! Linux needs an RCU grace period here because its mode test and per-CPU add are two
//! steps: a CPU that read "per-CPU" may add after the switcher has summed. Here both
//! kinds of per-CPU word are *closed* instead, each by its own argument:
//!
//! 1. Set `ATOMIC` (SeqCst RMW), then call the rseq fence
//!    ([`heavy_rseq`](crate::cpu::fence::heavy_rseq),
//!    `membarrier(PRIVATE_EXPEDITED_RSEQ)`). When it returns, every section that tested
//!    the mode before the flag was set has either committed (its `add` is visible to the
//!    switcher: the membarrier is a full barrier on that CPU) or been restarted, and a
//!    restarted or later section reads the flag and commits nothing. So the `rseq` words
//!    are final. This fence *is* the grace period: it waits for exactly the read-side
//!    sections that matter, and for nothing else.
//! 2. Seal every `atomic` word with `fetch_or(SEALED)`: the value it returns is final,
//!    because a compare-exchange that comes after it in the word's modification order
//!    sees `SEALED` and goes to `count` instead. No grace period is needed for these words
//!    at all: the mode test and the add are one atomic step *on the word itself*.
//! 3. Add `Σ parts - bias` to `count` in one RMW. Between steps 1 and 3, gets and puts go
//!    to `count`, which still holds the bias and so cannot reach zero.
//!
//! The switch is therefore synchronous: it costs one membarrier (10-35 us with other
//! threads running) and no waiting for other threads beyond it. `switch_to_atomic` and
//! `switch_to_atomic_sync` differ only in the confirmation callback.
//!
//! Why not the epoch-based fallback (an [`epoch`](crate::epoch) pin around the mode test
//! and a per-CPU `fetch_add`, and a grace period before summing): the sealable word makes
//! the fallback's get/put one uncontended compare-exchange, cheaper than a pin plus a
//! `fetch_add`, and the switch needs no grace period, so it never waits for a thread
//! that is pinned for other reasons (or forever). Both paths are model-checked: loom runs
//! the compare-exchange path as is, and the rseq path through the section model of
//! `section.rs` (a section holds its CPU's section lock; the rseq fence takes every one).
//!
//! Ordering: a put publishes the putter's earlier accesses to the thread that releases.
//! Compare-exchanges and `count` RMWs of puts are Release; the sealing `fetch_or` and the
//! fold's `count` RMW are AcqRel, so they continue the release sequence on `count` that
//! the final put reads with Acquire. A put's rseq `add` is a plain x86 store after the
//! putter's accesses (TSO keeps that order), made visible to the switcher by the
//! membarrier before its loads.
//!
//! # Kill and confirm
//!
//! `kill_and_confirm` sets `DEAD | ATOMIC` in one RMW, performs the fold if the ref was
//! per-CPU, runs `confirm`, and then drops the initial reference (which may release).
//! When `confirm` runs, [`tryget_live`](PercpuRef::tryget_live) fails in every call
//! that starts afterwards: a section cannot commit (it tests `ATOMIC`, and the fence has
//! run), and every other path reads `mode` after the `DEAD` store, either directly or
//! after finding its slot sealed (the sealing `fetch_or` comes after the `DEAD` store,
//! and the failed compare-exchange reads it with Acquire). A `tryget_live` that *started*
//! before the kill may still succeed; its reference is counted like any other.
//!
//! # Release, resurrect, reinit
//!
//! `release` runs on the thread whose RMW brings `count` to zero (a put, or a fold that
//! finds the count already spent), exactly once per lifetime, after that RMW, and with no
//! reference held (zero is only reachable in atomic mode, where `count` is the true
//! count). Then `RELEASED` is set. `count` never leaves zero on its own:
//! `tryget` is increment-if-not-zero, [`switch_to_percpu`](PercpuRef::switch_to_percpu)
//! adds the bias only to a non-zero count (a released ref stays atomic), and
//! [`resurrect`](PercpuRef::resurrect) takes its new initial reference with
//! increment-if-not-zero. Only [`reinit`](PercpuRef::reinit) starts a new lifetime, and it
//! first waits for `RELEASED`, so `release` never overlaps with a new reference.
//!
//! # Invariants
//! - `DEAD` implies `ATOMIC`; the `ATOMIC` and `DEAD` flags and `force_atomic` change only
//!   under the switch lock.
//! - No section commits while `ATOMIC` is set, from the fence of the switch that set it
//!   until the `Release` RMW that clears it. The fold zeroes the `rseq` words (nothing
//!   can commit to them then), so they are zero throughout atomic mode.
//! - An `atomic` word is sealed exactly while `ATOMIC` is set, from its fold until
//!   [`switch_to_percpu`](PercpuRef::switch_to_percpu) resets it; a reset word is zero.
//! - In per-CPU mode `count` holds the bias; in atomic mode after the fold it is the true
//!   count.

use core::fmt;
use core::mem::offset_of;

use super::section;
use crate::cpu::PerCpu;
use crate::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use crate::util::{AllocError, Backoff, CachePadded};

/// `mode`: gets and puts go to `count`.
const ATOMIC: usize = 1;
/// `mode`: killed; `tryget_live` fails. Always set together with (or after) `ATOMIC`.
const DEAD: usize = 2;
/// `mode`: `release` has run and returned for the current lifetime.
const RELEASED: usize = 4;
/// The bias `count` carries in per-CPU mode.
const BIAS: usize = 1 << (usize::BITS - 1);
/// The low bit of a slot's `atomic` word: the word is sealed.
const SEALED: usize = 1;

/// How a ref starts.
///
/// ```
/// use scalemem::refcount::{Init, PercpuRef};
/// assert_eq!(Init::default(), Init::PerCpu);
/// let r = PercpuRef::with_init(|| {}, Init::Atomic).unwrap();
/// assert!(!r.is_percpu() && r.tryget_live()); // alive, but counted atomically
/// r.put();
/// r.switch_to_percpu();
/// assert!(r.is_percpu());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Init {
    /// Per-CPU mode, holding the initial reference (Linux's default).
    #[default]
    PerCpu,
    /// Atomic mode, holding the initial reference, as if
    /// [`switch_to_atomic`](PercpuRef::switch_to_atomic) had been called
    /// (`PERCPU_REF_INIT_ATOMIC`): [`switch_to_percpu`](PercpuRef::switch_to_percpu)
    /// makes it per-CPU.
    Atomic,
    /// Dead with a zero count and nothing to release (`PERCPU_REF_INIT_DEAD`):
    /// [`reinit`](PercpuRef::reinit) brings it to life.
    Dead,
}

/// One CPU's part of the count.
#[repr(C)]
struct Slot {
    /// Written only by the conditional rseq section (and zeroed by the fold, when no
    /// section can commit to it).
    rseq: AtomicIsize,
    /// `2 * part | SEALED`, written only by compare-exchange, the sealing `fetch_or`, and
    /// the reset store of `switch_to_percpu`.
    atomic: AtomicUsize,
}

/// The words every get and put reads, kept off other data's cache lines: the mode word
/// (the flags of the section block, which also says where the `rseq` words are) and the
/// atomic count.
struct Hot {
    block: section::AddBlock,
    count: AtomicUsize,
}

/// The count without the release callback: what [`PercpuRef`] and
/// [`PercpuArc`](super::PercpuArc) share. Methods that can bring the count to zero
/// return `true` when they did; the caller then owns the release.
pub(crate) struct RawRef {
    hot: CachePadded<Hot>,
    slots: PerCpu<Slot>,
    /// The switch lock: held by `switch_*`, `kill*`, `resurrect` and `reinit`.
    switching: AtomicBool,
    /// Linux's `force_atomic`: set by `switch_to_atomic`, cleared by `switch_to_percpu`;
    /// `resurrect` and `reinit` return to per-CPU mode only while it is clear. Read and
    /// written only under the switch lock.
    force_atomic: AtomicBool,
    /// Whether this ref uses rseq sections (fixed at construction; see `section`).
    sections: bool,
}

/// A held switch lock.
struct SwitchGuard<'a>(&'a RawRef);

impl Drop for SwitchGuard<'_> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in `RawRef::lock`.
        self.0.switching.store(false, Ordering::Release);
    }
}

impl RawRef {
    pub(crate) fn new(init: Init) -> Result<Self, AllocError> {
        let slots = PerCpu::new(|_| Slot { rseq: AtomicIsize::new(0), atomic: AtomicUsize::new(0) })?;
        let (mode, count, force_atomic) = match init {
            Init::PerCpu => (0, BIAS.wrapping_add(1), false),
            // Atomic from the start: no section ever saw ATOMIC clear; seal the slots.
            Init::Atomic => (ATOMIC, 1, true),
            Init::Dead => (ATOMIC | DEAD | RELEASED, 0, false),
        };
        if mode & ATOMIC != 0 {
            for slot in slots.iter() {
                // Relaxed: not shared yet.
                slot.atomic.store(SEALED, Ordering::Relaxed);
            }
        }
        let block = section::AddBlock::new(mode, slots.raw_parts(), offset_of!(Slot, rseq), section::usable());
        let sections = block.sections();
        Ok(Self {
            hot: CachePadded::new(Hot { block, count: AtomicUsize::new(count) }),
            slots,
            switching: AtomicBool::new(false),
            force_atomic: AtomicBool::new(force_atomic),
            sections,
        })
    }

    /// Adds `delta` to this CPU's `rseq` word if the ref is per-CPU (tested inside the
    /// section). `false`: nothing done (atomic mode, no rseq, CPU out of range).
    #[inline]
    fn add_section(&self, delta: isize) -> bool {
        let Some(area) = section::area() else { return false };
        // SAFETY: (1) `area` is this thread's, just obtained. The block was built over
        // our live PerCpu<Slot>'s `rseq` words (an AtomicIsize at offset_of!(Slot, rseq))
        // and lives as long as &self; without sections it fails at once. (2) The `rseq`
        // words are written only by this section and by `to_percpu_locked`, which zeroes
        // them while ATOMIC is set and the fence of the switch that set it has run
        // (module invariants).
        unsafe { section::add_if_clear_block(area, &self.hot.block, ATOMIC, delta) }
    }

    /// Adds `delta` to this CPU's `atomic` word unless it is sealed. `false`: sealed.
    #[inline]
    fn add_slot(&self, delta: isize, order: Ordering) -> bool {
        let word = &self.slots.local().atomic;
        // Acquire: if we see SEALED, the switch that sealed the word set its mode flags
        // before; tryget_live relies on reading DEAD after this (module docs).
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current & SEALED != 0 {
                return false;
            }
            let new = current.wrapping_add((delta as usize) << 1);
            // `order` on success: Relaxed for gets (like Arc::clone), Release for puts
            // (pairs with the AcqRel sealing fetch_or). Acquire on failure: as above.
            match word.compare_exchange_weak(current, new, order, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    /// Acquire: if the flags say per-CPU, the slots were reset before (pairs with the
    /// Release RMW in `to_percpu_locked`). Correctness never depends on a stale answer:
    /// the slot words are authoritative.
    #[inline]
    fn mode(&self) -> usize {
        self.hot.block.flags.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn get_many(&self, n: usize) {
        if !self.add_section(n as isize) {
            self.get_slow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn get_slow(&self, n: usize) {
        // Relaxed slot CAS: a get publishes nothing (see add_slot).
        if self.mode() & ATOMIC == 0 && self.add_slot(n as isize, Ordering::Relaxed) {
            return;
        }
        // Relaxed: taking a reference publishes nothing (the caller holds one already).
        self.hot.count.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn tryget_many(&self, n: usize, live: bool) -> bool {
        // Per-CPU mode implies alive (DEAD implies ATOMIC, and zero is reachable only in
        // atomic mode), so a committed section is a successful tryget of either kind.
        self.add_section(n as isize) || self.tryget_slow(n, live)
    }

    #[cold]
    #[inline(never)]
    fn tryget_slow(&self, n: usize, live: bool) -> bool {
        // Relaxed slot CAS: as in get_slow; an unsealed slot means the ref is alive.
        if self.mode() & ATOMIC == 0 && self.add_slot(n as isize, Ordering::Relaxed) {
            return true;
        }
        // Re-read after the slot: a sealed slot means its switch's flags are visible.
        if live && self.mode() & DEAD != 0 {
            return false;
        }
        let count = &self.hot.count;
        // Relaxed load and CAS: increment-if-not-zero publishes nothing; a zero count
        // stays zero until reinit (module docs), so seeing it means failure.
        let mut current = count.load(Ordering::Relaxed);
        loop {
            if current == 0 {
                return false;
            }
            match count.compare_exchange_weak(current, current.wrapping_add(n), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    /// Drops `n` references; `true` if this brought the count to zero.
    #[inline]
    #[must_use]
    pub(crate) fn put_many(&self, n: usize) -> bool {
        !self.add_section((n as isize).wrapping_neg()) && self.put_slow(n)
    }

    #[cold]
    #[inline(never)]
    fn put_slow(&self, n: usize) -> bool {
        // Release slot CAS: pairs with the AcqRel sealing fetch_or of the fold (see add_slot).
        if self.mode() & ATOMIC == 0 && self.add_slot((n as isize).wrapping_neg(), Ordering::Release) {
            return false;
        }
        self.put_atomic(n)
    }

    /// `count -= n`; `true` if it reached zero.
    fn put_atomic(&self, n: usize) -> bool {
        // AcqRel: Release publishes our uses of the object to the releasing thread;
        // Acquire (useful when we are that thread) pairs with every earlier put's Release
        // through the release sequence on `count` (which the folds continue).
        let old = self.hot.count.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(old >= n || old > BIAS / 2, "PercpuRef: put without a matching get");
        old == n
    }

    fn lock(&self) -> SwitchGuard<'_> {
        let backoff = Backoff::new();
        // Acquire: pairs with the Release in SwitchGuard::drop.
        while self.switching.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
        SwitchGuard(self)
    }

    /// Sums the per-CPU parts into `count` after the caller set `ATOMIC` (the fold).
    /// Returns `true` if the count is now zero. REQUIRES: the switch lock, and `ATOMIC`
    /// newly set by the caller.
    fn fold_locked(&self) -> bool {
        // Step 1: close the rseq words (module docs).
        if self.sections {
            section::fence();
        }
        let mut sum = 0usize;
        for slot in self.slots.iter() {
            // Relaxed: after the fence the word is final and its last add is visible (the
            // membarrier ran a full barrier on the CPU that made it; in the loom model the
            // section lock's Acquire/Release does). No section can commit to it until
            // ATOMIC is cleared, so it may be zeroed now (a swap for brevity: nothing
            // races with it).
            sum = sum.wrapping_add(slot.rseq.swap(0, Ordering::Relaxed) as usize);
            // Step 2: AcqRel: Acquire pairs with the Release CASes of puts (their effects
            // reach the releasing thread through our count RMW); Release orders the
            // already-set flags before the seal for readers of the sealed word.
            let word = slot.atomic.fetch_or(SEALED, Ordering::AcqRel);
            sum = sum.wrapping_add(((word as isize) >> 1) as usize);
        }
        // Step 3: AcqRel, see put_atomic.
        let delta = sum.wrapping_sub(BIAS);
        let old = self.hot.count.fetch_add(delta, Ordering::AcqRel);
        old.wrapping_add(delta) == 0
    }

    /// Per-CPU mode again, if allowed. REQUIRES: the switch lock.
    fn to_percpu_locked(&self) {
        // Relaxed: ATOMIC and DEAD change only under the lock we hold.
        let mode = self.hot.block.flags.load(Ordering::Relaxed);
        if mode & ATOMIC == 0 || mode & DEAD != 0 {
            return;
        }
        // Add the bias unless the count is zero (a released ref stays atomic). Relaxed:
        // the Release RMW of `mode` below publishes the whole switch.
        let count = &self.hot.count;
        let mut current = count.load(Ordering::Relaxed);
        loop {
            if current == 0 {
                return;
            }
            match count.compare_exchange_weak(current, current.wrapping_add(BIAS), Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        for slot in self.slots.iter() {
            // Relaxed: a sealed `atomic` word rejects every CAS, so the store races with
            // nothing that could be lost; the Release RMW below publishes the zero before
            // any thread can see per-CPU mode. (`rseq` is already zero: the fold zeroed
            // it, and no section can commit while ATOMIC is set.)
            slot.atomic.store(0, Ordering::Relaxed);
        }
        // Release: pairs with the Acquire mode reads of the slow paths, and (TSO) with the
        // sections' plain loads of the mode.
        self.hot.block.flags.fetch_and(!ATOMIC, Ordering::Release);
    }

    /// Sets `flags` (with `ATOMIC`) and folds if the ref was per-CPU. Returns the mode
    /// before and whether the fold brought the count to zero. REQUIRES: the switch lock.
    fn to_atomic_locked(&self, flags: usize) -> (usize, bool) {
        // SeqCst: the flag store comes before the fence's own SeqCst fence and membarrier.
        let old = self.hot.block.flags.fetch_or(ATOMIC | flags, Ordering::SeqCst);
        let zero = old & ATOMIC == 0 && self.fold_locked();
        (old, zero)
    }

    /// Sets `RELEASED` after the release callback returned.
    fn mark_released(&self) {
        // Release: pairs with the Acquire in `reinit`, which must not start a new lifetime
        // before the callback of the old one is done.
        self.hot.block.flags.fetch_or(RELEASED, Ordering::Release);
    }

    /// `switch_to_atomic` + confirm under the lock. Returns `true` if the count is zero.
    fn switch_to_atomic(&self, confirm: impl FnOnce()) -> bool {
        let guard = self.lock();
        // Relaxed: under the lock.
        self.force_atomic.store(true, Ordering::Relaxed);
        let (_, zero) = self.to_atomic_locked(0);
        confirm();
        drop(guard);
        zero
    }

    fn switch_to_percpu(&self) {
        let _guard = self.lock();
        // Relaxed: under the lock.
        self.force_atomic.store(false, Ordering::Relaxed);
        self.to_percpu_locked();
    }

    /// Kills; `None` if already dead, else whether the count is now zero.
    pub(crate) fn kill(&self, confirm: impl FnOnce()) -> Option<bool> {
        let guard = self.lock();
        let (old, folded_to_zero) = self.to_atomic_locked(DEAD);
        if old & DEAD != 0 {
            return None;
        }
        confirm();
        drop(guard);
        // A fold that finds the count spent means the initial reference was already put
        // (a misuse, but not one to make worse by putting it twice).
        Some(folded_to_zero || self.put_atomic(1))
    }

    fn resurrect(&self) -> bool {
        let _guard = self.lock();
        // Relaxed: flags change only under the lock we hold.
        if self.hot.block.flags.load(Ordering::Relaxed) & DEAD == 0 {
            return false;
        }
        let count = &self.hot.count;
        // Relaxed: increment-if-not-zero; the mode RMW publishes.
        let mut current = count.load(Ordering::Relaxed);
        loop {
            if current == 0 {
                return false;
            }
            match count.compare_exchange_weak(current, current + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        // Release: tryget_live callers that see DEAD clear may use the object.
        self.hot.block.flags.fetch_and(!DEAD, Ordering::Release);
        // Relaxed: under the lock.
        if !self.force_atomic.load(Ordering::Relaxed) {
            self.to_percpu_locked();
        }
        true
    }

    fn reinit(&self) -> bool {
        let _guard = self.lock();
        // Relaxed: a non-zero count (or one that becomes non-zero) means "not released".
        if self.hot.count.load(Ordering::Relaxed) != 0 {
            return false;
        }
        // The count is zero: its release is running or done. Wait for it to be done.
        let backoff = Backoff::new();
        // Acquire: pairs with the Release in mark_released.
        while self.hot.block.flags.load(Ordering::Acquire) & RELEASED == 0 {
            backoff.snooze();
        }
        // Relaxed: the Release RMW of mode below publishes it.
        if self.hot.count.compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return false; // a get on a released ref: misuse
        }
        // Release: pairs with the Acquire mode reads (tryget_live, reinit).
        self.hot.block.flags.fetch_and(!(DEAD | RELEASED), Ordering::Release);
        // Relaxed: under the lock.
        if !self.force_atomic.load(Ordering::Relaxed) {
            self.to_percpu_locked();
        }
        true
    }

    pub(crate) fn is_zero(&self) -> bool {
        // Acquire: a zero seen here is final (the release sequence on `count`).
        self.mode() & ATOMIC != 0 && self.hot.count.load(Ordering::Acquire) == 0
    }

    fn is_dying(&self) -> bool {
        self.mode() & DEAD != 0
    }

    fn is_percpu(&self) -> bool {
        self.mode() & ATOMIC == 0
    }

    /// Re-derives the invariants that hold at rest (no concurrent operation): `DEAD`
    /// implies `ATOMIC`; per-CPU mode has unsealed slots and a biased count; atomic mode
    /// has sealed slots and no rseq part.
    pub(crate) fn assert_valid(&self) {
        let mode = self.mode();
        assert!(mode & DEAD == 0 || mode & ATOMIC != 0, "PercpuRef: DEAD without ATOMIC");
        for slot in self.slots.iter() {
            // Relaxed: at rest.
            let sealed = slot.atomic.load(Ordering::Relaxed) & SEALED != 0;
            assert_eq!(sealed, mode & ATOMIC != 0, "PercpuRef: slot seal disagrees with the mode");
            if mode & ATOMIC != 0 {
                // Relaxed: at rest.
                assert_eq!(slot.rseq.load(Ordering::Relaxed), 0, "PercpuRef: rseq part left in atomic mode");
            }
        }
    }

    /// The true count, summed (exact at rest, approximate under concurrent updates).
    pub(crate) fn count_hint(&self) -> usize {
        // Relaxed: a diagnostic.
        let mut sum = self.hot.count.load(Ordering::Relaxed);
        if self.is_percpu() {
            sum = sum.wrapping_sub(BIAS);
            for slot in self.slots.iter() {
                // Relaxed: a diagnostic.
                sum = sum.wrapping_add(slot.rseq.load(Ordering::Relaxed) as usize);
                let word = slot.atomic.load(Ordering::Relaxed);
                sum = sum.wrapping_add(((word as isize) >> 1) as usize);
            }
        }
        sum
    }
}

/// A reference count with Linux `percpu_ref` semantics: per-CPU gets and puts while the
/// owner keeps it alive, an atomic count with exact zero detection after
/// [`kill`](Self::kill), and a `release` callback that runs once, on the thread that drops
/// the count to zero.
///
/// The ref starts (with [`new`](Self::new)) in per-CPU mode holding one *initial*
/// reference, which belongs to whoever will kill it. Other users take and drop
/// references with [`get`](Self::get)/[`tryget_live`](Self::tryget_live) and
/// [`put`](Self::put). While per-CPU, the count cannot reach zero (and `release` cannot
/// run) however the gets and puts are spread over CPUs; [`kill`](Self::kill) switches to
/// atomic mode and drops the initial reference, after which the last put releases.
///
/// Costs on our machines: a per-CPU get or put is one rseq section (2-3 ns, no atomic
/// instruction, no shared write); without rseq, one uncontended compare-exchange on
/// the CPU's own line. In atomic mode every get and put is an RMW on the shared count.
/// A switch to atomic mode (`kill`, `switch_to_atomic*`) issues one
/// `membarrier(PRIVATE_EXPEDITED_RSEQ)`, 10-35 us with other threads running; it is
/// synchronous (see the [module documentation](self) for why no grace period is needed
/// beyond it). Each ref maps one page of per-CPU slots on machines with up to 32 CPUs.
///
/// `release` is a notification: it cannot free the `PercpuRef` it belongs to (the ref is
/// borrowed while it runs). To free memory when the count reaches zero, use
/// [`PercpuArc`](super::PercpuArc), or let `release` signal the owner.
///
/// Misuse that is a logic error, never undefined behaviour: a put without a get (caught
/// by a debug assertion in atomic mode), a get on a ref whose count reached zero
/// (`release` may then run again), gets and puts whose per-CPU parts exceed `2^62`.
///
/// ```
/// use scalemem::refcount::PercpuRef;
/// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
///
/// static RELEASED: AtomicBool = AtomicBool::new(false);
/// let r = PercpuRef::new(|| RELEASED.store(true, SeqCst)).unwrap();
/// assert!(r.tryget_live()); // a user enters
/// r.get();                  // and takes a second reference
/// r.put();
/// r.kill();                 // the owner drops the initial reference
/// assert!(!r.tryget_live());
/// assert!(!RELEASED.load(SeqCst)); // one reference left
/// r.put();
/// assert!(RELEASED.load(SeqCst) && r.is_zero());
/// ```
pub struct PercpuRef<F: Fn() + Send + Sync = fn()> {
    raw: RawRef,
    release: F,
}

/// The owner's side (creation, [`kill`](Self::kill), the switches) and the users' side
/// (gets and puts) of a ref.
///
/// ```
/// use scalemem::refcount::PercpuRef;
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
///
/// let releases = AtomicUsize::new(0);
/// let r = PercpuRef::new(|| {
///     releases.fetch_add(1, SeqCst);
/// })
/// .unwrap();
/// r.get_many(2); // users, on whichever CPUs they run
/// r.kill(); // the owner: atomic mode from now on, and no new users
/// assert!(!r.is_percpu() && !r.tryget_live());
/// r.put_many(2); // the last users leave
/// assert_eq!(releases.load(SeqCst), 1);
/// ```
impl<F: Fn() + Send + Sync> PercpuRef<F> {
    /// A ref in per-CPU mode holding the initial reference; `release` runs when the count
    /// reaches zero. Fails only if the kernel refuses the memory for the per-CPU slots.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// assert!(r.is_percpu() && !r.is_dying() && !r.is_zero());
    /// ```
    pub fn new(release: F) -> Result<Self, AllocError> {
        Self::with_init(release, Init::PerCpu)
    }

    /// A ref that starts as `init` says.
    ///
    /// ```
    /// use scalemem::refcount::{Init, PercpuRef};
    /// let r = PercpuRef::with_init(|| {}, Init::Dead).unwrap();
    /// assert!(r.is_dying() && r.is_zero() && !r.tryget());
    /// assert!(r.reinit());
    /// assert!(r.is_percpu() && r.tryget_live());
    /// # r.put();
    /// ```
    pub fn with_init(release: F, init: Init) -> Result<Self, AllocError> {
        Ok(Self { raw: RawRef::new(init)?, release })
    }

    /// Takes a reference. The caller must already hold one (or know the count cannot be
    /// zero); use [`tryget`](Self::tryget) or [`tryget_live`](Self::tryget_live)
    /// otherwise.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get(); // we hold the initial reference, so the count is not zero
    /// assert_eq!(r.count(), 2);
    /// r.put();
    /// ```
    #[inline]
    pub fn get(&self) {
        self.raw.get_many(1);
    }

    /// Takes `n` references at once (`n < 2^62`).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get_many(5);
    /// r.switch_to_atomic_sync(); // the per-CPU parts are summed into one count
    /// assert_eq!(r.count(), 6);
    /// r.put_many(5);
    /// ```
    #[inline]
    pub fn get_many(&self, n: usize) {
        self.raw.get_many(n);
    }

    /// Takes a reference unless the count has reached zero. Always succeeds in per-CPU
    /// mode (the count cannot be zero there), also on a killed ref that is not yet
    /// released.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.kill();
    /// assert!(!r.tryget()); // the initial reference was the last one
    /// ```
    #[inline]
    pub fn tryget(&self) -> bool {
        self.raw.tryget_many(1, false)
    }

    /// Takes a reference unless the ref has been killed (or its count reached zero).
    /// After [`kill_and_confirm`](Self::kill_and_confirm)'s `confirm` has run, every call
    /// that starts afterwards fails.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// assert!(r.tryget_live());
    /// r.kill();
    /// assert!(!r.tryget_live());
    /// assert!(r.tryget()); // still alive: the reference taken above is held
    /// r.put();
    /// r.put();
    /// ```
    #[inline]
    pub fn tryget_live(&self) -> bool {
        self.raw.tryget_many(1, true)
    }

    /// Drops a reference; runs `release` if it was the last.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    /// let released = AtomicBool::new(false);
    /// let r = scalemem::refcount::PercpuRef::new(|| released.store(true, SeqCst)).unwrap();
    /// r.get();
    /// r.kill();
    /// assert!(!released.load(SeqCst));
    /// r.put(); // the last reference
    /// assert!(released.load(SeqCst) && r.is_zero());
    /// ```
    #[inline]
    pub fn put(&self) {
        self.put_many(1);
    }

    /// Drops `n` references at once (`n < 2^62`); runs `release` if they were the last.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    /// let released = AtomicBool::new(false);
    /// let r = scalemem::refcount::PercpuRef::new(|| released.store(true, SeqCst)).unwrap();
    /// r.get_many(3);
    /// r.put_many(3); // per-CPU: the count cannot reach zero here
    /// assert_eq!(r.count(), 1);
    /// r.get_many(3);
    /// r.kill();
    /// r.put_many(3);
    /// assert!(released.load(SeqCst));
    /// ```
    #[inline]
    pub fn put_many(&self, n: usize) {
        if self.raw.put_many(n) {
            self.release_now();
        }
    }

    #[cold]
    #[inline(never)]
    fn release_now(&self) {
        (self.release)();
        self.raw.mark_released();
    }

    /// Marks the ref dead, switches it to atomic mode and drops the initial reference
    /// (which runs `release` if it was the last). Returns `false`, doing nothing, if the
    /// ref was already dead.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// assert!(r.kill());
    /// assert!(!r.kill());
    /// assert!(r.is_zero());
    /// ```
    pub fn kill(&self) -> bool {
        self.kill_and_confirm(|_| {})
    }

    /// [`kill`](Self::kill), running `confirm` once every CPU is guaranteed to see the ref
    /// as dead: from then on, every [`tryget_live`](Self::tryget_live) that starts fails.
    /// `confirm` runs on the calling thread, before the initial reference is dropped (so
    /// the ref is still alive in it), under the switch lock: it must not call the switch
    /// functions of this ref (`switch_*`, `kill*`, `resurrect`, `reinit`), which would
    /// deadlock. Returns `false` (without running `confirm`) if the ref was already dead.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// let mut confirmed = false;
    /// r.kill_and_confirm(|r| {
    ///     assert!(!r.tryget_live());
    ///     confirmed = true;
    /// });
    /// assert!(confirmed);
    /// ```
    pub fn kill_and_confirm(&self, confirm: impl FnOnce(&Self)) -> bool {
        match self.raw.kill(|| confirm(self)) {
            None => false,
            Some(zero) => {
                if zero {
                    self.release_now();
                }
                true
            }
        }
    }

    /// Switches to atomic mode and keeps it there (until
    /// [`switch_to_percpu`](Self::switch_to_percpu)); runs `confirm` once every CPU sees
    /// atomic mode, on the calling thread and under the switch lock (see
    /// [`kill_and_confirm`](Self::kill_and_confirm) for what it must not do). In Linux
    /// this call is asynchronous; here the switch is complete when it returns.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.switch_to_atomic(|r| assert!(!r.is_percpu()));
    /// r.switch_to_percpu();
    /// assert!(r.is_percpu());
    /// ```
    pub fn switch_to_atomic(&self, confirm: impl FnOnce(&Self)) {
        if self.raw.switch_to_atomic(|| confirm(self)) {
            self.release_now();
        }
    }

    /// Switches to atomic mode (and keeps it there), returning once the switch is
    /// complete.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.switch_to_atomic_sync();
    /// r.get();
    /// r.put();
    /// assert!(!r.is_percpu() && !r.is_zero());
    /// ```
    pub fn switch_to_atomic_sync(&self) {
        self.switch_to_atomic(|_| {});
    }

    /// Allows per-CPU mode again and switches to it, unless the ref is dead (then it
    /// switches when [`resurrect`](Self::resurrect)ed or [`reinit`](Self::reinit)ed) or its
    /// count has reached zero (a released ref stays atomic). Cheap: no fence.
    ///
    /// ```
    /// use scalemem::refcount::{Init, PercpuRef};
    /// let r = PercpuRef::with_init(|| {}, Init::Atomic).unwrap();
    /// r.switch_to_percpu();
    /// assert!(r.is_percpu());
    /// r.kill();
    /// r.switch_to_percpu(); // dead (and released): stays atomic
    /// assert!(!r.is_percpu() && r.is_zero());
    /// ```
    pub fn switch_to_percpu(&self) {
        self.raw.switch_to_percpu();
    }

    /// Undoes [`kill`](Self::kill) for a ref that is dead but not released: takes a new
    /// initial reference, clears the dead flag and returns to per-CPU mode (unless
    /// [`switch_to_atomic`](Self::switch_to_atomic) forced atomic mode). Returns `false`,
    /// doing nothing, if the ref is not dead or its count already reached zero (use
    /// [`reinit`](Self::reinit) then).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get();
    /// r.kill();
    /// assert!(r.resurrect());
    /// assert!(r.is_percpu() && r.tryget_live());
    /// r.put();
    /// r.put();
    /// ```
    pub fn resurrect(&self) -> bool {
        self.raw.resurrect()
    }

    /// Starts a new lifetime for a ref whose count reached zero: waits until its
    /// `release` has returned, then takes a new initial reference, clears the dead flag
    /// and returns to per-CPU mode (unless forced atomic). Returns `false`, doing nothing,
    /// if the count is not zero. Must not be called from `release` itself (it would wait
    /// for itself).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// assert!(!r.reinit()); // alive
    /// r.kill();
    /// assert!(r.reinit());
    /// assert!(r.is_percpu() && !r.is_dying());
    /// # r.kill();
    /// ```
    pub fn reinit(&self) -> bool {
        self.raw.reinit()
    }

    /// Whether the count has reached zero (always `false` in per-CPU mode).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get();
    /// r.kill();
    /// assert!(!r.is_zero()); // our reference is still held
    /// r.put();
    /// assert!(r.is_zero());
    /// ```
    pub fn is_zero(&self) -> bool {
        self.raw.is_zero()
    }

    /// Whether the ref has been killed (and not resurrected).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get();
    /// r.kill();
    /// assert!(r.is_dying());
    /// assert!(r.resurrect());
    /// assert!(!r.is_dying());
    /// r.put();
    /// ```
    pub fn is_dying(&self) -> bool {
        self.raw.is_dying()
    }

    /// Whether the ref is in per-CPU mode now (a hint: a switch may be racing).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// assert!(r.is_percpu());
    /// r.switch_to_atomic_sync();
    /// assert!(!r.is_percpu());
    /// ```
    pub fn is_percpu(&self) -> bool {
        self.raw.is_percpu()
    }

    /// The count, summed over the per-CPU parts: exact when no get or put races with
    /// it, a hint otherwise (a diagnostic, and what tests check).
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get_many(3);
    /// assert_eq!(r.count(), 4);
    /// # r.put_many(3);
    /// ```
    pub fn count(&self) -> usize {
        self.raw.count_hint()
    }

    /// Checks the invariants that hold while no operation runs concurrently (panics if
    /// one is broken): for tests, models and stress runs.
    ///
    /// ```
    /// let r = scalemem::refcount::PercpuRef::new(|| {}).unwrap();
    /// r.get_many(2);
    /// r.assert_valid(); // per-CPU: unsealed slots, a biased count
    /// r.kill();
    /// r.assert_valid(); // atomic: sealed slots, no per-CPU part left
    /// r.put_many(2);
    /// assert!(r.is_zero());
    /// ```
    pub fn assert_valid(&self) {
        self.raw.assert_valid();
    }
}

impl<F: Fn() + Send + Sync> fmt::Debug for PercpuRef<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PercpuRef")
            .field("count", &self.count())
            .field("percpu", &self.is_percpu())
            .field("dying", &self.is_dying())
            .field("zero", &self.is_zero())
            .field("sections", &self.raw.sections)
            .finish()
    }
}
