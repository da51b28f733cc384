//! The free-time trim (`umem::cache::Config::trim_threshold`, "Free-time trim" in the
//! cache module): a free that finds the depot's full magazines over the threshold sends
//! the excess to the slab layer (destructors run) and the regions give the freed pages
//! to the kernel; a trim that turns out premature raises the threshold, which decays back
//! after quiet intervals; 16 threads trimming and allocating at once lose and duplicate
//! nothing.
//!
//! Every cache here has the background reaper off and a manual Refcache, so nothing but
//! the trim gives memory back while a test looks.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier};

use scalemem::refcount::Config as RefcacheConfig;
use scalemem::umem::cache::{CacheStats, Config, Ctor, Dtor, ObjectCache};
use scalemem::umem::cpu_cache::Config as MagConfig;
use scalemem::umem::region::Regions;

const SIZE: usize = 4096;
const THRESHOLD: usize = 64 << 10;
/// A trim purges a region only once this many of its pages were freed since its last
/// purge (the cache module's "Free-time trim").
const PURGE_MIN_PAGES: usize = 64;

/// Managers leaked for `'static`, kept reachable from here so that LeakSanitizer does not
/// report them.
static LEAKED: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];
static LEAKED_NEXT: AtomicUsize = AtomicUsize::new(0);

/// A region manager ticked by hand, leaked for `'static`.
fn manual() -> &'static Regions {
    let regions: &'static Regions =
        Box::leak(Box::new(Regions::builder().refcache(RefcacheConfig::manual()).retain(0).build().unwrap()));
    LEAKED[LEAKED_NEXT.fetch_add(1, Relaxed)].store(std::ptr::from_ref(regions) as usize, Relaxed);
    regions
}

fn config(trim: Option<usize>, rounds: usize) -> Config {
    Config {
        reaper: false,
        magazines: MagConfig { initial_rounds: rounds, min_rounds: rounds, max_rounds: rounds, ..MagConfig::default() },
        trim_threshold: trim,
        decay_intervals: 2,
        ..Config::default()
    }
}

/// A cache of page-sized objects whose constructor stamps a magic word, whose destructor
/// checks it, and whose owner word (0: free) catches an object handed out twice.
struct Fixture {
    regions: &'static Regions,
    cache: ObjectCache,
    ctors: Arc<AtomicUsize>,
    dtors: Arc<AtomicUsize>,
}

const MAGIC: u64 = 0x7217_7217_7217_7217;

fn fixture(config: Config) -> Fixture {
    let regions = manual();
    let (ctors, dtors) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, d) = (Arc::clone(&ctors), Arc::clone(&dtors));
    let ctor: Ctor = Box::new(move |p| {
        c.fetch_add(1, Relaxed);
        // SAFETY: the chunk holds SIZE writable bytes, aligned to 8.
        unsafe { p.cast::<[AtomicU64; 2]>().write([AtomicU64::new(MAGIC), AtomicU64::new(0)]) };
        Ok(())
    });
    let dtor: Dtor = Box::new(move |p| {
        let words = words(p);
        assert_eq!(words[0].swap(0, Relaxed), MAGIC, "destructor on an unconstructed object");
        assert_eq!(words[1].load(Relaxed), 0, "destructor on an object in use");
        d.fetch_add(1, Relaxed);
    });
    let cache = ObjectCache::new_in(regions, "trim", SIZE, 8, Some(ctor), Some(dtor), config).unwrap();
    Fixture { regions, cache, ctors, dtors }
}

fn words<'a>(p: NonNull<u8>) -> &'a [AtomicU64; 2] {
    // SAFETY: callers pass constructed objects of a fixture's cache.
    unsafe { p.cast::<[AtomicU64; 2]>().as_ref() }
}

impl Fixture {
    fn alloc(&self, owner: u64) -> NonNull<u8> {
        let p = self.cache.alloc().unwrap();
        let w = words(p);
        assert_eq!(w[0].load(Relaxed), MAGIC, "an unconstructed object handed out");
        assert_eq!(w[1].swap(owner, Relaxed), 0, "an object handed out twice");
        // Touch the whole object, so that its page is resident.
        // SAFETY: our object's bytes past the two words.
        unsafe { p.as_ptr().add(16).write_bytes(0x5a, SIZE - 16) };
        p
    }

    fn free(&self, p: NonNull<u8>) {
        assert_ne!(words(p)[1].swap(0, Relaxed), 0);
        // SAFETY: from this cache, freed once, constructed.
        unsafe { self.cache.free(p) }.unwrap();
    }

    fn cycle(&self, n: usize) {
        let held: Vec<_> = (0..n).map(|_| self.alloc(1)).collect();
        for p in held {
            self.free(p);
        }
    }

    fn stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Bytes of objects in the depot's full magazines now.
    fn depot_bytes(&self) -> usize {
        let s = self.stats();
        s.depot_full * s.magazine_size * SIZE
    }
}

#[test]
fn a_free_over_the_threshold_gives_the_excess_back_at_once() {
    const N: usize = 1024; // 4 MiB
    let f = fixture(config(Some(THRESHOLD), 4));
    f.cycle(N);
    let s = f.stats();
    let magazine = s.magazine_size * SIZE;
    assert!(s.trims >= 1, "{s:?}");
    assert!(f.depot_bytes() <= THRESHOLD + magazine, "the depot kept {} bytes: {s:?}", f.depot_bytes());
    // What left the magazines went through the destructor, and its pages to the kernel
    // (all but the slab layer's two empty slabs), without any reap, update or tick:
    // all but fewer than PURGE_MIN_PAGES per region, which a trim's purge leaves for
    // later (how many depends on where the trims fell, which a migration moves).
    let cached = s.cpu_rounds + s.depot_full * s.magazine_size;
    assert_eq!(f.dtors.load(Relaxed), N - cached, "{s:?}");
    assert_eq!(f.ctors.load(Relaxed) - f.dtors.load(Relaxed), s.constructed);
    let r = f.regions.stats();
    let freed = (N - cached - 2) * SIZE;
    let deferred = f.regions.purge(1);
    assert!(
        deferred < r.live_regions * PURGE_MIN_PAGES * SIZE,
        "the trims left {deferred} bytes freed and resident: {r:?} {s:?}"
    );
    let returned = f.regions.stats().returned_bytes;
    assert!(returned >= freed, "only {returned} bytes of {freed} freed given back: {r:?} {s:?}");
    assert_eq!(f.stats().trim_threshold, THRESHOLD, "nothing was needed again: no raise");
    f.cache.assert_valid();
    f.regions.assert_valid();

    // The control: without a threshold the depot keeps every freed object.
    let g = fixture(config(None, 4));
    g.cycle(N);
    let s = g.stats();
    assert_eq!((s.trims, s.trim_threshold, g.dtors.load(Relaxed)), (0, 0, 0), "{s:?}");
    assert_eq!(g.regions.stats().returned_bytes, 0);
}

/// A destructor that panics inside a trim (the free that triggered it gets the panic)
/// must not stop the cache's later trims: before 2026-12-07 the trim's busy bit stayed
/// set, and every later free past the threshold thought another thread was trimming.
#[test]
fn a_destructor_that_panics_in_a_trim_does_not_stop_later_trims() {
    const N: usize = 1024; // 4 MiB
    let regions = manual();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let dtor: Dtor = Box::new(move |_| {
        if c.fetch_add(1, Relaxed) == 0 {
            panic!("destructor failed");
        }
    });
    let cache =
        ObjectCache::new_in(regions, "trim-panics", SIZE, 8, None, Some(dtor), config(Some(THRESHOLD), 4)).unwrap();
    let held: Vec<_> = (0..N).map(|_| cache.alloc().unwrap()).collect();
    let mut panics = 0;
    for p in held {
        // SAFETY: from this cache, freed once.
        let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { cache.free(p) }));
        match freed {
            Ok(result) => result.unwrap(),
            Err(_) => panics += 1,
        }
    }
    assert_eq!(panics, 1, "the destructor panics once, in the first trim");
    let s = cache.stats();
    let magazine = s.magazine_size * SIZE;
    let depot = s.depot_full * magazine;
    assert!(s.trims >= 1, "no trim after the panicking one: {s:?}");
    assert!(depot <= THRESHOLD + magazine, "the depot kept {depot} bytes: {s:?}");
    cache.assert_valid();
    regions.assert_valid();
}

#[test]
fn a_premature_trim_raises_the_threshold_which_decays_back() {
    const N: usize = 256; // 1 MiB per cycle, 16x the threshold
    let f = fixture(config(Some(THRESHOLD), 4));
    let (mut ctors, mut dtors) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        f.cycle(N);
        ctors.push(f.ctors.load(Relaxed));
        dtors.push(f.dtors.load(Relaxed));
    }
    let s = f.stats();
    // Each premature trim at least doubles the threshold past what it gave back, so the
    // cycle's demand is covered after a few cycles: the later cycles trim nothing (no
    // object goes back to the slabs) and take every object from the depot, but for
    // those a migration strands in the magazines of the CPU the thread left (at most
    // two magazines per CPU, in all: a round stranded is not lost, and serves the next
    // visit to that CPU).
    assert!(s.trim_threshold >= N * SIZE, "{s:?}");
    assert!(dtors[4..].windows(2).all(|w| w[0] == w[1]), "later cycles still trimmed: {dtors:?}");
    // SAFETY: sysconf has no preconditions.
    let cpus = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap();
    assert!(
        ctors[7] - ctors[4] <= cpus * 2 * s.magazine_size,
        "later cycles still went to the slabs: {ctors:?} ({cpus} CPUs) {s:?}"
    );
    let trims = s.trims;
    f.cycle(N);
    assert_eq!(f.stats().trims, trims, "a cycle within the raised threshold trimmed");
    // Quiet intervals: past `decay_intervals` (2) every update halves it, down to the
    // configured threshold.
    for _ in 0..40 {
        f.cache.update();
    }
    assert_eq!(f.stats().trim_threshold, THRESHOLD);
    f.cache.assert_valid();
    f.regions.assert_valid();
}

#[test]
fn a_trimming_cache_purges_what_its_intervals_drain() {
    // Under the threshold (1 MiB of 4 MiB): no free trims. The working-set intervals then
    // reap the idle depot and the decay drains the rest; in a trimming cache the pages
    // of the slabs they empty go back at once, not when their regions are released.
    const N: usize = 256;
    let f = fixture(config(Some(4 << 20), 4));
    f.cycle(N);
    assert_eq!((f.stats().trims, f.regions.stats().returned_bytes), (0, 0));
    for _ in 0..8 {
        f.cache.update();
    }
    let s = f.stats();
    assert_eq!(s.constructed, 0, "the decay drained everything: {s:?}");
    let returned = f.regions.stats().returned_bytes;
    // (A purge skips a region with fewer than 64 pages freed since its last one.)
    assert!(returned >= (N - PURGE_MIN_PAGES) * SIZE, "only {returned} bytes given back: {:?}", f.regions.stats());
    f.cache.assert_valid();
    f.regions.assert_valid();

    // The control: a cache without the trim leaves the pages to the regions' release.
    let g = fixture(config(None, 4));
    g.cycle(N);
    for _ in 0..8 {
        g.cache.update();
    }
    assert_eq!(g.stats().constructed, 0);
    assert_eq!(g.regions.stats().returned_bytes, 0);
}

#[test]
fn sixteen_threads_trim_allocate_and_free_at_once() {
    const THREADS: usize = 16;
    const ROUNDS: usize = 40;
    // A threshold of two magazines: nearly every depot push past it trims.
    let f = Arc::new(fixture(config(Some(2 * 2 * SIZE), 2)));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (f, barrier) = (Arc::clone(&f), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let me = t as u64 + 1;
                let mut rng = me.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                barrier.wait();
                for _ in 0..ROUNDS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let n = 1 + (rng as usize >> 8) % 200;
                    let held: Vec<_> = (0..n).map(|_| f.alloc(me)).collect();
                    for p in held {
                        f.free(p);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = f.stats();
    assert_eq!(s.in_use, 0, "{s:?}");
    assert!(s.trims > 0, "{s:?}");
    // No request is lost to a trimmer busy elsewhere: once the last free has returned,
    // the depot is within the threshold (as premature trims have raised it).
    assert!(f.depot_bytes() <= s.trim_threshold, "the depot kept {} bytes: {s:?}", f.depot_bytes());
    assert_eq!(f.ctors.load(Relaxed) - f.dtors.load(Relaxed), s.constructed, "{s:?}");
    f.cache.assert_valid();
    f.regions.assert_valid();
    // Everything still goes back: reap, then the regions' two epochs.
    f.cache.reap();
    for _ in 0..4 {
        f.regions.tick();
    }
    assert_eq!(f.ctors.load(Relaxed), f.dtors.load(Relaxed));
    assert_eq!(f.regions.stats().mapped_bytes, 0, "{:?}", f.regions.stats());
}
