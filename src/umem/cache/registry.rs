//! The registry of live caches (for [`global_stats`](super::global_stats)) and the
//! background reaper, which calls [`update`](super::ObjectCache::update) on every cache
//! made with [`Config::reaper`](super::Config::reaper) every [`REAP_INTERVAL`](super::REAP_INTERVAL). Under loom
//! there is neither.

#[cfg(not(scalemem_loom))]
pub(super) use imp::*;
#[cfg(scalemem_loom)]
pub(super) use loom_imp::*;

#[cfg(not(scalemem_loom))]
mod imp {
    use core::ptr::NonNull;

    use super::super::{GlobalStats, Inner, REAP_INTERVAL};
    use crate::umem::vmem::lock::Lock;

    /// A registered cache: its state, and whether the reaper maintains it.
    struct Entry(NonNull<Inner>, bool);

    impl Entry {
        fn inner(&self) -> &Inner {
            // SAFETY: registered, so alive: removal takes the registry lock, which every
            // caller of this holds.
            unsafe { self.0.as_ref() }
        }
    }

    // SAFETY: `Inner` is Send + Sync (see `ObjectCache`); the pointer is dereferenced
    // only under the registry lock, which `ObjectCache::drop` takes to remove it before
    // freeing the state.
    unsafe impl Send for Entry {}

    /// The live caches, under a futex lock that `fork` handlers can hold across the
    /// fork (std's `Mutex` has no way to be released by a handler).
    static CACHES: Lock<Vec<Entry>> = Lock::new_const(Vec::new());

    pub(crate) fn add(inner: NonNull<Inner>, reaper: bool) {
        // Registered before the lock is taken: registration allocates.
        crate::umem::fork::register();
        CACHES.with(|caches| {
            caches.push(Entry(inner, reaper));
            if reaper {
                start_reaper();
            }
        });
    }

    pub(crate) fn remove(inner: NonNull<Inner>) {
        CACHES.with(|caches| caches.retain(|entry| entry.0 != inner));
    }

    pub(crate) fn sum() -> GlobalStats {
        CACHES.with(|caches| {
            let mut total = GlobalStats { caches: caches.len(), ..GlobalStats::default() };
            for entry in caches.iter() {
                let stats = entry.inner().stats();
                total.in_use += stats.in_use;
                total.cpu_rounds += stats.cpu_rounds;
                total.depot_full += stats.depot_full;
                total.depot_empty += stats.depot_empty;
                total.depot_contention += stats.depot_contention;
                total.slab_bytes += stats.slab_bytes;
            }
            total
        })
    }

    /// Whether `entries[i]` is the first entry over its region manager (each manager is
    /// locked once, by its first cache, and unlocked by the same rule).
    fn first_over_its_regions(entries: &[Entry], i: usize) -> bool {
        // `get`, not indexing (`i` is an entry's index): the fork handlers may hold no
        // formatting panic.
        let Some(regions) = entries.get(i).map(|e| e.inner().regions()) else { return false };
        !entries.iter().take(i).any(|e| core::ptr::eq(e.inner().regions(), regions))
    }

    /// The `fork` prepare step for registered caches: the registry lock (held until
    /// [`fork_unlock`]), then every cache's locks, then each of their region managers'.
    /// This is the order in which the reaper (registry, then a cache) and a cache's
    /// slab layer (slab, then regions) nest them.
    pub(crate) fn fork_lock() {
        CACHES.force_lock();
        // SAFETY: held through `force_lock` just above; the only reference.
        let entries = unsafe { CACHES.force_get() };
        for entry in entries.iter() {
            entry.inner().fork_lock();
        }
        for i in 0..entries.len() {
            if first_over_its_regions(entries, i) {
                entries[i].inner().regions().fork_lock();
            }
        }
    }

    /// The `fork` child's repairs for every registered cache (`CpuCaches::after_fork_in_child`).
    ///
    /// # Safety
    /// Called in the child of a `fork`, before it has started any other thread, while
    /// the registry lock taken by [`fork_lock`] in the parent is still held.
    pub(crate) unsafe fn after_fork_in_child() {
        // SAFETY: held since `fork_lock` (contract); the only reference.
        let entries = unsafe { CACHES.force_get() };
        for entry in entries.iter() {
            // SAFETY: the caller's contract; the cache is registered, so alive.
            unsafe { entry.inner().cpu.after_fork_in_child() };
        }
    }

    /// Releases what [`fork_lock`] took, in reverse order.
    ///
    /// # Safety
    /// `fork_lock` ran (here, or in the parent before the `fork` that made this process)
    /// and nothing released its locks since.
    pub(crate) unsafe fn fork_unlock() {
        // SAFETY: held since `fork_lock` (contract); the only reference.
        let entries = unsafe { CACHES.force_get() };
        for i in (0..entries.len()).rev() {
            if first_over_its_regions(entries, i) {
                // SAFETY: locked by `fork_lock`, by the same rule.
                unsafe { entries[i].inner().regions().fork_unlock() };
            }
        }
        for entry in entries.iter().rev() {
            // SAFETY: locked by `fork_lock`.
            unsafe { entry.inner().fork_unlock() };
        }
        // SAFETY: taken by `fork_lock` (contract).
        unsafe { CACHES.force_unlock() };
    }

    fn start_reaper() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            // If the thread cannot start, caches are still reaped by explicit calls.
            let _ = crate::os::spawn_signal_free(std::thread::Builder::new().name("umem-reaper".into()), || {
                loop {
                    std::thread::sleep(REAP_INTERVAL);
                    CACHES.with(|caches| {
                        for entry in caches.iter().filter(|entry| entry.1) {
                            entry.inner().update();
                        }
                    });
                }
            });
        });
    }
}

#[cfg(scalemem_loom)]
mod loom_imp {
    use core::ptr::NonNull;

    use super::super::Inner;

    pub(crate) fn add(_: NonNull<Inner>, _: bool) {}
    pub(crate) fn remove(_: NonNull<Inner>) {}
}
