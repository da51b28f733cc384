//! A size class of page-sized blocks keeps one external slab header per block (each
//! slab holds one object); once its blocks are freed and the class decays, the pages of
//! those headers go back to the kernel (`SlabCache::shrink`). They used to stay mapped
//! and resident for good: after the footprint workload freed 256 MiB of 4 KiB blocks,
//! 10 MiB of headers were most of what the process kept. A binary of its own: the class
//! must see no other user.

mod common;

use scalemem::umem::global;

const PAGE: usize = 4096;
const BLOCKS: usize = 4096;

#[test]
fn a_decayed_class_gives_back_its_slab_header_pages() {
    let blocks = common::global_blocks(BLOCKS, PAGE);
    let live = global::class_stats(PAGE).unwrap();
    // One header per block (one object per slab), about 25 to a page.
    assert!(live.header_bytes >= BLOCKS / 26 * PAGE, "{live:?}");
    for p in blocks {
        // SAFETY: from `malloc`, freed once.
        unsafe { global::free(p as *mut u8) };
    }
    // The working-set updates: the idle class decays (its magazines drained, its slabs
    // and then its idle header pages given back).
    let mut left = live.header_bytes;
    for _ in 0..40 {
        global::maintain();
        left = global::class_stats(PAGE).unwrap().header_bytes;
        if left == 0 {
            break;
        }
    }
    let s = global::class_stats(PAGE).unwrap();
    assert_eq!((left, s.in_use, s.slabs), (0, 0, 0), "{s:?}");
}
