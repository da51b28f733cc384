//! Finding an object from any address: [`Regions::lookup`] (mask to the region, check
//! the registry and the header, read the page map, divide by the chunk), and what it
//! reports.

use core::ptr::NonNull;

use super::{CACHE_MAGIC, SLAB_MAGIC, SlabHeader};
use crate::sync::atomic::Ordering;
use crate::umem::region::Regions;

/// A cache's identity, as [`Regions::lookup`] reports it.
///
/// ```
/// use scalemem::umem::region::Regions;
/// use scalemem::umem::slab::SlabCache;
///
/// let regions = Regions::new()?;
/// let (a, b) = (SlabCache::builder(&regions, "a", 32, 8).build()?, SlabCache::builder(&regions, "b", 32, 8).build()?);
/// let p = a.alloc()?;
/// let owner = regions.lookup(p.as_ptr()).unwrap().cache;
/// assert!(owner == a.id() && owner != b.id()); // same size, told apart by identity
/// // SAFETY: from `a`, freed once.
/// unsafe { a.free(p) }.unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct CacheId(pub(super) usize);

/// What [`Regions::lookup`] found at an address.
///
/// ```
/// use scalemem::umem::region::Regions;
/// use scalemem::umem::slab::SlabCache;
///
/// let regions = Regions::new()?;
/// let cache = SlabCache::builder(&regions, "triples", 24, 8).build()?;
/// let p = cache.alloc()?;
/// // An address inside the object finds the object.
/// let found = regions.lookup(p.as_ptr().wrapping_add(10)).unwrap();
/// assert_eq!((found.name, found.base, found.size, found.allocated), ("triples", p, 24, true));
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// assert!(!regions.lookup(p.as_ptr()).unwrap().allocated);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

/// Finding an object from any address.
///
/// ```
/// use scalemem::umem::region::Regions;
/// use scalemem::umem::slab::SlabCache;
///
/// let regions = Regions::new()?;
/// let cache = SlabCache::builder(&regions, "pairs", 16, 8).build()?;
/// let p = cache.alloc()?;
/// let found = regions.lookup(p.as_ptr()).unwrap();
/// assert_eq!((found.name, found.size, found.allocated), ("pairs", 16, true));
/// // SAFETY: `p` came from this cache's `alloc` and is freed once.
/// unsafe { cache.free(p) }.unwrap();
/// // The emptied slab is kept (`max_empty`): its object is found, now free.
/// assert!(!regions.lookup(p.as_ptr()).unwrap().allocated);
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
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
            let word = unsafe { (*h).bits[super::bit_word(index)].load(Ordering::Relaxed) };
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

/// The allocator's lock-free object size (crate-internal); from outside the crate,
/// [`Regions::lookup`] answers the same question for any address.
///
/// ```
/// let regions = scalemem::umem::region::Regions::new()?;
/// let cache = scalemem::umem::slab::SlabCache::builder(&regions, "c", 100, 4).build()?;
/// let p = cache.alloc()?;
/// assert_eq!(regions.lookup(p.as_ptr()).map(|found| found.size), Some(100));
/// // SAFETY: `p` came from this cache's `alloc` and is freed once.
/// unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::util::AllocError>(())
/// ```
impl Regions {
    /// The object size of the slab cache owning `ptr`, or `None` if `ptr` is in no
    /// region of this manager; lock-free, for the allocator's `free(ptr)` and
    /// `malloc_usable_size`, whose callers vouch for the pointer.
    ///
    /// # Safety
    /// If `ptr` is in a region of this manager, it points into an allocated object of a
    /// slab cache over it (so its run, slab header and cache stay put meanwhile).
    #[inline]
    pub(crate) unsafe fn object_size(&self, ptr: *const u8) -> Option<usize> {
        if !self.contains(ptr) {
            return None;
        }
        // SAFETY: `ptr` is in a live run of ours (the caller's contract), whose owner was
        // set before the object was handed out.
        let h = unsafe { self.owner_of(ptr) } as *const SlabHeader;
        if h.is_null() {
            return None;
        }
        // SAFETY: a live slab header; its `ident` is read-only while the slab holds an
        // allocated object.
        unsafe { Some((*h).ident.size) }
    }
}
