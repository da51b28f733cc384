//! Quantum caches: for each size `q, 2q, ... qcache_max`, a small bounded stack of
//! ranges of that size that the arena has allocated and a caller has freed. An
//! allocation of a cached size pops one without taking the arena lock, and a free
//! pushes one back; the arena is reached only when the cache is empty (allocate one) or
//! full (free one). Each cache has its own [`Lock`](super::lock::Lock), so different
//! sizes do not contend with each other or with the arena.
//!
//! In the paper these are object caches (with per-CPU magazines): umem's object caches
//! do not exist yet, and when they land this module becomes a `umem_cache` per size. The
//! interface ([`QCache::pop`], [`QCache::push`], [`QCache::drain`]) is what the arena
//! needs from either.

/// How many ranges each quantum cache holds at most. Under loom: 2, so that the
/// full-cache path runs in a two-thread model.
pub(super) const DEPTH: usize = if cfg!(scalemem_loom) { 2 } else { 16 };

/// The most quantum caches an arena has (sizes `q ..= MAX_QCACHES * q`). Under loom: 2.
pub(super) const MAX_QCACHES: usize = if cfg!(scalemem_loom) { 2 } else { 16 };

/// One quantum cache (the state behind its lock).
pub(super) struct QCache {
    len: usize,
    slots: [usize; DEPTH],
    /// Allocations served from the cache.
    pub(super) hits: u64,
    /// Frees absorbed by the cache.
    pub(super) frees: u64,
}

impl QCache {
    pub(super) const fn new() -> Self {
        Self { len: 0, slots: [0; DEPTH], hits: 0, frees: 0 }
    }

    /// Takes a cached range's address.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<usize> {
        let len = self.len.checked_sub(1)?;
        let addr = *self.slots.get(len)?;
        self.len = len;
        self.hits += 1;
        Some(addr)
    }

    /// Caches `addr`; `false` if the cache is full (the caller frees it to the arena).
    #[inline]
    pub(super) fn push(&mut self, addr: usize) -> bool {
        let Some(slot) = self.slots.get_mut(self.len) else { return false };
        *slot = addr;
        self.len += 1;
        self.frees += 1;
        true
    }

    /// Whether `addr` is cached (a double free, in checking mode).
    pub(super) fn contains(&self, addr: usize) -> bool {
        self.cached().contains(&addr)
    }

    /// The cached addresses.
    pub(super) fn cached(&self) -> &[usize] {
        self.slots.get(..self.len).unwrap_or(&[])
    }

    /// Empties the cache into a buffer; returns the buffer and how many it holds.
    pub(super) fn drain(&mut self) -> ([usize; DEPTH], usize) {
        let n = core::mem::take(&mut self.len);
        (self.slots, n)
    }
}
