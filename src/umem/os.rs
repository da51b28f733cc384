//! The bottom of umem: the only place in the allocator that talks to the kernel.
//!
//! It wraps the crate's `os` module (anonymous `mmap`/`munmap` through `rustix`, never
//! libc's `malloc`) and adds what the region layer needs: a mapping aligned to a large
//! power of two (2 MiB regions, made by over-mapping and trimming the head and tail) and
//! `madvise(MADV_DONTNEED)`, which gives a range's pages back while keeping it mapped.
//!
//! # Fault injection
//!
//! Every map made through this module first asks a per-thread budget, so a test can make
//! the kernel "refuse" memory at a chosen point ([`testing::fail_maps_after`]) and check
//! that every layer above fails cleanly and works again once maps are allowed
//! ([`testing::allow_maps`]). The budget is per thread so that tests running in parallel
//! in one binary do not fail each other's maps. It costs one thread-local read per map
//! (a system call follows anyway). Under loom there is no budget.
//!
//! ```
//! use scalemem::umem::os::testing;
//! use scalemem::umem::region::Regions;
//!
//! testing::fail_maps_after(0);
//! assert!(Regions::new().is_err()); // the manager's own page cannot be mapped
//! testing::allow_maps();
//! assert!(Regions::new().is_ok());
//! ```

use core::ptr::NonNull;

use crate::util::AllocError;

/// Asks the fault-injection budget for one map: `false` if it must fail.
#[cfg(not(scalemem_loom))]
#[inline]
fn may_map() -> bool {
    let counted = match testing::maps_left() {
        usize::MAX => true,
        0 => false,
        n => {
            testing::set_maps_left(n - 1);
            true
        }
    };
    counted && testing::random_map_allowed()
}

#[cfg(scalemem_loom)]
#[inline]
fn may_map() -> bool {
    true
}

/// The system page size.
///
/// ```
/// use scalemem::umem::os::page_size;
/// use scalemem::umem::vmem::{OsPages, Policy, Vmem};
///
/// let page = page_size();
/// assert!(page.is_power_of_two() && page >= 4096);
/// let heap = Vmem::builder("heap").source(&OsPages).build()?;
/// let p = heap.alloc(1, Policy::InstantFit)?;
/// assert_eq!(heap.stats().imported, page); // the kernel maps whole pages
/// heap.free(p, 1)?;
/// # Ok::<(), scalemem::umem::vmem::VmemError>(())
/// ```
#[inline]
pub fn page_size() -> usize {
    crate::os::page_size()
}

/// Maps `len` bytes (rounded up to pages) of zeroed read-write memory.
pub(crate) fn map(len: usize) -> Result<NonNull<u8>, AllocError> {
    if !may_map() {
        return Err(AllocError);
    }
    crate::os::map(len)
}

/// Unmaps memory from [`map`].
///
/// # Safety
/// 1. `ptr` and `len` are what [`map`] returned and was given.
/// 2. Nothing refers to the memory any more.
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: (1) and (2) are the caller's.
    unsafe { crate::os::unmap(ptr, len) }
}

/// Maps `len` bytes (a multiple of the page size) of zeroed memory aligned to `align` (a
/// power of two, at least the page size). The address space used transiently is `len +
/// align - page`; only `len` bytes stay mapped.
pub(crate) fn map_aligned(len: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
    if !may_map() {
        return Err(AllocError);
    }
    crate::os::map_aligned(len, align)
}

/// Unmaps memory from [`map_aligned`].
///
/// # Safety
/// 1. `ptr`, `len` and `align` are what [`map_aligned`] returned and was given.
/// 2. Nothing refers to the memory any more.
pub(crate) unsafe fn unmap_aligned(ptr: NonNull<u8>, len: usize, align: usize) {
    // SAFETY: (1) and (2) are the caller's.
    unsafe { crate::os::unmap_aligned(ptr, len, align) }
}

/// `madvise(MADV_DONTNEED)`: the pages of the range go back to the kernel, the range stays
/// mapped and reads as zeros. Returns whether the kernel accepted (a refusal leaves the
/// memory resident, which is only a missed saving).
///
/// # Safety
/// 1. The range is page-aligned and inside a mapping of ours.
/// 2. Nothing needs its contents any more.
pub(crate) unsafe fn dontneed(ptr: NonNull<u8>, len: usize) -> bool {
    #[cfg(not(scalemem_loom))]
    if testing::REFUSE_DONTNEED.get() {
        return false;
    }
    // SAFETY: (1) and (2) are the caller's.
    unsafe { crate::os::dontneed(ptr, len) }
}

/// Whether ranges of ours get transparent huge pages without asking: the system's
/// `always` mode (read once), or what [`testing::assume_thp_always`] set for this thread.
/// Under loom, never.
pub(crate) fn thp_always() -> bool {
    #[cfg(not(scalemem_loom))]
    {
        match testing::ASSUME_THP.get() {
            1 => true,
            2 => false,
            _ => crate::os::thp_always(),
        }
    }
    #[cfg(scalemem_loom)]
    false
}

/// `madvise(MADV_NOHUGEPAGE)` on a range: no huge page backs it from now on (at fault
/// time or by `khugepaged`'s collapse, which would make pages given back resident
/// again). Returns whether the kernel accepted. Under loom, nothing (and `true`).
///
/// # Safety
/// The range is page-aligned and inside a mapping of ours.
pub(crate) unsafe fn no_huge_pages(ptr: NonNull<u8>, len: usize) -> bool {
    #[cfg(not(scalemem_loom))]
    {
        // SAFETY: the caller's.
        unsafe { crate::os::no_huge_pages(ptr, len) }
    }
    #[cfg(scalemem_loom)]
    {
        let _ = (ptr, len);
        true
    }
}

/// Fault injection for tests (outside semver): make this thread's maps fail, or its
/// page give-backs be refused.
#[doc(hidden)]
#[cfg(not(scalemem_loom))]
pub mod testing {
    // Initial-exec words (read on every map, inside `malloc`): see `ie_thread_local!`.
    crate::sync::ie_thread_local! {
        /// Maps this thread may still make before they fail, plus one (wrapping); 0, the
        /// initial value, is `usize::MAX`: no limit.
        static MAPS_LEFT_PLUS_ONE: usize;
        /// Random refusals: the xorshift state.
        static RANDOM_STATE: u64;
        /// Random refusals: one map in how many fails; 0: off.
        static RANDOM_ONE_IN: u32;
        /// Set: this thread's `madvise(MADV_DONTNEED)` calls are refused.
        pub(super) static REFUSE_DONTNEED: bool;
        /// 0: ask the system whether huge pages are on by default; 1: assume they are;
        /// 2: assume they are not.
        pub(super) static ASSUME_THP: u32;
    }

    /// Makes this thread's allocator layers act as if the system backed anonymous
    /// memory with transparent huge pages by default (`Some(true)`: `always` mode), or
    /// did not (`Some(false)`), or ask the system again (`None`); for tests on machines
    /// whose mode is `madvise`.
    ///
    /// ```
    /// scalemem::umem::os::testing::assume_thp_always(Some(true));
    /// scalemem::umem::os::testing::assume_thp_always(None);
    /// ```
    pub fn assume_thp_always(assume: Option<bool>) {
        ASSUME_THP.set(match assume {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        });
    }

    /// Makes this thread's page give-backs (`madvise(MADV_DONTNEED)` through
    /// `umem::os`) fail, as if the kernel refused them (`true`), or go to the kernel
    /// again (`false`).
    ///
    /// ```
    /// scalemem::umem::os::testing::refuse_dontneed(true);
    /// scalemem::umem::os::testing::refuse_dontneed(false);
    /// ```
    pub fn refuse_dontneed(refuse: bool) {
        REFUSE_DONTNEED.set(refuse);
    }

    /// Maps this thread may still make before they fail; `usize::MAX`: no limit.
    #[inline]
    pub(super) fn maps_left() -> usize {
        MAPS_LEFT_PLUS_ONE.get().wrapping_sub(1)
    }

    /// Sets [`maps_left`].
    #[inline]
    pub(super) fn set_maps_left(n: usize) {
        MAPS_LEFT_PLUS_ONE.set(n.wrapping_add(1));
    }

    /// From now on, this thread's next `n` maps through `umem::os` succeed (if the kernel
    /// agrees) and every later one fails, until [`allow_maps`].
    ///
    /// ```
    /// scalemem::umem::os::testing::fail_maps_after(3);
    /// scalemem::umem::os::testing::allow_maps();
    /// ```
    pub fn fail_maps_after(n: usize) {
        set_maps_left(n.min(usize::MAX - 1));
    }

    /// Lifts the limit set by [`fail_maps_after`].
    ///
    /// ```
    /// scalemem::umem::os::testing::allow_maps();
    /// ```
    pub fn allow_maps() {
        set_maps_left(usize::MAX);
        RANDOM_STATE.set(0);
        RANDOM_ONE_IN.set(0);
    }

    /// From now on, each of this thread's maps through `umem::os` fails with probability
    /// `1 / one_in` (a seeded xorshift sequence, so a failing run can be replayed), until
    /// [`allow_maps`]. Combines with [`fail_maps_after`]: a map must pass both.
    ///
    /// ```
    /// use scalemem::umem::global::{free, malloc};
    /// use scalemem::umem::os::testing;
    ///
    /// testing::fail_maps_randomly(42, 2);
    /// let blocks: Vec<*mut u8> = (0..64).map(|_| malloc(1 << 20)).collect();
    /// testing::allow_maps();
    /// // Some were refused (null), the rest are usable; all can be freed.
    /// for p in blocks {
    ///     // SAFETY: from `malloc` (or null), freed once.
    ///     unsafe { free(p) };
    /// }
    /// assert!(!malloc(1 << 20).is_null());
    /// ```
    pub fn fail_maps_randomly(seed: u64, one_in: u32) {
        // A zero state would stay zero: the seed is mixed with a constant.
        RANDOM_STATE.set(seed ^ 0x9e37_79b9_7f4a_7c15 | 1);
        RANDOM_ONE_IN.set(one_in);
    }

    /// Draws for one map under [`fail_maps_randomly`]: `false` if it must fail.
    #[inline]
    pub(super) fn random_map_allowed() -> bool {
        let one_in = RANDOM_ONE_IN.get();
        if one_in == 0 {
            return true;
        }
        let mut x = RANDOM_STATE.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        RANDOM_STATE.set(x);
        !x.is_multiple_of(u64::from(one_in))
    }
}
