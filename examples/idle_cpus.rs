//! What a CPU the program stops running on keeps cached (`umem::cpu_cache`, "Idle
//! CPUs"): one thread works on every CPU it may run on in turn, allocating and freeing
//! bursts of 4 KiB objects from an `ObjectCache` (background reaper on, the default) so
//! that each CPU's magazines fill, then stays on the first CPU and keeps working there
//! with bursts its own magazines serve. Every half second it prints what the cache holds
//! in magazines (the CPUs' and the depot's). The magazines have a fixed size here (31 rounds, no growth rule), so
//! that no resize, which drains every CPU, hides what happens to an idle one: within
//! about two working-set intervals (1 s each) its full magazines move to the depot, and
//! an interval later the working-set reap gives them back, while the CPU in use keeps
//! its own. (Before the idle drain they stayed until the cache's decay, which
//! needs ten intervals without any slab traffic, not just none on that CPU.)
//!
//! ```text
//! cargo run --release --example idle_cpus            # 5 s per part
//! cargo run --release --example idle_cpus -- 8       # 8 s per part
//! ```

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
use scalemem::umem::cache::{Config, ObjectCache};
use scalemem::umem::cpu_cache::Config as MagazineConfig;

const SIZE: usize = 4096;

/// Runs `f` with the thread on `cpu` alone.
fn on(cpu: usize, f: impl FnOnce()) {
    let mut one = CpuSet::new();
    one.set(cpu);
    sched_setaffinity(None, &one).expect("pinning to an allowed CPU");
    f();
}

/// `n` allocations, each written, then `n` frees.
fn burst(n: usize, alloc: &impl Fn() -> NonNull<u8>, free: &impl Fn(NonNull<u8>)) {
    let held: Vec<_> = (0..n).map(|_| alloc()).collect();
    for &p in &held {
        // SAFETY: a live block of SIZE bytes, ours until freed below.
        unsafe { p.as_ptr().write_bytes(1, SIZE) };
    }
    for p in held {
        free(p);
    }
}

/// Fills every allowed CPU's magazines, then works on the first one for `secs`,
/// printing `cached()` (bytes) every half second.
fn run(secs: f64, alloc: impl Fn() -> NonNull<u8>, free: impl Fn(NonNull<u8>), cached: impl Fn() -> usize) {
    let allowed = sched_getaffinity(None).expect("the thread's CPUs");
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c)).collect();
    println!("4 KiB objects, magazines of 31 rounds, {} CPUs", cpus.len());
    for &cpu in &cpus {
        on(cpu, || burst(62, &alloc, &free));
    }
    println!("  after a turn on every CPU: {:6} KiB cached", cached() >> 10);
    let start = Instant::now();
    let mut mark = start;
    on(cpus[0], || {
        while start.elapsed().as_secs_f64() < secs {
            burst(10, &alloc, &free);
            if mark.elapsed() >= Duration::from_millis(500) {
                mark = Instant::now();
                println!(
                    "  {:4.1} s on CPU {} alone: {:6} KiB cached",
                    start.elapsed().as_secs_f64(),
                    cpus[0],
                    cached() >> 10
                );
            }
        }
    });
    sched_setaffinity(None, &allowed).expect("restoring the affinity");
}

fn main() {
    let secs: f64 = std::env::args().nth(1).map_or(5.0, |s| s.parse().expect("usage: idle_cpus [SECONDS]"));
    let magazines = MagazineConfig { initial_rounds: 31, min_rounds: 31, max_rounds: 31, ..MagazineConfig::default() };
    let config = Config { magazines, grow_exchanges: None, ..Config::default() };
    let cache = ObjectCache::builder("idle_cpus", SIZE, 16).config(config).build().expect("an object cache");
    run(
        secs,
        || cache.alloc().expect("an object"),
        // SAFETY: from this cache, freed once.
        |p| unsafe { cache.free(p) }.expect("a free"),
        || {
            let stats = cache.stats();
            (stats.cpu_rounds + stats.depot_full * stats.magazine_size) * SIZE
        },
    );
}
