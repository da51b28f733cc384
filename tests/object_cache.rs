//! Tests of umem's object cache (`umem::cache`): constructors run once per object
//! entering from a slab, destructors as objects leave (reap, update/decay, destroy),
//! constructed state kept across magazine round trips, `TypedCache`/`CacheBox`, destroy
//! with objects outstanding and the teardown after the last free, memory back to the OS
//! after reap and region ticks, 16 threads with cross-thread frees and owner stamps,
//! fault injection, checking mode, and no global allocation on alloc/free.
//!
//! Every cache here has the background reaper off and a manual Refcache: the tests drive
//! `update`, `reap` and `Regions::tick` by hand.

mod common;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};

use common::counting_alloc::{Counting, allocations_in};
use scalemem::refcount::Config as RefcacheConfig;
use scalemem::umem::cache::{CacheError, Config, Ctor, Dtor, ObjectCache, TypedCache};
use scalemem::umem::cpu_cache::Config as MagConfig;
use scalemem::umem::os::testing;
use scalemem::umem::region::Regions;
use scalemem::umem::slab::FreeError;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Managers leaked for `'static`, kept reachable from here so that LeakSanitizer does not
/// report them (atomic slots, not a std `Mutex`, whose futex paths ThreadSanitizer does
/// not see into).
static LEAKED: [AtomicUsize; 1024] = [const { AtomicUsize::new(0) }; 1024];
static LEAKED_NEXT: AtomicUsize = AtomicUsize::new(0);

/// Keeps `regions` reachable from `LEAKED`.
fn keep(regions: &'static Regions) {
    LEAKED[LEAKED_NEXT.fetch_add(1, Relaxed)].store(std::ptr::from_ref(regions) as usize, Relaxed);
}

/// A region manager ticked by hand, leaked for `'static`.
fn manual(retain: usize) -> &'static Regions {
    let regions: &'static Regions =
        Box::leak(Box::new(Regions::builder().refcache(RefcacheConfig::manual()).retain(retain).build().unwrap()));
    keep(regions);
    regions
}

fn config() -> Config {
    Config { reaper: false, ..Config::default() }
}

/// The object of the raw-cache tests: a magic word written by the constructor, an owner
/// word (0: free), and a use counter that survives magazine round trips.
#[repr(C)]
struct Obj {
    magic: u64,
    owner: AtomicU64,
    uses: u64,
    stamp: u64,
}

const MAGIC: u64 = 0x0b1e_c7ca_c4e0_0001;

/// Counting constructor and destructor for `Obj`.
fn obj_hooks(ctors: &Arc<AtomicUsize>, dtors: &Arc<AtomicUsize>) -> (Ctor, Dtor) {
    let c = Arc::clone(ctors);
    let d = Arc::clone(dtors);
    let ctor: Ctor = Box::new(move |p| {
        c.fetch_add(1, Relaxed);
        // SAFETY: the chunk holds size_of::<Obj>() writable bytes, aligned.
        unsafe { p.cast::<Obj>().write(Obj { magic: MAGIC, owner: AtomicU64::new(0), uses: 0, stamp: 0 }) };
        Ok(())
    });
    let dtor: Dtor = Box::new(move |p| {
        // SAFETY: a constructed Obj leaving the cache.
        let obj = unsafe { p.cast::<Obj>().as_mut() };
        assert_eq!(obj.magic, MAGIC, "destructor on an unconstructed object");
        assert_eq!(obj.owner.load(Relaxed), 0, "destructor on an object in use");
        obj.magic = 0;
        d.fetch_add(1, Relaxed);
    });
    (ctor, dtor)
}

fn obj_cache(regions: &'static Regions, config: Config) -> (ObjectCache, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let ctors = Arc::new(AtomicUsize::new(0));
    let dtors = Arc::new(AtomicUsize::new(0));
    let (ctor, dtor) = obj_hooks(&ctors, &dtors);
    let cache =
        ObjectCache::new_in(regions, "obj", size_of::<Obj>(), align_of::<Obj>(), Some(ctor), Some(dtor), config)
            .unwrap();
    (cache, ctors, dtors)
}

fn obj<'a>(p: NonNull<u8>) -> &'a mut Obj {
    // SAFETY: callers pass objects of an `obj_cache`, constructed and theirs.
    unsafe { p.cast::<Obj>().as_mut() }
}

/// Ticks `regions` until `done` or `max` ticks.
/// Ticks `regions` until `done`, through at most `max` epochs. A tick that finds the
/// advancer busy returns without advancing (the fork test's prepare handler holds every
/// registered cache's regions' advancer while it forks): only ticks that advanced the
/// epoch count, within a 10 s bound.
fn tick_until(regions: &Regions, max: usize, done: impl Fn(&Regions) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut epoch = regions.tick();
    let mut advanced = 1;
    while advanced < max && std::time::Instant::now() < deadline {
        if done(regions) {
            return;
        }
        let now = regions.tick();
        if now != epoch {
            advanced += 1;
            epoch = now;
        } else {
            std::thread::yield_now();
        }
    }
}

#[test]
fn constructor_runs_once_per_object_from_a_slab() {
    let (cache, ctors, dtors) = obj_cache(manual(4), config());
    let mut held = Vec::new();
    let cycles = 2_000;
    for _ in 0..cycles {
        for _ in 0..8 {
            let p = cache.alloc().unwrap();
            let o = obj(p);
            assert_eq!(o.magic, MAGIC, "handed out unconstructed");
            o.uses += 1;
            held.push(p);
        }
        for p in held.drain(..) {
            // SAFETY: from this cache, freed once, constructed.
            unsafe { cache.free(p) }.unwrap();
        }
    }
    let allocs = cycles * 8;
    let ctor_calls = ctors.load(Relaxed);
    // Hits come from the magazines: a few misses per CPU and migration, not one per alloc.
    assert!(ctor_calls * 20 < allocs, "{ctor_calls} constructor calls for {allocs} allocations");
    assert_eq!(dtors.load(Relaxed), cache.stats().dtor_calls);
    // Constructed state survives a round trip: some object was used many times.
    let p = cache.alloc().unwrap();
    let uses = obj(p).uses;
    // SAFETY: from this cache, once.
    unsafe { cache.free(p) }.unwrap();
    assert!(uses > 1, "an object from the magazines was reconstructed (uses {uses})");
    cache.assert_valid();
    // Leaving the cache runs the destructor, once per constructed object.
    cache.reap();
    let stats = cache.stats();
    assert_eq!((stats.constructed, stats.cpu_rounds, stats.depot_full, stats.slabs), (0, 0, 0, 0));
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
    cache.assert_valid();
}

#[test]
fn update_frees_idle_magazines_and_decay_drains_everything() {
    let magazines = MagConfig { initial_rounds: 3, min_rounds: 3, max_rounds: 3, ..MagConfig::default() };
    let (cache, ctors, dtors) = obj_cache(manual(4), Config { magazines, decay_intervals: 3, ..config() });
    let objects: Vec<_> = (0..200).map(|_| cache.alloc().unwrap()).collect();
    for p in objects {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    let before = cache.stats();
    assert!(before.depot_full > 0, "{before:?}");
    // Two intervals: the depot's full magazines sat idle through one, and the
    // working-set reap frees them (destructing their rounds). The CPUs' own few rounds
    // (at most 6 objects of 32 bytes) are below the idle drain's 64 KiB: they stay.
    let mut reaped = cache.update();
    reaped += cache.update();
    let after = cache.stats();
    assert!(reaped > 0 && after.depot_full == 0, "{after:?}");
    assert_eq!(after.cpu_rounds, before.cpu_rounds, "{after:?}");
    assert_eq!(dtors.load(Relaxed), reaped);
    // Decay: no slab traffic for 3 intervals drains the CPUs' magazines too.
    for _ in 0..4 {
        cache.update();
    }
    let stats = cache.stats();
    assert_eq!((stats.constructed, stats.cpu_rounds, stats.slabs), (0, 0, 0), "{stats:?}");
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
    cache.assert_valid();
}

/// `rounds` bursts: allocate `burst` objects of `cache`, touching each, then free them.
fn bursts(cache: &ObjectCache, rounds: usize, burst: usize) {
    let mut held = Vec::with_capacity(burst);
    for _ in 0..rounds {
        held.extend((0..burst).map(|_| cache.alloc().unwrap()));
        for p in held.drain(..) {
            // SAFETY: an object of this cache (at least 8 bytes), freed once just after.
            unsafe { p.as_ptr().write(1) };
            // SAFETY: from this cache, once.
            unsafe { cache.free(p) }.unwrap();
        }
    }
}

/// Runs `f` with the thread pinned to the CPU it is on (so that no migration between a
/// slow path's snapshot and its section counts as depot contention), then restores the
/// thread's affinity.
fn pinned<R>(f: impl FnOnce() -> R) -> R {
    let original = rustix::thread::sched_getaffinity(None).unwrap();
    let mut one = rustix::thread::CpuSet::new();
    one.set(scalemem::cpu::current());
    rustix::thread::sched_setaffinity(None, &one).unwrap();
    let result = f();
    rustix::thread::sched_setaffinity(None, &original).unwrap();
    result
}

/// The exchange rule: one thread whose bursts of 100 outgrow its CPU's two 15-round
/// magazines never contends, but trades magazines with the depot all the time; with the
/// default configuration each working-set interval that saw more than `GROW_EXCHANGES`
/// such trades grows the magazines a step, and an interval without them does not.
#[test]
fn a_single_threads_bursts_grow_the_magazines() {
    pinned(single_threads_bursts);
}

fn single_threads_bursts() {
    let cache = ObjectCache::builder("bursts", 256, 16).config(config()).build().unwrap();
    assert_eq!(cache.stats().magazine_size, 15);
    // 1,000 bursts of 100 on 15-round magazines: about 10,000 magazines installed from
    // the depot (about 10 per burst) against the default threshold of 6,400.
    bursts(&cache, 1_000, 100);
    cache.update();
    let stats = cache.stats();
    assert_eq!((stats.magazine_size, stats.depot_contention), (31, 0), "{stats:?}");
    // The counters that say why (jemalloc's per-bin fills and flushes): the trades, and
    // the one resize they caused.
    assert!(stats.depot_exchanges > 6_400, "{stats:?}");
    assert_eq!((stats.resizes, stats.idle_drains), (1, 0), "{stats:?}");
    // At 31 rounds a burst trades about 4 magazines: 2,500 bursts are past the threshold.
    bursts(&cache, 2_500, 100);
    cache.update();
    assert_eq!(cache.stats().magazine_size, 47);
    // An interval with little traffic: no step.
    bursts(&cache, 10, 100);
    cache.update();
    assert_eq!(cache.stats().magazine_size, 47);
    cache.assert_valid();
}

/// With the exchange rule off (`grow_exchanges: None`, libumem's sizing) the same bursts
/// leave the magazines as they are; with a low threshold the rule stops at magazines
/// of `EXCHANGE_GROWTH_BYTES` of objects: 16 KiB objects reach 63 rounds (1 MiB / 16
/// KiB = 64), 64 KiB ones stay at 15 (the next step, 31, is past 16).
#[test]
fn the_exchange_rule_can_be_off_and_stops_at_its_byte_bound() {
    pinned(exchange_rule_off_and_bound);
}

fn exchange_rule_off_and_bound() {
    let off = ObjectCache::builder("bursts-off", 256, 16).config(Config { grow_exchanges: None, ..config() }).build();
    let off = off.unwrap();
    bursts(&off, 700, 100);
    off.update();
    assert_eq!(off.stats().magazine_size, 15, "{:?}", off.stats());
    assert_eq!(scalemem::umem::cache::EXCHANGE_GROWTH_BYTES, 1 << 20);
    for (size, top) in [(16 << 10, 63), (64 << 10, 15)] {
        let config = Config { grow_exchanges: Some(8), ..config() };
        let cache = ObjectCache::builder("bursts-bound", size, 16).config(config).build().unwrap();
        for _ in 0..8 {
            // 160 objects: past two magazines even at 63 rounds.
            bursts(&cache, 4, 160);
            cache.update();
        }
        assert_eq!(cache.stats().magazine_size, top, "{size}-byte objects: {:?}", cache.stats());
        cache.reap();
    }
}

/// The idle drain through `update`: a CPU that sat idle through an interval with at
/// least `Config::idle_drain` bytes of objects in its magazines gives them up (its full
/// magazines to the depot), and not with the drain off. Pinned, so that the thread's
/// objects stay on one CPU.
#[test]
fn update_drains_a_cpu_that_sat_idle() {
    pinned(cpu_that_sat_idle);
}

fn cpu_that_sat_idle() {
    for drain in [true, false] {
        // 4 KiB objects in magazines of 31: 62 cached objects are 248 KiB, past 64 KiB.
        let magazines = MagConfig { initial_rounds: 31, min_rounds: 31, max_rounds: 31, ..MagConfig::default() };
        let idle_drain = if drain { Config::default().idle_drain } else { None };
        let config = Config { magazines, idle_drain, grow_exchanges: None, ..config() };
        let cache = ObjectCache::builder("idle", 4096, 16).config(config).build().unwrap();
        bursts(&cache, 1, 62);
        let before = cache.stats();
        assert_eq!(before.cpu_rounds, 62, "{before:?}");
        cache.update(); // looks
        cache.update(); // nothing happened since
        let after = cache.stats();
        if drain {
            assert_eq!(after.cpu_rounds, 0, "{after:?}");
            assert_eq!(after.depot_full, 2, "the two full magazines go to the depot: {after:?}");
            assert_eq!(after.idle_drains, 1, "{after:?}");
        } else {
            assert_eq!((after.cpu_rounds, after.depot_full, after.idle_drains), (62, 0, 0), "{after:?}");
        }
        cache.assert_valid();
        cache.reap();
    }
}

/// A typed object with a pre-sized buffer and a drop counter.
struct Buffer {
    data: Vec<u8>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Relaxed);
    }
}

#[test]
fn typed_cache_boxes_keep_their_objects_constructed() {
    let inits = Arc::new(AtomicUsize::new(0));
    let drops = Arc::new(AtomicUsize::new(0));
    let (i, d) = (Arc::clone(&inits), Arc::clone(&drops));
    let cache = TypedCache::new_in(manual(4), "buffers", config(), move || {
        i.fetch_add(1, Relaxed);
        Buffer { data: Vec::with_capacity(1024), drops: Arc::clone(&d) }
    })
    .unwrap();
    for round in 0..500 {
        let mut boxes: Vec<_> = (0..4).map(|_| cache.alloc().unwrap()).collect();
        for b in &mut boxes {
            assert!(b.data.capacity() >= 1024);
            b.data.clear();
            b.data.push(round as u8);
        }
        drop(boxes); // back to the cache: no Buffer is dropped
        assert_eq!(drops.load(Relaxed), 0);
    }
    assert!(inits.load(Relaxed) < 100, "{} initialisations", inits.load(Relaxed));
    cache.raw().reap();
    assert_eq!(drops.load(Relaxed), inits.load(Relaxed), "reap drops each cached T once");
    assert_eq!(cache.raw().stats().slabs, 0);
    // Dropping the cache with objects cached drops them too.
    let b = cache.alloc().unwrap();
    drop(b);
    drop(cache);
    assert_eq!(drops.load(Relaxed), inits.load(Relaxed));
}

#[test]
fn destroy_fails_allocation_and_tears_down_after_the_last_free() {
    let (cache, ctors, dtors) = obj_cache(manual(4), config());
    let outstanding: Vec<_> = (0..40).map(|_| cache.alloc().unwrap()).collect();
    // Some cached objects, too.
    let cached: Vec<_> = (0..20).map(|_| cache.alloc().unwrap()).collect();
    for p in cached {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.destroy();
    cache.destroy(); // idempotent
    assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
    let stats = cache.stats();
    assert!(stats.destroyed && !stats.torn_down);
    assert_eq!((stats.cpu_rounds, stats.depot_full, stats.constructed), (0, 0, 40), "{stats:?}");
    // Outstanding objects are still usable and freeable.
    for (i, &p) in outstanding.iter().enumerate() {
        let o = obj(p);
        assert_eq!(o.magic, MAGIC);
        o.stamp = i as u64;
    }
    let (last, rest) = outstanding.split_last().unwrap();
    for (i, &p) in rest.iter().enumerate() {
        assert_eq!(obj(p).stamp, i as u64);
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
        assert!(!cache.stats().torn_down);
    }
    assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
    // SAFETY: from this cache, once.
    unsafe { cache.free(*last) }.unwrap();
    let stats = cache.stats();
    assert!(stats.torn_down, "{stats:?}");
    assert_eq!((stats.constructed, stats.slabs, stats.cpu_rounds), (0, 0, 0));
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
    cache.assert_valid();
}

#[test]
fn destroy_with_nothing_outstanding_tears_down_at_once() {
    let (cache, ctors, dtors) = obj_cache(manual(4), config());
    let p = cache.alloc().unwrap();
    // SAFETY: from this cache, once.
    unsafe { cache.free(p) }.unwrap();
    cache.destroy();
    assert!(cache.stats().torn_down);
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
    assert_eq!(cache.reap(), 0);
    assert_eq!(cache.update(), 0);
}

#[test]
fn reap_and_ticks_give_memory_back() {
    let regions = manual(0);
    let (cache, _, _) = obj_cache(regions, config());
    let objects: Vec<_> = (0..30_000).map(|_| cache.alloc().unwrap()).collect();
    let peak = regions.stats();
    assert!(peak.mapped_bytes >= 30_000 * size_of::<Obj>());
    let given_back = |r: &Regions| r.stats().returned_bytes + r.stats().unmapped_bytes;
    let before = given_back(regions);
    for p in objects {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.reap();
    tick_until(regions, 10, |r| r.stats().mapped_bytes == 0);
    let after = regions.stats();
    assert_eq!(after.mapped_bytes, 0, "{after:?}");
    assert!(given_back(regions) - before >= peak.mapped_bytes * 9 / 10, "{peak:?} -> {after:?}");
    assert!(cache.stats().regions.unmapped_bytes >= peak.mapped_bytes);
}

#[test]
fn constructor_failure_returns_the_chunk() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let cache = ObjectCache::builder("flaky", 64, 8)
        .ctor(Box::new(
            move |_| if c.fetch_add(1, Relaxed) % 2 == 1 { Err(scalemem::util::AllocError) } else { Ok(()) },
        ))
        .regions(manual(4))
        .config(config())
        .build()
        .unwrap();
    let mut ok = Vec::new();
    let mut failed = 0;
    for _ in 0..100 {
        match cache.alloc() {
            Ok(p) => ok.push(p),
            Err(e) => {
                assert_eq!(e, CacheError::Constructor);
                failed += 1;
            }
        }
    }
    assert_eq!((ok.len(), failed), (50, 50));
    cache.assert_valid();
    assert_eq!(cache.stats().constructed, 50);
    for p in ok {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.reap();
    assert_eq!(cache.stats().slabs, 0);
}

/// A destructor that panics while a reap drains the magazines (the module's "a panicking
/// constructor or destructor leaks its chunk and its reference; the cache stays
/// usable"): the panic reaches `reap`'s caller, and afterwards allocation, free and the
/// next reap work. Before 2026-12-07 the panic left the per-CPU layer stopped with its
/// reconfiguration flag taken, and the next reap, or dropping the cache, spun for ever.
#[test]
fn a_panicking_destructor_leaves_the_cache_usable() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let cache = ObjectCache::builder("dtor-panics", 64, 8)
        .dtor(Box::new(move |_| {
            if c.fetch_add(1, Relaxed) == 2 {
                panic!("destructor failed");
            }
        }))
        .regions(manual(4))
        .config(config())
        .build()
        .unwrap();
    // Leaked while the test runs, so that a failure is reported instead of hanging where
    // the cache would be dropped; a reap on another thread can be abandoned if it hangs.
    let cache: &'static ObjectCache = Box::leak(Box::new(cache));
    let objects: Vec<_> = (0..20).map(|_| cache.alloc().unwrap()).collect();
    for p in objects {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    let reaped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cache.reap()));
    assert!(reaped.is_err(), "the destructor's panic reaches the caller");
    cache.assert_valid();
    let p = cache.alloc().expect("alloc after the panic");
    // SAFETY: from this cache, once.
    unsafe { cache.free(p) }.expect("free after the panic");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(cache.reap()).unwrap());
    rx.recv_timeout(std::time::Duration::from_secs(20)).expect("a reap after the panic hung");
    cache.assert_valid();
    assert!(calls.load(Relaxed) > 3, "the next reap ran the destructor again");
    // SAFETY: leaked above and not used since; the thread that reaped has sent its result.
    drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
}

#[test]
fn refused_maps_fail_cleanly_and_recover() {
    let (cache, ctors, dtors) = obj_cache(manual(1), config());
    // No slab yet: the first allocation needs a region.
    testing::fail_maps_after(0);
    assert_eq!(cache.alloc(), Err(CacheError::OutOfMemory));
    cache.assert_valid();
    assert_eq!((ctors.load(Relaxed), cache.stats().constructed), (0, 0));
    // Enough maps for a while, then none: allocate until refused, free everything
    // (a magazine that cannot be made sends its object to the slab layer).
    testing::fail_maps_after(3);
    let mut held = Vec::new();
    let err = loop {
        match cache.alloc() {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
        assert!(held.len() < 1_000_000, "maps never refused");
    };
    assert_eq!(err, CacheError::OutOfMemory);
    cache.assert_valid();
    for p in held.drain(..) {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.assert_valid();
    testing::allow_maps();
    // Recovery.
    held.extend((0..1000).map(|_| cache.alloc().unwrap()));
    for p in held {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.reap();
    cache.assert_valid();
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
}

#[test]
fn checking_mode_refuses_bad_frees() {
    let regions = manual(4);
    let (cache, ctors, dtors) = obj_cache(regions, Config { checking: true, ..config() });
    let (other, _, _) = obj_cache(regions, config());
    let p = cache.alloc().unwrap();
    let q = cache.alloc().unwrap();
    let foreign = other.alloc().unwrap();
    let mut local = 0u64;
    // SAFETY: checking mode validates each pointer below before any change.
    unsafe {
        assert_eq!(cache.free(NonNull::from(&mut local).cast()), Err(FreeError::Foreign));
        assert_eq!(cache.free(foreign), Err(FreeError::WrongCache));
        assert_eq!(cache.free(p.add(8)), Err(FreeError::NotObjectBase));
        cache.free(p).unwrap();
        assert_eq!(cache.free(p), Err(FreeError::NotAllocated));
    }
    // Nothing is cached in checking mode: every free destructs.
    assert_eq!((ctors.load(Relaxed), dtors.load(Relaxed)), (2, 1));
    cache.assert_valid();
    // SAFETY: from these caches, once.
    unsafe {
        cache.free(q).unwrap();
        other.free(foreign).unwrap();
    }
    assert_eq!(cache.stats().constructed, 0);
}

#[test]
fn no_global_allocation_on_alloc_and_free() {
    let (cache, _, _) = obj_cache(manual(4), config());
    let typed = TypedCache::new_in(manual(4), "u64s", config(), || [7u64; 8]).unwrap();
    let mut held = Vec::with_capacity(64);
    let cycle = |held: &mut Vec<NonNull<u8>>| {
        for _ in 0..64 {
            held.push(cache.alloc().unwrap());
        }
        for p in held.drain(..) {
            // SAFETY: from this cache, once.
            unsafe { cache.free(p) }.unwrap();
        }
        for _ in 0..64 {
            let b = typed.alloc().unwrap();
            assert_eq!(b[3], 7);
        }
    };
    for _ in 0..10 {
        cycle(&mut held);
    }
    let n = allocations_in(|| {
        for _ in 0..1000 {
            cycle(&mut held);
        }
    });
    assert_eq!(n, 0, "alloc/free allocated through the global allocator");
}

#[test]
fn global_stats_count_live_caches() {
    let cache = ObjectCache::builder("global", 48, 8).config(config()).build().unwrap();
    let p = cache.alloc().unwrap();
    let stats = scalemem::umem::cache::global_stats();
    assert!(stats.caches >= 1 && stats.in_use >= 1 && stats.regions.mapped_bytes > 0, "{stats:?}");
    // SAFETY: from this cache, once.
    unsafe { cache.free(p) }.unwrap();
}

/// Objects in flight between threads: (address, stamp).
type Mailbox = Mutex<Vec<(usize, u64)>>;

#[test]
fn sixteen_threads_allocate_and_free_across_threads() {
    const THREADS: usize = 16;
    const OPS: usize = 20_000;
    let regions = manual(0);
    let (cache, ctors, dtors) = obj_cache(regions, config());
    let cache = Arc::new(cache);
    let mailboxes: Arc<Vec<Mailbox>> = Arc::new((0..THREADS).map(|_| Mutex::new(Vec::new())).collect());
    let barrier = Arc::new(Barrier::new(THREADS));
    let allocated = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, mailboxes, barrier, allocated) =
                (Arc::clone(&cache), Arc::clone(&mailboxes), Arc::clone(&barrier), Arc::clone(&allocated));
            std::thread::spawn(move || {
                let me = t as u64 + 1;
                let mut mine: Vec<(usize, u64)> = Vec::new();
                let mut rng = me.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                barrier.wait();
                for i in 0..OPS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if !rng.is_multiple_of(3) || mine.is_empty() {
                        let p = cache.alloc().unwrap();
                        let o = obj(p);
                        assert_eq!(o.magic, MAGIC);
                        // Owner stamp: an object handed to two owners at once fails here.
                        assert_eq!(o.owner.swap(me, Relaxed), 0, "object handed out twice");
                        let stamp = me << 32 | i as u64;
                        o.stamp = stamp;
                        allocated.fetch_add(1, Relaxed);
                        if rng.is_multiple_of(5) {
                            // Free it on another thread.
                            let to = (t + 1 + (rng as usize >> 8) % (THREADS - 1)) % THREADS;
                            mailboxes[to].lock().unwrap().push((p.as_ptr() as usize, stamp));
                        } else {
                            mine.push((p.as_ptr() as usize, stamp));
                        }
                    } else {
                        let (addr, stamp) = mine.swap_remove((rng as usize >> 4) % mine.len());
                        release(&cache, addr, stamp);
                    }
                    if i % 64 == 0 {
                        let inbox = std::mem::take(&mut *mailboxes[t].lock().unwrap());
                        for (addr, stamp) in inbox {
                            release(&cache, addr, stamp);
                        }
                    }
                }
                for (addr, stamp) in mine {
                    release(&cache, addr, stamp);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for mailbox in mailboxes.iter() {
        for (addr, stamp) in std::mem::take(&mut *mailbox.lock().unwrap()) {
            release(&cache, addr, stamp);
        }
    }
    let stats = cache.stats();
    assert_eq!(stats.in_use, 0, "{stats:?}");
    assert!(ctors.load(Relaxed) < allocated.load(Relaxed));
    cache.assert_valid();
    // Memory: everything back after reap and region ticks.
    let peak = regions.stats().mapped_bytes;
    let given_back = |r: &Regions| r.stats().returned_bytes + r.stats().unmapped_bytes;
    let before = given_back(regions);
    let rss_before = rss();
    cache.reap();
    tick_until(regions, 10, |r| r.stats().mapped_bytes == 0);
    let after = regions.stats();
    eprintln!(
        "stress: {} allocations, {} constructor calls, peak {} KiB mapped, after reap {} KiB; RSS {} -> {} KiB",
        allocated.load(Relaxed),
        ctors.load(Relaxed),
        peak >> 10,
        after.mapped_bytes >> 10,
        rss_before >> 10,
        rss() >> 10
    );
    assert!(after.mapped_bytes <= peak / 10, "{after:?}");
    assert!(given_back(regions) - before >= peak * 9 / 10, "{after:?}");
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
    let stats = cache.stats();
    assert_eq!((stats.constructed, stats.slabs), (0, 0));
}

fn release(cache: &ObjectCache, addr: usize, stamp: u64) {
    let p = NonNull::new(addr as *mut u8).unwrap();
    let o = obj(p);
    assert_eq!(o.stamp, stamp, "object overwritten while owned");
    assert_ne!(o.owner.swap(0, Relaxed), 0);
    // SAFETY: from this cache, freed once, constructed.
    unsafe { cache.free(p) }.unwrap();
}

/// Resident set size in bytes (`/proc/self/statm`, second field, in pages).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|s| s.parse::<usize>().ok()).unwrap_or(0) * 4096
}

/// The background reaper (decay after one idle interval here) and the regions' own
/// Refcache ticker give freed memory back to the OS with no further call into the
/// cache: the program frees everything and then only sleeps.
#[test]
fn background_reaper_returns_memory_without_calls() {
    let regions: &'static Regions = Box::leak(Box::new(Regions::new().unwrap()));
    keep(regions);
    let (cache, ctors, dtors) = obj_cache(regions, Config { reaper: true, decay_intervals: 1, ..Config::default() });
    const N: usize = 20_000;
    let objects: Vec<_> = (0..N).map(|_| cache.alloc().unwrap()).collect();
    // What the objects occupy (their slabs' pages were all written by the constructor):
    // the memory to give back. (A retained region's release gives back, and counts, only
    // the pages below its touched mark; the rest of its 2 MiB was never resident.)
    let used = N * size_of::<Obj>();
    assert!(regions.stats().mapped_bytes >= used);
    let given_back = |r: &Regions| r.stats().returned_bytes + r.stats().unmapped_bytes;
    let before = given_back(regions);
    for p in objects {
        // SAFETY: from this cache, once.
        unsafe { cache.free(p) }.unwrap();
    }
    let start = std::time::Instant::now();
    // Bound: (decay_intervals + 2) reaper intervals plus Refcache epochs; allow slack for
    // a loaded machine.
    while given_back(regions) - before < used * 9 / 10 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "memory not given back: {:?}", regions.stats());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    eprintln!(
        "reaper: {} KiB given back {:?} after the last free",
        (given_back(regions) - before) >> 10,
        start.elapsed()
    );
    assert_eq!(cache.stats().slabs, 0);
    assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
}

/// Real threads (rseq mode where available) allocating and freeing, some holding
/// objects, while the main thread destroys the cache: afterwards no round is stranded,
/// every constructed object is destructed once, and the teardown runs once.
#[test]
fn destroy_while_threads_allocate_and_free() {
    const THREADS: usize = 8;
    for round in 0..10 {
        let magazines = MagConfig { initial_rounds: 3, ..MagConfig::default() };
        let (cache, ctors, dtors) = obj_cache(manual(1), Config { magazines, ..config() });
        let cache = Arc::new(cache);
        let barrier = Arc::new(Barrier::new(THREADS + 1));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (cache, barrier) = (Arc::clone(&cache), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    barrier.wait();
                    let mut i = 0usize;
                    loop {
                        match cache.alloc() {
                            Ok(p) => {
                                assert_eq!(obj(p).owner.swap(t as u64 + 1, Relaxed), 0, "handed out twice");
                                held.push(p);
                            }
                            Err(e) => {
                                assert_eq!(e, CacheError::Destroyed);
                                break;
                            }
                        }
                        if held.len() > 4 + (i + t) % 7 {
                            for p in held.drain(..) {
                                obj(p).owner.store(0, Relaxed);
                                // SAFETY: from this cache, once.
                                unsafe { cache.free(p) }.unwrap();
                            }
                        }
                        i += 1;
                    }
                    // Outstanding objects are freed after the destroy.
                    for p in held {
                        assert_eq!(obj(p).magic, MAGIC);
                        obj(p).owner.store(0, Relaxed);
                        // SAFETY: from this cache, once.
                        unsafe { cache.free(p) }.unwrap();
                    }
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(std::time::Duration::from_millis(2 + round));
        cache.destroy();
        assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
        for h in handles {
            h.join().unwrap();
        }
        let stats = cache.stats();
        assert_eq!(stats.teardowns, 1, "{stats:?}");
        assert_eq!((stats.constructed, stats.cpu_rounds, stats.depot_full, stats.slabs), (0, 0, 0, 0), "{stats:?}");
        assert_eq!(ctors.load(Relaxed), dtors.load(Relaxed));
        cache.assert_valid();
    }
}

/// A reap or a decay frees the magazines it drains at once, not over the next pins: the
/// drained magazines are retired to the epoch collector, which holds each for a grace
/// period (two advances) and frees a bounded number of bags per collect; before the fix
/// a reap of thousands of magazines left most of them (and their pool pages: about a
/// megabyte in the stress below) pending until later pins, so a program that went idle
/// kept them. Alone in a child process: another test's pinned thread would hold the
/// epoch back (which is correct, and would make the count below mean nothing).
#[test]
fn reap_frees_its_magazines_at_once() {
    if !common::alone("reap_frees_its_magazines_at_once") {
        return;
    }
    let regions = manual(0);
    // Small magazines: many of them, more than a few collects' worth of bags.
    let config = Config { magazines: MagConfig { initial_rounds: 3, ..MagConfig::default() }, ..config() };
    let cache = ObjectCache::new_in(regions, "reap-mags", 64, 8, None, None, config).unwrap();
    let held: Vec<_> = (0..30_000).map(|_| cache.alloc().unwrap()).collect();
    for p in held {
        // SAFETY: from this cache, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    let stats = cache.stats();
    assert!(stats.depot_full > 2_000, "the frees did not fill thousands of magazines: {stats:?}");
    cache.reap();
    let pending = scalemem::epoch::default_collector().stats().pending;
    assert_eq!(pending, 0, "retired magazines still wait for the collector after the reap");
    let stats = cache.stats();
    assert_eq!((stats.cpu_rounds, stats.depot_full, stats.depot_empty), (0, 0, 0), "{stats:?}");
}

/// The footprint aim: after a 16-thread stress (more threads than cores) and the
/// decay interval (driven by hand: `update` for `decay_intervals + 1` intervals, then
/// Refcache ticks), the process's RSS is back within 10% of where it started. RSS is
/// process-wide, so this runs alone in a child process; the baseline is taken after one
/// warm-up round, so that what glibc keeps for the test's own threads and `Vec`s (arenas,
/// the thread-stack cache) is already in it.
#[test]
fn stress_rss_returns_after_decay() {
    if !common::alone("stress_rss_returns_after_decay") {
        return;
    }
    const THREADS: usize = 16;
    const HOLD: usize = 4096;
    const SIZE: usize = 1024;
    let regions = manual(0);
    let config = Config { decay_intervals: 2, ..config() };
    let cache = ObjectCache::new_in(regions, "rss", SIZE, 8, None, None, config).unwrap();
    // Two rounds, on the same 16 threads: in each, every thread fills HOLD objects
    // (every byte written), the main thread reads the RSS at the peak, then every thread
    // frees its objects; between rounds the main thread runs the decay while the
    // workers wait. The threads live through both rounds so that their stacks (and
    // what glibc keeps for them) are already in the baseline, as the one warm-up round
    // intends, instead of depending on which cached stacks fresh threads reuse.
    const ROUNDS: usize = 2;
    let barrier = Barrier::new(THREADS + 1);
    let decay = || {
        for _ in 0..=config.decay_intervals {
            cache.update();
        }
        tick_until(regions, 10, |r| r.stats().mapped_bytes == 0);
    };
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (cache, barrier) = (&cache, &barrier);
            scope.spawn(move || {
                let mut held = Vec::with_capacity(HOLD);
                for _ in 0..ROUNDS {
                    barrier.wait(); // start
                    for i in 0..HOLD {
                        let p = cache.alloc().unwrap();
                        // SAFETY: SIZE writable bytes.
                        unsafe { p.as_ptr().write_bytes((t + i) as u8, SIZE) };
                        held.push(p.as_ptr() as usize);
                    }
                    barrier.wait(); // filled
                    barrier.wait(); // peak measured
                    for (i, addr) in held.drain(..).enumerate().rev() {
                        let p = NonNull::new(addr as *mut u8).unwrap();
                        // SAFETY: SIZE bytes written above.
                        assert_eq!(unsafe { p.as_ptr().add(SIZE - 1).read() }, (t + i) as u8);
                        // SAFETY: from this cache, freed once.
                        unsafe { cache.free(p) }.unwrap();
                    }
                    barrier.wait(); // freed
                }
            });
        }
        // Returns the peak RSS of one round.
        let round = || {
            barrier.wait();
            barrier.wait();
            let peak = rss();
            barrier.wait();
            barrier.wait();
            peak
        };
        round();
        decay();
        let base = rss();
        let peak = round();
        let held = peak.saturating_sub(base);
        decay();
        let after = rss();
        eprintln!("rss: base {} KiB, peak {} KiB, after decay {} KiB", base >> 10, peak >> 10, after >> 10);
        assert!(held >= THREADS * HOLD * SIZE * 9 / 10, "the stress held {held} bytes");
        assert!(
            after <= base + base / 10,
            "RSS {after} after decay, {base} before the stress; cache {:?}; regions {:?}",
            cache.stats(),
            regions.stats()
        );
        let stats = cache.stats();
        assert_eq!((stats.in_use, stats.slabs, regions.stats().mapped_bytes), (0, 0, 0), "{stats:?}");
    });
}

/// `fork` while threads allocate, free, reap and resize registered caches (over the
/// process-wide regions, with the background reaper and the regions' Refcache ticker
/// running, one cache in locked mode): every child can use the caches, make and drop a
/// cache, read the global statistics and exit, and the parent goes on. Without umem's
/// fork handlers a child inherits, now and then, a registry, slab, regions or Refcache
/// lock held by a thread it does not have, and hangs.
#[test]
fn fork_while_threads_use_registered_caches() {
    let ctors = Arc::new(AtomicUsize::new(0));
    let c = ctors.clone();
    let ctor: Ctor = Box::new(move |p: NonNull<u8>| {
        // SAFETY: 64 writable bytes.
        unsafe { p.as_ptr().write_bytes(0x5A, 64) };
        c.fetch_add(1, Relaxed);
        Ok(())
    });
    let caches = Arc::new([
        ObjectCache::new("fork-a", 64, 8, Some(ctor), None).unwrap(),
        ObjectCache::builder("fork-b", 3000, 16).config(Config { locked: true, ..Config::default() }).build().unwrap(),
    ]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let _stop_workers = StopOnDrop(Arc::clone(&stop));
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let (caches, stop) = (Arc::clone(&caches), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut held: Vec<(usize, NonNull<u8>)> = Vec::new();
                let mut i = 0usize;
                while !stop.load(Relaxed) {
                    i += 1;
                    let k = (i + t) % 2;
                    held.push((k, caches[k].alloc().unwrap()));
                    if held.len() > 200 {
                        for (k, p) in held.drain(..150) {
                            // SAFETY: from cache k, freed once.
                            unsafe { caches[k].free(p) }.unwrap();
                        }
                    }
                    match i % 5000 {
                        0 => drop(caches[t % 2].reap()),
                        2500 => drop(caches[t % 2].update()),
                        _ => {}
                    }
                }
                for (k, p) in held {
                    // SAFETY: from cache k, freed once.
                    unsafe { caches[k].free(p) }.unwrap();
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    for round in 0..20 {
        // SAFETY: fork; the child uses the caches and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            common::forked_child(|| {
                let mut ok = true;
                for cache in caches.iter() {
                    let held: Vec<NonNull<u8>> = (0..5000).map(|_| cache.alloc().unwrap()).collect();
                    for p in held {
                        // SAFETY: from this cache, freed once.
                        ok &= unsafe { cache.free(p) }.is_ok();
                    }
                    cache.reap();
                    // The 8 workers (and the background reaper) vanished at the fork,
                    // perhaps mid-way between the slab layer and the counters.
                    cache.assert_valid_after_fork(9);
                }
                let fresh = ObjectCache::new("fork-child", 100, 8, None, None).unwrap();
                let p = fresh.alloc().unwrap();
                // SAFETY: from this cache, freed once.
                ok &= unsafe { fresh.free(p) }.is_ok();
                drop(fresh);
                ok &= scalemem::umem::cache::global_stats().caches >= 2;
                ok
            });
        }
        assert_eq!(common::wait_child(pid, &format!("child {round}")), 0, "child {round} failed");
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(ctors.load(Relaxed) > 0);
}

/// A size or alignment the slab layer cannot serve is refused as such at creation (not
/// as a lack of memory), before anything is mapped; the limits themselves are accepted.
#[test]
fn an_unservable_layout_is_refused_as_invalid() {
    use scalemem::umem::region::PAGE;
    use scalemem::umem::slab::MAX_SIZE;
    let regions = manual(1);
    for (size, align) in [(0, 8), (MAX_SIZE + 1, 8), (64, 3), (64, 0), (64, 2 * PAGE)] {
        let err = ObjectCache::builder("bad", size, align).regions(regions).config(config()).build().unwrap_err();
        assert_eq!(err, CacheError::InvalidLayout, "size {size}, alignment {align}");
    }
    assert_eq!(regions.stats().live_regions, 0, "a refused cache mapped a region");
    for (size, align) in [(1, 1), (MAX_SIZE, 8), (64, PAGE)] {
        let cache = ObjectCache::builder("limit", size, align).regions(regions).config(config()).build().unwrap();
        let p = cache.alloc().unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
        // SAFETY: from this cache, freed once.
        unsafe { cache.free(p) }.unwrap();
        cache.destroy();
    }
}
