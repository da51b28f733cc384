//! Tests of umem's os, region and slab layers: geometry, a seeded random model of several
//! caches, pointer lookup (base, interior, foreign), colouring, the region lifecycle
//! driven by hand-ticked Refcache epochs (release after two epochs at zero, revival,
//! pages given back), fault injection, checking mode, a 16-thread stress with
//! cross-thread frees, and no global allocation on alloc/free.

mod common;

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Barrier, Mutex};

use common::counting_alloc::{Counting, allocations_in};
use scalemem::refcount::Config;
use scalemem::umem::os::testing;
use scalemem::umem::region::{HEADER_PAGES, PAGE, REGION_SIZE, Regions};
use scalemem::umem::slab::{FreeError, MAX_SIZE, SMALL_MAX, SlabCache};

/// Objects in flight between threads: (cache index, address, stamp).
type Mailbox = Mutex<Vec<(usize, usize, u64)>>;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// xorshift64*: a seeded PRNG, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn manual(retain: usize) -> Regions {
    Regions::builder().refcache(Config::manual()).retain(retain).build().unwrap()
}

/// Fills an object with a pattern derived from `tag`.
fn fill(p: NonNull<u8>, size: usize, tag: u64) {
    // SAFETY: the object is ours, `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), size) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (tag as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
}

/// Checks the pattern written by `fill`.
fn check(p: NonNull<u8>, size: usize, tag: u64) {
    // SAFETY: the object is ours, `size` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
    for (i, &b) in bytes.iter().enumerate() {
        assert_eq!(b, (tag as usize).wrapping_mul(31).wrapping_add(i) as u8, "object {tag} corrupted at byte {i}");
    }
}

/// Ticks until `done` holds (at most `max` ticks); returns the ticks taken.
fn tick_until(regions: &Regions, max: usize, done: impl Fn(&Regions) -> bool) -> usize {
    for ticks in 0..=max {
        if done(regions) {
            return ticks;
        }
        regions.tick();
    }
    panic!("condition not reached in {max} ticks: {:?}", regions.stats());
}

/// `n` one-page objects of `cache` (a cache of page-sized objects), each written with
/// `tag` so that it is resident, in address order.
fn written_pages(cache: &SlabCache<'_>, n: usize, tag: u64) -> Vec<NonNull<u8>> {
    let mut pages: Vec<_> = (0..n).map(|_| cache.alloc().unwrap()).collect();
    pages.sort_by_key(|p| p.as_ptr() as usize);
    for &p in &pages {
        fill(p, PAGE, tag);
    }
    pages
}

/// Ticks `regions` until its one region (at `region`, emptied by the caller) is
/// released, then checks that it was retained, that `returned` bytes went back in all
/// (`what` says why), and that no page past its header is resident.
fn released_and_retained(regions: &Regions, region: usize, returned: usize, what: &str) {
    let ticks = tick_until(regions, 8, |r| r.stats().releases == 1);
    assert!(ticks <= 6, "release took {ticks} ticks");
    let st = regions.stats();
    assert_eq!(st.retained_regions, 1, "{st:?}");
    assert_eq!(st.returned_bytes, returned, "{what}: {st:?}");
    let body = (region + HEADER_PAGES * PAGE) as *const u8;
    assert!(!any_resident(body, REGION_SIZE - HEADER_PAGES * PAGE), "madvised pages still resident");
    regions.assert_valid();
}

/// Whether any page of `[p, p + len)` is resident (`mincore`).
fn any_resident(p: *const u8, len: usize) -> bool {
    let pages = len.div_ceil(4096);
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is mapped (a retained region); `vec` has one byte per page.
    let rc = unsafe { libc::mincore(p as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore failed");
    vec.iter().any(|&b| b & 1 != 0)
}

#[test]
fn geometry_small_and_large() {
    let regions = manual(0);
    for size in [1, 8, 24, 100, 256, 500, 512, 513, 1000, 3000, 4096, 5000, 10_000, 40_000, 65_536, MAX_SIZE] {
        for align in [1, 8, 64, 512, 4096] {
            let cache = SlabCache::builder(&regions, "geo", size, align).build().unwrap();
            let st = cache.stats();
            assert_eq!(st.small, st.chunk <= SMALL_MAX, "size {size}");
            assert!(st.chunk >= size && st.chunk.is_multiple_of(st.align));
            if st.small {
                assert_eq!(st.slab_pages, 1);
            } else {
                let waste = st.slab_pages * PAGE - st.capacity * st.chunk;
                assert!(
                    waste * 8 <= st.slab_pages * PAGE,
                    "size {size} align {align}: waste {waste} of {}",
                    st.slab_pages
                );
            }
            let p = cache.alloc().unwrap();
            assert_eq!(p.as_ptr() as usize % align.max(8), 0, "size {size} align {align}");
            // SAFETY: from this cache, freed once.
            unsafe { cache.free(p) }.unwrap();
            cache.assert_valid();
        }
    }
    regions.assert_valid();
    assert!(SlabCache::builder(&regions, "zero", 0, 8).build().is_err());
    assert!(SlabCache::builder(&regions, "huge", MAX_SIZE + 1, 8).build().is_err());
    assert!(SlabCache::builder(&regions, "odd", 8, 3).build().is_err());
    assert!(SlabCache::builder(&regions, "wide", 8, 2 * PAGE).build().is_err());
}

/// Seeded random model: several caches (8 B .. 64 KiB, several alignments), every object
/// filled with a pattern that is verified before its free, invariants checked
/// periodically, and the region counts checked against the live slabs when quiescent.
#[test]
fn random_model_several_caches() {
    for (seed, checking) in [(0x5eed_u64, false), (0xfeed_face, true)] {
        let regions = manual(1);
        let specs =
            [(8, 8), (24, 8), (100, 4), (512, 64), (600, 16), (3000, 8), (4096, 4096), (20_000, 64), (65_536, 8)];
        let caches: Vec<_> = specs
            .iter()
            .map(|&(size, align)| {
                SlabCache::builder(&regions, "model", size, align).checking(checking).max_empty(1).build().unwrap()
            })
            .collect();
        let mut rng = Rng(seed);
        let mut live: Vec<(usize, NonNull<u8>, u64)> = Vec::new();
        let mut tag = 0u64;
        let steps = if cfg!(debug_assertions) { 6_000 } else { 30_000 };
        for step in 0..steps {
            // Grow while small, then hover: frees become likelier as the set grows.
            if live.is_empty() || rng.below(1000) < 550 - live.len().min(500) {
                let c = rng.below(caches.len());
                let p = caches[c].alloc().unwrap();
                let size = specs[c].0;
                assert_eq!(p.as_ptr() as usize % specs[c].1.max(8), 0);
                tag += 1;
                fill(p, size, tag);
                live.push((c, p, tag));
            } else {
                let (c, p, t) = live.swap_remove(rng.below(live.len()));
                check(p, specs[c].0, t);
                // SAFETY: allocated from caches[c], freed once.
                unsafe { caches[c].free(p) }.unwrap();
            }
            if step % 1000 == 0 {
                regions.assert_valid();
                for cache in &caches {
                    cache.assert_valid();
                }
                regions.tick();
            }
        }
        for (c, p, t) in &live {
            check(*p, specs[*c].0, *t);
            let found = regions.lookup(p.as_ptr()).unwrap();
            assert_eq!((found.cache, found.base, found.allocated), (caches[*c].id(), *p, true));
        }
        let allocated: usize = caches.iter().map(|c| c.stats().allocated).sum();
        assert_eq!(allocated, live.len());
        regions.assert_counts_settled();
        for (c, p, t) in live.drain(..) {
            check(p, specs[c].0, t);
            // SAFETY: as above.
            unsafe { caches[c].free(p) }.unwrap();
        }
        for cache in &caches {
            assert_eq!(cache.stats().allocated, 0);
            cache.assert_valid();
            cache.shrink();
            assert_eq!(cache.stats().corruptions, 0);
        }
        assert_eq!(regions.stats().runs, 0);
        regions.assert_counts_settled();
        tick_until(&regions, 10, |r| r.stats().live_regions == 0);
        regions.assert_valid();
        assert_eq!(regions.stats().retained_regions, 1);
    }
}

/// A large cache keeps one external header per slab, in pages of headers. A shrink
/// gives back the pages whose headers are all spare (a page-sized object's slab is one
/// object, so 65,536 4 KiB objects once kept 10 MiB of header pages for good), and
/// keeps a page that still holds a header in use.
#[test]
fn shrink_gives_back_idle_header_pages() {
    let regions = manual(0);
    let cache = SlabCache::builder(&regions, "pages", 4096, 4096).max_empty(0).build().unwrap();
    assert_eq!((cache.stats().small, cache.stats().capacity), (false, 1));
    let objects: Vec<_> = (0..200).map(|_| cache.alloc().unwrap()).collect();
    let per_page = cache.stats().header_pages;
    assert!(per_page >= 200 / 25, "{:?}", cache.stats());
    cache.assert_valid();
    // Free all but the first: every header but one is spare.
    for &p in &objects[1..] {
        // SAFETY: from this cache, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    assert_eq!(cache.stats().header_pages, per_page, "spare headers stay until a shrink");
    cache.assert_valid();
    cache.shrink();
    assert_eq!(cache.stats().header_pages, 1, "the page of the header in use stays");
    cache.assert_valid();
    // Spare headers of the kept page serve new slabs; more map pages again.
    let again: Vec<_> = (0..60).map(|_| cache.alloc().unwrap()).collect();
    cache.assert_valid();
    for p in again.into_iter().chain([objects[0]]) {
        // SAFETY: from this cache, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.shrink();
    assert_eq!(cache.stats().header_pages, 0);
    cache.assert_valid();
}

#[test]
fn lookup_base_interior_and_foreign() {
    let regions = manual(0);
    let other = manual(0);
    let small = SlabCache::builder(&regions, "small", 40, 8).build().unwrap();
    let large = SlabCache::builder(&regions, "large", 5000, 64).build().unwrap();
    let elsewhere = SlabCache::builder(&other, "other", 40, 8).build().unwrap();
    let a = small.alloc().unwrap();
    let b = large.alloc().unwrap();
    let c = elsewhere.alloc().unwrap();
    for (p, cache, size) in [(a, &small, 40), (b, &large, 5000)] {
        for offset in [0, 1, size / 2, size - 1] {
            let found = regions.lookup(p.as_ptr().wrapping_add(offset)).unwrap();
            assert_eq!((found.cache, found.base, found.size, found.allocated), (cache.id(), p, size, true));
            assert_eq!(cache.lookup(p.as_ptr().wrapping_add(offset)), Some(p));
        }
    }
    assert_eq!(regions.lookup(a.as_ptr()).unwrap().name, "small");
    assert_eq!(small.lookup(b.as_ptr()), None, "another cache's object");
    // A pointer of another manager, the stack, the heap, null-ish, kernel-half and
    // unmapped addresses, a region's header, a free page of a live region.
    let on_stack = 0u64;
    let on_heap = Box::new(0u64);
    let region = a.as_ptr() as usize & !(REGION_SIZE - 1);
    let foreign = [
        c.as_ptr() as usize,
        &on_stack as *const u64 as usize,
        &*on_heap as *const u64 as usize,
        0,
        8,
        0x1000,
        usize::MAX,
        0xffff_8000_0000_0000,
        0x7fff_ffff_f000,
        region,
        region + 100,
        region + HEADER_PAGES * PAGE - 1,
        region + REGION_SIZE - 1,
    ];
    for addr in foreign {
        assert!(regions.lookup(addr as *const u8).is_none(), "{addr:#x} found");
    }
    // Random addresses never crash the lookup.
    let mut rng = Rng(42);
    for _ in 0..100_000 {
        let addr = rng.next() as usize;
        let _ = regions.lookup(addr as *const u8);
        let near = region.wrapping_add(rng.below(REGION_SIZE));
        let _ = regions.lookup(near as *const u8);
    }
    // A freed object is still found, but not as allocated.
    // SAFETY: from `small`, freed once.
    unsafe { small.free(a) }.unwrap();
    let found = regions.lookup(a.as_ptr()).unwrap();
    assert!(!found.allocated);
    // SAFETY: as above.
    unsafe {
        large.free(b).unwrap();
        elsewhere.free(c).unwrap();
    }
}

#[test]
fn colouring_varies_first_object_offset() {
    let regions = manual(0);
    let cache = SlabCache::builder(&regions, "colour", 200, 8).max_empty(8).build().unwrap();
    let st = cache.stats();
    assert!(st.colour_max >= 64, "a 200-byte cache has slack for colours: {st:?}");
    // The first object of each of several slabs.
    let mut firsts = Vec::new();
    let mut all = Vec::new();
    for _ in 0..6 {
        let first = cache.alloc().unwrap();
        firsts.push(first.as_ptr() as usize % PAGE);
        all.push(first);
        for _ in 1..st.capacity {
            all.push(cache.alloc().unwrap());
        }
    }
    firsts.dedup();
    assert!(firsts.len() >= 2, "no colouring seen: {firsts:?}");
    for w in firsts.windows(2) {
        assert_eq!(w[1].abs_diff(w[0]) % 64, 0, "colours step by cache lines");
    }
    // Large caches colour too (5000-byte objects leave slack in their slabs).
    let large = SlabCache::builder(&regions, "large", 5000, 8).build().unwrap();
    let lst = large.stats();
    let mut large_firsts = Vec::new();
    let mut large_all = Vec::new();
    for _ in 0..4 {
        let p = large.alloc().unwrap();
        large_firsts.push(p.as_ptr() as usize % PAGE);
        large_all.push(p);
        for _ in 1..lst.capacity {
            large_all.push(large.alloc().unwrap());
        }
    }
    large_firsts.dedup();
    assert_eq!(lst.colour_max > 0, large_firsts.len() >= 2, "{lst:?} {large_firsts:?}");
    cache.assert_valid();
    for p in all {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    for p in large_all {
        // SAFETY: from `large`, freed once.
        unsafe { large.free(p) }.unwrap();
    }
}

/// A region goes back only after its count has stayed zero for two epochs, and then its
/// pages are given back (retained) or it is unmapped (past the limit).
#[test]
fn region_released_after_two_epochs_at_zero() {
    for retain in [0, 1] {
        let regions = manual(retain);
        let cache = SlabCache::builder(&regions, "r", 1000, 8).max_empty(0).build().unwrap();
        let objects: Vec<_> = (0..800).map(|_| cache.alloc().unwrap()).collect();
        for &p in &objects {
            fill(p, 1000, 7);
        }
        let st = regions.stats();
        assert_eq!((st.live_regions, st.maps, st.mapped_bytes), (1, 1, REGION_SIZE));
        let region = objects[0].as_ptr() as usize & !(REGION_SIZE - 1);
        let body = (region + HEADER_PAGES * PAGE) as *const u8;
        let body_len = REGION_SIZE - HEADER_PAGES * PAGE;
        assert!(any_resident(body, body_len));
        // Ticks while slabs are live release nothing.
        for _ in 0..4 {
            regions.tick();
        }
        assert_eq!(regions.stats().releases, 0);
        for p in objects {
            // SAFETY: from `cache`, freed once.
            unsafe { cache.free(p) }.unwrap();
        }
        assert_eq!(regions.stats().runs, 0, "max_empty(0): every emptied slab went back");
        // The count is zero now; the next tick flushes it (queued for review), and two
        // more epochs must pass before the release.
        regions.tick();
        assert_eq!(regions.stats().releases, 0, "released in the epoch it reached zero");
        regions.tick();
        assert_eq!(regions.stats().releases, 0, "released after one epoch");
        let ticks = tick_until(&regions, 6, |r| r.stats().releases == 1);
        assert!(ticks <= 4, "release took {ticks} more ticks");
        let st = regions.stats();
        assert_eq!(st.live_regions, 0);
        if retain == 1 {
            assert_eq!(st.retained_regions, 1);
            assert_eq!(st.mapped_bytes, REGION_SIZE);
            // The release gives back the stretch below the touched mark (the pages the
            // slabs used), not the whole body: the rest was never written.
            let used = (800 * 1000usize).div_ceil(PAGE) * PAGE;
            assert!((used..body_len / 2).contains(&st.returned_bytes), "{st:?}");
            assert_eq!(st.returned_bytes % PAGE, 0);
            assert!(!any_resident(body, body_len), "madvised pages still resident");
            // Reuse: the retained region comes back without a new map.
            let p = cache.alloc().unwrap();
            assert_eq!(p.as_ptr() as usize & !(REGION_SIZE - 1), region);
            assert_eq!(regions.stats().maps, 1);
            regions.assert_valid();
            regions.assert_counts_settled();
            // SAFETY: from `cache`, freed once.
            unsafe { cache.free(p) }.unwrap();
        } else {
            assert_eq!((st.retained_regions, st.mapped_bytes, st.unmapped_bytes), (0, 0, REGION_SIZE));
        }
        regions.assert_valid();
    }
}

/// A purge that gave back a region's upper pages lowers its touched mark, so the
/// release that retains the region later gives back (and counts) only the pages below
/// it: every page is counted once, and none stays resident.
#[test]
fn release_after_a_purge_counts_each_page_once() {
    let regions = manual(1);
    let cache = SlabCache::builder(&regions, "pages", PAGE, PAGE).max_empty(0).build().unwrap();
    let pages = written_pages(&cache, 8, 3);
    let region = pages[0].as_ptr() as usize & !(REGION_SIZE - 1);
    for &p in &pages[4..] {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    assert_eq!(regions.purge(1), 4 * PAGE, "the upper four pages");
    for &p in &pages[..4] {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    released_and_retained(&regions, region, 8 * PAGE, "each page counted once");
}

/// Pages a purge gave back are marked clean: a later purge gives back (and counts) only
/// pages freed since, not the hole it already gave back; a run taken from a clean
/// stretch makes its pages dirty again when freed; and the release that retains the
/// region gives back only the pages no purge has: every page is counted once each time
/// it goes back, and none stays resident.
/// The `VmFlags` line of the mapping (from `/proc/self/smaps`) that holds `addr`.
fn vm_flags(addr: usize) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo <= addr && addr < hi;
            continue;
        }
        if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return flags.trim().to_string();
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[test]
fn purged_regions_refuse_huge_pages_where_the_system_gives_them_unasked() {
    // Where transparent huge pages are on for every mapping (`always`), khugepaged
    // collapses a 2 MiB range with any page still resident into a huge page: a purged
    // region (some live slabs, free pages given back) would be resident again in full.
    // The purge advises such a region MADV_NOHUGEPAGE (VmFlags `nh`), once.
    for always in [true, false] {
        testing::assume_thp_always(Some(always));
        let regions = manual(0);
        let cache = SlabCache::builder(&regions, "pages", PAGE, PAGE).max_empty(0).build().unwrap();
        let pages = written_pages(&cache, 8, 7);
        let region = pages[0].as_ptr() as usize & !(REGION_SIZE - 1);
        let nh = |flags: &str| flags.split_whitespace().any(|f| f == "nh");
        assert!(!nh(&vm_flags(region)), "a fresh region is advised nothing");
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(pages[3]) }.unwrap();
        assert_eq!(regions.purge(1), PAGE);
        assert_eq!(nh(&vm_flags(region)), always, "always = {always}: {}", vm_flags(region));
        // The region still serves runs (first fit takes the purged page again).
        let again = cache.alloc().unwrap();
        assert_eq!(again, pages[3]);
        fill(again, PAGE, 8);
        regions.assert_valid();
        // `again` is `pages[3]`: every page once.
        for p in pages {
            // SAFETY: from `cache`, freed once.
            unsafe { cache.free(p) }.unwrap();
        }
    }
    testing::assume_thp_always(None);
}

#[test]
fn purges_and_release_skip_clean_pages() {
    let regions = manual(1);
    let cache = SlabCache::builder(&regions, "pages", PAGE, PAGE).max_empty(0).build().unwrap();
    let pages = written_pages(&cache, 8, 5);
    let region = pages[0].as_ptr() as usize & !(REGION_SIZE - 1);
    assert!(pages.iter().all(|p| p.as_ptr() as usize & !(REGION_SIZE - 1) == region));
    let free = |p: NonNull<u8>| {
        // SAFETY: from `cache`, freed once (each caller frees a distinct page).
        unsafe { cache.free(p) }.unwrap();
    };
    // A hole of two pages below live ones.
    free(pages[2]);
    free(pages[3]);
    assert_eq!(regions.purge(1), 2 * PAGE, "the hole");
    assert!(!any_resident(pages[2].as_ptr(), 2 * PAGE));
    regions.assert_valid();
    // Another page freed: the next purge gives back that page only.
    free(pages[5]);
    assert_eq!(regions.purge(1), PAGE, "only the page freed since");
    assert_eq!(regions.stats().returned_bytes, 3 * PAGE);
    regions.assert_valid();
    // A run taken from the clean hole (first fit: its first page), written and freed,
    // is dirty again.
    let again = cache.alloc().unwrap();
    assert_eq!(again, pages[2], "first fit takes the clean hole");
    fill(again, PAGE, 6);
    free(again);
    assert_eq!(regions.purge(1), PAGE, "the retaken page only");
    assert_eq!(regions.stats().returned_bytes, 4 * PAGE);
    regions.assert_valid();
    // Everything else freed: the release gives back the five pages still dirty.
    for i in [0, 1, 4, 6, 7] {
        free(pages[i]);
    }
    released_and_retained(&regions, region, 9 * PAGE, "four by the purges, five by the release");
}

/// A give-back the kernel refuses leaves the pages dirty and below the touched mark:
/// nothing is counted, and the next purge tries them again.
#[test]
fn refused_purge_is_retried() {
    let regions = manual(1);
    let cache = SlabCache::builder(&regions, "pages", PAGE, PAGE).max_empty(0).build().unwrap();
    let pages = written_pages(&cache, 8, 7);
    for &p in &pages[4..] {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
    testing::refuse_dontneed(true);
    let refused = regions.purge(1);
    testing::refuse_dontneed(false);
    assert_eq!(refused, 0, "nothing went back");
    assert_eq!(regions.stats().returned_bytes, 0);
    assert!(any_resident(pages[4].as_ptr(), 4 * PAGE), "the refused pages are resident");
    regions.assert_valid();
    assert_eq!(regions.purge(1), 4 * PAGE, "retried");
    assert!(!any_resident(pages[4].as_ptr(), 4 * PAGE));
    assert_eq!(regions.purge(1), 0);
    regions.assert_valid();
    for &p in &pages[..4] {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap();
    }
}

/// An emptied region that gets a slab again before its release is revived: no release,
/// no new map, and its count follows the live slabs.
#[test]
fn emptied_region_is_revived_before_release() {
    let regions = manual(0);
    let cache = SlabCache::builder(&regions, "revive", 64, 8).max_empty(0).build().unwrap();
    let p = cache.alloc().unwrap();
    // SAFETY: from `cache`, freed once.
    unsafe { cache.free(p) }.unwrap();
    assert_eq!(regions.stats().runs, 0);
    regions.tick(); // the zero count is flushed: the region is queued for review
    let q = cache.alloc().unwrap();
    let st = regions.stats();
    assert_eq!((st.revivals, st.maps, st.live_regions), (1, 1, 1), "{st:?}");
    for _ in 0..6 {
        regions.tick();
    }
    assert_eq!(regions.stats().releases, 0, "a revived region was released");
    regions.assert_counts_settled();
    // SAFETY: from `cache`, freed once.
    unsafe { cache.free(q) }.unwrap();
    tick_until(&regions, 6, |r| r.stats().releases == 1);
    regions.assert_valid();
}

/// An empty region is reused only when no region with live slabs has room, so that it
/// can go back: here the allocation lands in the half-used region and the empty one is
/// released.
#[test]
fn empty_regions_are_used_last() {
    use scalemem::umem::region::USABLE_PAGES;
    let regions = manual(0);
    let cache = SlabCache::builder(&regions, "last", 60_000, 8).max_empty(0).build().unwrap();
    let per_region = USABLE_PAGES / cache.stats().slab_pages; // one object per slab
    let mut objects: Vec<_> = (0..per_region + 4).map(|_| cache.alloc().unwrap()).collect();
    assert_eq!(regions.stats().live_regions, 2);
    let region_of = |p: NonNull<u8>| p.as_ptr() as usize & !(REGION_SIZE - 1);
    let first = region_of(objects[0]);
    let (in_first, in_second): (Vec<_>, Vec<_>) = objects.drain(..).partition(|&p| region_of(p) == first);
    assert_eq!(in_first.len(), per_region);
    for p in in_second {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(p) }.unwrap(); // the second region is empty now
    }
    // SAFETY: as above.
    unsafe { cache.free(in_first[0]) }.unwrap(); // and the first has room
    regions.tick(); // the empty region's zero is seen: it is queued for review
    let p = cache.alloc().unwrap();
    assert_eq!(region_of(p), first, "an empty region was preferred to one with live slabs");
    tick_until(&regions, 6, |r| r.stats().releases == 1);
    let st = regions.stats();
    assert_eq!((st.revivals, st.live_regions, st.unmapped_bytes), (0, 1, REGION_SIZE), "{st:?}");
    regions.assert_valid();
    for p in in_first.into_iter().skip(1).chain([p]) {
        // SAFETY: as above.
        unsafe { cache.free(p) }.unwrap();
    }
    cache.assert_valid();
}

/// Maps fail after N calls: every allocation fails cleanly, every layer stays valid, and
/// allocation works again once maps are allowed.
#[test]
fn fault_injection_maps_fail_after_n() {
    for n in 0..8 {
        testing::fail_maps_after(n);
        let regions = match Regions::builder().refcache(Config::manual()).retain(0).build() {
            Ok(r) => r,
            Err(_) => {
                testing::allow_maps();
                continue;
            }
        };
        let caches: Vec<_> = [(64, 8), (5000, 64), (60_000, 8)]
            .iter()
            .filter_map(|&(size, align)| SlabCache::builder(&regions, "fault", size, align).build().ok())
            .collect();
        let mut got = Vec::new();
        let mut failures = 0;
        // Enough objects to need a second region (60 KiB objects fill 2 MiB fast).
        for i in 0..120 {
            for (c, cache) in caches.iter().enumerate() {
                match cache.alloc() {
                    Ok(p) => {
                        fill(p, 8, i);
                        got.push((c, p, i));
                    }
                    Err(_) => failures += 1,
                }
            }
            if i % 20 == 0 {
                regions.assert_valid();
                caches.iter().for_each(SlabCache::assert_valid);
            }
        }
        regions.assert_valid();
        caches.iter().for_each(SlabCache::assert_valid);
        assert!(failures > 0 || caches.len() < 3, "n = {n}: no failure seen");
        testing::allow_maps();
        let mut caches = caches;
        while caches.len() < 3 {
            caches.push(SlabCache::builder(&regions, "late", 64, 8).build().unwrap());
        }
        for cache in &caches {
            for _ in 0..50 {
                let p = cache.alloc().expect("allocation works again");
                got.push((usize::MAX, p, 0));
                // SAFETY: from `cache`, freed once (removed from `got` at once).
                unsafe { cache.free(got.pop().unwrap().1) }.unwrap();
            }
        }
        for (c, p, i) in got {
            check(p, 8, i);
            // SAFETY: from caches[c], freed once.
            unsafe { caches[c].free(p) }.unwrap();
        }
        for cache in &caches {
            cache.shrink();
            cache.assert_valid();
        }
        regions.assert_valid();
        drop(caches);
        tick_until(&regions, 8, |r| r.stats().mapped_bytes == 0);
    }
    // A warm cache keeps serving from its slabs while maps fail.
    let regions = manual(0);
    let cache = SlabCache::builder(&regions, "warm", 128, 8).build().unwrap();
    let p = cache.alloc().unwrap();
    testing::fail_maps_after(0);
    let more: Vec<_> = (0..10).map(|_| cache.alloc().unwrap()).collect();
    // Big objects need new regions soon: they fail, cleanly.
    let big = SlabCache::builder(&regions, "big", 60_000, 8).build();
    assert!(big.is_err(), "the cache's own page needs a map");
    testing::allow_maps();
    let big = SlabCache::builder(&regions, "big", 60_000, 8).build().unwrap();
    testing::fail_maps_after(0);
    let mut bigs = Vec::new();
    let err = loop {
        match big.alloc() {
            Ok(q) => bigs.push(q),
            Err(e) => break e,
        }
    };
    assert_eq!(err, scalemem::util::AllocError);
    regions.assert_valid();
    big.assert_valid();
    testing::allow_maps();
    bigs.push(big.alloc().unwrap());
    for q in bigs {
        // SAFETY: from `big`, freed once.
        unsafe { big.free(q) }.unwrap();
    }
    for q in more.into_iter().chain([p]) {
        // SAFETY: from `cache`, freed once.
        unsafe { cache.free(q) }.unwrap();
    }
    big.assert_valid();
    cache.assert_valid();
    regions.assert_valid();
}

#[test]
fn checking_mode_catches_bad_frees() {
    let regions = manual(0);
    let other_regions = manual(0);
    let cache = SlabCache::builder(&regions, "checked", 40, 8).checking(true).build().unwrap();
    let other = SlabCache::builder(&regions, "other", 40, 8).checking(true).build().unwrap();
    let elsewhere = SlabCache::builder(&other_regions, "elsewhere", 40, 8).build().unwrap();
    let p = cache.alloc().unwrap();
    let q = other.alloc().unwrap();
    let r = elsewhere.alloc().unwrap();
    let on_stack = [0u64; 4];
    let region = p.as_ptr() as usize & !(REGION_SIZE - 1);
    // SAFETY: checking mode accepts any pointer; `p` is ours to write (and its redzone).
    unsafe {
        assert_eq!(cache.free(q), Err(FreeError::WrongCache));
        assert_eq!(cache.free(r), Err(FreeError::Foreign));
        assert_eq!(cache.free(NonNull::from(&on_stack).cast()), Err(FreeError::Foreign));
        assert_eq!(cache.free(NonNull::new(0x1000 as *mut u8).unwrap()), Err(FreeError::Foreign));
        assert_eq!(cache.free(NonNull::new(region as *mut u8).unwrap()), Err(FreeError::Foreign));
        assert_eq!(cache.free(NonNull::new(usize::MAX as *mut u8).unwrap()), Err(FreeError::Foreign));
        assert_eq!(cache.free(NonNull::new(p.as_ptr().add(8)).unwrap()), Err(FreeError::NotObjectBase));
        // The slab's header (at the start of its page).
        let page = (p.as_ptr() as usize & !(PAGE - 1)) as *mut u8;
        assert_eq!(cache.free(NonNull::new(page).unwrap()), Err(FreeError::NotObjectBase));
        // A random sweep never crashes.
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let addr = (rng.next() as usize) | 1;
            assert!(cache.free(NonNull::new(addr as *mut u8).unwrap()).is_err());
            let near = (region + rng.below(REGION_SIZE)) | 1;
            assert!(cache.free(NonNull::new(near as *mut u8).unwrap()).is_err());
        }
        // Overrun: the redzone right after the 40 bytes.
        p.as_ptr().add(40).write(0);
        assert_eq!(cache.free(p), Err(FreeError::Overrun));
        p.as_ptr().add(40).write(0xBB);
        assert_eq!(cache.free(p), Ok(()));
        assert_eq!(cache.free(p), Err(FreeError::NotAllocated), "double free");
        // Write after free: found when the object is handed out again.
        p.as_ptr().add(20).write(1);
        let again = cache.alloc().unwrap();
        assert_eq!(again, p, "LIFO free list");
        assert_eq!(cache.stats().corruptions, 1);
        cache.free(again).unwrap();
        other.free(q).unwrap();
        elsewhere.free(r).unwrap();
    }
    cache.assert_valid();
    other.assert_valid();
    regions.assert_valid();
}

#[test]
fn unchecked_free_still_refuses_cheap_mistakes() {
    let regions = manual(0);
    let a = SlabCache::builder(&regions, "a", 32, 8).build().unwrap();
    let b = SlabCache::builder(&regions, "b", 32, 8).build().unwrap();
    let p = a.alloc().unwrap();
    let q = b.alloc().unwrap();
    // SAFETY: every pointer is inside a live slab over `regions`.
    unsafe {
        assert_eq!(a.free(q), Err(FreeError::WrongCache));
        assert_eq!(a.free(NonNull::new(p.as_ptr().add(4)).unwrap()), Err(FreeError::NotObjectBase));
        assert_eq!(a.free(p), Ok(()));
        // The emptied slab is kept (max_empty), so the double free reaches its bitmap.
        assert_eq!(a.free(p), Err(FreeError::NotAllocated));
        b.free(q).unwrap();
    }
    a.assert_valid();
    b.assert_valid();
}

/// 16 threads on 2 cores allocate from shared caches, stamp each object with its owner,
/// hand half of them to another thread to free (cross-thread frees), and check the
/// stamps: no object is ever handed to two threads. Everything goes back at the end.
#[test]
fn threads_allocate_and_free_across_threads() {
    const THREADS: usize = 16;
    let rounds = if cfg!(debug_assertions) { 150 } else { 600 };
    let regions: &'static Regions =
        Box::leak(Box::new(Regions::builder().refcache(Config::manual()).retain(1).build().unwrap()));
    let sizes = [16usize, 200, 1000, 6000];
    let caches: &'static [SlabCache<'static>] = Box::leak(
        sizes
            .iter()
            .map(|&s| SlabCache::builder(regions, "mt", s, 8).max_empty(1).build().unwrap())
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    let mailboxes: Arc<Vec<Mailbox>> = Arc::new((0..THREADS).map(|_| Mutex::default()).collect());
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                regions.tick();
                std::thread::yield_now();
            }
        })
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|me| {
            let (mailboxes, barrier) = (mailboxes.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(me as u64 + 1);
                let mut mine: Vec<(usize, usize, u64)> = Vec::new();
                barrier.wait();
                for round in 0..rounds {
                    for _ in 0..8 {
                        let c = rng.below(sizes.len());
                        let p = caches[c].alloc().unwrap();
                        let stamp = ((me as u64) << 32) | round as u64;
                        fill(p, sizes[c], stamp);
                        mine.push((c, p.as_ptr() as usize, stamp));
                    }
                    // Hand some to the next thread; free what others sent us.
                    let give: Vec<_> = mine.drain(..mine.len() / 2).collect();
                    mailboxes[(me + 1) % THREADS].lock().unwrap().extend(give);
                    let received: Vec<_> = std::mem::take(&mut *mailboxes[me].lock().unwrap());
                    for (c, p, stamp) in received.into_iter().chain(mine.drain(..mine.len() / 2)) {
                        let p = NonNull::new(p as *mut u8).unwrap();
                        check(p, sizes[c], stamp);
                        // SAFETY: from caches[c]; whoever holds the entry frees it once.
                        unsafe { caches[c].free(p) }.unwrap();
                    }
                }
                for (c, p, stamp) in mine {
                    let p = NonNull::new(p as *mut u8).unwrap();
                    check(p, sizes[c], stamp);
                    // SAFETY: as above.
                    unsafe { caches[c].free(p) }.unwrap();
                }
            })
        })
        .collect();
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    for mailbox in mailboxes.iter() {
        for (c, p, stamp) in std::mem::take(&mut *mailbox.lock().unwrap()) {
            let p = NonNull::new(p as *mut u8).unwrap();
            check(p, sizes[c], stamp);
            // SAFETY: as above.
            unsafe { caches[c].free(p) }.unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    ticker.join().unwrap();
    for cache in caches {
        assert_eq!(cache.stats().allocated, 0);
        cache.assert_valid();
        cache.shrink();
    }
    regions.assert_valid();
    assert_eq!(regions.stats().runs, 0);
    regions.assert_counts_settled();
    tick_until(regions, 10, |r| r.stats().live_regions == 0);
    let st = regions.stats();
    assert_eq!(st.retained_regions, 1);
    assert_eq!(st.mapped_bytes, REGION_SIZE, "everything but the retained region unmapped: {st:?}");
    // SAFETY: every thread that used them was joined; each was leaked once, above, and
    // the caches (which borrow the manager) go first.
    unsafe {
        drop(Box::from_raw(std::ptr::from_ref(caches).cast_mut()));
        drop(Box::from_raw(std::ptr::from_ref(regions).cast_mut()));
    }
}

/// After warm-up, alloc and free never call the global allocator, including when they
/// make and destroy slabs, map regions and revive them.
#[test]
fn no_global_allocation_on_alloc_and_free() {
    let regions = manual(1);
    let small = SlabCache::builder(&regions, "na-small", 48, 8).max_empty(0).build().unwrap();
    let large = SlabCache::builder(&regions, "na-large", 9000, 64).checking(true).max_empty(0).build().unwrap();
    let mut slots = [None::<NonNull<u8>>; 600];
    // Warm up: the thread-local fault budget and the Refcache's per-CPU caches.
    let warm = small.alloc().unwrap();
    // SAFETY: from `small`, freed once.
    unsafe { small.free(warm) }.unwrap();
    let n = allocations_in(|| {
        for round in 0..3 {
            for (i, slot) in slots.iter_mut().enumerate() {
                let cache = if i % 3 == 0 { &large } else { &small };
                *slot = Some(cache.alloc().unwrap());
            }
            for (i, slot) in slots.iter_mut().enumerate() {
                let cache = if i % 3 == 0 { &large } else { &small };
                // SAFETY: allocated just above from this cache.
                unsafe { cache.free(slot.take().unwrap()) }.unwrap();
            }
            let _ = regions.lookup(slots.as_ptr().cast());
            if round == 1 {
                regions.tick();
            }
        }
    });
    assert_eq!(n, 0, "alloc/free allocated through the global allocator");
}

/// Dropping the manager after its caches releases every region (the Refcache's drop
/// runs the last release callbacks).
#[test]
fn dropping_everything_returns_everything() {
    let mut seen = HashMap::new();
    for round in 0..3 {
        let regions = Regions::new().unwrap(); // background ticker
        {
            let cache = SlabCache::builder(&regions, "drop", 3000, 8).build().unwrap();
            let objects: Vec<_> = (0..1000).map(|_| cache.alloc().unwrap()).collect();
            seen.insert(round, regions.stats().maps);
            for p in objects.iter().step_by(2) {
                // SAFETY: from `cache`, freed once.
                unsafe { cache.free(*p) }.unwrap();
            }
            cache.assert_valid();
            // The other half are still allocated when the cache is dropped: its slabs go
            // back anyway.
        }
        assert_eq!(regions.stats().runs, 0);
        regions.assert_valid();
    }
    assert!(seen.values().all(|&maps| maps >= 2));
}

/// Regions emptied and refilled all the time while another thread ticks: 8 threads each
/// take one large object at a time (one object per slab) from a cache that keeps no empty
/// slab, so the region's count keeps dropping to zero and coming back (revivals). Every
/// other phase all threads pause together for a few milliseconds, long enough for the
/// ticker to release the empty region, which then comes back from the retained list.
/// Objects never overlap, and at the end every region is released.
#[test]
fn threads_churn_regions_while_ticking() {
    const THREADS: usize = 8;
    let phases = if cfg!(debug_assertions) { 4 } else { 10 };
    let regions = Regions::builder().refcache(Config::manual()).retain(1).build().unwrap();
    let cache = SlabCache::builder(&regions, "churn", 60_000, 8).max_empty(0).build().unwrap();
    assert_eq!(cache.stats().capacity, 1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                regions.tick();
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|me| {
                let (cache, barrier) = (&cache, &barrier);
                scope.spawn(move || {
                    for phase in 0..phases {
                        for i in 0..100 {
                            let p = cache.alloc().unwrap();
                            let stamp = ((me as u64) << 32) | (phase * 100 + i) as u64;
                            fill(p, 256, stamp);
                            if i % 8 == 0 {
                                std::thread::yield_now();
                            }
                            check(p, 256, stamp);
                            // SAFETY: from `cache`, freed once.
                            unsafe { cache.free(p) }.unwrap();
                        }
                        barrier.wait();
                        if phase % 2 == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                        }
                        barrier.wait();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    cache.assert_valid();
    regions.assert_valid();
    regions.assert_counts_settled();
    let st = regions.stats();
    assert!(st.releases > 0, "the pauses released no region: {st:?}");
    tick_until(&regions, 10, |r| r.stats().live_regions == 0);
    regions.assert_valid();
    eprintln!("churn: {:?}", regions.stats());
}
