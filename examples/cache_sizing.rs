//! How an object cache's magazines adapt to one thread's bursts (`umem::cache`, "Magazine
//! sizing"): a thread allocates a burst of objects, touches each, frees them all, over
//! and over, on a fresh `ObjectCache` with the background reaper on (the default). Run
//! once with the exchange rule (the default, `Config::grow_exchanges`) and once without
//! it (libumem's contention rule alone), then through `scalemem::Umem` (the global
//! heap's caches, which size themselves on their own 10 ms tick) for reference. Every
//! half second it prints the time per burst over that half second and the magazine size.
//!
//! ```text
//! cargo run --release --example cache_sizing                      # 256-byte objects, bursts of 100, 4 s each
//! cargo run --release --example cache_sizing -- --size 1024 --burst 200 --secs 6
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use scalemem::umem::Umem;
use scalemem::umem::cache::{Config, ObjectCache};

const USAGE: &str = "usage: cache_sizing [--size BYTES] [--burst N] [--secs S]";

/// Reads `--size`, `--burst` and `--secs`.
fn args() -> (usize, usize, f64) {
    let (mut size, mut burst, mut secs) = (256usize, 100usize, 4.0f64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--size" => size = value.parse().expect(USAGE),
            "--burst" => burst = value.parse().expect(USAGE),
            "--secs" => secs = value.parse().expect(USAGE),
            _ => panic!("unknown argument {flag}\n{USAGE}"),
        }
    }
    assert!(size >= 8 && burst > 0 && secs > 0.0, "{USAGE}");
    (size, burst, secs)
}

/// Runs bursts through `alloc`/`free` for `secs`, printing each half second's time per
/// burst and `magazines()`; returns the last second's mean time per burst, in ns.
fn run(
    label: &str,
    burst: usize,
    secs: f64,
    mut alloc: impl FnMut() -> NonNull<u8>,
    mut free: impl FnMut(NonNull<u8>),
    magazines: impl Fn() -> String,
) -> f64 {
    let mut held = Vec::with_capacity(burst);
    let start = Instant::now();
    let (mut mark, mut bursts) = (start, 0u64);
    let mut last_second = Vec::new();
    println!("{label}");
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            held.extend((0..burst).map(|_| alloc()));
            for &p in &held {
                // SAFETY: a live object of at least 8 bytes, ours until freed below.
                unsafe { p.as_ptr().write_volatile(1) };
            }
            for p in held.drain(..) {
                free(black_box(p));
            }
        }
        bursts += 64;
        let elapsed = mark.elapsed();
        if elapsed >= Duration::from_millis(500) {
            let ns = elapsed.as_nanos() as f64 / bursts as f64;
            let at = start.elapsed().as_secs_f64();
            println!("  {at:4.1} s  {ns:7.0} ns per burst  {}", magazines());
            if at > secs - 1.0 {
                last_second.push(ns);
            }
            (mark, bursts) = (Instant::now(), 0);
        }
    }
    last_second.iter().sum::<f64>() / last_second.len().max(1) as f64
}

fn main() {
    let (size, burst, secs) = args();
    println!("bursts of {burst} objects of {size} bytes, one thread, {secs} s each");
    let mut last = Vec::new();
    for (label, rule) in [("ObjectCache, exchange rule on (default)", true), ("ObjectCache, exchange rule off", false)]
    {
        let config = if rule { Config::default() } else { Config { grow_exchanges: None, ..Config::default() } };
        let cache = ObjectCache::builder("cache_sizing", size, 16).config(config).build().expect("an object cache");
        let ns = run(
            label,
            burst,
            secs,
            || cache.alloc().expect("an object"),
            // SAFETY: each object is from this cache and freed once.
            |p| unsafe { cache.free(p) }.expect("a free"),
            || format!("magazines of {}", cache.stats().magazine_size),
        );
        last.push((label, ns));
    }
    static UMEM: Umem = Umem::new();
    let layout = Layout::from_size_align(size, 16).expect("a layout");
    let ns = run(
        "scalemem::Umem (the global heap's caches)",
        burst,
        secs,
        // SAFETY: a non-zero-size layout.
        || NonNull::new(unsafe { UMEM.alloc(layout) }).expect("a block"),
        // SAFETY: from UMEM with this layout, freed once.
        |p| unsafe { UMEM.dealloc(p.as_ptr(), layout) },
        String::new,
    );
    last.push(("scalemem::Umem", ns));
    println!("last second, ns per burst:");
    for (label, ns) in &last {
        println!("  {label}: {ns:.0}");
    }
    println!("exchange rule on / off: {:.2}x the time", last[0].1 / last[1].1);
}
