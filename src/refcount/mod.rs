//! Reference counts that scale: [`PercpuRef`] (Linux's `percpu_ref`), with
//! [`PercpuOwner`]/[`PercpuArc`] on top, and [`Refcache`] (RadixVM's Refcache).
//!
//! # Which one when
//!
//! | | [`PercpuRef`] / [`PercpuArc`] | [`Refcache`] / [`RcRef`] | `Arc` |
//! |---|---|---|---|
//! | get/put, object alive | per-CPU: an rseq section, no shared write | per-CPU: an rseq section while the object is cached on the CPU | one RMW on a shared line |
//! | zero detection | exact, but only after the owner's [`kill`](PercpuRef::kill) | delayed: two epochs (20 ms by default) of zero | exact, immediate |
//! | who decides the end | an owner | nobody: the count does | nobody |
//! | weak references | `tryget_live` (fails once killed) | [`RcWeak`], upgradable until freed | `Weak` |
//! | extra memory | a page of per-CPU slots per object | 40-byte header per object, 4 KiB of cache per CPU per domain | 16 bytes |
//!
//! - [`PercpuRef`]: an object with an owner that decides when it dies (an object
//!   cache, a device, a module). While the owner keeps it alive, get and put touch only
//!   the current CPU's counter; [`kill`](PercpuRef::kill) turns it into an atomic count
//!   whose last put runs the `release` callback. [`PercpuOwner`]/[`PercpuArc`] are the
//!   typed version: an `Arc` whose clones are per-CPU while the owner lives.
//! - [`Refcache`]: many objects, no owner, counts that bounce through zero and back (the
//!   allocator's regions: a region empties and refills all the time, and must be
//!   returned to the kernel only once it has stayed empty). Increments and decrements
//!   are per-CPU; an object is freed once its count has stayed zero, untouched, for two
//!   epochs.
//!
//! # Building blocks
//!
//! The fast paths are rseq critical sections that test a condition and commit with one
//! `add` ([`cpu::rseq::add_if_clear_in`](crate::cpu::rseq::add_if_clear_in),
//! [`add_if_key_in`](crate::cpu::rseq::add_if_key_in)), and the slow sides close per-CPU words
//! with the rseq fence ([`heavy_rseq`](crate::cpu::fence::heavy_rseq)) instead of an RCU
//! grace period: it waits for exactly the in-flight sections that matter. Where the
//! process has no rseq or the kernel no rseq fence, both structures use per-CPU atomic
//! words (PercpuRef: sealable compare-exchange words; Refcache: per-CPU try-locks),
//! chosen at run time; `section.rs` says how loom models both. The protocols, with the
//! arguments for why no count is lost and no object is freed early, are in the
//! documentation of the [`percpu`] and [`refcache`] submodules.
//!
//! # Invariants (details in the submodules)
//!
//! - A per-CPU word is written either only by rseq sections or only by atomic RMWs,
//!   never both (an RMW from another CPU would race with the owning CPU's plain `add`);
//!   words are handed from one side to the other only after the rseq fence.
//! - Nothing on a get/put or increment/decrement path allocates. Creating a `PercpuRef`
//!   maps its per-CPU slots; `Refcache::alloc` boxes the object, while objects that embed
//!   an [`RcHeader`] (the allocator's own metadata) are counted through raw pointers with
//!   [`Refcache::inc`]/[`dec`](Refcache::dec) and freed by an [`RcRelease`] callback,
//!   without any allocation.
//! - Under loom: 2 CPUs, 2 cache ways per CPU (every object in way 0), rseq sections
//!   modelled by per-CPU section locks, fences SeqCst.

mod arc;
mod intrusive;
pub mod percpu;
mod rcref;
pub mod refcache;
mod section;

pub use arc::{PercpuArc, PercpuOwner};
pub use intrusive::{RcHeader, RcRelease};
pub use percpu::{Init, PercpuRef};
pub use rcref::{RcRef, RcWeak};
pub use refcache::{Config, Refcache, RefcacheStats};

/// Hooks for the loom models in `loom-tests/` (not part of the API, outside semver).
#[cfg(scalemem_loom)]
#[doc(hidden)]
pub mod model {
    /// Which model threads run the (modelled) rseq sections.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Sections {
        /// None: every structure built afterwards takes its atomic paths.
        None,
        /// Every thread.
        All,
        /// The main thread and the first spawned one; later threads use the atomic
        /// paths on the same structures.
        FirstTwo,
    }

    /// Chooses which threads have sections, for structures built afterwards in this
    /// model execution. Call it first in the model closure.
    pub fn set_sections(which: Sections) {
        use super::section::model as m;
        m::set(match which {
            Sections::None => m::NONE,
            Sections::All => m::ALL,
            Sections::FirstTwo => m::FIRST_TWO,
        });
    }
}
