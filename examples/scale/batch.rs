//! The batch workload (BENCHMARKING.md workload 1), shared by the scaling runner's `alloc`
//! group, which calls each allocator's `GlobalAlloc` impl directly, and the `global_*`
//! examples, which install one allocator as the process's `#[global_allocator]` and go
//! through `std::alloc`.
//!
//! One operation is one loop: allocate [`BLOCKS`] blocks of one layout, touching each (its
//! first byte, and one byte in every further 4 KiB page it spans), then free them in
//! allocation order. The blocks' pointers go into a `Vec` made once per thread, outside
//! the timed part.

use std::alloc::{GlobalAlloc, Layout, handle_alloc_error};

/// Blocks per batch loop.
pub const BLOCKS: usize = 100;
/// The page the batch workload touches one byte of.
const PAGE: usize = 4096;

/// Writes the first byte of the block at `block` and one byte in every further 4 KiB
/// page the block spans.
///
/// # Safety
///
/// `block` is a live allocation of at least `size` bytes, `size > 0`.
unsafe fn touch(block: *mut u8, size: usize) {
    // SAFETY: offset 0 is inside the block (caller: size > 0). Volatile, so that the
    // compiler keeps writes to memory it can see freed right after.
    unsafe { block.write_volatile(1) };
    let mut offset = PAGE - block.addr() % PAGE;
    while offset < size {
        // SAFETY: offset < size, inside the block (caller).
        unsafe { block.add(offset).write_volatile(1) };
        offset += PAGE;
    }
}

/// A thread's batch operation over `alloc` with `layout` (nonzero size): its `Vec` is
/// made here, through the process's global allocator. A failed allocation ends the run
/// through `handle_alloc_error`.
pub fn op<A: GlobalAlloc>(alloc: &A, layout: Layout) -> impl FnMut() + '_ {
    assert!(layout.size() > 0, "the batch workload allocates nonzero sizes");
    let size = layout.size();
    let mut blocks: Vec<*mut u8> = Vec::with_capacity(BLOCKS);
    move || {
        for _ in 0..BLOCKS {
            // SAFETY: `layout` has a nonzero size (asserted above).
            let block = unsafe { alloc.alloc(layout) };
            if block.is_null() {
                handle_alloc_error(layout);
            }
            // SAFETY: a live block of `size` bytes, just allocated.
            unsafe { touch(block, size) };
            blocks.push(block);
        }
        for block in blocks.drain(..) {
            // SAFETY: allocated above by `alloc` with `layout`, freed once.
            unsafe { alloc.dealloc(block, layout) };
        }
    }
}
