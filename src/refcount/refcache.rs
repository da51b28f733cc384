//! [`Refcache`]: reference counts with per-CPU delta caches and delayed zero detection
//! (Clements, Kaashoek, Zeldovich: *RadixVM*, EuroSys 2013, section 3.1).
//!
//! # The scheme
//!
//! Every object embeds a header with a *global count* (and flags). Each CPU has a
//! fixed-size, direct-mapped *delta cache* of `WAYS` entries `(object, delta)`, indexed by
//! a hash of the object's address. An increment or decrement of an object changes only
//! the local delta of its entry; when the entry holds another object (a conflict), that
//! object's delta is *evicted*: added to its global count. So the true count of an object
//! is its global count plus the deltas cached for it on every CPU, and neither alone
//! means anything.
//!
//! Time is cut into *epochs* (a global counter `G`). In every epoch every CPU *flushes*
//! its cache: it adds every cached delta, even a zero one, to its object's global count
//! and empties the cache. `G` advances from `e` to `e + 1` once every cache has flushed
//! during epoch `e`. When a flush (or eviction) brings an object's global count to zero,
//! the object is *queued for review* with the epoch `E` read just after; it is reviewed
//! once `G >= E + 2`:
//!
//! - count still zero, not *dirty* (no delta flushed into it since it was queued), and
//!   still *dying* (no weak upgrade since): freed;
//! - count zero but dirty, or revived by a weak upgrade: re-queued (dirty cleared, dying
//!   set, with the current epoch);
//! - count not zero: dropped from review (a later flush that brings it to zero queues it
//!   again).
//!
//! # Why two epochs, and why the dirty bit (the free is safe)
//!
//! Argue in one global order of the protocol's steps: per-cache operations (a section,
//! or an operation under the cache's lock), header RMWs (all SeqCst), and accesses to `G`
//! (SeqCst). Suppose the reviewer frees `o` at time `r`, and the queueing (or
//! re-queueing) RMW at time `q` cleared `DIRTY` and set `DYING`, and then read `G = E`,
//! and `G >= E + 2` at `r`.
//!
//! 1. Between `q` and `r` no header RMW touched `o`'s count: a flush, eviction or direct
//!    update sets `DIRTY`, an upgrade clears `DYING`, and only (re-)queueing, which is
//!    the reviewer's own step, resets them. So the global count is 0 throughout.
//! 2. `G` was `E` at some point after `q`, so it became `E + 1` after `q`; it became
//!    `E + 2` (before `r`) only after every cache `c` completed a flush that read
//!    `G = E + 1`. Let `s_c` be the moment that flush processed `o`'s way: `q < s_c < r`.
//! 3. At `s_c` cache `c` held no entry for `o` (flushing it would have dirtied `o`), and
//!    between `q` and `s_c` no operation on `c` touched `o`: an increment or decrement
//!    leaves an entry that stays until a flush or eviction applies it (dirtying `o`), or
//!    goes straight to the header (dirtying `o`). So `c`'s delta for `o` is 0 on
//!    `[q, s_c]`.
//! 4. At `m = min_c s_c` (which is in every `[q, s_c]`) the global count and every delta
//!    are 0: the true count is 0, no strong reference exists. A new one can only be
//!    cloned from an existing one (there is none) or made by an upgrade (excluded until
//!    `r` by 1., impossible after `r` by `FREED`). So nobody references `o` from `m` on,
//!    and no cache holds it.
//!
//! One epoch is not enough: a CPU's flush in epoch `E` may precede `q`, so a delta it
//! cached after that flush (a reference taken on it, say) is only seen at its flush in
//! `E + 1`. The dirty bit is needed because the count can go 0 → 1 → 0 between two
//! flushes of a reviewer's window (a reference moved from one CPU to another and
//! dropped): the count alone looks untouched. Zero deltas are flushed for the same
//! reason: an entry whose increments and decrements cancelled still witnessed a
//! reference.
//!
//! # Per-CPU caches: the synchronization protocol
//!
//! Each cache starts with a lock word (0 = free). Everything but the hit path holds it.
//!
//! - **Hit** (local, rseq): [`rseq::add_if_key_in`](crate::cpu::rseq::add_if_key_in): "if
//!   this CPU's lock is free and its way holds `o`, add `±1` to the way's delta", one
//!   committing `add`, no atomic instruction. A few nanoseconds.
//! - **Miss** (local, rseq): [`rseq::try_lock`](crate::cpu::rseq::try_lock) takes the
//!   lock of the CPU the thread runs on, committing the store of the token inside the
//!   section; any hit section on that CPU that was in flight was preempted by us (we run
//!   on its CPU), so it restarts and sees the lock. Under the lock: evict the way's old
//!   entry into its object's header, install `(o, ±1)`, and flush the whole cache first
//!   if it has not flushed in the current epoch. Release: a store of 0.
//! - **Remote flush** (the ticker, for CPUs that are idle or whose threads only hit):
//!   compare-exchange the lock from 0 to a token unique to the ticking call, then one
//!   rseq fence ([`heavy_rseq`](crate::cpu::fence::heavy_rseq)) for all such caches, then
//!   check that the lock still holds the token. After the fence, no section that read the
//!   lock as free before the compare-exchange can still commit (each was restarted or
//!   has committed, and its commit is visible); later sections read the token and bail.
//!   A [`try_lock`](crate::cpu::rseq::try_lock) section that read 0 before the
//!   compare-exchange may have committed after it, overwriting the token: then that
//!   thread owns the lock, the check fails, and the ticker leaves the cache alone this
//!   time (it never stores to a lock it does not own). Tokens cannot repeat while the
//!   ticker waits: only one ticker runs at a time and it releases what it owns.
//! - **Busy or no rseq**: a thread that finds its cache locked, or that has no rseq in a
//!   domain that uses sections, adds its delta straight to the object's header (dirtying
//!   it, exactly like an immediate flush). It never waits.
//!
//! Where the process has no rseq or no rseq fence, the domain runs in *locked* mode:
//! every operation compare-exchanges its CPU's lock (one uncontended atomic), and the
//! ticker takes the locks the same way, without fences.
//!
//! Evictions apply their delta while holding the cache's lock, so a flush can never miss
//! a delta that is "in transit" (step 3 above relies on it).
//!
//! # Who advances epochs
//!
//! - A background *ticker* thread per domain ([`Config::background`], the default),
//!   every [`Config::epoch`] (10 ms): it flushes every cache that has not flushed in the
//!   current epoch (remotely: one rseq fence per tick), advances `G`, and reviews. It skips
//!   ticks while nothing is cached and nothing awaits review, so an idle process is not
//!   woken for nothing beyond the timer. Because it flushes idle CPUs' caches itself, a
//!   process whose threads sleep still frees its objects.
//! - Callers' slow paths (misses) flush their own CPU's cache when it lags behind `G`,
//!   which costs no fence (they hold the lock taken locally), so busy CPUs mostly flush
//!   themselves.
//! - [`Refcache::tick`] does one ticker step by hand; tests and `Config::manual()`
//!   domains drive epochs that way.
//!
//! Frees run on the ticking thread, after it has released the review lock.
//!
//! # Weak references
//!
//! A [`RcWeak`](super::RcWeak) keeps the allocation (not the value) alive with a weak
//! count. Upgrading is one SeqCst RMW on the header: fail if `FREED`, otherwise add one
//! to the global count and clear `DYING` (the paper's "dying" bit, set when the object is
//! queued). The reviewer frees with one RMW that requires a zero count, `DYING` and no
//! `DIRTY`, so of an upgrade and a free that race, exactly one wins. The upgrade must
//! add to the *global* count in that same RMW, not to a per-CPU delta: a delta added
//! after the RMW could land after the reviewer's window has closed (the upgrading thread
//! preempted in between). Because the count goes up in the same RMW, the count test
//! alone would already veto the free, and the later drop of the upgraded reference
//! dirties the object; `DYING` is the paper's explicit form of the same veto, kept as a
//! second, independent check (removing it alone is not caught by the loom models, by
//! design; removing the dirty bit, the zero-delta flush or the second epoch is).
//!
//! # Invariants
//! - An object's `REVIEW` bit is set while it is on the inbox or the review list; its
//!   `next` and `review_epoch` belong to that list.
//! - A cache's entries change only under its lock, except deltas, which hit sections
//!   change while the lock is free. `flushed <= G`, and `G` changes only under the
//!   advancer lock, one step at a time.
//! - An object in a cache, on a list, or with a non-zero count is not `FREED`; a `FREED`
//!   object is in no cache (step 4).
//! - Nothing on the increment/decrement path allocates; the only shared write on it is
//!   the header RMW of an eviction or direct update, and the inbox push of an object
//!   whose count reached zero.

use core::fmt;
use core::mem::{offset_of, size_of};
use core::ptr::NonNull;
use core::time::Duration;

use super::rcref::{COUNT_SHIFT, DIRTY, DYING, FREED, Header, REVIEW, RcBox, RcRef, add_count, count_of};
use super::section;
use crate::cpu::PerCpu;
use crate::sync::UnsafeCell;
use crate::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicUsize, Ordering};
use crate::util::{AllocError, CachePadded};

/// Entries per CPU cache (a power of two). Under loom: 2, so conflicts and evictions
/// happen in models.
#[cfg(not(scalemem_loom))]
const WAYS: usize = 256;
#[cfg(scalemem_loom)]
const WAYS: usize = 2;
const WAY_BITS: u32 = WAYS.trailing_zeros();

/// The token of a lock taken locally (by `try_lock` or, in locked mode, by CAS).
const LOCAL_TOKEN: usize = 1;

/// How a [`Refcache`] runs.
///
/// ```
/// use core::time::Duration;
/// use scalemem::refcount::{Config, Refcache};
///
/// // The paper's 10 ms epochs, advanced by a background thread:
/// assert_eq!(Config::default(), Config { epoch: Duration::from_millis(10), background: true });
/// // Shorter epochs, for objects that should not wait long once unreferenced:
/// let cache = Refcache::with_config(Config { epoch: Duration::from_millis(1), ..Config::default() }).unwrap();
/// assert_eq!(*cache.alloc(42), 42);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How often the background ticker tries to advance the epoch (the paper's 10 ms).
    pub epoch: Duration,
    /// Whether a background thread ticks the domain every `epoch`. Without it, objects
    /// are freed only when [`Refcache::tick`] is called.
    pub background: bool,
}

impl Default for Config {
    /// 10 ms epochs, advanced by a background thread.
    fn default() -> Self {
        Self { epoch: Duration::from_millis(10), background: true }
    }
}

/// Presets besides [`Config::default`].
///
/// ```
/// use scalemem::refcount::Config;
/// assert_eq!(Config::manual(), Config { background: false, ..Config::default() });
/// ```
impl Config {
    /// No background thread: epochs advance only through [`Refcache::tick`] (tests,
    /// callers that have their own periodic hook).
    ///
    /// ```
    /// let config = scalemem::refcount::Config::manual();
    /// assert!(!config.background);
    /// ```
    pub fn manual() -> Self {
        Self { background: false, ..Self::default() }
    }
}

/// One cache entry: `key` is an object's header address (0: empty).
#[repr(C)]
struct Way {
    /// Written only under the cache's lock.
    key: AtomicUsize,
    /// Written by hit sections while the lock is free, and under the lock otherwise.
    delta: AtomicIsize,
}

/// One CPU's delta cache. `lock` must stay the first field: the rseq sections find it at
/// offset 0 of the CPU's block.
#[repr(C)]
struct Cache {
    /// 0: free; `LOCAL_TOKEN`: taken by a thread for its own CPU; otherwise a ticker's
    /// token.
    lock: AtomicUsize,
    /// The epoch of the cache's last flush. Written under the lock (Release), read by the
    /// advancer (Acquire).
    flushed: AtomicUsize,
    ways: [Way; WAYS],
}

impl Cache {
    fn new(epoch: usize) -> Self {
        Self {
            lock: AtomicUsize::new(0),
            flushed: AtomicUsize::new(epoch),
            ways: core::array::from_fn(|_| Way { key: AtomicUsize::new(0), delta: AtomicIsize::new(0) }),
        }
    }

    fn unlock(&self) {
        // Release: publishes our changes to the entries to the next holder (Acquire CAS)
        // and to hit sections (plain x86 loads; Acquire in the loom model).
        self.lock.store(0, Ordering::Release);
    }
}

/// The way of `key` in every cache.
#[cfg(not(scalemem_loom))]
#[inline]
fn way_index(key: usize) -> usize {
    // Fibonacci hashing of the address without its alignment bits.
    ((key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize) >> (usize::BITS - WAY_BITS)) & (WAYS - 1)
}

/// Under loom every object maps to way 0: a model must be deterministic, and addresses
/// are not; this way any two objects used on one CPU conflict, so models run evictions.
#[cfg(scalemem_loom)]
#[inline]
fn way_index(_key: usize) -> usize {
    0
}

/// The review list: objects due for review, singly linked through `Header::next`.
struct ReviewList {
    head: *mut Header,
}

/// The shared state of a [`Refcache`] (boxed, so that handles and the ticker can point
/// to it).
pub(crate) struct Domain {
    /// Where `caches`' blocks are, for the hit section (read together with the rest of
    /// the hit path's words).
    blocks: section::Blocks,
    caches: PerCpu<Cache>,
    /// `G`.
    epoch: CachePadded<AtomicUsize>,
    /// Objects newly queued for review (a push-only stack, taken whole by the advancer).
    inbox: CachePadded<AtomicPtr<Header>>,
    /// The advancer lock: held by `tick`.
    advancing: AtomicBool,
    /// Owned by the holder of `advancing`.
    review: UnsafeCell<ReviewList>,
    /// Objects on the inbox or the review list.
    pending: AtomicUsize,
    pub(crate) allocated: AtomicUsize,
    freed: AtomicUsize,
    /// Whether this domain uses rseq sections (fixed at construction; see `section`).
    sections: bool,
    /// Tells the ticker to exit.
    stop: AtomicBool,
}

// SAFETY: every field is an atomic, a PerCpu of atomics, or the review list, whose raw
// pointers are only followed by the holder of `advancing` (or with `&mut`).
// - Send: nothing in the domain is tied to a thread.
// - Sync: shared access goes through atomics and the advancer lock.
unsafe impl Send for Domain {}
// SAFETY: see the Send impl.
unsafe impl Sync for Domain {}

/// A held advancer lock.
struct Advancing<'a>(&'a Domain);

impl Drop for Advancing<'_> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire in `try_advancing`.
        self.0.advancing.store(false, Ordering::Release);
    }
}

impl Domain {
    fn new() -> Result<Self, AllocError> {
        const FIRST_EPOCH: usize = 1;
        let caches = PerCpu::new(|_| Cache::new(FIRST_EPOCH))?;
        let sections = section::usable();
        Ok(Self {
            blocks: section::Blocks::new(caches.raw_parts(), sections),
            caches,
            epoch: CachePadded::new(AtomicUsize::new(FIRST_EPOCH)),
            inbox: CachePadded::new(AtomicPtr::new(core::ptr::null_mut())),
            advancing: AtomicBool::new(false),
            review: UnsafeCell::new(ReviewList { head: core::ptr::null_mut() }),
            pending: AtomicUsize::new(0),
            allocated: AtomicUsize::new(0),
            freed: AtomicUsize::new(0),
            sections,
            stop: AtomicBool::new(false),
        })
    }

    /// `G`. SeqCst: see the module documentation (one order of header RMWs and `G`).
    fn epoch(&self) -> usize {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Adds `delta` to the object's count: the increment/decrement path.
    #[inline]
    pub(crate) fn add(&self, obj: NonNull<Header>, delta: isize) {
        let key = obj.as_ptr() as usize;
        if self.blocks.sections() {
            let Some(area) = section::area() else { return self.apply(obj, delta) };
            let key_off = offset_of!(Cache, ways) + way_index(key) * size_of::<Way>();
            // SAFETY: (1) `area` is this thread's. (2) `caches` is our live PerCpu<Cache>,
            // whose blocks start with the lock word and hold a key word at `key_off`
            // followed by the delta. (3) Keys and deltas are written only by these
            // sections and by lock holders (local via try_lock, remote after the fence
            // and token check), per the module protocol.
            if unsafe { section::add_if_key_block(area, &self.blocks, PerCpu::<Cache>::STRIDE, key_off, key, delta) } {
                return;
            }
            return self.add_slow_section(area, obj, delta);
        }
        self.add_locked_mode(obj, delta);
    }

    /// A miss or a locked cache, in a domain with sections.
    #[cold]
    #[inline(never)]
    fn add_slow_section(&self, area: section::Area, obj: NonNull<Header>, delta: isize) {
        // SAFETY: (1) this thread's area; (2) our PerCpu<Cache>, whose blocks start with
        // the lock word; (3) other threads take these locks only by CAS from 0 followed
        // by the fence and the token check (`flush_lagging`), and release only locks
        // they own.
        match unsafe { section::try_lock(area, self.caches.raw_parts(), LOCAL_TOKEN) } {
            Some(cpu) => {
                let cache = self.caches.get(cpu);
                self.update_locked(cache, obj, delta);
                cache.unlock();
            }
            None => self.apply(obj, delta),
        }
    }

    /// Every operation in locked mode (no sections in this domain).
    #[cold]
    #[inline(never)]
    fn add_locked_mode(&self, obj: NonNull<Header>, delta: isize) {
        let cache = self.caches.local();
        // Acquire: pairs with the Release in Cache::unlock.
        if cache.lock.compare_exchange(0, LOCAL_TOKEN, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            self.update_locked(cache, obj, delta);
            cache.unlock();
        } else {
            self.apply(obj, delta);
        }
    }

    /// Adds `delta` for `obj` in `cache`, evicting a conflicting entry, after flushing the
    /// cache if it has not flushed in the current epoch. REQUIRES: `cache`'s lock.
    fn update_locked(&self, cache: &Cache, obj: NonNull<Header>, delta: isize) {
        let epoch = self.epoch();
        // Relaxed: written only under the lock we hold.
        if cache.flushed.load(Ordering::Relaxed) != epoch {
            self.flush_locked(cache, epoch);
        }
        let key = obj.as_ptr() as usize;
        let way = &cache.ways[way_index(key)];
        // Relaxed (all way accesses under the lock): the lock's Acquire/Release orders
        // them against other holders, and no section commits while the lock is held.
        let old = way.key.load(Ordering::Relaxed);
        if old == key {
            let sum = way.delta.load(Ordering::Relaxed).wrapping_add(delta);
            way.delta.store(sum, Ordering::Relaxed);
            return;
        }
        if let Some(old) = NonNull::new(old as *mut Header) {
            // The eviction: applied before the lock is released (no delta in transit).
            self.apply(old, way.delta.load(Ordering::Relaxed));
        }
        way.key.store(key, Ordering::Relaxed);
        way.delta.store(delta, Ordering::Relaxed);
    }

    /// Applies every entry of `cache` (zero deltas too) and empties it; records the
    /// flush as `epoch`'s. REQUIRES: `cache`'s lock (or `&mut` access to the domain), and
    /// `epoch` read from `G` after the lock was taken.
    fn flush_locked(&self, cache: &Cache, epoch: usize) {
        for way in &cache.ways {
            // Relaxed: under the lock (see update_locked).
            let key = way.key.load(Ordering::Relaxed);
            if let Some(obj) = NonNull::new(key as *mut Header) {
                let delta = way.delta.load(Ordering::Relaxed);
                way.key.store(0, Ordering::Relaxed);
                way.delta.store(0, Ordering::Relaxed);
                self.apply(obj, delta);
            }
        }
        // Release: pairs with the Acquire in `all_flushed`: the advancer sees the applied
        // deltas' RMWs before it advances.
        cache.flushed.store(epoch, Ordering::Release);
    }

    /// Adds `delta` to the object's global count and marks it dirty; queues it for review
    /// if that made the count zero and it is not queued yet. A flush, eviction, or direct
    /// update.
    fn apply(&self, obj: NonNull<Header>, delta: isize) {
        // SAFETY: a cached or referenced object is live (module docs, step 4).
        let header = unsafe { obj.as_ref() };
        // Relaxed: the CAS decides.
        let mut state = header.state.load(Ordering::Relaxed);
        loop {
            debug_assert!(state & FREED == 0, "Refcache: a delta for a freed object");
            let mut new = add_count(state, delta) | DIRTY;
            let queue = count_of(new) == 0 && new & REVIEW == 0;
            if queue {
                new = (new | REVIEW | DYING) & !DIRTY;
            }
            // SeqCst: one order of header RMWs and `G` (module docs); Release publishes the
            // accesses that preceded the delta (the reference's uses) to the freeing
            // thread's Acquire.
            match header.state.compare_exchange_weak(state, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => {
                    if queue {
                        self.enqueue(obj);
                    }
                    return;
                }
                Err(seen) => state = seen,
            }
        }
    }

    /// Pushes an object whose `REVIEW` bit we just set onto the inbox, with the epoch read
    /// now (after the RMW that queued it).
    fn enqueue(&self, obj: NonNull<Header>) {
        // SAFETY: we set REVIEW, so the object's list fields are ours until the push.
        let header = unsafe { obj.as_ref() };
        // Relaxed: published by the Release push below.
        header.review_epoch.store(self.epoch(), Ordering::Relaxed);
        // Relaxed: a statistic.
        self.pending.fetch_add(1, Ordering::Relaxed);
        // Relaxed: the CAS decides.
        let mut head = self.inbox.load(Ordering::Relaxed);
        loop {
            // Relaxed: published by the Release CAS.
            header.next.store(head, Ordering::Relaxed);
            // Release: pairs with the Acquire swap in `review_locked`, publishing
            // `review_epoch` and `next`.
            match self.inbox.compare_exchange_weak(head, obj.as_ptr(), Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => head = seen,
            }
        }
    }

    fn try_advancing(&self) -> Option<Advancing<'_>> {
        // Acquire: pairs with the Release in Advancing::drop (the review list).
        self.advancing.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(Advancing(self))
    }

    /// Takes the advancer lock and every CPU cache's lock with no scope, for `fork`
    /// handlers (umem's regions): the child then inherits no tick and no cache update
    /// half done, and no cache locked by a thread it will not have (which would keep
    /// that CPU from ever flushing, so the child's epoch from ever advancing). Others are
    /// never blocked meanwhile: a busy advancer lock skips the tick, a busy cache lock
    /// sends the update to the object's header. Each holder finishes without waiting on a
    /// lock, so the spinning here ends.
    #[cfg(not(scalemem_loom))]
    pub(crate) fn fork_lock(&self) {
        /// Our token: even, non-zero, not `LOCAL_TOKEN`, and no ticker's (a ticker's is
        /// the address of a local, and no ticker runs while we hold the advancer lock).
        const FORK_TOKEN: usize = 2;
        let backoff = crate::util::Backoff::new();
        loop {
            if let Some(held) = self.try_advancing() {
                // Held until `fork_unlock`.
                core::mem::forget(held);
                break;
            }
            backoff.snooze();
        }
        loop {
            for cache in self.caches.iter() {
                // Acquire on success: pairs with the Release in Cache::unlock.
                let _ = cache.lock.compare_exchange(0, FORK_TOKEN, Ordering::Acquire, Ordering::Relaxed);
            }
            if self.sections {
                // A try_lock section that read a lock free before our CAS has committed
                // (overwriting our token: that thread owns the lock) or restarted.
                section::fence();
            }
            // Acquire: as in `flush_lagging`. After the fence no section can overwrite
            // a token of ours, so a lock seen holding it stays ours.
            if self.caches.iter().all(|cache| cache.lock.load(Ordering::Acquire) == FORK_TOKEN) {
                return;
            }
            backoff.snooze();
        }
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took (in the parent, and in the
    /// child, whose only thread is the one that took them).
    ///
    /// # Safety
    /// `fork_lock` ran on this domain (here, or in the parent before the `fork` that
    /// made this process) and nothing released its locks since.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn fork_unlock(&self) {
        for cache in self.caches.iter() {
            cache.unlock();
        }
        drop(Advancing(self));
    }

    /// One epoch step: flush every cache that has not flushed in the current epoch,
    /// advance the epoch if all have, review what is due, then free. Returns the epoch.
    /// If another thread is ticking, returns at once.
    pub(crate) fn tick(&self) -> usize {
        let Some(advancing) = self.try_advancing() else { return self.epoch() };
        let mut epoch = self.epoch();
        self.flush_lagging(epoch);
        if self.all_flushed(epoch) {
            epoch += 1;
            // SeqCst: see `epoch()`. Only the advancer writes `G`.
            self.epoch.store(epoch, Ordering::SeqCst);
        }
        let freed = self.review_locked(&advancing, epoch);
        drop(advancing);
        // SAFETY: every object on the list was moved to FREED by the reviewer, once.
        unsafe { Self::free_all(freed) };
        epoch
    }

    /// Flushes every cache whose last flush is older than `epoch`, taking their locks
    /// remotely (module docs). Caches that are busy are left for the next tick.
    /// REQUIRES: the advancer lock (so `epoch` is `G`, and our token is unique).
    fn flush_lagging(&self, epoch: usize) {
        let marker = 0u64;
        // Unique among running lockers: the address of a live local of this call (even,
        // non-zero, and not LOCAL_TOKEN).
        let token = core::ptr::from_ref(&marker) as usize;
        let mut any = false;
        for cache in self.caches.iter() {
            // Acquire: see `all_flushed`.
            if cache.flushed.load(Ordering::Acquire) != epoch {
                // Acquire on success: pairs with the Release in Cache::unlock.
                any |= cache.lock.compare_exchange(0, token, Ordering::Acquire, Ordering::Relaxed).is_ok();
            }
        }
        if !any {
            return;
        }
        if self.sections {
            // Sections that saw a lock free before our CAS have committed or restarted.
            section::fence();
        }
        for cache in self.caches.iter() {
            // Acquire: a try_lock commit that overwrote our token makes that thread the
            // owner; otherwise the token is ours and nothing can change it (module docs).
            if cache.lock.load(Ordering::Acquire) == token {
                self.flush_locked(cache, epoch);
                cache.unlock();
            }
        }
    }

    /// Whether every cache has flushed in `epoch`.
    fn all_flushed(&self, epoch: usize) -> bool {
        // Acquire: pairs with the Release in flush_locked.
        self.caches.iter().all(|cache| cache.flushed.load(Ordering::Acquire) == epoch)
    }

    /// Reviews every queued object that is due at `epoch`; returns the objects to free,
    /// linked through `next`.
    fn review_locked(&self, _advancing: &Advancing<'_>, epoch: usize) -> *mut Header {
        // Acquire: pairs with the Release pushes in `enqueue`.
        let incoming = self.inbox.swap(core::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: the review list belongs to the holder of the advancer lock (we are).
        let mut list =
            self.review.with_mut(|list| unsafe { core::mem::replace(&mut (*list).head, core::ptr::null_mut()) });
        let mut kept: *mut Header = core::ptr::null_mut();
        let mut freed: *mut Header = core::ptr::null_mut();
        for mut cursor in [incoming, core::mem::take(&mut list)] {
            while let Some(obj) = NonNull::new(cursor) {
                // SAFETY: objects on our lists are live and their list fields are ours
                // (REVIEW is set); read `next` before any RMW that could hand them on.
                let header = unsafe { obj.as_ref() };
                // Relaxed: list fields are ours (published by the inbox's Release/Acquire
                // or written by this lock's holders).
                cursor = header.next.load(Ordering::Relaxed);
                let due = header.review_epoch.load(Ordering::Relaxed).saturating_add(2) <= epoch;
                let keep = if due {
                    match self.review_one(header) {
                        Verdict::Free => {
                            // Relaxed: the object is ours now (FREED).
                            header.next.store(freed, Ordering::Relaxed);
                            freed = obj.as_ptr();
                            false
                        }
                        Verdict::Requeue => true,
                        Verdict::Drop => false,
                    }
                } else {
                    true
                };
                if keep {
                    // Relaxed: list fields are ours.
                    header.next.store(kept, Ordering::Relaxed);
                    kept = obj.as_ptr();
                }
            }
        }
        // SAFETY: as above.
        self.review.with_mut(|list| unsafe { (*list).head = kept });
        freed
    }

    /// Decides one due object (REVIEW set, ours).
    fn review_one(&self, header: &Header) -> Verdict {
        // Relaxed: the CAS decides.
        let mut state = header.state.load(Ordering::Relaxed);
        loop {
            let (new, verdict) = if count_of(state) != 0 {
                (state & !(REVIEW | DYING | DIRTY), Verdict::Drop)
            } else if state & DIRTY != 0 || state & DYING == 0 {
                ((state & !DIRTY) | DYING, Verdict::Requeue)
            } else {
                (FREED, Verdict::Free)
            };
            // SeqCst: see `apply`; Acquire (for Free) makes every earlier RMW's published
            // accesses (the uses of the last references) happen before the free.
            match header.state.compare_exchange_weak(state, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => {
                    match verdict {
                        // Relaxed: the list fields are still ours (REVIEW stays set).
                        Verdict::Requeue => header.review_epoch.store(self.epoch(), Ordering::Relaxed),
                        Verdict::Free => {
                            // Relaxed: statistics.
                            self.pending.fetch_sub(1, Ordering::Relaxed);
                            self.freed.fetch_add(1, Ordering::Relaxed);
                        }
                        // Relaxed: a statistic.
                        Verdict::Drop => drop(self.pending.fetch_sub(1, Ordering::Relaxed)),
                    }
                    return verdict;
                }
                Err(seen) => state = seen,
            }
        }
    }

    /// Frees the objects of a list built by `review_locked`.
    ///
    /// # Safety
    /// Every object on the list was moved to `FREED` by the caller, and is freed once.
    unsafe fn free_all(mut cursor: *mut Header) {
        while let Some(obj) = NonNull::new(cursor) {
            // SAFETY: the object is live until we free it, and its list fields are ours.
            // Relaxed: see review_locked.
            cursor = unsafe { obj.as_ref() }.next.load(Ordering::Relaxed);
            // SAFETY: (1) FREED by our reviewer, no reference exists or can be made; (2)
            // once: it left every list.
            unsafe { Header::free_value(obj) };
        }
    }

    /// A tick if [`has_work`](Self::has_work) says one could do anything (the background
    /// ticker's and `Refcache::tick_if_busy`'s step); `None` when it skipped.
    fn tick_if_busy(&self) -> Option<usize> {
        self.has_work().then(|| self.tick())
    }

    /// Whether a tick could do anything: objects await review, or some cache holds an
    /// entry (a hint: read without the locks).
    fn has_work(&self) -> bool {
        // Relaxed: a hint; a missed entry waits for the next tick.
        self.pending.load(Ordering::Relaxed) != 0
            || self.caches.iter().any(|cache| cache.ways.iter().any(|way| way.key.load(Ordering::Relaxed) != 0))
    }
}

/// What the reviewer does with a due object.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Free,
    Requeue,
    Drop,
}

impl Drop for Domain {
    fn drop(&mut self) {
        // No handle is left (they borrow the Refcache), so no operation runs: apply
        // every cached delta, then free every object whose count is zero. An object with
        // a non-zero count was leaked (`mem::forget` of a handle) and stays allocated.
        let epoch = self.epoch();
        for cache in self.caches.iter() {
            self.flush_locked(cache, epoch);
        }
        let mut freed: *mut Header = core::ptr::null_mut();
        // Acquire: see review_locked.
        let mut cursor = self.inbox.swap(core::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: `&mut self`: the review list is ours.
        let mut listed = self.review.with_mut(|list| unsafe { (*list).head });
        for _ in 0..2 {
            while let Some(obj) = NonNull::new(cursor) {
                // SAFETY: listed objects are live, their list fields ours.
                let header = unsafe { obj.as_ref() };
                // Relaxed: exclusive access.
                cursor = header.next.load(Ordering::Relaxed);
                let state = header.state.load(Ordering::Relaxed);
                if count_of(state) == 0 {
                    header.state.store(FREED, Ordering::Relaxed);
                    header.next.store(freed, Ordering::Relaxed);
                    freed = obj.as_ptr();
                } else {
                    header.state.store(state & !(REVIEW | DYING | DIRTY), Ordering::Relaxed);
                }
            }
            cursor = core::mem::take(&mut listed);
        }
        // SAFETY: every object on `freed` was moved to FREED here, once, and nothing
        // references it (no handle outlives the domain).
        unsafe { Self::free_all(freed) };
    }
}

/// Counters of a [`Refcache`], for tests and monitoring.
///
/// ```
/// use scalemem::refcount::{Config, Refcache};
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let r = cache.alloc("x");
/// let stats = cache.stats();
/// assert_eq!((stats.live, stats.pending, stats.freed), (1, 0, 0));
/// drop(r);
/// for _ in 0..8 {
///     cache.tick(); // flush the caches, then review once the count stayed zero
/// }
/// let stats = cache.stats();
/// assert_eq!((stats.live, stats.pending, stats.freed), (0, 0, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RefcacheStats {
    /// The current epoch.
    pub epoch: usize,
    /// Objects allocated and not yet freed (referenced, or waiting for review).
    pub live: usize,
    /// Objects whose count reached zero and that wait for review.
    pub pending: usize,
    /// Objects freed so far.
    pub freed: usize,
}

/// A Refcache domain: per-CPU delta caches, epochs, and a review queue; objects are
/// allocated with [`alloc`](Self::alloc) and referenced through [`RcRef`] and
/// [`RcWeak`](super::RcWeak). See the [module documentation](self) for the protocol.
///
/// An increment or decrement costs a few nanoseconds and writes no shared cache line
/// while the object's entry is in the CPU's cache; an object is freed at least two
/// epochs (20 ms by default) after its last reference is dropped, by the ticker thread
/// (or by whoever calls [`tick`](Self::tick)). That delay is the point where freeing is
/// expensive and counts bounce around zero: the allocator uses it for the regions behind
/// its slabs.
///
/// Memory: `256 * 16` bytes of cache per CPU, a 40-byte header per object.
///
/// ```
/// use scalemem::refcount::{Config, Refcache};
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let object = cache.alloc(vec![1, 2, 3]);
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         let mine = object.clone();
///         s.spawn(move || assert_eq!(mine.len(), 3));
///     }
/// });
/// drop(object);
/// assert_eq!(cache.stats().live, 1); // not freed yet: zero is detected by epochs
/// // Freed once its count has stayed zero, untouched, for two whole epochs: three to
/// // five ticks, depending on which CPUs' caches still held its deltas.
/// let mut ticks = 0;
/// while cache.stats().live > 0 {
///     cache.tick();
///     ticks += 1;
///     assert!(ticks <= 8, "never freed");
/// }
/// ```
pub struct Refcache {
    domain: Box<Domain>,
    #[cfg(not(scalemem_loom))]
    ticker: Option<std::thread::JoinHandle<()>>,
}

/// Making a domain, allocating counted objects in it, and driving and watching its
/// epochs.
///
/// ```
/// use scalemem::refcount::{Config, Refcache};
///
/// let cache = Refcache::with_config(Config::manual()).unwrap();
/// let a = cache.alloc(1);
/// let b = a.clone();
/// drop(a);
/// for _ in 0..8 {
///     cache.tick();
/// }
/// assert_eq!((*b, cache.stats().freed), (1, 0)); // `b` keeps the object alive
/// ```
impl Refcache {
    /// A domain with the default [`Config`] (10 ms epochs, background ticker). Fails if
    /// the kernel refuses the memory for the caches or the ticker thread cannot start.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    /// static DROPPED: AtomicBool = AtomicBool::new(false);
    /// struct Noisy;
    /// impl Drop for Noisy {
    ///     fn drop(&mut self) {
    ///         DROPPED.store(true, SeqCst);
    ///     }
    /// }
    ///
    /// let cache = scalemem::refcount::Refcache::new().unwrap();
    /// drop(cache.alloc(Noisy)); // freed by the ticker within a few epochs,
    /// drop(cache); // or at the latest when the domain goes
    /// assert!(DROPPED.load(SeqCst));
    /// ```
    pub fn new() -> Result<Self, AllocError> {
        Self::with_config(Config::default())
    }

    /// A domain with `config`. Under loom there is never a background thread.
    ///
    /// ```
    /// use scalemem::refcount::{Config, Refcache};
    ///
    /// let cache = Refcache::with_config(Config::manual()).unwrap();
    /// drop(cache.alloc([0u8; 64]));
    /// assert_eq!(cache.stats().freed, 0); // no ticker: nothing is freed until we tick
    /// let mut ticks = 0;
    /// while cache.stats().freed == 0 {
    ///     cache.tick();
    ///     ticks += 1;
    ///     assert!(ticks <= 8, "never freed");
    /// }
    /// ```
    pub fn with_config(config: Config) -> Result<Self, AllocError> {
        let domain = Box::new(Domain::new()?);
        #[cfg(not(scalemem_loom))]
        {
            let ticker = if config.background { Some(spawn_ticker(&domain, config.epoch)?) } else { None };
            Ok(Self { domain, ticker })
        }
        #[cfg(scalemem_loom)]
        {
            let _ = config;
            Ok(Self { domain })
        }
    }

    /// [`Domain::fork_lock`], for the owners of intrusive domains (umem's regions).
    #[cfg(not(scalemem_loom))]
    pub(crate) fn fork_lock(&self) {
        self.domain.fork_lock();
    }

    /// [`Domain::fork_unlock`].
    ///
    /// # Safety
    /// As `Domain::fork_unlock`.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn fork_unlock(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.domain.fork_unlock() };
    }

    /// Moves `value` to the heap behind a counted header and returns the first reference.
    /// Allocates (through `Box`); the reference operations never do.
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// let v = cache.alloc(vec![1, 2, 3]);
    /// let w = v.clone(); // another reference to the same object
    /// assert_eq!(w.iter().sum::<i32>(), 6);
    /// assert_eq!(cache.stats().live, 1);
    /// ```
    pub fn alloc<T: Send + 'static>(&self, value: T) -> RcRef<'_, T> {
        // Relaxed: a statistic.
        self.domain.allocated.fetch_add(1, Ordering::Relaxed);
        RcRef::from_owned(&self.domain, RcBox::allocate(value))
    }

    /// One epoch step by hand: flushes every CPU's cache that has not flushed in the
    /// current epoch (remotely, with one rseq fence), advances the epoch if all have,
    /// reviews the objects that are due and frees those whose count stayed zero and
    /// untouched for two epochs. Returns the epoch. If another thread is ticking, returns
    /// at once.
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// let e = cache.tick();
    /// assert_eq!(cache.tick(), e + 1);
    /// ```
    pub fn tick(&self) -> usize {
        self.domain.tick()
    }

    /// [`tick`](Self::tick), but only if it could do anything: some CPU's cache holds a
    /// delta or some object awaits review (read as a hint, without the locks: a delta
    /// cached just after the check waits for the next call). `None` when it skipped. For
    /// callers that drive a [`Config::manual`] domain on a timer, as the background
    /// ticker does for itself: an idle domain then costs no rseq fence (a `membarrier`
    /// that interrupts every CPU running the process) per period.
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// assert_eq!(cache.tick_if_busy(), None); // nothing cached, nothing to review
    /// let r = cache.alloc(7);
    /// drop(r); // a -1 delta now sits in this CPU's cache (or in the object's header)
    /// let mut ticks = 0;
    /// while cache.tick_if_busy().is_some() {
    ///     ticks += 1; // flush, then review until the object is freed
    /// }
    /// assert!(ticks >= 1);
    /// assert_eq!(cache.stats().pending, 0);
    /// ```
    pub fn tick_if_busy(&self) -> Option<usize> {
        self.domain.tick_if_busy()
    }

    /// Checks the invariants that hold while no operation runs concurrently (panics if
    /// one is broken): every cache lock is free, no cache has flushed in a future epoch,
    /// an empty way has no delta, and the objects on the review lists are exactly the
    /// `pending` ones, each marked `REVIEW` and none freed. For tests, models and stress
    /// runs.
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// drop(cache.alloc(1));
    /// cache.tick();
    /// cache.assert_valid();
    /// ```
    pub fn assert_valid(&self) {
        let domain = &*self.domain;
        let _advancing = domain.try_advancing().expect("Refcache::assert_valid while a tick runs");
        let epoch = domain.epoch();
        for cache in domain.caches.iter() {
            // Relaxed (here and below): at rest, after the caller synchronised with every
            // thread that used the domain.
            assert_eq!(cache.lock.load(Ordering::Relaxed), 0, "Refcache: a cache lock is held at rest");
            assert!(cache.flushed.load(Ordering::Relaxed) <= epoch, "Refcache: a cache flushed in a future epoch");
            for way in &cache.ways {
                if way.key.load(Ordering::Relaxed) == 0 {
                    assert_eq!(way.delta.load(Ordering::Relaxed), 0, "Refcache: a delta without an object");
                }
            }
        }
        // Acquire: pairs with the Release pushes in `enqueue` (their `next` links).
        let inbox = domain.inbox.load(Ordering::Acquire);
        // SAFETY: we hold the advancer lock, which owns the review list.
        let review = domain.review.with(|list| unsafe { (*list).head });
        let mut listed = 0;
        for mut cursor in [inbox, review] {
            while let Some(obj) = NonNull::new(cursor) {
                // SAFETY: a listed object is not freed (only the advancer frees, and we
                // hold its lock); the inbox is push-only, so its links stay valid.
                let header = unsafe { obj.as_ref() };
                let state = header.state.load(Ordering::Relaxed);
                assert!(state & REVIEW != 0 && state & FREED == 0, "Refcache: a listed object not under review");
                listed += 1;
                cursor = header.next.load(Ordering::Relaxed);
            }
        }
        assert_eq!(listed, domain.pending.load(Ordering::Relaxed), "Refcache: pending count disagrees with the lists");
    }

    /// The shared state, for the intrusive API (`intrusive.rs`).
    pub(crate) fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The current epoch.
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// let e = cache.epoch();
    /// assert_eq!(cache.epoch(), e); // a manual domain advances only when ticked
    /// cache.tick();
    /// assert_eq!(cache.epoch(), e + 1);
    /// ```
    pub fn epoch(&self) -> usize {
        self.domain.epoch()
    }

    /// Counters (each read on its own; a hint under concurrency).
    ///
    /// ```
    /// let cache = scalemem::refcount::Refcache::with_config(scalemem::refcount::Config::manual()).unwrap();
    /// let objects: Vec<_> = (0..3).map(|i| cache.alloc(i)).collect();
    /// let stats = cache.stats();
    /// assert_eq!((stats.live, stats.freed, stats.epoch), (3, 0, cache.epoch()));
    /// drop(objects);
    /// assert_eq!(cache.stats().freed, 0); // freed only epochs later, by a tick
    /// ```
    pub fn stats(&self) -> RefcacheStats {
        // Relaxed: statistics.
        let allocated = self.domain.allocated.load(Ordering::Relaxed);
        let freed = self.domain.freed.load(Ordering::Relaxed);
        RefcacheStats {
            epoch: self.domain.epoch(),
            live: allocated.saturating_sub(freed),
            pending: self.domain.pending.load(Ordering::Relaxed),
            freed,
        }
    }
}

impl Drop for Refcache {
    fn drop(&mut self) {
        #[cfg(not(scalemem_loom))]
        if let Some(ticker) = self.ticker.take() {
            // Release: the ticker's Acquire load sees it and exits.
            self.domain.stop.store(true, Ordering::Release);
            ticker.thread().unpark();
            // A panicking ticker has already reported; the domain is still consistent.
            let _ = ticker.join();
        }
        // `domain` drops next: it applies the cached deltas and frees what is unreferenced.
    }
}

impl fmt::Debug for Refcache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refcache").field("stats", &self.stats()).field("sections", &self.domain.sections).finish()
    }
}

/// Starts the ticker thread of `domain`.
#[cfg(not(scalemem_loom))]
fn spawn_ticker(domain: &Domain, epoch: Duration) -> Result<std::thread::JoinHandle<()>, AllocError> {
    /// The domain's address, sent to the ticker.
    struct DomainPtr(*const Domain);
    // SAFETY: Domain is Sync, and the Refcache joins the ticker before the boxed domain
    // is dropped, so the pointer stays valid for the thread's whole life.
    unsafe impl Send for DomainPtr {}
    impl DomainPtr {
        fn get(&self) -> *const Domain {
            self.0
        }
    }

    let ptr = DomainPtr(domain);
    crate::os::spawn_signal_free(std::thread::Builder::new().name("scalemem-refcache".into()), move || {
        // SAFETY: see DomainPtr.
        let domain = unsafe { &*ptr.get() };
        // Acquire: pairs with the Release store in Refcache::drop.
        while !domain.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(epoch);
            if !domain.stop.load(Ordering::Acquire) {
                let _ = domain.tick_if_busy();
            }
        }
    })
    .map_err(|_| AllocError)
}

#[allow(dead_code)]
const _: () = assert!(WAYS.is_power_of_two() && WAYS >= 2 && COUNT_SHIFT == 8);
