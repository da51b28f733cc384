//! loom models of `scalemem::refcount`.
//!
//! Under loom there are 2 CPUs (model thread index modulo 2), fences are SeqCst fences,
//! and rseq critical sections are replaced by their model (`src/refcount/section.rs`):
//! a section runs under its CPU's section lock, and the rseq fence waits for every CPU's
//! running section. Each `PercpuRef` model runs three times: with no thread using
//! sections (the atomic fallback: compare-exchange on sealable per-CPU words), with every
//! thread using them, and with the main thread and thread 1 using them while thread 2
//! (on CPU 0, like the main thread) does not, so both kinds of per-CPU word are live on
//! one CPU.
//!
//! ```text
//! ci/loom.sh refcount
//! ```
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;

use scalemem::refcount::PercpuRef;
use scalemem::refcount::model::{Sections, set_sections};
use scalemem_loom_tests::run_model;

const EVERY_PATH: [Sections; 3] = [Sections::None, Sections::All, Sections::FirstTwo];

/// What the release callback observed.
struct Observed {
    /// Runs of `release`.
    releases: AtomicUsize,
    /// References the test threads say they hold right now, the initial one included
    /// (it is given up in the kill's `confirm`, right before the kill drops it).
    held: AtomicUsize,
    /// `release` ran while `held` was not zero.
    early: AtomicUsize,
}

impl Default for Observed {
    fn default() -> Self {
        Self { releases: AtomicUsize::new(0), held: AtomicUsize::new(1), early: AtomicUsize::new(0) }
    }
}

/// Kills `r`, giving up the initial reference in `held` just before it is dropped.
fn kill<F: Fn() + Send + Sync>(r: &PercpuRef<F>, observed: &Observed) {
    assert!(r.kill_and_confirm(|_| {
        observed.held.fetch_sub(1, SeqCst);
    }));
}

fn observed_ref(observed: &Arc<Observed>) -> PercpuRef<impl Fn() + Send + Sync + use<>> {
    let o = observed.clone();
    PercpuRef::new(move || {
        if o.held.load(SeqCst) != 0 {
            o.early.fetch_add(1, SeqCst);
        }
        o.releases.fetch_add(1, SeqCst);
    })
    .unwrap()
}

/// `switch_to_atomic` racing with gets and puts on both CPUs: no count is lost, and
/// `release` runs exactly once, at the kill, never while a reference is held.
#[test]
fn switch_to_atomic_vs_gets_and_puts() {
    for sections in EVERY_PATH {
        run_model(&format!("switch_to_atomic vs get/put ({sections:?})"), move || {
            set_sections(sections);
            let observed = Arc::new(Observed::default());
            let r = Arc::new(observed_ref(&observed));

            let workers: Vec<_> = [1, 2]
                .into_iter()
                .map(|index| {
                    let (r, observed) = (r.clone(), observed.clone());
                    thread::spawn(move || {
                        let _ = index;
                        r.get();
                        observed.held.fetch_add(1, SeqCst);
                        observed.held.fetch_sub(1, SeqCst);
                        r.put();
                    })
                })
                .collect();

            r.switch_to_atomic_sync();
            for worker in workers {
                worker.join().unwrap();
            }
            assert_eq!(r.count(), 1, "a get or put was lost");
            r.assert_valid();
            assert_eq!(observed.releases.load(SeqCst), 0, "released before the kill");
            kill(&r, &observed);
            assert_eq!(observed.releases.load(SeqCst), 1);
            assert_eq!(observed.early.load(SeqCst), 0);
        });
    }
}

/// A reference taken in per-CPU mode and dropped while the ref is being killed (its put
/// lands on the atomic count before the per-CPU parts are folded): the bias must keep
/// the count above zero until the fold.
#[test]
fn kill_vs_put_of_a_percpu_reference() {
    for sections in EVERY_PATH {
        run_model(&format!("kill vs put ({sections:?})"), move || {
            set_sections(sections);
            let observed = Arc::new(Observed::default());
            let r = Arc::new(observed_ref(&observed));
            r.get(); // per-CPU, on the main thread's CPU: handed to the putter
            observed.held.fetch_add(1, SeqCst);

            let putter = {
                let (r, observed) = (r.clone(), observed.clone());
                thread::spawn(move || {
                    observed.held.fetch_sub(1, SeqCst);
                    r.put();
                })
            };
            kill(&r, &observed);
            putter.join().unwrap();
            assert_eq!(observed.releases.load(SeqCst), 1, "release must run exactly once");
            assert_eq!(observed.early.load(SeqCst), 0, "released while a reference was held");
            assert!(r.is_zero());
        });
    }
}

/// `kill_and_confirm` racing with `tryget_live` and puts: a `tryget_live` that starts
/// after `confirm` fails; successful ones are counted (release waits for their puts).
#[test]
fn kill_vs_tryget_live() {
    for sections in EVERY_PATH {
        run_model(&format!("kill vs tryget_live ({sections:?})"), move || {
            set_sections(sections);
            let observed = Arc::new(Observed::default());
            let confirmed = Arc::new(AtomicUsize::new(0));
            let r = Arc::new(observed_ref(&observed));

            let users: Vec<_> = (0..2)
                .map(|_| {
                    let (r, observed, confirmed) = (r.clone(), observed.clone(), confirmed.clone());
                    thread::spawn(move || {
                        let after_confirm = confirmed.load(SeqCst) != 0;
                        if r.tryget_live() {
                            assert!(!after_confirm, "tryget_live succeeded after confirm");
                            observed.held.fetch_add(1, SeqCst);
                            // We hold a reference: release cannot have run.
                            assert_eq!(observed.releases.load(SeqCst), 0, "tryget_live revived a released ref");
                            observed.held.fetch_sub(1, SeqCst);
                            r.put();
                        }
                    })
                })
                .collect();

            assert!(r.kill_and_confirm(|_| {
                confirmed.store(1, SeqCst);
                observed.held.fetch_sub(1, SeqCst);
            }));
            for user in users {
                user.join().unwrap();
            }
            assert!(!r.tryget_live());
            assert_eq!(observed.releases.load(SeqCst), 1);
            assert_eq!(observed.early.load(SeqCst), 0, "released while a reference was held");
        });
    }
}

/// `switch_to_percpu` after an atomic period, racing with a get/put: the slots come
/// back clean and nothing is lost either way.
#[test]
fn switch_back_to_percpu_vs_get_put() {
    for sections in [Sections::None, Sections::All] {
        run_model(&format!("switch_to_percpu vs get/put ({sections:?})"), move || {
            set_sections(sections);
            let observed = Arc::new(Observed::default());
            let r = Arc::new(observed_ref(&observed));
            r.switch_to_atomic_sync();

            let worker = {
                let r = r.clone();
                thread::spawn(move || {
                    r.get();
                    r.put();
                })
            };
            r.switch_to_percpu();
            worker.join().unwrap();
            r.assert_valid();
            assert_eq!(r.count(), 1, "a get or put was lost");
            kill(&r, &observed);
            assert_eq!(observed.releases.load(SeqCst), 1);
            assert_eq!(observed.early.load(SeqCst), 0);
        });
    }
}

// ---------------------------------------------------------------------------------------
// Refcache. Under loom each CPU's cache has 2 ways, and the domains run without a
// background ticker: the models tick by hand.
// ---------------------------------------------------------------------------------------

mod refcache {
    use super::*;
    use loom::cell::UnsafeCell;
    use scalemem::refcount::{Config, RcRef, Refcache};

    /// An object whose value is a loom cell: a free that is not ordered after a reader's
    /// access (a use after free) is a causality violation loom reports.
    struct Value {
        cell: UnsafeCell<usize>,
        drops: Arc<AtomicUsize>,
    }

    // SAFETY: the cell is only read through shared references, and written once by the
    // destructor, which runs when no reference exists (the property under test; loom
    // reports any overlap).
    unsafe impl Sync for Value {}

    impl Value {
        fn new(drops: &Arc<AtomicUsize>) -> Self {
            Self { cell: UnsafeCell::new(7), drops: drops.clone() }
        }

        fn read(&self) -> usize {
            // SAFETY: see the Sync impl.
            self.cell.with(|v| unsafe { *v })
        }
    }

    impl Drop for Value {
        fn drop(&mut self) {
            // SAFETY: we are dropping the value: loom reports any access not ordered
            // before this write.
            self.cell.with_mut(|v| unsafe { *v = 0 });
            self.drops.fetch_add(1, SeqCst);
        }
    }

    /// Ticks until the object is freed, at most `limit` times.
    fn tick_until_freed(cache: &Refcache, drops: &AtomicUsize, limit: usize) {
        for _ in 0..limit {
            if drops.load(SeqCst) != 0 {
                break;
            }
            cache.tick();
        }
        assert_eq!(drops.load(SeqCst), 1, "not freed exactly once: {:?}", cache.stats());
        cache.assert_valid();
    }

    /// Increments after the global count reached zero, inside the review window: thread 1
    /// drops the first reference on CPU 1 while the main thread (CPU 0) keeps a clone and
    /// clones it again, and thread 2 (CPU 0) ticks meanwhile. The object must not be
    /// freed while referenced, and must be freed once all references are gone.
    #[test]
    fn inc_after_zero_within_the_review_window() {
        for sections in [Sections::None, Sections::All] {
            run_model(&format!("refcache: inc after zero ({sections:?})"), move || {
                set_sections(sections);
                let cache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(Config::manual()).unwrap()));
                let drops = Arc::new(AtomicUsize::new(0));
                let first = cache.alloc(Value::new(&drops));
                let kept = first.clone(); // CPU 0's delta +1
                cache.tick(); // every cache now lags: the ticker's ticks flush

                let dropper = thread::spawn(move || drop(first)); // CPU 1's delta -1
                let ticker = thread::spawn(move || {
                    cache.tick();
                    cache.tick();
                });
                assert_eq!(kept.read(), 7);
                let again = kept.clone();
                drop(kept);
                assert_eq!(again.read(), 7);
                dropper.join().unwrap();
                ticker.join().unwrap();
                assert_eq!(drops.load(SeqCst), 0, "freed while referenced");
                drop(again);
                tick_until_freed(cache, &drops, 5);
                // SAFETY: every handle is gone; the domain was leaked for 'static.
                drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
            });
        }
    }

    /// Runs `op` on CPU 1: on a new model thread with an odd index (spawning an empty one
    /// first if the next index is even), and waits for it.
    fn on_cpu1<R: Send + 'static>(next_index: &mut usize, op: impl FnOnce() -> R + Send + 'static) -> R {
        if (*next_index).is_multiple_of(2) {
            thread::spawn(|| {}).join().unwrap();
            *next_index += 1;
        }
        *next_index += 1;
        thread::spawn(op).join().unwrap()
    }

    /// The counterexample the dirty bit and the zero-delta flush exist for, step by step
    /// (no concurrency: the order is forced, each CPU's flushes are triggered by its own
    /// misses and by ticks). A reference moves between CPUs so that the global count is
    /// zero when the object is queued and again when it is reviewed, while a reference is
    /// live and its +1 sits unflushed in CPU 0's cache. Only the flush of CPU 1's entry
    /// whose delta cancelled to zero (and the dirty bit it sets) shows the object was
    /// touched. Needs sections (a hit must not flush), so it runs with them on.
    #[test]
    fn reference_moving_between_cpus_in_the_review_window() {
        run_model("refcache: reference moving between CPUs", || {
            set_sections(Sections::All);
            let cache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(Config::manual()).unwrap()));
            let drops = Arc::new(AtomicUsize::new(0));
            let mut next_index = 1;
            let r = cache.alloc(Value::new(&drops)); // X: global 1
            let y = cache.alloc(Value::new(&Arc::new(AtomicUsize::new(0)))); // Y shares X's way
            let e = cache.tick(); // nothing to flush: the epoch advances, every cache lags
            // CPU 1 flushes (its miss finds it lagging), then caches X +1.
            let (r, r1) = on_cpu1(&mut next_index, move || {
                let r1 = r.clone();
                (r, r1)
            });
            drop(r); // CPU 0 flushes, then caches X -1
            let y2 = y.clone(); // evicts X -1: global 0, X queued in epoch `e`
            assert_eq!(cache.stats().pending, 1, "X should be queued now");
            assert_eq!(cache.tick(), e + 1); // both flushed in `e`: advance
            drop(y2); // CPU 0 flushes in e + 1 (X is not in it), caches Y -1
            let r2 = r1.clone(); // evicts Y, caches X +1 on CPU 0: unflushed from here on
            on_cpu1(&mut next_index, move || drop(r1)); // a hit on CPU 1: X's delta there is 0
            assert_eq!(cache.tick(), e + 2); // flushes CPU 1's zero delta, advances, reviews X
            assert_eq!(drops.load(SeqCst), 0, "freed while referenced (the +1 on CPU 0 was never seen)");
            assert_eq!(cache.stats().pending, 1, "X should be re-queued (dirty)");
            assert_eq!(r2.read(), 7);
            drop((r2, y));
            tick_until_freed(cache, &drops, 6);
            // SAFETY: every handle is gone; the domain was leaked for 'static.
            drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
        });
    }

    /// A weak upgrade racing with the final free: exactly one wins; an upgraded
    /// reference is never freed under its user.
    #[test]
    fn weak_upgrade_vs_final_free() {
        for sections in [Sections::None, Sections::All] {
            run_model(&format!("refcache: upgrade vs free ({sections:?})"), move || {
                set_sections(sections);
                let cache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(Config::manual()).unwrap()));
                let drops = Arc::new(AtomicUsize::new(0));
                let strong = cache.alloc(Value::new(&drops));
                let weak = RcRef::downgrade(&strong);
                drop(strong);
                cache.tick(); // the count reaches zero: queued, dying

                let upgrader = thread::spawn(move || {
                    if let Some(revived) = weak.upgrade() {
                        assert_eq!(revived.read(), 7);
                    }
                    weak
                });
                cache.tick();
                cache.tick(); // due: freed unless the upgrade came first
                let weak = upgrader.join().unwrap();
                tick_until_freed(cache, &drops, 5);
                assert!(weak.upgrade().is_none());
                drop(weak);
                // SAFETY: every handle is gone; the domain was leaked for 'static.
                drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
            });
        }
    }

    /// The ticker flushes CPU 1's cache remotely (lock by compare-exchange, rseq fence,
    /// token check) while thread 1 runs hit and miss paths on it: no delta is lost or
    /// applied twice.
    #[test]
    fn remote_flush_vs_local_hits() {
        for sections in [Sections::All, Sections::None] {
            run_model(&format!("refcache: remote flush vs hits ({sections:?})"), move || {
                set_sections(sections);
                let cache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(Config::manual()).unwrap()));
                let drops = Arc::new(AtomicUsize::new(0));
                let root = cache.alloc(Value::new(&drops));
                cache.tick(); // every cache now lags: the next tick flushes them remotely
                let worker = {
                    let mine = root.clone();
                    thread::spawn(move || {
                        let a = mine.clone(); // CPU 1: miss, then hits
                        let b = a.clone();
                        drop(a);
                        assert_eq!(b.read(), 7);
                        drop(b);
                        drop(mine);
                    })
                };
                cache.tick();
                worker.join().unwrap();
                assert_eq!(drops.load(SeqCst), 0, "freed while referenced");
                drop(root);
                tick_until_freed(cache, &drops, 5);
                // SAFETY: every handle is gone; the domain was leaked for 'static.
                drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
            });
        }
    }

    /// The intrusive form (a region header counting live slabs): a reviver takes a
    /// reference to a header whose count is zero while ticks review it. The release
    /// callback writes the region's payload cell, so a revived user reading it
    /// concurrently is a causality violation; the release runs exactly once, after the
    /// last reference.
    #[test]
    fn intrusive_revive_vs_release() {
        use core::ptr::NonNull;
        use scalemem::refcount::{RcHeader, RcRelease};

        #[repr(C)]
        struct Region {
            header: RcHeader,
            payload: UnsafeCell<usize>,
            releases: AtomicUsize,
        }
        // SAFETY: the payload is read by holders of a reference and written once by the
        // release, which runs when none exists (the property under test).
        unsafe impl Sync for Region {}

        struct Release;
        impl RcRelease for Release {
            unsafe fn release(header: NonNull<RcHeader>) {
                // SAFETY: the header is the first field of a leaked repr(C) Region.
                let region = unsafe { header.cast::<Region>().as_ref() };
                // SAFETY: see the Sync impl; loom checks the claim.
                region.payload.with_mut(|v| unsafe { *v = 0 });
                region.releases.fetch_add(1, SeqCst);
            }
        }

        for sections in [Sections::None, Sections::All] {
            run_model(&format!("refcache: intrusive revive vs release ({sections:?})"), move || {
                set_sections(sections);
                let cache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(Config::manual()).unwrap()));
                let region: &'static Region = Box::leak(Box::new(Region {
                    header: RcHeader::new::<Release>(),
                    payload: UnsafeCell::new(7),
                    releases: AtomicUsize::new(0),
                }));
                let obj = NonNull::from(&region.header);
                // SAFETY: a fresh header, leaked (valid after its release too).
                unsafe {
                    cache.register(obj);
                    cache.dec(obj); // the region empties: zero, queued at the next tick
                }
                cache.tick();
                let reviver = thread::spawn(move || {
                    let obj = NonNull::from(&region.header);
                    // SAFETY: the header is leaked; a successful revival is a reference.
                    if unsafe { cache.try_revive(obj) } {
                        // SAFETY: see the Sync impl.
                        assert_eq!(region.payload.with(|v| unsafe { *v }), 7);
                        // SAFETY: the revived reference, given up.
                        unsafe { cache.dec(obj) };
                    }
                });
                cache.tick();
                cache.tick(); // due: released unless the revival came first
                reviver.join().unwrap();
                for _ in 0..6 {
                    if region.releases.load(SeqCst) != 0 {
                        break;
                    }
                    cache.tick();
                }
                assert_eq!(region.releases.load(SeqCst), 1, "released {} times", region.releases.load(SeqCst));
                cache.assert_valid();
                // SAFETY: every reference is gone; the domain was leaked for 'static.
                drop(unsafe { Box::from_raw(std::ptr::from_ref(cache).cast_mut()) });
            });
        }
    }
}
