//! [`PerCpu<T>`]: one cache-padded slot per possible CPU, in memory mapped from the
//! kernel (never the global allocator, so the allocator itself can use it).

use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use crate::os;
use crate::util::AllocError;

/// Slots are at least this far apart, so two CPUs never write one cache line (nor the
/// line pair x86's adjacent-line prefetcher fetches together).
const SLOT_ALIGN: usize = 128;

/// One value of `T` per possible CPU, each in its own cache lines.
///
/// The fast side reaches its CPU's slot with [`local`](PerCpu::local); the slow side
/// (summing counters, draining caches) walks every slot with [`iter`](PerCpu::iter).
/// Which slot is "local" is only a hint: a thread can migrate at any moment, so slots
/// shared this way must be atomics or be protected by rseq (see [`crate::cpu::rseq`]).
///
/// ```
/// use scalemem::cpu::PerCpu;
/// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
///
/// let hits = PerCpu::new(|_cpu| AtomicUsize::new(0)).unwrap();
/// hits.local().fetch_add(1, Relaxed);
/// let total: usize = hits.iter().map(|h| h.load(Relaxed)).sum();
/// assert_eq!(total, 1);
/// ```
pub struct PerCpu<T> {
    base: NonNull<u8>,
    /// Initialised slots (all of them once `with_cpus` returns).
    len: usize,
    /// Bytes mapped at `base`.
    map_bytes: usize,
    _owns: PhantomData<T>,
}

// SAFETY: PerCpu owns its Ts like a Box<[T]> does.
// - Send: moving the PerCpu moves ownership of every T to another thread, so T: Send.
// - Sync: &PerCpu hands out &T to any thread (local(), iter()), so T: Sync.
unsafe impl<T: Send> Send for PerCpu<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Sync> Sync for PerCpu<T> {}

impl<T> PerCpu<T> {
    /// One slot per [`possible`](crate::cpu::possible) CPU, each built by `init(cpu)`.
    /// Fails only if the kernel refuses the memory.
    ///
    /// ```
    /// use scalemem::cpu::{PerCpu, possible};
    ///
    /// let slots = PerCpu::new(|cpu| cpu * 2).unwrap();
    /// assert_eq!(slots.len(), possible());
    /// assert!(slots.iter().enumerate().all(|(cpu, &v)| v == cpu * 2));
    /// ```
    pub fn new(init: impl FnMut(usize) -> T) -> Result<Self, AllocError> {
        Self::with_cpus(crate::cpu::possible(), init)
    }

    /// `cpus` slots (at least 1), each built by `init(cpu)`.
    ///
    /// ```
    /// let slots = scalemem::cpu::PerCpu::with_cpus(3, |cpu| cpu * 10).unwrap();
    /// assert_eq!(slots.iter().copied().collect::<Vec<_>>(), [0, 10, 20]);
    /// ```
    pub fn with_cpus(cpus: usize, mut init: impl FnMut(usize) -> T) -> Result<Self, AllocError> {
        let len = cpus.max(1);
        // At compile time, so that no allocator path (which makes per-CPU slots when a
        // cache is made) holds a panic: 4 KiB, the least page size Linux has.
        const { assert!(align_of::<T>() <= 4096, "PerCpu slot alignment above a page") };
        // No overflow: size_of::<T>() <= isize::MAX and the alignment is at most a page.
        let stride = Self::STRIDE;
        let bytes = stride.checked_mul(len).ok_or(AllocError)?;
        let base = os::map(bytes)?;
        let mut this = Self { base, len: 0, map_bytes: bytes, _owns: PhantomData };
        for cpu in 0..len {
            // SAFETY: slot `cpu` lies inside the mapping (cpu < len, bytes = stride * len),
            // is aligned (page-aligned base, stride a multiple of align) and uninitialised.
            unsafe { this.slot_ptr(cpu).write(init(cpu)) };
            // A panicking `init` leaves `len` counting only initialised slots, which Drop
            // then drops before unmapping.
            this.len = cpu + 1;
        }
        Ok(this)
    }

    /// Number of slots.
    ///
    /// ```
    /// use scalemem::cpu::PerCpu;
    ///
    /// assert_eq!(PerCpu::with_cpus(4, |_| 0u8).unwrap().len(), 4);
    /// assert_eq!(PerCpu::with_cpus(0, |_| 0u8).unwrap().len(), 1); // at least one slot
    /// ```
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: there is at least one slot.
    ///
    /// ```
    /// let slots = scalemem::cpu::PerCpu::with_cpus(0, |cpu| cpu).unwrap();
    /// assert!(!slots.is_empty());
    /// assert_eq!(*slots.get(0), 0);
    /// ```
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    #[inline]
    fn slot_ptr(&self, cpu: usize) -> *mut T {
        // SAFETY: callers pass cpu < the mapped slot count; the offset stays in the mapping.
        unsafe { self.base.as_ptr().add(cpu * Self::STRIDE).cast() }
    }

    /// The slot of `cpu` (taken modulo the slot count).
    ///
    /// ```
    /// let slots = scalemem::cpu::PerCpu::with_cpus(3, |cpu| cpu * 10).unwrap();
    /// assert_eq!(*slots.get(1), 10);
    /// assert_eq!(*slots.get(4), 10); // 4 % 3 == 1
    /// ```
    #[inline]
    pub fn get(&self, cpu: usize) -> &T {
        let cpu = if cpu < self.len { cpu } else { cpu % self.len };
        // SAFETY: cpu < len, so the slot is initialised; it lives as long as &self.
        unsafe { &*self.slot_ptr(cpu) }
    }

    /// The slot of the CPU this thread is running on now.
    ///
    /// ```
    /// use scalemem::cpu::PerCpu;
    /// use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    ///
    /// let hits = PerCpu::new(|_| AtomicUsize::new(0)).unwrap();
    /// for _ in 0..10 {
    ///     hits.local().fetch_add(1, Relaxed); // whichever CPU we are on now
    /// }
    /// assert_eq!(hits.iter().map(|h| h.load(Relaxed)).sum::<usize>(), 10);
    /// ```
    #[inline]
    pub fn local(&self) -> &T {
        self.get(crate::cpu::current())
    }

    /// Every slot, in CPU order.
    ///
    /// ```
    /// let slots = scalemem::cpu::PerCpu::with_cpus(4, |cpu| cpu + 1).unwrap();
    /// assert_eq!(slots.iter().len(), 4);
    /// assert_eq!(slots.iter().sum::<usize>(), 1 + 2 + 3 + 4);
    /// ```
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &T> + '_ {
        (0..self.len).map(move |cpu| self.get(cpu))
    }

    /// Every slot, mutably.
    ///
    /// ```
    /// let mut slots = scalemem::cpu::PerCpu::with_cpus(3, |_| 0usize).unwrap();
    /// for (cpu, slot) in slots.iter_mut().enumerate() {
    ///     *slot = cpu * cpu;
    /// }
    /// assert_eq!(*slots.get(2), 4);
    /// assert_eq!(slots.iter().copied().collect::<Vec<_>>(), [0, 1, 4]);
    /// ```
    pub fn iter_mut(&mut self) -> impl ExactSizeIterator<Item = &mut T> + '_ {
        let this: &Self = self;
        // SAFETY: &mut self gives exclusive access to every slot; each index is yielded
        // once, so the &mut T never alias.
        (0..this.len).map(move |cpu| unsafe { &mut *this.slot_ptr(cpu) })
    }

    /// Base address, byte distance between slots, and slot count: what an rseq critical
    /// section needs to find the current CPU's slot itself.
    #[inline]
    pub(crate) fn raw_parts(&self) -> (*mut u8, usize, usize) {
        // The constant, not the field: a section then multiplies by an immediate
        // instead of a value it must load first.
        (self.base.as_ptr(), Self::STRIDE, self.len)
    }

    /// The distance between two slots, a compile-time constant (the size of `T`
    /// rounded up to its alignment, at least [`SLOT_ALIGN`]).
    pub(crate) const STRIDE: usize = {
        let align = if align_of::<T>() > SLOT_ALIGN { align_of::<T>() } else { SLOT_ALIGN };
        (size_of::<T>() + align - 1) & !(align - 1)
    };
}

impl<T> Drop for PerCpu<T> {
    fn drop(&mut self) {
        for cpu in 0..self.len {
            // SAFETY: slots 0..len are initialised and dropped once, here.
            unsafe { core::ptr::drop_in_place(self.slot_ptr(cpu)) };
        }
        // SAFETY: base/map_bytes are the mapping made in with_cpus; the slots are dropped.
        unsafe { os::unmap(self.base, self.map_bytes) };
    }
}

impl<T: core::fmt::Debug> core::fmt::Debug for PerCpu<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
