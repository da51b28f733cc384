//! Epoch-based reclamation (EBR) whose read side writes no shared cache line.
//!
//! A thread *pins* before it reads a lock-free structure and unpins after; an object
//! unlinked from the structure is *retired* (deferred) and freed only once every thread
//! that could have seen it has unpinned. The API follows crossbeam-epoch ([`pin`],
//! [`Guard`], [`Atomic`], [`Owned`], [`Shared`], [`Collector`], [`LocalHandle`],
//! [`unprotected`]), plus an intrusive, allocation-free [`Guard::retire`] for the
//! allocator's own metadata.
//!
//! # The algorithm
//!
//! A collector has a global epoch `G` (a counter) and one record per registered thread.
//!
//! - **Pin** (outermost only): load `G` (Acquire), store `pinned(G)` into the thread's own
//!   record (Release), then [`fence::light`](crate::cpu::fence::light), a compiler fence.
//!   No SeqCst fence and no read-modify-write: the record's line is written only by its
//!   thread. **Unpin**: store "not pinned" (Release).
//! - **Retire**: the object goes into the thread's bag (64 deferred functions; or a
//!   64-object intrusive batch). A full bag is **sealed**: a SeqCst fence, then a load of
//!   `G` = `S`, recorded in the bag; the bag goes into the collector's garbage queue.
//! - **Advance** (one thread at a time): load `G` = `e` (Acquire), issue
//!   [`fence::heavy`](crate::cpu::fence::heavy) (membarrier), read every record
//!   (Acquire); if every pinned record is pinned in `e`, store `G = e + 1` (Release).
//! - **Collect** (one thread at a time, others skip): load `G` (Acquire); move newly
//!   sealed bags from the lock-free inbox to the back of a FIFO; run bags from its front
//!   while `G >= S + 2`, at most 8 per call.
//!
//! # Why a bag sealed in `S` may be freed once `G >= S + 2`
//!
//! Let `O` be an object of the bag, unlinked by `U` on the retiring thread `R`, which then
//! sealed the bag: `U`, fence `F_R`, load `G` = `S`. Let `T` be a thread that reached `O`
//! in a pinned section `P` (its pointer load read the value from before `U`). Let `A` be
//! the advance from `S + 1` to `S + 2` (it exists: the freer saw `G >= S + 2`), and `A'`
//! the advance from `S` to `S + 1`. membarrier makes `T` execute a full barrier `M_T` at
//! some point during `A`'s heavy fence.
//!
//! 1. `M_T` is after `P` ended: `T`'s unpin store (Release) is visible to `A`'s scan
//!    (Acquire), whose store of `S + 2` (Release) the freer reads (Acquire), so all of `P`
//!    happens before the free. (If `A` read a later pin of `T`, that store is Release too.)
//! 2. `M_T` is inside `P`, after its pin store: `A` sees `T` pinned, so `T` pinned in
//!    `S + 1`, reading `G` from `A'`'s store. Then `T`'s load of `O`'s pointer comes after
//!    `A'` published `S + 1`. But `R` read `G = S` *after* `F_R`, which made `U` visible
//!    everywhere first; so `U` was visible before `S + 1` was, and `T`, having seen
//!    `S + 1`, cannot have missed `U`. Contradiction: `T` cannot reach `O`.
//! 3. `M_T` is before `P`'s pin store: `A` read `G = S + 1`, which (as in 2) was
//!    published after `U` was visible everywhere; `M_T` comes after that read, and `T`'s
//!    loads come after `M_T`, so they see `U`. Contradiction again.
//!
//! So every section that could reach `O` ended before the free (case 1). The argument
//! assumes multi-copy-atomic hardware (x86-64, AArch64) for membarrier; in the symmetric
//! mode (SeqCst fences on both sides, also what loom checks) the same three cases follow
//! from the C++20 rule for SeqCst fences: either `F_R` precedes `T`'s fence in the total
//! order (then `T` sees `U`), or it follows it (then `R`'s load must see `S + 1`).
//!
//! Why two advances and not one: a reader may pin in `S + 1` (not holding back the first
//! advance) just before `U` becomes visible; only the second advance waits for it. Why
//! not fewer fences: without `F_R`, `R`'s load of `G` could be satisfied before `U`
//! leaves its store buffer, sealing the bag one epoch too early.
//!
//! # Costs and amortisation
//! - Pin + unpin: a thread-local load, two loads and two stores of the thread's own
//!   record, no fence instruction: about 4 ns here, a quarter of crossbeam-epoch's
//!   (BENCHMARKS.md).
//! - Sealing: one SeqCst fence per 64 retired objects.
//! - Advancing: one membarrier (10-35 us with other threads running) per advance, tried
//!   after 8 sealed bags (512 objects), or from a pinning thread at most once a
//!   millisecond while garbage waits; one advancer at a time. A failed attempt (a thread
//!   pinned in an older epoch) waits for the next 8 seals too, so a stalled reader does
//!   not turn every seal into a membarrier.
//! - Collecting: each sealed bag is moved once from the inbox to the FIFO and popped
//!   once from its front (O(1) per bag); a call runs at most 8 bags or batches (512
//!   objects), outside the collector lock. Every seal by a pinned thread triggers a
//!   collect, and so do every 128th pin of a thread and the *first* pin of every thread
//!   (of every newly claimed record): a thread that exits seals without collecting (it
//!   runs in a thread-exit hook, where user destructors must not run), so short-lived
//!   threads would otherwise leave their bags behind faster than anyone collects them.
//!   With it, collection keeps pace with retirement while the epoch advances
//!   (`tests/churn.rs`: 3000 threads, the backlog stays under a few dozen bags).
//!
//! # Invariants
//! - A record's epoch word is written only by the thread that claimed it.
//! - `G` is written only by the holder of the `advancing` try-lock, one step at a time.
//! - A bag is owned by one party at a time (see `bag.rs`); the inboxes are push-only and
//!   take-all (no ABA); each FIFO belongs to the holder of the collector lock.
//! - Records, bags and the collector itself live in memory mapped from the kernel: no
//!   path of this module allocates through the global allocator, except `defer` of a
//!   closure larger than three words (boxed once).
//! - A thread that exits hands its bag and batch to the collector; if it exits while
//!   pinned (a leaked guard), its record stays pinned forever: reclamation stalls, and
//!   nothing is freed early.
//! - Garbage left when a non-default collector is dropped runs at that moment.
//!
//! # Limits
//! - A thread pinned forever stops reclamation (as in every EBR); use hazard pointers
//!   where one stalled reader must not hold back memory.
//! - Garbage is freed by threads that pin, retire or flush; a process whose threads all
//!   stop doing so keeps its last garbage until they resume.
//! - Deferred functions must not panic: a panic leaks the rest of its bag.
//! - `fork`: in the child, the default collector unpins the records of the threads that
//!   did not come along (a `pthread_atfork` handler), so one pinned at the fork cannot
//!   hold the child's epoch back; what those threads had retired is leaked in the child,
//!   never freed early. Collectors made with [`Collector::new`] get no such repair: a
//!   child that uses one must not have forked while another thread was pinned in it.

mod atomic;
mod bag;
mod collector;
pub(crate) mod default;
mod deferred;
mod guard;
pub(crate) mod internal;
mod queue;
mod retired;

pub use atomic::{Atomic, CompareExchangeError, Owned, Pointer, Shared};
pub use collector::{Collector, CollectorStats, LocalHandle};
pub use default::{default_collector, is_pinned, pin};
pub use guard::{Guard, unprotected};
pub use retired::{ReclaimFn, Retired};
