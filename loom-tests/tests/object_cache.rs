//! loom models of umem's object cache: `destroy` racing with an alloc/free pair on
//! another thread, and two threads' free-time trims (no request lost). Magazines of 2 rounds on loom's 2 CPUs, locked mode (the only mode
//! under loom), a manual Refcache. No object may be lost (every constructed object is
//! destructed once, the slab layer ends empty), the teardown runs exactly once, and an
//! allocation that starts after `destroy` returned fails.
//!
//! ```text
//! ci/loom.sh object_cache
//! ```
//!
//! A mutation check: with the drain in `settle` removed (the operation that sees the
//! cache dead no longer drains), `destroy_races_alloc_free` fails (a round stranded in a
//! magazine: no teardown). With the trim's request protocol cut back to a plain
//! try-lock (the trimmer lets go after one round), `a_trim_request_is_not_lost_to_a_busy_trimmer`
//! fails (a full magazine left in the depot).
#![cfg(scalemem_loom)]

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use loom::sync::Arc;
use loom::thread;
use scalemem::refcount::Config as RefcacheConfig;
use scalemem::umem::cache::{CacheError, Config, ObjectCache};
use scalemem::umem::cpu_cache::Config as MagConfig;
use scalemem::umem::region::Regions;
use scalemem_loom_tests::run_model_long;

/// Branches per execution: a setup of 5 slab allocations and the drains take thousands.
const BRANCHES: usize = 20_000;

/// Magazines of 2 rounds, no resizing.
const TINY: MagConfig =
    MagConfig { initial_rounds: 2, min_rounds: 2, max_rounds: 2, grow_contention: 2, shrink_idle: 8 };

/// A counter shared with the constructor or destructor.
type Counter = std::sync::Arc<AtomicUsize>;

/// A cache whose constructor and destructor count (plain std atomics: read after the
/// joins) over a leaked manual region manager.
fn setup() -> (&'static Regions, Arc<ObjectCache>, Counter, Counter) {
    setup_with(Config { magazines: TINY, reaper: false, ..Config::default() })
}

/// [`setup`] with another configuration.
fn setup_with(config: Config) -> (&'static Regions, Arc<ObjectCache>, Counter, Counter) {
    let regions: &'static Regions =
        Box::leak(Box::new(Regions::builder().refcache(RefcacheConfig::manual()).retain(1).build().unwrap()));
    let ctors = std::sync::Arc::new(AtomicUsize::new(0));
    let dtors = std::sync::Arc::new(AtomicUsize::new(0));
    let (c, d) = (ctors.clone(), dtors.clone());
    let cache = ObjectCache::builder("loom", 64, 8)
        .ctor(Box::new(move |p: NonNull<u8>| {
            c.fetch_add(1, Relaxed);
            // SAFETY: 64 writable bytes.
            unsafe { p.cast::<u64>().write(0xC0) };
            Ok(())
        }))
        .dtor(Box::new(move |p: NonNull<u8>| {
            // SAFETY: a constructed object leaving the cache.
            assert_eq!(unsafe { p.cast::<u64>().read() }, 0xC0, "destructed twice or never constructed");
            // SAFETY: as above.
            unsafe { p.cast::<u64>().write(0xDD) };
            d.fetch_add(1, Relaxed);
        }))
        .regions(regions)
        .config(config)
        .build()
        .unwrap();
    (regions, Arc::new(cache), ctors, dtors)
}

/// Checks the books once every thread is joined, and reclaims the cache and manager.
fn finish(regions: &'static Regions, cache: Arc<ObjectCache>, ctors: Counter, dtors: Counter) {
    let cache = Arc::try_unwrap(cache).unwrap_or_else(|_| panic!("cache still shared"));
    assert_eq!(cache.alloc(), Err(CacheError::Destroyed), "allocation after destroy");
    let stats = cache.stats();
    assert!(stats.destroyed);
    assert_eq!(stats.teardowns, 1, "teardown ran {} times: {stats:?}", stats.teardowns);
    assert_eq!((stats.constructed, stats.cpu_rounds, stats.depot_full, stats.slabs), (0, 0, 0, 0), "{stats:?}");
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed), "an object was lost or destructed twice");
    cache.assert_valid();
    drop(cache);
    assert_eq!(regions.stats().runs, 0, "a slab outlived the teardown");
    // (Region release after the teardown is the region model's story: `region.rs`.)
    // SAFETY: every thread that used it was joined, the cache dropped; leaked once.
    unsafe { drop(Box::from_raw(std::ptr::from_ref(regions).cast_mut())) };
}

/// CPU 0 (main) caches 5 objects: 3 on its CPU, one full magazine in the depot. Thread 1
/// (CPU 1) allocates (taking the depot's full magazine, or missing to the slab layer
/// once destroy has begun) and frees, while main destroys the cache. Whatever the
/// interleaving, the rounds the other thread moves are drained (by destroy, or by the
/// thread itself when it sees the cache dead), and the teardown runs once, after the
/// last object is back.
#[test]
fn destroy_races_alloc_free() {
    run_model_long("object cache: destroy vs an alloc/free pair on another CPU", BRANCHES, || {
        let (regions, cache, ctors, dtors) = setup();
        let objects: Vec<_> = (0..5).map(|_| cache.alloc().unwrap()).collect();
        for p in objects {
            // SAFETY: from this cache, once.
            unsafe { cache.free(p) }.unwrap();
        }
        let other = Arc::clone(&cache);
        let t = thread::spawn(move || match other.alloc() {
            Ok(p) => {
                // SAFETY: a constructed object of this cache.
                assert_eq!(unsafe { p.cast::<u64>().read() }, 0xC0);
                // SAFETY: from this cache, once.
                unsafe { other.free(p) }.unwrap();
            }
            Err(e) => assert_eq!(e, CacheError::Destroyed),
        });
        cache.destroy();
        assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
        t.join().unwrap();
        finish(regions, cache, ctors, dtors);
    });
}

/// An object is out when destroy runs; the other thread frees it while main destroys.
/// The last free (or the destroy, if the free came first) runs the teardown, once.
#[test]
fn destroy_races_last_free() {
    run_model_long("object cache: destroy vs the last free", BRANCHES, || {
        let (regions, cache, ctors, dtors) = setup();
        let p = cache.alloc().unwrap();
        let q = cache.alloc().unwrap();
        // SAFETY: from this cache, once.
        unsafe { cache.free(q) }.unwrap();
        let addr = p.as_ptr() as usize;
        let other = Arc::clone(&cache);
        let t = thread::spawn(move || {
            let p = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: from this cache, freed once (this thread owns it now).
            unsafe { other.free(p) }.unwrap();
        });
        cache.destroy();
        t.join().unwrap();
        finish(regions, cache, ctors, dtors);
    });
}

/// Thread 1 (CPU 1) frees 3 objects: the third finds its loaded magazine full and
/// exchanges it with the depot (a full magazine in hand on its way to the depot's full
/// list) while main destroys the cache. The full magazine must not be stranded.
#[test]
fn destroy_races_free_depot_exchange() {
    run_model_long("object cache: destroy vs frees that exchange a full magazine", BRANCHES, || {
        let (regions, cache, ctors, dtors) = setup();
        let addrs: Vec<usize> = (0..3).map(|_| cache.alloc().unwrap().as_ptr() as usize).collect();
        let other = Arc::clone(&cache);
        let t = thread::spawn(move || {
            for addr in addrs {
                let p = NonNull::new(addr as *mut u8).unwrap();
                // SAFETY: from this cache, freed once (this thread owns them now).
                unsafe { other.free(p) }.unwrap();
            }
        });
        cache.destroy();
        assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
        t.join().unwrap();
        finish(regions, cache, ctors, dtors);
    });
}

/// The free-time trim loses no request (`cache.rs`, `Trim::state`). The threshold is
/// under one magazine, so every full magazine pushed into the depot asks for a trim, and
/// a trim empties the depot. Main (CPU 0) and thread 1 (CPU 1) each fill their two
/// magazines and push a third round, which sends a full magazine to the depot; if one
/// thread's push lands while the other is trimming, the trimmer must run another round
/// for it. Once both have returned, no full magazine may be left in the depot. (With the
/// trim a plain try-lock, the push that found it taken was never trimmed: this model
/// failed.)
#[test]
fn a_trim_request_is_not_lost_to_a_busy_trimmer() {
    run_model_long("object cache: a free's trim request while another thread trims", BRANCHES, || {
        let config = Config { magazines: TINY, reaper: false, trim_threshold: Some(64), ..Config::default() };
        let (regions, cache, ctors, dtors) = setup_with(config);
        let objects: Vec<usize> = (0..10).map(|_| cache.alloc().unwrap().as_ptr() as usize).collect();
        let (mine, theirs) = objects.split_at(5);
        let theirs = theirs.to_vec();
        let other = Arc::clone(&cache);
        let t = thread::spawn(move || {
            for &addr in &theirs {
                // SAFETY: from this cache, freed once (this thread owns them now).
                unsafe { other.free(NonNull::new(addr as *mut u8).unwrap()) }.unwrap();
            }
        });
        for &addr in mine {
            // SAFETY: from this cache, freed once.
            unsafe { cache.free(NonNull::new(addr as *mut u8).unwrap()) }.unwrap();
        }
        t.join().unwrap();
        let stats = cache.stats();
        assert_eq!(stats.depot_full, 0, "a trim request was lost: {stats:?}");
        assert!(stats.trims >= 1, "{stats:?}");
        cache.destroy();
        finish(regions, cache, ctors, dtors);
    });
}
