//! Lock-free data structures generic over the reclamation scheme ([`Reclaim`]): each
//! runs unchanged on epoch-based reclamation ([`Ebr`], the default) or hazard pointers
//! ([`Hazard`], or a user [`Domain`](crate::hazard::Domain)).
//!
//! - [`TreiberStack`]: push and pop by compare-exchange on the head.
//! - [`MsQueue`]: Michael and Scott's queue (a sentinel node, lagging tail helped along).
//! - [`OrderedList`]: Harris and Michael's sorted set (logical deletion by marking a node's
//!   `next`, physical unlinking by whoever walks past it).
//!
//! Nodes embed the [`Retired`] link, so pops and removals retire
//! without allocating under either scheme. Every structure is tested under both schemes
//! (`tests/ds.rs`), and the stack and the queue are model-checked under both with loom
//! (`loom-tests/tests/ds.rs`).
//!
//! # The rules they follow (what [`Reclaim`] asks)
//! - Take a shield per pointer held at once (the queue's dequeue holds the head and its
//!   successor: two; the list holds previous, current and next: three) and load shared
//!   pointers only through it.
//! - After protecting a pointer read from inside a node, re-check that the node is still
//!   reachable (the queue re-reads `head`; the list re-reads the predecessor's link), so
//!   that the pointer was not read from an already unlinked node.
//! - Retire a node once, after the compare-exchange that unlinked it.
//!
//! [`Reclaim`]: crate::reclaim::Reclaim
//! [`Ebr`]: crate::reclaim::Ebr
//! [`Hazard`]: crate::reclaim::Hazard

mod list;
mod queue;
mod stack;

pub use list::OrderedList;
pub use queue::MsQueue;
pub use stack::TreiberStack;

use core::ptr::NonNull;

use crate::epoch::Retired;

/// Frees a boxed node from its embedded link (the first field of every node type here).
///
/// # Safety
/// 1. `link` is the first field of a `repr(C)` `N` from `Box::into_raw`, freed once.
/// 2. `link` was projected from the box's pointer (`&raw mut (*node).link`), not made
///    from a reference to the field, whose provenance would cover the field alone.
unsafe fn free_node<N>(link: NonNull<Retired>) {
    // SAFETY: (1) the link's address is the box's; (2) with the box's provenance.
    drop(unsafe { Box::from_raw(link.cast::<N>().as_ptr()) });
}
