//! The bootstrap arena: memory for the requests the global heap cannot serve itself.
//!
//! A request that arrives while its thread is already inside the heap (the heap being
//! made, `dlsym` or the thread-exit registration allocating under us) must not re-enter
//! it. It takes a block from this arena instead: a bump allocator over chunks of address
//! space mapped on first use, chunk `i` holding `first << i` bytes, so that a process
//! reserves only what its set-up requests need. Blocks are never reused (a `free` of one
//! is ignored); each carries its size in the word before it, for `realloc` and
//! `malloc_usable_size`.
//!
//! # Protocol
//!
//! 1. **A chunk's base is published once.** A thread that finds `base[i]` zero maps a
//!    chunk and installs it with a compare-exchange (AcqRel: Release publishes the
//!    mapping, Acquire reads a winner's). A loser unmaps its own mapping, which no one
//!    else ever saw, and uses the winner's. A thread that finds the base non-zero loads
//!    it with Acquire.
//! 2. **The bump word** packs the chunk in use (bits [`CHUNK_SHIFT`]..) and the bytes of
//!    it handed out (the bits below). A thread reads it, computes where its block starts
//!    (after a size word, aligned) and ends, and reserves the range with one
//!    compare-exchange from the value it read to the next: the end in the same chunk, or
//!    the next chunk with nothing handed out when the block does not fit in the rest
//!    (the rest is left unused). The exchanges on the bump word are totally ordered, each
//!    moves it strictly forward from the value the previous one stored, and a range is
//!    taken only by the exchange that stored its end, so **no two blocks overlap**. The
//!    exchange is Relaxed: it orders no memory, since the chunk's memory is fresh from
//!    the kernel and each range is written only by its taker (which read the chunk's
//!    base itself, by step 1).
//! 3. The taker writes the block's size into the word before the block, then returns it.
//!    Whoever is handed the block later learnt of it through a chain that starts after
//!    that write.
//! 4. [`BootArena::contains`] loads each base Relaxed: a caller asks about a pointer it
//!    was handed, and the chain that handed it the pointer starts after the taker's
//!    Acquire or Release of that base (step 1), so the base is visible to it.
//!
//! # Invariants
//!
//! - A chunk's base is 0 until published, then never changes; the chunk index in the
//!   bump word never decreases, and its byte count never exceeds the chunk's size.
//! - Every block lies inside one published chunk, after its size word, aligned as asked.
//! - A request larger than half the largest chunk, or aligned to more than that, gets
//!   null, and so does every request once the last chunk is spent or the kernel refuses
//!   a chunk; a refusal publishes nothing, so a later request tries again.
//!
//! The loom model `loom-tests/tests/boot.rs` runs steps 1, 2 and 4 with tiny chunks:
//! threads racing to map the same chunk and to move on past a full one, and a thread
//! asking about a block another handed it.

use crate::sync::atomic::{AtomicUsize, Ordering};

/// Shift of the chunk index in the bump word.
pub const CHUNK_SHIFT: u32 = 56;

/// Where a [`BootArena`] gets its chunks: the kernel for the global heap's arena, a
/// buffer in the tests and the loom model.
pub trait ChunkSource {
    /// The address of `bytes` fresh bytes, readable and writable, aligned to at least
    /// 16; 0 if refused.
    fn map(&self, bytes: usize) -> usize;

    /// Gives back a chunk that [`map`](Self::map) returned and that was never published.
    ///
    /// # Safety
    /// `base` came from `map(bytes)` and no one holds a pointer into it.
    unsafe fn unmap(&self, base: usize, bytes: usize);
}

/// A bump allocator over `CHUNKS` chunks of doubling size (module documentation).
pub struct BootArena<const CHUNKS: usize> {
    /// Bytes of chunk 0; chunk `i` holds `first << i`.
    first: usize,
    /// Each chunk's base once mapped (0 before).
    base: [AtomicUsize; CHUNKS],
    /// The bump word: the chunk in use (bits [`CHUNK_SHIFT`]..) and the bytes of it handed
    /// out.
    at: AtomicUsize,
    /// Bytes handed out over all chunks (a statistic).
    used: AtomicUsize,
}

impl<const CHUNKS: usize> BootArena<CHUNKS> {
    /// An arena whose first chunk holds `first` bytes (a multiple of 16), nothing mapped.
    #[cfg(not(scalemem_loom))]
    pub const fn new(first: usize) -> Self {
        Self {
            first,
            base: [const { AtomicUsize::new(0) }; CHUNKS],
            at: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
        }
    }

    /// An arena whose first chunk holds `first` bytes (a multiple of 16), nothing mapped.
    #[cfg(scalemem_loom)]
    pub fn new(first: usize) -> Self {
        Self {
            first,
            base: core::array::from_fn(|_| AtomicUsize::new(0)),
            at: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
        }
    }

    /// Bytes of chunk `i`.
    pub const fn chunk_bytes(&self, i: usize) -> usize {
        self.first << i
    }

    /// The base of chunk `i`, mapping it on first use (step 1); 0 if the source refuses.
    fn base_of(&self, i: usize, source: &impl ChunkSource) -> usize {
        // Acquire: pairs with the AcqRel exchange below (the mapping is there).
        let base = self.base[i].load(Ordering::Acquire);
        if base != 0 {
            return base;
        }
        let mapped = source.map(self.chunk_bytes(i));
        if mapped == 0 {
            return 0;
        }
        // AcqRel: publishes our mapping (Release) or reads the winner's (Acquire).
        match self.base[i].compare_exchange(0, mapped, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => mapped,
            Err(winner) => {
                // SAFETY: mapped just above with this length, never published.
                unsafe { source.unmap(mapped, self.chunk_bytes(i)) };
                winner
            }
        }
    }

    /// A block of `size` bytes aligned to `align` (a power of two, at least 16), with its
    /// size in the word before it; null when the arena is spent, the request is larger
    /// (or more aligned) than half the largest chunk, or the source refuses a chunk.
    pub fn alloc(&self, size: usize, align: usize, source: &impl ChunkSource) -> *mut u8 {
        let largest = self.chunk_bytes(CHUNKS - 1);
        if size > largest / 2 || align > largest / 2 {
            return core::ptr::null_mut();
        }
        // Relaxed: step 2 (the exchange orders no memory).
        let mut at = self.at.load(Ordering::Relaxed);
        loop {
            let (chunk, handed) = (at >> CHUNK_SHIFT, at & ((1 << CHUNK_SHIFT) - 1));
            if chunk >= CHUNKS {
                return core::ptr::null_mut();
            }
            let base = self.base_of(chunk, source);
            if base == 0 {
                return core::ptr::null_mut();
            }
            // The block starts after a size word, aligned. No overflow: every term is
            // below the largest chunk plus the base, far from usize::MAX.
            let start = (base + handed + 8).next_multiple_of(align);
            let end = start + size;
            let next = if end > base + self.chunk_bytes(chunk) {
                // On to the next chunk (which may be too small too: the loop moves on).
                (chunk + 1) << CHUNK_SHIFT
            } else {
                chunk << CHUNK_SHIFT | (end - base)
            };
            // Relaxed: step 2.
            match self.at.compare_exchange_weak(at, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) if next >> CHUNK_SHIFT == chunk => {
                    // Relaxed: a statistic.
                    self.used.fetch_add(size, Ordering::Relaxed);
                    // SAFETY: `start - 8 .. end` lies in the chunk, in the range this
                    // exchange reserved for us alone; `start - 8` is 8-aligned (start is
                    // 16-aligned).
                    unsafe { ((start - 8) as *mut usize).write(size) };
                    return start as *mut u8;
                }
                Ok(_) => at = next,
                Err(now) => at = now,
            }
        }
    }

    /// Whether `ptr` points into one of the arena's chunks (step 4: `ptr` is a pointer the
    /// caller was handed, or any address it wants to ask about).
    #[inline]
    pub fn contains(&self, ptr: *const u8) -> bool {
        (0..CHUNKS).any(|i| {
            // Relaxed: step 4.
            let base = self.base[i].load(Ordering::Relaxed);
            base != 0 && (ptr as usize).wrapping_sub(base) < self.chunk_bytes(i)
        })
    }

    /// The size [`alloc`](Self::alloc) recorded for a block.
    ///
    /// # Safety
    /// `ptr` is a block this arena's `alloc` returned.
    pub unsafe fn size_of(&self, ptr: *const u8) -> usize {
        // SAFETY: `alloc` wrote the size in the word before every block (step 3).
        unsafe { ptr.cast::<usize>().sub(1).read() }
    }

    /// Bytes handed out so far over all chunks (a statistic).
    pub fn used(&self) -> usize {
        // Relaxed: a statistic.
        self.used.load(Ordering::Relaxed)
    }

    /// The chunk the bump word is in (for tests).
    #[cfg(any(test, scalemem_loom))]
    pub fn chunk_in_use(&self) -> usize {
        // Relaxed: a snapshot for a test.
        self.at.load(Ordering::Relaxed) >> CHUNK_SHIFT
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;
    use crate::sync::atomic::AtomicUsize;
    use std::alloc::Layout;

    /// Chunks from 16-aligned, zeroed heap buffers it keeps (and frees when dropped,
    /// after the arena that used them); counts maps and unmaps; refuses after `limit`
    /// maps (at most 64: 8 threads racing for each of 6 chunks map 48 at most). Atomics only, no `Mutex`: ThreadSanitizer does not see into std's futex
    /// paths.
    struct Buffers {
        limit: usize,
        maps: AtomicUsize,
        unmaps: AtomicUsize,
        /// Each map's (address, bytes), by map number.
        chunks: [(AtomicUsize, AtomicUsize); 64],
    }

    impl Buffers {
        fn new(limit: usize) -> Self {
            Self {
                limit: limit.min(64),
                maps: AtomicUsize::new(0),
                unmaps: AtomicUsize::new(0),
                chunks: core::array::from_fn(|_| (AtomicUsize::new(0), AtomicUsize::new(0))),
            }
        }

        /// Maps kept: maps less unmaps.
        fn kept(&self) -> usize {
            // Relaxed: read after the threads that mapped were joined.
            self.maps.load(Ordering::Relaxed) - self.unmaps.load(Ordering::Relaxed)
        }
    }

    impl ChunkSource for Buffers {
        fn map(&self, bytes: usize) -> usize {
            // Relaxed: a counter; each map takes its own number below the limit.
            let Ok(n) =
                self.maps.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.limit).then_some(n + 1))
            else {
                return 0;
            };
            let layout = Layout::from_size_align(bytes, 16).unwrap();
            // SAFETY: a non-zero size (every chunk is).
            let base = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
            assert_ne!(base, 0);
            // Relaxed: read by `drop`, after every thread that maps is gone.
            self.chunks[n].0.store(base, Ordering::Relaxed);
            self.chunks[n].1.store(bytes, Ordering::Relaxed);
            base
        }

        // SAFETY: nothing to uphold here: the buffer is freed with the others on drop.
        unsafe fn unmap(&self, _base: usize, _bytes: usize) {
            // Relaxed: a counter (the buffer itself is freed with the others on drop).
            self.unmaps.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Drop for Buffers {
        fn drop(&mut self) {
            for (base, bytes) in &self.chunks {
                // Relaxed: exclusive access (`&mut self`).
                let (base, bytes) = (base.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
                if base != 0 {
                    // SAFETY: allocated in `map` with this layout, freed once.
                    unsafe { std::alloc::dealloc(base as *mut u8, Layout::from_size_align(bytes, 16).unwrap()) };
                }
            }
        }
    }

    /// Blocks are aligned, carry their sizes, never overlap, and move on to the next
    /// chunk when the rest of one is too small; oversized requests and a spent arena give
    /// null.
    #[test]
    fn bumps_through_chunks() {
        let arena = BootArena::<3>::new(256);
        let source = Buffers::new(usize::MAX);
        let a = arena.alloc(100, 16, &source);
        let b = arena.alloc(100, 32, &source);
        assert!(!a.is_null() && !b.is_null() && (b as usize).is_multiple_of(32));
        assert_eq!(arena.chunk_in_use(), 0);
        // 100 + 8 + 100 (+ alignment) of 256 handed out: 200 more do not fit.
        let c = arena.alloc(200, 16, &source);
        assert_eq!(arena.chunk_in_use(), 1);
        // SAFETY: all three came from this arena's `alloc`.
        assert_eq!(unsafe { (arena.size_of(a), arena.size_of(b), arena.size_of(c)) }, (100, 100, 200));
        let mut ranges = [(a as usize, 100), (b as usize, 100), (c as usize, 200)];
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 + 8 <= w[1].0), "blocks overlap");
        assert!([a, b, c].iter().all(|&p| arena.contains(p)));
        assert!(!arena.contains(&ranges as *const _ as *const u8));
        // Half the largest chunk (1024) at most.
        assert!(arena.alloc(513, 16, &source).is_null() && arena.alloc(16, 1024, &source).is_null());
        let d = arena.alloc(512, 16, &source);
        assert!(!d.is_null() && arena.contains(d) && arena.chunk_in_use() == 2);
        assert_eq!(arena.used(), 912);
        // The last chunk's rest (1024 - 520) cannot hold 512 more: spent.
        assert!(arena.alloc(512, 16, &source).is_null());
        assert_eq!((source.maps.load(Ordering::Relaxed), source.kept()), (3, 3));
    }

    /// A refused chunk publishes nothing: the request gets null, and a later one, once
    /// the source gives memory again, gets a block.
    #[test]
    fn refusal_is_not_remembered() {
        let arena = BootArena::<2>::new(64);
        let mut source = Buffers::new(0);
        assert!(arena.alloc(16, 16, &source).is_null());
        source.limit = 1;
        let p = arena.alloc(16, 16, &source);
        assert!(!p.is_null() && arena.contains(p));
    }

    /// Threads racing on one arena get disjoint blocks; every chunk is mapped once for
    /// good (a losing mapping is given back).
    #[test]
    fn threads_get_disjoint_blocks() {
        let arena = BootArena::<6>::new(1024);
        let source = Buffers::new(usize::MAX);
        let mut blocks: Vec<(usize, usize, u8)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..8usize)
                .map(|t| {
                    let (arena, source) = (&arena, &source);
                    s.spawn(move || {
                        let mut mine = Vec::new();
                        for i in 0..64 {
                            let size = 16 + 8 * ((t + i) % 7);
                            let p = arena.alloc(size, 16, source);
                            if p.is_null() {
                                break;
                            }
                            // SAFETY: `size` writable bytes of our own block.
                            unsafe { p.write_bytes(t as u8, size) };
                            mine.push((p as usize, size, t as u8));
                        }
                        mine
                    })
                })
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        blocks.sort();
        assert!(blocks.windows(2).all(|w| w[0].0 + w[0].1 + 8 <= w[1].0), "blocks overlap");
        for &(p, size, t) in &blocks {
            // SAFETY: a live block of `size` bytes from this arena.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, size) };
            assert!(bytes.iter().all(|&b| b == t), "a block was written by another thread");
            // SAFETY: as above, a block of this arena.
            assert_eq!(unsafe { arena.size_of(p as *const u8) }, size);
        }
        assert_eq!(source.kept(), arena.chunk_in_use().min(5) + 1, "a chunk mapped for good twice");
    }
}
