//! loom models of `umem::boot`, the bootstrap arena that serves the global heap's
//! re-entrant requests: threads race to map the same chunk (one mapping is kept, the
//! loser's is given back), to reserve ranges of the bump word, and to move on past a
//! chunk too full for them; a thread handed a block by another recognises it as the
//! arena's with its size. Chunks are tiny (64 and 128 bytes) so that two requests fill
//! the first one.
//!
//! ```text
//! ci/loom.sh boot
//! ```
#![cfg(scalemem_loom)]

use loom::sync::Arc;
use loom::sync::atomic::AtomicPtr;
use loom::thread;
use std::sync::Mutex;
use std::sync::atomic::Ordering::{Acquire, Release};

use scalemem::umem::boot::{BootArena, ChunkSource};
use scalemem_loom_tests::run_model;

/// Two chunks: 64 bytes, then 128.
type Arena = BootArena<2>;

/// Chunks from 16-aligned heap buffers it keeps until dropped (plain memory: the model
/// checks the arena's atomics, not the blocks' bytes); counts maps and unmaps. Its locks
/// are never held across a loom operation, so they cannot block a loom thread.
#[derive(Default)]
struct Buffers {
    counts: Mutex<(usize, usize)>,
    chunks: Mutex<Vec<Box<[u128]>>>,
}

impl ChunkSource for Buffers {
    fn map(&self, bytes: usize) -> usize {
        self.counts.lock().unwrap().0 += 1;
        let mut words = vec![0u128; bytes / 16].into_boxed_slice();
        let base = words.as_mut_ptr() as usize;
        self.chunks.lock().unwrap().push(words);
        base
    }

    // SAFETY: nothing to uphold here: the caller's contract (a chunk no one holds) only
    // matters to a source that frees it, and this one frees its buffers when dropped.
    unsafe fn unmap(&self, _base: usize, _bytes: usize) {
        self.counts.lock().unwrap().1 += 1;
    }
}

impl Buffers {
    /// Mappings kept: maps less unmaps.
    fn kept(&self) -> usize {
        let (maps, unmaps) = *self.counts.lock().unwrap();
        maps - unmaps
    }
}

/// Takes a block of `size` bytes and checks what the arena promises of it: non-null,
/// 16-aligned, inside one chunk, its size recorded.
fn take(arena: &Arena, source: &Buffers, size: usize) -> (usize, usize) {
    let p = arena.alloc(size, 16, source);
    assert!(!p.is_null(), "a request that fits was refused");
    assert!((p as usize).is_multiple_of(16));
    assert!(arena.contains(p) && arena.contains(p.wrapping_add(size - 1)), "a block outside its chunk");
    // SAFETY: a block this arena's `alloc` returned.
    assert_eq!(unsafe { arena.size_of(p) }, size);
    // SAFETY: `size` writable bytes of our own block.
    unsafe { p.write_bytes(0xa5, size) };
    (p as usize, size)
}

/// Blocks (start, size) must not overlap, each with its size word before it.
fn assert_disjoint(mut blocks: Vec<(usize, usize)>) {
    blocks.sort();
    assert!(blocks.windows(2).all(|w| w[0].0 + w[0].1 + 8 <= w[1].0), "two blocks overlap: {blocks:?}");
}

/// Two threads take their first blocks from a fresh arena at once: both may map the
/// first chunk, one mapping is published and the other given back, and the blocks are
/// disjoint.
#[test]
fn racing_first_requests_map_the_chunk_once() {
    run_model("boot: two first requests race to map chunk 0", || {
        let arena = Arc::new(Arena::new(64));
        let source = Arc::new(Buffers::default());
        let other = {
            let (arena, source) = (arena.clone(), source.clone());
            thread::spawn(move || take(&arena, &source, 16))
        };
        let mine = take(&arena, &source, 16);
        let theirs = other.join().unwrap();
        assert_disjoint(vec![mine, theirs]);
        assert_eq!(arena.chunk_in_use(), 0, "two 16-byte blocks fit in 64 bytes");
        assert_eq!(source.kept(), 1, "chunk 0 kept twice, or a published mapping given back");
    });
}

/// Two 40-byte requests race on a 64-byte first chunk: one fits, the other moves the
/// bump word on to the second chunk (whoever gets there maps it). Both get disjoint
/// blocks inside a chunk, and each chunk is kept once.
#[test]
fn a_request_that_does_not_fit_moves_on() {
    run_model("boot: two requests race past a full chunk", || {
        let arena = Arc::new(Arena::new(64));
        let source = Arc::new(Buffers::default());
        let other = {
            let (arena, source) = (arena.clone(), source.clone());
            thread::spawn(move || take(&arena, &source, 40))
        };
        let mine = take(&arena, &source, 40);
        let theirs = other.join().unwrap();
        assert_disjoint(vec![mine, theirs]);
        assert_eq!(arena.chunk_in_use(), 1, "two 40-byte blocks do not fit in 64 bytes");
        assert_eq!(source.kept(), 2, "a chunk kept twice, or a published mapping given back");
        assert_eq!(arena.used(), 80);
        // A 64-byte block fills the second chunk's rest exactly; after it the arena is
        // spent (there is no third chunk).
        take(&arena, &source, 64);
        assert!(arena.alloc(16, 16, &*source).is_null());
        assert_eq!(source.kept(), 2);
    });
}

/// A block taken by one thread and handed to another through the program's own
/// Release/Acquire: the receiver recognises it as the arena's (its Relaxed loads of the
/// chunk bases see the base the taker published or read) and reads its size, while a
/// third request races to map the chunk.
#[test]
fn a_handed_block_is_recognised() {
    run_model("boot: a block handed to another thread is the arena's", || {
        let arena = Arc::new(Arena::new(64));
        let source = Arc::new(Buffers::default());
        let handed = Arc::new(AtomicPtr::new(core::ptr::null_mut::<u8>()));
        let taker = {
            let (arena, source, handed) = (arena.clone(), source.clone(), handed.clone());
            thread::spawn(move || {
                let (p, _) = take(&arena, &source, 16);
                // Release: the program's hand-off of the block.
                handed.store(p as *mut u8, Release);
            })
        };
        let racer = {
            let (arena, source) = (arena.clone(), source.clone());
            thread::spawn(move || take(&arena, &source, 16))
        };
        // Acquire: pairs with the hand-off's Release.
        let p = handed.load(Acquire);
        if !p.is_null() {
            assert!(arena.contains(p), "a handed block not recognised as the arena's");
            // SAFETY: a block of this arena, handed to us.
            assert_eq!(unsafe { arena.size_of(p) }, 16);
        }
        taker.join().unwrap();
        racer.join().unwrap();
        assert_eq!(source.kept(), 1);
    });
}
