//! [`RmLock<T>`]: a read-mostly lock whose read side writes no shared cache line, the
//! userspace analogue of FreeBSD's `rmlock(9)`.
//!
//! A read acquire writes the lock's tag into a slot of the thread's own reader record
//! (a cache line only that thread writes) and loads the writer flag, with a compiler
//! fence between; the release clears the slot the same way. A thread without a free
//! slot counts itself in per-CPU counters instead (an rseq `add`, no `lock` prefix). A
//! write acquire sets the flag, issues `membarrier` (the userspace IPI) and waits until
//! no record's slot and no count shows a reader inside. Reads are therefore a couple of
//! nanoseconds and scale with the number of CPUs; a write
//! costs a `membarrier` (under a microsecond to tens of microseconds, growing with the
//! number of other threads running) plus the wait. Use it where reads outnumber writes
//! by thousands to one.
//!
//! # Who it is for
//!
//! **A configuration or routing table read on every request** (see
//! `examples/rmlock_config.rs`): every request thread holds a read guard while it looks
//! a route up, and an administrator swaps in a new table a few times a minute.
//! `std::sync::RwLock` and `parking_lot::RwLock` make every reader write the lock's
//! word, so two cores reading the same lock bounce its cache line; `RmLock` readers
//! touch only their own record.
//!
//! ```
//! use std::collections::HashMap;
//! use scalemem::rmlock::RmLock;
//!
//! let routes = RmLock::new(HashMap::from([("/api", "10.0.0.1:8080")]));
//! // Every request:
//! let backend = routes.read().get("/api").copied();
//! assert_eq!(backend, Some("10.0.0.1:8080"));
//! // Rarely:
//! routes.write().insert("/static", "10.0.0.2:80");
//! ```
//!
//! **`umem`'s per-CPU cache reconfiguration** (magazine resize, reaping every CPU's
//! magazines, destroying a cache): the allocation and free fast paths hold the read
//! side around their per-CPU magazine operation, and the reaper takes the write side.
//! What that user relies on:
//! - Nothing on the read path allocates, formats or blocks in the fast case; the lock
//!   is created with [`RmLock::try_new`], which maps its memory from the kernel and
//!   never calls the global allocator; the thread-local it uses is `const`-initialised
//!   and has no destructor (so it works inside `GlobalAlloc` and during thread exit).
//! - [`RmLock::try_read`] never waits: on `None` a reconfiguration is running and the
//!   fast path falls back to the depot (or whatever needs no per-CPU state).
//! - The guard may be held across a CPU migration (counts are per CPU; only their sums
//!   mean anything) but must be dropped on the thread that took it (it is not `Send`).
//! - A reaper's [`RmLock::write`] costs one `membarrier` plus the wait for fast paths
//!   already inside, which are short; dropping the write guard wakes every thread that
//!   slept waiting for it. Reaping N caches is N membarriers: batch reconfigurations
//!   under one lock where that matters.
//!
//! ```
//! use scalemem::rmlock::RmLock;
//!
//! struct CacheConfig { magazine_rounds: usize }
//! let config = RmLock::try_new(CacheConfig { magazine_rounds: 16 }).expect("one page");
//!
//! // Fast path: never sleeps.
//! let rounds = match config.try_read() {
//!     Some(cfg) => cfg.magazine_rounds, // ... per-CPU magazine push/pop under the guard
//!     None => 0,                        // reconfiguration in progress: use the depot
//! };
//! assert_eq!(rounds, 16);
//!
//! // Reaper: excludes every fast path for the duration of the guard.
//! config.write().magazine_rounds = 32;
//! ```
//!
//! # The protocol
//!
//! The lock (`raw.rs`) holds `state` (the writer flag `WRITER`, plus `PARKED` while
//! someone sleeps on it), `drain` (the word a writer sleeps on while readers leave), its
//! *tag* (a non-zero word derived from a never-reused identity) and per-CPU *arrival*
//! and *departure* counts (monotone, `tracker.rs`). Each thread owns a *reader record*
//! of 8 slots from a process-wide registry (`slots.rs`), claimed on its first read and
//! given back at its exit. A thread's first (outermost) read of a lock:
//!
//! - **R1** arrive: store the tag into a free slot of its record (Release; the lock's
//!   home slot if free). With no free slot (8 other locks held) or no record (after its
//!   exit hook, or if registration failed): +1 on the current CPU's arrival count (rseq
//!   `add`, or a Relaxed `fetch_add` on the CPU's atomic word where the thread has no
//!   rseq);
//! - **R2** `fence::light()` (a compiler fence; a SeqCst fence in the symmetric mode).
//!   On the slot path the thread's record registration decides the kind once for the
//!   thread's life (a compiler fence if the mode was asymmetric then, else SeqCst), so
//!   the inline path reads no global mode word and never calls out to decide;
//! - **R3** load `state` (Acquire). `WRITER` clear: the reader is inside. Set: it
//!   departs at once (R4-R6, having touched no data), spins briefly then sleeps on
//!   `state` until `WRITER` clears, and starts again at R1.
//!
//! Its last release:
//!
//! - **R4** (counted readers) `fence(Release)` (free on x86-64);
//! - **R5** depart: store 0 into the slot (Release), or +1 on the current CPU's departure
//!   count (possibly another CPU's than R1's); then `fence::light()`;
//! - **R6** load `state` (Relaxed); if `WRITER` is set, *notify*: `drain.fetch_add`
//!   (SeqCst), and a futex wake if the writer sleeps on `drain`.
//!
//! A writer:
//!
//! - **W1** compare-exchange `state` from 0 to `WRITER` (Acquire): the writers' mutex
//!   and the readers' flag in one word. If another writer holds it, spin, then set
//!   `PARKED` and sleep on `state`.
//! - **W2** `fence::heavy()`: `membarrier(PRIVATE_EXPEDITED)`, a full barrier on every
//!   CPU running a thread of the process (SeqCst fences in the symmetric mode).
//! - **W3** wait until every visible reader has departed: no slot of any claimed record
//!   holds the lock's tag (Acquire loads), and the counts balance (sum the departure
//!   counts, an Acquire fence, sum the arrival counts, compare). Otherwise: spin; then
//!   `drain.fetch_or(WRITER_SLEEPING)` (SeqCst), check again, and sleep on `drain`.
//! - **W4** the critical section.
//! - **W5** swap `state` to 0 (Release); if `PARKED` was set, wake every sleeper on
//!   `state` (readers and writers; they all re-check).
//!
//! Nested reads of a lock the thread already holds in a slot only raise the slot's depth
//! (a word beside the slots that only the owner reads): they do not check the flag, and
//! only the release that finds the depth at zero clears the slot. Counted
//! reads are not tracked for recursion (see [`RmLock::read`]).
//!
//! # Why it is correct
//!
//! In the symmetric mode (and in loom, which checks it) `light` and `heavy` are SeqCst
//! fences, and the C++ rule for them gives, for a reader's fence `F_r` (R2 or R5) and a
//! writer's `F_w` (W2): if `F_r` precedes `F_w` in the total order of SeqCst fences,
//! every load the writer makes after W2 sees the reader's count update made before
//! `F_r`; otherwise the reader's load after `F_r` sees `WRITER` (stored by W1 before
//! `F_w`, and not cleared before W5).
//!
//! 1. **No reader is inside while a writer is.** Let reader `r` pass R3 while writer `w`
//!    holds the lock. `r` read `WRITER` clear, so its load read `state` from before W1
//!    (every value from W1 to W5 has `WRITER` set). By the fence rule `F_r` precedes
//!    `F_w`, so `w`'s W3 sees `r`'s arrival. *A slot reader*: `w` loads `r`'s record's
//!    `claimed` word and slot after W2, so it sees the claim and the tag (both stored
//!    before `F_r`) or a later store of that slot, which only `r` makes and only when it
//!    leaves: `w` waits until `r` has left. *A counted reader*: every departure `w` counts comes with its
//!    reader's arrival: the reader's R4 Release fence precedes the departure, `w`'s
//!    Acquire fence follows the read of the departure sums, so the arrival (made before
//!    R4) is visible to `w`'s later read of the arrival sums. The arrival sum therefore
//!    counts at least the readers of the departures counted, and equality means every
//!    reader whose arrival `w` counted has departed: `r` had left before `w` got in.
//!    A reader that arrives after `w` read its CPU's slot is not counted, but it sees
//!    `WRITER` (fence rule) and departs without touching data. Its departure may land on
//!    another CPU, and be counted without its arrival if the counts were one up-down
//!    counter: it would then cancel the +1 of a reader still inside. With separate
//!    monotone counts, read departures-first, it cannot (`tracker.rs`).
//! 2. **Readers' accesses happen before the writer's.** A slot reader's departure is a
//!    Release store, and so is every later store to that slot (its owner's next reads,
//!    of this lock or any other): whichever value `w`'s Acquire load reads, it
//!    synchronises with a store sequenced after `r`'s critical section. A counted
//!    reader: `r`'s R4 Release fence, its departure (a Relaxed RMW under the atomic
//!    fallback, which later RMWs on the word keep in the release sequence) read by `w`
//!    before the Acquire fence of W3.
//! 3. **The writer's accesses happen before later readers'.** A reader that passes R3
//!    read `WRITER` clear from a W5 (Release swap) or from something later in `state`'s
//!    modification order that W5 precedes: it synchronises with that W5, and with every
//!    earlier writer through W1's Acquire. Writers exclude each other through W1.
//! 4. **Recursion.** A nested read is covered by the thread's outermost hold, whose
//!    slot keeps the tag until the depth returns to zero: (1)-(3) apply to it. The
//!    depth is per thread and lock, so guards may drop in any order. Slots hold tags of
//!    lock identities, not addresses, so a guard leaked with `mem::forget` can never make
//!    a later lock at the same address look held.
//! 5. **No lost wake-up.** A writer sleeping on `drain`: a reader that departs does R5
//!    (`F_r`), then R6. If `F_r` precedes `F_w`, W3's sums see the departure; otherwise R6
//!    sees `WRITER` and notifies. The writer's `fetch_or` and the reader's `fetch_add` on
//!    `drain` are ordered: if the reader's comes first, the writer's reads it, so the
//!    departure (sequenced before it) is visible to the check that follows; if second,
//!    the reader reads `WRITER_SLEEPING` and wakes, and `drain` no longer holds the value
//!    the writer sleeps on (the futex re-checks it atomically with sleeping). Sleepers on
//!    `state` set `PARKED` by compare-exchange from a value with `WRITER`; W5's swap
//!    either reads `PARKED` and wakes them, or comes first and their compare-exchange
//!    fails.
//! 6. **A writer is not starved.** From `F_w` on, every new outermost reader sees
//!    `WRITER` and waits, so W3 waits only for readers that were inside at W2 (and
//!    their nested reads, which end with their outer guard). Readers are not protected
//!    the same way: a writer-heavy stream can starve them, as in FreeBSD's rmlock.
//!
//! **The asymmetric mode** replaces the SeqCst fences by a compiler fence and
//! `membarrier`, which makes every CPU running a thread of this process execute a full
//! barrier during W2 (a thread not running passes through a context switch, also a full
//! barrier): for each reader that barrier falls either before its R2/R5 fence point (then
//! the reader's next load sees `WRITER`) or after (then its slot store or count update
//! has left the store buffer before the writer's next load). The fence rule above holds for
//! multi-copy-atomic hardware (x86-64, AArch64); see [`crate::cpu::fence`]. The rseq
//! `add` is a plain read-modify-write that only its CPU commits; the threads that write
//! one CPU's word are serialised by context switches (full barriers), so the word
//! behaves like an atomic that only one thread writes, in program order
//! ([`crate::cpu::rseq`]). On x86-64 (the only target with our rseq sections) stores
//! are not reordered with earlier loads or stores and loads not with earlier loads, so
//! R4's Release fence and W3's Acquire fence need no instruction, and the critical
//! section's accesses stay before the departure.
//!
//! **Where membarrier is refused** (old kernels, seccomp, `SCALEMEM_FENCE=symmetric`,
//! [`crate::cpu::fence::use_symmetric`]), `fence::mode()` is symmetric from the first
//! fence on and both sides are SeqCst fences: correct by the argument above, each read
//! acquire and release then costs a SeqCst fence (5-8 ns here). A switch at run time is
//! safe (a reader still using a compiler fence is still covered by the membarrier that
//! `heavy` keeps issuing once registered).
//!
//! # Invariants
//! - `PARKED` is set only together with `WRITER`; `WRITER` is set by W1 and cleared by W5
//!   of the thread that set it (or by a failed `try_write`).
//! - Each counted hold arrives once and departs once; the counts only grow (wrapping at
//!   2^64). With no guard alive, the arrival and departure sums are equal.
//! - A slot of a thread's record holds a lock's tag, and its depth `d`, exactly while
//!   the thread holds `d + 1` slot-tracked read guards of that lock; a free slot has
//!   depth 0. Only the owner stores to its slots (always with Release) and depths.
//! - The read path never allocates, formats or panics; the only panic in `read` is the
//!   diagnosis of a thread waiting for its own write lock, on the slow path.
//!
//! # Costs and limits
//! - Read acquire + release: a thread-local load, two loads and two stores of the
//!   thread's own slot, two loads of `state` and of the fence mode, no fence
//!   instruction: about 3-4 ns on one thread on the AMD host of BENCHMARKS.md, against
//!   about 6.5 ns for `std` and `parking_lot` there, and no shared line written, so it
//!   does not slow down as readers are added. With the symmetric fallback add two
//!   SeqCst fences. A counted read (a thread without a free slot) costs two rseq adds
//!   instead of the slot stores (about twice as much); without rseq
//!   (`SCALEMEM_RSEQ=0`, other targets) those adds are uncontended `lock xadd`s on the
//!   CPU's own line.
//! - A thread's first read claims a record (a CAS over the registry, and a page from
//!   the kernel when all 21 records of every page are taken) and sets a pthread key
//!   whose destructor gives it back at exit. The registry only grows to the most
//!   threads ever reading at once; a writer scans every claimed record (8 slots each),
//!   so a write costs more with thousands of threads alive.
//! - Write: one `membarrier` (about 0.1 us with no other thread running, 10-35 us with
//!   others running, since it interrupts every CPU running one of them), plus the wait
//!   for readers inside; `try_write` pays the `membarrier` even when it fails.
//! - Memory: one mapping per lock of `cpu::possible()` x 128 bytes, rounded up to a
//!   page (one 4 KiB page up to 32 CPUs). Thousands of locks mean thousands of
//!   mappings: this is a lock for a few long-lived, hot objects.
//! - No poisoning (as in `parking_lot`): a panic while a write guard is held releases
//!   the lock with the data as the panicking code left it.
//! - Writer-preferring: waiting readers are woken together when a writer releases, and
//!   a writer that takes the lock in between goes first.
//! - Recursion is tracked for 8 different locks held at once per thread
//!   ([`RmLock::read`]); not async-signal-safe (do not read an
//!   `RmLock` in a signal handler that may interrupt a reader of it).
//! - A guard leaked with `mem::forget` keeps its lock read-locked forever (writers wait
//!   forever), as with `std::sync::RwLock`, and keeps its slot; a thread that exits
//!   with a slot in use keeps its record (192 bytes) claimed forever. Never unsound. A
//!   write guard leaked by a thread that has exited can make a later thread (reusing
//!   its thread-local block) panic in `read` instead of waiting forever.
//! - `fork()` copies the counts, the records and the flag as they are: a lock held by
//!   another thread of the parent stays held in the child, and the records of the
//!   parent's other threads stay claimed there. The allocator must take its write locks in
//!   a `pthread_atfork` prepare handler and release them in both processes after.

mod lock;
mod raw;
mod slots;
mod tracker;

pub use lock::{RmLock, RmReadGuard, RmWriteGuard};

/// Makes the calling model thread read every `RmLock` through the per-CPU counts (the
/// path of a thread without a free reader slot), so that loom models cover that path
/// too. Only under loom.
#[cfg(scalemem_loom)]
#[doc(hidden)]
pub fn loom_read_with_counts() {
    slots::force_counts();
}
