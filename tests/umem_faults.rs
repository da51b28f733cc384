//! Fault injection over the whole allocator (issue 9): the OS layer refuses maps after a
//! budget of N, or at random, while `scalemem::umem::global` serves mixed small and large
//! requests. Every request then either succeeds with a usable block or fails cleanly
//! (null, the old block of a failed `realloc` intact), the heap's invariants hold, every
//! block can be freed, and allocation works again once maps are allowed.
//!
//! The heap is one per process and `assert_valid` wants it quiescent, so this binary
//! holds one test that runs the phases in order (the global allocator here is `System`).

#![cfg(not(scalemem_loom))]

use scalemem::umem::global::{self as umem, assert_valid};
use scalemem::umem::os::testing;

/// Bytes held at most in one round: far more than the heap caches, so a round that
/// holds its blocks needs new maps and meets the refusal.
const HOLD_LIMIT: usize = 512 << 20;

/// The size of request `i`: mostly small-class sizes, every fourth a large block.
fn size_of_request(i: usize, salt: usize) -> usize {
    let x = (i.wrapping_mul(0x9e37_79b9) ^ salt.wrapping_mul(0x85eb_ca6b)) >> 3;
    if i.is_multiple_of(4) { (256 << 10) + (x % (4 << 20)) } else { 1 + x % (64 << 10) }
}

/// Writes a tag into the first, middle and last bytes of a block (a block's other pages
/// are never touched, so rounds stay cheap).
fn mark(p: *mut u8, len: usize, tag: u8) {
    for at in [0, len / 2, len - 1] {
        // SAFETY: `at < len`, inside the block.
        unsafe { p.add(at).write(tag) };
    }
}

fn assert_marked(p: *const u8, len: usize, tag: u8) {
    for at in [0, len / 2, len - 1] {
        // SAFETY: `at < len`, inside the block.
        assert_eq!(unsafe { p.add(at).read() }, tag, "block {p:?} of {len} bytes lost its contents at {at}");
    }
}

/// A live block: address, requested length, tag.
type Block = (*mut u8, usize, u8);

fn free_all(held: &mut Vec<Block>) {
    for (p, len, tag) in held.drain(..) {
        assert_marked(p, len, tag);
        // SAFETY: from this heap, freed once.
        unsafe { umem::free(p) };
    }
}

/// Allocates every size again with maps allowed: the heap has recovered.
fn assert_recovered(salt: usize) {
    let mut held = Vec::new();
    for i in 0..64 {
        let len = size_of_request(i, salt);
        let p = umem::malloc(len);
        assert!(!p.is_null(), "{len} bytes refused with maps allowed");
        mark(p, len, i as u8);
        held.push((p, len, i as u8));
    }
    free_all(&mut held);
}

#[test]
fn refused_maps_fail_cleanly_and_recover() {
    // Before the heap exists: making it needs maps, so every request fails, and the
    // failure is not remembered.
    testing::fail_maps_after(0);
    assert!(umem::malloc(64).is_null());
    assert!(umem::calloc(4, 16).is_null());
    assert!(umem::aligned_alloc(4096, 100).is_null());
    assert!(umem::malloc(8 << 20).is_null());
    testing::allow_maps();
    assert_recovered(0);
    assert_valid();

    // A budget of N maps, then none: hold blocks until the heap needs more than it has.
    let mut refusals = 0;
    for budget in 0..16 {
        testing::fail_maps_after(budget);
        let (mut held, mut bytes, mut nulls) = (Vec::new(), 0usize, 0);
        let mut i = 0;
        while bytes < HOLD_LIMIT && nulls < 64 {
            let len = size_of_request(i, budget);
            let tag = (i % 251) as u8;
            let p = if i % 3 == 0 { umem::calloc(1, len) } else { umem::malloc(len) };
            if p.is_null() {
                nulls += 1;
            } else {
                if i % 3 == 0 {
                    // SAFETY: `len` bytes from calloc.
                    let edges = unsafe { [*p, *p.add(len - 1)] };
                    assert_eq!(edges, [0, 0], "calloc gave dirty memory");
                }
                mark(p, len, tag);
                held.push((p, len, tag));
                bytes += len;
            }
            i += 1;
        }
        assert!(nulls > 0, "budget {budget}: {bytes} bytes held without a refusal");
        refusals += nulls;
        // A failed realloc leaves its block as it was.
        if let Some(&(p, len, tag)) = held.iter().find(|b| b.1 > 1 << 20) {
            // SAFETY: a live block of this heap.
            assert!(unsafe { umem::realloc(p, 1 << 30) }.is_null());
            assert_marked(p, len, tag);
        }
        assert_valid();
        free_all(&mut held);
        assert_valid();
        testing::allow_maps();
        assert_recovered(budget);
        assert_valid();
    }
    assert!(refusals >= 16);

    // Random refusals (one map in three) under a mix of malloc, calloc, realloc and free.
    for seed in 1..=4u64 {
        testing::fail_maps_randomly(seed, 3);
        let mut held: Vec<Block> = Vec::new();
        let (mut ok, mut refused) = (0, 0);
        let mut x = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        for i in 0..3_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = size_of_request(i, x as usize);
            let tag = (x >> 40) as u8;
            match x % 8 {
                0..=3 => {
                    let p = umem::malloc(len);
                    if p.is_null() {
                        refused += 1;
                    } else {
                        ok += 1;
                        mark(p, len, tag);
                        held.push((p, len, tag));
                    }
                }
                4 => {
                    let p = umem::calloc(len, 1);
                    if p.is_null() {
                        refused += 1;
                    } else {
                        ok += 1;
                        // SAFETY: `len` bytes from calloc.
                        assert_eq!(unsafe { [*p, *p.add(len / 2), *p.add(len - 1)] }, [0, 0, 0]);
                        mark(p, len, tag);
                        held.push((p, len, tag));
                    }
                }
                5 if !held.is_empty() => {
                    let k = (x >> 20) as usize % held.len();
                    let (p, old, old_tag) = held[k];
                    // SAFETY: a live block of this heap.
                    let q = unsafe { umem::realloc(p, len) };
                    if q.is_null() {
                        refused += 1;
                        assert_marked(p, old, old_tag);
                    } else {
                        ok += 1;
                        // SAFETY: the kept prefix is min(old, len) bytes.
                        assert_eq!(unsafe { *q }, old_tag, "realloc lost the first byte");
                        mark(q, len, tag);
                        held[k] = (q, len, tag);
                    }
                }
                _ if !held.is_empty() => {
                    let (p, len, tag) = held.swap_remove((x >> 20) as usize % held.len());
                    assert_marked(p, len, tag);
                    // SAFETY: from this heap, freed once.
                    unsafe { umem::free(p) };
                }
                _ => {}
            }
            if held.iter().map(|b| b.1).sum::<usize>() > HOLD_LIMIT {
                free_all(&mut held);
            }
        }
        testing::allow_maps();
        assert!(ok > 0 && refused > 0, "seed {seed}: {ok} served, {refused} refused");
        assert_valid();
        free_all(&mut held);
        assert_valid();
        assert_recovered(seed as usize);
    }
    umem::trim();
    assert_valid();
}
