//! Finding an object from any address: [`Regions::lookup`] (mask to the region, check
//! the registry and the header, read the page map, divide by the chunk), and what it
//! reports.

use core::ptr::NonNull;

use super::{CACHE_MAGIC, SLAB_MAGIC, SlabHeader};
use crate::sync::atomic::Ordering;
use crate::umem::region::Regions;

/// A cache's identity, as [`Regions::lookup`] reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct CacheId(pub(super) usize);

/// What [`Regions::lookup`] found at an address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct Found {
    /// The cache that owns the slab.
    pub cache: CacheId,
    /// The cache's name.
    pub name: &'static str,
    /// The object holding the address (its base).
    pub base: NonNull<u8>,
    /// The cache's object size.
    pub size: usize,
    /// Whether the object is allocated (a hint if it is being allocated or freed
    /// concurrently).
    pub allocated: bool,
}

impl Regions {
    /// What lies at `ptr`: the cache and the base of the object whose chunk holds it (an
    /// interior pointer finds its object), or `None` for an address in no live slab of
    /// these regions (a foreign pointer, a free page, a slab's header, colour or tail).
    /// Any address is safe: the region registry is checked before a header is read, and
    /// the regions lock keeps what it reads mapped. This is what `free(ptr)` in C needs.
    ///
    /// ```
    /// let regions = scalemem::umem::region::Regions::new()?;
    /// assert!(regions.lookup(0x1234 as *const u8).is_none());
    /// # Ok::<(), scalemem::util::AllocError>(())
    /// ```
    pub fn lookup(&self, ptr: *const u8) -> Option<Found> {
        self.with_owner(ptr, |owner| {
            let h = owner?.cast::<SlabHeader>().as_ptr();
            // SAFETY: under the regions lock, a page-map entry names a live slab header
            // whose `ident` is read-only; its cache lives as long as its slabs.
            let (ident, c) = unsafe {
                let ident = &(*h).ident;
                if ident.magic != SLAB_MAGIC {
                    return None;
                }
                (ident, &*ident.cache)
            };
            if c.magic != CACHE_MAGIC || (ptr as usize) < ident.first as usize {
                return None;
            }
            let index = (ptr as usize - ident.first as usize) / c.chunk;
            if index >= c.capacity {
                return None;
            }
            // SAFETY: live header. Relaxed: see `SlabHeader::bits`.
            let word = unsafe { (*h).bits[index / 64].load(Ordering::Relaxed) };
            Some(Found {
                cache: CacheId(ident.cache as usize),
                name: c.name,
                // SAFETY: inside the slab, not null.
                base: unsafe { NonNull::new_unchecked(ident.first.add(index * c.chunk)) },
                size: c.size,
                allocated: word & (1 << (index % 64)) != 0,
            })
        })
    }
}
