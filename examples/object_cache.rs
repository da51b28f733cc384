//! A typed object cache with an expensive constructor against `Box::new` constructing
//! the object every time.
//!
//! ```text
//! cargo run --release --example object_cache
//! ```
//!
//! The object is a parser-style scratch space: a 16 KiB pre-sized buffer, a mutex-guarded
//! counter and a 256-entry computed table. The cache builds one per object entering from
//! a slab and hands it back constructed; `Box::new` allocates and computes every time.
//! Prints timings only (no assertions on time).

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use scalemem::umem::cache::TypedCache;

/// What a request handler needs, expensive to make.
struct Scratch {
    buffer: Vec<u8>,
    hits: Mutex<u64>,
    table: [u32; 256],
}

impl Scratch {
    fn new() -> Self {
        let mut table = [0u32; 256];
        let mut crc = 0xFFFF_FFFFu32;
        for (i, entry) in table.iter_mut().enumerate() {
            crc ^= i as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
            *entry = crc;
        }
        Self { buffer: Vec::with_capacity(16 << 10), hits: Mutex::new(0), table }
    }

    /// One "request": fill part of the buffer and fold it through the table.
    fn handle(&mut self, request: u64) -> u32 {
        self.buffer.clear();
        self.buffer.extend((0..64).map(|i| (request as u8).wrapping_add(i)));
        *self.hits.lock().unwrap() += 1;
        self.buffer.iter().fold(0u32, |acc, &b| acc.rotate_left(5) ^ self.table[b as usize])
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const REQUESTS: u64 = 200_000;
    const IN_FLIGHT: usize = 8;
    let cache = TypedCache::new("scratch", Scratch::new)?;

    for round in 0..3 {
        let start = Instant::now();
        let mut sum = 0u32;
        for r in 0..REQUESTS / IN_FLIGHT as u64 {
            let mut held: [_; IN_FLIGHT] = std::array::from_fn(|_| cache.alloc().expect("cache alloc"));
            for (i, s) in held.iter_mut().enumerate() {
                sum ^= s.handle(r * IN_FLIGHT as u64 + i as u64);
            }
        }
        let cached = start.elapsed();
        black_box(sum);

        let start = Instant::now();
        let mut sum = 0u32;
        for r in 0..REQUESTS / IN_FLIGHT as u64 {
            let mut held: [_; IN_FLIGHT] = std::array::from_fn(|_| Box::new(Scratch::new()));
            for (i, s) in held.iter_mut().enumerate() {
                sum ^= s.handle(r * IN_FLIGHT as u64 + i as u64);
            }
        }
        let boxed = start.elapsed();
        black_box(sum);

        let per = |d: std::time::Duration| d.as_nanos() as f64 / REQUESTS as f64;
        println!(
            "round {round}: typed cache {:>7.1} ns/request, Box::new {:>7.1} ns/request ({:.1}x)",
            per(cached),
            per(boxed),
            per(boxed) / per(cached)
        );
    }
    let stats = cache.raw().stats();
    println!(
        "constructor calls: {} for {} allocations; magazine size {}, {} slab(s), {} KiB of slabs",
        stats.ctor_calls,
        3 * REQUESTS,
        stats.magazine_size,
        stats.slabs,
        stats.slab_bytes >> 10
    );
    cache.raw().reap();
    println!(
        "after reap: {} constructed objects, {} slab(s)",
        cache.raw().stats().constructed,
        cache.raw().stats().slabs
    );
    Ok(())
}
