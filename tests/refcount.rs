//! Tests of `scalemem::refcount`: the semantics of `PercpuRef` (every mode, switch,
//! kill, resurrect and reinit), `PercpuOwner`/`PercpuArc`, and `Refcache`; then stress
//! runs with 16 threads (oversubscribing our 2-CPU machines) that migrate themselves
//! between CPUs while a signal thread interrupts them, so that rseq sections are aborted
//! and restarted, racing with switches, kills, epoch flushes and reviews. Each stress run
//! is bounded by a deadline as well as an operation count.

#![cfg(not(scalemem_loom))]

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::chaos::{self, Chaos, rseq_expected};
use scalemem::refcount::{Init, PercpuArc, PercpuOwner, PercpuRef};

// ---------------------------------------------------------------------------------------
// Chaos: 16 threads, self-migration, SIGUSR1.
// ---------------------------------------------------------------------------------------

const THREADS: usize = 16;

/// This file's stress runs: THREADS workers, a migration every 1000 operations, a signal
/// round every 200 µs, and a wall-clock cap of 1.2 s (2 s in release builds).
const CHAOS: chaos::Config = chaos::Config {
    threads: THREADS,
    migrate_every: 1_000,
    time_limit: Duration::from_millis(if cfg!(debug_assertions) { 1_200 } else { 2_000 }),
    signal_interval: Duration::from_micros(200),
};

// ---------------------------------------------------------------------------------------
// PercpuRef: semantics.
// ---------------------------------------------------------------------------------------

/// A ref whose release callback counts its runs and records the releasing thread.
fn counted() -> (PercpuRef<impl Fn() + Send + Sync>, Arc<AtomicUsize>) {
    let releases = Arc::new(AtomicUsize::new(0));
    let r = releases.clone();
    (
        PercpuRef::new(move || {
            r.fetch_add(1, SeqCst);
        })
        .unwrap(),
        releases,
    )
}

#[test]
fn percpu_ref_lifecycle() {
    let (r, releases) = counted();
    assert!(r.is_percpu() && !r.is_dying() && !r.is_zero());
    assert_eq!(r.count(), 1);
    r.get();
    r.get_many(10);
    assert!(r.tryget() && r.tryget_live());
    assert_eq!(r.count(), 14);
    r.put_many(12);
    assert_eq!(r.count(), 2);
    r.assert_valid();

    assert!(r.kill());
    r.assert_valid();
    assert!(r.is_dying() && !r.is_percpu() && !r.is_zero());
    assert!(!r.tryget_live());
    assert!(r.tryget(), "alive: one reference is held");
    assert_eq!(r.count(), 2);
    r.put();
    assert_eq!(releases.load(SeqCst), 0);
    r.put();
    assert_eq!(releases.load(SeqCst), 1);
    assert!(r.is_zero());
    assert!(!r.tryget() && !r.tryget_live());
    assert!(!r.kill(), "a second kill does nothing");
    assert!(!r.resurrect(), "released: resurrect refuses");
    r.switch_to_percpu();
    assert!(!r.is_percpu(), "dead refs stay atomic");
    assert_eq!(releases.load(SeqCst), 1);

    assert!(r.reinit());
    assert!(r.is_percpu() && !r.is_dying() && !r.is_zero());
    assert_eq!(r.count(), 1);
    assert!(!r.reinit(), "not zero");
    r.kill();
    assert_eq!(releases.load(SeqCst), 2, "one release per lifetime");
}

#[test]
fn percpu_ref_release_runs_where_the_count_reaches_zero() {
    let releaser = Arc::new(Mutex::new(None));
    let r = {
        let releaser = releaser.clone();
        Arc::new(PercpuRef::new(move || *releaser.lock().unwrap() = Some(std::thread::current().id())).unwrap())
    };
    r.get();
    r.kill();
    assert_eq!(*releaser.lock().unwrap(), None);
    let other = {
        let r = r.clone();
        std::thread::spawn(move || {
            r.put();
            std::thread::current().id()
        })
        .join()
        .unwrap()
    };
    assert_eq!(*releaser.lock().unwrap(), Some(other));
}

#[test]
fn percpu_ref_kill_in_atomic_mode_and_confirm() {
    let (r, releases) = counted();
    r.switch_to_atomic_sync();
    assert!(!r.is_percpu());
    r.get();
    let mut confirmed = false;
    assert!(r.kill_and_confirm(|r| {
        assert!(!r.tryget_live());
        assert!(!r.is_zero(), "confirm runs before the initial reference is dropped");
        confirmed = true;
    }));
    assert!(confirmed);
    assert_eq!(releases.load(SeqCst), 0);
    r.put();
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn percpu_ref_switches_keep_the_count() {
    let (r, releases) = counted();
    for round in 0..20 {
        r.get_many(3);
        if round % 2 == 0 {
            r.switch_to_atomic(|r| assert!(!r.is_percpu()));
        } else {
            r.switch_to_percpu();
        }
        r.assert_valid();
        r.put_many(3);
        assert_eq!(r.count(), 1);
        r.switch_to_atomic_sync();
        r.switch_to_atomic_sync(); // idempotent
        r.switch_to_percpu();
        r.switch_to_percpu(); // idempotent
        assert!(r.is_percpu());
    }
    assert_eq!(releases.load(SeqCst), 0);
    // Forced atomic: resurrect stays atomic until switch_to_percpu.
    r.switch_to_atomic_sync();
    r.get();
    r.kill();
    assert!(r.resurrect());
    assert!(!r.is_percpu() && !r.is_dying());
    r.switch_to_percpu();
    assert!(r.is_percpu());
    r.put();
    r.kill();
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn percpu_ref_init_modes() {
    let (atomic, _) = (PercpuRef::with_init(|| {}, Init::Atomic).unwrap(), ());
    assert!(!atomic.is_percpu() && !atomic.is_dying());
    atomic.assert_valid();
    atomic.get();
    atomic.put();
    atomic.switch_to_percpu();
    assert!(atomic.is_percpu());
    atomic.assert_valid();

    let releases = AtomicUsize::new(0);
    let dead = PercpuRef::with_init(
        || {
            releases.fetch_add(1, SeqCst);
        },
        Init::Dead,
    )
    .unwrap();
    assert!(dead.is_dying() && dead.is_zero() && !dead.tryget());
    dead.assert_valid();
    assert!(dead.reinit());
    assert!(dead.tryget_live());
    dead.put();
    dead.kill();
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn percpu_ref_puts_on_other_cpus_sum_up() {
    // References taken on one thread and dropped on others (per-CPU parts go negative).
    let (r, releases) = counted();
    let r = Arc::new(r);
    r.get_many(1000);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| r.put_many(250));
        }
    });
    assert_eq!(r.count(), 1);
    r.kill();
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn percpu_ref_reinit_waits_for_a_running_release() {
    let in_release = Arc::new(Barrier::new(2));
    let finish = Arc::new(AtomicBool::new(false));
    let r = {
        let (in_release, finish) = (in_release.clone(), finish.clone());
        Arc::new(
            PercpuRef::new(move || {
                in_release.wait();
                while !finish.load(SeqCst) {
                    std::thread::yield_now();
                }
            })
            .unwrap(),
        )
    };
    let killer = {
        let r = r.clone();
        std::thread::spawn(move || r.kill())
    };
    in_release.wait(); // release is running on the killer
    let reinit = {
        let r = r.clone();
        std::thread::spawn(move || r.reinit())
    };
    std::thread::sleep(Duration::from_millis(20));
    assert!(!reinit.is_finished(), "reinit must wait for release to return");
    finish.store(true, SeqCst);
    assert!(killer.join().unwrap());
    assert!(reinit.join().unwrap());
    assert!(r.is_percpu() && r.tryget_live());
    r.put();
}

// ---------------------------------------------------------------------------------------
// PercpuRef: stress.
// ---------------------------------------------------------------------------------------

#[test]
fn percpu_ref_loses_no_count_across_switches() {
    // Workers hold up to 8 references each and drop them in another order (and on other
    // CPUs, by migrating); a side thread keeps switching between modes. No count may be
    // lost, and release must not run until the final kill.
    let releases = AtomicUsize::new(0);
    let r = PercpuRef::new(|| {
        releases.fetch_add(1, SeqCst);
    })
    .unwrap();
    let (ops, Chaos { signals, .. }) = CHAOS.stress_with_side(
        |t, migrator, deadline| {
            let mut held = 0usize;
            let mut ops = 0usize;
            while ops < 200_000 && Instant::now() < deadline {
                match (ops + t) % 5 {
                    0 | 1 if held < 8 => {
                        r.get();
                        held += 1;
                    }
                    2 if held < 8 => {
                        assert!(r.tryget() && r.tryget_live(), "never killed during the run");
                        held += 2;
                    }
                    _ if held > 0 => {
                        r.put();
                        held -= 1;
                    }
                    _ => {}
                }
                migrator.tick(ops);
                ops += 1;
            }
            r.put_many(held);
            ops
        },
        |deadline| {
            let mut switches = 0;
            while Instant::now() < deadline {
                r.switch_to_atomic_sync();
                std::thread::sleep(Duration::from_micros(300));
                r.switch_to_percpu();
                std::thread::sleep(Duration::from_micros(300));
                switches += 1;
            }
            assert!(switches > 0);
        },
    );
    assert!(signals > 0);
    eprintln!("percpu_ref: {} ops on {THREADS} threads, {signals} signals", ops.iter().sum::<usize>());
    r.assert_valid();
    assert_eq!(r.count(), 1, "a get or put was lost or duplicated");
    assert_eq!(releases.load(SeqCst), 0);
    r.kill();
    assert_eq!(releases.load(SeqCst), 1);
}

#[test]
fn percpu_ref_kill_races_with_tryget_live() {
    // Many rounds: workers enter with tryget_live and leave with put while the main
    // thread kills with confirm. A tryget_live that starts after confirm must fail;
    // release runs exactly once, after every successful tryget_live was put.
    let rounds = if cfg!(debug_assertions) { 30 } else { 100 };
    for _ in 0..rounds {
        let inside = AtomicUsize::new(0);
        let released_while_inside = AtomicBool::new(false);
        let releases = AtomicUsize::new(0);
        let r = PercpuRef::new(|| {
            if inside.load(SeqCst) != 0 {
                released_while_inside.store(true, SeqCst);
            }
            releases.fetch_add(1, SeqCst);
        })
        .unwrap();
        let confirmed = AtomicBool::new(false);
        let start = Barrier::new(5);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..2_000 {
                        let after_confirm = confirmed.load(SeqCst);
                        if r.tryget_live() {
                            assert!(!after_confirm, "tryget_live succeeded after confirm");
                            inside.fetch_add(1, SeqCst);
                            std::hint::spin_loop();
                            inside.fetch_sub(1, SeqCst);
                            r.put();
                        } else {
                            assert!(r.is_dying());
                        }
                    }
                });
            }
            start.wait();
            std::thread::yield_now();
            assert!(r.kill_and_confirm(|_| confirmed.store(true, SeqCst)));
        });
        assert_eq!(releases.load(SeqCst), 1);
        assert!(!released_while_inside.load(SeqCst), "released while a reference was held");
        assert!(r.is_zero());
    }
}

// ---------------------------------------------------------------------------------------
// PercpuOwner / PercpuArc.
// ---------------------------------------------------------------------------------------

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn percpu_arc_frees_once_after_the_owner_and_the_last_handle() {
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = PercpuOwner::new(Tracked(drops.clone())).unwrap();
    let a = owner.share();
    let b = a.clone();
    assert!(PercpuArc::ptr_eq(&a, &b));
    drop(a);
    owner.kill();
    assert_eq!(drops.load(SeqCst), 0);
    let c = b.clone(); // atomic get now
    drop(b);
    assert_eq!(drops.load(SeqCst), 0);
    drop(c);
    assert_eq!(drops.load(SeqCst), 1);

    // The owner last.
    let owner = PercpuOwner::new(Tracked(drops.clone())).unwrap();
    drop(owner.share());
    drop(owner);
    assert_eq!(drops.load(SeqCst), 2);
}

#[test]
fn percpu_arc_stress_with_owner_dropped_mid_run() {
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = Mutex::new(Some(PercpuOwner::new(Tracked(drops.clone())).unwrap()));
    let seed = owner.lock().unwrap().as_ref().unwrap().share();
    // One slot per worker, touched only by the test thread (before the workers start)
    // and by its worker: no std Mutex handover, which ThreadSanitizer cannot see.
    let handles: Vec<Mutex<Option<PercpuArc<Tracked>>>> =
        (0..THREADS).map(|_| Mutex::new(Some(seed.clone()))).collect();
    drop(seed);
    let (_, Chaos { signals, .. }) = CHAOS.stress_with_side(
        |t, migrator, deadline| {
            let mine = handles[t].lock().unwrap().take().unwrap();
            let mut stash = Vec::with_capacity(8);
            let mut op = 0;
            while op < 100_000 && Instant::now() < deadline {
                if stash.len() < 8 && op % 3 != 2 {
                    stash.push(mine.clone());
                } else {
                    stash.pop();
                }
                migrator.tick(op);
                op += 1;
            }
            assert_eq!(drops.load(SeqCst), 0, "freed while handles are held");
        },
        |deadline| {
            std::thread::sleep((deadline - Instant::now()) / 2);
            owner.lock().unwrap().take(); // kill in the middle of the run
        },
    );
    assert!(signals > 0);
    owner.lock().unwrap().take();
    assert_eq!(drops.load(SeqCst), 1, "freed exactly once after the last handle");
}

// ---------------------------------------------------------------------------------------
// Refcache: semantics.
// ---------------------------------------------------------------------------------------

use scalemem::refcount::{Config, RcRef, Refcache};

/// Ticks until nothing is live, through at most `limit` epochs; returns the ticks that
/// advanced the epoch. A tick that finds the advancer busy (the background ticker's, in
/// the tests that run one) or a CPU's cache busy returns without advancing: it is not
/// counted, and the loop yields and ticks again (within 10 s). Otherwise a ticker
/// preempted while it holds the advancer would use up the budget in microseconds (a CI
/// run saw `refcache_stress_never_frees_a_referenced_object` fail so, its 4 last objects
/// still waiting for their flush).
fn tick_until_empty(cache: &Refcache, limit: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut advanced = 0;
    while advanced < limit && Instant::now() < deadline {
        if cache.stats().live == 0 {
            return advanced;
        }
        let before = cache.epoch();
        if cache.tick() != before {
            advanced += 1;
        } else {
            std::thread::yield_now();
        }
    }
    panic!("objects still live after {advanced} epochs: {:?}", cache.stats());
}

#[test]
fn refcache_frees_after_two_epochs_of_zero() {
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let a = cache.alloc(Tracked(drops.clone()));
    let b = a.clone();
    let c = b.clone();
    drop((a, b));
    for _ in 0..5 {
        cache.tick();
    }
    assert_eq!(drops.load(SeqCst), 0, "freed while referenced");
    assert_eq!(cache.stats().live, 1);
    drop(c);
    assert_eq!(drops.load(SeqCst), 0, "freed at once: zero is detected by epochs");
    // The delta reaches the header at the next flush (tick 1), the object is reviewed
    // two epochs after it was queued.
    let e0 = cache.epoch();
    let ticks = tick_until_empty(&cache, 10);
    assert!(cache.epoch() >= e0 + 2, "freed before two epochs passed");
    assert!(ticks <= 3, "took {ticks} ticks");
    assert_eq!(drops.load(SeqCst), 1);
    let stats = cache.stats();
    assert_eq!((stats.live, stats.pending, stats.freed), (0, 0, 1));
    cache.assert_valid();
}

/// Calls `tick_if_busy` until it skips; panics with `stuck` after 10 ticks.
fn busy_ticks(cache: &Refcache, stuck: &str) {
    let mut ticks = 0;
    while cache.tick_if_busy().is_some() {
        ticks += 1;
        assert!(ticks <= 10, "{stuck}: {:?}", cache.stats());
    }
}

#[test]
fn refcache_tick_if_busy_skips_only_an_idle_domain() {
    // What a periodic driver (umem's maintenance) relies on: no tick, so no rseq fence,
    // while nothing is cached or under review; ticks until the object is freed otherwise.
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let e0 = cache.epoch();
    assert_eq!(cache.tick_if_busy(), None, "an empty domain ticked");
    assert_eq!(cache.epoch(), e0, "a skipped tick advanced the epoch");
    let drops = Arc::new(AtomicUsize::new(0));
    let a = cache.alloc(Tracked(drops.clone()));
    let b = a.clone(); // a +1 delta in this CPU's cache (or in the header if it was busy)
    drop(a);
    // A live object whose deltas are all flushed leaves nothing to do: the skips begin
    // within a few ticks and never free it.
    busy_ticks(&cache, "a domain holding only a live, flushed object kept ticking");
    assert_eq!(drops.load(SeqCst), 0, "freed while referenced");
    let settled = cache.epoch();
    assert_eq!(cache.tick_if_busy(), None);
    assert_eq!(cache.epoch(), settled);
    // The last reference: the domain is busy until the object is freed, then idle again.
    drop(b);
    busy_ticks(&cache, "no progress after the last drop");
    assert_eq!(drops.load(SeqCst), 1, "the periodic driver stopped before the free");
    assert!(cache.epoch() >= settled + 2, "freed before two epochs passed");
    assert_eq!(cache.tick_if_busy(), None);
    cache.assert_valid();
}

#[test]
fn refcache_references_moved_between_threads() {
    // A reference taken on one thread (CPU) and dropped on another: per-CPU deltas of
    // opposite signs; the object must survive until the last one is gone.
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let root = cache.alloc(Tracked(drops.clone()));
    for round in 0..50 {
        let moved: Vec<_> = (0..8).map(|_| root.clone()).collect();
        std::thread::scope(|s| {
            s.spawn(move || drop(moved));
        });
        if round % 3 == 0 {
            cache.tick();
        }
        assert_eq!(drops.load(SeqCst), 0);
    }
    drop(root);
    tick_until_empty(&cache, 10);
    assert_eq!(drops.load(SeqCst), 1);
}

#[test]
fn refcache_weak_upgrade_until_freed() {
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let strong = cache.alloc(Tracked(drops.clone()));
    let weak = RcRef::downgrade(&strong);
    let weak2 = weak.clone();
    assert!(weak.upgrade().is_some());
    drop(strong);
    cache.tick(); // count reaches zero: queued, dying
    let revived = weak.upgrade().expect("dying but not freed: upgrade succeeds");
    for _ in 0..6 {
        cache.tick();
    }
    assert_eq!(drops.load(SeqCst), 0, "the upgrade must veto the free");
    drop(revived);
    tick_until_empty(&cache, 10);
    assert_eq!(drops.load(SeqCst), 1);
    assert!(weak.upgrade().is_none());
    assert!(weak2.upgrade().is_none());
    drop(weak);
    drop(weak2); // frees the memory (ASan checks)
}

#[test]
fn refcache_drop_frees_what_is_unreferenced() {
    let drops = Arc::new(AtomicUsize::new(0));
    let live = {
        let cache = Refcache::with_config(Config::manual()).unwrap();
        let a = cache.alloc(Tracked(drops.clone()));
        let b = cache.alloc(Tracked(drops.clone()));
        let kept = a.clone();
        drop((a, b));
        cache.tick(); // b is queued; a's count is still one (kept)
        let live = cache.stats().live;
        drop(kept); // a's last delta is only cached when the domain goes
        live
    };
    assert_eq!(live, 2);
    assert_eq!(drops.load(SeqCst), 2, "the domain's drop frees every unreferenced object");
}

#[test]
fn refcache_many_objects_evict_each_other() {
    // More objects than ways per CPU: conflicts evict deltas into headers.
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let objects: Vec<_> = (0..2_000).map(|_| cache.alloc(Tracked(drops.clone()))).collect();
    let mut clones = Vec::new();
    for round in 0..4 {
        for object in &objects {
            clones.push(object.clone());
        }
        if round == 1 {
            cache.tick();
        }
    }
    drop(objects);
    cache.tick();
    assert_eq!(drops.load(SeqCst), 0);
    clones.truncate(2_000 * 3); // drops the last round's clones
    for _ in 0..4 {
        cache.tick();
    }
    assert_eq!(drops.load(SeqCst), 0);
    cache.assert_valid();
    drop(clones);
    tick_until_empty(&cache, 10);
    assert_eq!(drops.load(SeqCst), 2_000);
    cache.assert_valid();
}

#[test]
fn refcache_background_ticker_frees_without_help() {
    let cache = Refcache::with_config(Config { epoch: Duration::from_millis(2), background: true }).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let object = cache.alloc(Tracked(drops.clone()));
    let clones: Vec<_> = (0..10).map(|_| object.clone()).collect();
    std::thread::scope(|s| {
        s.spawn(move || drop(clones)); // on another thread, whose CPU then goes idle
    });
    drop(object);
    let deadline = Instant::now() + Duration::from_secs(5);
    while drops.load(SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the ticker did not free the object: {:?}", cache.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cache.stats().live, 0);
}

// ---------------------------------------------------------------------------------------
// Refcache: stress.
// ---------------------------------------------------------------------------------------

#[test]
fn refcache_stress_never_frees_a_referenced_object() {
    // 16 migrating, signalled threads allocate objects, clone and drop references, pass
    // them to each other through a shared pool, and upgrade weak references from a shared
    // table (racing with the frees of objects that just died), while the background
    // ticker (1 ms epochs) and a side thread tick. A thread checks that the object of
    // every reference it holds has not been dropped (by id, without touching the
    // object); at the end every object is dropped exactly once.
    const NEW_PER_THREAD: usize = 2_000;
    const IDS: usize = THREADS * NEW_PER_THREAD;
    const WEAK_SLOTS: usize = 64;
    struct Counted {
        id: usize,
        drops: Arc<Vec<AtomicUsize>>,
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.drops[self.id].fetch_add(1, SeqCst);
        }
    }
    let drops: Arc<Vec<AtomicUsize>> = Arc::new((0..IDS).map(|_| AtomicUsize::new(0)).collect());
    let created: Vec<AtomicBool> = (0..IDS).map(|_| AtomicBool::new(false)).collect();
    let cache = Refcache::with_config(Config { epoch: Duration::from_millis(1), background: true }).unwrap();
    let pool = Mutex::new(Vec::new());
    let weaks = Mutex::new(Vec::with_capacity(WEAK_SLOTS));
    let (ops, Chaos { signals, .. }) = CHAOS.stress_with_side(
        |t, migrator, deadline| {
            let mut held: Vec<(usize, RcRef<'_, Counted>)> = Vec::new();
            let mut next_id = t * NEW_PER_THREAD;
            let mut op = 0usize;
            let mut rng = t as u64 * 0x9E37_79B9 + 1;
            while op < 60_000 && Instant::now() < deadline {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let pick = (rng >> 16) as usize;
                match rng % 16 {
                    0 if next_id < (t + 1) * NEW_PER_THREAD => {
                        let id = next_id;
                        next_id += 1;
                        created[id].store(true, SeqCst);
                        let r = cache.alloc(Counted { id, drops: drops.clone() });
                        let mut weaks = weaks.lock().unwrap();
                        if weaks.len() < WEAK_SLOTS {
                            weaks.push((id, RcRef::downgrade(&r)));
                        } else {
                            weaks[pick % WEAK_SLOTS] = (id, RcRef::downgrade(&r));
                        }
                        drop(weaks);
                        held.push((id, r));
                    }
                    1..=5 if !held.is_empty() => {
                        let (id, r) = &held[pick % held.len()];
                        let copy = (*id, r.clone());
                        held.push(copy);
                    }
                    6..=10 if !held.is_empty() => {
                        held.swap_remove(pick % held.len());
                    }
                    11 => {
                        if let Some(pair) = pool.lock().unwrap().pop() {
                            held.push(pair);
                        }
                    }
                    12 if !held.is_empty() => {
                        let pair = held.swap_remove(pick % held.len());
                        pool.lock().unwrap().push(pair);
                    }
                    13 | 14 => {
                        let weaks = weaks.lock().unwrap();
                        if !weaks.is_empty() {
                            let (id, weak) = &weaks[pick % weaks.len()];
                            if let Some(r) = weak.upgrade() {
                                held.push((*id, r));
                            }
                        }
                    }
                    _ => {}
                }
                if op.is_multiple_of(32) {
                    for (id, r) in &held {
                        assert_eq!(drops[*id].load(SeqCst), 0, "object {id} dropped while referenced");
                        assert_eq!(r.id, *id);
                    }
                }
                if held.len() > 24 {
                    held.truncate(8);
                }
                migrator.tick(op);
                op += 1;
            }
            op
        },
        |deadline| {
            while Instant::now() < deadline {
                cache.tick();
                std::thread::sleep(Duration::from_micros(200));
            }
        },
    );
    assert!(signals > 0);
    let during = cache.stats();
    eprintln!("refcache: {} ops, {signals} signals, {during:?}", ops.iter().sum::<usize>());
    assert!(during.freed > 0, "nothing was freed during the run");
    drop(pool.into_inner().unwrap());
    tick_until_empty(&cache, 20);
    for (id, d) in drops.iter().enumerate() {
        let expected = usize::from(created[id].load(SeqCst));
        assert_eq!(d.load(SeqCst), expected, "object {id} dropped {} times", d.load(SeqCst));
    }
    drop(weaks.into_inner().unwrap());
}

#[test]
fn rseq_sections_are_the_fast_path_here() {
    // Where rseq is on and the kernel has the rseq fence (our machines), both structures
    // use sections; with rseq switched off they use their atomic/locked paths.
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let r = PercpuRef::new(|| {}).unwrap();
    let expected = rseq_expected() && scalemem::cpu::fence::heavy_rseq();
    let flag = format!("sections: {expected}");
    assert!(format!("{cache:?}").contains(&flag), "{cache:?}");
    assert!(format!("{r:?}").contains(&flag), "{r:?}");
}

// ---------------------------------------------------------------------------------------
// Refcache: intrusive headers (the allocator's regions).
// ---------------------------------------------------------------------------------------

mod intrusive {
    use super::*;
    use core::ptr::NonNull;
    use scalemem::refcount::{RcHeader, RcRelease};

    /// A region-like object: a header plus a payload that the release callback poisons
    /// and records, so a release while referenced or a second release is visible.
    #[repr(C)]
    struct Region {
        header: RcHeader,
        payload: AtomicUsize,
        releases: AtomicUsize,
    }

    const LIVE: usize = 0x5ca1e;
    const RELEASED: usize = 0xdead;

    struct ReleaseRegion;
    impl RcRelease for ReleaseRegion {
        unsafe fn release(header: NonNull<RcHeader>) {
            // SAFETY: the header is the first field of a repr(C) Region that the test
            // keeps alive (leaked) for exactly this check.
            let region = unsafe { header.cast::<Region>().as_ref() };
            assert_eq!(region.payload.swap(RELEASED, SeqCst), LIVE, "released twice");
            region.releases.fetch_add(1, SeqCst);
        }
    }

    fn region() -> &'static Region {
        Box::leak(Box::new(Region {
            header: RcHeader::new::<ReleaseRegion>(),
            payload: AtomicUsize::new(LIVE),
            releases: AtomicUsize::new(0),
        }))
    }

    fn ptr(r: &Region) -> NonNull<RcHeader> {
        NonNull::from(&r.header)
    }

    /// Frees a region made by `region()` (LeakSanitizer checks these tests).
    ///
    /// # Safety
    /// The domain that counted it has been dropped, so nothing can touch it any more.
    unsafe fn free_region(r: &'static Region) {
        // SAFETY: `r` came from Box::leak in region(); per the contract it is unused.
        drop(unsafe { Box::from_raw(std::ptr::from_ref(r).cast_mut()) });
    }

    #[test]
    fn released_once_two_epochs_after_zero_and_never_while_counted() {
        let cache = Refcache::with_config(Config::manual()).unwrap();
        let r = region();
        // SAFETY: a fresh header, leaked, so valid after release too.
        unsafe { cache.register(ptr(r)) };
        for _ in 0..100 {
            // SAFETY: we hold the creator's reference.
            unsafe { cache.inc(ptr(r)) };
        }
        std::thread::scope(|s| {
            for _ in 0..4 {
                // 100 references handed to threads, 25 each, dropped on their CPUs.
                s.spawn(|| {
                    for _ in 0..25 {
                        // SAFETY: each drops one of the 100 references taken above.
                        unsafe { cache.dec(ptr(r)) };
                    }
                });
            }
        });
        for _ in 0..6 {
            cache.tick();
        }
        assert_eq!(r.releases.load(SeqCst), 0, "released while the creator's reference is held");
        assert_eq!(cache.stats().live, 1);
        // SAFETY: the creator's reference, given up.
        unsafe { cache.dec(ptr(r)) };
        assert_eq!(r.releases.load(SeqCst), 0, "released at once: zero is detected by epochs");
        let e0 = cache.epoch();
        tick_until_empty(&cache, 10);
        assert!(cache.epoch() >= e0 + 2, "released before two epochs passed");
        assert_eq!(r.releases.load(SeqCst), 1);
        cache.assert_valid();
        drop(cache);
        // SAFETY: the domain is gone.
        unsafe { free_region(r) };
    }

    #[test]
    fn revive_vetoes_the_release_and_fails_after_it() {
        let cache = Refcache::with_config(Config::manual()).unwrap();
        let r = region();
        // SAFETY: fresh header, leaked.
        unsafe { cache.register(ptr(r)) };
        // SAFETY: the creator's reference.
        unsafe { cache.dec(ptr(r)) };
        cache.tick(); // zero reaches the header: queued for review, dying
        // SAFETY: the header is leaked, so valid whatever the domain does.
        assert!(unsafe { cache.try_revive(ptr(r)) }, "not released yet: revival succeeds");
        for _ in 0..6 {
            cache.tick();
        }
        assert_eq!(r.releases.load(SeqCst), 0, "a revived region must not be released");
        assert_eq!(r.header.global_count(), 1);
        // SAFETY: the revived reference, given up.
        unsafe { cache.dec(ptr(r)) };
        tick_until_empty(&cache, 10);
        assert_eq!(r.releases.load(SeqCst), 1);
        // SAFETY: leaked header.
        assert!(!unsafe { cache.try_revive(ptr(r)) }, "revival after the release must fail");
        drop(cache);
        // SAFETY: the domain is gone.
        unsafe { free_region(r) };
    }

    #[test]
    fn dropping_the_domain_releases_zero_count_headers_only() {
        let (a, b) = (region(), region());
        {
            let cache = Refcache::with_config(Config::manual()).unwrap();
            // SAFETY: fresh headers, leaked.
            unsafe {
                cache.register(ptr(a));
                cache.register(ptr(b));
                cache.dec(ptr(a));
            }
            cache.tick();
        }
        assert_eq!(a.releases.load(SeqCst), 1);
        assert_eq!(b.releases.load(SeqCst), 0, "a counted header is leaked, not released");
        // SAFETY: the domain is gone (dropped at the end of the block above).
        unsafe {
            free_region(a);
            free_region(b);
        }
    }

    #[test]
    fn racing_revivals_and_drops_release_exactly_once_at_the_end() {
        // 8 threads revive and drop one header in a loop while the main thread ticks:
        // a region that empties and refills all the time. It is never released while a
        // revival holds it, and released exactly once after the last drop.
        let cache = Refcache::with_config(Config::manual()).unwrap();
        let r = region();
        // SAFETY: fresh header, leaked.
        unsafe { cache.register(ptr(r)) };
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut held = 0usize;
                    while !stop.load(SeqCst) {
                        // SAFETY: the header is leaked (valid), and while we hold a
                        // revived reference the region must be live.
                        if unsafe { cache.try_revive(ptr(r)) } {
                            assert_eq!(r.payload.load(SeqCst), LIVE, "released while referenced");
                            held += 1;
                            // SAFETY: the reference just revived.
                            unsafe { cache.dec(ptr(r)) };
                        }
                    }
                    held
                });
            }
            for _ in 0..200 {
                cache.tick();
            }
            // SAFETY: the creator's reference, given up mid-run.
            unsafe { cache.dec(ptr(r)) };
            for _ in 0..200 {
                cache.tick();
            }
            stop.store(true, SeqCst);
        });
        tick_until_empty(&cache, 10);
        assert_eq!(r.releases.load(SeqCst), 1);
        drop(cache);
        // SAFETY: the domain is gone.
        unsafe { free_region(r) };
    }
}
