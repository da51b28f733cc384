//! [`Retired`]: the link an object embeds to be retired without allocating.

use core::cell::UnsafeCell;
use core::fmt;
use core::ptr::{self, NonNull};

/// The reclaim function of an intrusively retired object: receives the object's
/// embedded [`Retired`] link, recovers the object from it and frees it.
pub type ReclaimFn = unsafe fn(NonNull<Retired>);

/// An intrusive retirement link (four words) embedded in an object, so that
/// [`Guard::retire`](super::Guard::retire) can queue the object for reclamation without
/// allocating anything. This is the path the allocator uses for its own metadata
/// (depot magazines, slabs): reclamation must not call the allocator it serves.
///
/// Retired objects are chained through their links into batches of up to 64; the first
/// object of a batch also carries the batch's epoch and its link to the next batch.
///
/// ```
/// use scalemem::epoch::{Collector, Retired};
/// use std::ptr::NonNull;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// #[repr(C)]
/// struct Node {
///     link: Retired, // first field, so a *Retired is a *Node
///     value: u64,
/// }
///
/// static FREED: AtomicU64 = AtomicU64::new(0);
/// unsafe fn reclaim(link: NonNull<Retired>) {
///     // SAFETY: every link we retire is the first field of a boxed Node, whose pointer
///     // it was cast from (so it carries the whole box's provenance).
///     let node = unsafe { Box::from_raw(link.as_ptr().cast::<Node>()) };
///     FREED.fetch_add(node.value, Ordering::Relaxed);
/// }
///
/// let collector = Collector::new();
/// let handle = collector.register();
/// let node = Box::into_raw(Box::new(Node { link: Retired::new(), value: 7 }));
/// // SAFETY: the node is unreachable by other threads from now on, and retired once.
/// unsafe { handle.pin().retire(NonNull::new(node).unwrap().cast(), reclaim) };
/// for _ in 0..3 {
///     handle.pin().flush();
/// }
/// assert_eq!(FREED.load(Ordering::Relaxed), 7);
/// ```
#[repr(C)]
pub struct Retired {
    /// Next object in the same batch.
    pub(crate) next: UnsafeCell<*mut Retired>,
    /// Next batch (meaningful in a batch's first object only).
    pub(crate) batch_next: UnsafeCell<*mut Retired>,
    /// The epoch the batch was sealed in (first object only).
    pub(crate) epoch: UnsafeCell<usize>,
    /// Called once the object is safe to free.
    pub(crate) reclaim: UnsafeCell<Option<ReclaimFn>>,
}

// SAFETY: the fields are written only by the thread that owns the retired object at that
// moment: the retiring thread until the batch is pushed (a Release CAS), then the one
// collector that took the batch off the list (an Acquire swap). No two threads touch
// them concurrently, so the link may be shared and sent like the object embedding it.
unsafe impl Send for Retired {}
// SAFETY: see the Send impl.
unsafe impl Sync for Retired {}

impl Retired {
    /// A fresh, unlinked link.
    ///
    /// ```
    /// use scalemem::epoch::{self, Retired};
    /// use std::ptr::NonNull;
    /// use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    ///
    /// #[repr(C)]
    /// struct Block {
    ///     link: Retired, // first field, so a *Retired is a *Block
    ///     bytes: [u8; 64],
    /// }
    /// static FREED: AtomicBool = AtomicBool::new(false);
    ///
    /// unsafe fn free(link: NonNull<Retired>) {
    ///     // SAFETY: the only link retired here is the first field of a boxed Block.
    ///     drop(unsafe { Box::from_raw(link.as_ptr().cast::<Block>()) });
    ///     FREED.store(true, Relaxed);
    /// }
    ///
    /// let block = Box::into_raw(Box::new(Block { link: Retired::new(), bytes: [0; 64] }));
    /// // SAFETY: `unprotected`: the block was never shared, so no other thread can reach
    /// // it. `retire`: (1) it is unreachable and valid until `free` runs; (2) it is
    /// // retired once; (3) `free` frees a boxed Block from its first field.
    /// unsafe { epoch::unprotected().retire(NonNull::new(block).unwrap().cast(), free) };
    /// assert!(FREED.load(Relaxed));
    /// ```
    pub const fn new() -> Self {
        Self {
            next: UnsafeCell::new(ptr::null_mut()),
            batch_next: UnsafeCell::new(ptr::null_mut()),
            epoch: UnsafeCell::new(0),
            reclaim: UnsafeCell::new(None),
        }
    }
}

impl Default for Retired {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Retired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Retired")
    }
}
