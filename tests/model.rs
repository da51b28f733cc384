//! Model-based tests (issue 9, the primitives' part): proptest drives random operation
//! sequences against `PercpuRef`, `Refcache` (strong and weak references, intrusive
//! headers) and `RmLock`, and checks every observable result against a small reference
//! model after each step. Shrinking turns a failure into a minimal sequence.
//!
//! The sequences run on one thread (the concurrent behaviour is what the loom models and
//! the stress tests cover); the test thread still migrates between CPUs as the scheduler
//! likes, so per-CPU parts are exercised on both.

#![cfg(not(scalemem_loom))]

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;

use proptest::prelude::*;
use scalemem::refcount::{Config, PercpuRef, RcRef, RcWeak, Refcache};
use scalemem::rmlock::RmLock;

fn cases() -> ProptestConfig {
    ProptestConfig { cases: if cfg!(debug_assertions) { 64 } else { 256 }, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------
// PercpuRef
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum RefOp {
    Get(u8),
    Put(u8),
    TryGet,
    TryGetLive,
    Kill,
    SwitchToAtomic,
    SwitchToPercpu,
    Resurrect,
    Reinit,
}

fn ref_op() -> impl Strategy<Value = RefOp> {
    prop_oneof![
        4 => (1u8..4).prop_map(RefOp::Get),
        4 => (1u8..4).prop_map(RefOp::Put),
        2 => Just(RefOp::TryGet),
        2 => Just(RefOp::TryGetLive),
        1 => Just(RefOp::Kill),
        1 => Just(RefOp::SwitchToAtomic),
        1 => Just(RefOp::SwitchToPercpu),
        1 => Just(RefOp::Resurrect),
        1 => Just(RefOp::Reinit),
    ]
}

/// What Linux's percpu_ref promises, as plain state.
#[derive(Debug)]
struct RefModel {
    count: usize,
    dead: bool,
    forced_atomic: bool,
    releases: usize,
}

impl RefModel {
    fn percpu(&self) -> bool {
        !self.forced_atomic && !self.dead && self.count > 0
    }
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn percpu_ref_matches_its_model(ops in proptest::collection::vec(ref_op(), 1..80)) {
        let releases = Arc::new(AtomicUsize::new(0));
        let r = {
            let releases = releases.clone();
            PercpuRef::new(move || {
                releases.fetch_add(1, SeqCst);
            })
            .unwrap()
        };
        let mut m = RefModel { count: 1, dead: false, forced_atomic: false, releases: 0 };
        for op in ops {
            match op {
                // A get needs a held reference; a put needs one to give up, and in per-CPU
                // mode must not drop the count to zero (zero is only detected in atomic
                // mode, as in Linux: the initial reference is dropped by kill).
                RefOp::Get(n) if m.count > 0 => {
                    r.get_many(n.into());
                    m.count += usize::from(n);
                }
                RefOp::Put(n) if m.count > usize::from(n) || (!m.percpu() && m.count >= usize::from(n)) => {
                    r.put_many(n.into());
                    m.count -= usize::from(n);
                    if m.count == 0 {
                        m.releases += 1;
                    }
                }
                RefOp::Get(_) | RefOp::Put(_) => continue,
                RefOp::TryGet => {
                    let expect = m.count > 0;
                    prop_assert_eq!(r.tryget(), expect, "tryget with {:?}", m);
                    m.count += usize::from(expect);
                }
                RefOp::TryGetLive => {
                    let expect = m.count > 0 && !m.dead;
                    prop_assert_eq!(r.tryget_live(), expect, "tryget_live with {:?}", m);
                    m.count += usize::from(expect);
                }
                RefOp::Kill => {
                    let expect = !m.dead;
                    if m.count == 0 && !m.dead {
                        // Killing a ref already released (count zero in forced atomic
                        // mode) would drop a reference nobody holds: not a valid call.
                        continue;
                    }
                    prop_assert_eq!(r.kill(), expect);
                    if expect {
                        m.dead = true;
                        m.count -= 1;
                        if m.count == 0 {
                            m.releases += 1;
                        }
                    }
                }
                RefOp::SwitchToAtomic => {
                    r.switch_to_atomic_sync();
                    m.forced_atomic = true;
                }
                RefOp::SwitchToPercpu => {
                    r.switch_to_percpu();
                    m.forced_atomic = false;
                }
                RefOp::Resurrect => {
                    let expect = m.dead && m.count > 0;
                    prop_assert_eq!(r.resurrect(), expect, "resurrect with {:?}", m);
                    if expect {
                        m.dead = false;
                        m.count += 1;
                    }
                }
                RefOp::Reinit => {
                    let expect = m.count == 0;
                    prop_assert_eq!(r.reinit(), expect, "reinit with {:?}", m);
                    if expect {
                        m.dead = false;
                        m.count = 1;
                    }
                }
            }
            prop_assert_eq!(r.count(), m.count, "count after a step, model {:?}", m);
            prop_assert_eq!(r.is_dying(), m.dead);
            prop_assert_eq!(r.is_percpu(), m.percpu(), "mode, model {:?}", m);
            prop_assert_eq!(r.is_zero(), m.count == 0);
            prop_assert_eq!(releases.load(SeqCst), m.releases, "release runs, model {:?}", m);
            r.assert_valid();
        }
        // Leave it released, so that dropping it is not a leak of a live reference.
        if m.count > 0 {
            if !m.dead {
                r.kill();
                m.count -= 1;
            }
            if m.count > 0 {
                r.put_many(m.count);
            }
            m.releases += 1;
        }
        prop_assert_eq!(releases.load(SeqCst), m.releases);
    }
}

// ---------------------------------------------------------------------------------------
// Refcache
// ---------------------------------------------------------------------------------------

/// Objects per sequence (more than one, so that they share and evict cache ways).
const OBJECTS: usize = 3;

#[derive(Debug, Clone)]
enum RcOp {
    Clone(usize),
    Drop(usize),
    Upgrade(usize),
    Tick,
}

fn rc_op() -> impl Strategy<Value = RcOp> {
    prop_oneof![
        3 => (0..OBJECTS).prop_map(RcOp::Clone),
        3 => (0..OBJECTS).prop_map(RcOp::Drop),
        1 => (0..OBJECTS).prop_map(RcOp::Upgrade),
        3 => Just(RcOp::Tick),
    ]
}

/// Counts the drops of an object's value.
struct Value {
    drops: Arc<AtomicUsize>,
}

impl Drop for Value {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

/// The most ticks an unreferenced, untouched object may wait: it reaches the header at
/// the next flush, is reviewed two epochs after it was queued, and a CPU whose cache
/// still held its last delta adds up to two more (`Refcache`'s docs: three to five).
const MAX_TICKS_TO_FREE: usize = 5;

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn refcache_matches_its_model(ops in proptest::collection::vec(rc_op(), 1..120)) {
        let cache = Refcache::with_config(Config::manual()).unwrap();
        let drops: Vec<Arc<AtomicUsize>> = (0..OBJECTS).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let mut strong: Vec<Vec<RcRef<'_, Value>>> =
            drops.iter().map(|d| vec![cache.alloc(Value { drops: d.clone() })]).collect();
        let weak: Vec<RcWeak<'_, Value>> = strong.iter().map(|h| RcRef::downgrade(&h[0])).collect();
        // Ticks each object has spent with no reference and no upgrade (None: referenced).
        let mut idle: Vec<Option<usize>> = vec![None; OBJECTS];
        let mut freed = [false; OBJECTS];
        for op in ops {
            match op {
                RcOp::Clone(i) => {
                    if let Some(h) = strong[i].first() {
                        let c = h.clone();
                        strong[i].push(c);
                    }
                }
                RcOp::Drop(i) => {
                    if strong[i].pop().is_some() && strong[i].is_empty() {
                        idle[i] = Some(0);
                    }
                }
                RcOp::Upgrade(i) => {
                    let up = weak[i].upgrade();
                    prop_assert_eq!(up.is_some(), !freed[i], "upgrade of object {} (freed: {})", i, freed[i]);
                    if let Some(h) = up {
                        strong[i].push(h);
                        idle[i] = None;
                    }
                }
                RcOp::Tick => {
                    cache.tick();
                    for t in idle.iter_mut().flatten() {
                        *t += 1;
                    }
                }
            }
            for i in 0..OBJECTS {
                let d = drops[i].load(SeqCst);
                prop_assert!(d <= 1, "object {} dropped {} times", i, d);
                if !strong[i].is_empty() {
                    prop_assert_eq!(d, 0, "object {} freed while referenced", i);
                }
                if d == 1 {
                    freed[i] = true;
                }
                if let Some(t) = idle[i] {
                    prop_assert!(
                        t <= MAX_TICKS_TO_FREE || freed[i],
                        "object {} unreferenced for {} ticks and not freed: {:?}", i, t, cache.stats()
                    );
                }
            }
        }
        strong.clear();
        let mut ticks = 0;
        while drops.iter().any(|d| d.load(SeqCst) == 0) {
            prop_assert!(ticks <= MAX_TICKS_TO_FREE, "not freed after the last drop: {:?}", cache.stats());
            cache.tick();
            ticks += 1;
        }
        for (i, d) in drops.iter().enumerate() {
            prop_assert_eq!(d.load(SeqCst), 1, "object {} not freed exactly once", i);
            prop_assert!(weak[i].upgrade().is_none());
        }
        cache.assert_valid();
    }
}

// ---------------------------------------------------------------------------------------
// RmLock
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum LockOp {
    Read,
    TryRead,
    DropRead(usize),
    Write,
    TryWrite,
    DropWrite,
}

fn lock_op() -> impl Strategy<Value = LockOp> {
    prop_oneof![
        3 => Just(LockOp::Read),
        2 => Just(LockOp::TryRead),
        3 => (0usize..8).prop_map(LockOp::DropRead),
        1 => Just(LockOp::Write),
        2 => Just(LockOp::TryWrite),
        2 => Just(LockOp::DropWrite),
    ]
}

proptest! {
    #![proptest_config(cases())]

    /// One thread's guards against the lock's rules: reads nest (recursion), a try_write
    /// fails while this thread reads, a try_read fails while it writes, a write guard sees
    /// and updates the value, and every guard dropped leaves the lock free again. Blocking
    /// calls that would wait for this thread itself (they panic by design) are not made.
    #[test]
    fn rmlock_matches_its_model(ops in proptest::collection::vec(lock_op(), 1..100)) {
        let lock = RmLock::new(0u64);
        let mut value = 0u64;
        let mut reads = Vec::new();
        let mut write = None;
        for op in ops {
            match op {
                LockOp::Read if write.is_none() => reads.push(lock.read()),
                LockOp::TryRead => {
                    let g = lock.try_read();
                    prop_assert_eq!(g.is_some(), write.is_none());
                    reads.extend(g);
                }
                LockOp::DropRead(k) if !reads.is_empty() => {
                    let k = k % reads.len();
                    drop(reads.remove(k));
                }
                LockOp::Write if write.is_none() && reads.is_empty() => {
                    let mut g = lock.write();
                    prop_assert_eq!(*g, value);
                    *g += 1;
                    value += 1;
                    write = Some(g);
                }
                LockOp::TryWrite => {
                    let g = lock.try_write();
                    prop_assert_eq!(g.is_some(), write.is_none() && reads.is_empty());
                    if let Some(mut g) = g {
                        *g += 1;
                        value += 1;
                        write = Some(g);
                    }
                }
                LockOp::DropWrite => write = None,
                _ => continue,
            }
            prop_assert_eq!(lock.is_write_locked(), write.is_some());
            for g in &reads {
                prop_assert_eq!(**g, value);
            }
        }
        drop(reads);
        drop(write);
        prop_assert!(!lock.is_write_locked());
        prop_assert_eq!(*lock.try_write().expect("free after every guard is dropped"), value);
        prop_assert_eq!(lock.into_inner(), value);
    }
}
