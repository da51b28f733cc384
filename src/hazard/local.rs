//! Each thread's cache of its blocks: one for the global domain and a few for user
//! domains, so that taking a hazard pointer or retiring finds the thread's block with a
//! thread-local load and touches no shared cache line.
//!
//! Registration must not allocate through the global allocator and must not rely on
//! `thread_local!` destructors (std registers them lazily, in an allocating list). So
//! the cache is a `const`-initialised, destructor-free thread-local, and thread exit is
//! observed through a pthread key whose destructor releases the cached blocks (as the
//! epoch collector's registration does). A cached user-domain block holds a reference on
//! its domain, so the entry never dangles; entries of domains whose last handle is gone
//! are dropped at the next miss. A thread with more live user domains than entries, or one
//! that has exited, claims a block for the duration of one call instead.

use core::cell::Cell;
use core::ptr::{self, NonNull};

use super::record::{Block, DomainInner};
use crate::util::AllocError;

/// User-domain blocks a thread keeps cached.
const USER_ENTRIES: usize = 4;

/// A thread's cached blocks.
pub(crate) struct Cache {
    /// The primary block in the global domain (null until first use).
    global: Cell<*mut Block>,
    /// (domain, primary block) per user domain; null domain = empty entry.
    users: [Cell<(*const DomainInner, *mut Block)>; USER_ENTRIES],
    /// Set once the thread's exit hook ran (or, without one, never cache).
    exited: Cell<bool>,
    /// Whether the exit hook is registered.
    #[cfg(not(scalemem_loom))]
    hooked: Cell<bool>,
}

impl Cache {
    const fn new() -> Self {
        Self {
            global: Cell::new(ptr::null_mut()),
            users: [const { Cell::new((ptr::null(), ptr::null_mut())) }; USER_ENTRIES],
            exited: Cell::new(false),
            #[cfg(not(scalemem_loom))]
            hooked: Cell::new(false),
        }
    }

    /// The cached primary block of `domain`, if any.
    #[inline]
    fn lookup(&self, domain: NonNull<DomainInner>, global: NonNull<DomainInner>) -> *mut Block {
        if domain == global {
            return self.global.get();
        }
        for entry in &self.users {
            let (d, block) = entry.get();
            if d == domain.as_ptr().cast_const() {
                return block;
            }
        }
        ptr::null_mut()
    }

    /// Claims a block of `domain` and caches it if there is room. Returns the block and
    /// whether it was cached (else the caller releases it after its call).
    #[cold]
    #[inline(never)]
    fn fill(
        &self,
        domain: NonNull<DomainInner>,
        global: NonNull<DomainInner>,
    ) -> Result<(NonNull<Block>, bool), AllocError> {
        let block = DomainInner::claim(domain)?;
        if self.exited.get() || !self.hook() {
            return Ok((block, false));
        }
        if domain == global {
            self.global.set(block.as_ptr());
            return Ok((block, true));
        }
        // Drop entries of dead domains (their last handle is gone: no call of ours can be
        // using their blocks), then take an empty entry.
        for entry in &self.users {
            let (d, b) = entry.get();
            // SAFETY: a cached entry holds a reference on its domain.
            if !d.is_null() && unsafe { &*d }.is_dead() {
                entry.set((ptr::null(), ptr::null_mut()));
                // SAFETY: the entry's claim is ours; it is given up and not used again.
                unsafe { Block::release_chain(NonNull::new_unchecked(b)) };
            }
        }
        for entry in &self.users {
            if entry.get().0.is_null() {
                entry.set((domain.as_ptr(), block.as_ptr()));
                return Ok((block, true));
            }
        }
        Ok((block, false))
    }

    /// Releases every cached block (thread exit).
    fn release_all(&self) {
        self.exited.set(true);
        let global = self.global.replace(ptr::null_mut());
        let users = self.users.iter().map(|e| e.replace((ptr::null(), ptr::null_mut())).1);
        for block in core::iter::once(global).chain(users) {
            if let Some(block) = NonNull::new(block) {
                // SAFETY: the cache's claim is ours; given up here, not used again.
                unsafe { Block::release_chain(block) };
            }
        }
    }

    #[cfg(scalemem_loom)]
    fn hook(&self) -> bool {
        true
    }

    /// Registers the exit hook once; false if it cannot be (then nothing is cached).
    #[cfg(not(scalemem_loom))]
    fn hook(&self) -> bool {
        if self.hooked.get() {
            return true;
        }
        let Some(key) = imp::KEY.get() else { return false };
        // SAFETY: `key` is a live key; the value only has to be non-null for the
        // destructor to run (it reaches the cache through the thread-local).
        if unsafe { libc::pthread_setspecific(key, NonNull::<u8>::dangling().as_ptr().cast()) } != 0 {
            return false;
        }
        self.hooked.set(true);
        true
    }
}

/// Calls `f` with this thread's primary block in `domain` (claiming one on first use).
/// `global` is the global domain's state (its blocks live in a dedicated cache slot).
#[inline]
pub(crate) fn with_block<R>(
    domain: NonNull<DomainInner>,
    global: NonNull<DomainInner>,
    f: impl FnOnce(NonNull<Block>) -> R,
) -> Result<R, AllocError> {
    let cached = imp::with_cache(|cache| cache.lookup(domain, global)).unwrap_or(ptr::null_mut());
    match NonNull::new(cached) {
        Some(block) => Ok(f(block)),
        None => with_block_slow(domain, global, f),
    }
}

#[cold]
#[inline(never)]
fn with_block_slow<R>(
    domain: NonNull<DomainInner>,
    global: NonNull<DomainInner>,
    f: impl FnOnce(NonNull<Block>) -> R,
) -> Result<R, AllocError> {
    let filled = imp::with_cache(|cache| cache.fill(domain, global));
    let (block, cached) = match filled {
        Some(result) => result?,
        // The thread-local is gone (thread teardown): a claim for this call only.
        None => (DomainInner::claim(domain)?, false),
    };
    if cached {
        return Ok(f(block));
    }
    struct Release(NonNull<Block>);
    impl Drop for Release {
        fn drop(&mut self) {
            // SAFETY: the one-call claim made above; release_chain keeps it until its
            // last hazard pointer (taken during the call) is dropped.
            unsafe { Block::release_chain(self.0) };
        }
    }
    let _release = Release(block);
    Ok(f(block))
}

/// Visits this thread's cached blocks (for the debug check against mixing domains).
#[cfg(debug_assertions)]
pub(crate) fn for_each_cached(mut f: impl FnMut(NonNull<Block>)) {
    let _ = imp::with_cache(|cache| {
        let users = cache.users.iter().map(|e| e.get().1);
        for block in core::iter::once(cache.global.get()).chain(users) {
            if let Some(block) = NonNull::new(block) {
                f(block);
            }
        }
    });
}

#[cfg(not(scalemem_loom))]
mod imp {
    use super::Cache;
    use crate::thread_exit::ExitKey;

    crate::sync::thread_local! {
        static CACHE: Cache = const { Cache::new() };
    }

    /// Calls `f` with the cache, or returns `None` during thread teardown.
    #[inline]
    pub(super) fn with_cache<R>(f: impl FnOnce(&Cache) -> R) -> Option<R> {
        CACHE.try_with(f).ok()
    }

    /// The pthread key whose destructor releases a thread's blocks.
    pub(super) static KEY: ExitKey = ExitKey::new(at_exit);

    /// Thread-exit hook: releases the thread's cached blocks.
    unsafe extern "C" fn at_exit(_: *mut libc::c_void) {
        let _ = CACHE.try_with(Cache::release_all);
    }
}

#[cfg(scalemem_loom)]
mod imp {
    use super::Cache;

    /// Under loom the cache is a loom thread-local whose destructor releases the blocks.
    pub(super) struct LoomCache(Cache);

    impl Drop for LoomCache {
        fn drop(&mut self) {
            self.0.release_all();
        }
    }

    crate::sync::thread_local! {
        static CACHE: LoomCache = LoomCache(Cache::new());
    }

    pub(super) fn with_cache<R>(f: impl FnOnce(&Cache) -> R) -> Option<R> {
        CACHE.try_with(|c| f(&c.0)).ok()
    }
}
