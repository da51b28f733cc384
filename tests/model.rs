//! Model-based tests (issue 9): proptest drives random operation sequences against
//! `PercpuRef`, `Refcache` (strong and weak references, intrusive headers), `RmLock`,
//! umem's global allocator (`Umem`'s `GlobalAlloc` and the C family, blocks filled with
//! patterns), a vmem arena (alloc, xalloc with alignment, phase and boundaries, frees,
//! coalescing, the free total) and an object cache (constructed state, reaping), and
//! checks every observable result against a small reference model after each step.
//! Shrinking turns a failure into a minimal sequence.
//!
//! The sequences run on one thread (the concurrent behaviour is what the loom models and
//! the stress tests cover); the test thread still migrates between CPUs as the scheduler
//! likes, so per-CPU parts are exercised on both.

#![cfg(not(scalemem_loom))]

mod common;

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

// ---------------------------------------------------------------------------------------
// GlobalAlloc (umem's Umem) and the C family
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum AllocOp {
    /// `GlobalAlloc::alloc` of (size, log2 align).
    Alloc(usize, u8),
    /// `GlobalAlloc::realloc` of the i-th live Rust block to a new size.
    Realloc(usize, usize),
    /// `GlobalAlloc::dealloc` of the i-th live Rust block.
    Dealloc(usize),
    /// `malloc`, `calloc` or `aligned_alloc` (log2 align) of a size.
    CAlloc(usize, u8),
    /// C `realloc` of the i-th live C block (size 0 frees).
    CRealloc(usize, usize),
    /// C `free` of the i-th live C block.
    CFree(usize),
}

/// Sizes across every path: tiny, each size-class range, just past the largest class,
/// and large blocks.
fn alloc_size() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=64, 65usize..=4096, 4097usize..=(128 << 10) + 64, (128usize << 10)..=(3 << 20)]
}

fn alloc_op() -> impl Strategy<Value = AllocOp> {
    prop_oneof![
        3 => (alloc_size(), 0u8..=13).prop_map(|(s, a)| AllocOp::Alloc(s, a)),
        2 => (any::<usize>(), alloc_size()).prop_map(|(i, s)| AllocOp::Realloc(i, s)),
        2 => any::<usize>().prop_map(AllocOp::Dealloc),
        3 => (prop_oneof![0usize..=64, alloc_size()], 0u8..=16).prop_map(|(s, a)| AllocOp::CAlloc(s, a)),
        2 => (any::<usize>(), prop_oneof![Just(0usize), alloc_size()]).prop_map(|(i, s)| AllocOp::CRealloc(i, s)),
        2 => any::<usize>().prop_map(AllocOp::CFree),
    ]
}

/// A live block in the model: address, size, alignment asked, fill byte.
#[derive(Debug, Clone, Copy)]
struct Block {
    ptr: *mut u8,
    size: usize,
    align: usize,
    fill: u8,
}

impl Block {
    /// Fills the block with its pattern (first and last bytes and one per 4 KiB page,
    /// so large blocks stay cheap).
    fn fill(&self) {
        for at in (0..self.size).step_by(4096).chain([self.size - 1]) {
            // SAFETY: `at < size`: inside the live block.
            unsafe { self.ptr.add(at).write(self.fill ^ (at as u8)) };
        }
    }

    /// Checks the pattern at the probe points below `len` (after a realloc: the new
    /// address with the old size's pattern, up to the smaller size).
    fn check(&self, len: usize) {
        for at in (0..self.size).step_by(4096).chain([self.size - 1]) {
            if at >= len {
                continue;
            }
            // SAFETY: `at < len <=` the live block's size.
            let got = unsafe { self.ptr.add(at).read() };
            assert_eq!(got, self.fill ^ (at as u8), "block {:?}: byte {at} changed", self.ptr);
        }
    }
}

proptest! {
    #![proptest_config(cases())]

    /// Random sequences of Rust and C allocator calls against a model of the live blocks:
    /// every block is aligned as asked, holds its size (`usable_size` too), keeps its
    /// pattern until freed (so no two live blocks overlap and realloc moves content),
    /// and impossible requests get null.
    #[test]
    fn global_alloc_matches_its_model(ops in proptest::collection::vec(alloc_op(), 1..60)) {
        use std::alloc::{GlobalAlloc, Layout};
        use scalemem::umem::global;
        let umem = scalemem::Umem::new();
        let mut rust: Vec<Block> = Vec::new();
        let mut c: Vec<Block> = Vec::new();
        let mut fill = 0u8;
        let mut next_fill = || { fill = fill.wrapping_add(37); fill };
        for op in ops {
            match op {
                AllocOp::Alloc(size, shift) => {
                    let align = 1usize << shift;
                    let layout = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: a non-zero size.
                    let ptr = unsafe { umem.alloc(layout) };
                    prop_assert!(!ptr.is_null());
                    prop_assert_eq!(ptr as usize % align, 0);
                    let b = Block { ptr, size, align, fill: next_fill() };
                    b.fill();
                    rust.push(b);
                }
                AllocOp::Realloc(i, new) if !rust.is_empty() => {
                    let b = rust.swap_remove(i % rust.len());
                    b.check(b.size);
                    let layout = Layout::from_size_align(b.size, b.align).unwrap();
                    // SAFETY: a live block of `layout`; a non-zero new size that rounds
                    // to at most isize::MAX.
                    let ptr = unsafe { umem.realloc(b.ptr, layout, new) };
                    prop_assert!(!ptr.is_null());
                    prop_assert_eq!(ptr as usize % b.align, 0);
                    Block { ptr, ..b }.check(b.size.min(new));
                    let nb = Block { ptr, size: new, align: b.align, fill: next_fill() };
                    nb.fill();
                    rust.push(nb);
                }
                AllocOp::Dealloc(i) if !rust.is_empty() => {
                    let b = rust.swap_remove(i % rust.len());
                    b.check(b.size);
                    // SAFETY: live, this layout, freed once.
                    unsafe { umem.dealloc(b.ptr, Layout::from_size_align(b.size, b.align).unwrap()) };
                }
                AllocOp::CAlloc(size, shift) => {
                    let align = 1usize << shift;
                    let ptr = match shift % 3 {
                        0 => global::malloc(size),
                        1 => global::calloc(1, size),
                        _ => global::aligned_alloc(align, size),
                    };
                    prop_assert!(!ptr.is_null());
                    let align = if shift % 3 == 2 { align.max(global::MIN_ALIGN) } else { global::MIN_ALIGN };
                    prop_assert_eq!(ptr as usize % align, 0);
                    // SAFETY: live.
                    let usable = unsafe { global::usable_size(ptr) };
                    prop_assert!(usable >= size);
                    if size > 0 {
                        if shift % 3 == 1 {
                            // SAFETY: `size` readable bytes.
                            let zeroed = unsafe { std::slice::from_raw_parts(ptr, size) }.iter().all(|&x| x == 0);
                            prop_assert!(zeroed);
                        }
                        // The pattern covers every usable byte: `malloc_usable_size` promises
                        // them, so an overstated one overlaps a neighbour and shows.
                        let b = Block { ptr, size: usable, align, fill: next_fill() };
                        b.fill();
                        c.push(b);
                    } else {
                        // SAFETY: from malloc, freed once.
                        unsafe { global::free(ptr) };
                    }
                }
                AllocOp::CRealloc(i, new) if !c.is_empty() => {
                    let b = c.swap_remove(i % c.len());
                    b.check(b.size);
                    // SAFETY: a live C block; not used again unless returned.
                    let ptr = unsafe { global::realloc(b.ptr, new) };
                    if new == 0 {
                        prop_assert!(ptr.is_null());
                        continue;
                    }
                    prop_assert!(!ptr.is_null());
                    prop_assert_eq!(ptr as usize % global::MIN_ALIGN, 0);
                    // SAFETY: live.
                    let usable = unsafe { global::usable_size(ptr) };
                    prop_assert!(usable >= new);
                    Block { ptr, ..b }.check(b.size.min(new));
                    let nb = Block { ptr, size: usable, align: b.align, fill: next_fill() };
                    nb.fill();
                    c.push(nb);
                }
                AllocOp::CFree(i) if !c.is_empty() => {
                    let b = c.swap_remove(i % c.len());
                    b.check(b.size);
                    // SAFETY: live, freed once.
                    unsafe { global::free(b.ptr) };
                }
                _ => {}
            }
        }
        for b in rust.iter().chain(&c) {
            b.check(b.size);
        }
        for b in rust {
            // SAFETY: live, this layout, freed once.
            unsafe { umem.dealloc(b.ptr, Layout::from_size_align(b.size, b.align).unwrap()) };
        }
        for b in c {
            // SAFETY: live, freed once.
            unsafe { global::free(b.ptr) };
        }
        // Impossible requests.
        prop_assert!(global::aligned_alloc(24, 8).is_null());
        prop_assert!(global::calloc(usize::MAX, 2).is_null());
        // SAFETY: a valid layout; too large to serve.
        let huge = unsafe { umem.alloc(Layout::from_size_align(isize::MAX as usize - 4095, 4096).unwrap()) };
        prop_assert!(huge.is_null());
    }
}

// ---------------------------------------------------------------------------------------
// vmem
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum VmemOp {
    /// `alloc(units * Q, policy)`; `best` picks best fit over instant fit.
    Alloc { units: usize, best: bool },
    /// `xalloc(units * Q)` aligned to `Q << align_shift`, with `phase` quanta past it,
    /// inside 1 KiB windows if `nocross`.
    Xalloc { units: usize, align_shift: u32, phase: usize, nocross: bool },
    /// Frees the i-th live range (`xfree` if `x`).
    Free { i: usize, x: bool },
    /// A free of a wrong size or of an address that is not allocated.
    BadFree(usize),
    /// Empties the quantum caches.
    Reap,
}

const VQ: usize = 8;
/// The arena's spans: two, so a request can fit neither, one or both.
const VSPANS: [(usize, usize); 2] = [(0x1000, 0x1000), (0x4000, 0x400)];

fn vmem_op() -> impl Strategy<Value = VmemOp> {
    prop_oneof![
        4 => (1usize..48, any::<bool>()).prop_map(|(units, best)| VmemOp::Alloc { units, best }),
        3 => (1usize..24, 0u32..6, 0usize..4, any::<bool>())
            .prop_map(|(units, align_shift, phase, nocross)| VmemOp::Xalloc { units, align_shift, phase, nocross }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, x)| VmemOp::Free { i, x }),
        1 => (0usize..0x600).prop_map(VmemOp::BadFree),
        1 => Just(VmemOp::Reap),
    ]
}

proptest! {
    #![proptest_config(cases())]

    /// Random alloc/xalloc/free sequences on a two-span arena against a map of live
    /// ranges: results are quantum-aligned, meet their constraints, lie inside a span and
    /// overlap no live range; an unconstrained request fails only if no gap in the model
    /// fits it (for instant fit: no gap of the next power of two); bad frees are refused and change nothing; the free
    /// total is the spans minus what is live; and freeing everything coalesces each span
    /// back into one free segment.
    #[test]
    fn vmem_matches_its_model(ops in proptest::collection::vec(vmem_op(), 1..120)) {
        use scalemem::umem::vmem::{Constraints, Policy, Vmem, VmemError};
        let arena = Vmem::builder("model").quantum(VQ).qcache_max(4 * VQ).checking(true)
            .span(VSPANS[0].0, VSPANS[0].1).build().unwrap();
        arena.add(VSPANS[1].0, VSPANS[1].1).unwrap();
        let mut live = std::collections::BTreeMap::<usize, usize>::new();
        for op in ops {
            match op {
                VmemOp::Alloc { units, best } | VmemOp::Xalloc { units, align_shift: 0, phase: 0, nocross: best } => {
                    let size = units * VQ;
                    let policy = if best { Policy::BestFit } else { Policy::InstantFit };
                    match arena.alloc(size, policy) {
                        Ok(a) => {
                            prop_assert_eq!(a % VQ, 0);
                            prop_assert!(VSPANS.iter().any(|&(b, n)| b <= a && a + size <= b + n), "outside the spans");
                            if let Some((&p, &n)) = live.range(..=a).next_back() {
                                prop_assert!(p + n <= a, "{:#x}+{:#x} overlaps {:#x}+{:#x}", a, size, p, n);
                            }
                            if let Some((&nx, _)) = live.range(a..).next() {
                                prop_assert!(a + size <= nx, "{:#x}+{:#x} overlaps {:#x}", a, size, nx);
                            }
                            live.insert(a, size);
                        }
                        // Ranges parked in quantum caches are not in the model: the
                        // gaps it sees are exact only while the caches are empty.
                        Err(VmemError::Exhausted) if arena.stats().qcached == 0 => {
                            let gap = common::largest_gap(&VSPANS, &live);
                            if best {
                                prop_assert!(gap < size, "best fit refused {:#x} with a gap of {:#x}", size, gap);
                            } else {
                                // Instant fit takes any segment from the lists of at least
                                // the next power of two.
                                prop_assert!(gap < size.next_power_of_two(), "instant fit refused {:#x}, gap {:#x}", size, gap);
                            }
                        }
                        Err(VmemError::Exhausted) => {}
                        Err(e) => prop_assert!(false, "unexpected {:?}", e),
                    }
                }
                VmemOp::Xalloc { units, align_shift, phase, nocross } => {
                    let size = units * VQ;
                    let align = VQ << align_shift;
                    let c = Constraints {
                        align,
                        phase: (phase * VQ) % align,
                        nocross: if nocross { 0x400 } else { 0 },
                        ..Constraints::default()
                    };
                    match arena.xalloc(size, &c) {
                        Ok(a) => {
                            prop_assert_eq!(a % align, c.phase);
                            if nocross {
                                prop_assert_eq!(a / 0x400, (a + size - 1) / 0x400, "crossed a 1 KiB boundary");
                            }
                            prop_assert!(VSPANS.iter().any(|&(b, n)| b <= a && a + size <= b + n));
                            if let Some((&p, &n)) = live.range(..=a).next_back() {
                                prop_assert!(p + n <= a);
                            }
                            if let Some((&nx, _)) = live.range(a..).next() {
                                prop_assert!(a + size <= nx);
                            }
                            live.insert(a, size);
                        }
                        Err(VmemError::Exhausted) => {}
                        Err(e) => prop_assert!(false, "unexpected {:?} for {:?}", e, c),
                    }
                }
                VmemOp::Free { i, x } if !live.is_empty() => {
                    let (&a, &size) = live.iter().nth(i % live.len()).unwrap();
                    live.remove(&a);
                    prop_assert_eq!(if x { arena.xfree(a, size) } else { arena.free(a, size) }, Ok(()));
                }
                VmemOp::BadFree(k) => {
                    let a = 0x1000 + VQ * k;
                    let before = arena.stats();
                    match live.get(&a) {
                        Some(&size) => prop_assert_eq!(arena.free(a, size + VQ), Err(VmemError::WrongSize)),
                        None => {
                            let r = arena.free(a, VQ);
                            prop_assert!(matches!(r, Err(VmemError::NotAllocated | VmemError::WrongSize)), "{:?}", r);
                        }
                    }
                    let after = arena.stats();
                    prop_assert_eq!((before.in_use, before.free), (after.in_use, after.free));
                }
                VmemOp::Reap => {
                    arena.reap();
                    prop_assert_eq!(arena.stats().qcached, 0);
                }
                VmemOp::Free { .. } => {}
            }
            let s = arena.stats();
            let used: usize = live.values().sum();
            prop_assert_eq!(s.in_use - s.qcached, used);
            prop_assert_eq!(s.free + s.qcached, s.total - used);
            arena.assert_valid();
        }
        for (a, size) in std::mem::take(&mut live) {
            prop_assert_eq!(arena.free(a, size), Ok(()));
        }
        arena.reap();
        arena.assert_valid();
        let s = arena.stats();
        prop_assert_eq!(s.in_use, 0);
        prop_assert_eq!(s.segments, 4, "two spans, each one free segment");
    }
}

// ---------------------------------------------------------------------------------------
// Object cache
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum CacheOp {
    Alloc,
    /// Frees the i-th live object, having written `scribble` into its payload (a user
    /// may change a constructed object, as long as it is constructed when freed).
    Free {
        i: usize,
        scribble: u8,
    },
    Reap,
    Update,
}

fn cache_op() -> impl Strategy<Value = CacheOp> {
    prop_oneof![
        5 => Just(CacheOp::Alloc),
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, scribble)| CacheOp::Free { i, scribble }),
        1 => Just(CacheOp::Reap),
        1 => Just(CacheOp::Update),
    ]
}

proptest! {
    #![proptest_config(cases())]

    /// Random alloc/free/reap/update sequences on an object cache with a constructor and
    /// a destructor, against a model of the live objects: each object handed out is
    /// constructed (its header word set by the constructor, its payload as the last user
    /// left it or as constructed), aligned, and overlaps no live object; `in_use` is the
    /// live count; constructors minus destructors equals `constructed`; the layers'
    /// invariants hold after every step; and after a reap of an empty cache every
    /// constructed object has been destroyed.
    #[test]
    fn object_cache_matches_its_model(
        size in prop_oneof![Just(24usize), Just(64), Just(200), Just(1000), Just(5000)],
        ops in proptest::collection::vec(cache_op(), 1..200),
    ) {
        use std::ptr::NonNull;
        use scalemem::umem::cache::{Config, ObjectCache};
        const MAGIC: u64 = 0x5ca1_ab1e_0b1e_c7ed;
        let ctors = Arc::new(AtomicUsize::new(0));
        let dtors = Arc::new(AtomicUsize::new(0));
        let (c2, d2) = (ctors.clone(), dtors.clone());
        let ctor = Box::new(move |p: NonNull<u8>| {
            // SAFETY: the cache passes `size` writable bytes, 8-aligned.
            unsafe { p.cast::<u64>().write(MAGIC) };
            // SAFETY: as above; the payload follows the header word.
            unsafe { p.as_ptr().add(8).write_bytes(0xC7, size - 8) };
            c2.fetch_add(1, SeqCst);
            Ok(())
        });
        let dtor = Box::new(move |p: NonNull<u8>| {
            // SAFETY: a constructed object of `size` bytes.
            assert_eq!(unsafe { p.cast::<u64>().read() }, MAGIC, "destroyed an unconstructed object");
            // SAFETY: as above.
            unsafe { p.cast::<u64>().write(0) };
            d2.fetch_add(1, SeqCst);
        });
        // One set of regions for every case, reachable from a static: a fresh leaked one per
        // case would be reported by LeakSanitizer (and would leak its arenas' address space).
        static REGIONS: std::sync::OnceLock<&'static scalemem::umem::region::Regions> =
            std::sync::OnceLock::new();
        let regions =
            *REGIONS.get_or_init(|| Box::leak(Box::new(scalemem::umem::region::Regions::new().unwrap())));
        let config = Config { reaper: false, ..Config::default() };
        let cache = ObjectCache::new_in(regions, "model", size, 8, Some(ctor), Some(dtor), config).unwrap();
        // Live objects: address -> payload byte the user last wrote (0xC7 when fresh).
        let mut live = std::collections::BTreeMap::<usize, u8>::new();
        // Freed objects: the payload they had, which a later alloc may return as is.
        let mut freed = std::collections::BTreeMap::<usize, u8>::new();
        for op in ops {
            match op {
                CacheOp::Alloc => {
                    let p = cache.alloc().unwrap();
                    let a = p.as_ptr() as usize;
                    prop_assert_eq!(a % 8, 0);
                    // SAFETY: a live object of `size` bytes.
                    let (magic, first, last) = unsafe {
                        (p.cast::<u64>().read(), *p.as_ptr().add(8), *p.as_ptr().add(size - 1))
                    };
                    prop_assert_eq!(magic, MAGIC, "handed out unconstructed");
                    let expected = freed.remove(&a).unwrap_or(0xC7);
                    // A freed object comes back as freed, or destroyed and built anew.
                    prop_assert!(first == last && (first == expected || first == 0xC7),
                        "payload {:#x}/{:#x}, expected {:#x}", first, last, expected);
                    if let Some((&prev, _)) = live.range(..a).next_back() {
                        prop_assert!(prev + size <= a, "overlaps a live object");
                    }
                    if let Some((&next, _)) = live.range(a..).next() {
                        prop_assert!(a + size <= next, "overlaps a live object");
                    }
                    live.insert(a, first);
                }
                CacheOp::Free { i, scribble } if !live.is_empty() => {
                    let (&a, _) = live.iter().nth(i % live.len()).unwrap();
                    live.remove(&a);
                    let p = NonNull::new(a as *mut u8).unwrap();
                    // SAFETY: a live object of `size` bytes; the header stays constructed.
                    unsafe { p.as_ptr().add(8).write_bytes(scribble, size - 8) };
                    // SAFETY: from this cache, freed once.
                    let freed_ok = unsafe { cache.free(p) }.is_ok();
                    prop_assert!(freed_ok);
                    freed.insert(a, scribble);
                }
                CacheOp::Reap => { cache.reap(); }
                CacheOp::Update => { cache.update(); }
                CacheOp::Free { .. } => {}
            }
            let s = cache.stats();
            prop_assert_eq!(s.in_use, live.len());
            prop_assert_eq!(ctors.load(SeqCst) - dtors.load(SeqCst), s.constructed);
            prop_assert!(s.constructed >= s.in_use);
            cache.assert_valid();
        }
        for (a, _) in std::mem::take(&mut live) {
            // SAFETY: from this cache, freed once.
            let freed_ok = unsafe { cache.free(NonNull::new(a as *mut u8).unwrap()) }.is_ok();
            prop_assert!(freed_ok);
        }
        cache.reap();
        cache.reap();
        cache.assert_valid();
        let s = cache.stats();
        prop_assert_eq!((s.in_use, s.constructed), (0, 0), "a reap of an idle cache destroys everything");
        prop_assert_eq!(ctors.load(SeqCst), dtors.load(SeqCst));
    }
}
