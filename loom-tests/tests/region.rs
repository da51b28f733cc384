//! loom models of `umem::region`: a region whose last slab is freed, an allocation on
//! another thread that wants a run, and Refcache ticks reviewing the region, all at once.
//! The release callback must run exactly once or the revival must win, never both, and
//! the allocation must never land in a released region. Under loom a region is 64 KiB
//! (14 usable pages), the registry is a token, and each model ends with `assert_valid`
//! and a drain that releases every region.
//!
//! ```text
//! ci/loom.sh region
//! ```
#![cfg(scalemem_loom)]

use loom::thread;

static ITERATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

use scalemem::refcount::Config;
use scalemem::umem::region::Regions;
use scalemem::umem::slab::SlabCache;
use scalemem_loom_tests::run_model;

/// A manager and one cache over it, leaked for `'static` (model threads need it) and
/// reclaimed by `finish`.
fn setup() -> (&'static Regions, &'static SlabCache<'static>) {
    let regions: &'static Regions =
        Box::leak(Box::new(Regions::builder().refcache(Config::manual()).retain(1).build().unwrap()));
    // max_empty(0): freeing a slab's last object gives its run back to the region.
    let cache: &'static SlabCache<'static> =
        Box::leak(Box::new(SlabCache::builder(regions, "loom", 256, 8).max_empty(0).build().unwrap()));
    (regions, cache)
}

/// Frees `q`, ticks until every region is released, checks the books, and reclaims the
/// leaked manager and cache.
fn finish(regions: &'static Regions, cache: &'static SlabCache<'static>, q: core::ptr::NonNull<u8>) {
    let n = ITERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if n.is_multiple_of(1000) {
        eprintln!("iteration {n}: {:?}", regions.stats());
    }
    // SAFETY: `q` came from `cache` and is freed once.
    unsafe { cache.free(q) }.unwrap();
    cache.assert_valid();
    regions.assert_valid();
    let mut ticks = 0;
    while regions.stats().live_regions != 0 {
        regions.tick();
        ticks += 1;
        assert!(ticks <= 6, "an empty region was never released: {:?}", regions.stats());
    }
    let stats = regions.stats();
    assert_eq!(stats.runs, 0);
    assert_eq!(stats.retained_regions, 1, "{stats:?}");
    regions.assert_valid();
    // SAFETY: every thread that used them was joined; each was leaked once, above.
    unsafe {
        drop(Box::from_raw(std::ptr::from_ref(cache).cast_mut()));
        drop(Box::from_raw(std::ptr::from_ref(regions).cast_mut()));
    }
}

/// The region's count is already zero and queued for review; the next tick frees it
/// unless an allocation revives it first. Exactly one of the two happens, and the new
/// object lives in an active region.
#[test]
fn review_vs_revival() {
    run_model("region: review vs revival", || {
        let (regions, cache) = setup();
        let p = cache.alloc().unwrap();
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap(); // the last slab: the count drops to zero
        regions.tick(); // the zero is flushed: the region is queued, due at the next epoch

        let allocator = thread::spawn(move || cache.alloc().unwrap().as_ptr() as usize);
        regions.tick(); // reviews the region: free it, or re-queue it if revived
        let q = core::ptr::NonNull::new(allocator.join().unwrap() as *mut u8).unwrap();

        let stats = regions.stats();
        assert_eq!(stats.releases + stats.revivals, 1, "release and revival: exactly one wins ({stats:?})");
        let found = regions.lookup(q.as_ptr()).expect("the object is in an active region");
        assert!(found.allocated);
        finish(regions, cache, q);
    });
}

/// The last slab is freed on one thread while another allocates and the main thread
/// ticks: however it interleaves, the region is released at most once, never while a
/// slab lives in it, and a revival excludes a release.
#[test]
fn last_free_vs_allocation_vs_ticks() {
    run_model("region: last free vs allocation vs ticks", || {
        let (regions, cache) = setup();
        let p = cache.alloc().unwrap().as_ptr() as usize;
        regions.tick();

        let freer = thread::spawn(move || {
            let p = core::ptr::NonNull::new(p as *mut u8).unwrap();
            // SAFETY: from `cache`, freed once.
            unsafe { cache.free(p) }.unwrap();
        });
        let allocator = thread::spawn(move || cache.alloc().unwrap().as_ptr() as usize);
        regions.tick();
        regions.tick();
        freer.join().unwrap();
        let q = core::ptr::NonNull::new(allocator.join().unwrap() as *mut u8).unwrap();

        let stats = regions.stats();
        assert!(stats.releases + stats.revivals <= 1, "{stats:?}");
        let found = regions.lookup(q.as_ptr()).expect("the object is in an active region");
        assert!(found.allocated);
        finish(regions, cache, q);
    });
}
