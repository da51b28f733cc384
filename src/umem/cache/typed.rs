//! [`TypedCache<T>`] and [`CacheBox<T>`]: the typed face of [`ObjectCache`].

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use super::{CacheBuilder, CacheError, Config, ObjectCache};
use crate::umem::region::Regions;

/// A typed object cache: its objects are `T`s, made by an initialiser as they enter from
/// the slab layer and dropped as they leave; [`alloc`](Self::alloc) hands out a
/// [`CacheBox`] that gives its object back, still a valid `T`, when dropped.
///
/// ```
/// use scalemem::umem::cache::TypedCache;
/// let cache = TypedCache::new("tables", || (0..64u32).map(|i| i * i).collect::<Vec<_>>())?;
/// let table = cache.alloc()?;
/// assert_eq!(table[8], 64);
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
pub struct TypedCache<T: Send> {
    cache: ObjectCache,
    _marker: PhantomData<fn() -> T>,
}

impl<T: Send> TypedCache<T> {
    /// A cache of `T`s made by `init`, over the process-wide regions, default [`Config`].
    ///
    /// ```
    /// use scalemem::umem::cache::TypedCache;
    ///
    /// let cache = TypedCache::new("counters", || 0u64)?;
    /// let mut a = cache.alloc()?;
    /// *a += 1;
    /// let b = cache.alloc()?; // nothing was freed yet: a fresh object from `init`
    /// assert_eq!((*a, *b), (1, 0));
    /// assert_eq!(cache.raw().stats().ctor_calls, 2);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn new(name: &'static str, init: impl Fn() -> T + Send + Sync + 'static) -> Result<Self, CacheError> {
        Self::builder(name, init, ObjectCache::builder(name, 0, 1))
    }

    /// [`new`](Self::new) over `regions` with `config`.
    ///
    /// ```
    /// use scalemem::umem::cache::{Config, TypedCache};
    /// use scalemem::umem::region::Regions;
    /// use std::sync::OnceLock;
    ///
    /// // The manager must outlive every cache over it: a static.
    /// static REGIONS: OnceLock<Regions> = OnceLock::new();
    /// let regions = REGIONS.get_or_init(|| Regions::new().unwrap());
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = TypedCache::new_in(regions, "strings", config, || String::from("fresh"))?;
    /// assert_eq!(*cache.alloc()?, "fresh");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_in(
        regions: &'static Regions,
        name: &'static str,
        config: Config,
        init: impl Fn() -> T + Send + Sync + 'static,
    ) -> Result<Self, CacheError> {
        Self::builder(name, init, ObjectCache::builder(name, 0, 1).regions(regions).config(config))
    }

    fn builder(
        name: &'static str,
        init: impl Fn() -> T + Send + Sync + 'static,
        mut builder: CacheBuilder,
    ) -> Result<Self, CacheError> {
        builder.name = name;
        builder.size = size_of::<T>().max(1);
        builder.align = align_of::<T>();
        let builder = builder
            .ctor(Box::new(move |p: NonNull<u8>| {
                // SAFETY: the chunk is `size_of::<T>()` writable bytes aligned for T.
                unsafe { p.cast::<T>().write(init()) };
                Ok(())
            }))
            .dtor(Box::new(|p: NonNull<u8>| {
                // SAFETY: a constructed T leaving the cache, used by no one.
                unsafe { p.cast::<T>().drop_in_place() }
            }));
        Ok(Self { cache: builder.build()?, _marker: PhantomData })
    }

    /// A constructed `T` (as the initialiser made it, or as its last user left it).
    ///
    /// ```
    /// let cache = scalemem::umem::cache::TypedCache::new("n", || 5u64)?;
    /// let mut n = cache.alloc()?;
    /// *n += 1;
    /// drop(n);
    /// // The same object back from this CPU's magazine, as its last user left it (6); or,
    /// // had this thread moved to another CPU in between, a fresh one (5).
    /// let again = cache.alloc()?;
    /// assert!(*again == 6 || *again == 5);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    #[inline]
    pub fn alloc(&self) -> Result<CacheBox<'_, T>, CacheError> {
        let ptr = self.cache.alloc()?.cast::<T>();
        Ok(CacheBox { ptr, cache: self })
    }

    /// The untyped cache under this one (stats, reap, update, destroy).
    ///
    /// ```
    /// let cache = scalemem::umem::cache::TypedCache::new("buffers", || vec![0u8; 256])?;
    /// let buf = cache.alloc()?;
    /// assert_eq!(cache.raw().stats().in_use, 1);
    /// drop(buf); // back to a magazine, still constructed
    /// cache.raw().reap(); // drains the magazines: every object is destructed
    /// let s = cache.raw().stats();
    /// assert_eq!((s.in_use, s.constructed, s.cpu_rounds), (0, 0, 0));
    /// assert_eq!(s.ctor_calls, s.dtor_calls);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn raw(&self) -> &ObjectCache {
        &self.cache
    }
}

impl<T: Send> fmt::Debug for TypedCache<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TypedCache").field(&self.cache).finish()
    }
}

/// A `T` from a [`TypedCache`], given back to it (still constructed) on drop.
///
/// ```
/// let cache = scalemem::umem::cache::TypedCache::new("b", || [0u8; 16])?;
/// let mut b = cache.alloc()?;
/// b[0] = 1;
/// assert_eq!(b.len(), 16);
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
pub struct CacheBox<'c, T: Send> {
    ptr: NonNull<T>,
    cache: &'c TypedCache<T>,
}

// SAFETY: a CacheBox owns its T (Send) and refers to a Sync cache:
// - Send: moving it moves the T's ownership; the cache may be used from any thread.
unsafe impl<T: Send> Send for CacheBox<'_, T> {}
// SAFETY: `&CacheBox` gives only `&T`:
// - Sync: needs T: Sync.
unsafe impl<T: Send + Sync> Sync for CacheBox<'_, T> {}

impl<T: Send> core::ops::Deref for CacheBox<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a constructed T owned by this box.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: Send> core::ops::DerefMut for CacheBox<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: a constructed T owned by this box, borrowed mutably through it.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T: Send> Drop for CacheBox<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: (1) from this cache's alloc, freed once (the box is dropped once).
        // (2) A valid T (the box kept it so), used by no one after this.
        let freed = unsafe { self.cache.cache.free(self.ptr.cast()) };
        debug_assert!(freed.is_ok());
    }
}

impl<T: Send + fmt::Debug> fmt::Debug for CacheBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}
