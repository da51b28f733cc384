//! [`PerCpuStack`]: one bounded stack of pointers per CPU, pushed and popped by rseq
//! critical sections where the process has rseq, and under a per-CPU try-lock otherwise.

use core::marker::PhantomData;
use core::mem::offset_of;
use core::ptr::NonNull;

use crate::cpu::{self, PerCpu, rseq};
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::util::{AllocError, Backoff};

/// How a [`PerCpuStack`] synchronises, fixed when it is built: the two never run on one
/// structure (a locked push does not exclude an rseq pop, nor the reverse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// rseq critical sections ([`rseq::push`], [`rseq::pop`]); `lock` is unused.
    Rseq,
    /// Every access to `len` and `items` holds `lock`.
    Locked,
}

/// One CPU's stack. `len` and `items` form the header layout [`rseq::push`] expects
/// (`len` at offset 0, `items` right after it, in the non-loom build where the cells are
/// transparent); `lock` comes after them.
#[repr(C)]
struct Slot<const N: usize> {
    /// Number of items. An atomic so that [`PerCpuStack::len_hint`] may read it at any
    /// time; its writers are serialised (rseq: by the owning CPU; locked: by `lock`), so
    /// loads and stores are enough.
    len: AtomicUsize,
    /// `items[..len]` are non-null pointers pushed and not yet popped. Rseq mode: accessed
    /// only by the critical sections and by `&mut` methods. Locked mode: only under
    /// `lock`, or by `&mut` methods.
    items: [UnsafeCell<*mut ()>; N],
    /// Locked mode's try-lock. `true` while held.
    lock: AtomicBool,
}

impl<const N: usize> Slot<N> {
    fn new() -> Self {
        Self {
            len: AtomicUsize::new(0),
            items: core::array::from_fn(|_| UnsafeCell::new(core::ptr::null_mut())),
            lock: AtomicBool::new(false),
        }
    }

    /// Takes the lock if it is free.
    #[inline]
    fn try_lock(&self) -> Option<SlotGuard<'_, N>> {
        // Acquire (on success): pairs with the Release store in SlotGuard::drop, so this
        // holder sees every `len`/`items` access of the previous holder. Relaxed on
        // failure: nothing is read under a failed attempt.
        self.lock.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(SlotGuard { slot: self })
    }

    /// Pops the top item; `&mut` or under the lock (locked mode only).
    #[inline]
    fn pop_exclusive(&self) -> Option<NonNull<()>> {
        // Relaxed: `len` is written only by the holder of exclusive access, which we are;
        // the lock (or &mut) orders it against the previous holder.
        let len = self.len.load(Ordering::Relaxed);
        if len == 0 || len > N {
            debug_assert!(len <= N, "PerCpuStack: len beyond capacity");
            return None;
        }
        // SAFETY: exclusive access (caller) means no other thread touches items[len - 1];
        // it holds a pointer stored by a push (initialised, non-null by construction).
        let item = self.items[len - 1].with(|p| unsafe { *p });
        // Relaxed: as above.
        self.len.store(len - 1, Ordering::Relaxed);
        NonNull::new(item)
    }

    /// Pushes `item` unless full; `&mut` or under the lock (locked mode only).
    #[inline]
    fn push_exclusive(&self, item: NonNull<()>) -> bool {
        // Relaxed: see pop_exclusive.
        let len = self.len.load(Ordering::Relaxed);
        if len >= N {
            return false;
        }
        // SAFETY: exclusive access (caller): nothing else reads or writes items[len].
        self.items[len].with_mut(|p| unsafe { *p = item.as_ptr() });
        // Relaxed: see pop_exclusive.
        self.len.store(len + 1, Ordering::Relaxed);
        true
    }
}

/// A held [`Slot::lock`]; releases it when dropped.
struct SlotGuard<'a, const N: usize> {
    slot: &'a Slot<N>,
}

impl<const N: usize> Drop for SlotGuard<'_, N> {
    #[inline]
    fn drop(&mut self) {
        // Release: pairs with the Acquire of the next successful try_lock, publishing our
        // `len`/`items` accesses (and, through them, the data behind pushed pointers).
        self.slot.lock.store(false, Ordering::Release);
    }
}

/// How many times a locked-mode operation tries its own CPU's lock before moving on to
/// other CPUs' slots.
const OWN_TRIES: usize = 2;
/// How many other CPUs' slots a locked-mode operation tries when its own is busy.
const OTHER_SLOTS: usize = 2;

/// Bounded stacks of pointers, one per CPU, each holding up to `N` items: the shape of a
/// per-CPU magazine layer. An operation works on the stack of the CPU the thread runs on,
/// so threads on different CPUs never touch the same cache lines.
///
/// Two modes, chosen once at construction and fixed for the structure's life:
///
/// - **rseq** ([`new`](Self::new) when [`cpu::rseq_enabled`]): [`push`](Self::push) and
///   [`pop`](Self::pop) are restartable sequences ([`rseq::push`], [`rseq::pop`]) with no
///   atomic instruction. A thread whose own rseq registration failed cannot use them: its
///   push returns `Err` and its pop `None` ("unavailable: use your shared path").
/// - **locked** ([`new`](Self::new) without rseq, under loom, or
///   [`new_locked`](Self::new_locked)): each CPU's stack has a try-lock. An operation
///   takes its CPU's lock; if that is busy (a preempted holder, a thread that just
///   migrated), it backs off briefly, then tries the next CPUs' stacks, and finally
///   reports full (`Err`) or empty (`None`) rather than wait.
///
/// Either way an `Err` or `None` is a hint that this CPU has nothing or no room right now,
/// not a statement about the whole structure: other CPUs' stacks may hold items.
///
/// The stack stores addresses and never dereferences them. Ownership of whatever they
/// point to passes from pusher to popper: what a thread wrote before `push` is visible to
/// the thread that pops the pointer. Items still stored when the stack is dropped are
/// forgotten (drain it first with [`drain`](Self::drain)).
///
/// ```
/// use scalemem::cpu::PerCpuStack;
/// use std::ptr::NonNull;
///
/// let stack: PerCpuStack<u64, 8> = PerCpuStack::new().unwrap();
/// let mut a = 1u64;
/// let mut b = 2u64;
/// stack.push(NonNull::from(&mut a)).unwrap();
/// stack.push(NonNull::from(&mut b)).unwrap();
/// // A thread may migrate between calls, so pop may find another CPU's stack;
/// // drain sees them all.
/// let mut seen = Vec::new();
/// if let Some(p) = stack.pop() {
///     seen.push(p);
/// }
/// let mut stack = stack;
/// stack.drain(|p| seen.push(p));
/// seen.sort();
/// let mut expected = vec![NonNull::from(&mut a), NonNull::from(&mut b)];
/// expected.sort();
/// assert_eq!(seen, expected);
/// ```
pub struct PerCpuStack<T, const N: usize> {
    slots: PerCpu<Slot<N>>,
    mode: Mode,
    _items: PhantomData<NonNull<T>>,
}

// SAFETY: the structure stores only addresses and never dereferences them, like
// AtomicPtr<T> (which is Send and Sync for every T); using a popped pointer is the
// caller's unsafe business. Its own state is synchronised: per-CPU slots are accessed
// under rseq (serialised by the owning CPU) or under the slot's lock, `len_hint` reads
// atomics, and `drain` takes &mut self.
unsafe impl<T, const N: usize> Send for PerCpuStack<T, N> {}
// SAFETY: see the Send impl.
unsafe impl<T, const N: usize> Sync for PerCpuStack<T, N> {}

impl<T, const N: usize> PerCpuStack<T, N> {
    /// The header layout the rseq sections rely on.
    #[cfg(not(scalemem_loom))]
    const LAYOUT: () = assert!(
        offset_of!(Slot<N>, items) == offset_of!(Slot<N>, len) + 8
            && size_of::<UnsafeCell<*mut ()>>() == 8
            && size_of::<AtomicUsize>() == 8
    );

    /// Empty stacks, one per possible CPU, in rseq mode if [`cpu::rseq_enabled`] and in
    /// locked mode otherwise. Fails only if the kernel refuses the memory.
    ///
    /// ```
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 32>::new().unwrap();
    /// assert_eq!(stack.uses_rseq(), scalemem::cpu::rseq_enabled());
    /// ```
    pub fn new() -> Result<Self, AllocError> {
        Self::with_mode(if cpu::rseq_enabled() { Mode::Rseq } else { Mode::Locked })
    }

    /// Empty stacks in locked mode, even where rseq is available (to test or benchmark
    /// the fallback).
    ///
    /// ```
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 32>::new_locked().unwrap();
    /// assert!(!stack.uses_rseq());
    /// ```
    pub fn new_locked() -> Result<Self, AllocError> {
        Self::with_mode(Mode::Locked)
    }

    fn with_mode(mode: Mode) -> Result<Self, AllocError> {
        #[cfg(not(scalemem_loom))]
        #[allow(clippy::let_unit_value)]
        let () = Self::LAYOUT;
        let slots = PerCpu::new(|_cpu| Slot::new())?;
        Ok(Self { slots, mode, _items: PhantomData })
    }

    /// Whether push and pop use rseq critical sections (else per-CPU try-locks).
    ///
    /// ```
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 4>::new().unwrap();
    /// let _fast = stack.uses_rseq();
    /// ```
    #[inline]
    pub fn uses_rseq(&self) -> bool {
        self.mode == Mode::Rseq
    }

    /// Items each CPU's stack can hold (`N`).
    ///
    /// ```
    /// assert_eq!(scalemem::cpu::PerCpuStack::<u8, 4>::new().unwrap().capacity(), 4);
    /// ```
    #[inline]
    pub fn capacity(&self) -> usize {
        N
    }

    /// Pushes `item` on the current CPU's stack. Returns it back as `Err` when that stack
    /// is full, or, in locked mode, busy; or, in rseq mode, when this thread has no rseq
    /// registration (use your shared path then).
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 1>::new().unwrap();
    /// let mut x = 0u8;
    /// assert!(stack.push(NonNull::from(&mut x)).is_ok());
    /// ```
    #[inline]
    pub fn push(&self, item: NonNull<T>) -> Result<(), NonNull<T>> {
        let pushed = match self.mode {
            Mode::Rseq => match rseq::thread_area() {
                Some(area) => {
                    let (header0, stride, ncpus) = self.header_parts();
                    // SAFETY: (1) `area` comes from thread_area() on this thread, now.
                    // (2) Each of the `ncpus` slots holds an initialised header at
                    // header0 + cpu * stride (Self::LAYOUT: len then N item cells),
                    // 8-byte aligned, with len <= N, alive while &self is.
                    // (3) In rseq mode `len`/`items` are written only by these sections
                    // and by &mut methods; len_hint only loads `len` atomically.
                    unsafe { rseq::push(area, header0, stride, ncpus, N, item.as_ptr().cast()) }
                }
                None => false,
            },
            Mode::Locked => self.with_locked_slot(|slot| slot.push_exclusive(item.cast())).unwrap_or(false),
        };
        if pushed { Ok(()) } else { Err(item) }
    }

    /// Pops the item most recently pushed on the current CPU's stack. `None` when that
    /// stack is empty, or, in locked mode, busy; or, in rseq mode, when this thread has no
    /// rseq registration.
    ///
    /// ```
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 1>::new().unwrap();
    /// assert_eq!(stack.pop(), None);
    /// ```
    #[inline]
    pub fn pop(&self) -> Option<NonNull<T>> {
        let item = match self.mode {
            Mode::Rseq => match rseq::thread_area() {
                Some(area) => {
                    let (header0, stride, ncpus) = self.header_parts();
                    // SAFETY: as in `push`.
                    NonNull::new(unsafe { rseq::pop(area, header0, stride, ncpus) })
                }
                None => None,
            },
            Mode::Locked => self.with_locked_slot(Slot::pop_exclusive).flatten(),
        };
        item.map(NonNull::cast)
    }

    /// Removes every item from every CPU's stack, calling `f` on each (each CPU's stack
    /// top first). If `f` panics, the items not yet handed out stay stored.
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// let mut stack = scalemem::cpu::PerCpuStack::<u8, 4>::new().unwrap();
    /// let mut x = 0u8;
    /// stack.push(NonNull::from(&mut x)).unwrap();
    /// let mut n = 0;
    /// stack.drain(|_| n += 1);
    /// assert_eq!((n, stack.len_hint()), (1, 0));
    /// ```
    pub fn drain(&mut self, mut f: impl FnMut(NonNull<T>)) {
        for slot in self.slots.iter() {
            // &mut self: no push or pop runs, in either mode, so the slot is ours alone.
            while let Some(item) = slot.pop_exclusive() {
                f(item.cast());
            }
        }
    }

    /// The number of items stored across all CPUs. Exact when nothing runs concurrently;
    /// otherwise a snapshot of each CPU's count at slightly different times.
    ///
    /// ```
    /// let stack = scalemem::cpu::PerCpuStack::<u8, 4>::new().unwrap();
    /// assert_eq!(stack.len_hint(), 0);
    /// ```
    pub fn len_hint(&self) -> usize {
        self.slots
            .iter()
            // Relaxed: a hint; `len`'s writers store single words (the rseq commit is one
            // 8-byte mov), so the load is never torn. It publishes nothing.
            .map(|slot| slot.len.load(Ordering::Relaxed).min(N))
            .sum()
    }

    /// Panics if some CPU's stack claims more than `N` items (a corrupted structure).
    /// Meant for tests and debug checks; racy pushes and pops cannot make it fail.
    ///
    /// ```
    /// scalemem::cpu::PerCpuStack::<u8, 4>::new().unwrap().assert_valid();
    /// ```
    pub fn assert_valid(&self) {
        for slot in self.slots.iter() {
            // Relaxed: see len_hint.
            assert!(slot.len.load(Ordering::Relaxed) <= N, "PerCpuStack: len beyond capacity");
        }
    }

    /// What the rseq sections need: CPU 0's header, the distance between headers, and
    /// the number of CPUs.
    #[inline]
    fn header_parts(&self) -> (*mut u8, usize, usize) {
        let (base, stride, ncpus) = self.slots.raw_parts();
        // SAFETY: `len` lies inside slot 0, which lies inside the mapping.
        (unsafe { base.add(offset_of!(Slot<N>, len)) }, stride, ncpus)
    }

    /// Runs `f` under the lock of the current CPU's slot, or, if that stays busy, of one
    /// of the next CPUs' slots. `None` if no lock was free.
    #[inline]
    fn with_locked_slot<R>(&self, f: impl FnOnce(&Slot<N>) -> R) -> Option<R> {
        let ncpus = self.slots.len();
        let home = cpu::current();
        let home_slot = self.slots.get(home);
        let backoff = Backoff::new();
        for attempt in 0..OWN_TRIES {
            if let Some(guard) = home_slot.try_lock() {
                return Some(f(guard.slot));
            }
            if attempt + 1 < OWN_TRIES {
                backoff.spin();
            }
        }
        for step in 1..ncpus.min(OTHER_SLOTS + 1) {
            if let Some(guard) = self.slots.get((home + step) % ncpus).try_lock() {
                return Some(f(guard.slot));
            }
        }
        None
    }
}

impl<T, const N: usize> core::fmt::Debug for PerCpuStack<T, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PerCpuStack")
            .field("capacity", &N)
            .field("cpus", &self.slots.len())
            .field("rseq", &self.uses_rseq())
            .field("len_hint", &self.len_hint())
            .finish()
    }
}
