//! Soak: several minutes of every primitive at once, with `Umem` as the global allocator,
//! checking that the process's memory stays flat and that every invariant holds at the
//! end.
//!
//! The main thread runs rounds of the `stress` example (a Treiber stack on `epoch`, a
//! queue on hazard pointers, `AtomicArc` read-copy-update, thread churn, per-CPU
//! counters; each round checks itself) while mixed workers run for the whole soak:
//! allocations of every size through the global allocator (stamped and checked, some
//! freed by other threads), a `TypedCache`, `PercpuRef` gets and puts, `Refcache`
//! objects made, shared, downgraded and dropped, and reads of an `RmLock`'d table that a
//! side thread rewrites (allocating under the write lock) while it switches the
//! `PercpuRef` between modes.
//!
//! After a warm-up (the first quarter), the resident set is sampled between stress
//! rounds: its median over the last half of the run must stay within a quarter (plus
//! 32 MiB) of its median over the half before, so growth that goes on for the whole run
//! fails. At the
//! end every count must be exact and the heap's invariants must hold.
//!
//! ```text
//! cargo run --release --example soak                  # 5 minutes
//! SOAK_SECS=90 cargo run --release --example soak     # what CI runs
//! ```

#[path = "stress.rs"]
#[allow(dead_code)]
mod stress;

use std::collections::HashMap;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::{Duration, Instant};

use scalemem::Umem;
use scalemem::refcount::{PercpuRef, RcRef, Refcache};
use scalemem::rmlock::RmLock;
use scalemem::umem::TypedCache;
use scalemem::umem::global;

#[global_allocator]
static A: Umem = Umem::new();

/// Drops of Refcache objects.
static OBJECT_DROPS: AtomicUsize = AtomicUsize::new(0);

/// A Refcache object: its drop is counted.
struct Object(u64);

impl Drop for Object {
    fn drop(&mut self) {
        OBJECT_DROPS.fetch_add(1, Relaxed);
    }
}

/// The lock's table: every entry equals `version`.
struct Table {
    version: u64,
    entries: Vec<u64>,
}

/// The resident set in KiB.
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What one mixed worker did.
#[derive(Default)]
struct Counts {
    ops: usize,
    objects_made: usize,
    remote_frees: usize,
}

fn main() {
    let secs: f64 = env_or("SOAK_SECS", 300.0);
    let workers: usize = env_or("SOAK_THREADS", 8);
    println!("soak: {secs} s, {workers} mixed workers beside 8-thread stress rounds, Umem as the global allocator");
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);

    let stop = AtomicBool::new(false);
    let releases = AtomicUsize::new(0);
    let percpu = PercpuRef::new(|| {
        releases.fetch_add(1, SeqCst);
    })
    .expect("per-CPU ref memory");
    let refcache = Refcache::new().expect("Refcache memory");
    let lock = RmLock::new(Table { version: 0, entries: vec![0; 64] });
    let typed = TypedCache::new("soak", || [7u64; 16]).expect("object cache");
    let exchange: std::sync::Mutex<Vec<Vec<u64>>> = std::sync::Mutex::new(Vec::new());
    let (mut rss_samples, mut stress_rounds) = (Vec::new(), 0usize);

    let (counts, writes) = std::thread::scope(|s| {
        let mixed: Vec<_> = (0..workers)
            .map(|t| {
                let (stop, percpu, refcache, lock, typed, exchange) =
                    (&stop, &percpu, &refcache, &lock, &typed, &exchange);
                s.spawn(move || {
                    let mut c = Counts::default();
                    let mut blocks: Vec<Vec<u64>> = Vec::new();
                    let mut map: HashMap<u64, String> = HashMap::new();
                    let mut objects: Vec<RcRef<'_, Object>> = Vec::new();
                    let mut boxes = Vec::new();
                    let mut held = 0usize;
                    while !stop.load(Relaxed) {
                        let i = c.ops;
                        match i % 8 {
                            0 | 1 => {
                                let stamp = ((t as u64) << 48) | i as u64;
                                let len = if i % 509 == 0 { 1 << 17 } else { 1 + (i * 7919 + t * 131) % 2048 };
                                blocks.push(vec![stamp; len]);
                                if blocks.len() > 64 {
                                    let b = blocks.swap_remove((i / 8) % blocks.len());
                                    assert!(b.iter().all(|&w| w == b[0]), "a block changed under its owner");
                                    if i % 3 == 0 {
                                        let mut ex = exchange.lock().unwrap();
                                        ex.push(b);
                                        if ex.len() > 128 {
                                            let theirs = ex.swap_remove(0);
                                            drop(ex);
                                            assert!(theirs.iter().all(|&w| w == theirs[0]));
                                            c.remote_frees += 1;
                                        }
                                    }
                                }
                            }
                            2 => {
                                map.insert(i as u64 % 4096, format!("value {i} of {t}"));
                                map.remove(&((i as u64 * 31) % 4096));
                            }
                            3 => {
                                if held < 4 && i % 3 != 0 {
                                    percpu.get();
                                    held += 1;
                                } else if held > 0 {
                                    percpu.put();
                                    held -= 1;
                                }
                            }
                            4 => {
                                if objects.is_empty() || i % 16 == 4 {
                                    objects.push(refcache.alloc(Object(i as u64)));
                                    c.objects_made += 1;
                                } else if objects.len() < 16 && i % 3 == 0 {
                                    let weak = RcRef::downgrade(&objects[0]);
                                    objects.push(weak.upgrade().expect("a strong reference is held"));
                                } else {
                                    let k = i % objects.len();
                                    let o = objects.swap_remove(k);
                                    let _ = o.0;
                                }
                            }
                            5 => {
                                let table = lock.read();
                                assert!(table.entries.iter().all(|&e| e == table.version), "torn table");
                            }
                            6 => {
                                let b = typed.alloc().expect("object cache memory");
                                assert_eq!(*b, [7; 16], "an object came back unconstructed");
                                boxes.push(b);
                                if boxes.len() > 32 {
                                    boxes.swap_remove(i % 32);
                                }
                            }
                            _ => {
                                // Growth through realloc across classes, then back.
                                let mut v: Vec<u8> = Vec::new();
                                v.extend((0..(i % 5000)).map(|k| k as u8));
                                v.truncate(3);
                                v.shrink_to_fit();
                            }
                        }
                        c.ops += 1;
                    }
                    percpu.put_many(held);
                    for b in &blocks {
                        assert!(b.iter().all(|&w| w == b[0]));
                    }
                    c
                })
            })
            .collect();
        let side = s.spawn(|| {
            let mut writes = 0u64;
            while !stop.load(Relaxed) {
                {
                    let mut table = lock.write();
                    table.version += 1;
                    let version = table.version;
                    table.entries = vec![version; 64 + (version % 64) as usize];
                }
                writes += 1;
                percpu.switch_to_atomic_sync();
                std::thread::sleep(Duration::from_millis(2));
                percpu.switch_to_percpu();
                std::thread::sleep(Duration::from_millis(2));
            }
            writes
        });

        // Stress rounds on the main thread, RSS sampled between and during them.
        let mut next_sample = start;
        while Instant::now() < end {
            let left = (end - Instant::now()).as_secs_f64();
            let report = stress::run(left.clamp(0.5, 2.0), 8);
            stress_rounds += 1;
            assert!(report.stack_ops > 0, "{report:?}");
            let now = Instant::now();
            if now >= next_sample {
                rss_samples.push((now - start, rss_kib()));
                next_sample = now + Duration::from_secs(1);
                let (at, rss) = rss_samples[rss_samples.len() - 1];
                eprint!("\rsoak: {:>5.0} s, {stress_rounds} stress rounds, RSS {} MiB   ", at.as_secs_f64(), rss >> 10);
            }
        }
        stop.store(true, Relaxed);
        let counts: Vec<Counts> = mixed.into_iter().map(|h| h.join().unwrap()).collect();
        (counts, side.join().unwrap())
    });
    eprintln!();

    // Every count exact.
    let remaining: usize = exchange.lock().unwrap().drain(..).map(|b| usize::from(b.iter().all(|&w| w == b[0]))).sum();
    percpu.assert_valid();
    assert_eq!(percpu.count(), 1, "a PercpuRef get or put was lost or duplicated");
    percpu.kill();
    assert_eq!(releases.load(SeqCst), 1, "release ran once");
    let made: usize = counts.iter().map(|c| c.objects_made).sum();
    drop(refcache); // frees what is still under review
    assert_eq!(OBJECT_DROPS.load(SeqCst), made, "every Refcache object dropped exactly once");
    let table = lock.read();
    assert!(table.entries.iter().all(|&e| e == table.version));
    assert_eq!(table.version, writes);
    drop(table);
    assert_eq!(typed.raw().stats().in_use, 0, "every cached object came back");

    // The resident set stayed flat after the warm-up: the median of the samples in the
    // last half of the steady state is within a quarter (plus 32 MiB) of the median in
    // the half before. (Medians, because freed large blocks stay cached for the decay
    // time, 10 s, which makes single samples swing with the stress rounds.)
    let warm = Duration::from_secs_f64(secs / 4.0);
    let steady: Vec<usize> = rss_samples.iter().filter(|&&(at, _)| at >= warm).map(|&(_, rss)| rss).collect();
    assert!(steady.len() >= 4, "too few RSS samples: {rss_samples:?}");
    let (first, last) = steady.split_at(steady.len() / 2);
    let median = |s: &[usize]| {
        let mut s = s.to_vec();
        s.sort_unstable();
        s[s.len() / 2]
    };
    let (first_median, last_median) = (median(first), median(last));
    assert!(
        last_median <= first_median + first_median / 4 + (32 << 10),
        "RSS kept growing: median {first_median} KiB in the first half of the steady state, {last_median} KiB \
         in the second; samples {rss_samples:?}"
    );
    global::assert_valid();
    let ops: usize = counts.iter().map(|c| c.ops).sum();
    let remote: usize = counts.iter().map(|c| c.remote_frees).sum::<usize>() + remaining;
    let stats = global::stats();
    println!(
        "ok in {:.0} s: {ops} mixed operations ({made} Refcache objects, {remote} remote frees), {writes} lock writes, \
         {stress_rounds} stress rounds; RSS median {first_median} KiB then {last_median} KiB; heap mapped {} MiB, in use {} KiB; \
         every count exact, heap invariants hold",
        start.elapsed().as_secs_f64(),
        stats.mapped >> 20,
        stats.in_use >> 10,
    );
}
