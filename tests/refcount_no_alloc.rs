//! The get/put paths of `PercpuRef` and the increment/decrement paths of `Refcache`
//! (hits, misses, evictions, flushes of the caller's own cache, direct header updates)
//! never call the global allocator: a counting allocator checks it on this thread.

#![cfg(not(scalemem_loom))]

mod common;

use common::counting_alloc::{Counting, allocations_in};
use scalemem::refcount::{Config, PercpuRef, Refcache};

#[global_allocator]
static GLOBAL: Counting = Counting;

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

#[test]
fn intrusive_inc_dec_revive_and_release_do_not_allocate() {
    use core::ptr::NonNull;
    use scalemem::refcount::{RcHeader, RcRelease};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);
    struct Count;
    impl RcRelease for Count {
        unsafe fn release(_: NonNull<RcHeader>) {
            RELEASED.fetch_add(1, Relaxed);
        }
    }
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let headers: Vec<RcHeader> = (0..512).map(|_| RcHeader::new::<Count>()).collect();
    let ptrs: Vec<NonNull<RcHeader>> = headers.iter().map(NonNull::from).collect();
    let n = allocations_in(|| {
        for &p in &ptrs {
            // SAFETY: fresh headers in `headers`, which outlives the domain's use of them.
            unsafe { cache.register(p) };
        }
        for _ in 0..4 {
            for &p in &ptrs {
                // SAFETY: we hold each header's creator reference.
                unsafe {
                    cache.inc(p);
                    cache.dec(p);
                }
            }
            cache.tick();
        }
        for &p in &ptrs {
            // SAFETY: the creator references, given up; then revived once and dropped.
            unsafe {
                cache.dec(p);
                cache.tick();
                if cache.try_revive(p) {
                    cache.dec(p);
                }
            }
        }
        for _ in 0..8 {
            cache.tick();
        }
    });
    assert_eq!(n, 0);
    assert_eq!(RELEASED.load(Relaxed), 512);
    drop(cache);
    drop(headers);
}
