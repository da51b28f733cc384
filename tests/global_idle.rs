//! A settled global heap costs the machine nothing in the background: its maintenance
//! thread does not tick the regions' Refcache (each tick is an rseq fence, a
//! `membarrier` that interrupts every CPU running the process) while no region count is
//! in flux, and wakes about once a second, not every 10 ms tick. A binary of its own:
//! other tests' allocations would move the epoch.

mod common;

use std::time::Duration;

use scalemem::umem::global;

#[test]
fn a_settled_heap_is_not_ticked_by_its_maintenance_thread() {
    // Make the heap and a few size classes, give everything back, settle.
    let blocks: Vec<*mut u8> = (0..2000).map(|i| global::malloc(16 + (i * 37) % 4000)).collect();
    assert!(blocks.iter().all(|p| !p.is_null()));
    for p in blocks {
        // SAFETY: from `malloc`, freed once.
        unsafe { global::free(p) };
    }
    global::trim();
    global::spawn_maintenance_thread().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let before = global::stats().region_epoch;
    std::thread::sleep(Duration::from_millis(500));
    let after = global::stats().region_epoch;
    // Ticking regardless, the thread would advance the epoch about 50 times here (every
    // 10 ms); a working-set update (once a second) that still finds something to give
    // back may tick a few times legitimately.
    assert!(after - before < 10, "the settled heap was ticked {} times in 500 ms", after - before);
    // Nor does the thread itself wake 100 times a second: with the counts settled it
    // sleeps until the next working-set update (about once a second). Each sleep is one
    // voluntary context switch of the thread.
    let wakes = || maintenance_thread_switches().expect("the maintenance thread is running (umem-maintain)");
    let start = wakes();
    std::thread::sleep(Duration::from_millis(1500));
    let woke = wakes() - start;
    assert!(woke <= 8, "the idle maintenance thread woke {woke} times in 1.5 s");
}

/// The voluntary context switches of the `umem-maintain` thread so far.
fn maintenance_thread_switches() -> Option<u64> {
    let (_, status) = common::threads_named("umem-maintain").pop()?;
    common::status_field(&status, "voluntary_ctxt_switches")?.parse().ok()
}
