//! Thread churn (issue 9, the primitives' part): thousands of short-lived threads pin,
//! retire, take hazard pointers, retire to a hazard domain, use per-CPU magazines and
//! Refcache references, and exit, a few at a time. Per-thread records (epoch records,
//! hazard records, the magazine layer's slots) must be reused, not leaked: their counts
//! stay at the peak number of threads alive at once. Everything retired by an exited
//! thread must still be freed exactly once, and the resident set must stay bounded.

#![cfg(not(scalemem_loom))]

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use std::thread;

use scalemem::epoch::{self, Owned};
use scalemem::hazard::{self, HazardPointer};
use scalemem::refcount::{Config as RcConfig, Refcache};
use scalemem::umem::{Config as MagConfig, CpuCaches};

mod common;

/// Threads in all; at most `AT_ONCE` alive together.
const THREADS: usize = if cfg!(debug_assertions) { 1_000 } else { 3_000 };
const AT_ONCE: usize = 8;

/// A value whose drops are counted.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// The resident set in KiB (from /proc/self/status).
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn short_lived_threads_reuse_their_records_and_lose_no_garbage() {
    // In a child with glibc's `malloc` kept to one arena (`common::alone`): the resident
    // set below is the whole process's, and a churned thread that finds glibc's arenas
    // busy would make it another, which is glibc's memory, not ours.
    if !common::alone("short_lived_threads_reuse_their_records_and_lose_no_garbage") {
        return;
    }
    let collector = epoch::default_collector();
    let hazards = Arc::new(scalemem::unique_domain!());
    let refcache: &'static Refcache = Box::leak(Box::new(Refcache::with_config(RcConfig::manual()).unwrap()));
    let caches = Arc::new(CpuCaches::new(MagConfig::default()).unwrap());
    let epoch_drops = Arc::new(AtomicUsize::new(0));
    let hazard_drops = Arc::new(AtomicUsize::new(0));
    let epoch_slot = Arc::new(epoch::Atomic::new(Tracked(epoch_drops.clone())));
    let hazard_slot = Arc::new(AtomicPtr::new(Box::into_raw(Box::new(Tracked(hazard_drops.clone())))));
    let shared = refcache.alloc(0u64);
    // The objects circulating through the magazine layer: each must come back once.
    let rounds: Vec<Box<u64>> = (0..256).map(Box::new).collect();
    let mut pool: Vec<NonNull<u8>> = rounds.iter().map(|b| NonNull::from(&**b).cast()).collect();
    let pool_ptrs: std::collections::BTreeSet<usize> = pool.iter().map(|p| p.as_ptr() as usize).collect();

    let before = rss_kib();
    let (mut epoch_retired, mut hazard_retired) = (0usize, 0usize);
    let mut rss_after_warmup = 0;
    for batch in 0..THREADS / AT_ONCE {
        let workers: Vec<_> = (0..AT_ONCE)
            .map(|k| {
                let (epoch_slot, hazard_slot, hazards, caches) =
                    (epoch_slot.clone(), hazard_slot.clone(), hazards.clone(), caches.clone());
                let (epoch_drops, hazard_drops) = (epoch_drops.clone(), hazard_drops.clone());
                let mine = shared.clone();
                let handed: Vec<usize> = pool.drain(..pool.len().min(4)).map(|p| p.as_ptr() as usize).collect();
                thread::spawn(move || {
                    let (mut retired_e, mut retired_h) = (0, 0);
                    for i in 0..4 {
                        let guard = epoch::pin();
                        if (i + k) % 2 == 0 {
                            let old = epoch_slot.swap(Owned::new(Tracked(epoch_drops.clone())), AcqRel, &guard);
                            // SAFETY: unlinked by the swap, retired once.
                            unsafe { guard.defer_destroy(old) };
                            retired_e += 1;
                        }
                        drop(guard);
                        let mut hp = HazardPointer::new_in(&*hazards);
                        // SAFETY: the slot's boxes are retired to `hazards` after the swap
                        // that unlinks them.
                        assert!(unsafe { hp.protect(&hazard_slot) }.is_some());
                        if (i + k) % 2 == 1 {
                            let new = Box::into_raw(Box::new(Tracked(hazard_drops.clone())));
                            let old = hazard_slot.swap(new, AcqRel);
                            // SAFETY: unlinked by the swap, retired once.
                            unsafe { hazards.retire_ptr(old, hazard::drop_box) };
                            retired_h += 1;
                        }
                    }
                    let copies: Vec<_> = (0..4).map(|_| mine.clone()).collect();
                    drop(copies);
                    drop(mine);
                    // Objects go into this CPU's magazines and out again (maybe on
                    // another CPU): whatever the layer keeps stays there for later threads.
                    let mut back = Vec::new();
                    for p in handed {
                        let p = NonNull::new(p as *mut u8).unwrap();
                        if let Err(p) = caches.free(p) {
                            back.push(p.as_ptr() as usize);
                        }
                    }
                    while back.len() < 4 {
                        match caches.alloc() {
                            Some(p) => back.push(p.as_ptr() as usize),
                            None => break,
                        }
                    }
                    (retired_e, retired_h, back)
                })
            })
            .collect();
        for w in workers {
            let (e, h, back) = w.join().expect("churn thread panicked");
            epoch_retired += e;
            hazard_retired += h;
            pool.extend(back.into_iter().map(|p| NonNull::new(p as *mut u8).unwrap()));
        }
        if batch % 64 == 0 {
            refcache.tick();
        }
        if batch == 16 {
            rss_after_warmup = rss_kib();
        }
    }

    // Records are reused. A thread that registers while no record is free maps a page
    // of them (31 epoch records, 15 hazard records); threads that do so at the same time
    // each map one. So the records mapped stay below a page per thread alive at once
    // (AT_ONCE churn threads plus this one), whatever the number of threads that came
    // and went; a leak of one record per thread would be THREADS. And the garbage exiting
    // threads handed over is collected as it comes (each thread's first pin runs the
    // upkeep), not left to pile up until someone flushes: one bag per thread would be
    // thousands.
    const EPOCH_RECORDS_PER_PAGE: usize = 31;
    const HAZARD_RECORDS_PER_PAGE: usize = 15;
    let stats = collector.stats();
    assert!(stats.pending <= 64, "epoch garbage of exited threads piles up: {stats:?}");
    assert!(stats.threads <= 2, "epoch records still claimed after every churn thread exited: {stats:?}");
    assert!(
        stats.records <= EPOCH_RECORDS_PER_PAGE * (AT_ONCE + 1),
        "epoch records leaked: {} for {THREADS} threads: {stats:?}",
        stats.records
    );
    let hs = hazards.stats();
    assert!(hs.records <= HAZARD_RECORDS_PER_PAGE * (AT_ONCE + 1), "hazard records leaked: {hs:?}");
    assert!(hs.threads <= 1, "hazard records still claimed after every churn thread exited: {hs:?}");

    // Garbage of exited threads is freed exactly once.
    let mut spins = 0;
    while epoch_drops.load(SeqCst) < epoch_retired {
        epoch::pin().flush();
        spins += 1;
        assert!(spins < 100_000, "epoch garbage of exited threads lost: {:?}", collector.stats());
        thread::yield_now();
    }
    assert_eq!(epoch_drops.load(SeqCst), epoch_retired, "epoch garbage freed twice");
    hazards.reclaim();
    hazards.reclaim();
    assert_eq!(hazard_drops.load(SeqCst), hazard_retired, "hazard garbage of exited threads not freed exactly once");

    // Every round circulated through the magazines comes back once.
    caches.drain(|p| pool.push(p));
    let mut seen: Vec<usize> = pool.iter().map(|p| p.as_ptr() as usize).collect();
    seen.sort_unstable();
    let unique: std::collections::BTreeSet<usize> = seen.iter().copied().collect();
    assert_eq!(seen.len(), unique.len(), "a round came back twice");
    assert_eq!(unique, pool_ptrs, "a round was lost or invented");

    // Refcache: the shared object is still referenced (by `shared`), then freed.
    let live_before = refcache.stats().live;
    assert_eq!(live_before, 1);
    drop(shared);
    let mut ticks = 0;
    while refcache.stats().live > 0 {
        refcache.tick();
        ticks += 1;
        assert!(ticks <= 8, "Refcache object not freed after churn: {:?}", refcache.stats());
    }

    // Resident set: thread stacks come and go; what stays must not grow with the number
    // of threads (a leak of one page per thread would be 12 MiB here). Not under
    // AddressSanitizer, whose allocator keeps freed memory in quarantine (256 MiB by
    // default) and per-thread caches on purpose: there LeakSanitizer checks leaks.
    let after = rss_kib();
    println!("churn: {THREADS} threads; RSS {before} KiB before, {rss_after_warmup} after warm-up, {after} KiB after");
    #[cfg(not(scalemem_asan))]
    assert!(
        after <= rss_after_warmup + 4096,
        "RSS grew by {} KiB over {THREADS} short-lived threads",
        after.saturating_sub(rss_after_warmup)
    );

    // SAFETY: every other user of the slots has exited; the objects are ours.
    unsafe {
        drop(Box::from_raw(hazard_slot.load(Acquire)));
        let guard = epoch::unprotected();
        drop(epoch_slot.swap(epoch::Shared::null(), AcqRel, guard).into_owned());
    }
    drop(rounds);
    // SAFETY: every thread that used the domain has been joined, and every reference to
    // its objects is gone; it was leaked above only to be shared as 'static.
    drop(unsafe { Box::from_raw(std::ptr::from_ref(refcache).cast_mut()) });
}
