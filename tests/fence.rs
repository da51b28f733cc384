//! `cpu::fence` modes: the asymmetric mode where the kernel allows it, the switch to the
//! symmetric (SeqCst) fallback at run time while threads are pinning and retiring, and
//! epoch reclamation staying correct across the switch. (CI also runs the whole suite
//! with `SCALEMEM_FENCE=symmetric`, which selects the fallback at start-up.)

#[path = "../examples/stress.rs"]
#[allow(dead_code)]
mod stress;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Barrier};
use std::thread;

use scalemem::cpu::fence::{self, Mode};

#[test]
fn modes_and_the_switch_to_symmetric_under_load() {
    let forced = std::env::var("SCALEMEM_FENCE").as_deref() == Ok("symmetric");
    let initial = fence::mode();
    if std::env::var_os("SCALEMEM_EXPECT_REFUSED").is_some() {
        // Under ci/modes.sh's seccomp filter the kernel refuses membarrier: the
        // registration's failure, not a setting, must select the fallback.
        assert!(!fence::membarrier_registered(), "membarrier registered under a filter that refuses it");
        assert_eq!(initial, Mode::Symmetric);
    } else if forced {
        assert_eq!(initial, Mode::Symmetric);
    } else if fence::membarrier_registered() {
        // Linux 4.14+ without seccomp filters: our machines.
        assert_eq!(initial, Mode::Asymmetric);
    }

    // Store-buffering litmus test in the current mode, then again after the switch,
    // with the switch happening while the litmus threads run.
    let x = Arc::new(AtomicUsize::new(0));
    let y = Arc::new(AtomicUsize::new(0));
    let both_missed = Arc::new(AtomicUsize::new(0));
    let rounds = if cfg!(debug_assertions) { 20_000 } else { 200_000 };
    let barrier = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let light_side = {
        let (x, y, barrier, stop) = (x.clone(), y.clone(), barrier.clone(), stop.clone());
        thread::spawn(move || {
            let mut seen = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                barrier.wait();
                x.store(1, std::sync::atomic::Ordering::Relaxed);
                fence::light();
                seen.push(y.load(std::sync::atomic::Ordering::Relaxed));
                barrier.wait();
            }
            stop.store(true, SeqCst);
            seen
        })
    };
    let mut seen_heavy = Vec::with_capacity(rounds);
    for round in 0..rounds {
        if round == rounds / 2 {
            fence::use_symmetric();
        }
        x.store(0, SeqCst);
        y.store(0, SeqCst);
        barrier.wait();
        y.store(1, std::sync::atomic::Ordering::Relaxed);
        fence::heavy();
        seen_heavy.push(x.load(std::sync::atomic::Ordering::Relaxed));
        barrier.wait();
    }
    let seen_light = light_side.join().unwrap();
    for (a, b) in seen_light.iter().zip(&seen_heavy) {
        if *a == 0 && *b == 0 {
            both_missed.fetch_add(1, SeqCst);
        }
    }
    assert_eq!(both_missed.load(SeqCst), 0, "a light/heavy pair let both sides miss");
    assert_eq!(fence::mode(), Mode::Symmetric);
    assert!(stop.load(SeqCst));

    // Epoch reclamation in the symmetric mode: the full stress, every object accounted.
    let report = stress::run(1.0, 8);
    assert!(report.stack_ops > 0);
}
