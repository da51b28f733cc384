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
    use std::sync::Mutex;

    use super::super::{GlobalStats, Inner, REAP_INTERVAL};

    /// A registered cache: its state, and whether the reaper maintains it.
    struct Entry(NonNull<Inner>, bool);

    // SAFETY: `Inner` is Send + Sync (see `ObjectCache`); the pointer is dereferenced
    // only under the registry lock, which `ObjectCache::drop` takes to remove it before
    // freeing the state.
    unsafe impl Send for Entry {}

    static CACHES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    pub(crate) fn add(inner: NonNull<Inner>, reaper: bool) {
        let mut caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
        caches.push(Entry(inner, reaper));
        if reaper {
            start_reaper();
        }
    }

    pub(crate) fn remove(inner: NonNull<Inner>) {
        let mut caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
        caches.retain(|entry| entry.0 != inner);
    }

    pub(crate) fn sum() -> GlobalStats {
        let caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = GlobalStats { caches: caches.len(), ..GlobalStats::default() };
        for entry in caches.iter() {
            // SAFETY: registered, so alive (removal takes this lock).
            let stats = unsafe { entry.0.as_ref() }.stats();
            total.in_use += stats.in_use;
            total.cpu_rounds += stats.cpu_rounds;
            total.depot_full += stats.depot_full;
            total.depot_empty += stats.depot_empty;
            total.depot_contention += stats.depot_contention;
            total.slab_bytes += stats.slab_bytes;
        }
        total
    }

    fn start_reaper() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            // If the thread cannot start, caches are still reaped by explicit calls.
            let _ = std::thread::Builder::new().name("umem-reaper".into()).spawn(|| {
                loop {
                    std::thread::sleep(REAP_INTERVAL);
                    let caches = CACHES.lock().unwrap_or_else(|e| e.into_inner());
                    for entry in caches.iter().filter(|entry| entry.1) {
                        // SAFETY: registered, so alive (removal takes this lock).
                        unsafe { entry.0.as_ref() }.update();
                    }
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
