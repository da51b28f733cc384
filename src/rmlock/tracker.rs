//! The per-CPU reader counts of one [`RmLock`](super::RmLock): how many readers have
//! *arrived* and how many have *departed*, each a monotone per-CPU counter.
//!
//! # Synchronization protocol
//!
//! Local operations (any thread, on whatever CPU it runs): [`Readers::arrive`] and
//! [`Readers::depart`] add 1 to the current CPU's `arrived` or `departed` word. Where the
//! thread has rseq the add is a restartable sequence that commits with one plain `add`
//! to memory (no `lock` prefix, no shared line); elsewhere it is a `fetch_add` on the
//! slot's separate atomic word. The two kinds of word are never mixed: an atomic RMW
//! landing between the load and the store of the owning CPU's plain `add` would be lost
//! (see [`PerCpuCounter`](crate::cpu::PerCpuCounter), which splits its slots the same
//! way).
//!
//! Remote operation (the writer only): [`Readers::all_departed`] sums every CPU's
//! `departed` words, issues an Acquire fence, then sums every `arrived` word, and
//! reports whether the sums are equal.
//!
//! The counts are monotone (they wrap at 2^64, which no lock reaches) and a reader's
//! arrival and departure may land on different CPUs (it migrated, or it is the loom
//! model, which moves every thread to the other CPU at each update): only the sums mean
//! anything. Why two monotone counts and not one up-down count: a reader that arrives
//! on CPU 0 just after the writer has read CPU 0's slot, sees the writer and backs out
//! on CPU 1, would show the writer its decrement without its increment. With one count
//! that -1 cancels the +1 of a reader still inside, and the writer walks in on it. With
//! two counts the writer reads the departures first and, after the Acquire fence, the
//! arrivals, so every departure it counted comes with its arrival (the reader issues a
//! Release fence between the two): the arrival sum can only be ahead, and equality means
//! every reader the writer can see has left. (SRCU compares its lock and unlock counts
//! the same way.) The loom model `migrating_back_out_cannot_hide_a_reader` fails if the
//! counts are folded into one.

use core::mem::offset_of;

use crate::cpu::PerCpu;
use crate::sync::atomic::{AtomicIsize, Ordering, fence};
use crate::util::AllocError;

/// One CPU's counts. `*_rseq` words are written only by [`crate::cpu::rseq::add`] on
/// their own CPU; `arrived`/`departed` only by `fetch_add`. All of them are read by
/// [`Readers::all_departed`] with atomic loads.
#[repr(C)]
struct Slot {
    arrived_rseq: AtomicIsize,
    departed_rseq: AtomicIsize,
    arrived: AtomicIsize,
    departed: AtomicIsize,
}

/// Per-CPU arrival and departure counts (one cache-padded [`Slot`] per CPU, mapped from
/// the kernel).
pub(super) struct Readers {
    slots: PerCpu<Slot>,
}

impl Readers {
    /// Zeroed counts. Fails only if the kernel refuses the memory.
    pub(super) fn try_new() -> Result<Self, AllocError> {
        let slots = PerCpu::new(|_cpu| Slot {
            arrived_rseq: AtomicIsize::new(0),
            departed_rseq: AtomicIsize::new(0),
            arrived: AtomicIsize::new(0),
            departed: AtomicIsize::new(0),
        })?;
        Ok(Self { slots })
    }

    /// Counts one arrival on the current CPU. Orders nothing by itself: the caller
    /// follows it with `fence::light()` (see the module doc of `rmlock`).
    #[inline]
    pub(super) fn arrive(&self) {
        if !self.add_rseq(offset_of!(Slot, arrived_rseq)) {
            // Relaxed: the protocol's orderings are fences around the call (rmlock's
            // module doc); the count itself publishes nothing.
            self.local().arrived.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one departure on the current CPU. The caller precedes it with a Release
    /// fence, which pairs with the Acquire fence in [`all_departed`](Self::all_departed).
    #[inline]
    pub(super) fn depart(&self) {
        if !self.add_rseq(offset_of!(Slot, departed_rseq)) {
            // Relaxed: ordered by the caller's Release fence (see above); a later
            // fetch_add by another thread continues the release sequence.
            self.local().departed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Adds 1 to the current CPU's word at `offset` in its slot with an rseq critical
    /// section; `false` (nothing done) where this thread has no rseq or its CPU number is
    /// past the slot count.
    #[inline]
    fn add_rseq(&self, offset: usize) -> bool {
        let Some(area) = rseq_area() else {
            return false;
        };
        let (base, stride, ncpus) = self.slots.raw_parts();
        // SAFETY: `offset` is a field offset inside slot 0, which lies in the mapping.
        let word0 = unsafe { base.add(offset) }.cast::<isize>();
        // SAFETY: (1) `area` came from thread_area() on this thread (see `rseq_area`).
        // (2) Slot `cpu` is at base + cpu * stride for every cpu < ncpus, initialised and
        // alive while &self is; the word is an 8-byte-aligned AtomicIsize, so writing
        // through the pointer is allowed (interior mutability).
        // (3) The `*_rseq` words are written only here; `all_departed` reads them with
        // atomic loads.
        unsafe { crate::cpu::rseq::add(area, word0, stride, ncpus, 1) }
    }

    /// The slot the atomic fallback updates: the current CPU's. Under loom a thread
    /// alternates between the two modelled CPUs at every update, so that every model
    /// also covers a reader that migrates between its arrival and its departure.
    #[inline]
    fn local(&self) -> &Slot {
        #[cfg(not(scalemem_loom))]
        {
            self.slots.local()
        }
        #[cfg(scalemem_loom)]
        {
            crate::sync::thread_local! {
                static TICK: core::cell::Cell<usize> = core::cell::Cell::new(0);
            }
            let tick = TICK.with(|tick| {
                tick.set(tick.get() + 1);
                tick.get()
            });
            self.slots.get(crate::cpu::current() + tick)
        }
    }

    /// True if every reader whose arrival is visible here has departed: the departure
    /// sum, read first, equals the arrival sum, read after an Acquire fence.
    ///
    /// REQUIRES: called by the writer after its heavy fence (see rmlock's module doc);
    /// then `true` means no reader is inside, and every departed reader's critical
    /// section happens before what the caller does next.
    pub(super) fn all_departed(&self) -> bool {
        let mut departed = 0isize;
        for slot in self.slots.iter() {
            // Relaxed (both): made useful by the Acquire fence below. The rseq word's
            // writer is a plain 8-byte store (single-copy atomic on x86_64).
            #[cfg(not(scalemem_loom))]
            {
                departed = departed.wrapping_add(slot.departed_rseq.load(Ordering::Relaxed));
            }
            departed = departed.wrapping_add(slot.departed.load(Ordering::Relaxed));
        }
        // Acquire: pairs with the Release fence each reader issues before `depart`. Every
        // departure read above therefore brings its reader's arrival (made before that
        // fence) and its critical section into view of the loads below and of the
        // writer's critical section.
        fence(Ordering::Acquire);
        let mut arrived = 0isize;
        for slot in self.slots.iter() {
            // Relaxed (both): see above.
            #[cfg(not(scalemem_loom))]
            {
                arrived = arrived.wrapping_add(slot.arrived_rseq.load(Ordering::Relaxed));
            }
            arrived = arrived.wrapping_add(slot.arrived.load(Ordering::Relaxed));
        }
        arrived == departed
    }
}

/// This thread's rseq area ([`crate::cpu::rseq::thread_area`]), looked up once per
/// thread and kept in a `const`-initialised, destructor-free thread-local: one load
/// instead of the lookup's global flag, thread pointer and `__rseq_offset` loads and
/// registration check, twice per read. The area is the thread's for its whole life
/// (glibc registers it at thread start and unregisters it at exit), so the cached
/// pointer stays valid for every later call on this thread.
#[cfg(not(scalemem_loom))]
#[inline]
fn rseq_area() -> Option<*mut u8> {
    crate::sync::thread_local! {
        /// Null: not looked up yet; [`NO_AREA`]: this thread has no rseq area; else the
        /// area.
        static AREA: core::cell::Cell<*mut u8> = const { core::cell::Cell::new(core::ptr::null_mut()) };
    }
    /// The marker of a thread without an rseq area (never a valid area address).
    const NO_AREA: *mut u8 = core::ptr::without_provenance_mut(1);
    AREA.with(|cached| {
        let area = cached.get();
        if area == NO_AREA {
            None
        } else if area.is_null() {
            let area = crate::cpu::rseq::thread_area();
            cached.set(area.unwrap_or(NO_AREA));
            area
        } else {
            Some(area)
        }
    })
}

/// Under loom there is no rseq.
#[cfg(scalemem_loom)]
#[inline]
fn rseq_area() -> Option<*mut u8> {
    None
}
