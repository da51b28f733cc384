//! `alloc_api`: sequences of calls to umem's process-wide heap through all three of its
//! interfaces on [`scalemem::Umem`] and `scalemem::umem::global` — `GlobalAlloc`
//! (`alloc`, `alloc_zeroed`, `realloc`, `dealloc`), `allocator_api2`'s `Allocator`
//! (`allocate`, `allocate_zeroed`, `grow`, `shrink` with a changing alignment,
//! `deallocate`) and the C family (`malloc`, `calloc`, `aligned_alloc`, `realloc`,
//! `free`, `usable_size`, `trim`, `maintain`, `stats`) — with sizes and alignments from
//! the fuzzer, edge cases and absurd values included.
//!
//! Checked after every call:
//! - a block is aligned as asked (at least 16 for the C family), `usable_size` is at
//!   least its size, and it holds its fill pattern (derived from a per-block tag) until
//!   it is resized or freed: so no two live blocks overlap, nothing writes into a live
//!   block, and a resize keeps the prefix;
//! - zeroed blocks (`alloc_zeroed`, `allocate_zeroed`, `calloc`) read zero;
//! - null (or `AllocError`) only for an impossible request: an alignment that is not a
//!   power of two, or a size of 2^48 or more (more than the address space); a plausible
//!   request (up to 4 MiB, aligned up to 1 GiB) always succeeds, and a failed resize
//!   leaves the old block intact;
//! - the heap's `stats` count at least the live bytes.
//!
//! A block made through the Rust interfaces may be freed or resized through the C ones
//! (the module's contract allows it); a C block is only ever given back to the C ones.
//! At most 64 blocks and 64 MiB are live at once: a possible request past that is
//! skipped. Everything is freed at the end of each input.

#![no_main]

mod common;

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use arbitrary::Arbitrary;
use common::{Align, IMPOSSIBLE, MAX_BYTES, MAX_LIVE, RawAlign, Size};
use libfuzzer_sys::fuzz_target;
use scalemem::Umem;
use scalemem::umem::global;

/// How a block is resized.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Resize {
    /// `GlobalAlloc::realloc` (a Rust block, same alignment, new size not 0).
    Global,
    /// `Allocator::grow` or `shrink`, whichever the sizes call for, to a new alignment.
    Allocator,
    /// C `realloc` (any block; size 0 frees).
    C,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// `GlobalAlloc::alloc` or `alloc_zeroed` (a size of 0 is made 1: `GlobalAlloc`
    /// forbids zero-sized layouts).
    Global { size: Size, align: Align, zeroed: bool },
    /// `Allocator::allocate` or `allocate_zeroed` (zero sizes allowed).
    Allocate { size: Size, align: Align, zeroed: bool },
    /// C `malloc`.
    Malloc { size: Size },
    /// C `calloc` (`n * size` may overflow).
    Calloc { n: Size, size: Size },
    /// C `aligned_alloc`, with any alignment.
    AlignedAlloc { align: RawAlign, size: Size },
    /// Resizes the live block `slot % live`.
    Resize { slot: u8, size: Size, align: Align, how: Resize },
    /// Frees the live block `slot % live`, through C `free` if `c` (else by its layout).
    Free { slot: u8, c: bool },
    /// `usable_size` of a live block (checked against its size).
    UsableSize { slot: u8 },
    /// `global::trim`, then every live block is checked.
    Trim,
    /// `global::maintain`, then every live block is checked.
    Maintain,
    /// `global::stats`, checked against the live bytes.
    Stats,
}

/// Who may free a block: the Rust interfaces need its layout.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// From `GlobalAlloc` or `Allocator` with this alignment (and the block's size).
    Rust { align: usize },
    /// From the C family: freed and resized only through it.
    C,
}

#[derive(Debug)]
struct Block {
    ptr: *mut u8,
    size: usize,
    kind: Kind,
    tag: u8,
}

impl Block {
    fn check(&self, what: &str) {
        // SAFETY: a live block of `size` bytes.
        unsafe { common::check(self.ptr, self.size, self.size, self.tag, what) };
    }

    fn layout(&self) -> Option<Layout> {
        match self.kind {
            Kind::Rust { align } => Some(Layout::from_size_align(self.size, align).expect("a live block's layout")),
            Kind::C => None,
        }
    }
}

struct State {
    live: Vec<Block>,
    bytes: usize,
    next_tag: u8,
}

/// Whether a request must succeed: small enough for any machine.
fn plausible(size: usize, align: usize) -> bool {
    size <= 4 << 20 && align <= 1 << 30
}

impl State {
    /// Whether a possible request for `size` more bytes is to be skipped (the bounds).
    fn too_big(&self, size: usize) -> bool {
        size < IMPOSSIBLE && (self.live.len() >= MAX_LIVE || size > MAX_BYTES - self.bytes)
    }

    /// Checks a fresh block (`zeroed`: it reads zero), fills it and records it.
    fn add(&mut self, ptr: *mut u8, size: usize, align: usize, kind: Kind, zeroed: bool, what: &str) {
        assert!(!ptr.is_null());
        assert_eq!(ptr as usize % align, 0, "{what}: {ptr:?} is not aligned to {align}");
        // SAFETY: a live block of ours (just made).
        let usable = unsafe { global::usable_size(ptr) };
        assert!(usable >= size, "{what}: usable_size {usable} < {size}");
        if zeroed {
            // SAFETY: `size` readable bytes.
            unsafe { common::check_zero(ptr, size, what) };
        }
        self.next_tag = self.next_tag.wrapping_add(101);
        let tag = self.next_tag;
        // SAFETY: `size` writable bytes.
        unsafe { common::fill(ptr, size, tag) };
        self.bytes += size;
        self.live.push(Block { ptr, size, kind, tag });
    }

    fn take(&mut self, slot: u8) -> Option<Block> {
        if self.live.is_empty() {
            return None;
        }
        let b = self.live.swap_remove(usize::from(slot) % self.live.len());
        self.bytes -= b.size;
        Some(b)
    }

    fn put_back(&mut self, b: Block) {
        self.bytes += b.size;
        self.live.push(b);
    }

    fn free(&mut self, b: Block, c: bool) {
        b.check("before free");
        match b.layout() {
            Some(layout) if !c => {
                if layout.size() == 0 {
                    // SAFETY: from `Allocator::allocate` with this layout, freed once.
                    unsafe { Umem.deallocate(NonNull::new(b.ptr).expect("live"), layout) };
                } else {
                    // SAFETY: from this allocator with this layout, freed once.
                    unsafe { Umem.dealloc(b.ptr, layout) };
                }
            }
            // SAFETY: a live block of this module (any interface), freed once.
            _ => unsafe { global::free(b.ptr) },
        }
    }

    fn resize(&mut self, b: Block, size: usize, align: usize, how: Resize) {
        b.check("before resize");
        let how = match (how, b.kind) {
            (Resize::Global | Resize::Allocator, Kind::C) => Resize::C,
            (Resize::Global, _) if size == 0 => Resize::C,
            _ => how,
        };
        let new_align = match how {
            Resize::Global => b.layout().map_or(16, |l| l.align()),
            Resize::Allocator => align,
            Resize::C => 16,
        };
        if size > b.size && self.too_big(size) {
            return self.put_back(b);
        }
        let (ptr, kind) = match how {
            Resize::Global => {
                let old = b.layout().expect("a Rust block");
                if Layout::from_size_align(size, old.align()).is_err() {
                    return self.put_back(b);
                }
                // SAFETY: a live block of this layout; `size` is not 0 and makes a valid
                // layout with the same alignment.
                (unsafe { Umem.realloc(b.ptr, old, size) }, b.kind)
            }
            Resize::Allocator => {
                let old = b.layout().expect("a Rust block");
                let Ok(new) = Layout::from_size_align(size, align) else { return self.put_back(b) };
                let nn = NonNull::new(b.ptr).expect("live");
                // SAFETY: a live block of layout `old`; grow for a size at least the old
                // one, shrink for one at most it, as the trait requires.
                let r = unsafe { if size >= b.size { Umem.grow(nn, old, new) } else { Umem.shrink(nn, old, new) } };
                match r {
                    Ok(s) => {
                        assert_eq!(s.len(), size, "Allocator resize: slice length");
                        (s.as_ptr().cast::<u8>(), Kind::Rust { align })
                    }
                    Err(_) => (core::ptr::null_mut(), b.kind),
                }
            }
            Resize::C => {
                // SAFETY: a live block of this module (any interface).
                let p = unsafe { global::realloc(b.ptr, size) };
                if size == 0 {
                    assert!(p.is_null(), "realloc(p, 0) frees and returns null");
                    return;
                }
                (p, Kind::C)
            }
        };
        if ptr.is_null() {
            assert!(!plausible(size, new_align), "{how:?} resize of {} bytes to {size} failed", b.size);
            b.check("after a failed resize");
            return self.put_back(b);
        }
        assert!(size < IMPOSSIBLE, "{how:?} resize to {size} bytes succeeded");
        // SAFETY: the new block holds `min(old, new)` bytes of the old content.
        unsafe { common::check(ptr, b.size, b.size.min(size), b.tag, "after resize") };
        self.add(ptr, size, new_align, kind, false, "resize");
    }

    fn check_all(&self, what: &str) {
        for b in &self.live {
            b.check(what);
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut st = State { live: Vec::new(), bytes: 0, next_tag: 0 };
    for op in ops.into_iter().take(512) {
        match op {
            Op::Global { size, align, zeroed } => {
                let (size, align) = (size.get().max(1), align.get());
                let Ok(layout) = Layout::from_size_align(size, align) else { continue };
                if st.too_big(size) {
                    continue;
                }
                // SAFETY: a layout of non-zero size.
                let p = unsafe { if zeroed { Umem.alloc_zeroed(layout) } else { Umem.alloc(layout) } };
                if p.is_null() {
                    assert!(!plausible(size, align), "GlobalAlloc::alloc({layout:?}) failed");
                    continue;
                }
                assert!(size < IMPOSSIBLE, "GlobalAlloc::alloc({layout:?}) succeeded");
                st.add(p, size, align, Kind::Rust { align }, zeroed, "GlobalAlloc::alloc");
            }
            Op::Allocate { size, align, zeroed } => {
                let (size, align) = (size.get(), align.get());
                let Ok(layout) = Layout::from_size_align(size, align) else { continue };
                if st.too_big(size) {
                    continue;
                }
                let r = if zeroed { Umem.allocate_zeroed(layout) } else { Umem.allocate(layout) };
                match r {
                    Ok(s) => {
                        assert!(size < IMPOSSIBLE, "Allocator::allocate({layout:?}) succeeded");
                        assert_eq!(s.len(), size, "Allocator::allocate: slice length");
                        st.add(s.as_ptr().cast(), size, align, Kind::Rust { align }, zeroed, "Allocator::allocate");
                    }
                    Err(_) => assert!(!plausible(size, align), "Allocator::allocate({layout:?}) failed"),
                }
            }
            Op::Malloc { size } => {
                let size = size.get();
                if st.too_big(size) {
                    continue;
                }
                let p = global::malloc(size);
                if p.is_null() {
                    assert!(!plausible(size, 16), "malloc({size}) failed");
                    continue;
                }
                assert!(size < IMPOSSIBLE, "malloc({size}) succeeded");
                st.add(p, size, 16, Kind::C, false, "malloc");
            }
            Op::Calloc { n, size } => {
                let (n, size) = (n.get(), size.get());
                let total = n.checked_mul(size);
                if total.is_some_and(|t| st.too_big(t)) {
                    continue;
                }
                let p = global::calloc(n, size);
                let Some(total) = total else {
                    assert!(p.is_null(), "calloc({n}, {size}) overflows, yet succeeded");
                    continue;
                };
                if p.is_null() {
                    assert!(!plausible(total, 16), "calloc({n}, {size}) failed");
                    continue;
                }
                assert!(total < IMPOSSIBLE, "calloc({n}, {size}) succeeded");
                st.add(p, total, 16, Kind::C, true, "calloc");
            }
            Op::AlignedAlloc { align, size } => {
                let (align, size) = (align.get(), size.get());
                if st.too_big(size) {
                    continue;
                }
                let p = global::aligned_alloc(align, size);
                if !align.is_power_of_two() {
                    assert!(p.is_null(), "aligned_alloc({align}, {size}): not a power of two, yet succeeded");
                    continue;
                }
                if p.is_null() {
                    assert!(!plausible(size, align), "aligned_alloc({align}, {size}) failed");
                    continue;
                }
                assert!(size < IMPOSSIBLE, "aligned_alloc({align}, {size}) succeeded");
                st.add(p, size, align.max(16), Kind::C, false, "aligned_alloc");
            }
            Op::Resize { slot, size, align, how } => {
                if let Some(b) = st.take(slot) {
                    st.resize(b, size.get(), align.get(), how);
                }
            }
            Op::Free { slot, c } => {
                if let Some(b) = st.take(slot) {
                    st.free(b, c);
                }
            }
            Op::UsableSize { slot } => {
                if let Some(b) = st.live.get(usize::from(slot) % st.live.len().max(1)) {
                    // SAFETY: a live block of ours.
                    let usable = unsafe { global::usable_size(b.ptr) };
                    assert!(usable >= b.size, "usable_size {usable} < {}", b.size);
                }
            }
            Op::Trim => {
                global::trim();
                st.check_all("after trim");
            }
            Op::Maintain => {
                global::maintain();
                st.check_all("after maintain");
            }
            Op::Stats => {
                let s = global::stats();
                assert!(s.in_use >= st.bytes, "stats: in_use {} < the {} live bytes", s.in_use, st.bytes);
                assert!(s.mapped >= s.in_use, "stats: mapped {} < in_use {}", s.mapped, s.in_use);
            }
        }
    }
    while let Some(b) = st.take(0) {
        st.free(b, false);
    }
});
