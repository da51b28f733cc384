//! Threads whose rseq registration is gone. The crate's hot paths (`PercpuRef`,
//! `Refcache`, the umem magazines) find the rseq area from the thread pointer without
//! checking that the kernel watches it, and rely on every critical section refusing a
//! `cpu_id` that is not a CPU number (the kernel writes `u32::MAX` there when a thread
//! unregisters). Here a thread unregisters itself with the raw system call and then
//! uses each structure: every operation must take its fallback and lose nothing. A
//! section that wrote before its CPU check would corrupt a slot here (or crash).

#![cfg(not(scalemem_loom))]

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;

use scalemem::Umem;
use scalemem::cpu::rseq;
use scalemem::refcount::{Config, PercpuRef, Refcache};
use scalemem::rmlock::RmLock;
use scalemem::umem::cache::ObjectCache;

/// glibc's rseq signature on x86_64 (what it registered with).
const RSEQ_SIG: u32 = 0x5305_3053;
const RSEQ_FLAG_UNREGISTER: i32 = 1;

unsafe extern "C" {
    static __rseq_size: u32;
}

/// Unregisters the calling thread's rseq area (glibc registered it at thread start).
/// False where there is nothing to unregister or the kernel refuses.
fn unregister_this_thread() -> bool {
    let Some(area) = rseq::thread_area() else { return false };
    // SAFETY: reading glibc's exported constant.
    let exported = unsafe { __rseq_size } as usize;
    // glibc 2.35-2.39 registers 32 bytes; later versions register at least __rseq_size.
    for len in [32usize, exported] {
        // SAFETY: the rseq system call with the flags, area, length and signature glibc
        // registered with; it only changes this thread's registration.
        let r = unsafe { libc::syscall(libc::SYS_rseq, area, len as u32, RSEQ_FLAG_UNREGISTER, RSEQ_SIG) };
        if r == 0 {
            return true;
        }
    }
    false
}

/// Runs `f` on a new thread that first unregisters rseq; `None` (and a note) where this
/// system cannot unregister (no rseq at all: then every path is the fallback anyway).
fn on_unregistered_thread<R: Send>(f: impl FnOnce() -> R + Send) -> Option<R> {
    thread::scope(|s| {
        s.spawn(|| {
            if !unregister_this_thread() {
                eprintln!("rseq_unregistered: cannot unregister rseq here; skipping");
                return None;
            }
            assert!(rseq::thread_area().is_none(), "the area still reports a CPU after unregistering");
            Some(f())
        })
        .join()
        .unwrap()
    })
}

#[test]
fn percpu_ref_counts_through_the_fallback() {
    let released = Arc::new(AtomicUsize::new(0));
    let r = {
        let released = released.clone();
        PercpuRef::new(move || {
            released.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap()
    };
    // A registered thread's sections count on this CPU meanwhile.
    for _ in 0..1000 {
        r.get();
    }
    let ran = on_unregistered_thread(|| {
        for _ in 0..10_000 {
            r.get();
            r.put();
        }
        // Ten references taken here, dropped by the registered thread below.
        for _ in 0..10 {
            r.get();
        }
    });
    if ran.is_none() {
        return;
    }
    for _ in 0..1010 {
        r.put();
    }
    assert!(!r.is_zero());
    r.assert_valid();
    r.kill();
    assert!(r.is_zero(), "a get or put was lost: the count is not zero after the last put");
    assert_eq!(released.load(Ordering::SeqCst), 1);
}

#[test]
fn refcache_counts_through_the_fallback() {
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let cache = Refcache::with_config(Config::manual()).unwrap();
    let obj = cache.alloc(Dropped(dropped.clone()));
    let kept = on_unregistered_thread(|| {
        let mut held = Vec::new();
        for i in 0..10_000 {
            let c = obj.clone();
            if i % 1000 == 0 {
                held.push(c);
            }
        }
        held
    });
    let Some(kept) = kept else { return };
    assert_eq!(kept.len(), 10);
    for _ in 0..4 {
        cache.tick();
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "freed while references were held");
    drop(kept);
    drop(obj);
    for _ in 0..8 {
        cache.tick();
    }
    cache.assert_valid();
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "not freed once every reference was dropped");
}

#[test]
fn umem_allocates_and_frees_through_the_slow_paths() {
    static A: Umem = Umem::new();
    let layout = Layout::from_size_align(64, 8).unwrap();
    let ran = on_unregistered_thread(|| {
        let mut seen = HashSet::new();
        let mut blocks = Vec::new();
        for round in 0..4usize {
            for i in 0..2_000usize {
                // SAFETY: a valid, non-zero layout.
                let p = unsafe { A.alloc(layout) };
                assert!(!p.is_null());
                assert!(seen.insert(p as usize) || round > 0, "a live block handed out twice");
                // SAFETY: 64 writable bytes.
                unsafe { p.cast::<usize>().write(i ^ round) };
                blocks.push((p, i ^ round));
            }
            for (p, tag) in blocks.drain(..) {
                // SAFETY: written above, still live.
                assert_eq!(unsafe { p.cast::<usize>().read() }, tag, "a live block was overwritten");
                // SAFETY: from A with this layout, freed once.
                unsafe { A.dealloc(p, layout) };
            }
            seen.clear();
        }
        // The C interface too (its free finds the class from the address).
        let ps: Vec<_> = (0..1000).map(|i| scalemem::umem::global::malloc(16 + i % 200)).collect();
        assert!(ps.iter().all(|p| !p.is_null()));
        for p in ps {
            // SAFETY: from malloc, freed once.
            unsafe { scalemem::umem::global::free(p) };
        }
    });
    if ran.is_some() {
        // And the registered main thread still gets its fast path.
        // SAFETY: a valid layout; freed once.
        unsafe { A.dealloc(A.alloc(layout), layout) };
    }
}

#[test]
fn object_cache_and_rmlock_through_the_fallback() {
    let cache = ObjectCache::builder("unregistered", 48, 8).build().unwrap();
    let lock = RmLock::new(0u64);
    // true: the unregistered thread holds the read lock; false: it could not unregister.
    let (holding_tx, holding_rx) = mpsc::channel::<bool>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let (cache, lock) = (&cache, &lock);
        s.spawn(move || {
            let tx = holding_tx.clone();
            let ran = on_unregistered_thread(move || {
                let objs: Vec<_> = (0..5_000).map(|_| cache.alloc().unwrap()).collect();
                for p in objs {
                    // SAFETY: from this cache, freed once.
                    unsafe { cache.free(p).unwrap() };
                }
                let guard = lock.read();
                tx.send(true).unwrap();
                release_rx.recv().unwrap();
                drop(guard);
            });
            if ran.is_none() {
                holding_tx.send(false).unwrap();
            }
        });
        if holding_rx.recv().unwrap() {
            assert!(lock.try_write().is_none(), "a writer got in past a reader counted by the fallback");
            release_tx.send(()).unwrap();
        }
    });
    // The reader departed through its fallback too: the writer gets in.
    *lock.write() += 1;
    assert_eq!(*lock.read(), 1);
    assert_eq!(cache.stats().in_use, 0, "objects freed on the unregistered thread were lost");
    cache.assert_valid();
}
