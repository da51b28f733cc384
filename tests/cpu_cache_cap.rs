//! The per-CPU cache cap of the global heap (`global::CPU_CACHE_BYTES`, tcmalloc's): the
//! size classes' magazines together hold at most that much per CPU, however many classes
//! a program uses and however busy they are (each class keeps magazines of at least one
//! round); and a busy class the cap holds back takes room from a class that has been idle
//! for a working-set interval. A binary of its own: it needs the heap to itself.

use std::time::{Duration, Instant};

use scalemem::umem::global::{self, CPU_CACHE_BYTES};

/// Large classes: each one's first magazines (15 rounds) hold 0.5-3.8 MiB per CPU, so
/// that ten of them would need twice the cap.
const LARGE: [usize; 10] =
    [16 << 10, 20 << 10, 24 << 10, 32 << 10, 40 << 10, 48 << 10, 64 << 10, 80 << 10, 96 << 10, 128 << 10];
/// The busy class of the second half (a small one, made last).
const BUSY: usize = 8 << 10;
/// The magazine sizes the growth rules step through (`cpu_cache`).
const LADDER: [usize; 9] = [1, 3, 7, 15, 31, 47, 63, 95, 143];

/// Allocates `n` blocks of `size` bytes and frees them: a burst that trades magazines
/// with the depot when `n` is well above two magazines.
fn burst(size: usize, n: usize) {
    let blocks: Vec<*mut u8> = (0..n).map(|_| global::malloc(size)).collect();
    assert!(blocks.iter().all(|p| !p.is_null()));
    for p in blocks {
        // SAFETY: from `malloc`, freed once.
        unsafe { global::free(p) };
    }
}

/// The heap's magazine capacity per CPU, checked against the cap plus the one-round
/// magazines of the classes the cap left at one round.
fn within_cap(when: &str) -> usize {
    let capacity = global::stats().cpu_cache_capacity;
    let floor: usize = LARGE
        .iter()
        .chain([&BUSY])
        .filter_map(|&size| global::class_stats(size))
        .filter(|s| s.magazine_size == 1)
        .map(|s| 2 * s.size)
        .sum();
    assert!(
        capacity <= CPU_CACHE_BYTES + floor,
        "{when}: magazines hold {capacity} bytes per CPU, past the cap of {CPU_CACHE_BYTES} (+{floor} of one-round magazines)"
    );
    capacity
}

fn magazine_size(size: usize) -> usize {
    global::class_stats(size).expect("a class in use").magazine_size
}

#[test]
fn classes_share_the_cap_and_an_idle_one_gives_room_to_a_busy_one() {
    // Ten large classes made one after the other: the later ones get what the earlier
    // ones leave of the cap.
    for &size in &LARGE {
        burst(size, 1);
        within_cap("classes made");
    }
    assert!(magazine_size(128 << 10) < 15, "the last large class got full-size magazines past the cap");
    // Busy in turn: growth stays within the cap.
    for round in 0..3 {
        for &size in &LARGE {
            burst(size, 200);
            global::maintain();
            within_cap(&format!("round {round}, {size}-byte bursts"));
        }
    }
    let large_last_busy = Instant::now();

    // Their depots emptied (so that the working-set rule, which shrinks a class whose
    // depot magazines sat idle, gives nothing back below): only taking room from an
    // idle class can make any.
    global::trim();
    // A class made last gets what the others leave, and grows until the cap holds it
    // back while every other class is recent.
    let room = CPU_CACHE_BYTES.saturating_sub(global::stats().cpu_cache_capacity);
    burst(BUSY, 1);
    assert!(magazine_size(BUSY) <= (room / (2 * BUSY)).max(1), "a class made past the cap");
    let mut held_back = 0;
    for _ in 0..20 {
        burst(BUSY, 3000);
        global::maintain();
        within_cap("busy class, no idle one");
        held_back = magazine_size(BUSY);
    }
    // Unless this ran so slowly (a sanitizer, a loaded machine) that the large classes
    // were already idle for an interval, the busy class is held back by the cap alone.
    let held_by_cap = large_last_busy.elapsed() < Duration::from_millis(900);
    if held_by_cap {
        let next = LADDER.iter().copied().find(|&r| r > held_back).unwrap();
        assert!(
            next <= (1 << 20) / BUSY
                && global::stats().cpu_cache_capacity + 2 * BUSY * (next - held_back) > CPU_CACHE_BYTES,
            "the busy class stopped at {held_back} rounds with room to grow: the test does not reach the cap"
        );
    } else {
        eprintln!("slow run: the large classes went idle before the busy class was held back");
    }
    // Once the large classes have been idle for a working-set interval, the busy class
    // takes room from them, step by step.
    std::thread::sleep(Duration::from_millis(1100));
    for _ in 0..20 {
        burst(BUSY, 3000);
        global::maintain();
        within_cap("busy class taking room");
    }
    let grown = magazine_size(BUSY);
    if held_by_cap {
        assert!(grown > held_back, "the busy class stayed at {held_back} rounds next to idle classes");
    } else {
        assert!(grown >= held_back, "the busy class shrank from {held_back} rounds while busy");
    }
    global::assert_valid();
}
