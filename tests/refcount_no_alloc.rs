//! The get/put paths of `PercpuRef` and the increment/decrement paths of `Refcache`
//! (hits, misses, evictions, flushes of the caller's own cache, direct header updates)
//! never call the global allocator: a counting allocator checks it on this thread.

#![cfg(not(scalemem_loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use scalemem::refcount::{Config, PercpuRef, Refcache};

struct Counting;

std::thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to System; the counter is a const-initialised thread-local without a
// destructor, so counting never allocates or re-enters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn percpu_ref_get_put_do_not_allocate() {
    let r = PercpuRef::new(|| {}).unwrap();
    let n = allocations_in(|| {
        for _ in 0..10_000 {
            r.get();
            assert!(r.tryget_live());
            r.put();
            r.put();
        }
        r.switch_to_atomic_sync();
        for _ in 0..1_000 {
            r.get();
            r.put();
        }
        r.switch_to_percpu();
        r.kill();
    });
    assert_eq!(n, 0);
}

#[test]
fn refcache_inc_dec_do_not_allocate() {
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let objects: Vec<_> = (0..1_000).map(|i| cache.alloc(i)).collect();
    let mut clones = Vec::with_capacity(4_000);
    let n = allocations_in(|| {
        for round in 0..4 {
            for object in &objects {
                clones.push(object.clone()); // misses and evictions: 1000 objects, 256 ways
            }
            if round == 2 {
                cache.tick(); // then the next miss flushes its own lagging cache
            }
        }
        clones.clear();
    });
    assert_eq!(n, 0);
    drop(objects);
    for _ in 0..4 {
        cache.tick();
    }
    assert_eq!(cache.stats().live, 0);
}
