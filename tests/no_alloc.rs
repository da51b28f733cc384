//! The epoch read side and the intrusive retire path never call the global allocator
//! (the allocator will pin on its own paths). A counting allocator checks it; this file
//! runs without the test harness so no runner thread allocates meanwhile.

mod common;

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

use common::counting_alloc::{Counting, allocations_in};
use scalemem::epoch::{self, Atomic, Retired, Shared};

#[global_allocator]
static GLOBAL: Counting = Counting;

#[repr(C)]
struct Node {
    link: Retired,
    value: usize,
}

static FREED: AtomicUsize = AtomicUsize::new(0);

unsafe fn reclaim(link: NonNull<Retired>) {
    // SAFETY: every retired link is the first field of a Node from `NODES` below; the
    // nodes are statically allocated, so reclaiming only counts.
    let node = unsafe { &*link.as_ptr().cast::<Node>() };
    assert!(node.value < 1 << 20);
    FREED.fetch_add(1, SeqCst);
}

fn main() {
    // Pre-allocate everything the measured loops touch, so only scalemem can allocate.
    const N: usize = 50_000;
    let mut nodes: Box<[Node]> = (0..N).map(|value| Node { link: Retired::new(), value }).collect();
    let slot = Atomic::new(1u64);
    static RUNS: AtomicUsize = AtomicUsize::new(0);

    // First use registers the thread and maps its first bag chunk (mmap, not malloc).
    drop(epoch::pin());

    let pins = allocations_in(|| {
        for _ in 0..100_000 {
            let guard = epoch::pin();
            let p = slot.load(Acquire, &guard);
            // SAFETY: loaded under `guard`.
            assert_eq!(unsafe { *p.deref() }, 1);
        }
    });
    assert_eq!(pins, 0, "pin/load/unpin allocated");

    let retires = allocations_in(|| {
        for node in nodes.iter_mut() {
            let guard = epoch::pin();
            // SAFETY: each node is retired once and never shared; reclaim only counts.
            unsafe { guard.retire(NonNull::from(&mut node.link), reclaim) };
        }
        for _ in 0..1000 {
            epoch::pin().flush();
        }
    });
    assert_eq!(retires, 0, "intrusive retire/flush allocated");
    assert_eq!(FREED.load(SeqCst), N, "every retired node reclaimed once");

    let small_defers = allocations_in(|| {
        for _ in 0..N {
            let guard = epoch::pin();
            guard.defer(|| RUNS.fetch_add(1, SeqCst));
        }
        for _ in 0..1000 {
            epoch::pin().flush();
        }
    });
    assert_eq!(small_defers, 0, "defer of a small closure allocated");
    assert_eq!(RUNS.load(SeqCst), N);

    // A boxed object retired through defer_destroy: the free is the only allocator call.
    let owned = Box::into_raw(Box::new(5u64));
    let destroys = allocations_in(|| {
        let guard = epoch::pin();
        let old = slot.swap(Shared::from(owned as *const u64), AcqRel, &guard);
        // SAFETY: unlinked by the swap, retired once.
        unsafe { guard.defer_destroy(old) };
    });
    assert_eq!(destroys, 0, "defer_destroy allocated");
    // A new thread's first pin registers it (record from mmap, exit hook via a pthread
    // key): no allocation either.
    let first_pin = std::thread::spawn(|| allocations_in(|| drop(epoch::pin()))).join().unwrap();
    assert_eq!(first_pin, 0, "thread registration allocated");
    // Free what is left so leak checkers stay quiet: the value in the slot, and the
    // nodes (every one reclaimed above, so no link refers to them any more).
    // SAFETY: no other thread uses the slot.
    drop(unsafe { slot.into_owned() });
    drop(nodes);
    println!("no_alloc: registration, pin, load, retire, defer and flush made no global allocations");
}
