//! A user's Treiber stack, written only against scalemem's public API (the very code of
//! `examples/treiber_stack.rs`), model-checked by building scalemem with its loom facade.
//! This is how a downstream crate checks its own structure: enable scalemem's `loom`
//! feature and build with `RUSTFLAGS="--cfg scalemem_loom"`.
#![cfg(scalemem_loom)]

#[path = "../../examples/treiber_stack.rs"]
#[allow(dead_code)]
mod treiber_stack;

use loom::sync::Arc;
use loom::thread;
use treiber_stack::TreiberStack;

use scalemem_loom_tests::run_model;

#[test]
fn concurrent_push_pop_keeps_every_value_once() {
    run_model("treiber stack", || {
        let stack = Arc::new(TreiberStack::new());
        stack.push(0usize);
        let threads: Vec<_> = (1..=2)
            .map(|t| {
                let stack = stack.clone();
                thread::spawn(move || {
                    stack.push(t);
                    stack.pop()
                })
            })
            .collect();
        let mut seen: Vec<usize> = threads.into_iter().filter_map(|t| t.join().unwrap()).collect();
        while let Some(v) = stack.pop() {
            seen.push(v);
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2]);
    });
}
