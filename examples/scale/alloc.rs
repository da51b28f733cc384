//! The `alloc` group: umem's global allocator ([`scalemem::Umem`]) beside glibc
//! (`std::alloc::System`), jemalloc (`tikv-jemallocator`) and mimalloc (the `mimalloc`
//! crate), each called directly through its `GlobalAlloc` impl (the runner's own global
//! allocator stays `System`), on two workloads of BENCHMARKING.md:
//!
//! - `batch` (workload 1): each thread loops: allocate [`BLOCKS`] blocks of S bytes,
//!   touching each (its first byte, and one byte in every further 4 KiB page it spans),
//!   then free them in allocation order; one op = one loop. S is 256, 4096 and 65536
//!   bytes in quick mode; 256, 1024, 4096, 16384 and 65536 with `--full`. The minor page
//!   faults of the whole process over the cell (`getrusage`, thread start-up included:
//!   a few pages per thread beside thousands of allocations) divided by the allocations
//!   go into a note.
//! - `remote` (workload 2): T/2 producer/consumer pairs. The producer allocates blocks of
//!   64..=4096 bytes (sizes from a xorshift), writes each block's size into its first
//!   word and passes the pointer through a bounded single-producer single-consumer ring
//!   of [`RING`] slots (atomics only, nothing allocated per message); the consumer reads
//!   the size and frees the block, so every free is a remote one. One op = one free.
//!   Pairs need an even thread count: 1 and odd counts have no cell.
//!
//! Beside the four allocators, umem's Rust API runs both workloads: an `ObjectCache`
//! (no constructor) of S-byte objects for a batch cell and of 4096-byte objects for a
//! remote one, called through a small `GlobalAlloc` adapter (`CacheAlloc`).
//!
//! Blocks are 8-byte aligned (a `Box<[u64]>`'s layout). A failed allocation ends the run
//! through `handle_alloc_error`. jemalloc and mimalloc are not built under
//! `--cfg scalemem_asan`, `scalemem_tsan` or `scalemem_loom` (Cargo.toml); there the group compares umem
//! with glibc only.

use std::alloc::{GlobalAlloc, Layout, System, handle_alloc_error};
use std::hint::spin_loop;
use std::sync::Barrier;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use scalemem::Umem;
use scalemem::umem::ObjectCache;

use crate::Ctx;
use crate::batch::{self, BLOCKS};
use crate::harness::{self, Measure, Run, StopOnDrop, ThreadRun};
use crate::model::{self, GroupReport, RateTable};

/// The contenders, in row order; umem's global allocator first (the ratios divide by the
/// peers), its object cache second (an `ObjectCache` of S bytes for a batch cell, of the
/// largest remote size for a remote one), then the peers in [`on_peer!`]'s order.
#[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
const CONTENDERS: [&str; 5] = ["scalemem Umem", "scalemem ObjectCache", "glibc (System)", "jemalloc", "mimalloc"];
#[cfg(any(scalemem_asan, scalemem_tsan, scalemem_loom))]
const CONTENDERS: [&str; 3] = ["scalemem Umem", "scalemem ObjectCache", "glibc (System)"];

/// umem's Rust API as a contender: an [`ObjectCache`] whose objects are at least as large
/// as every block the cell asks for, so the layout is not looked at.
struct CacheAlloc(ObjectCache);

// SAFETY: `alloc` returns null or an object of the cache (at least the layout's size,
// aligned to ALIGN, the alignment of every layout here); `dealloc` gives it back once.
unsafe impl GlobalAlloc for CacheAlloc {
    unsafe fn alloc(&self, _: Layout) -> *mut u8 {
        self.0.alloc().map_or(std::ptr::null_mut(), std::ptr::NonNull::as_ptr)
    }

    unsafe fn dealloc(&self, block: *mut u8, _: Layout) {
        // SAFETY: `block` came from `alloc` (not null: the cell stops on null) and is
        // freed once; the cache has no constructor, so any bytes are an object.
        let freed = unsafe { self.0.free(std::ptr::NonNull::new_unchecked(block)) };
        assert!(freed.is_ok(), "the object cache refused its own object");
    }
}

/// Block sizes of the batch workload.
const SIZES_QUICK: [usize; 3] = [256, 4096, 65536];
const SIZES_FULL: [usize; 5] = [256, 1024, 4096, 16384, 65536];

/// Cells per thread count, for the runner's time estimate: one batch table per size and
/// the remote table.
pub fn cells(full: bool) -> usize {
    CONTENDERS.len() * (if full { SIZES_FULL.len() } else { SIZES_QUICK.len() } + 1)
}

/// Slots of a producer/consumer ring.
pub const RING: usize = 256;
/// The remote workload's block sizes: `MIN_REMOTE..=MAX_REMOTE`.
const MIN_REMOTE: usize = 64;
const MAX_REMOTE: usize = 4096;
/// The alignment of every block.
const ALIGN: usize = 8;

/// Runs `$f(&allocator, args...)` for peer `$peer`: 0 `Umem`, then glibc, jemalloc and
/// mimalloc ([`CONTENDERS`] without the object cache).
macro_rules! on_peer {
    ($peer:expr, $f:ident($($arg:expr),*)) => {
        match $peer {
            0 => $f(&Umem::new(), $($arg),*),
            1 => $f(&System, $($arg),*),
            #[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
            2 => $f(&tikv_jemallocator::Jemalloc, $($arg),*),
            #[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
            3 => $f(&mimalloc::MiMalloc, $($arg),*),
            other => unreachable!("no contender {other}"),
        }
    };
}

/// Minor page faults of the whole process so far.
fn minor_faults() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a writable rusage for getrusage to fill; RUSAGE_SELF is a valid
    // `who`, so the call cannot fail (and a zeroed rusage is a valid one if it did).
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    usage.ru_minflt as u64
}

/// One repetition of a batch cell: the run, and minor faults per allocation.
pub struct BatchRep {
    run: Run,
    faults_per_alloc: f64,
}

fn batch_cell<A: GlobalAlloc + Sync>(alloc: &A, threads: usize, secs: f64, size: usize) -> BatchRep {
    let layout = Layout::from_size_align(size, ALIGN).expect("a valid layout");
    let before = minor_faults();
    // One loop between looks at the stop flag: a loop of 64 KiB blocks takes up to
    // milliseconds.
    let run = harness::run_batched(threads, secs, 1, |_| batch::op(alloc, layout));
    let faults = minor_faults().saturating_sub(before);
    // The warm-up loop each thread runs before the barrier allocates too.
    let allocations = (run.total_ops() + threads as u64) * BLOCKS as u64;
    BatchRep { run, faults_per_alloc: faults as f64 / allocations as f64 }
}

/// Sets its flag (Release) when dropped: a producer says it pushes no more, a consumer
/// that it pops no more, even when unwinding.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        // Release: a producer's pushes happen before a consumer that sees the flag.
        self.0.store(true, Release);
    }
}

/// A bounded single-producer single-consumer ring of block pointers. Each side keeps a
/// copy of the other side's index and reloads it only when the ring looks full (or
/// empty), so that the two index lines do not bounce on every message.
struct Ring {
    slots: [AtomicPtr<u8>; RING],
    /// Messages popped so far; written by the consumer only.
    head: CachePadded<AtomicUsize>,
    /// Messages pushed so far; written by the producer only.
    tail: CachePadded<AtomicUsize>,
    /// The producer pushes no more.
    producer_done: AtomicBool,
    /// The consumer pops no more (it panicked): the producer must not wait for room.
    consumer_gone: AtomicBool,
}

impl Ring {
    fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            producer_done: AtomicBool::new(false),
            consumer_gone: AtomicBool::new(false),
        }
    }
}

/// The producer's end: its own count of pushes and its last look at the consumer's.
struct Producer<'a> {
    ring: &'a Ring,
    tail: usize,
    head: usize,
}

impl Producer<'_> {
    /// Pushes `block`, or gives it back if the ring is full.
    fn push(&mut self, block: *mut u8) -> Result<(), *mut u8> {
        if self.tail - self.head == RING {
            // Acquire: the consumer's load of a slot happens before we overwrite it.
            self.head = self.ring.head.load(Acquire);
            if self.tail - self.head == RING {
                return Err(block);
            }
        }
        // Relaxed: published by the Release store of the tail.
        self.ring.slots[self.tail % RING].store(block, Relaxed);
        self.tail += 1;
        // Release: the slot, and the block's contents, before the consumer sees the tail.
        self.ring.tail.store(self.tail, Release);
        Ok(())
    }
}

/// The consumer's end: its own count of pops and its last look at the producer's.
struct Consumer<'a> {
    ring: &'a Ring,
    head: usize,
    tail: usize,
}

impl Consumer<'_> {
    fn pop(&mut self) -> Option<*mut u8> {
        if self.head == self.tail {
            // Acquire: pairs with the producer's Release store of the tail.
            self.tail = self.ring.tail.load(Acquire);
            if self.head == self.tail {
                return None;
            }
        }
        // Relaxed: the Acquire load of the tail ordered the producer's store before it.
        let block = self.ring.slots[self.head % RING].load(Relaxed);
        self.head += 1;
        // Release: our load of the slot before the producer reuses it.
        self.ring.head.store(self.head, Release);
        Some(block)
    }
}

/// Waits for the other side of a ring: spins a little, then yields the CPU (on an
/// oversubscribed machine the other side may not be running at all).
fn wait(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        spin_loop();
    } else {
        thread::yield_now();
    }
}

/// A xorshift64 step: the remote workload's block sizes.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn remote_layout(size: usize) -> Layout {
    Layout::from_size_align(size, ALIGN).expect("a valid layout")
}

/// Allocates blocks and pushes them until `stop`; then says it is done.
fn produce<A: GlobalAlloc>(alloc: &A, ring: &Ring, seed: u64, stop: &AtomicBool, start_line: &Barrier) -> ThreadRun {
    let _done = SetOnDrop(&ring.producer_done);
    let mut producer = Producer { ring, tail: 0, head: 0 };
    let mut state = seed | 1;
    start_line.wait();
    let start = Instant::now();
    let mut ops = 0u64;
    // Relaxed: see StopOnDrop.
    while !ops.is_multiple_of(harness::BATCH) || !stop.load(Relaxed) {
        let size = MIN_REMOTE + (xorshift(&mut state) % (MAX_REMOTE - MIN_REMOTE + 1) as u64) as usize;
        let layout = remote_layout(size);
        // SAFETY: `layout` has a nonzero size.
        let block = unsafe { alloc.alloc(layout) };
        if block.is_null() {
            handle_alloc_error(layout);
        }
        // SAFETY: a live block of at least 64 bytes aligned to 8: room for a usize.
        unsafe { block.cast::<usize>().write(size) };
        let mut message = block;
        let mut spins = 0;
        while let Err(back) = producer.push(message) {
            // Acquire: nothing to order; the consumer is gone for good.
            if ring.consumer_gone.load(Acquire) {
                // SAFETY: allocated above with `layout`, never pushed, freed once.
                unsafe { alloc.dealloc(back, layout) };
                return ThreadRun { ops, start, end: Instant::now() };
            }
            message = back;
            wait(&mut spins);
        }
        ops += 1;
    }
    ThreadRun { ops, start, end: Instant::now() }
}

/// Pops and frees blocks until `stop` (timed), then frees what is left in the ring until
/// the producer is done (not timed).
fn consume<A: GlobalAlloc>(alloc: &A, ring: &Ring, stop: &AtomicBool, start_line: &Barrier) -> ThreadRun {
    let _gone = SetOnDrop(&ring.consumer_gone);
    let mut consumer = Consumer { ring, head: 0, tail: 0 };
    let free = |block: *mut u8| {
        // SAFETY: the producer wrote the block's size into its first word before the
        // Release store that published the pointer, and our pop's Acquire load saw it.
        let size = unsafe { block.cast::<usize>().read() };
        // SAFETY: the producer allocated the block with this layout through `alloc` and
        // gave it up when it pushed it; each pointer is popped once, so freed once.
        unsafe { alloc.dealloc(block, remote_layout(size)) };
    };
    start_line.wait();
    let start = Instant::now();
    let mut ops = 0u64;
    let mut spins = 0;
    loop {
        match consumer.pop() {
            Some(block) => {
                free(block);
                ops += 1;
                spins = 0;
                // Relaxed: see StopOnDrop.
                if ops.is_multiple_of(harness::BATCH) && stop.load(Relaxed) {
                    break;
                }
            }
            None if stop.load(Relaxed) => break,
            None => wait(&mut spins),
        }
    }
    let end = Instant::now();
    loop {
        // Acquire: every push happened before; an empty ring after this is empty for good.
        let done = ring.producer_done.load(Acquire);
        match consumer.pop() {
            Some(block) => free(block),
            None if done => break,
            None => wait(&mut spins),
        }
    }
    ThreadRun { ops, start, end }
}

/// `threads / 2` pairs; thread `2i` produces for thread `2i + 1`.
fn remote_cell<A: GlobalAlloc + Sync>(alloc: &A, threads: usize, secs: f64) -> Run {
    let pairs = threads / 2;
    assert!(pairs > 0 && threads.is_multiple_of(2), "the remote workload runs pairs of threads");
    let rings: Vec<Ring> = (0..pairs).map(|_| Ring::new()).collect();
    let stop = AtomicBool::new(false);
    let start_line = Barrier::new(threads + 1);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|index| {
                let (ring, stop, start_line) = (&rings[index / 2], &stop, &start_line);
                scope.spawn(move || {
                    if index % 2 == 0 {
                        produce(alloc, ring, 0x9e37_79b9_7f4a_7c15 ^ index as u64, stop, start_line)
                    } else {
                        consume(alloc, ring, stop, start_line)
                    }
                })
            })
            .collect();
        let stopper = StopOnDrop(&stop);
        start_line.wait();
        thread::sleep(Duration::from_secs_f64(secs));
        drop(stopper);
        Run { threads: workers.into_iter().map(|w| w.join().expect("a worker thread panicked")).collect() }
    })
}

/// Frees per second over the consumers (odd threads), over the whole span; ns = T x
/// span / frees.
fn frees(run: &Run) -> Option<(f64, f64)> {
    let frees: u64 = run.threads.iter().skip(1).step_by(2).map(|t| t.ops).sum();
    let span = run.span();
    Some((frees as f64 / span / 1e6, run.threads.len() as f64 * span * 1e9 / frees.max(1) as f64))
}

/// Faults per allocation: three decimals, and "<0.001" for fewer than one fault in
/// 2,000 allocations.
fn fmt_faults(x: f64) -> String {
    match x {
        x if x < 0.0005 => "<0.001".to_owned(),
        x if x >= 10.0 => format!("{x:.1}"),
        x => format!("{x:.3}"),
    }
}

/// "umem / peer" ratios of the medians of a table, one clause per peer; `label` names
/// the table.
fn ratios(label: &str, table: &RateTable) -> String {
    let Some((umem, peers)) = table.rows.split_first() else { return String::new() };
    let clauses: Vec<String> = peers
        .iter()
        .filter(|peer| !peer.name.starts_with("scalemem"))
        .map(|peer| {
            let at: Vec<String> = umem
                .cells
                .iter()
                .filter_map(|u| {
                    let p = peer.cells.iter().find(|c| c.threads == u.threads)?;
                    Some(format!("T={} {:.2}x", u.threads, u.mops.median / p.mops.median))
                })
                .collect();
            format!("{} {}", peer.name, at.join(", "))
        })
        .collect();
    format!("{label}: {} / peer, ratio of the median rates: {}", umem.name, clauses.join("; "))
}

pub fn group(ctx: &Ctx) -> GroupReport {
    let sizes: &[usize] = if ctx.full { &SIZES_FULL } else { &SIZES_QUICK };
    let mut rates = Vec::new();
    let mut notes = Vec::new();
    for &size in sizes {
        let reps =
            ctx.measure(&format!("alloc batch {size} B"), &CONTENDERS, &ctx.threads, |peer, threads| match peer {
                0 => batch_cell(&Umem::new(), threads, ctx.secs, size),
                1 => {
                    let cache = ObjectCache::new("scale-batch", size, ALIGN, None, None).expect("an object cache");
                    batch_cell(&CacheAlloc(cache), threads, ctx.secs, size)
                }
                other => on_peer!(other - 1, batch_cell(threads, ctx.secs, size)),
            });
        let faults: Vec<Vec<Measure>> = reps
            .iter()
            .map(|per_threads| {
                per_threads.iter().map(|reps| Measure::of(reps.iter().map(|r| r.faults_per_alloc).collect())).collect()
            })
            .collect();
        let runs: Vec<Vec<Vec<Run>>> = reps
            .into_iter()
            .map(|per_threads| per_threads.into_iter().map(|reps| reps.into_iter().map(|r| r.run).collect()).collect())
            .collect();
        let table = RateTable {
            title: format!("batch {size} B: loops of {BLOCKS} allocations + {BLOCKS} frees, Mops/s over all threads"),
            rows: CONTENDERS
                .iter()
                .zip(&runs)
                .map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, model::whole))
                .collect(),
        };
        notes.push(ratios(&format!("batch {size} B"), &table));
        let faults: Vec<String> = CONTENDERS
            .iter()
            .zip(&faults)
            .map(|(name, per_threads)| {
                let at: Vec<String> = ctx
                    .threads
                    .iter()
                    .zip(per_threads)
                    .map(|(threads, m)| format!("T={threads} {}", fmt_faults(m.median)))
                    .collect();
                format!("{name} {}", at.join(", "))
            })
            .collect();
        notes.push(format!(
            "batch {size} B: minor page faults per allocation (the process's, over the cell; median of the \
             repetitions): {}",
            faults.join("; ")
        ));
        rates.push(table);
    }
    let pairs: Vec<usize> = ctx.threads.iter().copied().filter(|t| t.is_multiple_of(2)).collect();
    if pairs.is_empty() {
        notes.push("remote: no even thread count in this run, so no producer/consumer pairs; not measured".to_owned());
    } else {
        let runs = ctx.measure("alloc remote", &CONTENDERS, &pairs, |peer, threads| match peer {
            0 => remote_cell(&Umem::new(), threads, ctx.secs),
            1 => {
                let cache = ObjectCache::new("scale-remote", MAX_REMOTE, ALIGN, None, None).expect("an object cache");
                remote_cell(&CacheAlloc(cache), threads, ctx.secs)
            }
            other => on_peer!(other - 1, remote_cell(threads, ctx.secs)),
        });
        let table = RateTable {
            title: "remote: frees of blocks another thread allocated, Mops/s over all threads".to_owned(),
            rows: CONTENDERS.iter().zip(&runs).map(|(name, runs)| model::rate_row(name, &pairs, runs, frees)).collect(),
        };
        notes.push(ratios("remote", &table));
        rates.push(table);
    }
    GroupReport {
        id: "alloc",
        title: "alloc: umem (GlobalAlloc and ObjectCache) against glibc, jemalloc and mimalloc (called directly)",
        about: format!(
            "batch: each thread allocates {BLOCKS} blocks of S bytes (touching the first byte and one byte per \
             further 4 KiB page), then frees them in allocation order; one op = one loop (ns: per loop per \
             thread). remote: T/2 pairs, each a producer allocating {MIN_REMOTE}..={MAX_REMOTE}-byte blocks and \
             passing them through a {RING}-slot SPSC ring to a consumer that frees them; one op = one free (ns: \
             T x elapsed / frees; no cell at 1 or an odd T). Every contender is called through its GlobalAlloc \
             impl with 8-byte alignment. The plot shows the first batch table."
        ),
        rates,
        notes,
        ..GroupReport::default()
    }
}
