//! A lock-free Treiber stack on `scalemem::epoch`, written only against the public API.
//!
//! `cargo run --release --example treiber_stack` pushes and pops from 8 threads and
//! checks that every value comes out exactly once. The stack itself (`TreiberStack`) is
//! also what `tests/epoch_stress.rs` hammers and what `loom-tests/tests/treiber.rs`
//! model-checks, so the code a user would write is the code that is verified.

use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use scalemem::epoch::{self, Atomic, Owned};

/// A Treiber stack: a linked list whose head is swung by compare-exchange; popped nodes
/// are retired through the epoch collector, so concurrent poppers that still read them
/// never touch freed memory.
pub struct TreiberStack<T> {
    head: Atomic<Node<T>>,
}

struct Node<T> {
    value: ManuallyDrop<T>,
    next: Atomic<Node<T>>,
}

impl<T> Default for TreiberStack<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TreiberStack<T> {
    /// An empty stack.
    pub fn new() -> Self {
        Self { head: Atomic::null() }
    }

    /// Pushes `value`.
    pub fn push(&self, value: T) {
        let mut node = Owned::new(Node { value: ManuallyDrop::new(value), next: Atomic::null() });
        let guard = epoch::pin();
        loop {
            let head = self.head.load(Relaxed, &guard);
            node.next.store(head, Relaxed);
            // Release: publishes the node's contents to the Acquire load in pop.
            match self.head.compare_exchange(head, node, Release, Relaxed, &guard) {
                Ok(_) => return,
                Err(err) => node = err.new,
            }
        }
    }

    /// Pops the most recently pushed value.
    pub fn pop(&self) -> Option<T> {
        let guard = epoch::pin();
        loop {
            // Acquire: pairs with the Release CAS in push, so the node is initialised.
            let head = self.head.load(Acquire, &guard);
            // SAFETY: loaded under `guard`; popped nodes are only freed after it unpins.
            let node = unsafe { head.as_ref() }?;
            let next = node.next.load(Relaxed, &guard);
            if self.head.compare_exchange(head, next, Relaxed, Relaxed, &guard).is_ok() {
                // SAFETY: we unlinked the node, so we alone take its value (once), and
                // we retire it once; the deferred drop frees only the node, since the
                // value is ManuallyDrop.
                unsafe {
                    let value = ptr::read(&*node.value);
                    guard.defer_destroy(head);
                    return Some(value);
                }
            }
        }
    }

    /// Whether the stack is empty right now.
    pub fn is_empty(&self) -> bool {
        let guard = epoch::pin();
        self.head.load(Acquire, &guard).is_null()
    }
}

impl<T> Drop for TreiberStack<T> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

#[allow(dead_code)]
fn main() {
    use std::sync::Arc;
    const THREADS: usize = 8;
    const PER_THREAD: usize = 100_000;

    let stack = Arc::new(TreiberStack::new());
    let started = std::time::Instant::now();
    let popped: Vec<Vec<usize>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let stack = &stack;
                s.spawn(move || {
                    let mut got = Vec::new();
                    for i in 0..PER_THREAD {
                        stack.push(t * PER_THREAD + i);
                        if i % 2 == 1 {
                            got.extend(stack.pop());
                        }
                    }
                    got
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = vec![false; THREADS * PER_THREAD];
    for v in popped.into_iter().flatten().chain(std::iter::from_fn(|| stack.pop())) {
        assert!(!seen[v], "value {v} popped twice");
        seen[v] = true;
    }
    assert!(seen.iter().all(|&s| s), "a value was lost");
    println!(
        "{} pushes and pops on {THREADS} threads in {:?}: every value exactly once (epoch {} after {} advances)",
        THREADS * PER_THREAD,
        started.elapsed(),
        epoch::default_collector().epoch(),
        epoch::default_collector().advances(),
    );
}
