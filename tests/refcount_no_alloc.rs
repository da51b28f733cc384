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
