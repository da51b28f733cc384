//! Signals and migrations over the allocator (issue 9). With `Umem` as this binary's
//! global allocator, 16 workers on 2 CPUs allocate and free (locally and remotely, small
//! and large blocks), take `PercpuRef` and `Refcache` references (strong and weak) and
//! read an `RmLock`, while they move themselves between CPUs with `sched_setaffinity`
//! every few hundred operations and a signal thread interrupts them with `SIGUSR1`, which
//! aborts and restarts the rseq sections under test (magazine pop and push, per-CPU
//! counter adds, the reader counts). A side thread meanwhile switches the `PercpuRef`
//! between modes, writes the lock and ticks the Refcache epochs.
//!
//! Nothing may be lost or duplicated: every block carries its owner's stamp in every word
//! and is checked when freed (a block handed out twice would be overwritten by its second
//! owner); every block handed to another thread is received exactly once; the bytes in
//! use return to where they started; the refcounts end exact (one `release`, one drop);
//! the lock's invariant holds in every read; and the heap's invariants hold at the end.
//! The binary holds this one test, so the heap is quiescent when it is checked.

#![cfg(not(scalemem_loom))]

mod common;

use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use common::chaos::{self, Chaos};
use scalemem::Umem;
use scalemem::refcount::{Config as RcConfig, PercpuRef, RcRef, Refcache};
use scalemem::rmlock::RmLock;
use scalemem::umem::global;

#[global_allocator]
static A: Umem = Umem::new();

const THREADS: usize = 16;

const CHAOS: chaos::Config = chaos::Config {
    threads: THREADS,
    migrate_every: 300,
    time_limit: Duration::from_millis(if cfg!(debug_assertions) { 2_000 } else { 3_000 }),
    signal_interval: Duration::from_micros(200),
};

/// A block whose every word holds `stamp`.
struct Block {
    words: Vec<u64>,
    stamp: u64,
}

impl Block {
    fn new(stamp: u64, len: usize) -> Self {
        Self { words: vec![stamp; len], stamp }
    }

    fn check(&self) {
        if let Some(bad) = self.words.iter().position(|&w| w != self.stamp) {
            panic!(
                "block {:p} ({} words) of stamp {:#x} holds {:#x} at word {bad}: handed out twice",
                self.words.as_ptr(),
                self.words.len(),
                self.stamp,
                self.words[bad]
            );
        }
    }
}

/// Drops of the Refcache object.
static DROPS: AtomicUsize = AtomicUsize::new(0);

/// Counts its drops in `DROPS`.
struct Tracked;

impl Drop for Tracked {
    fn drop(&mut self) {
        DROPS.fetch_add(1, SeqCst);
    }
}

/// The length in words of worker `t`'s `i`th block: mostly small classes, now and then
/// a large block (above the 128 KiB classes).
fn words_of(t: usize, i: usize) -> usize {
    let x = (i.wrapping_mul(0x9e37_79b9) ^ t.wrapping_mul(0x85eb_ca6b)) >> 4;
    if i.is_multiple_of(61) { (160 << 10) / 8 + x % 4096 } else { 1 + x % 1024 }
}

#[test]
fn signals_and_migrations_lose_nothing() {
    let releases = AtomicUsize::new(0);
    let refcache = Refcache::with_config(RcConfig::manual()).unwrap();
    let percpu = PercpuRef::new(|| {
        releases.fetch_add(1, SeqCst);
    })
    .unwrap();
    let lock = RmLock::new((0u64, 0u64));
    // Blocks in transit between threads: each is freed by whoever takes it.
    let exchange: Mutex<Vec<Block>> = Mutex::new(Vec::with_capacity(1024));
    let sent = AtomicUsize::new(0);
    let received = AtomicUsize::new(0);

    let shared = refcache.alloc(Tracked);
    let seeds: Mutex<Vec<RcRef<'_, Tracked>>> = Mutex::new((0..THREADS).map(|_| shared.clone()).collect());
    drop(shared);
    let before = global::stats();

    let (ops, Chaos { signals, migrations }) = CHAOS.stress_with_side(
        |t, migrator, deadline| {
            let mine = seeds.lock().unwrap().pop().unwrap();
            let weak = RcRef::downgrade(&mine);
            let mut blocks: Vec<Block> = Vec::with_capacity(64);
            let mut refs: Vec<RcRef<'_, Tracked>> = Vec::with_capacity(8);
            let mut held = 0usize;
            let mut op = 0usize;
            while Instant::now() < deadline {
                match op % 8 {
                    0..=2 => {
                        let stamp = ((t as u64) << 40) | op as u64;
                        blocks.push(Block::new(stamp, words_of(t, op)));
                        if blocks.len() > 48 {
                            let b = blocks.swap_remove(op % blocks.len());
                            b.check();
                        }
                    }
                    3 => {
                        // Remote frees: hand a block over, free one from someone else.
                        if let Some(b) = blocks.pop() {
                            b.check();
                            let mut ex = exchange.lock().unwrap();
                            ex.push(b);
                            sent.fetch_add(1, SeqCst);
                            if ex.len() > 256 {
                                let theirs = ex.swap_remove(op % 256);
                                drop(ex);
                                theirs.check();
                                received.fetch_add(1, SeqCst);
                            }
                        }
                    }
                    4 => {
                        if held < 8 && !op.is_multiple_of(3) {
                            percpu.get();
                            held += 1;
                        } else if held > 0 {
                            percpu.put();
                            held -= 1;
                        }
                    }
                    5 => {
                        if refs.len() < 8 && !op.is_multiple_of(3) {
                            refs.push(if op.is_multiple_of(5) {
                                weak.upgrade().expect("a strong ref is held")
                            } else {
                                mine.clone()
                            });
                        } else {
                            refs.pop();
                        }
                    }
                    6 => {
                        let pair = lock.read();
                        assert_eq!(pair.0, pair.1, "a read saw a half-done write");
                    }
                    _ => {
                        // A growing, then shrinking buffer: realloc across classes.
                        let mut v: Vec<u8> = Vec::with_capacity(16);
                        for k in 0..(op % 3000) {
                            v.push(k as u8);
                        }
                        v.truncate(7);
                        v.shrink_to_fit();
                        assert_eq!(v, [0, 1, 2, 3, 4, 5, 6][..v.len()]);
                    }
                }
                migrator.tick(op);
                op += 1;
            }
            for b in blocks {
                b.check();
            }
            percpu.put_many(held);
            drop(refs);
            drop(mine);
            op
        },
        |deadline| {
            let mut rounds = 0;
            while Instant::now() < deadline {
                percpu.switch_to_atomic_sync();
                {
                    let mut w = lock.write();
                    w.0 += 1;
                    std::thread::yield_now();
                    w.1 += 1;
                }
                refcache.tick();
                std::thread::sleep(Duration::from_micros(500));
                percpu.switch_to_percpu();
                std::thread::sleep(Duration::from_micros(500));
                rounds += 1;
            }
            assert!(rounds > 0);
        },
    );

    // What is still in transit is received now.
    for b in exchange.lock().unwrap().drain(..) {
        b.check();
        received.fetch_add(1, SeqCst);
    }
    assert_eq!(sent.load(SeqCst), received.load(SeqCst), "a handed-over block was lost or duplicated");
    drop(exchange);

    // The refcounts are exact: the PercpuRef holds its initial reference only, and the
    // Refcache object goes once its last reference is two epochs behind.
    percpu.assert_valid();
    assert_eq!(percpu.count(), 1, "a get or put was lost or duplicated");
    assert_eq!(releases.load(SeqCst), 0);
    percpu.kill();
    assert_eq!(releases.load(SeqCst), 1);
    for _ in 0..8 {
        refcache.tick();
    }
    assert_eq!(DROPS.load(SeqCst), 1, "the Refcache object is freed exactly once");
    let (a, b) = *lock.read();
    assert_eq!(a, b);

    // Every block allocated during the run was freed: the bytes in use are back where
    // they were (up to what the harness's own threads left, well under one large block).
    let after = global::stats();
    global::assert_valid();
    let total: usize = ops.iter().sum();
    assert!(signals > 0 && migrations > 0, "{signals} signals, {migrations} migrations");
    assert!(
        after.in_use <= before.in_use + (64 << 10),
        "bytes in use grew from {} to {} over {total} operations",
        before.in_use,
        after.in_use
    );
    eprintln!(
        "chaos over the allocator: {total} operations on {THREADS} threads, {signals} signals, {migrations} \
         migrations, {} blocks handed over, {a} writes; bytes in use {} before, {} after",
        sent.load(SeqCst),
        before.in_use,
        after.in_use
    );
}
