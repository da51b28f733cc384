//! `vmem`: operation sequences against two [`Vmem`] arenas — a parent that holds spans
//! the fuzzer adds, and a child that imports its spans from the parent (the `Source`
//! that `Vmem` implements) — checked against a reference model of each: a map of the
//! ranges the caller holds, and the parent's spans.
//!
//! Checked after every operation, besides `assert_valid` on both arenas:
//! - an allocation is a multiple of the quantum, lies inside one span, overlaps no
//!   range held in either arena, and meets its constraints (alignment and phase,
//!   `nocross`, the `[min_addr, max_addr)` window);
//! - an allocation of the parent fails with `Exhausted` exactly when the model has no
//!   gap (within one span: spans never merge) where the request fits (while the child
//!   holds no span of the parent's, whose place the model does not know), and bad
//!   input gets the error of the module's table: `ZeroSize`, `Overflow`,
//!   `BadConstraints`, `Overlap`, `NotAllocated`/`WrongSize` for frees of ranges not
//!   held (double frees included), with the arena unchanged;
//! - a split of a held range is refused off the quantum or outside `(0, size)`; a join
//!   of two held neighbours is done within one span and refused (`NotAdjacent`) across
//!   two that touch; neither moves a unit;
//! - the counts: `total` is the sum of the spans, `in_use - qcached` the model's held
//!   units (plus what the child imported, for the parent), `free = total - in_use`;
//! - at the end, with everything freed and the quantum caches reaped, the child has
//!   given every span back and each parent span is one free segment again.
//!
//! The quantum (1 .. 4096), the quantum-cache limit and the first span come from the
//! input too. Checking mode is on, so a bad free of a quantum-cache size is refused
//! rather than cached.

#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use scalemem::umem::vmem::{Constraints, Policy, Vmem, VmemError};

/// At most this many ranges held in each arena.
const MAX_LIVE: usize = 64;
/// At most this many spans in the parent.
const MAX_SPANS: usize = 16;

#[derive(Arbitrary, Debug)]
struct Input {
    quantum_shift: u8,
    qcache_quanta: u8,
    child_quantum_shift: u8,
    child_qcache_quanta: u8,
    first_span: SpanReq,
    ops: Vec<Op>,
}

/// A span to add: aligned to the quantum or not, anywhere up to the top of `usize`.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct SpanReq {
    sel: u8,
    base: u32,
    size: u32,
}

impl SpanReq {
    fn get(self, q_shift: u32) -> (usize, usize) {
        let base = match self.sel % 4 {
            0 | 1 => (self.base as usize) << q_shift,
            2 => self.base as usize,
            _ => usize::MAX - (self.base as usize),
        };
        let size = match (self.sel / 4) % 4 {
            0 | 1 => ((self.size % (1 << 16)) as usize) << q_shift,
            2 => self.size as usize,
            _ => (self.size as usize) << 32,
        };
        (base, size)
    }
}

/// A size in arena units: an edge case, or a value at a random magnitude.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct VSize {
    sel: u8,
    raw: u32,
}

impl VSize {
    fn get(self, q: usize, qcache_max: usize) -> usize {
        match self.sel {
            0 => 0,
            1 => 1,
            2 => q - 1,
            3 => q,
            4 => q + 1,
            5 => qcache_max,
            6 => qcache_max + 1,
            7 => usize::MAX,
            8 => (usize::MAX - q).saturating_add(2),
            s => (self.raw >> (s % 32)) as usize,
        }
    }
}

/// Raw `xalloc` constraints, valid or not.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct XReq {
    align: u8,
    phase: u32,
    phase_valid: bool,
    nocross: u8,
    min: Option<u32>,
    max: Option<u32>,
    best: bool,
}

impl XReq {
    fn get(self, q: usize) -> Constraints {
        let align = match self.align {
            a @ 0..64 => 1usize << a,
            64..80 => 0,
            a => usize::from(a),
        };
        let phase = if self.phase_valid {
            ((self.phase as usize) * q) & align.max(q).wrapping_sub(1)
        } else {
            self.phase as usize
        };
        let nocross = if self.nocross < 64 { 1 << self.nocross } else { 0 };
        let shift = q.trailing_zeros();
        Constraints {
            align,
            phase,
            nocross,
            min_addr: self.min.map_or(0, |m| (m as usize) << shift),
            max_addr: self.max.map_or(usize::MAX, |m| (m as usize) << shift),
            policy: if self.best { Policy::BestFit } else { Policy::InstantFit },
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// `alloc` on the parent.
    Alloc { size: VSize, best: bool },
    /// `xalloc` on the parent.
    XAlloc { size: VSize, c: XReq },
    /// Frees a held range of the parent with `free` (or `xfree`).
    Free { slot: u8, x: bool },
    /// A free the parent must refuse: a held range with another size, a range freed
    /// before, or any address.
    BadFree { slot: u8, how: u8, addr: u32, size: VSize, x: bool },
    /// `add` on the parent.
    Add(SpanReq),
    /// `reap` on the parent or the child.
    Reap { child: bool },
    /// `alloc` (or `xalloc` with an alignment) on the child, which imports from the parent.
    ChildAlloc { size: VSize, align: u8, best: bool },
    /// Frees a held range of the child.
    ChildFree { slot: u8, x: bool },
    /// Splits a held range of the parent at `at` quanta (any value: 0, the size and
    /// beyond must be refused), or at `at` units off the quantum when `off` is set.
    Split { slot: u8, at: u16, off: bool },
    /// Joins a held range of the parent with the held range right after it, if there is
    /// one: done within one span, refused across two that touch.
    Join { slot: u8 },
}

/// The model of one arena: the ranges the caller holds, `base -> (rounded size, size asked)`.
#[derive(Default)]
struct Held(BTreeMap<usize, (usize, usize)>);

impl Held {
    fn units(&self) -> usize {
        self.0.values().map(|&(r, _)| r).sum()
    }

    fn overlaps(&self, base: usize, end: usize) -> bool {
        self.0.range(..end).next_back().is_some_and(|(&b, &(r, _))| b + r > base)
    }

    fn nth(&self, slot: u8) -> Option<(usize, usize, usize)> {
        if self.0.is_empty() {
            return None;
        }
        let (&b, &(r, s)) = self.0.iter().nth(usize::from(slot) % self.0.len())?;
        Some((b, r, s))
    }
}

/// Whether `constraints` are valid for `size` (rounded) units, by `Constraints`' doc.
fn valid(c: &Constraints, q: usize, size: usize) -> bool {
    let align = if c.align == 0 { q } else { c.align };
    if !align.is_power_of_two() {
        return false;
    }
    let align = align.max(q);
    let nocross_ok = c.nocross == 0 || (c.nocross.is_power_of_two() && c.nocross >= align && c.nocross >= size);
    c.phase % q == 0 && c.phase < align && nocross_ok && c.min_addr <= c.max_addr
}

/// Whether `addr .. addr + size` meets `c` (valid, as [`valid`]).
fn meets(c: &Constraints, q: usize, addr: usize, size: usize) -> bool {
    let align = if c.align == 0 { q } else { c.align }.max(q) as u128;
    let (a, s) = (addr as u128, size as u128);
    let nocross_ok = c.nocross == 0 || a / c.nocross as u128 == (a + s - 1) / c.nocross as u128;
    a % align == c.phase as u128 && nocross_ok && a >= c.min_addr as u128 && a + s <= c.max_addr as u128
}

/// Whether `size` units meeting `c` fit in the free gap `[lo, hi)`: the lowest aligned
/// candidate, and if it crosses a `nocross` boundary, the first candidate past it (in
/// wide arithmetic, so nothing overflows).
fn fits_in(c: &Constraints, q: usize, lo: usize, hi: usize, size: usize) -> bool {
    let align = if c.align == 0 { q } else { c.align }.max(q) as u128;
    let (lo, hi) = ((lo as u128).max(c.min_addr as u128), (hi as u128).min(c.max_addr as u128));
    let s = size as u128;
    let first_at = |x: u128| x + ((c.phase as u128).wrapping_sub(x) & (align - 1));
    let mut a = first_at(lo);
    if c.nocross != 0 {
        let nc = c.nocross as u128;
        if a / nc != (a + s - 1) / nc {
            a = first_at((a / nc + 1) * nc);
            if a / nc != (a + s - 1) / nc {
                return false;
            }
        }
    }
    a + s <= hi
}

struct Model {
    q: usize,
    spans: Vec<(usize, usize)>,
    held: Held,
    child_held: Held,
}

impl Model {
    /// Whether any gap of any span fits the request.
    fn any_fit(&self, c: &Constraints, size: usize) -> bool {
        self.spans.iter().any(|&(base, end)| {
            let mut lo = base;
            for (&b, &(r, _)) in self.held.0.range(base..end) {
                if fits_in(c, self.q, lo, b, size) {
                    return true;
                }
                lo = b + r;
            }
            fits_in(c, self.q, lo, end, size)
        })
    }

    /// Checks a fresh parent (or child) range: quantum, inside a span, no overlap.
    fn check_new(&self, addr: usize, size: usize, q: usize, what: &str) {
        assert_eq!(addr % q, 0, "{what}: {addr:#x} is not a multiple of the quantum {q:#x}");
        let end = addr.checked_add(size).unwrap_or_else(|| panic!("{what}: {addr:#x} + {size:#x} overflows"));
        assert!(
            self.spans.iter().any(|&(b, e)| b <= addr && end <= e),
            "{what}: [{addr:#x}, {end:#x}) is not inside one span of {:x?}",
            self.spans
        );
        assert!(!self.held.overlaps(addr, end), "{what}: [{addr:#x}, {end:#x}) overlaps a held parent range");
        assert!(!self.child_held.overlaps(addr, end), "{what}: [{addr:#x}, {end:#x}) overlaps a held child range");
    }
}

fn check_stats(parent: &Vmem, child: &Vmem, m: &Model) {
    let (p, c) = (parent.stats(), child.stats());
    let total: usize = m.spans.iter().map(|&(b, e)| e - b).sum();
    assert_eq!(p.total, total, "parent total");
    assert_eq!(p.in_use - p.qcached, m.held.units() + c.imported, "parent in_use - qcached");
    assert_eq!(p.free, p.total - p.in_use, "parent free");
    assert_eq!(c.total, c.imported, "child total");
    assert_eq!(c.in_use - c.qcached, m.child_held.units(), "child in_use - qcached");
    assert_eq!(c.free, c.total - c.in_use, "child free");
}

fn round(size: usize, q: usize) -> Result<usize, VmemError> {
    if size == 0 {
        return Err(VmemError::ZeroSize);
    }
    size.checked_next_multiple_of(q).ok_or(VmemError::Overflow)
}

/// Runs a parent allocation and checks it against the model.
/// `c` is `xalloc`'s constraints; without them, `alloc` with `policy`.
fn parent_alloc(parent: &Vmem, child: &Vmem, m: &mut Model, size: usize, c: Option<Constraints>, policy: Policy) {
    let q = m.q;
    let result = match &c {
        Some(c) => parent.xalloc(size, c),
        None => parent.alloc(size, policy),
    };
    let what = if c.is_some() { "xalloc" } else { "alloc" };
    let rounded = match round(size, q) {
        Ok(r) => r,
        Err(e) => return assert_eq!(result, Err(e), "{what}({size:#x})"),
    };
    let cons = c.unwrap_or_default();
    if c.is_some() && !valid(&cons, q, rounded) {
        return assert_eq!(result, Err(VmemError::BadConstraints), "{what}({size:#x}, {cons:?})");
    }
    match result {
        Ok(addr) => {
            m.check_new(addr, rounded, q, what);
            assert!(meets(&cons, q, addr, rounded), "{what}({size:#x}, {cons:?}) = {addr:#x}: constraints not met");
            m.held.0.insert(addr, (rounded, size));
        }
        Err(VmemError::Exhausted) => {
            // Sound either way round only while no child span hides in the parent.
            if child.stats().imported == 0 {
                assert!(!m.any_fit(&cons, rounded), "{what}({size:#x}, {cons:?}): Exhausted, but the model fits it");
            }
        }
        Err(e) => panic!("{what}({size:#x}, {cons:?}): {e:?}"),
    }
}

fuzz_target!(|input: Input| {
    let q_shift = u32::from(input.quantum_shift % 13);
    let q = 1usize << q_shift;
    let qcache_max = usize::from(input.qcache_quanta % 20) * q;
    let cq = 1usize << (input.child_quantum_shift % 15);
    let (base, size) = input.first_span.get(q_shift);
    let mut builder = Vmem::builder("fuzz-parent").quantum(q).qcache_max(qcache_max).checking(true);
    if size > 0 {
        builder = builder.span(base, size);
    }
    let built = builder.build();
    let Ok(parent) = built else {
        // Only a bad first span may fail the build.
        let e = built.err();
        let bad = base % q != 0 || size % q != 0 || base.checked_add(size).is_none();
        assert!(bad && matches!(e, Some(VmemError::BadConstraints | VmemError::Overflow)), "build: {e:?}");
        return;
    };
    let mut m = Model { q, spans: Vec::new(), held: Held::default(), child_held: Held::default() };
    if size > 0 {
        m.spans.push((base, base + size));
    }
    let child_qcache = usize::from(input.child_qcache_quanta % 20) * cq;
    let child = Vmem::builder("fuzz-child")
        .quantum(cq)
        .qcache_max(child_qcache)
        .checking(true)
        .source(&parent)
        .build()
        .unwrap();
    let mut freed: Vec<(usize, usize)> = Vec::new();

    for op in input.ops.into_iter().take(256) {
        match op {
            Op::Alloc { size, best } => {
                if m.held.0.len() >= MAX_LIVE {
                    continue;
                }
                let policy = if best { Policy::BestFit } else { Policy::InstantFit };
                parent_alloc(&parent, &child, &mut m, size.get(q, qcache_max), None, policy);
            }
            Op::XAlloc { size, c } => {
                if m.held.0.len() < MAX_LIVE {
                    let (size, c) = (size.get(q, qcache_max), c.get(q));
                    parent_alloc(&parent, &child, &mut m, size, Some(c), c.policy);
                }
            }
            Op::Free { slot, x } => {
                if let Some((b, _, asked)) = m.held.nth(slot) {
                    let r = if x { parent.xfree(b, asked) } else { parent.free(b, asked) };
                    assert_eq!(r, Ok(()), "free({b:#x}, {asked:#x})");
                    m.held.0.remove(&b);
                    freed.push((b, asked));
                    if freed.len() > 16 {
                        freed.remove(0);
                    }
                }
            }
            Op::BadFree { slot, how, addr, size, x } => {
                // A span the child imported is a parent allocation the model cannot
                // see: a "bad" free could hit it, so only while there is none.
                if child.stats().imported != 0 {
                    continue;
                }
                let (addr, size) = match how % 3 {
                    0 => match m.held.nth(slot) {
                        Some((b, r, _)) => (b, r + q),
                        None => continue,
                    },
                    1 => match freed.get(usize::from(slot) % freed.len().max(1)) {
                        Some(&(b, s)) if !m.held.0.contains_key(&b) => (b, s),
                        _ => continue,
                    },
                    _ => ((addr as usize) << q_shift, size.get(q, qcache_max)),
                };
                let before = parent.stats();
                let r = if x { parent.xfree(addr, size) } else { parent.free(addr, size) };
                match m.held.0.get(&addr) {
                    Some(&(held, asked)) if round(size, q) == Ok(held) => {
                        // A valid free after all (the fuzzer named a held range).
                        assert_eq!(r, Ok(()), "free({addr:#x}, {size:#x})");
                        m.held.0.remove(&addr);
                        freed.push((addr, asked));
                    }
                    _ => {
                        let expected = match round(size, q) {
                            Err(e) => vec![e],
                            Ok(_) => vec![VmemError::NotAllocated, VmemError::WrongSize],
                        };
                        assert!(
                            r.is_err_and(|e| expected.contains(&e)),
                            "bad free({addr:#x}, {size:#x}): {r:?}, expected one of {expected:?}"
                        );
                        let after = parent.stats();
                        assert_eq!((before.in_use, before.free), (after.in_use, after.free), "a refused free");
                    }
                }
            }
            Op::Add(req) => {
                if m.spans.len() >= MAX_SPANS {
                    continue;
                }
                let (base, size) = req.get(q_shift);
                let r = parent.add(base, size);
                let end = base.checked_add(size);
                let mut expected = Vec::new();
                if size == 0 {
                    expected.push(VmemError::ZeroSize);
                }
                if base % q != 0 || size % q != 0 {
                    expected.push(VmemError::BadConstraints);
                }
                match end {
                    None => expected.push(VmemError::Overflow),
                    Some(end) if m.spans.iter().any(|&(b, e)| b < end && base < e) => expected.push(VmemError::Overlap),
                    Some(_) => {}
                }
                match r {
                    Ok(()) => {
                        assert!(expected.is_empty(), "add({base:#x}, {size:#x}) succeeded, expected {expected:?}");
                        m.spans.push((base, base + size));
                    }
                    Err(e) => assert!(expected.contains(&e), "add({base:#x}, {size:#x}): {e:?}, expected {expected:?}"),
                }
            }
            Op::Reap { child: c } => {
                if c {
                    child.reap();
                } else {
                    parent.reap();
                }
            }
            Op::ChildAlloc { size, align, best } => {
                if m.child_held.0.len() >= MAX_LIVE {
                    continue;
                }
                let size = size.get(cq, child_qcache);
                let policy = if best { Policy::BestFit } else { Policy::InstantFit };
                let align = if align < 24 { 1usize << align } else { 0 };
                let r = if align == 0 {
                    child.alloc(size, policy)
                } else {
                    child.xalloc(size, &Constraints { align, policy, ..Constraints::default() })
                };
                let rounded = match round(size, cq) {
                    Ok(r) => r,
                    Err(e) => {
                        assert_eq!(r, Err(e), "child alloc({size:#x})");
                        continue;
                    }
                };
                match r {
                    Ok(addr) => {
                        m.check_new(addr, rounded, cq, "child alloc");
                        assert_eq!(addr % align.max(1), 0, "child xalloc: {addr:#x} not aligned to {align:#x}");
                        m.child_held.0.insert(addr, (rounded, size));
                    }
                    // The parent could not give it a span (or the span arithmetic overflows).
                    Err(VmemError::Exhausted | VmemError::Overflow) => {}
                    Err(e) => panic!("child alloc({size:#x}, align {align:#x}): {e:?}"),
                }
            }
            Op::Split { slot, at, off } => {
                let Some((b, r, asked)) = m.held.nth(slot) else { continue };
                let head = if off { usize::from(at) } else { usize::from(at) << q_shift };
                let before = parent.stats();
                let result = parent.split(b, asked, head);
                if head == 0 || head >= r || head % q != 0 {
                    assert_eq!(result, Err(VmemError::BadConstraints), "split({b:#x}, {asked:#x}, {head:#x})");
                    let after = parent.stats();
                    assert_eq!(
                        (before.in_use, before.allocated_segments),
                        (after.in_use, after.allocated_segments),
                        "a refused split"
                    );
                } else {
                    assert_eq!(result, Ok(()), "split({b:#x}, {asked:#x}, {head:#x})");
                    m.held.0.insert(b, (head, head));
                    m.held.0.insert(b + head, (r - head, r - head));
                }
            }
            Op::Join { slot } => {
                let Some((b, r, asked)) = m.held.nth(slot) else { continue };
                let Some(&(nr, nasked)) = m.held.0.get(&(b + r)) else { continue };
                let one_span = m.spans.iter().any(|&(base, end)| base <= b && b + r + nr <= end);
                let before = parent.stats();
                let result = parent.join(b, asked, nasked);
                let after = parent.stats();
                assert_eq!((before.in_use, before.free), (after.in_use, after.free), "a join moves no unit");
                if one_span {
                    assert_eq!(result, Ok(()), "join({b:#x}, {asked:#x}, {nasked:#x})");
                    m.held.0.remove(&(b + r));
                    m.held.0.insert(b, (r + nr, r + nr));
                } else {
                    assert_eq!(result, Err(VmemError::NotAdjacent), "join({b:#x}, {asked:#x}, {nasked:#x})");
                    assert_eq!(before.allocated_segments, after.allocated_segments, "a refused join");
                }
            }
            Op::ChildFree { slot, x } => {
                if let Some((b, _, asked)) = m.child_held.nth(slot) {
                    let r = if x { child.xfree(b, asked) } else { child.free(b, asked) };
                    assert_eq!(r, Ok(()), "child free({b:#x}, {asked:#x})");
                    m.child_held.0.remove(&b);
                }
            }
        }
        parent.assert_valid();
        child.assert_valid();
        check_stats(&parent, &child, &m);
    }

    // Everything back: the child returns each span it imported, and each parent span is
    // one free segment again.
    for (&b, &(_, asked)) in &m.child_held.0 {
        assert_eq!(child.free(b, asked), Ok(()), "final child free({b:#x}, {asked:#x})");
    }
    m.child_held.0.clear();
    child.reap();
    child.assert_valid();
    assert_eq!(child.stats().imported, 0, "the child kept an imported span");
    for (&b, &(_, asked)) in &m.held.0 {
        assert_eq!(parent.free(b, asked), Ok(()), "final free({b:#x}, {asked:#x})");
    }
    m.held.0.clear();
    parent.reap();
    parent.assert_valid();
    let s = parent.stats();
    assert_eq!((s.in_use, s.free, s.qcached), (0, s.total, 0), "parent after freeing everything");
    assert_eq!((s.spans, s.segments), (m.spans.len(), 2 * m.spans.len()), "parent spans and segments");
    drop(child);
});
