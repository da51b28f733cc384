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
            if rng % 2 == 0 {
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
