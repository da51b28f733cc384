//! loom model of `cpu::fence` in the mode loom can check (and the run-time fallback):
//! the store-buffering litmus test with `light()` on one side and `heavy()` on the other
//! must never let both threads miss each other's store.
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::Relaxed;

use scalemem::cpu::fence;
use scalemem_loom_tests::run_model;

#[test]
fn light_and_heavy_forbid_store_buffering() {
    run_model("fence store buffering", || {
        let x = Arc::new(AtomicUsize::new(0));
        let y = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (x, y) = (x.clone(), y.clone());
            thread::spawn(move || {
                x.store(1, Relaxed);
                fence::light();
                y.load(Relaxed)
            })
        };
        y.store(1, Relaxed);
        fence::heavy();
        let seen_x = x.load(Relaxed);
        let seen_y = reader.join().unwrap();
        assert!(seen_x == 1 || seen_y == 1, "both sides missed the other's store");
    });
}
