//! Magazines: fixed-capacity arrays of rounds (constructed objects), and the
//! `os::map`-backed pool their memory comes from.
//!
//! A magazine is a header followed by `cap` round words:
//!
//! ```text
//! #[repr(C)] Magazine { link: Retired (32 bytes), next: AtomicUsize, cap: usize, pad: [usize; 2],
//!                       rounds: [*mut u8; cap] }    // rounds at byte 64 = rseq::mag_layout::ROUNDS
//! ```
//!
//! - `link` comes first, so a `*mut Retired` from [`Guard::retire`] is a `*mut Magazine`:
//!   the reaper retires magazines without allocating.
//! - `next` links the magazine into a depot stack (written by the pusher before its
//!   Release CAS, read by poppers; an atomic because a stale popper may read it while a
//!   new owner rewrites it).
//! - `cap` is set when the magazine is made and never changes: magazines of several sizes
//!   may coexist for a while after a resize.
//! - How many of the rounds are valid is not stored in the magazine: in a CPU slot the
//!   slot's state word says it; in the depot, the list says it (full: `cap`, empty: 0).
//!
//! # The pool
//!
//! Magazine memory never comes from the global allocator. Outside loom a process-wide
//! pool carves blocks of 256, 512, ... 4096 bytes (each aligned to its size) out of
//! 64 KiB chunks from [`os::map`](crate::os), one chunk at a time per block size (so a
//! page holds blocks of one size), and keeps freed blocks' addresses on one stack per
//! block size, in a side mapping, under a spin lock held for a few instructions.
//! Because free blocks are not linked through their own memory, [`trim`] (called by
//! reaps) can give every page whose blocks are all free back to the kernel
//! (`MADV_DONTNEED`) while the blocks stay on their stacks: after a burst of frees
//! fills thousands of depot magazines, their memory goes back with the objects'. The
//! chunks stay mapped. Under loom each magazine is its own mapping (loom's `os::map`
//! is the global allocator).
//!
//! Invariants: a block is on at most one free stack; a block handed out is 256-byte
//! aligned and below 2^48 (the depot packs a version tag into the other bits of its
//! head word, `depot.rs`); a magazine is returned to the pool only through
//! [`Magazine::retire`] after an epoch grace period, or directly by a holder that can prove no
//! other thread can reach it.

use core::ptr::NonNull;

use crate::cpu::rseq::mag_layout;
use crate::epoch::{Guard, Retired};
use crate::sync::atomic::{AtomicUsize, Ordering};

/// Alignment of magazine blocks: the depot keeps 8 bits of its version tag below it.
pub(crate) const MAG_ALIGN: usize = 256;

/// A magazine header; the rounds follow at byte [`mag_layout::ROUNDS`].
#[repr(C)]
pub(crate) struct Magazine {
    /// Intrusive retirement link (first field: a `*mut Retired` is a `*mut Magazine`).
    link: Retired,
    /// Depot stack link (a `*mut Magazine` as an address).
    pub(crate) next: AtomicUsize,
    /// Number of round words after the header; fixed.
    cap: usize,
}

/// Bytes of a magazine with `cap` rounds.
const fn magazine_bytes(cap: usize) -> usize {
    mag_layout::ROUNDS + cap * size_of::<*mut u8>()
}

#[cfg(not(scalemem_loom))]
const _: () = assert!(size_of::<Magazine>() <= mag_layout::ROUNDS && size_of::<Retired>() == 32);

impl Magazine {
    /// Makes an empty magazine of `cap` rounds (`1..=MAX_CAP`); `None` if the pool
    /// cannot get memory from the kernel.
    pub(crate) fn create(cap: usize) -> Option<NonNull<Magazine>> {
        debug_assert!((1..=mag_layout::MAX_CAP).contains(&cap));
        let block = pool::alloc(magazine_bytes(cap))?;
        let mag = block.cast::<Magazine>();
        // SAFETY: the block is fresh, 256-byte aligned and large enough for the header
        // and `cap` rounds; nobody else refers to it.
        unsafe { mag.as_ptr().write(Magazine { link: Retired::new(), next: AtomicUsize::new(0), cap }) };
        Some(mag)
    }

    /// The magazine's capacity.
    ///
    /// # Safety
    /// `mag` is a live magazine (made by [`create`](Self::create), not yet freed).
    #[inline]
    pub(crate) unsafe fn cap(mag: NonNull<Magazine>) -> usize {
        // SAFETY: live (contract); `cap` is written once, before the magazine is shared.
        unsafe { (*mag.as_ptr()).cap }
    }

    /// The address of round word `i`.
    ///
    /// # Safety
    /// `mag` is live and `i < cap`.
    #[inline]
    pub(crate) unsafe fn round(mag: NonNull<Magazine>, i: usize) -> *mut *mut u8 {
        // SAFETY: the round words lie right after the header, inside the block (i < cap).
        unsafe { mag.as_ptr().cast::<u8>().add(mag_layout::ROUNDS).cast::<*mut u8>().add(i) }
    }

    /// Hands rounds `0..n` to `sink`, top first.
    ///
    /// # Safety
    /// The caller owns `mag` exclusively, and its first `n <= cap` round words hold rounds.
    pub(crate) unsafe fn empty_into(mag: NonNull<Magazine>, n: usize, sink: &mut dyn FnMut(NonNull<u8>)) {
        for i in (0..n).rev() {
            // SAFETY: exclusive owner, i < n <= cap (contract).
            let round = unsafe { *Self::round(mag, i) };
            match NonNull::new(round) {
                Some(round) => sink(round),
                None => debug_assert!(false, "magazine: null round"),
            }
        }
    }

    /// Returns the magazine's memory to the pool at once.
    ///
    /// # Safety
    /// No other thread can reach `mag` any more, now or later (it is in no depot list,
    /// no CPU slot, and no popper may still read its `next`).
    pub(crate) unsafe fn destroy(mag: NonNull<Magazine>) {
        // SAFETY: live (contract).
        let bytes = magazine_bytes(unsafe { Self::cap(mag) });
        // SAFETY: the header holds no resource needing a drop except (under loom) a model
        // atomic, which loom does not require us to drop; the block came from pool::alloc
        // with this size and is unreachable (contract).
        unsafe { pool::free(mag.cast(), bytes) };
    }

    /// Returns the magazine's memory to the pool once no pinned thread can hold it.
    ///
    /// # Safety
    /// `mag` is unreachable for any thread that pins from now on (popped from the depot
    /// or taken from a stopped CPU slot), and retired once.
    pub(crate) unsafe fn retire(mag: NonNull<Magazine>, guard: &Guard) {
        // Relaxed: a hint (see RETIRED).
        #[cfg(not(scalemem_loom))]
        RETIRED.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        // SAFETY: `link` is the first field, so the cast is the link's address; the
        // magazine stays valid until `reclaim` runs and nobody else touches the link
        // (contract); `reclaim` frees exactly a magazine from its link.
        unsafe { guard.retire(mag.cast::<Retired>(), reclaim) };
    }
}

/// Magazines retired and not yet reclaimed, process-wide: a hint for [`trim`], which
/// drives the epoch collector (a `membarrier` per advance) only while some are waiting,
/// so that a maintenance pass over idle caches interrupts no CPU. Relaxed: nothing is
/// published through it; a stale reading costs one needless or one postponed flush.
#[cfg(not(scalemem_loom))]
static RETIRED: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Gives the pages of free magazine blocks back to the kernel (see "The pool"): first,
/// if any magazine awaits reclamation ([`RETIRED`]), this thread's retired magazines are
/// handed to the epoch collector, which frees those
/// whose grace period has passed. With `settle` (after a drain that retired magazines
/// just now) the collector is then driven, unpinned, through whole grace periods until
/// what it holds is freed ([`Collector::settle`](crate::epoch::Collector)): otherwise a
/// drain of thousands of magazines waited for two more advances and for many bounded
/// collects, and a cache that went idle kept their pages (it could be megabytes) until
/// some later pin. Returns the bytes given back.
pub(crate) fn trim(settle: bool) -> usize {
    // Relaxed: a hint (see RETIRED).
    #[cfg(not(scalemem_loom))]
    if RETIRED.load(core::sync::atomic::Ordering::Relaxed) != 0 {
        crate::epoch::pin().flush();
        if settle {
            // A few advances: two pass a grace period; more only while each frees.
            crate::epoch::default_collector().settle(4);
        }
    }
    #[cfg(scalemem_loom)]
    let _ = settle;
    pool::trim()
}

/// Holds the magazine pool's lock across `fork` (see `umem::global`): magazines are made
/// and freed outside every other lock, so a thread of the parent may hold it.
pub(crate) fn fork_lock() {
    pool::fork_lock();
}

/// Releases what [`fork_lock`] took, in the parent and in the child.
pub(crate) fn fork_unlock() {
    pool::fork_unlock();
}

/// The reclaim function of retired magazines.
///
/// # Safety
/// `link` is the link of a magazine retired by [`Magazine::retire`], whose grace period
/// has passed.
unsafe fn reclaim(link: NonNull<Retired>) {
    // Relaxed: a hint (see RETIRED).
    #[cfg(not(scalemem_loom))]
    RETIRED.fetch_sub(1, core::sync::atomic::Ordering::Relaxed);
    // SAFETY: the link is the magazine's first field, and nobody can reach it any more.
    unsafe { Magazine::destroy(link.cast::<Magazine>()) };
}

#[cfg(not(scalemem_loom))]
mod pool {
    use core::ptr::{self, NonNull};

    use super::{MAG_ALIGN, asan};
    use crate::sync::UnsafeCell;
    use crate::sync::atomic::{AtomicBool, Ordering};
    use crate::util::Backoff;

    /// Block sizes 256 << class for class in 0..CLASSES (256 B to 4 KiB).
    const CLASSES: usize = 5;
    /// Bytes mapped at a time, per class.
    const CHUNK: usize = 64 * 1024;
    /// The kernel's page: the unit [`trim`] gives back.
    const PAGE: usize = 4096;
    /// Free-stack entries per class (8 MiB of address space each, touched as used: room
    /// for 2^20 free magazines, far above any real cache). A free that finds its stack
    /// full drops the block (counted, never reused): a bounded leak rather than a
    /// failure.
    const STACK_ENTRIES: usize = 1 << 20;
    /// Frees between two trims that do any work.
    const TRIM_AFTER: usize = 256;

    /// A class's free blocks, as addresses in a side mapping (not linked through the
    /// blocks, so a whole page of free blocks can be given back without losing them).
    struct Stack {
        /// `STACK_ENTRIES` words, mapped on the class's first free (null before).
        words: *mut usize,
        len: usize,
    }

    struct Pool {
        /// Spin lock over everything below; held for a few instructions, except in
        /// `trim` (rare: a reap), never across a call that could allocate.
        lock: AtomicBool,
        free: [UnsafeCell<Stack>; CLASSES],
        /// Each class's current chunk's unused range (classes never share a page).
        bump: [UnsafeCell<(usize, usize)>; CLASSES],
        /// Frees since the last trim; blocks dropped because a stack was full.
        counts: UnsafeCell<(usize, usize)>,
    }

    // SAFETY: every field but `lock` is accessed only under `lock` (Acquire on taking
    // it, Release on dropping it); the blocks and stacks they point to are owned by the
    // pool until handed out.
    unsafe impl Sync for Pool {}

    static POOL: Pool = Pool {
        lock: AtomicBool::new(false),
        free: [const { UnsafeCell::new(Stack { words: ptr::null_mut(), len: 0 }) }; CLASSES],
        bump: [const { UnsafeCell::new((0, 0)) }; CLASSES],
        counts: UnsafeCell::new((0, 0)),
    };

    fn class_of(bytes: usize) -> Option<usize> {
        (0..CLASSES).find(|&c| bytes <= MAG_ALIGN << c)
    }

    fn with_lock<R>(f: impl FnOnce() -> R) -> R {
        let backoff = Backoff::new();
        // Acquire: pairs with the Release store below, so this holder sees the previous
        // holder's list and bump updates.
        while POOL.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
        let result = f();
        // Release: publishes this holder's updates to the next.
        POOL.lock.store(false, Ordering::Release);
        result
    }

    pub(super) fn alloc(bytes: usize) -> Option<NonNull<u8>> {
        let class = class_of(bytes)?;
        let size = MAG_ALIGN << class;
        loop {
            let got = with_lock(|| {
                let popped = POOL.free[class].with_mut(|s| {
                    // SAFETY: under the lock; the first `len` words of a mapped stack are
                    // free blocks of this class.
                    unsafe {
                        let s = &mut *s;
                        if s.len == 0 {
                            return ptr::null_mut();
                        }
                        s.len -= 1;
                        ptr::with_exposed_provenance_mut::<u8>(*s.words.add(s.len))
                    }
                });
                if !popped.is_null() {
                    return Some(popped);
                }
                POOL.bump[class].with_mut(|b| {
                    // SAFETY: under the lock.
                    let (start, end) = unsafe { *b };
                    let aligned = (start + size - 1) & !(size - 1);
                    if start != 0 && aligned + size <= end {
                        // SAFETY: under the lock.
                        unsafe { *b = (aligned + size, end) };
                        Some(ptr::with_exposed_provenance_mut::<u8>(aligned))
                    } else {
                        None
                    }
                })
            });
            if let Some(block) = got {
                let block = NonNull::new(block)?;
                asan::unpoison(block, size);
                return Some(block);
            }
            // Map a chunk outside the lock; a racing thread may map one too, and the
            // loser's chunk simply replaces the winner's remaining range (that tail, at
            // most one chunk per race, is never used: a bounded waste).
            // Through umem's OS layer, so fault injection reaches magazines too.
            let chunk = super::super::os::map(CHUNK).ok()?;
            let base = chunk.as_ptr().expose_provenance();
            if base + CHUNK > 1 << 48 {
                return None;
            }
            with_lock(|| {
                // SAFETY: under the lock.
                POOL.bump[class].with_mut(|b| unsafe { *b = (base, base + CHUNK) });
            });
        }
    }

    /// # Safety
    /// `block` came from `alloc(bytes)` and nobody refers to it any more.
    pub(super) unsafe fn free(block: NonNull<u8>, bytes: usize) {
        let Some(class) = class_of(bytes) else { return };
        // A freed block is poisoned under AddressSanitizer, so a thread that touches a
        // magazine after its grace period is reported.
        asan::poison(block, MAG_ALIGN << class);
        // The class's stack is mapped outside the lock on its first free; a racing
        // mapper's copy is unmapped.
        // SAFETY: under the lock (a read of the pointer).
        if with_lock(|| POOL.free[class].with_mut(|s| unsafe { (*s).words.is_null() })) {
            let Ok(words) = crate::os::map(STACK_ENTRIES * size_of::<usize>()) else {
                // No memory for the stack: drop the block (counted).
                // SAFETY: under the lock.
                with_lock(|| POOL.counts.with_mut(|c| unsafe { (*c).1 += 1 }));
                return;
            };
            let lost = with_lock(|| {
                POOL.free[class].with_mut(|s| {
                    // SAFETY: under the lock.
                    unsafe {
                        if (*s).words.is_null() {
                            (*s).words = words.as_ptr().cast();
                            false
                        } else {
                            true
                        }
                    }
                })
            });
            if lost {
                // SAFETY: mapped above with this length, never published.
                unsafe { crate::os::unmap(words, STACK_ENTRIES * size_of::<usize>()) };
            }
        }
        with_lock(|| {
            POOL.free[class].with_mut(|s| {
                // SAFETY: under the lock; the stack is mapped (above, never unmapped)
                // and `len < STACK_ENTRIES` is checked before the write.
                unsafe {
                    let s = &mut *s;
                    if s.len < STACK_ENTRIES {
                        *s.words.add(s.len) = block.as_ptr().expose_provenance();
                        s.len += 1;
                        POOL.counts.with_mut(|c| (*c).0 += 1);
                    } else {
                        POOL.counts.with_mut(|c| (*c).1 += 1);
                    }
                }
            });
        });
    }

    /// Takes the pool's lock without a scope, for `fork` (the global allocator's prepare
    /// handler takes it last: nothing is taken while it is held).
    pub(crate) fn fork_lock() {
        let backoff = Backoff::new();
        // Acquire: as in `with_lock`.
        while POOL.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            backoff.snooze();
        }
    }

    /// Releases what [`fork_lock`] took (in the parent and in the child).
    pub(crate) fn fork_unlock() {
        // Release: as in `with_lock`.
        POOL.lock.store(false, Ordering::Release);
    }

    /// Gives back to the kernel (`MADV_DONTNEED`) every page whose blocks are all free,
    /// if enough frees happened since the last trim; the blocks stay in their stacks (a
    /// reuse faults in a zero page, and every magazine is initialised when made).
    /// Returns the bytes given back. Sorts each stack under the lock: for reaps only.
    pub(crate) fn trim() -> usize {
        with_lock(|| {
            // SAFETY: under the lock.
            let due = POOL.counts.with_mut(|c| unsafe {
                let due = (*c).0 >= TRIM_AFTER;
                if due {
                    (*c).0 = 0;
                }
                due
            });
            if !due {
                return 0;
            }
            let mut given = 0;
            for class in 0..CLASSES {
                let per_page = PAGE / (MAG_ALIGN << class);
                POOL.free[class].with_mut(|s| {
                    // SAFETY: under the lock; the first `len` words of a mapped stack
                    // are the class's free blocks, ours to reorder.
                    let words = unsafe {
                        let s = &mut *s;
                        if s.words.is_null() {
                            return;
                        }
                        core::slice::from_raw_parts_mut(s.words, s.len)
                    };
                    words.sort_unstable();
                    // Runs of consecutive wholly free pages, each given back in one call.
                    let mut run: Option<(usize, usize)> = None;
                    let mut i = 0;
                    while i < words.len() {
                        let page = words[i] & !(PAGE - 1);
                        let mut j = i;
                        while j < words.len() && words[j] & !(PAGE - 1) == page {
                            j += 1;
                        }
                        if j - i == per_page {
                            run = match run {
                                Some((start, end)) if end == page => Some((start, page + PAGE)),
                                other => {
                                    given += give_back(other);
                                    Some((page, page + PAGE))
                                }
                            };
                        }
                        i = j;
                    }
                    given += give_back(run);
                });
            }
            given
        })
    }

    /// `MADV_DONTNEED` over a run of wholly free pages; its length, or 0.
    fn give_back(run: Option<(usize, usize)>) -> usize {
        let Some((start, end)) = run else { return 0 };
        // SAFETY: the run is whole pages of pool chunks (mapped, never unmapped) whose
        // blocks are all free: nobody reads them until a block is handed out again,
        // initialised then.
        let ok = unsafe {
            crate::umem::os::dontneed(NonNull::new_unchecked(ptr::with_exposed_provenance_mut(start)), end - start)
        };
        if ok { end - start } else { 0 }
    }
}

/// AddressSanitizer hooks for the pool (no-ops unless built with `--cfg scalemem_asan`).
#[cfg(not(scalemem_loom))]
mod asan {
    use core::ptr::NonNull;

    #[cfg(scalemem_asan)]
    unsafe extern "C" {
        fn __asan_poison_memory_region(addr: *const core::ffi::c_void, size: usize);
        fn __asan_unpoison_memory_region(addr: *const core::ffi::c_void, size: usize);
    }

    /// Marks a freed block unreachable.
    #[inline]
    pub(super) fn poison(_block: NonNull<u8>, _size: usize) {
        #[cfg(scalemem_asan)]
        // SAFETY: the sanitizer runtime is linked (the cfg is set only with it); the
        // range lies inside a live mapping of the pool.
        unsafe {
            __asan_poison_memory_region(_block.as_ptr().cast(), _size)
        };
    }

    /// Makes a block handed out accessible again.
    #[inline]
    pub(super) fn unpoison(_block: NonNull<u8>, _size: usize) {
        #[cfg(scalemem_asan)]
        // SAFETY: as in poison.
        unsafe {
            __asan_unpoison_memory_region(_block.as_ptr().cast(), _size)
        };
    }
}

#[cfg(scalemem_loom)]
mod pool {
    use core::ptr::NonNull;

    pub(super) fn alloc(bytes: usize) -> Option<NonNull<u8>> {
        crate::os::map(bytes).ok()
    }

    /// # Safety
    /// `block` came from `alloc(bytes)` and nobody refers to it any more.
    pub(super) unsafe fn free(block: NonNull<u8>, bytes: usize) {
        // SAFETY: mapped by alloc with this length; unreachable (contract).
        unsafe { crate::os::unmap(block, bytes) };
    }

    /// Nothing to give back: every freed magazine is unmapped at once.
    pub(crate) fn trim() -> usize {
        0
    }

    /// No lock to hold under loom.
    pub(crate) fn fork_lock() {}

    /// No lock to release under loom.
    pub(crate) fn fork_unlock() {}
}

/// Loads a magazine's `next` link.
#[inline]
pub(crate) fn next_of(mag: NonNull<Magazine>) -> usize {
    // SAFETY: callers pass a magazine they own or are pinned for (depot pop), so it has
    // not been returned to the pool.
    let mag = unsafe { mag.as_ref() };
    // Relaxed: the depot's Acquire load of the head (which pairs with the pusher's
    // Release CAS) orders this load after the pusher's store of the link.
    mag.next.load(Ordering::Relaxed)
}

/// Stores a magazine's `next` link.
#[inline]
pub(crate) fn set_next(mag: NonNull<Magazine>, next: usize) {
    // SAFETY: the caller owns the magazine (it is in no list).
    let mag = unsafe { mag.as_ref() };
    // Relaxed: published by the depot push's Release CAS.
    mag.next.store(next, Ordering::Relaxed);
}
