//! loom models of `PerCpuStack` in locked mode (the only mode under loom: there is no
//! rseq), with N = 2 on loom's 2 CPUs (model thread index modulo 2). Every item pushed
//! must end up exactly once: popped by some thread, handed back by a failed push, or in
//! the final drain. loom also checks that no two threads touch a slot's items without
//! the slot's lock.
//!
//! Each model has three threads, because two threads sit on two different CPUs, touch
//! disjoint slots, and leave loom nothing to interleave: the main thread (index 0) and
//! model thread 2 share CPU 0, so their try-locks collide and the loser moves on to CPU
//! 1's slot, where it meets thread 1.
//!
//! ```text
//! RUSTFLAGS="--cfg scalemem_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p scalemem-loom-tests --release --test cpu_stack
//! ```
#![cfg(scalemem_loom)]

use std::ptr::NonNull;

use loom::sync::Arc;
use loom::thread;
use scalemem::cpu::PerCpuStack;
use scalemem_loom_tests::run_model;

type Stack = PerCpuStack<u8, 2>;

/// A fake, never dereferenced, non-null address.
fn token(n: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut::<u8>(n)).unwrap()
}

/// Asserts that `seen` holds each of the tokens `1..=count` exactly once.
fn assert_each_once(mut seen: Vec<usize>, count: usize) {
    seen.sort_unstable();
    assert_eq!(seen, (1..=count).collect::<Vec<_>>(), "lost or duplicated items");
}

/// Pushes `items`, then pops up to `pops` items; returns the addresses it ends up
/// holding: what it popped and what it could not push.
fn push_then_pop(stack: &Stack, items: &[usize], pops: usize) -> Vec<usize> {
    let mut hand = Vec::new();
    for &item in items {
        if let Err(back) = stack.push(token(item)) {
            assert_eq!(back, token(item));
            hand.push(item);
        }
    }
    for _ in 0..pops {
        if let Some(item) = stack.pop() {
            hand.push(item.as_ptr().addr());
        }
    }
    hand
}

/// Drains the stack once every other handle is gone.
fn drain_all(stack: Arc<Stack>, seen: &mut Vec<usize>) {
    let mut stack = Arc::try_unwrap(stack).unwrap_or_else(|_| panic!("stack still shared"));
    stack.assert_valid();
    let stored = stack.len_hint();
    let before = seen.len();
    stack.drain(|item| seen.push(item.as_ptr().addr()));
    assert_eq!(seen.len() - before, stored);
    assert_eq!(stack.len_hint(), 0);
}

#[test]
fn three_threads_push_and_pop() {
    run_model("cpu_stack: three threads, two sharing CPU 0, push and pop", || {
        let stack = Arc::new(Stack::new().unwrap());
        // Model threads 1 and 2: CPUs 1 and 0.
        let others: Vec<_> = [[1, 2], [3, 4]]
            .into_iter()
            .map(|items| {
                let stack = stack.clone();
                thread::spawn(move || push_then_pop(&stack, &items, 1))
            })
            .collect();
        // Model thread 0: CPU 0, like thread 2.
        let mut seen = push_then_pop(&stack, &[5], 2);
        for other in others {
            seen.extend(other.join().unwrap());
        }
        drain_all(stack, &mut seen);
        assert_each_once(seen, 5);
    });
}

#[test]
fn three_threads_contend_for_one_cpu() {
    run_model("cpu_stack: three threads, two on CPU 0, full and busy slots", || {
        let stack = Arc::new(Stack::new_locked().unwrap());
        // Model threads 1 and 2: CPUs 1 and 0; thread 2 shares CPU 0 with the main
        // thread, so their try-locks collide and one of them moves to CPU 1's slot.
        let pushers: Vec<_> = [[1, 2], [3, 4]]
            .into_iter()
            .map(|items| {
                let stack = stack.clone();
                thread::spawn(move || push_then_pop(&stack, &items, 0))
            })
            .collect();
        // Model thread 0: pops concurrently with the pushes.
        let mut seen = push_then_pop(&stack, &[], 2);
        for pusher in pushers {
            seen.extend(pusher.join().unwrap());
        }
        drain_all(stack, &mut seen);
        assert_each_once(seen, 4);
    });
}
