//! `scalemem::umem::cache::ObjectCache` beside general-purpose allocators, in the same run,
//! on one thread.
//!
//! Run with `cargo bench --bench umem`. Groups:
//!
//! - `umem/pair`: one operation is an allocation and a free of one 64-byte object.
//!   `object_cache`: `ObjectCache::alloc`/`free` (a magazine hit after the first round);
//!   `typed_cache`: `TypedCache<[u64; 8]>::alloc` and the `CacheBox` drop;
//!   `box_system`: `Box::new([0u64; 8])` and its drop through `System` (glibc malloc);
//!   `jemalloc` and `mimalloc`: the `tikv-jemallocator` and `mimalloc` crates'
//!   allocators, called directly through their `GlobalAlloc` impls (the global
//!   allocator stays `System`); `umem_global`: [`scalemem::Umem`]'s `GlobalAlloc` (the
//!   size-class cache of 64 bytes), called the same way.
//! - `umem/burst`: 32 allocations then 32 frees per operation (the magazines of 15 rounds
//!   exchange with the depot), same contenders.
//! - `umem/expensive_ctor`: a typed cache of a 4 KiB-buffer struct against `Box::new`
//!   constructing it every time (what the constructor caching saves), the box and its
//!   buffer through glibc (`box_new`), jemalloc (`box_jemalloc`) and mimalloc
//!   (`box_mimalloc`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use scalemem::umem::cache::{Config, ObjectCache, TypedCache};

const LAYOUT: Layout = match Layout::from_size_align(64, 8) {
    Ok(layout) => layout,
    Err(_) => panic!("layout"),
};

fn config() -> Config {
    // The bench drives the cache; no background thread visiting it meanwhile.
    Config { reaper: false, ..Config::default() }
}

/// A pair through a `GlobalAlloc`.
fn global_pair<A: GlobalAlloc>(a: &A) {
    // SAFETY: a non-zero-size layout; the block is freed once with the same layout.
    unsafe {
        let p = a.alloc(LAYOUT);
        assert!(!p.is_null());
        black_box(p);
        a.dealloc(p, LAYOUT);
    }
}

/// A burst through a `GlobalAlloc`.
fn global_burst<A: GlobalAlloc>(a: &A, hand: &mut Vec<*mut u8>) {
    for _ in 0..32 {
        // SAFETY: a non-zero-size layout.
        let p = unsafe { a.alloc(LAYOUT) };
        assert!(!p.is_null());
        hand.push(p);
    }
    for p in hand.drain(..) {
        // SAFETY: allocated above with this layout, freed once.
        unsafe { a.dealloc(black_box(p), LAYOUT) };
    }
}

fn pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("umem/pair");
    let cache = ObjectCache::builder("bench64", 64, 8).config(config()).build().unwrap();
    group.bench_function("object_cache", |b| {
        b.iter(|| {
            let p = cache.alloc().unwrap();
            black_box(p);
            // SAFETY: from this cache, freed once.
            unsafe { cache.free(p) }.unwrap();
        })
    });
    let typed = TypedCache::new_in(default_regions(), "bench64t", config(), || [0u64; 8]).unwrap();
    group.bench_function("typed_cache", |b| {
        b.iter(|| {
            let object = typed.alloc().unwrap();
            // The object, not the box by value: a by-value `black_box` copies the box
            // through the stack in two stores and one wider load, a store-forwarding
            // stall that doubled the measured time.
            black_box(&*object);
        })
    });
    group.bench_function("box_system", |b| b.iter(|| black_box(Box::new([0u64; 8]))));
    group.bench_function("umem_global", |b| b.iter(|| global_pair(&scalemem::Umem::new())));
    group.bench_function("system", |b| b.iter(|| global_pair(&System)));
    #[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
    {
        group.bench_function("jemalloc", |b| b.iter(|| global_pair(&tikv_jemallocator::Jemalloc)));
        group.bench_function("mimalloc", |b| b.iter(|| global_pair(&mimalloc::MiMalloc)));
    }
    group.finish();
}

fn burst(c: &mut Criterion) {
    let mut group = c.benchmark_group("umem/burst");
    let cache = ObjectCache::builder("bench64b", 64, 8).config(config()).build().unwrap();
    let mut hand = Vec::with_capacity(32);
    group.bench_function("object_cache", |b| {
        b.iter(|| {
            for _ in 0..32 {
                hand.push(cache.alloc().unwrap());
            }
            for p in hand.drain(..) {
                // SAFETY: from this cache, freed once.
                unsafe { cache.free(black_box(p)) }.unwrap();
            }
        })
    });
    let mut raw = Vec::with_capacity(32);
    group.bench_function("umem_global", |b| b.iter(|| global_burst(&scalemem::Umem::new(), &mut raw)));
    group.bench_function("system", |b| b.iter(|| global_burst(&System, &mut raw)));
    #[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
    {
        group.bench_function("jemalloc", |b| b.iter(|| global_burst(&tikv_jemallocator::Jemalloc, &mut raw)));
        group.bench_function("mimalloc", |b| b.iter(|| global_burst(&mimalloc::MiMalloc, &mut raw)));
    }
    group.finish();
}

/// An object worth caching: a pre-sized buffer and a computed table; the buffer comes
/// from `A`.
struct Expensive<A: Allocator = Global> {
    buffer: allocator_api2::vec::Vec<u8, A>,
    table: [u32; 64],
}

impl Expensive {
    fn new() -> Self {
        Self::new_in(Global)
    }
}

impl<A: Allocator> Expensive<A> {
    fn new_in(alloc: A) -> Self {
        let mut table = [0u32; 64];
        for (i, t) in table.iter_mut().enumerate() {
            *t = (i as u32).wrapping_mul(2_654_435_761).rotate_left(7);
        }
        Self { buffer: allocator_api2::vec::Vec::with_capacity_in(4096, alloc), table }
    }
}

/// A `GlobalAlloc` as an `allocator_api2` allocator, so that a box and the buffer inside
/// it both come from that allocator (the bench's global allocator stays `System`).
struct Via<A: 'static>(&'static A);

impl<A> Clone for Via<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Via<A> {}

// SAFETY: blocks come from `A::alloc` with the layout asked for and go back to
// `A::dealloc` with the same layout; zero-size requests get a dangling aligned pointer
// and are never passed to `A`. Copies share the one `&'static A`.
unsafe impl<A: GlobalAlloc> Allocator for Via<A> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            let dangling = NonNull::new(layout.align() as *mut u8).ok_or(AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(dangling, 0));
        }
        // SAFETY: a non-zero-size layout.
        let p = unsafe { self.0.alloc(layout) };
        NonNull::new(p).map(|p| NonNull::slice_from_raw_parts(p, layout.size())).ok_or(AllocError)
    }

    // SAFETY (the caller's, `Allocator::deallocate`'s contract): `ptr` came from
    // `allocate` on this allocator with `layout`, and is freed once.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: the caller's contract: `ptr` came from `allocate` with `layout`.
            unsafe { self.0.dealloc(ptr.as_ptr(), layout) }
        }
    }
}

/// `Box::new` of a freshly constructed object, box and buffer from `alloc`.
fn box_in<A: Allocator + Copy>(alloc: A) {
    let mut e = allocator_api2::boxed::Box::new_in(Expensive::new_in(alloc), alloc);
    let byte = e.table[3] as u8;
    e.buffer.push(byte);
    black_box(&*e);
}

fn expensive_ctor(c: &mut Criterion) {
    let mut group = c.benchmark_group("umem/expensive_ctor");
    let cache = TypedCache::new_in(default_regions(), "expensive", config(), Expensive::new).unwrap();
    group.bench_function("typed_cache", |b| {
        b.iter(|| {
            let mut e = cache.alloc().unwrap();
            let byte = e.table[3] as u8;
            e.buffer.clear();
            e.buffer.push(byte);
            black_box(&*e);
        })
    });
    group.bench_function("box_new", |b| b.iter(|| box_in(Global)));
    #[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
    {
        static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
        static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
        group.bench_function("box_jemalloc", |b| b.iter(|| box_in(Via(&JEMALLOC))));
        group.bench_function("box_mimalloc", |b| b.iter(|| box_in(Via(&MIMALLOC))));
    }
    group.finish();
}

/// One region manager for the typed caches (the process-wide one is private).
fn default_regions() -> &'static scalemem::umem::region::Regions {
    use std::sync::OnceLock;
    static REGIONS: OnceLock<scalemem::umem::region::Regions> = OnceLock::new();
    REGIONS.get_or_init(|| scalemem::umem::region::Regions::new().unwrap())
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = pair, burst, expensive_ctor
}
criterion_main!(benches);
