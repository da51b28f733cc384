//! A counting global allocator: forwards every call to `System` and counts, per thread,
//! the calls that allocate (`alloc`, `alloc_zeroed` and `realloc`). A test binary installs
//! it with `#[global_allocator] static GLOBAL: Counting = Counting;` and reads it through
//! [`allocations_in`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// The counting allocator.
pub struct Counting;

// SAFETY: forwards every call to `System` unchanged; counting touches only a const,
// destructor-free thread-local (no allocation, no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract is System's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations made by `f` on this thread (only meaningful where [`Counting`] is the
/// global allocator).
pub fn allocations_in(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}
