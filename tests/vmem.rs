//! Tests of `umem::vmem`: each feature on its own, a randomized comparison against a
//! reference model, a threaded stress that checks no two live allocations overlap, a
//! record-exhaustion run in a child process under `RLIMIT_AS`, and a check that the
//! alloc/free paths make no global allocation.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use common::counting_alloc::{Counting, allocations_in};
use scalemem::umem::vmem::{Constraints, OsPages, Policy, Source, Vmem, VmemError, VmemStats};

#[global_allocator]
static GLOBAL: Counting = Counting;

const IF: Policy = Policy::InstantFit;
const BF: Policy = Policy::BestFit;

/// xorshift64*: a fixed-seed PRNG, so every failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0), near enough.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The stats fields that describe the arena's state (not its cumulative counters).
fn shape(s: &VmemStats) -> (usize, usize, usize, usize, usize, usize, usize, usize) {
    (s.total, s.in_use, s.free, s.imported, s.qcached, s.spans, s.segments, s.allocated_segments)
}

// --- basics ---

#[test]
fn alloc_free_coalesces_back_to_one_segment() {
    let arena = Vmem::new("coalesce", 0x1000, 0x1000, 0x10, None, 0).unwrap();
    let mut live = Vec::new();
    for i in 0..16 {
        let a = arena.alloc(0x10 * (1 + i % 3), IF).unwrap();
        assert_eq!(a % 0x10, 0);
        assert!((0x1000..0x2000).contains(&a));
        live.push((a, 0x10 * (1 + i % 3)));
    }
    arena.assert_valid();
    // Free in an order that exercises merging with the next, the previous and both.
    for &i in &[1, 3, 2, 0, 5, 7, 6, 4, 8, 10, 9, 11, 15, 13, 14, 12] {
        let (a, size) = live[i];
        arena.free(a, size).unwrap();
        arena.assert_valid();
    }
    let s = arena.stats();
    assert_eq!((s.in_use, s.free, s.total), (0, 0x1000, 0x1000));
    assert_eq!(s.segments, 2, "a span marker and one free segment");
    assert_eq!(s.allocated_segments, 0);
    assert_eq!((s.allocations, s.frees, s.failures), (16, 16, 0));
}

#[test]
fn a_split_segment_frees_in_parts_and_coalesces_back() {
    let arena = Vmem::new("split", 0x1000, 0x1000, 0x10, None, 0).unwrap();
    let a = arena.xalloc(0x100, &Constraints::default()).unwrap();
    // Bad splits change nothing.
    for (addr, size, head) in [(a, 0x100, 0), (a, 0x100, 0x100), (a, 0x100, 0x108), (a, 0x100, 0x200)] {
        assert_eq!(arena.split(addr, size, head), Err(VmemError::BadConstraints), "split at {head:#x}");
    }
    assert_eq!(arena.split(a + 0x10, 0xf0, 0x10), Err(VmemError::NotAllocated));
    assert_eq!(arena.split(a, 0x80, 0x10), Err(VmemError::WrongSize));
    assert_eq!(arena.stats().allocated_segments, 1);
    // Three parts: [a, a+0x40), [a+0x40, a+0x50), [a+0x50, a+0x100).
    arena.split(a, 0x100, 0x40).unwrap();
    arena.split(a + 0x40, 0xc0, 0x10).unwrap();
    let s = arena.stats();
    assert_eq!((s.in_use, s.allocated_segments), (0x100, 3), "a split moves no unit");
    assert_eq!(arena.free(a, 0x100), Err(VmemError::WrongSize), "the old whole is gone");
    arena.assert_valid();
    // Each part frees on its own; the middle one last merges all three with the rest.
    arena.free(a + 0x50, 0xb0).unwrap();
    arena.free(a, 0x40).unwrap();
    assert_eq!(arena.stats().in_use, 0x10);
    arena.assert_valid();
    arena.free(a + 0x40, 0x10).unwrap();
    let s = arena.stats();
    assert_eq!((s.in_use, s.free, s.segments, s.allocated_segments), (0, 0x1000, 2, 0));
    arena.assert_valid();
}

/// A join undoes a split: two live segments next to each other in one span become one
/// (the back's record gone, the counts unmoved); segments of two spans that touch, a
/// wrong size or an address that is not a segment are refused with nothing changed.
#[test]
fn a_join_makes_two_neighbours_one_segment_within_a_span() {
    let arena = Vmem::new("join", 0x1000, 0x1000, 0x10, None, 0).unwrap();
    arena.add(0x2000, 0x1000).unwrap(); // a second span that touches the first
    let a = arena.xalloc(0x100, &Constraints { min_addr: 0x1000, max_addr: 0x1100, ..Constraints::default() }).unwrap();
    arena.split(a, 0x100, 0x40).unwrap();
    assert_eq!(arena.join(a, 0x40, 0x80), Err(VmemError::WrongSize));
    assert_eq!(arena.join(a + 0x10, 0x30, 0xc0), Err(VmemError::NotAllocated));
    assert_eq!(arena.stats().allocated_segments, 2, "a refused join changes nothing");
    arena.join(a, 0x40, 0xc0).unwrap();
    let s = arena.stats();
    assert_eq!((s.in_use, s.allocated_segments), (0x100, 1), "a join moves no unit");
    assert_eq!(arena.free(a + 0x40, 0xc0), Err(VmemError::NotAllocated), "the back is gone");
    arena.assert_valid();
    // The last 0x10 of the first span and the first 0x10 of the second: adjacent
    // addresses, two spans.
    let end = Constraints { min_addr: 0x1ff0, max_addr: 0x2000, ..Constraints::default() };
    let start = Constraints { min_addr: 0x2000, max_addr: 0x2010, ..Constraints::default() };
    let (x, y) = (arena.xalloc(0x10, &end).unwrap(), arena.xalloc(0x10, &start).unwrap());
    assert_eq!((x, y), (0x1ff0, 0x2000));
    assert_eq!(arena.join(x, 0x10, 0x10), Err(VmemError::NotAdjacent));
    // A free segment between two live ones is not a neighbour either.
    let b = arena.xalloc(0x20, &Constraints { min_addr: 0x1800, max_addr: 0x1820, ..Constraints::default() }).unwrap();
    let c = arena.xalloc(0x20, &Constraints { min_addr: 0x1840, max_addr: 0x1860, ..Constraints::default() }).unwrap();
    assert_eq!(arena.join(b, 0x20, 0x20), Err(VmemError::NotAllocated));
    for (p, n) in [(a, 0x100), (x, 0x10), (y, 0x10), (b, 0x20), (c, 0x20)] {
        arena.free(p, n).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.in_use, s.allocated_segments), (0, 0));
    arena.assert_valid();
}

#[test]
fn sizes_round_up_to_the_quantum() {
    let arena = Vmem::new("round", 0, 0x1000, 8, None, 0).unwrap();
    let a = arena.alloc(13, IF).unwrap();
    assert_eq!(arena.stats().in_use, 16);
    // Any size that rounds to the same multiple frees it.
    arena.free(a, 9).unwrap();
    assert_eq!(arena.stats().in_use, 0);
}

#[test]
fn id_allocator_hands_out_every_id_once() {
    let pids = Vmem::new("pids", 1, 1000, 1, None, 0).unwrap();
    let mut seen = vec![false; 1001];
    for _ in 0..1000 {
        let id = pids.alloc(1, IF).unwrap();
        assert!((1..=1000).contains(&id));
        assert!(!seen[id], "id {id} handed out twice");
        seen[id] = true;
    }
    assert_eq!(pids.alloc(1, IF), Err(VmemError::Exhausted));
    pids.assert_valid();
    for id in (1..=1000).rev() {
        pids.free(id, 1).unwrap();
    }
    assert_eq!(pids.stats().segments, 2);
    pids.assert_valid();
}

#[test]
fn disjoint_spans_do_not_merge() {
    let arena = Vmem::builder("spans").span(0, 100).build().unwrap();
    arena.add(100, 100).unwrap(); // adjacent, but a separate span
    arena.add(1000, 50).unwrap();
    assert_eq!(arena.add(150, 10), Err(VmemError::Overlap));
    assert_eq!(arena.add(usize::MAX - 5, 10), Err(VmemError::Overflow));
    // 150 does not fit in any one span even though 0..200 is contiguous.
    assert_eq!(arena.alloc(150, IF), Err(VmemError::Exhausted));
    let a = arena.alloc(100, IF).unwrap();
    let b = arena.alloc(100, IF).unwrap();
    let c = arena.alloc(50, IF).unwrap();
    let mut got = [a, b, c];
    got.sort();
    assert_eq!(got, [0, 100, 1000]);
    arena.assert_valid();
    for (x, n) in [(a, 100), (b, 100), (c, 50)] {
        arena.free(x, n).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.spans, s.segments, s.free), (3, 6, 250));
    arena.assert_valid();
}

// --- constrained allocation ---

#[test]
fn xalloc_honours_alignment_phase_nocross_and_window() {
    let arena = Vmem::new("x", 0x1_0000, 0x10_0000, 0x10, None, 0).unwrap();
    let mut rng = Rng(7);
    let mut live = Vec::new();
    for _ in 0..500 {
        let size = 0x10 * (1 + rng.below(16));
        let align = 0x10 << rng.below(9);
        let phase = if align > 0x10 { 0x10 * rng.below(align / 0x10) } else { 0 };
        let nocross = if rng.below(3) == 0 { (align.max(size) * 2).next_power_of_two() } else { 0 };
        let policy = if rng.below(2) == 0 { IF } else { BF };
        let c = Constraints { align, phase, nocross, policy, ..Constraints::default() };
        let a = arena.xalloc(size, &c).unwrap();
        assert_eq!(a % align, phase, "align {align:#x} phase {phase:#x} -> {a:#x}");
        // (With nocross 0 both sides are None.)
        assert_eq!(a.checked_div(nocross), (a + size - 1).checked_div(nocross), "crossed {nocross:#x}");
        live.push((a, size));
    }
    arena.assert_valid();
    // An address window.
    let c = Constraints { min_addr: 0x8_0000, max_addr: 0x8_1000, ..Constraints::default() };
    for _ in 0..8 {
        if let Ok(a) = arena.xalloc(0x100, &c) {
            assert!(a >= 0x8_0000 && a + 0x100 <= 0x8_1000);
            live.push((a, 0x100));
        }
    }
    // A window too small for the size.
    let tight = Constraints { min_addr: 0x9_0000, max_addr: 0x9_0080, ..Constraints::default() };
    assert_eq!(arena.xalloc(0x100, &tight), Err(VmemError::Exhausted));
    for (a, size) in live {
        arena.xfree(a, size).unwrap();
    }
    arena.assert_valid();
    assert_eq!(arena.stats().segments, 2);
}

#[test]
fn xalloc_rejects_impossible_constraints() {
    let arena = Vmem::new("bad", 0, 0x1000, 0x10, None, 0).unwrap();
    let before = arena.stats();
    for c in [
        Constraints { align: 0x30, ..Constraints::default() },
        Constraints { align: 0x40, phase: 0x40, ..Constraints::default() },
        Constraints { align: 0x40, phase: 0x8, ..Constraints::default() },
        Constraints { nocross: 0x30, ..Constraints::default() },
        Constraints { align: 0x100, nocross: 0x80, ..Constraints::default() },
        Constraints { nocross: 0x10, ..Constraints::default() }, // size 0x20 > nocross
        Constraints { min_addr: 0x800, max_addr: 0x400, ..Constraints::default() },
    ] {
        assert_eq!(arena.xalloc(0x20, &c), Err(VmemError::BadConstraints), "{c:?}");
    }
    assert_eq!(shape(&arena.stats()), shape(&before));
    arena.assert_valid();
}

#[test]
fn nocross_moves_to_the_next_boundary() {
    let arena = Vmem::new("nocross", 0, 0x1000, 1, None, 0).unwrap();
    let _first = arena.alloc(0xF0, IF).unwrap(); // free space now starts at 0xF0
    let c = Constraints { nocross: 0x100, ..Constraints::default() };
    assert_eq!(arena.xalloc(0x20, &c), Ok(0x100));
    arena.assert_valid();
    // The 0x10 gap before 0x100 remains free.
    let gap = Constraints { max_addr: 0x100, ..Constraints::default() };
    assert_eq!(arena.xalloc(0x10, &gap), Ok(0xF0));
}

// --- fit policies ---

#[test]
fn instant_fit_and_best_fit_choose_differently() {
    let arena = Vmem::new("fit", 0, 1000, 1, None, 0).unwrap();
    let a = arena.alloc(5, IF).unwrap();
    let _b = arena.alloc(1, IF).unwrap();
    let c = arena.alloc(40, IF).unwrap();
    let _d = arena.alloc(1, IF).unwrap();
    arena.free(a, 5).unwrap(); // a hole of 5 (free list [4, 8))
    arena.free(c, 40).unwrap(); // a hole of 40 (free list [32, 64))
    // Instant fit for 5 looks only at lists whose members all fit (from [8, 16) up):
    // the 40-hole is the head of the first such non-empty list.
    assert_eq!(arena.alloc(5, IF), Ok(c));
    arena.free(c, 5).unwrap();
    // Best fit takes the exact hole.
    assert_eq!(arena.alloc(5, BF), Ok(a));
    arena.assert_valid();
    // Instant fit falls back to searching the size's own list when no list above fits:
    let small = Vmem::new("fallback", 0, 7, 1, None, 0).unwrap();
    assert_eq!(small.alloc(6, IF), Ok(0));
}

// --- import and release ---

#[test]
fn import_from_a_source_arena_and_release_a_wholly_free_span() {
    let parent = Vmem::new("parent", 0x10_0000, 0x10_0000, 0x1000, None, 0).unwrap();
    let child = Vmem::builder("child").quantum(0x10).source(&parent).build().unwrap();
    assert_eq!(child.stats().total, 0);
    let a = child.alloc(0x30, IF).unwrap();
    let b = child.alloc(0x30, IF).unwrap();
    let s = child.stats();
    assert_eq!((s.imports, s.imported, s.spans), (1, 0x1000, 1), "one page imported, shared by both");
    assert_eq!(parent.stats().in_use, 0x1000);
    assert!((0x10_0000..0x20_0000).contains(&a));
    // A big request imports a second span of a whole number of parent quanta.
    let big = child.alloc(0x1800, IF).unwrap();
    assert_eq!(child.stats().imported, 0x3000);
    assert_eq!(parent.stats().in_use, 0x3000);
    child.assert_valid();
    parent.assert_valid();
    child.free(big, 0x1800).unwrap();
    assert_eq!(child.stats().imported, 0x1000, "the big span went back");
    assert_eq!(parent.stats().in_use, 0x1000);
    child.free(a, 0x30).unwrap();
    assert_eq!(child.stats().releases, 1, "span still partly used");
    child.free(b, 0x30).unwrap();
    let s = child.stats();
    assert_eq!((s.total, s.imported, s.spans, s.segments, s.releases), (0, 0, 0, 0, 2));
    assert_eq!(parent.stats().in_use, 0);
    assert_eq!(parent.stats().segments, 2);
    child.assert_valid();
    parent.assert_valid();
}

#[test]
fn import_with_alignment_slack_and_exhausted_source() {
    let parent = Vmem::new("parent", 0x1000, 0x4000, 0x1000, None, 0).unwrap();
    let child = Vmem::builder("child").quantum(0x100).source(&parent).build().unwrap();
    let c = Constraints { align: 0x2000, ..Constraints::default() };
    let a = child.xalloc(0x100, &c).unwrap();
    assert_eq!(a % 0x2000, 0);
    // The window constraint is not imported for, and the source runs dry.
    let w = Constraints { min_addr: 0x10_0000, ..Constraints::default() };
    assert_eq!(child.xalloc(0x100, &w), Err(VmemError::Exhausted));
    assert_eq!(child.alloc(0x10_0000, IF), Err(VmemError::Exhausted));
    child.assert_valid();
    parent.assert_valid();
    assert_eq!(child.stats().failures, 2);
    child.xfree(a, 0x100).unwrap();
    assert_eq!(parent.stats().in_use, 0);
}

#[test]
fn dropping_a_child_returns_its_spans() {
    let parent = Vmem::new("parent", 0, 1 << 20, 4096, None, 0).unwrap();
    {
        let child = Vmem::builder("child").quantum(64).source(&parent).qcache_max(256).build().unwrap();
        for _ in 0..100 {
            child.alloc(200, IF).unwrap(); // never freed
        }
        assert!(parent.stats().in_use > 0);
    }
    assert_eq!(parent.stats().in_use, 0);
    parent.assert_valid();
}

#[test]
fn os_pages_back_an_arena_with_real_memory() {
    let heap = Vmem::builder("heap").quantum(16).source(&OsPages).qcache_max(64).build().unwrap();
    let mut live = Vec::new();
    for i in 0..200usize {
        let size = 16 + (i * 37) % 3000;
        let p = heap.alloc(size, IF).unwrap();
        // SAFETY: the arena's spans are our own mappings; [p, p + size) is ours alone.
        unsafe { std::ptr::write_bytes(p as *mut u8, i as u8, size) };
        live.push((p, size, i as u8));
    }
    for &(p, size, v) in &live {
        // SAFETY: as above; nobody else wrote there.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
        assert!(bytes.iter().all(|&b| b == v), "allocation at {p:#x} overwritten");
    }
    heap.assert_valid();
    for (p, size, _) in live {
        heap.free(p, size).unwrap();
    }
    heap.reap();
    let s = heap.stats();
    assert_eq!((s.imported, s.total, s.in_use), (0, 0, 0), "every page unmapped");
    assert_eq!(s.imports, s.releases);
}

/// A source that counts imports and refuses all but a budget of them.
struct Budget {
    base: std::sync::atomic::AtomicUsize,
    left: std::sync::atomic::AtomicUsize,
    live: std::sync::atomic::AtomicUsize,
}

impl Source for Budget {
    fn import(&self, size: usize, _align: usize) -> Result<usize, VmemError> {
        if self.left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_err() {
            return Err(VmemError::Exhausted);
        }
        self.live.fetch_add(1, SeqCst);
        Ok(self.base.fetch_add(size + 0x1000, SeqCst))
    }

    unsafe fn release(&self, _base: usize, _size: usize) {
        self.live.fetch_sub(1, SeqCst);
    }
}

#[test]
fn a_function_source_is_imported_from_and_released_to() {
    let src = Budget {
        base: std::sync::atomic::AtomicUsize::new(0x100_0000),
        left: std::sync::atomic::AtomicUsize::new(3),
        live: std::sync::atomic::AtomicUsize::new(0),
    };
    let arena = Vmem::builder("fn").quantum(8).source(&src).build().unwrap();
    let a = arena.alloc(100, IF).unwrap();
    let b = arena.alloc(200, BF).unwrap(); // no room in the 104-unit span: a second import
    let c = arena.alloc(300, IF).unwrap();
    assert_eq!(src.live.load(SeqCst), 3);
    let before = shape(&arena.stats());
    assert_eq!(arena.alloc(400, IF), Err(VmemError::Exhausted));
    assert_eq!(shape(&arena.stats()), before, "a failed import changes nothing");
    arena.assert_valid();
    for (x, n) in [(a, 100), (b, 200), (c, 300)] {
        arena.free(x, n).unwrap();
    }
    assert_eq!(src.live.load(SeqCst), 0);
    assert_eq!(arena.stats().total, 0);
}

// --- quantum caches ---

#[test]
fn quantum_caches_serve_small_sizes() {
    let arena = Vmem::builder("qc").quantum(16).span(0, 1 << 16).qcache_max(64).checking(true).build().unwrap();
    let a = arena.alloc(16, IF).unwrap();
    let b = arena.alloc(48, IF).unwrap();
    arena.free(a, 16).unwrap();
    arena.free(b, 48).unwrap();
    let s = arena.stats();
    assert_eq!((s.qcached, s.in_use, s.allocated_segments), (64, 64, 2), "parked, still allocated in the arena");
    // The same ranges come back (LIFO) without touching the free lists.
    assert_eq!(arena.alloc(16, IF), Ok(a));
    assert_eq!(arena.alloc(48, BF), Ok(b));
    assert_eq!(arena.stats().qcached, 0);
    // Checking mode: a double free into a cache, and a wrong size, are refused.
    arena.free(a, 16).unwrap();
    assert_eq!(arena.free(a, 16), Err(VmemError::NotAllocated));
    assert_eq!(arena.xfree(a, 16), Err(VmemError::NotAllocated));
    assert_eq!(arena.free(b, 32), Err(VmemError::WrongSize));
    assert_eq!(arena.free(12345 * 16, 16), Err(VmemError::NotAllocated));
    arena.assert_valid();
    arena.free(b, 48).unwrap();
    // Sizes above qcache_max bypass the caches.
    let big = arena.alloc(80, IF).unwrap();
    arena.free(big, 80).unwrap();
    assert_eq!(arena.stats().qcached, 64);
    // A cache holds at most 16 ranges; the 17th free goes to the arena.
    let many: Vec<usize> = (0..20).map(|_| arena.alloc(32, IF).unwrap()).collect();
    for &x in &many {
        arena.free(x, 32).unwrap();
    }
    assert_eq!(arena.stats().qcached, 64 + 16 * 32);
    arena.assert_valid();
    arena.reap();
    let s = arena.stats();
    assert_eq!((s.qcached, s.in_use, s.segments), (0, 0, 2));
    arena.assert_valid();
}

#[test]
fn cached_ranges_never_make_an_allocation_fail() {
    // 16 units; fill the arena with 1-unit allocations, free them all into the cache
    // (16 fit), then ask for all 16 units at once: the arena reaps its caches and retries.
    let arena = Vmem::builder("reap").span(0, 16).qcache_max(2).build().unwrap();
    let ids: Vec<usize> = (0..16).map(|_| arena.alloc(1, IF).unwrap()).collect();
    for &id in &ids {
        arena.free(id, 1).unwrap();
    }
    assert_eq!(arena.stats().qcached, 16);
    assert_eq!(arena.alloc(16, IF), Ok(0));
    assert_eq!(arena.stats().failures, 0);
    arena.assert_valid();
}

#[test]
fn qcache_max_is_clamped_to_sixteen_quanta() {
    let arena = Vmem::builder("clamp").quantum(8).span(0, 4096).qcache_max(1000).build().unwrap();
    let a = arena.alloc(128, IF).unwrap(); // 16 quanta: cached on free
    let b = arena.alloc(136, IF).unwrap(); // 17 quanta: not
    arena.free(a, 128).unwrap();
    arena.free(b, 136).unwrap();
    assert_eq!(arena.stats().qcached, 128);
}

// --- the hash ---

#[test]
fn hash_grows_with_thousands_of_live_segments() {
    let arena = Vmem::new("hash", 0, 1 << 30, 1 << 4, None, 0).unwrap();
    let initial = arena.stats().hash_buckets;
    let mut live = Vec::new();
    for i in 0..10_000usize {
        // Alternate sizes so that neighbours do not all look alike.
        let size = 16 * (1 + i % 5);
        live.push((arena.alloc(size, IF).unwrap(), size));
    }
    let s = arena.stats();
    assert_eq!(s.allocated_segments, 10_000);
    assert!(s.hash_buckets >= 10_000 / 2 && s.hash_buckets > initial, "hash did not grow: {} buckets", s.hash_buckets);
    arena.assert_valid();
    // Free every other one (no coalescing possible), then the rest.
    for &(a, size) in live.iter().step_by(2) {
        arena.free(a, size).unwrap();
    }
    arena.assert_valid();
    for &(a, size) in live.iter().skip(1).step_by(2) {
        arena.free(a, size).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.allocated_segments, s.segments, s.in_use), (0, 2, 0));
    arena.assert_valid();
}

// --- bad input ---

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let arena = Vmem::builder("bad").quantum(8).span(0x1000, 0x1000).checking(false).build().unwrap();
    let a = arena.alloc(64, IF).unwrap();
    let before = arena.stats();
    assert_eq!(arena.alloc(0, IF), Err(VmemError::ZeroSize));
    assert_eq!(arena.alloc(usize::MAX, IF), Err(VmemError::Overflow));
    assert_eq!(arena.alloc(usize::MAX - 7, IF), Err(VmemError::Exhausted));
    assert_eq!(arena.free(a + 8, 56), Err(VmemError::NotAllocated), "an interior address");
    assert_eq!(arena.free(a, 128), Err(VmemError::WrongSize));
    assert_eq!(arena.free(a, 0), Err(VmemError::ZeroSize));
    assert_eq!(arena.free(0x9999_0000, 8), Err(VmemError::NotAllocated));
    assert_eq!(arena.add(0x1800, 0x100), Err(VmemError::Overlap));
    assert_eq!(arena.add(0x3000, 0), Err(VmemError::ZeroSize));
    assert_eq!(arena.add(0x3001, 8), Err(VmemError::BadConstraints));
    assert_eq!(arena.xalloc(8, &Constraints { max_addr: 0x1000, ..Constraints::default() }), Err(VmemError::Exhausted));
    assert_eq!(shape(&arena.stats()), shape(&before));
    assert_eq!(arena.stats().failures, 2, "the two Exhausted allocations");
    arena.assert_valid();
    arena.free(a, 64).unwrap();
    assert_eq!(arena.free(a, 64), Err(VmemError::NotAllocated), "a double free");
    arena.assert_valid();
    assert_eq!(Vmem::new("q", 0, 10, 3, None, 0).err(), Some(VmemError::BadQuantum));
    assert_eq!(Vmem::new("q", 1, 8, 4, None, 0).err(), Some(VmemError::BadConstraints));
}

// --- randomized comparison with a model ---

fn model_run(seed: u64, ops: usize, with_source: bool) {
    const Q: usize = 8;
    let parent = Vmem::new("model-parent", 0x10_0000, 0x4_0000, 0x100, None, 0).unwrap();
    let mut builder = Vmem::builder("model").quantum(Q).qcache_max(4 * Q).checking(true);
    let mut spans = Vec::new();
    if with_source {
        builder = builder.source(&parent);
    } else {
        builder = builder.span(0x1000, 0x2000);
        spans = vec![(0x1000, 0x2000), (0x8000, 0x800)];
    }
    let arena = builder.build().unwrap();
    if !with_source {
        arena.add(0x8000, 0x800).unwrap();
    }
    let mut rng = Rng(seed);
    let mut live: BTreeMap<usize, usize> = BTreeMap::new();
    let mut exhausted = 0;
    for op in 0..ops {
        match rng.below(10) {
            0..=4 => {
                let max = if rng.below(4) == 0 { 64 } else { 6 };
                let size = Q * (1 + rng.below(max));
                let policy = if rng.below(2) == 0 { IF } else { BF };
                let constrained = rng.below(3) == 0;
                let c = Constraints {
                    align: Q << rng.below(5),
                    nocross: if rng.below(4) == 0 { 0x400 } else { 0 },
                    policy,
                    ..Constraints::default()
                };
                let result = if constrained { arena.xalloc(size, &c) } else { arena.alloc(size, policy) };
                match result {
                    Ok(a) => {
                        assert_eq!(a % Q, 0);
                        if constrained {
                            assert_eq!(a % c.align.max(Q), 0);
                            assert_eq!(a.checked_div(c.nocross), (a + size - 1).checked_div(c.nocross));
                        }
                        if let Some((&p, &n)) = live.range(..=a).next_back() {
                            assert!(p + n <= a, "op {op}: {a:#x}+{size:#x} overlaps {p:#x}+{n:#x}");
                        }
                        if let Some((&nx, _)) = live.range(a..).next() {
                            assert!(a + size <= nx, "op {op}: {a:#x}+{size:#x} overlaps {nx:#x}");
                        }
                        if !with_source {
                            assert!(spans.iter().any(|&(b, n)| b <= a && a + size <= b + n), "outside the spans");
                        }
                        live.insert(a, size);
                    }
                    Err(VmemError::Exhausted) => {
                        exhausted += 1;
                        if !with_source && !constrained {
                            let gap = common::largest_gap(&spans, &live);
                            assert!(gap < size, "op {op}: exhausted for {size:#x} with a free gap of {gap:#x}");
                        }
                    }
                    Err(e) => panic!("op {op}: unexpected {e:?}"),
                }
            }
            5..=8 if !live.is_empty() => {
                let nth = rng.below(live.len());
                let (&a, &size) = live.iter().nth(nth).unwrap();
                live.remove(&a);
                if rng.below(2) == 0 { arena.free(a, size) } else { arena.xfree(a, size) }.unwrap();
            }
            _ if rng.below(3) == 0 && live.iter().any(|(&a, &n)| live.contains_key(&(a + n))) => {
                // A join of two live segments next to each other: one segment after it,
                // unless they lie in two spans (possible only with a source: the fixed
                // spans here are far apart).
                let pairs: Vec<_> =
                    live.iter().filter(|&(&a, &n)| live.contains_key(&(a + n))).map(|(&a, &n)| (a, n)).collect();
                let (a, size) = pairs[rng.below(pairs.len())];
                let next = live[&(a + size)];
                match arena.join(a, size, next) {
                    Ok(()) => {
                        live.remove(&(a + size));
                        live.insert(a, size + next);
                        assert_eq!(
                            arena.free(a + size, next),
                            Err(VmemError::NotAllocated),
                            "op {op}: the back is gone"
                        );
                    }
                    Err(VmemError::NotAdjacent) => {
                        assert!(with_source, "op {op}: {a:#x}+{size:#x} and the next are in one span")
                    }
                    Err(e) => panic!("op {op}: join: unexpected {e:?}"),
                }
            }
            _ if rng.below(2) == 0 && live.values().any(|&n| n >= 2 * Q) => {
                // A split of a live segment at a random quantum inside it: both parts are
                // then live on their own (freed separately later, coalescing back).
                let big: Vec<_> = live.iter().filter(|&(_, &n)| n >= 2 * Q).map(|(&a, &n)| (a, n)).collect();
                let (a, size) = big[rng.below(big.len())];
                let head = Q * (1 + rng.below(size / Q - 1));
                arena.split(a, size, head).unwrap();
                live.insert(a, head);
                live.insert(a + head, size - head);
                assert_eq!(arena.free(a, size), Err(VmemError::WrongSize), "op {op}: the whole is gone");
            }
            _ => {
                // A bad free: an address that is not allocated, or the wrong size.
                let a = 0x1000 + Q * rng.below(0x400);
                match live.get(&a) {
                    Some(&size) => assert_eq!(arena.free(a, size + Q), Err(VmemError::WrongSize)),
                    None => {
                        let r = arena.free(a, Q);
                        assert!(matches!(r, Err(VmemError::NotAllocated | VmemError::WrongSize)), "{r:?}");
                    }
                }
            }
        }
        let s = arena.stats();
        let used: usize = live.values().sum();
        assert_eq!(s.in_use - s.qcached, used, "op {op}: in use");
        assert_eq!(s.free + s.qcached, s.total - used, "op {op}: free total");
        if op % 64 == 0 {
            arena.assert_valid();
            parent.assert_valid();
        }
        if op % 500 == 499 {
            arena.reap();
            assert_eq!(arena.stats().qcached, 0);
        }
    }
    assert!(exhausted > 0, "the run never filled the arena; make it smaller");
    for (a, size) in std::mem::take(&mut live) {
        arena.free(a, size).unwrap();
    }
    arena.reap();
    arena.assert_valid();
    let s = arena.stats();
    assert_eq!(s.in_use, 0);
    if with_source {
        assert_eq!((s.total, s.imported), (0, 0));
        assert_eq!(parent.stats().in_use, 0);
        assert!(s.imports > 1 && s.imports == s.releases);
    } else {
        assert_eq!(s.segments, 4, "two spans, each one free segment");
    }
}

#[test]
fn randomized_against_a_model() {
    for seed in 1..=4 {
        model_run(seed * 0x9E37_79B9, 6000, false);
    }
}

#[test]
fn randomized_against_a_model_with_imports() {
    for seed in 1..=4 {
        model_run(seed * 0x5851_F42D, 6000, true);
    }
}

// --- threads ---

/// `threads` threads allocate and free in `arena`; every unit of a live allocation is
/// claimed in `owner` (one word per unit, indexed from `base`), so an overlap shows as a
/// failed claim.
fn stress(arena: &Vmem<'_>, base: usize, units: usize, threads: usize, rounds: usize) {
    let owner: Arc<Vec<AtomicU32>> = Arc::new((0..units).map(|_| AtomicU32::new(0)).collect());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let owner = owner.clone();
            scope.spawn(move || {
                let me = t as u32 + 1;
                let mut rng = Rng(0xC0FFEE + t as u64);
                let mut mine: Vec<(usize, usize)> = Vec::with_capacity(64);
                let claim = |a: usize, n: usize, from: u32, to: u32| {
                    for u in a - base..a - base + n {
                        // Relaxed: a unit changes hands only through the arena's or a
                        // quantum cache's lock (a Release unlock after the free, an
                        // Acquire lock before the next allocation; a reap chains two),
                        // which orders these swaps already.
                        let prev = owner[u].swap(to, Relaxed);
                        assert_eq!(prev, from, "unit {:#x} owned by {prev}, thread {me} expected {from}", u + base);
                    }
                };
                for _ in 0..rounds {
                    if mine.len() < 48 && rng.below(3) != 0 {
                        let max = if rng.below(8) == 0 { 200 } else { 24 };
                        let size = 1 + rng.below(max);
                        let result = if rng.below(4) == 0 {
                            let c = Constraints { align: 1 << rng.below(6), ..Constraints::default() };
                            arena.xalloc(size, &c).inspect(|a| assert_eq!(a % c.align, 0))
                        } else {
                            arena.alloc(size, if rng.below(2) == 0 { IF } else { BF })
                        };
                        match result {
                            Ok(a) => {
                                claim(a, size, 0, me);
                                mine.push((a, size));
                            }
                            Err(VmemError::Exhausted) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                    } else if !mine.is_empty() {
                        let (a, size) = mine.swap_remove(rng.below(mine.len()));
                        claim(a, size, me, 0);
                        arena.free(a, size).unwrap();
                    }
                }
                for (a, size) in mine {
                    claim(a, size, me, 0);
                    arena.free(a, size).unwrap();
                }
            });
        }
        // Meanwhile, check the invariants a few times under contention.
        for _ in 0..20 {
            arena.assert_valid();
            std::thread::yield_now();
        }
    });
    arena.reap();
    arena.assert_valid();
    assert_eq!(arena.stats().in_use, 0);
}

#[test]
fn threads_never_get_overlapping_ranges() {
    let arena = Vmem::builder("stress").span(0, 4096).qcache_max(8).checking(true).build().unwrap();
    stress(&arena, 0, 4096, 12, 60_000);
    let s = arena.stats();
    assert_eq!(s.segments, 2);
    assert!(s.allocations > 150_000, "{s:?}");
}

#[test]
fn threads_never_get_overlapping_ranges_with_imports() {
    let parent = Vmem::new("stress-parent", 0x10_0000, 0x2000, 64, None, 0).unwrap();
    let child = Vmem::builder("stress-child").source(&parent).qcache_max(4).build().unwrap();
    stress(&child, 0x10_0000, 0x2000, 8, 40_000);
    let s = child.stats();
    assert!(s.imports > 0 && s.imports == s.releases, "{s:?}");
    assert_eq!(parent.stats().in_use, 0);
    parent.assert_valid();
}

// --- no global allocation ---

#[test]
fn alloc_and_free_make_no_global_allocation() {
    let parent = Vmem::new("na-parent", 0x100_0000, 1 << 24, 4096, None, 0).unwrap();
    let arena = Vmem::builder("na").quantum(16).source(&parent).qcache_max(128).build().unwrap();
    let mut live = [(0usize, 0usize); 2000];
    let burst = |live: &mut [(usize, usize); 2000]| {
        let mut rng = Rng(99);
        for slot in live.iter_mut() {
            let size = 16 * (1 + rng.below(40));
            *slot = (arena.alloc(size, if rng.below(2) == 0 { IF } else { BF }).unwrap(), size);
        }
        for slot in live.iter_mut().step_by(3) {
            let c = Constraints { align: 256, ..Constraints::default() };
            arena.free(slot.0, slot.1).unwrap();
            *slot = (arena.xalloc(slot.1, &c).unwrap(), slot.1);
        }
        for &(a, size) in live.iter() {
            arena.free(a, size).unwrap();
        }
        arena.reap();
    };
    burst(&mut live); // warm-up: maps records and grows the hash
    let n = allocations_in(|| {
        for _ in 0..5 {
            burst(&mut live);
        }
    });
    assert_eq!(n, 0, "vmem called the global allocator {n} times");
    // Arenas built from scratch (records, hash) map memory, not the heap, too.
    let n = allocations_in(|| {
        let a = Vmem::new("fresh", 0, 1 << 20, 1, None, 4).unwrap();
        let x = a.alloc(3, IF).unwrap();
        a.free(x, 3).unwrap();
    });
    assert_eq!(n, 0, "creating an arena allocated");
}

// --- running out of memory for records ---

const RLIMIT_CHILD: &str = "VMEM_RLIMIT_CHILD";

/// In a child process (the address-space limit would starve the test harness): limits
/// the address space to just above what is used, then fragments an arena until the
/// record pool cannot grow. The failing allocation must report `NoRecords` and leave the
/// arena valid; frees must still work (they need no record) and coalesce everything.
#[test]
fn running_out_of_records_fails_cleanly() {
    if std::env::var_os(RLIMIT_CHILD).is_some() {
        records_child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "running_out_of_records_fails_cleanly", "--nocapture", "--test-threads=1"])
        .env(RLIMIT_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("records exhausted after"), "child did not reach the limit:\n{stdout}\n{stderr}");
}

fn records_child() {
    let arena = Vmem::new("oom", 0, 1 << 40, 1, None, 0).unwrap();
    // Reserve the Vec's address space before the limit, so the limit hits the record
    // pool, not the test's own bookkeeping.
    let mut live: Vec<usize> = Vec::with_capacity(4_000_000);
    let vm_kib: usize = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    let limit = (vm_kib + 2048) as u64 * 1024; // 2 MiB of headroom
    let rlim = libc::rlimit { rlim_cur: limit, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid pointer to an initialised struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlim) }, 0);
    let err = loop {
        // One unit each; keep them all: every allocation splits the free tail (a record).
        match arena.alloc(1, IF) {
            Ok(a) => live.push(a),
            Err(e) => break e,
        }
        assert!(live.len() < 4_000_000, "never ran out");
    };
    let rlim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: as above (raising the soft limit back to the hard one).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlim) }, 0);
    assert_eq!(err, VmemError::NoRecords);
    let s = arena.stats();
    assert_eq!(s.allocated_segments, live.len());
    assert_eq!(s.failures, 1);
    arena.assert_valid();
    for &a in live.iter().rev() {
        arena.free(a, 1).unwrap();
    }
    assert_eq!(arena.stats().segments, 2);
    arena.assert_valid();
    println!("records exhausted after {} allocations", live.len());
}
