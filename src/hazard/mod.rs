//! Hazard pointers whose read side issues no fence instruction, with bounded garbage.
//!
//! A reader *protects* an object by publishing its address in a hazard slot of its own
//! and checking that the object is still reachable; a writer that unlinked an object
//! *retires* it, and the object is freed by a later *scan* that finds no slot holding
//! it. Unlike epoch-based reclamation ([`crate::epoch`]), a reader that stalls holds
//! back only the objects it protects: garbage stays bounded (below).
//!
//! The API: [`Domain`] (the global one, [`Domain::global`], and user domains, best made
//! with [`unique_domain!`](crate::unique_domain)), [`HazardPointer`] (`protect`,
//! `try_protect`, `reset`), [`HazardPointerArray`], [`Domain::retire_ptr`] (with a
//! deleter; allocates a small node), the intrusive, allocation-free [`Domain::retire`]
//! (the object embeds a [`Retired`] link, the same type as the epoch collector's),
//! [`Domain::reclaim`] and [`Domain::stats`]; and [`AtomicArc`], an atomically swappable
//! `Arc` whose loads are protected by hazard pointers.
//!
//! # The algorithm
//!
//! A domain has a registry of *records*, each with [`SLOTS_PER_RECORD`] hazard slots. A
//! thread claims one record per domain (more if it holds more hazard pointers at once)
//! and caches it in a thread-local; taking and dropping a [`HazardPointer`] flips a bit in
//! that record. The record also holds the thread's retired list and scan buffer. When a
//! thread exits, its records go back to the domain (FREE) with whatever garbage they
//! still hold, and are reused by the next thread that needs one.
//!
//! - **Publish** (`protect`): load the pointer `p` from the source (Relaxed), store `p`
//!   into the slot (Release), [`fence::light`](crate::cpu::fence::light) (a compiler
//!   fence), re-load the source (Acquire); if it still holds `p`, `p` is protected, else
//!   retry with the new value. **Reset**: store null (Release).
//! - **Retire**: put the object on the thread's list (no shared write). When the list
//!   reaches `R` objects, or every 8 retires if 10 ms have passed since the thread's last
//!   scan, **scan**.
//! - **Scan**: adopt the lists of exited threads' records (if any), then
//!   [`fence::heavy`](crate::cpu::fence::heavy) (one `membarrier` per scan), then load
//!   every slot of the domain (Acquire) into the thread's scan buffer (mmap'd, doubled
//!   when the domain has grown), sort it, and free every listed object whose address is
//!   not in it (binary search). Survivors stay on the list. Then `R = max(C, K·H)`, with
//!   `H` the number of slots just read.
//!
//! # Why an object the scan frees is not in use
//!
//! Let `U` be the unlink of object `O` (a store to the source that removes `O`), made by
//! the retiring thread `W` or, for an adopted list, by a thread whose record release
//! (Release) `W` read with its claim (Acquire): either way `U` happens before `W`'s heavy
//! fence `X`. Let `T` be a reader that publishes `O` (store `P` to its slot), runs its
//! light fence `Y`, and re-loads the source (`B`), finding `O`. Let `C` be `W`'s load of
//! `T`'s slot after `X`.
//!
//! - If `C` reads `P` or a later store of `T`'s slot: `C` finds `O` (it does not free it),
//!   or a later Release store (a reset or a new publish) that `T` made after it finished
//!   with `O`; `C` is Acquire, so all of `T`'s accesses to `O` happen before the free.
//!   (The next owner of a reused record is ordered after `T` by the record's Release/
//!   Acquire hand-over, so its stores count as later ones of `T`.)
//! - If `C` reads a value from before `P`: in the symmetric mode `X` and `Y` are SeqCst
//!   fences, and by the C++20 rule for them (\[atomics.order\] p4.4: a SeqCst fence that
//!   happens before `A`, and `B` that happens before another one, with `A`
//!   coherence-ordered before `B`, order the fences the same way in `S`): `X` → `C`, `C`
//!   coherence-before `P`, `P` → `Y` give `X` before `Y` in `S`. Had `B` read a value
//!   from before `U`, `Y` → `B`, `B` coherence-before `U`, `U` → `X` would give `Y`
//!   before `X`. So `B` sees `U` (or later): `B` does not find `O` (the retire contract
//!   forbids re-linking `O`; a *new* object at the same address is a new object, which
//!   the hazard rightly protects), and `T` does not use `O`.
//!
//! In the asymmetric mode, `Y` is a compiler fence and `X` is `membarrier`, which makes
//! every CPU running a thread of the process execute a full barrier `M` during the call
//! (a thread that is not running passes a context switch, also a full barrier). If `M`
//! falls after `P` in `T`'s program, `P` is globally visible before `X` returns, and `C`
//! reads it or later. If `M` falls before `P`, then `B` is after `M`, and `U` (visible to
//! `W` before its call: `W` issues a SeqCst fence first) was globally visible before `M`:
//! `B` sees it. The argument assumes multi-copy-atomic hardware (x86-64, AArch64), as the
//! epoch collector's does. Loom checks the symmetric mode (both fences SeqCst).
//!
//! Adoption happens *before* the heavy fence, so that the adopted objects' unlinks happen
//! before it too; a list adopted after the fence would need another scan.
//!
//! # Bounded garbage
//!
//! With `H` hazard slots in a domain, `R = max(C, K·H)` (`C` =
//! [`SCAN_THRESHOLD_MIN`] = 1024, `K` = [`SCAN_THRESHOLD_FACTOR`] = 2):
//!
//! - after a scan a thread's list holds only objects some slot held, at most `H`
//!   (`H < R`); the next scan runs when the list reaches `R`. So **a thread's list never
//!   holds more than `R` objects**, whatever readers do (one stalled forever included);
//! - `H` only grows (records are reused, never unregistered), so `R` is as of now;
//! - a record released by an exited thread keeps its list (at most `R`, and in the global
//!   domain at most `H`: an exiting thread scans first) until another thread's scan
//!   adopts it, or the record is claimed again.
//!
//! So in a domain where `n` records hold retired objects, **retired-but-unreclaimed ≤
//! n · max(C, K·H)** ([`DomainStats::bound`]); with one retiring thread, `≤ max(C, K·H)`.
//! `tests/hazard.rs` checks it with a reader that protects one object and never moves
//! while a writer retires for seconds. Each scan costs `O(H log H)` and runs once per
//! `R - H ≥ R/2` retires: `O(log H)` amortised per retire, and no more than a constant
//! number of heavy fences per `C/2` retires.
//!
//! # Invariants
//! - A slot is written only by the thread that claimed its record.
//! - A record's owner-only fields (free mask, retired list, scan buffer) are touched by its
//!   claimer, or by a scanner that claims a FREE record to adopt its list, or by the sweep
//!   when a user domain's last handle is dropped (when no hazard pointer, retire or scan of
//!   it can run); hand-overs are Release/Acquire on the record's state.
//! - Records, the scan buffers and user domains' state live in memory mapped from the
//!   kernel: taking a hazard pointer, protecting, the intrusive retire and scanning never
//!   call the global allocator. [`Domain::retire_ptr`] allocates one node per call.
//! - A thread that exits while a hazard pointer of its own is still alive (one kept in
//!   another thread-local) keeps the record until that hazard pointer is dropped.
//!
//! # Limits
//! - A thread's garbage is freed by that thread's scans (or by an adopter after it exits);
//!   a thread that stops retiring keeps up to `R` objects until it retires again, calls
//!   [`Domain::reclaim`], or exits.
//! - A thread uses at most 4 user domains with cached records at once; beyond that, each
//!   call into a further domain claims a record for its own duration (slower, correct).

mod arc;
mod domain;
mod local;
mod pointer;
mod record;

pub use crate::epoch::{ReclaimFn, Retired};
pub use arc::{AsRaw, AtomicArc, Guard};
pub use domain::{Domain, DomainStats, Global, SCAN_THRESHOLD_FACTOR, SCAN_THRESHOLD_MIN, SLOTS_PER_RECORD, drop_box};
pub use pointer::{HazardPointer, HazardPointerArray};
