//! Stress tests of the per-CPU structures built on rseq critical sections
//! (`PerCpuCounter`, `PerCpuStack`) and of their fallbacks: 16 threads (oversubscribing
//! our 2-CPU machines) while a signal thread keeps interrupting them with `SIGUSR1` and
//! they keep migrating themselves between CPUs, which is what makes the kernel abort and
//! restart critical sections. Each test is bounded by a deadline as well as an operation
//! count, so `cargo test` stays quick in debug builds.

#![cfg(not(scalemem_loom))]

mod common;

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use common::chaos::{self, rseq_expected};
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
use scalemem::cpu::{self, PerCpuCounter, PerCpuStack};

const THREADS: usize = 16;
/// Operations between two self-migrations of a worker.
const MIGRATE_EVERY: usize = 2_000;

/// Per-worker operation cap.
fn ops_per_thread() -> usize {
    if cfg!(debug_assertions) { 300_000 } else { 3_000_000 }
}

/// This file's stress runs: THREADS workers, a migration every MIGRATE_EVERY operations,
/// a signal round every 50 µs, and a wall-clock cap of 1.5 s (2.5 s in release builds).
const CHAOS: chaos::Config = chaos::Config {
    threads: THREADS,
    migrate_every: MIGRATE_EVERY,
    time_limit: Duration::from_millis(if cfg!(debug_assertions) { 1_500 } else { 2_500 }),
    signal_interval: Duration::from_micros(50),
};

#[test]
fn rseq_is_in_use_here() {
    let counter = PerCpuCounter::new().unwrap();
    counter.inc();
    let stack = PerCpuStack::<u8, 4>::new().unwrap();
    if rseq_expected() {
        assert!(cpu::rseq_enabled());
        assert!(cpu::rseq::thread_area().is_some());
        assert!(stack.uses_rseq());
        assert_eq!(counter.sum_by_path(), (1, 0), "the increment took the atomic fallback");
    } else {
        assert!(!stack.uses_rseq() || cpu::rseq_enabled());
        assert_eq!(counter.sum(), 1);
    }
    assert!(!PerCpuStack::<u8, 4>::new_locked().unwrap().uses_rseq());
}

#[test]
fn counter_loses_no_update_under_signals_and_migration() {
    let counter = PerCpuCounter::new().unwrap();
    let started = Instant::now();
    let (deltas, chaos) = CHAOS.stress(|t, migrator, deadline| {
        let mut total: isize = 0;
        let mut ops = 0usize;
        for op in 0..ops_per_thread() {
            if op % 1024 == 0 && Instant::now() >= deadline {
                break;
            }
            let delta = match (op + t) % 8 {
                3 => -2,
                6 => 5,
                _ => 1,
            };
            counter.add(delta);
            total += delta;
            ops += 1;
            migrator.tick(op);
        }
        (total, ops)
    });
    let expected: isize = deltas.iter().map(|&(d, _)| d).sum();
    let ops: usize = deltas.iter().map(|&(_, n)| n).sum();
    eprintln!(
        "counter: {ops} adds in {:?}, {} signals, {} migrations",
        started.elapsed(),
        chaos.signals,
        chaos.migrations
    );
    assert_eq!(counter.sum(), expected);
    if rseq_expected() {
        assert_eq!(counter.sum_by_path(), (expected, 0), "some adds took the atomic fallback");
    }
    assert!(chaos.signals > 0);
}

/// Builds a token: a fake, never dereferenced, non-null address naming (thread, index).
fn token(thread: usize, index: usize) -> NonNull<u8> {
    from_addr(((thread + 1) << 32) | index)
}

fn from_addr(addr: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut::<u8>(addr)).unwrap()
}

fn untoken(item: NonNull<u8>) -> (usize, usize) {
    let addr = item.as_ptr().addr();
    ((addr >> 32).wrapping_sub(1), addr & 0xffff_ffff)
}

/// Tokens move between the workers' hands and the stack; at the end every token ever
/// created must be in exactly one hand or in the final drain.
fn stack_conserves_tokens<const N: usize>(mut stack: PerCpuStack<u8, N>) {
    let started = Instant::now();
    let (hands, chaos) = CHAOS.stress(|t, migrator, deadline| {
        // Addresses, not NonNull: the hands travel back to the main thread.
        let mut hand: Vec<usize> = Vec::new();
        let mut created = 0usize;
        let (mut pushes, mut pops) = (0usize, 0usize);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
        for op in 0..ops_per_thread() {
            if op % 1024 == 0 && Instant::now() >= deadline {
                break;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng.is_multiple_of(2) {
                let item = hand.pop().map_or_else(
                    || {
                        created += 1;
                        token(t, created - 1)
                    },
                    from_addr,
                );
                match stack.push(item) {
                    Ok(()) => pushes += 1,
                    Err(back) => {
                        assert_eq!(back, item);
                        hand.push(back.as_ptr().addr());
                    }
                }
            } else if let Some(item) = stack.pop() {
                pops += 1;
                hand.push(item.as_ptr().addr());
            }
            migrator.tick(op);
        }
        (hand, created, pushes, pops)
    });
    stack.assert_valid();
    let stored = stack.len_hint();
    let mut drained = Vec::new();
    stack.drain(|item| drained.push(item));
    assert_eq!(drained.len(), stored);
    assert_eq!(stack.len_hint(), 0);

    let mut seen: Vec<Vec<u8>> = hands.iter().map(|(_, created, _, _)| vec![0u8; *created]).collect();
    let all = hands.iter().flat_map(|(hand, ..)| hand.iter().copied().map(from_addr));
    for item in all.chain(drained.iter().copied()) {
        let (thread, index) = untoken(item);
        assert!(thread < THREADS && index < seen[thread].len(), "garbage item {item:p}");
        seen[thread][index] += 1;
    }
    for (thread, counts) in seen.iter().enumerate() {
        for (index, &count) in counts.iter().enumerate() {
            assert_eq!(count, 1, "token ({thread}, {index}) seen {count} times");
        }
    }
    let pushes: usize = hands.iter().map(|h| h.2).sum();
    let pops: usize = hands.iter().map(|h| h.3).sum();
    eprintln!(
        "stack (rseq: {}, N = {N}): {pushes} pushes, {pops} pops, {} drained in {:?}, {} signals, {} migrations",
        stack.uses_rseq(),
        drained.len(),
        started.elapsed(),
        chaos.signals,
        chaos.migrations
    );
    assert_eq!(pushes, pops + drained.len());
    assert!(pushes > 0 && pops > 0);
    assert!(chaos.signals > 0);
}

#[test]
fn stack_loses_and_duplicates_nothing_rseq_mode() {
    let stack = PerCpuStack::<u8, 16>::new().unwrap();
    assert_eq!(stack.uses_rseq(), rseq_expected());
    stack_conserves_tokens(stack);
}

#[test]
fn stack_loses_and_duplicates_nothing_locked_mode() {
    stack_conserves_tokens(PerCpuStack::<u8, 16>::new_locked().unwrap());
}

/// Pinned to one CPU, one thread fills that CPU's stack to exactly N, gets the N+1st
/// item back, and pops all N in LIFO order.
fn full_and_empty<const N: usize>(mut stack: PerCpuStack<u8, N>) {
    let original = sched_getaffinity(None).unwrap();
    let mut one = CpuSet::new();
    one.set(cpu::current());
    sched_setaffinity(None, &one).unwrap();

    assert_eq!(stack.pop(), None);
    for i in 0..N {
        assert_eq!(stack.push(token(0, i)), Ok(()), "push {i} of {N}");
    }
    assert_eq!(stack.len_hint(), N);
    assert_eq!(stack.push(token(0, N)), Err(token(0, N)));
    assert_eq!(stack.len_hint(), N);
    for i in (0..N).rev() {
        assert_eq!(stack.pop(), Some(token(0, i)));
    }
    assert_eq!(stack.pop(), None);
    assert_eq!(stack.len_hint(), 0);

    // Half full, then drained.
    for i in 0..N / 2 {
        stack.push(token(0, i)).unwrap();
    }
    sched_setaffinity(None, &original).unwrap();
    let mut drained = Vec::new();
    stack.drain(|item| drained.push(item));
    assert_eq!(drained, (0..N / 2).rev().map(|i| token(0, i)).collect::<Vec<_>>());
    stack.assert_valid();
}

#[test]
fn stack_full_and_empty_at_capacity() {
    full_and_empty(PerCpuStack::<u8, 2>::new().unwrap());
    full_and_empty(PerCpuStack::<u8, 64>::new().unwrap());
    full_and_empty(PerCpuStack::<u8, 2>::new_locked().unwrap());
    full_and_empty(PerCpuStack::<u8, 64>::new_locked().unwrap());
    // N = 0 is degenerate but legal: always full and empty.
    let zero = PerCpuStack::<u8, 0>::new().unwrap();
    assert_eq!(zero.push(token(0, 0)), Err(token(0, 0)));
    assert_eq!(zero.pop(), None);
}

// --- The magazine sections (rseq::mag_pop, mag_push, mag_exchange) on raw slots ---

mod magazine_sections {
    use super::*;
    use scalemem::cpu::rseq::mag_layout::{
        BYTE_MASK, CAP_SHIFT, LOADED_SHIFT, MAGS, PREV_CAP_SHIFT, PREV_ROUNDS_SHIFT, PREV_SHIFT, ROUNDS_MASK,
        SLOT_STRIDE,
    };
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

    const CAP: usize = 4;

    /// A magazine: 64 bytes of header, then the rounds (rseq::mag_layout::ROUNDS = 64).
    #[repr(C, align(64))]
    struct Mag {
        _header: [usize; 8],
        rounds: [usize; CAP],
    }

    /// A CPU's slot in the mag_layout layout. The sections write `state` and `mags` with
    /// plain stores; the test reads them with atomic loads.
    #[repr(C, align(128))]
    struct Slot {
        stop: AtomicUsize,
        state: AtomicU64,
        mags: [AtomicUsize; 3],
    }

    fn make(loaded: usize, rounds: usize, prev: usize, prev_rounds: usize) -> u64 {
        rounds as u64
            | (CAP as u64) << CAP_SHIFT
            | (loaded as u64) << LOADED_SHIFT
            | (prev as u64) << PREV_SHIFT
            | (prev_rounds as u64) << PREV_ROUNDS_SHIFT
            | (CAP as u64) << PREV_CAP_SHIFT
    }

    fn decode(state: u64) -> (usize, usize, usize, usize) {
        (
            ((state >> LOADED_SHIFT) & BYTE_MASK) as usize,
            (state & ROUNDS_MASK) as usize,
            ((state >> PREV_SHIFT) & BYTE_MASK) as usize,
            ((state >> PREV_ROUNDS_SHIFT) & BYTE_MASK) as usize,
        )
    }

    /// Every CPU has two 4-round magazines (indices 0 and 1; index 2 is scratch). Workers
    /// push and pop tokens with mag_push/mag_pop and, when the loaded magazine is full
    /// (push) or empty (pop) and the previous one can help, swap them with mag_exchange
    /// from a snapshot that may be stale or another CPU's. Under signals and migrations,
    /// every token must end up exactly once in a hand or in a magazine.
    #[test]
    fn sections_lose_and_duplicate_nothing() {
        if !rseq_expected() {
            return;
        }
        let n = cpu::possible();
        let mut mags: Vec<Mag> = (0..2 * n).map(|_| Mag { _header: [0; 8], rounds: [0; CAP] }).collect();
        let slots: Vec<Slot> = (0..n)
            .map(|cpu| Slot {
                stop: AtomicUsize::new(0),
                state: AtomicU64::new(make(0, 0, 1, 0)),
                mags: [
                    AtomicUsize::new((&raw mut mags[2 * cpu]).addr()),
                    AtomicUsize::new((&raw mut mags[2 * cpu + 1]).addr()),
                    AtomicUsize::new(0),
                ],
            })
            .collect();
        let base = slots.as_ptr().cast::<u8>().cast_mut().addr();
        assert_eq!(size_of::<Slot>(), SLOT_STRIDE);
        let mags_range = (mags.as_ptr().addr(), mags.as_ptr().addr() + mags.len() * size_of::<Mag>());
        let (hands, chaos) = CHAOS.stress(|t, migrator, deadline| {
            let base = std::ptr::with_exposed_provenance_mut::<u8>(base);
            let area = cpu::rseq::thread_area().unwrap();
            let mut hand: Vec<usize> = Vec::new();
            let (mut created, mut swaps) = (0usize, 0usize);
            let mut rng = 0x2545_f491_4f6c_dd1du64 ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for op in 0..ops_per_thread() {
                if op % 1024 == 0 && Instant::now() >= deadline {
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let push = rng.is_multiple_of(2);
                let done = if push {
                    let item = hand.pop().unwrap_or_else(|| {
                        created += 1;
                        token(t, created - 1).as_ptr().addr()
                    });
                    // SAFETY: this thread's area; `n` slots of the mag_layout layout
                    // `SLOT_STRIDE` apart whose loaded magazine always has CAP round words;
                    // only the sections write them while workers run.
                    let ok = unsafe { cpu::rseq::mag_push(area, base, n, from_addr(item).as_ptr().cast()) };
                    if !ok {
                        hand.push(item);
                    }
                    ok
                } else {
                    // SAFETY: as above.
                    let item = unsafe { cpu::rseq::mag_pop(area, base, n) };
                    if !item.is_null() {
                        hand.push(item.addr());
                    }
                    !item.is_null()
                };
                if !done {
                    // Snapshot (possibly stale, possibly another CPU's) and swap if the
                    // previous magazine can serve this operation.
                    let state = slots[cpu::current()].state.load(Relaxed);
                    let (loaded, rounds, prev, prev_rounds) = decode(state);
                    let useful = if push { rounds == CAP && prev_rounds == 0 } else { rounds == 0 && prev_rounds > 0 };
                    if useful {
                        let spare = 3 - loaded - prev;
                        let swapped = make(prev, prev_rounds, loaded, rounds);
                        // SAFETY: as above; the scratch word (`spare`) is referenced by
                        // neither index of `state`, and `swapped` describes any slot in
                        // `state` once a null is stored in the scratch word.
                        let evicted = unsafe {
                            cpu::rseq::mag_exchange(
                                area,
                                base,
                                n,
                                state,
                                swapped,
                                std::ptr::null_mut(),
                                MAGS + 8 * spare,
                                MAGS + 8 * prev,
                            )
                        };
                        if let Some(evicted) = evicted {
                            let a = evicted.addr();
                            assert!(a >= mags_range.0 && a < mags_range.1, "exchange read a foreign word {a:#x}");
                            swaps += 1;
                        }
                    }
                }
                migrator.tick(op);
            }
            (hand, created, swaps)
        });
        // Collect what the magazines hold.
        let mut stored = Vec::new();
        for slot in &slots {
            let (loaded, rounds, prev, prev_rounds) = decode(slot.state.load(Relaxed));
            assert!(loaded < 2 && prev < 2 && loaded != prev, "a swap left the scratch word loaded");
            for (index, count) in [(loaded, rounds), (prev, prev_rounds)] {
                let mag = slot.mags[index].load(Relaxed) as *const Mag;
                // SAFETY: the slot's magazines are elements of `mags`, alive; the workers
                // have finished.
                stored.extend(unsafe { &(&(*mag).rounds)[..count] }.iter().copied());
            }
        }
        let mut seen: Vec<Vec<u8>> = hands.iter().map(|(_, created, _)| vec![0u8; *created]).collect();
        for addr in hands.iter().flat_map(|(hand, ..)| hand.iter().copied()).chain(stored.iter().copied()) {
            let (thread, index) = untoken(from_addr(addr));
            assert!(thread < THREADS && index < seen[thread].len(), "garbage round {addr:#x}");
            seen[thread][index] += 1;
        }
        for (thread, counts) in seen.iter().enumerate() {
            for (index, &count) in counts.iter().enumerate() {
                assert_eq!(count, 1, "token ({thread}, {index}) seen {count} times");
            }
        }
        let swaps: usize = hands.iter().map(|h| h.2).sum();
        eprintln!(
            "magazine sections: {} rounds stored, {swaps} swaps, {} signals, {} migrations",
            stored.len(),
            chaos.signals,
            chaos.migrations
        );
        assert!(swaps > 0 && chaos.signals > 0);
        drop(mags);
    }

    /// A stopped slot refuses every section.
    #[test]
    fn stop_word_refuses_every_section() {
        let Some(area) = cpu::rseq::thread_area() else { return };
        let n = cpu::possible();
        let mut mag = Mag { _header: [0; 8], rounds: [0; CAP] };
        let slots: Vec<Slot> = (0..n)
            .map(|_| Slot {
                stop: AtomicUsize::new(2),
                state: AtomicU64::new(make(0, 1, 1, 0)),
                mags: [AtomicUsize::new((&raw mut mag).addr()), AtomicUsize::new(0), AtomicUsize::new(0)],
            })
            .collect();
        let base = slots.as_ptr().cast::<u8>().cast_mut();
        assert_eq!(size_of::<Slot>(), SLOT_STRIDE);
        let state = make(0, 1, 1, 0);
        // SAFETY: this thread's area; `n` stopped slots whose loaded magazine is `mag`.
        unsafe {
            assert!(cpu::rseq::mag_pop(area, base, n).is_null());
            assert!(!cpu::rseq::mag_push(area, base, n, 16 as *mut ()));
            let swapped = make(1, 0, 0, 1);
            assert_eq!(
                cpu::rseq::mag_exchange(area, base, n, state, swapped, std::ptr::null_mut(), MAGS + 16, MAGS + 8),
                None
            );
        }
        assert!(slots.iter().all(|s| s.state.load(Relaxed) == state));
    }
}
