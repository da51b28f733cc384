//! The global heap trims at free time (`umem::global::TRIM_THRESHOLD`): a program that
//! frees most of what it allocated gets the memory back into the kernel's hands right
//! away, as glibc's heap trim does, not only after the maintenance interval. A binary of
//! its own: the figure is the process's resident set.

mod common;

use std::sync::{Arc, Barrier};

use scalemem::umem::global;

const THREADS: usize = 8;
const BLOCKS: usize = 1024; // of 4 KiB: 32 MiB in all
const PAGE: usize = 4096;

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * PAGE
}

#[test]
fn freed_blocks_leave_the_resident_set_at_once() {
    let live = Arc::new(Barrier::new(THREADS + 1));
    let freed = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (live, freed) = (Arc::clone(&live), Arc::clone(&freed));
            std::thread::spawn(move || {
                let blocks = common::global_blocks(BLOCKS, PAGE);
                live.wait();
                live.wait(); // the main thread has read the resident set
                for p in blocks {
                    // SAFETY: from `malloc`, freed once.
                    unsafe { global::free(p as *mut u8) };
                }
                freed.wait();
            })
        })
        .collect();
    live.wait();
    let at_peak = rss();
    let headers_at_peak = global::class_stats(PAGE).unwrap().header_bytes;
    live.wait();
    freed.wait();
    let after = rss();
    let stats = global::stats();
    let headers_after = global::class_stats(PAGE).unwrap().header_bytes;
    for h in handles {
        h.join().unwrap();
    }
    let total = THREADS * BLOCKS * PAGE;
    eprintln!(
        "resident: {} KiB with {} KiB live, {} KiB right after the frees",
        at_peak >> 10,
        total >> 10,
        after >> 10
    );
    // Kept: the 4 KiB class's trim threshold (4 MiB), the CPUs' magazines (two of 32
    // rounds per CPU) and the slab layer's two empty slabs. Without the trim the depot
    // keeps all 32 MiB until the working-set interval and the decay.
    assert!(
        at_peak - after >= total * 3 / 4,
        "only {} KiB of {} KiB left the resident set: {stats:?}",
        (at_peak - after) >> 10,
        total >> 10
    );
    // The slab headers of the trimmed blocks (one per 4 KiB block, about 25 to a page)
    // go back with them: what the trim keeps needs a fraction of the peak's pages.
    assert!(
        headers_after * 2 <= headers_at_peak,
        "{} KiB of slab headers at the peak, {} KiB after the trim",
        headers_at_peak >> 10,
        headers_after >> 10
    );
}
