//! `fork` for the whole allocator: one set of `pthread_atfork` handlers, registered by
//! the first of the global heap and the first registered object cache, that takes every
//! lock of umem before the process is copied and releases them after, in the parent and
//! in the child. The child then inherits no structure half changed by a thread it will
//! not have, and no lock that such a thread holds (libumem does the same).
//!
//! # Lock order
//!
//! The prepare handler takes the locks in the order in which the allocator's own paths
//! nest them, so it cannot deadlock with a thread that is inside the allocator:
//!
//! 1. the registry of object caches (the reaper holds it while it reaps a cache, and a
//!    cache's creation allocates while it holds it);
//! 2. each registered cache's reconfiguration (and, in locked mode, slot) locks, then its
//!    slab lock (reaping drains magazines into the slab layer);
//! 3. each of their region managers: its Refcache's advancer and CPU-cache locks (which
//!    nobody waits on), then its lock (a slab takes pages from it);
//! 4. the global heap (its set-up, maintenance and creation locks, each size class's
//!    cache, its regions, the large heap): a registered cache's constructor or destructor
//!    may allocate through the global allocator while its cache's locks are held;
//! 5. the magazine pool, which every cache's magazines come from, outside every lock.
//!
//! Release is the reverse. A constructor or destructor must not create or drop an object
//! cache (the cache module's rule for the reaper): that would take the registry under a
//! cache's lock.
//!
//! # What the child inherits from threads it does not have
//!
//! Outside those locks a thread changes umem only by single commits (rseq sections,
//! compare-and-swaps on the depots' stacks), so every structure is whole in the copy.
//! Two things can still be mid-way: a depot list's count, which a push raises before its
//! compare-and-swap and a pop lowers after its own (the child recounts every depot before
//! it releases the locks); and what such a thread held in its hands (a round being
//! allocated or freed, a magazine between the depot and its CPU slot, a chunk between
//! the slab layer and its cache's counters), which is lost to the child like the rest of
//! that thread's memory: at most one object or magazine per thread and cache
//! (`ObjectCache::assert_valid_after_fork` checks that bound).

use core::sync::atomic::{AtomicBool, Ordering};

/// Registers the handlers once, and the epoch collector's (whose child handler must be
/// in place before umem pins under one of its locks). glibc's registration allocates and
/// takes the lock that `fork` holds while it runs the prepare handlers, which take
/// umem's locks: so this is called before the first of those locks is taken, never
/// under one.
pub(crate) fn register() {
    static DONE: AtomicBool = AtomicBool::new(false);
    crate::epoch::default::register_fork_handler();
    // Relaxed: only one caller registers; the handlers read nothing published here.
    if !DONE.swap(true, Ordering::Relaxed) {
        // SAFETY: the handlers are `extern "C"` functions that do not unwind.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    }
}

extern "C" fn prepare() {
    super::cache::fork_lock_registered();
    super::global::fork_lock();
    super::magazine::fork_lock();
}

/// Releases what `prepare` took.
fn release() {
    super::magazine::fork_unlock();
    // SAFETY: `prepare` took these before the fork, on this thread (in the child: the
    // thread that forked), and nothing released them since.
    unsafe {
        super::global::fork_unlock();
        super::cache::fork_unlock_registered();
    }
}

extern "C" fn parent() {
    release();
}

extern "C" fn child() {
    // The child is single-threaded: whoever was inside the allocator in the parent is
    // gone; the forking thread was not inside (fork is not called from an allocation).
    // First the repairs of what such a thread can leave inexact outside every lock (the
    // depots' counts), while the locks still keep out a thread the child may start from
    // a later atfork handler.
    // SAFETY: in the child, single-threaded, with every lock `prepare` took still held.
    unsafe {
        super::cache::after_fork_in_child_registered();
        super::global::after_fork_in_child();
    }
    release();
}
