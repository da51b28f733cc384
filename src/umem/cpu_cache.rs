//! [`CpuCaches`]: the per-CPU magazine layer of one object cache. Each CPU holds a
//! *loaded* and a *previous* magazine; allocation pops rounds from the loaded one, free
//! pushes them, and the depot (`depot.rs`) supplies full and empty magazines.
//!
//! # Per-CPU state
//!
//! A CPU's slot is `{ stop, state, mags: [*mut Magazine; 3] }` (the layout of
//! [`rseq::mag_layout`]). The state word packs the loaded magazine's index, round count
//! and capacity, and the previous magazine's index, round count and capacity (capacity
//! 0: no magazine). The third magazine word is scratch. **Every change of a slot commits
//! with one store of the state word**:
//!
//! | transition | condition on the state | commit |
//! |---|---|---|
//! | pop (alloc fast path) | `rounds > 0` | `rounds - 1` ([`rseq::mag_pop`]) |
//! | push (free fast path) | `rounds < cap` | `rounds + 1` ([`rseq::mag_push`]) |
//! | swap (alloc) | `rounds == 0`, previous holds rounds (full) | loaded and previous fields exchanged |
//! | swap (free) | `rounds == cap` (full or none), previous empty | the same |
//! | depot exchange (alloc) | `rounds == 0`, previous empty or none | new magazine (full) in the scratch word becomes loaded, loaded becomes previous, previous is handed out (to the depot's empty list) |
//! | depot exchange (free) | `rounds == cap`, previous full or none | the same with an empty magazine; the old previous goes to the full list |
//!
//! The swaps and exchanges are all one section, [`rseq::mag_exchange`]: "if the state
//! still equals the snapshot I decided on, store the new magazine into the scratch word,
//! read the previous magazine's word, commit the new state". The new magazine is taken
//! from the depot (or made) *before* the section; if the section fails (the state moved,
//! the slot is stopped) the magazine goes back to the depot and the thread decides again.
//!
//! # Why a migration or a signal cannot lose or duplicate a round
//!
//! - In rseq mode only the sections write a slot's state and magazine words (besides a
//!   reconfiguration, which first stops the slot, below), and each section ends in its
//!   one committing store. A thread preempted, migrated or signalled before the commit is
//!   restarted from the top and re-reads the CPU number and the state, so it commits only
//!   on the CPU it runs on, to a state it has just read: no two commits to one slot can
//!   interleave, and an uncommitted attempt leaves nothing anyone reads (a round written
//!   above the count, a magazine written into the scratch word).
//! - The snapshot a thread decides on may be stale or come from another CPU's slot (it
//!   migrated after reading it): the exchange section commits only if the slot it runs on
//!   has exactly that state, and each transition is correct for *any* slot in that state
//!   (the condition and the new state depend on the state word only; the evicted
//!   magazine is read inside the section). A stale snapshot therefore makes the section
//!   fail, never corrupt.
//! - A pop returns the round only after its commit, and a push's round becomes visible
//!   only through its commit; a failed free returns the round to the caller (`Err`), a
//!   failed alloc returns `None`: each round is in exactly one place at every moment.
//! - Invariant: the previous magazine is always full, empty or absent (each transition
//!   moves a loaded magazine to "previous" only when it is empty, or full/absent), so the
//!   full list holds only full magazines and the empty list only empty ones.
//!
//! # Fallback: locked mode
//!
//! Without rseq (`SCALEMEM_RSEQ=0`, glibc without rseq, another architecture, loom, or a
//! kernel without `MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ`) the stop word is a try-lock:
//! the same operations and the same state words, each under the slot's lock (taken
//! with an Acquire CAS from 0, released with a Release store). A busy lock is a miss,
//! never a wait. The mode is chosen once, at construction ([`CpuCaches::new`]), or forced
//! with [`CpuCaches::new_locked`]. In rseq mode, a thread whose own rseq registration
//! failed (glibc reports it per thread) cannot run the sections: every call it makes is a
//! miss, and its objects go straight to the layer below.
//!
//! # Reconfiguration: stop flag + `heavy_rseq`, not `RmLock`
//!
//! [`drain`](CpuCaches::drain) and resizing must see every CPU's magazines while no fast
//! path changes them. Rseq mode uses the *stop flag + [`fence::heavy_rseq`]* protocol
//! (tcmalloc's): the reconfigurer, holding the cache's reconfiguration mutex, stores
//! `STOPPED` into every slot's stop word (SeqCst), then calls `heavy_rseq`
//! (`membarrier(PRIVATE_EXPEDITED_RSEQ)`), which restarts every section in flight on
//! every CPU. Each section reads the stop word between its start and its commit, so after
//! `heavy_rseq` returns no section that saw the slot running can commit, and every later
//! one sees `STOPPED` and fails: the slots are frozen, and (membarrier being a full
//! barrier on every CPU) their last commits are visible to the reconfigurer. It drains
//! them, writes the initial state, and clears the stop words (Release: a section that
//! reads 0 sees the drained state). We chose this over [`RmLock`](crate::rmlock::RmLock)
//! because the fast path then pays nothing beyond its own section: one load and compare
//! of a word on the cache line the section touches anyway, no counter update, no fence.
//! An `RmLock` read side would add two rseq additions and a compiler fence per
//! operation. In locked mode the reconfigurer takes each slot's lock (spinning; holders
//! are short).
//!
//! The rounds a drain takes go to a caller's sink, which may run user code (an object
//! cache's destructor) and panic. A slot therefore lets go of its magazines (writes the
//! initial state) before it hands their first round over, and the slots are restarted
//! and the mutex released on every way out of a reconfiguration, unwinding included: a
//! panicking sink leaks the rounds it did not get (never hands them out twice) and
//! leaves the layer working.
//!
//! # Idle CPUs
//!
//! A CPU the program stops running on keeps its loaded and previous magazines, and the
//! working-set reap, which frees only the depot's idle magazines, never sees them: on a
//! many-core machine whose load shrinks to a few CPUs, every other CPU would hold its
//! rounds for as long as the class stays in use elsewhere (tcmalloc drains the caches of
//! CPUs the process no longer runs on for the same reason).
//! [`drain_idle`](CpuCaches::drain_idle), called once per working-set interval, drains
//! exactly the slots whose state word did not change since its previous call and that
//! hold at least as many rounds as the caller finds worth a stop (an object cache: 64
//! KiB of objects by default, [`Config::idle_drain`](crate::umem::cache::Config)): under the reconfiguration mutex it stops those slots only (the
//! same stop word and, in rseq mode, the same `heavy_rseq` fence as a full
//! reconfiguration, so the argument above applies slot by slot; in locked mode a slot
//! whose lock a fast path holds is busy and is skipped), drains them, and restarts them.
//! The other CPUs' sections run on meanwhile. A full magazine of a drained slot goes to
//! the depot whole, the rest to the caller's sink. A state word that came back to the
//! same value after a second of traffic (as many pushes as pops) makes a busy CPU look
//! idle: it then refills on its next misses, from the depot (where its full magazine
//! went) or the layer below.
//!
//! # Sizing
//!
//! Each [`update`](CpuCaches::update) ends an interval: the depot's working set moves on
//! (`depot.rs`); if the depot saw more than [`Config::grow_contention`] failed CAS
//! attempts or retried pops during the interval the magazine size grows one step of libumem's ladder
//! (1, 3, 7, 15, 31, 47, 63, 95, 143, bounded by [`Config::max_rounds`]); if it saw none
//! and at least [`Config::shrink_idle`] magazines sat idle in the depot for the whole
//! previous interval, it shrinks a step (libumem never shrinks). A resize drains every
//! CPU and purges the depot, so the new size applies at once; magazines of the old size
//! still in flight keep working (each magazine records its own capacity).
//! [`grow_if_contended`](CpuCaches::grow_if_contended) applies the growth half of the
//! rule at once, for a caller that checks every few milliseconds (umem's global heap
//! does on every 10 ms maintenance tick): magazines too small for a workload's bursts
//! show as depot contention within a tick, long before an interval ends.
//! [`grow_if_exchanging`](CpuCaches::grow_if_exchanging) grows them on the rate of
//! exchanges with the depot instead, contended or not, up to a bound the caller gives
//! (the global heap: about 1 MiB of objects per magazine): one thread whose bursts
//! exceed its CPU's two magazines never contends, but trades magazines with the depot
//! all the time (tcmalloc and jemalloc size their caches on such misses too). Neither
//! resizes a layer already at the ladder's top (or its bound): a resize to the same size
//! would still drain every CPU. An owner that shares a memory budget among layers
//! (umem's global heap: one cap per CPU on all its size classes' magazines) caps what
//! the growth rules may reach with `set_growth_cap` and moves room from an idle layer to
//! a busy one with `shrink_step`; a cap stops growth, it never shrinks a layer itself.

use core::ptr::{NonNull, null_mut};

use super::depot::Depot;
use super::magazine::Magazine;
use crate::cpu::rseq::mag_layout::{
    BYTE_MASK, CAP_MASK, CAP_SHIFT, LOADED_SHIFT, MAGS, MAX_CAP, PREV_CAP_SHIFT, PREV_ROUNDS_SHIFT, PREV_SHIFT,
    ROUNDS_MASK,
};
use crate::cpu::{self, PerCpu, fence, rseq};
use crate::epoch;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use crate::util::{AllocError, Backoff};

/// libumem's magazine sizes.
const LADDER: [usize; 9] = [1, 3, 7, 15, 31, 47, 63, 95, 143];

/// The ladder's next size above `size` (`size` itself past the top).
fn ladder_up(size: usize) -> usize {
    LADDER.iter().copied().find(|&r| r > size).unwrap_or(size)
}

/// The ladder's next size below `size`, not below `min` (`size` itself at the bottom).
fn ladder_down(size: usize, min: usize) -> usize {
    LADDER.iter().rev().copied().find(|&r| r < size).unwrap_or(size).max(min)
}

/// Whether the monotone counter now at `now` moved more than `threshold` since the value
/// `last` holds, which becomes `now` either way: each check measures from the previous
/// one, so a threshold is a rate per checking interval. (Recording only past the
/// threshold made it a count since the last growth: a class trading a magazine once a
/// minute would have grown a step every hour.)
fn moved_past(last: &AtomicUsize, now: usize, threshold: usize) -> bool {
    // Relaxed: a statistic; concurrent callers at worst both see one delta.
    now.wrapping_sub(last.swap(now, Ordering::Relaxed)) > threshold
}

/// A reconfiguration in progress ([`CpuCaches::reconfigure`]): dropping it, at the end or
/// while a panicking sink unwinds, restarts the slots if they are still stopped and
/// releases the reconfiguration flag, so that a destructor's panic leaves the layer
/// working (the slots' states were reset before any round reached the sink, see
/// `Slot::drain_exclusive`) rather than stopped with the flag taken, where every later
/// drain, the layer's own `Drop` included, would wait for ever.
struct Reconfiguring<'a> {
    caches: &'a CpuCaches,
    /// The slots are stopped (drained or being drained).
    stopped: bool,
}

impl Drop for Reconfiguring<'_> {
    fn drop(&mut self) {
        if self.stopped {
            self.caches.unstop_stopped();
        }
        // Release: pairs with the Acquire that takes the flag in `reconfigure`: the next
        // reconfigurer sees this one's slot and depot changes.
        self.caches.reconfig.store(false, Ordering::Release);
    }
}

/// Stop word values. `FREE`: the fast path may run. `LOCKED`: a locked-mode operation
/// holds the slot. `STOPPED`: a reconfiguration owns the slot.
const FREE: usize = 0;
const LOCKED: usize = 1;
const STOPPED: usize = 2;

/// How many times a locked-mode operation tries its slot's lock before missing.
const LOCK_TRIES: usize = 2;
/// How many decisions a slow path makes before giving up (a miss).
const SLOW_TRIES: usize = 4;

/// Tuning of a [`CpuCaches`].
///
/// ```
/// let config = scalemem::umem::cpu_cache::Config { initial_rounds: 2, ..Default::default() };
/// assert_eq!(config.initial_rounds, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Rounds per magazine at first (`1..=255`).
    pub initial_rounds: usize,
    /// The smallest size shrinking may reach.
    pub min_rounds: usize,
    /// The largest size growth may reach (at most 255).
    pub max_rounds: usize,
    /// Grow when more than this many depot CAS attempts failed in one interval
    /// (libumem: 2, counting failed lock attempts).
    pub grow_contention: usize,
    /// Shrink when the depot saw no contention and at least this many magazines were
    /// idle for a whole interval.
    pub shrink_idle: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self { initial_rounds: 15, min_rounds: 1, max_rounds: 143, grow_contention: 2, shrink_idle: 8 }
    }
}

/// A snapshot of a [`CpuCaches`], read with relaxed loads (exact when quiescent).
///
/// ```
/// use std::ptr::NonNull;
/// use scalemem::umem::{Config, CpuCaches};
/// let caches = CpuCaches::new(Config { initial_rounds: 2, ..Config::default() }).unwrap();
/// let mut objects = [0u64; 5];
/// for object in &mut objects {
///     let _ = caches.free(NonNull::from(object).cast());
/// }
/// let stats = caches.stats();
/// // Each round is on some CPU or in a full depot magazine of 2 (unless a free missed).
/// assert!(stats.cpu_rounds + 2 * stats.depot_full <= 5);
/// assert_eq!(stats.magazine_size, 2);
/// # caches.drain(|_| {});
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Rounds held in the CPUs' loaded and previous magazines.
    pub cpu_rounds: usize,
    /// Full magazines in the depot.
    pub depot_full: usize,
    /// Empty magazines in the depot.
    pub depot_empty: usize,
    /// Rounds per magazine made from now on.
    pub magazine_size: usize,
    /// Failed depot CAS attempts since creation.
    pub contention: usize,
    /// Magazines the CPUs installed from the depot since creation (a full one taken for
    /// an empty one, or an empty one for a full one).
    pub exchanges: usize,
    /// Resizes since creation.
    pub resizes: usize,
    /// CPUs drained by [`CpuCaches::drain_idle`] since creation.
    pub idle_drains: usize,
}

/// One CPU's state word, decoded (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State(u64);

impl State {
    /// Nothing loaded (index 0), nothing previous (index 1).
    const INITIAL: State = State(1 << PREV_SHIFT);

    fn rounds(self) -> usize {
        (self.0 & ROUNDS_MASK) as usize
    }
    fn cap(self) -> usize {
        ((self.0 >> CAP_SHIFT) & CAP_MASK) as usize
    }
    fn loaded(self) -> usize {
        ((self.0 >> LOADED_SHIFT) & BYTE_MASK) as usize
    }
    fn prev(self) -> usize {
        ((self.0 >> PREV_SHIFT) & BYTE_MASK) as usize
    }
    fn prev_rounds(self) -> usize {
        ((self.0 >> PREV_ROUNDS_SHIFT) & BYTE_MASK) as usize
    }
    fn prev_cap(self) -> usize {
        ((self.0 >> PREV_CAP_SHIFT) & BYTE_MASK) as usize
    }
    /// The magazine word neither loaded nor previous.
    fn spare(self) -> usize {
        3 - self.loaded() - self.prev()
    }

    fn make(loaded: usize, rounds: usize, cap: usize, prev: usize, prev_rounds: usize, prev_cap: usize) -> State {
        debug_assert!(loaded != prev && loaded < 3 && prev < 3 && rounds <= cap && prev_rounds <= prev_cap);
        State(
            rounds as u64
                | (cap as u64) << CAP_SHIFT
                | (loaded as u64) << LOADED_SHIFT
                | (prev as u64) << PREV_SHIFT
                | (prev_rounds as u64) << PREV_ROUNDS_SHIFT
                | (prev_cap as u64) << PREV_CAP_SHIFT,
        )
    }

    /// Loaded and previous exchanged.
    fn swapped(self) -> State {
        State::make(self.prev(), self.prev_rounds(), self.prev_cap(), self.loaded(), self.rounds(), self.cap())
    }

    /// A new magazine (`rounds` of `cap`) in the spare word becomes loaded; loaded becomes
    /// previous; previous leaves.
    fn installed(self, rounds: usize, cap: usize) -> State {
        State::make(self.spare(), rounds, cap, self.loaded(), self.rounds(), self.cap())
    }
}

/// One CPU's slot, in the layout of [`rseq::mag_layout`].
#[repr(C)]
struct Slot {
    /// `FREE`, `LOCKED` (locked mode) or `STOPPED`. Rseq mode: written only by the
    /// reconfigurer; the sections read it.
    stop: AtomicUsize,
    /// The state word. Rseq mode: written by the sections (plain stores, single-copy
    /// atomic on x86-64) and by the reconfigurer of a stopped slot; locked mode: under
    /// the lock.
    state: AtomicUsize,
    /// Magazines; which is which is in `state`. Written like `state`.
    mags: [AtomicPtr<Magazine>; 3],
    /// The state word [`drain_idle`](CpuCaches::drain_idle) saw at its previous call
    /// (written only by it, under the reconfiguration mutex; no section reads it).
    seen: AtomicUsize,
}

impl Slot {
    fn new() -> Self {
        Self {
            stop: AtomicUsize::new(FREE),
            state: AtomicUsize::new(State::INITIAL.0 as usize),
            mags: core::array::from_fn(|_| AtomicPtr::new(null_mut())),
            seen: AtomicUsize::new(State::INITIAL.0 as usize),
        }
    }

    // Relaxed in the `*_exclusive` methods and `snapshot`: exclusive access (the lock,
    // whose Acquire/Release order the holders; or a stopped slot, ordered by
    // `heavy_rseq`) serialises every access; the snapshot is re-checked by the exchange.

    fn snapshot(&self) -> State {
        State(self.state.load(Ordering::Relaxed) as u64)
    }

    fn set_state(&self, state: State) {
        // Relaxed: exclusive access (see above).
        self.state.store(state.0 as usize, Ordering::Relaxed);
    }

    fn mag(&self, index: usize) -> Option<NonNull<Magazine>> {
        // Relaxed: exclusive access (see above). `get`, not indexing (a state's indexes
        // are below 3): no allocator path may hold a formatting panic.
        NonNull::new(self.mags.get(index)?.load(Ordering::Relaxed))
    }

    /// Pops a round; requires exclusive access.
    fn pop_exclusive(&self) -> Option<NonNull<u8>> {
        let state = self.snapshot();
        let rounds = state.rounds();
        if rounds == 0 {
            return None;
        }
        let mag = self.mag(state.loaded())?;
        // SAFETY: exclusive access; the loaded magazine is live (it is in this slot) and
        // its first `rounds <= cap` words hold rounds.
        let round = unsafe { *Magazine::round(mag, rounds - 1) };
        self.set_state(State(state.0 - 1));
        NonNull::new(round)
    }

    /// Pushes a round; requires exclusive access.
    fn push_exclusive(&self, round: NonNull<u8>) -> bool {
        let state = self.snapshot();
        let rounds = state.rounds();
        if rounds >= state.cap() {
            return false;
        }
        let Some(mag) = self.mag(state.loaded()) else { return false };
        // SAFETY: exclusive access; the loaded magazine is live with `cap > rounds` words.
        unsafe { *Magazine::round(mag, rounds) = round.as_ptr() };
        self.set_state(State(state.0 + 1));
        true
    }

    /// [`rseq::mag_exchange`] under exclusive access.
    fn exchange_exclusive(&self, expected: State, new: State, item: *mut Magazine) -> Option<*mut Magazine> {
        if self.snapshot() != expected {
            return None;
        }
        // (`get`: as in `mag`; a state's indexes are below 3.)
        let (Some(spare), Some(prev)) = (self.mags.get(expected.spare()), self.mags.get(expected.prev())) else {
            return None;
        };
        // Relaxed: under the lock (see above).
        spare.store(item, Ordering::Relaxed);
        let evicted = prev.load(Ordering::Relaxed);
        self.set_state(new);
        Some(evicted)
    }

    /// Takes the loaded and previous magazines out (rounds to `sink`, magazines retired)
    /// and resets the state; requires exclusive access. With a `depot`
    /// ([`CpuCaches::drain_idle`]) a full magazine goes to its full list whole instead
    /// (its rounds stay cached for whichever CPU wants them next, and the working-set
    /// reap frees it after an interval in which none does).
    fn drain_exclusive(&self, depot: Option<&Depot>, sink: &mut dyn FnMut(NonNull<u8>), guard: &epoch::Guard) {
        let state = self.snapshot();
        // The slot lets go of both magazines before any round reaches `sink`: a sink that
        // panics (an object cache's destructor) then leaks the rounds not yet handed over,
        // with their magazine, instead of leaving them in a state that would hand them
        // out again or give them to a later drain a second time.
        self.set_state(State::INITIAL);
        for (index, rounds, cap) in
            [(state.loaded(), state.rounds(), state.cap()), (state.prev(), state.prev_rounds(), state.prev_cap())]
        {
            if cap == 0 {
                continue;
            }
            let Some(mag) = self.mag(index) else {
                debug_assert!(false, "cpu_cache: a present magazine is null");
                continue;
            };
            if let Some(depot) = depot
                && rounds == cap
            {
                // Ours (the slot is stopped and reset), full: the depot's full list takes
                // exactly such magazines.
                depot.push_full(mag);
                continue;
            }
            // SAFETY: exclusive access to a stopped/locked slot: the magazine is ours,
            // with `rounds` valid rounds.
            unsafe { Magazine::empty_into(mag, rounds, sink) };
            // SAFETY: after the reset below no state references it, and no section is in
            // flight on a stopped slot; retired once.
            unsafe { Magazine::retire(mag, guard) };
        }
    }
}

/// The slots of a rseq-mode [`CpuCaches`], reduced to what its hit sections need (the
/// base address and the slot count; slots are `SLOT_STRIDE` apart, `PerCpu`'s spacing).
/// [`CpuCaches::raw_slots`] makes one; a caller that keeps it in a table of its own (the
/// global heap's per-class table) reaches the current CPU's slot without loading the
/// layer first. Valid while the layer lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawSlots {
    pub(crate) base: *mut u8,
    pub(crate) ncpus: usize,
}

impl RawSlots {
    /// A pop from the current CPU's loaded magazine (no swap, no depot): one rseq
    /// section; `None` when it is empty or missing, the slot is stopped, or this thread
    /// has no rseq registration.
    ///
    /// # Safety
    /// 1. `self` came from [`CpuCaches::raw_slots`] of a layer that is still alive.
    #[inline(always)]
    pub(crate) unsafe fn pop(self) -> Option<NonNull<u8>> {
        // Unchecked: rseq mode was chosen after rseq_enabled(); a thread without a
        // registration fails the section and takes the slow path.
        let offset = rseq::thread_offset_unchecked();
        // SAFETY: (1) this thread's area's offset from the thread pointer (unchecked: see
        // the module doc of cpu::rseq; the layer chose rseq mode after rseq_enabled(),
        // and `self` reached us from it). (2) By (1), `ncpus` initialised slots of the mag_layout layout
        // (checked at compile time) at base + cpu * SLOT_STRIDE, alive with the layer; a
        // slot's state and magazine words are consistent whenever no section is
        // mid-flight (every change commits with the state store). (3) In rseq mode only
        // the sections and a reconfigurer that stopped the slot write them.
        NonNull::new(unsafe { rseq::mag_pop_tp(offset, self.base, self.ncpus) }.cast::<u8>())
    }

    /// A push of `round` into the current CPU's loaded magazine if it has room (no swap,
    /// no depot): one rseq section; false otherwise, the round still the caller's.
    ///
    /// # Safety
    /// As [`pop`](Self::pop); `round` is an object the layer may hold (as for
    /// [`CpuCaches::free`]).
    #[inline(always)]
    pub(crate) unsafe fn push(self, round: NonNull<u8>) -> bool {
        // Unchecked: as in `pop`.
        let offset = rseq::thread_offset_unchecked();
        // SAFETY: as in `pop`.
        unsafe { rseq::mag_push_tp(offset, self.base, self.ncpus, round.as_ptr().cast()) }
    }
}

/// How the slots synchronise; fixed at construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rseq,
    Locked,
}

/// The per-CPU magazine layer of one object cache, generic over what lies below: it
/// stores opaque, already constructed object pointers ("rounds") and never dereferences
/// them.
///
/// - [`alloc`](Self::alloc) returns a round, or `None` on a miss: the caller then takes
///   an object from the slab layer and runs the constructor.
/// - [`free`](Self::free) keeps a round, or hands it back (`Err`) when there is no room:
///   the caller runs the destructor and frees it to the slab layer.
/// - [`drain`](Self::drain), [`reap`](Self::reap) and [`update`](Self::update) give rounds
///   back through a sink, for reconfiguration and memory pressure.
///
/// Nothing here allocates through the global allocator: slots come from
/// [`PerCpu`] (mmap), magazines from an mmap-backed pool. A refused mmap is a miss.
///
/// ```
/// use scalemem::umem::cpu_cache::{Config, CpuCaches};
/// use std::ptr::NonNull;
///
/// let caches = CpuCaches::new(Config { initial_rounds: 2, ..Config::default() }).unwrap();
/// assert_eq!(caches.alloc(), None); // nothing cached yet: the caller uses the slab layer
/// let mut objects = [0u64; 3];
/// for object in &mut objects {
///     // The caller would otherwise destruct the object and return it to its slab.
///     let _ = caches.free(NonNull::from(object).cast::<u8>());
/// }
/// let round = caches.alloc(); // an object freed above, if this thread's CPU has it
/// let mut back = Vec::from_iter(round);
/// caches.drain(|object| back.push(object));
/// assert_eq!(back.len(), 3);
/// ```
pub struct CpuCaches {
    slots: PerCpu<Slot>,
    depot: Depot,
    mode: Mode,
    config: Config,
    /// Rounds of the magazines made from now on.
    mag_rounds: AtomicUsize,
    /// The reconfigurers' mutex (drain, resize).
    reconfig: AtomicBool,
    /// Depot contention at the last `update`.
    last_contention: AtomicUsize,
    /// The depot contention at the last [`grow_if_contended`](CpuCaches::grow_if_contended).
    tick_contention: AtomicUsize,
    /// The depot exchanges at the last [`grow_if_exchanging`](CpuCaches::grow_if_exchanging).
    tick_exchanges: AtomicUsize,
    resizes: AtomicUsize,
    /// CPUs drained by `drain_idle` (a statistic).
    idle_drains: AtomicUsize,
    /// The most rounds any growth rule may reach now, below [`Config::max_rounds`]: set
    /// by an owner that shares a memory budget among layers (umem's global heap bounds
    /// the magazine capacity of all its size classes per CPU). `usize::MAX`: no cap.
    growth_cap: AtomicUsize,
}

// SAFETY: every field is Sync/Send except the raw magazine pointers inside the slots
// (AtomicPtr is Send + Sync) and the rounds, which are opaque addresses never
// dereferenced (like AtomicPtr<u8>). Per-CPU state is synchronised by rseq or the slot
// locks (module documentation); the depot by its atomics and the epoch.
unsafe impl Send for CpuCaches {}
// SAFETY: see the Send impl.
unsafe impl Sync for CpuCaches {}

// The layout the rseq sections rely on (not under loom, whose atomics are larger and
// where no section runs).
#[cfg(not(scalemem_loom))]
const _: () = assert!(
    core::mem::offset_of!(Slot, stop) == crate::cpu::rseq::mag_layout::STOP
        && core::mem::offset_of!(Slot, state) == crate::cpu::rseq::mag_layout::STATE
        && core::mem::offset_of!(Slot, mags) == MAGS
        && PerCpu::<Slot>::STRIDE == crate::cpu::rseq::mag_layout::SLOT_STRIDE
        && size_of::<AtomicUsize>() == 8
        && size_of::<AtomicPtr<Magazine>>() == 8
);

/// Making a layer, caching rounds and taking them back out.
///
/// ```
/// use std::ptr::NonNull;
/// use scalemem::umem::cpu_cache::CpuCaches;
///
/// let caches = CpuCaches::new(Default::default()).unwrap();
/// let mut objects = [0u64; 3];
/// let mut refused = 0; // a free with no room goes to the layer below
/// for object in &mut objects {
///     refused += usize::from(caches.free(NonNull::from(object).cast()).is_err());
/// }
/// let mut drained = 0;
/// caches.drain(|_| drained += 1);
/// assert_eq!(drained + refused, 3); // each round in exactly one place
/// assert!(caches.holds_nothing());
/// ```
impl CpuCaches {
    /// An empty layer, in rseq mode where [`cpu::rseq_enabled`] and the kernel offers
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ`, in locked mode otherwise. Fails only if
    /// the kernel refuses the memory for the per-CPU slots.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.stats().cpu_rounds, 0);
    /// ```
    pub fn new(config: Config) -> Result<Self, AllocError> {
        // heavy_rseq() here also registers membarrier and tells whether the kernel can
        // stop rseq sections, which reconfiguration relies on.
        let rseq = cpu::rseq_enabled() && fence::heavy_rseq();
        Self::with_mode(config, if rseq { Mode::Rseq } else { Mode::Locked })
    }

    /// An empty layer in locked mode, even where rseq is available (to test or compare
    /// the fallback).
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new_locked(Default::default()).unwrap();
    /// assert!(!caches.uses_rseq());
    /// ```
    pub fn new_locked(config: Config) -> Result<Self, AllocError> {
        Self::with_mode(config, Mode::Locked)
    }

    fn with_mode(config: Config, mode: Mode) -> Result<Self, AllocError> {
        let clamp = |rounds: usize| rounds.clamp(1, MAX_CAP);
        let config = Config {
            initial_rounds: clamp(config.initial_rounds),
            min_rounds: clamp(config.min_rounds.min(config.initial_rounds)),
            max_rounds: clamp(config.max_rounds.max(config.initial_rounds)),
            ..config
        };
        Ok(Self {
            slots: PerCpu::new(|_| Slot::new())?,
            depot: Depot::new(),
            mode,
            config,
            mag_rounds: AtomicUsize::new(config.initial_rounds),
            reconfig: AtomicBool::new(false),
            last_contention: AtomicUsize::new(0),
            tick_contention: AtomicUsize::new(0),
            tick_exchanges: AtomicUsize::new(0),
            resizes: AtomicUsize::new(0),
            idle_drains: AtomicUsize::new(0),
            growth_cap: AtomicUsize::new(usize::MAX),
        })
    }

    /// Whether the per-CPU operations are rseq sections (else per-CPU try-locks).
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// let _fast = caches.uses_rseq();
    /// ```
    #[inline]
    pub fn uses_rseq(&self) -> bool {
        self.mode == Mode::Rseq
    }

    /// The configuration in force (sizes clamped to `1..=255`).
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.config().initial_rounds, 15);
    /// ```
    pub fn config(&self) -> Config {
        self.config
    }

    /// Takes a round from the current CPU's magazines, or from a full magazine of the
    /// depot. `None` is a miss: allocate from the layer below.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert!(caches.alloc().is_none());
    /// ```
    #[inline]
    pub fn alloc(&self) -> Option<NonNull<u8>> {
        match self.pop_round() {
            Some(round) => Some(round),
            None => self.alloc_slow(),
        }
    }

    /// Keeps `round` in the current CPU's magazines (exchanging a full one for an empty
    /// one with the depot, or making an empty one, if needed). `Err(round)` when there
    /// is no room: free it to the layer below.
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// let mut object = 0u64;
    /// let kept = caches.free(NonNull::from(&mut object).cast());
    /// # let mut rest = Vec::new(); caches.drain(|p| rest.push(p));
    /// assert!(kept.is_ok() || kept == Err(NonNull::from(&mut object).cast()));
    /// ```
    #[inline]
    pub fn free(&self, round: NonNull<u8>) -> Result<(), NonNull<u8>> {
        if self.push_round(round) { Ok(()) } else { self.free_slow(round) }
    }

    /// A round from the current CPU's loaded magazine, or `None` (no depot, no swap):
    /// one rseq section, for callers with their own slow path. In locked mode always
    /// `None`: the caller's slow path takes the slot's lock ([`alloc`](Self::alloc), or
    /// [`try_pop_locked`](Self::try_pop_locked)), so the inlined hit path holds no call
    /// and keeps no registers across one.
    #[inline(always)]
    pub(crate) fn try_pop(&self) -> Option<NonNull<u8>> {
        if self.mode == Mode::Rseq { self.pop_rseq() } else { None }
    }

    /// Pushes `round` into the current CPU's loaded magazine if it has room (no depot,
    /// no swap); false otherwise, the round still the caller's. One rseq section; in
    /// locked mode always false (as [`try_pop`](Self::try_pop)).
    #[inline(always)]
    pub(crate) fn try_push(&self, round: NonNull<u8>) -> bool {
        self.mode == Mode::Rseq && self.push_rseq(round)
    }

    /// [`try_pop`](Self::try_pop)'s locked-mode counterpart: one try-lock of the current
    /// CPU's slot and a pop from its loaded magazine; `None` in rseq mode (the caller
    /// tried the section already) or if the slot stayed busy. For the callers' slow
    /// paths (inlined there, never into a hit path).
    #[inline]
    pub(crate) fn try_pop_locked(&self) -> Option<NonNull<u8>> {
        if self.mode == Mode::Locked { self.locked(cpu::current(), Slot::pop_exclusive).flatten() } else { None }
    }

    /// [`try_push`](Self::try_push)'s locked-mode counterpart (as
    /// [`try_pop_locked`](Self::try_pop_locked)); false in rseq mode.
    #[inline]
    pub(crate) fn try_push_locked(&self, round: NonNull<u8>) -> bool {
        self.mode == Mode::Locked && self.locked(cpu::current(), |slot| slot.push_exclusive(round)).unwrap_or(false)
    }

    #[inline(always)]
    fn pop_round(&self) -> Option<NonNull<u8>> {
        match self.mode {
            Mode::Rseq => self.pop_rseq(),
            Mode::Locked => self.locked(cpu::current(), Slot::pop_exclusive).flatten(),
        }
    }

    /// `pop_round` in rseq mode (the caller has checked the mode).
    #[inline(always)]
    fn pop_rseq(&self) -> Option<NonNull<u8>> {
        let (base, _, ncpus) = self.slots.raw_parts();
        // SAFETY: this layer's own slots, in rseq mode (the caller's check), alive with
        // &self: what `RawSlots::pop` asks.
        unsafe { RawSlots { base, ncpus }.pop() }
    }

    /// The rseq-mode slots as a [`RawSlots`] handle, for a caller that keeps it where its
    /// fast path finds it in fewer loads than through `self`; `None` in locked mode.
    #[inline]
    pub(crate) fn raw_slots(&self) -> Option<RawSlots> {
        let (base, _, ncpus) = self.slots.raw_parts();
        (self.mode == Mode::Rseq).then_some(RawSlots { base, ncpus })
    }

    #[inline(always)]
    fn push_round(&self, round: NonNull<u8>) -> bool {
        match self.mode {
            Mode::Rseq => self.push_rseq(round),
            Mode::Locked => self.locked(cpu::current(), |slot| slot.push_exclusive(round)).unwrap_or(false),
        }
    }

    /// `push_round` in rseq mode (the caller has checked the mode).
    #[inline(always)]
    fn push_rseq(&self, round: NonNull<u8>) -> bool {
        let (base, _, ncpus) = self.slots.raw_parts();
        // SAFETY: as in pop_rseq.
        unsafe { RawSlots { base, ncpus }.push(round) }
    }

    /// The one-store transition of the current CPU's slot (rseq) or of slot `cpu` (locked)
    /// from `expected` to `new`, installing `item` in the spare word; returns the old
    /// previous magazine word, or `None` if the state was not `expected`.
    fn exchange(&self, cpu: usize, expected: State, new: State, item: *mut Magazine) -> Option<*mut Magazine> {
        match self.mode {
            Mode::Rseq => {
                // Unchecked: as in pop_round.
                let area = rseq::thread_area_unchecked();
                let (base, _, ncpus) = self.slots.raw_parts();
                let store_off = MAGS + 8 * expected.spare();
                let load_off = MAGS + 8 * expected.prev();
                // SAFETY: (1)-(3) as in pop_round; `new` describes the slot once `item`
                // is in the spare word (State::swapped/installed keep every magazine's
                // rounds and capacity, and `item` is the installed magazine or, for a
                // swap, a null nobody reads). (4) both offsets are magazine words and the
                // spare one is referenced by neither index of `expected`.
                let evicted = unsafe {
                    rseq::mag_exchange(area, base, ncpus, expected.0, new.0, item.cast(), store_off, load_off)
                };
                evicted.map(|p| p.cast::<Magazine>())
            }
            Mode::Locked => self.locked(cpu, |slot| slot.exchange_exclusive(expected, new, item)).flatten(),
        }
    }

    /// Runs `f` under slot `cpu`'s lock (locked mode), or `None` if it stays busy.
    #[inline]
    fn locked<R>(&self, cpu: usize, f: impl FnOnce(&Slot) -> R) -> Option<R> {
        let slot = self.slots.get(cpu);
        let backoff = Backoff::new();
        for attempt in 0..LOCK_TRIES {
            // Acquire: pairs with the Release unlocks below and in `unstop_stopped`, so this
            // holder sees the slot and its magazines as the previous holder left them.
            if slot.stop.compare_exchange(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                let result = f(slot);
                // Release: publishes this holder's slot and magazine writes.
                slot.stop.store(FREE, Ordering::Release);
                return Some(result);
            }
            if attempt + 1 < LOCK_TRIES {
                backoff.spin();
            }
        }
        None
    }

    /// False when the rseq fast path cannot run on this thread at all.
    #[inline]
    fn usable_here(&self) -> bool {
        self.mode == Mode::Locked || rseq::thread_area().is_some()
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self) -> Option<NonNull<u8>> {
        if !self.usable_here() {
            return None;
        }
        for _ in 0..SLOW_TRIES {
            let cpu = cpu::current();
            let slot = self.slots.get(cpu);
            // Relaxed: a hint; the sections re-check the stop word.
            if slot.stop.load(Ordering::Relaxed) == STOPPED {
                return None;
            }
            let state = slot.snapshot();
            if state.rounds() == 0 {
                if state.prev_rounds() > 0 {
                    // Previous is full: swap.
                    let _ = self.exchange(cpu, state, state.swapped(), null_mut());
                } else {
                    // Previous is empty or absent: exchange it for a full one.
                    let full = self.depot.pop_full()?;
                    // SAFETY: popped: ours, live.
                    let cap = unsafe { Magazine::cap(full) };
                    match self.exchange(cpu, state, state.installed(cap, cap), full.as_ptr()) {
                        Some(evicted) => {
                            self.depot.count_exchange();
                            if state.prev_cap() > 0 {
                                debug_assert_eq!(state.prev_rounds(), 0);
                                if let Some(evicted) = NonNull::new(evicted) {
                                    self.depot.push_empty(evicted);
                                }
                            }
                        }
                        None => {
                            self.depot.count_retry();
                            self.depot.push_full(full);
                        }
                    }
                }
            }
            if let Some(round) = self.pop_round() {
                return Some(round);
            }
        }
        None
    }

    #[cold]
    #[inline(never)]
    fn free_slow(&self, round: NonNull<u8>) -> Result<(), NonNull<u8>> {
        if !self.usable_here() {
            return Err(round);
        }
        for _ in 0..SLOW_TRIES {
            let cpu = cpu::current();
            let slot = self.slots.get(cpu);
            // Relaxed: a hint; the sections re-check the stop word.
            if slot.stop.load(Ordering::Relaxed) == STOPPED {
                return Err(round);
            }
            let state = slot.snapshot();
            if state.rounds() >= state.cap() {
                if state.prev_cap() > 0 && state.prev_rounds() == 0 {
                    // Previous is empty: swap.
                    let _ = self.exchange(cpu, state, state.swapped(), null_mut());
                } else {
                    // Previous is full or absent: exchange it for an empty one.
                    let empty = match self.depot.pop_empty() {
                        Some(empty) => empty,
                        None => match Magazine::create(self.magazine_size()) {
                            Some(empty) => empty,
                            None => return Err(round),
                        },
                    };
                    // SAFETY: ours, live.
                    let cap = unsafe { Magazine::cap(empty) };
                    match self.exchange(cpu, state, state.installed(0, cap), empty.as_ptr()) {
                        Some(evicted) => {
                            self.depot.count_exchange();
                            if state.prev_cap() > 0 {
                                debug_assert_eq!(state.prev_rounds(), state.prev_cap());
                                if let Some(evicted) = NonNull::new(evicted) {
                                    self.depot.push_full(evicted);
                                }
                            }
                        }
                        None => {
                            self.depot.count_retry();
                            self.depot.push_empty(empty);
                        }
                    }
                }
            }
            if self.push_round(round) {
                return Ok(());
            }
        }
        Err(round)
    }

    /// Rounds per magazine for magazines made from now on.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.magazine_size(), 15);
    /// ```
    pub fn magazine_size(&self) -> usize {
        // Relaxed: a size hint; a stale one makes a magazine of the previous size, which
        // works (each magazine records its capacity).
        self.mag_rounds.load(Ordering::Relaxed)
    }

    /// Cheap counters (relaxed loads of per-CPU state words and depot counts).
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// let stats = caches.stats();
    /// assert_eq!((stats.cpu_rounds, stats.depot_full, stats.depot_empty), (0, 0, 0));
    /// ```
    pub fn stats(&self) -> Stats {
        let cpu_rounds = self
            .slots
            .iter()
            .map(|slot| {
                let state = slot.snapshot();
                state.rounds() + state.prev_rounds()
            })
            .sum();
        let (depot_full, depot_empty) = self.depot.lens();
        Stats {
            cpu_rounds,
            depot_full,
            depot_empty,
            magazine_size: self.magazine_size(),
            contention: self.depot.contention(),
            exchanges: self.depot.exchanges(),
            // Relaxed: statistics.
            resizes: self.resizes.load(Ordering::Relaxed),
            idle_drains: self.idle_drains.load(Ordering::Relaxed),
        }
    }

    /// Empties every CPU's magazines and the depot: every round cached at the moment of
    /// the call goes to `sink` (rounds cached concurrently by other threads may stay).
    /// Magazines are retired. This is the reconfiguration write side: it stops every
    /// CPU's fast path for its duration (module documentation).
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// let mut object = 0u64;
    /// // Kept in this CPU's magazine, unless the free missed (a thread without rseq
    /// // registration in rseq mode, say).
    /// let kept = caches.free(NonNull::from(&mut object).cast()).is_ok();
    /// let mut drained = 0;
    /// caches.drain(|_| drained += 1);
    /// assert_eq!(drained, usize::from(kept));
    /// assert_eq!(caches.stats().cpu_rounds, 0);
    /// ```
    pub fn drain(&self, mut sink: impl FnMut(NonNull<u8>)) {
        self.reconfigure(None, &mut sink);
    }

    /// Whether the layer holds no magazine at all: every slot's state says neither a
    /// loaded nor a previous magazine, and the depot is empty. Read without stopping the
    /// CPUs, so only a hint (a CPU may load a magazine just after): for a periodic caller
    /// deciding whether a [`drain`](Self::drain) is worth its stop and its rseq fence (a
    /// `membarrier`), never for destroy.
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert!(caches.holds_nothing());
    /// let mut object = 0u64;
    /// if caches.free(NonNull::from(&mut object).cast()).is_ok() {
    ///     assert!(!caches.holds_nothing());
    /// }
    /// caches.drain(|_| {});
    /// assert!(caches.holds_nothing());
    /// ```
    pub fn holds_nothing(&self) -> bool {
        // Relaxed: a hint (see above).
        self.slots.iter().all(|slot| {
            let state = slot.snapshot();
            state.cap() == 0 && state.prev_cap() == 0
        }) && self.depot.lens() == (0, 0)
    }

    /// Frees the depot magazines that sat idle for the whole last interval (between the
    /// last two [`update`](Self::update)s): rounds to `sink`, magazines retired. Returns
    /// the number of magazines freed. Does not stop the CPUs.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.reap(|_| unreachable!()), 0);
    /// ```
    pub fn reap(&self, mut sink: impl FnMut(NonNull<u8>)) -> usize {
        self.depot.reap(&mut sink)
    }

    /// Drains the slots of the CPUs that did nothing with this layer since the previous
    /// call and hold at least `min_rounds` rounds (at least 1; module documentation,
    /// "Idle CPUs"): their full
    /// magazines go to the depot (which the working-set reap empties if no CPU takes
    /// them), the rounds of the others to `sink`; the other CPUs keep running. Returns
    /// the number of CPUs drained. Meant to be called once per working-set interval (an
    /// object cache's [`update`](crate::umem::ObjectCache::update) does): a CPU the
    /// program stopped running on then gives back what it cached within two intervals.
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// let mut object = 0u64;
    /// let kept = caches.free(NonNull::from(&mut object).cast()).is_ok();
    /// caches.drain_idle(1, |_| unreachable!()); // the first call only looks
    /// // Nothing happened on any CPU since, but a CPU holding one round is not worth
    /// // stopping when the caller asks for two.
    /// assert_eq!(caches.drain_idle(2, |_| unreachable!()), 0);
    /// let mut drained = 0;
    /// // A CPU that holds the round (in a magazine of 15, not full) is drained.
    /// assert_eq!(caches.drain_idle(1, |_| drained += 1), usize::from(kept));
    /// assert_eq!(drained, usize::from(kept));
    /// assert_eq!(caches.stats().cpu_rounds, 0);
    /// ```
    pub fn drain_idle(&self, min_rounds: usize, mut sink: impl FnMut(NonNull<u8>)) -> usize {
        let min_rounds = min_rounds.max(1);
        let backoff = Backoff::new();
        // Acquire: as in `reconfigure` (serialised with every reconfiguration, so that
        // the stop words this writes are the only STOPPED ones).
        while self.reconfig.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
        // Lets go of the stopped slots and of the flag however this ends.
        let mut held = Reconfiguring { caches: self, stopped: false };
        let mut idle = 0;
        for slot in self.slots.iter() {
            // Relaxed: a hint about another CPU's slot (a section may commit right after
            // this load; the stop below and the fence decide what is drained). `seen` is
            // written only here, under the mutex.
            let state = slot.snapshot();
            let seen = slot.seen.swap(state.0 as usize, Ordering::Relaxed);
            if seen != state.0 as usize || state.rounds() + state.prev_rounds() < min_rounds {
                continue;
            }
            let stopped = match self.mode {
                // SeqCst: ordered before the heavy_rseq fence, as in `stop_all`.
                Mode::Rseq => {
                    slot.stop.store(STOPPED, Ordering::SeqCst);
                    true
                }
                // Acquire: as in `stop_all`; a slot a fast path holds now is not idle.
                Mode::Locked => slot.stop.compare_exchange(FREE, STOPPED, Ordering::Acquire, Ordering::Relaxed).is_ok(),
            };
            idle += usize::from(stopped);
        }
        if idle == 0 {
            return 0;
        }
        held.stopped = true;
        if self.mode == Mode::Rseq && !fence::heavy_rseq() {
            // Refused (it was accepted when the layer was made): nothing is drained.
            return 0;
        }
        let guard = epoch::pin();
        for slot in self.slots.iter() {
            // Relaxed: our own stores (under the mutex no one else stops a slot).
            if slot.stop.load(Ordering::Relaxed) == STOPPED {
                slot.drain_exclusive(Some(&self.depot), &mut sink, &guard);
                // Relaxed: as above; the drained state is what the next call compares.
                slot.seen.store(State::INITIAL.0 as usize, Ordering::Relaxed);
            }
        }
        // Relaxed: a statistic.
        self.idle_drains.fetch_add(idle, Ordering::Relaxed);
        idle
    }

    /// Full magazines in the depot now: a relaxed load, a hint under concurrency (never
    /// below the true number).
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.depot_full(), 0);
    /// ```
    #[inline]
    pub fn depot_full(&self) -> usize {
        self.depot.lens().0
    }

    /// Empties the depot's full magazines beyond `keep` at once: their rounds go to
    /// `sink`, the magazines stay in the depot, empty. Unlike [`reap`](Self::reap) it
    /// does not wait for a working-set interval, and unlike [`drain`](Self::drain) it
    /// stops no CPU and issues no fence: the fast paths run on. Returns the rounds given
    /// to `sink`. (The object cache's free-time trim.)
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// use scalemem::umem::cpu_cache::{Config, CpuCaches};
    /// let caches = CpuCaches::new(Config { initial_rounds: 1, ..Default::default() }).unwrap();
    /// let mut objects = [0u64; 8];
    /// for object in &mut objects {
    ///     let _ = caches.free(NonNull::from(object).cast());
    /// }
    /// let full = caches.depot_full();
    /// let mut trimmed = 0;
    /// assert_eq!(caches.trim_depot(0, |_| trimmed += 1), trimmed);
    /// assert_eq!((caches.depot_full(), trimmed), (0, full));
    /// caches.drain(|_| {});
    /// ```
    pub fn trim_depot(&self, keep: usize, mut sink: impl FnMut(NonNull<u8>)) -> usize {
        self.depot.trim_full(keep, &mut sink)
    }

    /// Ends a working-set interval (call it periodically, libumem: every 10 s) and
    /// resizes the magazines if the interval's depot contention or idleness calls for it
    /// (module documentation). A resize drains everything into `sink`. Returns the
    /// magazine size now in force.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert_eq!(caches.update(|_| {}), 15); // no contention, nothing idle: unchanged
    /// ```
    pub fn update(&self, mut sink: impl FnMut(NonNull<u8>)) -> usize {
        self.depot.update();
        let contention = self.depot.contention();
        // Relaxed: a statistic; concurrent updates at worst see one interval twice.
        let delta = contention.wrapping_sub(self.last_contention.swap(contention, Ordering::Relaxed));
        let size = self.magazine_size();
        let (idle_full, idle_empty) = self.depot.reapable();
        let target = if delta > self.config.grow_contention {
            // Never below the size in force: a cap stops growth, it does not shrink.
            ladder_up(size).min(self.growth_limit()).max(size)
        } else if delta == 0 && idle_full + idle_empty >= self.config.shrink_idle {
            ladder_down(size, self.config.min_rounds)
        } else {
            size
        };
        if target != size {
            self.reconfigure(Some(target), &mut sink);
        }
        self.magazine_size()
    }

    /// Grows the magazines one step of the ladder now if the depot saw more than
    /// `failures` failed CAS attempts or retried pops since the last call: the fast
    /// half of the contention rule of [`update`](Self::update), for a caller that
    /// checks often (umem's global heap, every 10 ms tick), so that CPUs that keep
    /// exchanging magazines through the depot get larger ones within a tick instead of
    /// a working-set interval. Shrinking stays with `update`. A resize drains
    /// everything into `sink` (a stop and an rseq fence: at most one per ladder step).
    /// Returns whether it grew.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert!(!caches.grow_if_contended(0, |_| {})); // no contention yet
    /// ```
    pub fn grow_if_contended(&self, failures: usize, mut sink: impl FnMut(NonNull<u8>)) -> bool {
        if !moved_past(&self.tick_contention, self.depot.contention(), failures) {
            return false;
        }
        let size = self.magazine_size();
        let target = ladder_up(size).min(self.growth_limit());
        if target <= size {
            return false;
        }
        self.reconfigure(Some(target), &mut sink);
        true
    }

    /// Grows the magazines one step of the ladder now, to at most `max_rounds`, if the
    /// CPUs installed more than `exchanges` magazines from the depot since the last call,
    /// contended or not: their loaded and previous magazines are too small for the
    /// bursts they see (one thread alone that allocates a hundred blocks and frees them
    /// never contends, but trades a magazine with the depot every few dozen
    /// operations). The caller's `max_rounds` bounds what the rule may cost in cached
    /// memory (umem's global heap: about 1 MiB of objects per magazine); the contention
    /// rule keeps its own bound, [`Config::max_rounds`], which also bounds this one.
    /// Shrinking stays with [`update`](Self::update). Returns whether it grew.
    ///
    /// ```
    /// let caches = scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap();
    /// assert!(!caches.grow_if_exchanging(0, 143, |_| {})); // no exchange yet
    /// ```
    pub fn grow_if_exchanging(&self, exchanges: usize, max_rounds: usize, mut sink: impl FnMut(NonNull<u8>)) -> bool {
        if !moved_past(&self.tick_exchanges, self.depot.exchanges(), exchanges) {
            return false;
        }
        let size = self.magazine_size();
        let target = ladder_up(size);
        // At the top of the ladder `ladder_up` gives the size itself: no step, no drain.
        if target <= size || target > max_rounds.min(self.growth_limit()) {
            return false;
        }
        self.reconfigure(Some(target), &mut sink);
        true
    }

    /// Caps what the growth rules ([`update`](Self::update),
    /// [`grow_if_contended`](Self::grow_if_contended),
    /// [`grow_if_exchanging`](Self::grow_if_exchanging)) may grow the magazines to, below
    /// [`Config::max_rounds`], until the next call: for an owner that shares a memory
    /// budget among several layers (umem's global heap, among its size classes). A cap
    /// below the size in force stops growth; it does not shrink (idleness does).
    /// `usize::MAX` lifts it.
    pub(crate) fn set_growth_cap(&self, rounds: usize) {
        // Relaxed: a hint for the growth rules, which the owner calls after this under
        // the same serialisation (the global heap's maintenance lock); a stale cap at
        // worst lets one step through or holds one back.
        self.growth_cap.store(rounds, Ordering::Relaxed);
    }

    /// Magazines installed from the depot so far (a running count): how busy the layer
    /// is, for an owner that shares a budget among layers.
    pub(crate) fn exchanges(&self) -> usize {
        self.depot.exchanges()
    }

    /// Whether the next step of the ladder is within the layer's own bounds
    /// ([`Config::max_rounds`] and `max_rounds`) but above the cap of
    /// [`set_growth_cap`](Self::set_growth_cap): growth the cap alone holds back.
    pub(crate) fn growth_capped(&self, max_rounds: usize) -> bool {
        let size = self.magazine_size();
        let next = ladder_up(size);
        next > size && next <= max_rounds.min(self.config.max_rounds) && next > self.growth_limit()
    }

    /// Shrinks the magazines one step of the ladder (not below [`Config::min_rounds`]),
    /// draining everything into `sink`, as the idle rule of [`update`](Self::update)
    /// does: for an owner that takes room from an idle layer for a busy one. Returns
    /// whether it shrank.
    pub(crate) fn shrink_step(&self, mut sink: impl FnMut(NonNull<u8>)) -> bool {
        let size = self.magazine_size();
        let target = ladder_down(size, self.config.min_rounds);
        if target >= size {
            return false;
        }
        self.reconfigure(Some(target), &mut sink);
        true
    }

    /// The most rounds a growth rule may reach now.
    fn growth_limit(&self) -> usize {
        // Relaxed: see `set_growth_cap`.
        self.config.max_rounds.min(self.growth_cap.load(Ordering::Relaxed))
    }

    /// Takes the reconfiguration mutex without a scope, for `fork`: no drain or resize
    /// is then half done when the process is copied. In locked mode it also takes every
    /// slot's lock, so that no slot is copied locked by a thread the child will not
    /// have (its first reconfiguration would wait for it forever). In rseq mode a slot
    /// operation is one section, never half done in the copy.
    pub(crate) fn fork_lock(&self) {
        let backoff = Backoff::new();
        // Acquire: as in `reconfigure`.
        while self.reconfig.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
        if self.mode == Mode::Locked {
            for slot in self.slots.iter() {
                let backoff = Backoff::new();
                // Acquire: pairs with the fast paths' Release unlocks (as in `stop_all`).
                while slot.stop.compare_exchange_weak(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err() {
                    backoff.snooze();
                }
            }
        }
    }

    /// Repairs what a `fork` can leave inexact in the child: the depot's counts (see
    /// `Depot::recount_after_fork`). The slots need nothing: each of their changes is
    /// one commit (rseq) or made under a slot lock that `fork_lock` held.
    ///
    /// # Safety
    /// Called in the child of a `fork`, before it has started any other thread.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn after_fork_in_child(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.depot.recount_after_fork() };
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took (in the parent and the child).
    pub(crate) fn fork_unlock(&self) {
        if self.mode == Mode::Locked {
            for slot in self.slots.iter() {
                // Release: publishes nothing new (the slot was only held), pairs with the
                // next holder's Acquire.
                slot.stop.store(FREE, Ordering::Release);
            }
        }
        // Release: pairs with the Acquire of the next reconfigurer.
        self.reconfig.store(false, Ordering::Release);
    }

    /// The reconfiguration write side: under the reconfiguration mutex, stops every
    /// slot, drains it, optionally sets a new magazine size, restarts the slots, and
    /// purges the depot.
    fn reconfigure(&self, resize: Option<usize>, sink: &mut dyn FnMut(NonNull<u8>)) {
        let backoff = Backoff::new();
        // Acquire: pairs with the Release in `Reconfiguring::drop`; reconfigurations are
        // serialised.
        while self.reconfig.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
        // Lets go of the slots and of the flag however this ends: `sink` may panic.
        let mut held = Reconfiguring { caches: self, stopped: false };
        let guard = epoch::pin();
        if self.stop_all() {
            held.stopped = true;
            for slot in self.slots.iter() {
                slot.drain_exclusive(None, sink, &guard);
            }
            if let Some(rounds) = resize {
                // Relaxed: see magazine_size.
                self.mag_rounds.store(rounds, Ordering::Relaxed);
                // Relaxed: a statistic.
                self.resizes.fetch_add(1, Ordering::Relaxed);
            }
            held.stopped = false;
            self.unstop_stopped();
        }
        drop(guard);
        self.depot.purge(sink);
        drop(held);
    }

    /// Stops every slot. False (and nothing stopped) where the kernel refuses the rseq
    /// membarrier, which it accepted when the layer was made: then nothing is drained.
    fn stop_all(&self) -> bool {
        match self.mode {
            Mode::Rseq => {
                for slot in self.slots.iter() {
                    // SeqCst: ordered before the heavy_rseq fence; in rseq mode no other
                    // thread writes the stop word (reconfigurers are serialised).
                    slot.stop.store(STOPPED, Ordering::SeqCst);
                }
                if fence::heavy_rseq() {
                    return true;
                }
                self.unstop_stopped();
                false
            }
            Mode::Locked => {
                for slot in self.slots.iter() {
                    let backoff = Backoff::new();
                    // Acquire: pairs with the fast paths' Release unlocks.
                    while slot.stop.compare_exchange_weak(FREE, STOPPED, Ordering::Acquire, Ordering::Relaxed).is_err()
                    {
                        backoff.snooze();
                    }
                }
                true
            }
        }
    }

    /// Restarts every slot a reconfiguration stopped (all of them after `stop_all`, the
    /// idle ones after `drain_idle`): only reconfigurers, serialised by the mutex, write
    /// `STOPPED`, so a locked-mode slot that a fast path holds is left alone.
    fn unstop_stopped(&self) {
        for slot in self.slots.iter() {
            // Relaxed: our own stores (see above).
            if slot.stop.load(Ordering::Relaxed) == STOPPED {
                // Release: a fast path that reads FREE (rseq: the section's load, an x86
                // load with acquire semantics; locked: the Acquire CAS) sees the drained
                // slot.
                slot.stop.store(FREE, Ordering::Release);
            }
        }
    }

    /// Panics if some CPU's state is malformed (indices, counts above capacities), a
    /// present magazine is missing or of another capacity, or a depot list's length
    /// differs from its count. Quiescent use only (tests).
    ///
    /// ```
    /// scalemem::umem::cpu_cache::CpuCaches::new(Default::default()).unwrap().assert_valid();
    /// ```
    pub fn assert_valid(&self) {
        for slot in self.slots.iter() {
            let state = slot.snapshot();
            assert!(state.loaded() < 3 && state.prev() < 3 && state.loaded() != state.prev());
            assert!(state.rounds() <= state.cap() && state.prev_rounds() <= state.prev_cap());
            assert!(state.prev_rounds() == 0 || state.prev_rounds() == state.prev_cap(), "partial previous");
            for (index, cap) in [(state.loaded(), state.cap()), (state.prev(), state.prev_cap())] {
                if cap > 0 {
                    let mag = slot.mag(index).expect("present magazine is null");
                    // SAFETY: quiescent; a present magazine is live.
                    assert_eq!(unsafe { Magazine::cap(mag) }, cap);
                }
            }
        }
        self.depot.assert_valid();
    }
}

impl Drop for CpuCaches {
    /// Frees every magazine. Rounds still cached are forgotten (not freed): drain first.
    fn drop(&mut self) {
        self.drain(|_| {});
    }
}

impl core::fmt::Debug for CpuCaches {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuCaches").field("rseq", &self.uses_rseq()).field("stats", &self.stats()).finish()
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// Frees every object of `objects` into `caches` and allocates them all back: with
    /// magazines far smaller than the set, the CPU trades magazines with the depot.
    fn churn(caches: &CpuCaches, objects: &mut [u64]) {
        for object in objects.iter_mut() {
            if caches.free(NonNull::from(object).cast()).is_err() {
                // Refused (no magazine could be had): not cached, nothing to take back.
            }
        }
        while caches.alloc().is_some() {}
    }

    /// A growth cap stops the exchange rule at the cap (and says so), lifting it lets
    /// the rule grow the magazines, and `shrink_step` walks back down the ladder to the
    /// minimum and no further.
    #[test]
    fn a_growth_cap_holds_growth_and_shrink_step_walks_down() {
        let caches = CpuCaches::new(Config { initial_rounds: 3, ..Config::default() }).unwrap();
        let mut objects = vec![0u64; 256];
        caches.set_growth_cap(5);
        churn(&caches, &mut objects);
        assert!(caches.exchanges() > 0, "no magazine was traded with the depot");
        assert!(!caches.grow_if_exchanging(0, 143, |_| {}), "grew past the cap");
        assert_eq!(caches.magazine_size(), 3);
        assert!(caches.growth_capped(143), "the cap alone holds the next step back");
        assert!(!caches.growth_capped(5), "a step past the caller's own bound is not the cap's doing");
        caches.set_growth_cap(usize::MAX);
        assert!(!caches.growth_capped(143));
        churn(&caches, &mut objects);
        assert!(caches.grow_if_exchanging(0, 143, |_| {}));
        assert_eq!(caches.magazine_size(), 7);
        let mut drained = 0;
        assert!(caches.shrink_step(|_| drained += 1));
        assert_eq!(caches.magazine_size(), 3);
        assert!(caches.shrink_step(|_| drained += 1));
        assert_eq!(caches.magazine_size(), 1);
        assert!(!caches.shrink_step(|_| drained += 1), "shrank below the minimum");
        assert_eq!(caches.magazine_size(), 1);
        // Nothing cached is lost to the resizes: what they drained plus what is left
        // is what the churn left cached (nothing: every object was taken back).
        caches.drain(|_| drained += 1);
        assert_eq!(drained, 0);
    }
}
