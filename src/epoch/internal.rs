//! The collector's shared state ([`Global`]) and the per-thread records ([`Local`]).
//!
//! See the module doc of [`crate::epoch`] for the algorithm and the correctness argument;
//! this file implements it. The orderings named there appear here as:
//! - pin: `epoch.load(Acquire)`, `record.store(Release)`, `fence::light()`;
//! - seal: `fence(SeqCst)` (the retirer's full fence, once per bag), `epoch.load`;
//! - advance: `epoch.load(Acquire)`, `fence::heavy()`, `record.load(Acquire)` for every
//!   record, `epoch.store(Release)`;
//! - collect: `epoch.load(Acquire)`, free the bags whose epoch is at least two behind.

use core::cell::Cell;
use core::ptr::{self, NonNull};

use super::bag::{Bag, BagChunk};
use super::deferred::Deferred;
use super::queue::{GarbageQueue, reclaim_list};
use super::retired::{ReclaimFn, Retired};
use crate::cpu::fence;
use crate::os;
use crate::push_list::push_list;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, fence as atomic_fence};
use crate::util::{AllocError, CachePadded};

/// Every tunable of the collector, sized down under loom so that the full-bag,
/// new-chunk and budget-exhausted paths run in small models.
pub(crate) mod cfg {
    /// Deferred functions per bag.
    pub(crate) const BAG_CAP: usize = if cfg!(scalemem_loom) { 2 } else { 64 };
    /// Intrusively retired objects per batch.
    pub(crate) const BATCH_CAP: usize = if cfg!(scalemem_loom) { 2 } else { 64 };
    /// Bags per mmap'd chunk.
    pub(crate) const BAGS_PER_CHUNK: usize = if cfg!(scalemem_loom) { 2 } else { 16 };
    /// Records per mmap'd chunk (one 4 KiB page: a 128-byte header and 31 records).
    pub(crate) const RECORDS_PER_CHUNK: usize = if cfg!(scalemem_loom) { 2 } else { 31 };
    /// Sealed bags or batches since the last advance that trigger an advance attempt.
    pub(crate) const ADVANCE_AFTER_SEALS: usize = if cfg!(scalemem_loom) { 1 } else { 8 };
    /// Bags or batches one collect call may run: the bound on the work a retiring
    /// thread does per call (64 * 8 = 512 objects). Each seal triggers a collect, so
    /// collection outpaces production as long as one call in eight gets the lock.
    pub(crate) const COLLECT_BUDGET: usize = if cfg!(scalemem_loom) { 1 } else { 8 };
    /// A thread looks after the collector (time-based advance, collect, sealing an old
    /// partial bag) once per this many outermost pins. Off under loom, where models
    /// drive the same code through `flush` and every extra atomic multiplies the states.
    pub(crate) const PINS_BETWEEN_CHECKS: usize = if cfg!(scalemem_loom) { usize::MAX } else { 128 };
    /// The pin count a newly claimed record starts from: one short of a check, so that
    /// the first pin of every thread runs the upkeep (advance, bounded collect). Every
    /// exiting thread hands over up to two sealed units (its bag and its batch), and a
    /// collect reclaims up to `COLLECT_BUDGET`: so short-lived threads that pin only a
    /// few times each still collect at least as fast as they leave garbage behind.
    /// Under loom: 0 (the models drive collection explicitly).
    pub(crate) const FIRST_PIN_COUNT: usize = if cfg!(scalemem_loom) { 0 } else { PINS_BETWEEN_CHECKS - 1 };
    /// With garbage waiting, an advance is attempted at least this often (nanoseconds)
    /// by pinning threads, even when few bags are sealed.
    pub(crate) const ADVANCE_INTERVAL_NS: u64 = 1_000_000;
    /// A partial bag that has waited through this many checks is sealed.
    pub(crate) const PARTIAL_BAG_CHECKS: usize = 2;
}

/// Low bit of a record's epoch word: the thread is pinned.
const PINNED: usize = 1;

/// A record's epoch word for "pinned in global epoch `e`".
#[inline]
fn pinned(e: usize) -> usize {
    (e << 1) | PINNED
}

/// Whether a record word pinned in some epoch names the global epoch `e`.
#[inline]
fn is_pinned_in(word: usize, e: usize) -> bool {
    (word >> 1) == (e & (usize::MAX >> 1))
}

/// Whether a bag sealed in epoch `sealed` may be freed once the global epoch is `now`.
#[inline]
pub(crate) fn expired(sealed: usize, now: usize) -> bool {
    (now.wrapping_sub(sealed) as isize) >= 2
}

/// Coarse monotonic time in nanoseconds (the vDSO, no syscall); 0 under loom, where
/// time-based advances are off and models drive the collector explicitly.
fn now_ns() -> u64 {
    #[cfg(scalemem_loom)]
    {
        0
    }
    #[cfg(not(scalemem_loom))]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
        (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
    }
}

/// The state one collector shares between all its threads.
pub(crate) struct Global {
    /// The global epoch. Read by every outermost pin, written by advances only.
    epoch: CachePadded<AtomicUsize>,
    /// Sealed bags and sealed intrusive batches, waiting for their epochs to expire.
    bags: CachePadded<GarbageQueue<Bag>>,
    batches: GarbageQueue<Retired>,
    /// Bags and batches sealed but not yet reclaimed.
    pending: AtomicUsize,
    /// Bags and batches sealed since the last advance attempt.
    sealed_since_advance: AtomicUsize,
    /// Registered records (push-only list; records are never unlinked before teardown).
    registry: CachePadded<AtomicPtr<Local>>,
    /// Mappings holding records, and mappings holding bags (for teardown).
    record_chunks: AtomicPtr<RecordChunk>,
    bag_chunks: AtomicPtr<BagChunk>,
    /// Try-lock making one thread at a time the owner of the queues' FIFOs.
    collecting: AtomicBool,
    /// `now_ns()` at the last advance attempt.
    last_advance: AtomicUsize,
    /// Try-lock serialising advances (one heavy fence at a time is plenty).
    advancing: AtomicBool,
    /// Number of successful advances (statistics).
    advances: AtomicUsize,
    /// `Collector` handles plus claimed records; the collector is torn down at zero.
    refs: AtomicUsize,
    /// Whether this is the process-wide default collector (a static, never torn down).
    is_static: bool,
}

macro_rules! global_init {
    ($is_static:expr) => {
        Global {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            bags: CachePadded::new(GarbageQueue::new()),
            batches: GarbageQueue::new(),
            pending: AtomicUsize::new(0),
            sealed_since_advance: AtomicUsize::new(0),
            registry: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
            record_chunks: AtomicPtr::new(ptr::null_mut()),
            bag_chunks: AtomicPtr::new(ptr::null_mut()),
            collecting: AtomicBool::new(false),
            last_advance: AtomicUsize::new(0),
            advancing: AtomicBool::new(false),
            advances: AtomicUsize::new(0),
            refs: AtomicUsize::new(1),
            is_static: $is_static,
        }
    };
}

impl Global {
    /// The process-wide default collector (a `static`).
    #[cfg(not(scalemem_loom))]
    pub(crate) const fn new_static() -> Self {
        global_init!(true)
    }

    /// A collector in memory of its own, with one reference (the caller's `Collector`).
    pub(crate) fn new_mapped() -> Result<NonNull<Global>, AllocError> {
        let mem = os::map(core::mem::size_of::<Global>())?.cast::<Global>();
        // SAFETY: a fresh page-aligned mapping at least size_of::<Global>() long.
        unsafe { mem.as_ptr().write(global_init!(false)) };
        Ok(mem)
    }

    /// The current global epoch.
    pub(crate) fn epoch(&self) -> usize {
        // Relaxed: a statistic for callers; the protocol's loads are below.
        self.epoch.load(Ordering::Relaxed)
    }

    /// Number of successful advances so far.
    pub(crate) fn advances(&self) -> usize {
        // Relaxed: a statistic.
        self.advances.load(Ordering::Relaxed)
    }

    /// (records mapped, records claimed) — a walk of the registry, for monitoring.
    pub(crate) fn record_counts(&self) -> (usize, usize) {
        let (mut total, mut claimed) = (0, 0);
        // Acquire: see register().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(record) = NonNull::new(cursor) {
            // SAFETY: records stay mapped while the collector lives.
            let local = unsafe { record.as_ref() };
            total += 1;
            // Relaxed: a statistic.
            claimed += usize::from(local.in_use.load(Ordering::Relaxed));
            cursor = local.next;
        }
        (total, claimed)
    }

    /// Adds a reference (a `Collector` clone or a claimed record).
    pub(crate) fn acquire_ref(&self) {
        // Relaxed: the caller already holds a reference, as in Arc::clone.
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a reference; the last one tears the collector down.
    ///
    /// # Safety
    /// The caller held a reference and does not use `this` afterwards.
    pub(crate) unsafe fn release_ref(this: NonNull<Global>) {
        // SAFETY: the caller's reference keeps the Global alive until this RMW.
        let global = unsafe { this.as_ref() };
        // Release: orders this holder's uses before the teardown; the Acquire fence on
        // the last holder's side pairs with every earlier Release, as in Arc::drop.
        if global.refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        atomic_fence(Ordering::Acquire);
        if !global.is_static {
            // SAFETY: the last reference is gone: no handle, record or guard remains.
            unsafe { Global::destroy(this) };
        }
    }

    /// Runs all remaining garbage and unmaps everything.
    ///
    /// # Safety
    /// No reference to the collector remains, so no thread is pinned in it.
    unsafe fn destroy(this: NonNull<Global>) {
        // SAFETY: per the contract we are the only user of the Global and its memory.
        unsafe {
            let global = this.as_ref();
            // Teardown: every remaining bag and batch runs now, whatever its epoch.
            reclaim_list(global.bags.take_all());
            reclaim_list(global.batches.take_all());
            // Acquire (both chunk lists): pairs with the Release CASes in push_list (the
            // Acquire fence in release_ref has ordered them before us already).
            let mut chunk = global.bag_chunks.swap(ptr::null_mut(), Ordering::Acquire);
            while let Some(c) = NonNull::new(chunk) {
                chunk = (*c.as_ptr()).next;
                BagChunk::unmap(c);
            }
            let mut chunk = global.record_chunks.swap(ptr::null_mut(), Ordering::Acquire);
            while let Some(c) = NonNull::new(chunk) {
                chunk = (*c.as_ptr()).next;
                RecordChunk::unmap(c);
            }
            ptr::drop_in_place(this.as_ptr());
            os::unmap(this.cast(), core::mem::size_of::<Global>());
        }
    }

    /// Claims a free record or maps new ones; the record holds a reference to `this`.
    pub(crate) fn register(this: NonNull<Global>) -> Result<NonNull<Local>, AllocError> {
        // SAFETY: the caller holds a reference (a Collector), so the Global is alive.
        let global = unsafe { this.as_ref() };
        // Acquire: pairs with the Release CAS that published each record chunk, making
        // the records' initialisation (including `next`) visible.
        let mut cursor = global.registry.load(Ordering::Acquire);
        while let Some(record) = NonNull::new(cursor) {
            // SAFETY: records stay mapped until teardown, which our reference prevents.
            let local = unsafe { record.as_ref() };
            // Relaxed pre-check to skip busy records without an RMW. Acquire on the CAS:
            // pairs with the Release store in `finalize`, so the previous owner's writes
            // to the owner-only fields happen before ours.
            if !local.in_use.load(Ordering::Relaxed)
                && local.in_use.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                local.claim();
                global.acquire_ref();
                return Ok(record);
            }
            cursor = local.next;
        }
        let record = RecordChunk::map(global, this)?;
        global.acquire_ref();
        Ok(record)
    }

    /// Queues a sealed bag.
    fn push_bag(&self, bag: NonNull<Bag>) {
        // Relaxed: a count for heuristics; the queue's own CAS publishes the bag.
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.bags.push(bag);
    }

    /// Queues a sealed intrusive batch.
    fn push_batch(&self, head: NonNull<Retired>) {
        // Relaxed: as in push_bag.
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.batches.push(head);
    }

    /// Counts a seal; returns true when enough have accumulated to try an advance.
    fn note_sealed(&self) -> bool {
        // Relaxed: a heuristic counter; no data is published through it.
        self.sealed_since_advance.fetch_add(1, Ordering::Relaxed) + 1 >= cfg::ADVANCE_AFTER_SEALS
    }

    /// Whether any sealed garbage is waiting.
    fn has_garbage(&self) -> bool {
        // Relaxed: a hint; collect synchronises through the queues.
        self.pending.load(Ordering::Relaxed) > 0
    }

    /// Bags and batches sealed but not yet reclaimed.
    pub(crate) fn pending(&self) -> usize {
        // Relaxed: a statistic.
        self.pending.load(Ordering::Relaxed)
    }

    /// Tries to advance the global epoch by one: succeeds if every pinned record is
    /// pinned in the current epoch. Issues one heavy fence. Returns whether it advanced.
    pub(crate) fn try_advance(&self) -> bool {
        // Acquire: pairs with the Release store that ends the previous advance, so
        // advances are serialised in happens-before order. (A CAS rather than a swap:
        // loom 0.7.3 reports a swap-based try-lock as stuck after both holders released
        // it, a modelling artefact; the CAS costs the same here.)
        if self.advancing.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        // Acquire: pairs with the previous advance's Release store of the epoch.
        let e = self.epoch.load(Ordering::Acquire);
        // The heavy side of the pin protocol: after it, every pin store that a thread
        // made before its own light fence is visible to the loads below, or that
        // thread's later loads see everything visible to us now (module doc, case 1).
        fence::heavy();
        let mut ok = true;
        // Acquire: see register().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(record) = NonNull::new(cursor) {
            // SAFETY: records stay mapped while the collector lives; we hold a reference.
            let local = unsafe { record.as_ref() };
            // Acquire: pairs with the Release stores of pin/unpin, so a section that
            // ended before the store we read happens before our epoch store below.
            let word = local.epoch.load(Ordering::Acquire);
            if word & PINNED != 0 && !is_pinned_in(word, e) {
                ok = false;
                break;
            }
            cursor = local.next;
        }
        if ok {
            // Release: pairs with the Acquire loads of the epoch in pin, advance and
            // collect (module doc: the chain from an unpin to the free).
            self.epoch.store(e.wrapping_add(1), Ordering::Release);
            // Relaxed: a statistic.
            self.advances.fetch_add(1, Ordering::Relaxed);
        }
        // Relaxed: heuristics. Reset after failures too, so that a thread pinned for a
        // long time costs one heavy fence per ADVANCE_AFTER_SEALS seals (or per
        // ADVANCE_INTERVAL_NS), not one per seal.
        self.sealed_since_advance.store(0, Ordering::Relaxed);
        self.last_advance.store(now_ns() as usize, Ordering::Relaxed);
        // Release: see the swap above.
        self.advancing.store(false, Ordering::Release);
        ok
    }

    /// Repairs the collector in the child of a `fork`, where only the forking thread
    /// exists. The records of the threads that did not come along would otherwise stay
    /// as they were at the fork: one pinned then would hold the epoch back forever, and
    /// nothing retired in the child would ever be freed. So every record but `me` (the
    /// forking thread's) is unpinned: its thread will never read again. A collection or
    /// advance that another thread had begun is abandoned: its try-lock is released and,
    /// for a collection, the FIFOs it was reordering are forgotten. Garbage in those
    /// FIFOs and in the gone threads' bags is leaked, never freed early; their records
    /// stay claimed. Both are bounded by what was pending at the fork.
    ///
    /// # Safety
    /// Called in the child of `fork` before it starts a thread, not from inside a
    /// collection or advance (neither runs user code, so the forking thread cannot be in
    /// one); `me` is the forking thread's registered record, or null.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn after_fork_in_child(&self, me: *const Local) {
        // Relaxed throughout: the child's only thread.
        let mut cursor = self.registry.load(Ordering::Relaxed);
        while !cursor.is_null() {
            if cursor.cast_const() != me {
                // SAFETY: registered records stay mapped for the collector's life.
                unsafe { (*cursor).epoch.store(0, Ordering::Relaxed) };
            }
            // SAFETY: as above; `next` is fixed once published.
            cursor = unsafe { (*cursor).next };
        }
        if self.collecting.load(Ordering::Relaxed) {
            // SAFETY: the only thread; the lock's holder is gone.
            unsafe {
                self.bags.abandon_fifo();
                self.batches.abandon_fifo();
            }
            self.collecting.store(false, Ordering::Relaxed);
        }
        self.advancing.store(false, Ordering::Relaxed);
    }

    /// Reclaims up to [`cfg::COLLECT_BUDGET`] expired bags or batches. Skips if no
    /// garbage waits or another thread is collecting (it frees the garbage instead).
    pub(crate) fn collect(&self) {
        if !self.has_garbage() {
            return;
        }
        // Acquire: pairs with the Release store that ends the previous collection, so
        // the FIFOs pass from holder to holder in happens-before order.
        if self.collecting.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        // Acquire: pairs with the advance's Release store (the last link of the chain
        // that orders readers' accesses before our frees; module doc).
        let now = self.epoch.load(Ordering::Acquire);
        let mut budget = cfg::COLLECT_BUDGET;
        // SAFETY: we hold the collecting lock.
        let (bags, batches) =
            unsafe { (self.bags.take_expired(now, &mut budget), self.batches.take_expired(now, &mut budget)) };
        // Release: see the CAS above. The expired nodes are already ours.
        self.collecting.store(false, Ordering::Release);
        // Run them outside the lock: deferred functions may pin, defer and collect.
        // SAFETY: we own the unlinked nodes and their epochs expired.
        let freed = unsafe { reclaim_list(bags) + reclaim_list(batches) };
        // Relaxed: a count for heuristics.
        self.pending.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Periodic upkeep from a pinning thread: a time-based advance when garbage waits,
    /// then a bounded collect.
    fn maintain(&self) {
        if !self.has_garbage() {
            return;
        }
        let now = now_ns();
        // Relaxed: a heuristic timestamp.
        let last = self.last_advance.load(Ordering::Relaxed) as u64;
        if now.wrapping_sub(last) >= cfg::ADVANCE_INTERVAL_NS || cfg!(scalemem_loom) {
            self.try_advance();
        }
        self.collect();
    }
}

/// A thread's record in a collector. The first word is the only one other threads read
/// on the fast path (advances scan it); the rest is the owner's.
#[repr(C, align(128))]
pub(crate) struct Local {
    /// `pinned(e)` while pinned in epoch `e`, 0 while not pinned.
    epoch: AtomicUsize,
    /// Whether a thread (or a leaked guard) owns this record.
    in_use: AtomicBool,
    /// Empty bags handed back by collectors (multi-producer push, owner takes all).
    free_bags: AtomicPtr<Bag>,
    /// Next record in the registry; written before the record is published, then fixed.
    next: *mut Local,
    /// The collector.
    global: NonNull<Global>,

    // Owner-only state. Accessed only by the thread that claimed `in_use`; handed to the
    // next owner through the Release store/Acquire CAS on `in_use`.
    /// Live guards.
    guard_count: Cell<usize>,
    /// Live handles (the thread-local one, `LocalHandle`s, `repin_after` windows).
    handle_count: Cell<usize>,
    /// Outermost pins, for periodic upkeep.
    pin_count: Cell<usize>,
    /// The bag being filled (null until the first defer).
    bag: Cell<*mut Bag>,
    /// Checks the current partial bag has waited through.
    bag_age: Cell<usize>,
    /// Private list of empty bags.
    spare: Cell<*mut Bag>,
    /// The intrusive batch being filled and its length.
    batch_head: Cell<*mut Retired>,
    batch_len: Cell<usize>,
}

impl Local {
    /// Resets the owner-only state for a new owner (called right after claiming).
    fn claim(&self) {
        debug_assert_eq!(self.guard_count.get(), 0);
        self.handle_count.set(1);
        self.pin_count.set(cfg::FIRST_PIN_COUNT);
        self.bag_age.set(0);
    }

    /// The collector this record belongs to.
    #[inline]
    pub(crate) fn global(&self) -> &Global {
        // SAFETY: a claimed record holds a reference to its Global (register()).
        unsafe { self.global.as_ref() }
    }

    /// The collector pointer (for handing out `Collector` references).
    #[inline]
    pub(crate) fn global_ptr(&self) -> &NonNull<Global> {
        &self.global
    }

    /// Whether this thread is pinned.
    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        self.guard_count.get() > 0
    }

    /// Enters a pinned section (nested pins only count).
    #[inline]
    pub(crate) fn pin(&self) {
        let count = self.guard_count.get();
        self.guard_count.set(count.checked_add(1).expect("guard count overflow"));
        if count == 0 {
            // Acquire: pairs with the advance's Release store (module doc, case 1b).
            let e = self.global().epoch.load(Ordering::Acquire);
            // Release: a section that ended before this store happens before any
            // advance that reads it (module doc, case 1a).
            self.epoch.store(pinned(e), Ordering::Release);
            // The light side of the pin protocol: the store above is ordered before the
            // section's loads against any advance's heavy fence.
            fence::light();
            let pins = self.pin_count.get().wrapping_add(1);
            self.pin_count.set(pins);
            if pins.is_multiple_of(cfg::PINS_BETWEEN_CHECKS) {
                self.maintain_slow();
            }
        }
    }

    /// Leaves a pinned section; the outermost unpin clears the record.
    #[inline]
    pub(crate) fn unpin(&self) {
        let count = self.guard_count.get();
        debug_assert!(count > 0);
        self.guard_count.set(count - 1);
        if count == 1 {
            // Release: the section's accesses happen before an advance that reads this.
            self.epoch.store(0, Ordering::Release);
            if self.handle_count.get() == 0 {
                // SAFETY: neither a guard nor a handle remains: the record is ours to free.
                unsafe { self.finalize() };
            }
        }
    }

    /// Re-pins in the current epoch if it moved (a no-op while nested).
    pub(crate) fn repin(&self) {
        if self.guard_count.get() != 1 {
            return;
        }
        // Acquire and Release: as in pin().
        let e = self.global().epoch.load(Ordering::Acquire);
        // Relaxed: our own last store.
        if self.epoch.load(Ordering::Relaxed) != pinned(e) {
            self.epoch.store(pinned(e), Ordering::Release);
            fence::light();
        }
    }

    /// Adds a handle (a temporary one in `repin_after`).
    pub(crate) fn acquire_handle(&self) {
        self.handle_count.set(self.handle_count.get() + 1);
    }

    /// Drops a handle. When the last handle goes the record's garbage is handed to the
    /// collector; the record itself is freed once no guard remains either (a leaked
    /// guard keeps it pinned forever, which stalls reclamation but frees nothing early).
    ///
    /// # Safety
    /// `this` is a claimed record on which the caller holds a handle, used by the
    /// owning thread only; the caller does not use the record after this call unless it
    /// holds a guard or another handle.
    pub(crate) unsafe fn release_handle(this: NonNull<Local>) {
        // SAFETY: the caller holds a handle, so the record is claimed and alive.
        let local = unsafe { this.as_ref() };
        let handles = local.handle_count.get() - 1;
        local.handle_count.set(handles);
        if handles == 0 {
            if local.guard_count.get() == 0 {
                // SAFETY: no guard and no handle remains.
                unsafe { local.finalize() };
            } else {
                // Exiting while pinned: adopt the garbage now, keep the record pinned.
                local.seal_bag();
                local.seal_batch();
            }
        }
    }

    /// Hands the record's garbage to the collector and frees the record for reuse.
    ///
    /// # Safety
    /// No guard and no handle refers to the record; it is not used after this call.
    unsafe fn finalize(&self) {
        self.seal_bag();
        self.seal_batch();
        let global = self.global;
        // Release: pairs with the Acquire CAS in register(): our owner-only writes happen
        // before the next owner's.
        self.in_use.store(false, Ordering::Release);
        // SAFETY: the record held one reference, given up here; `self` is not touched.
        unsafe { Global::release_ref(global) };
    }

    /// Defers `deferred` until no pinned thread can hold what it frees.
    pub(crate) fn defer(&self, deferred: Deferred) {
        let bag = match NonNull::new(self.bag.get()) {
            Some(bag) => bag,
            None => {
                let bag = self.take_bag();
                self.bag.set(bag.as_ptr());
                bag
            }
        };
        // SAFETY: the current bag is owned by this record and never left full.
        if unsafe { Bag::push(bag, deferred) } {
            self.seal_bag();
        }
    }

    /// Retires an intrusively linked object.
    ///
    /// # Safety
    /// As for `Guard::retire`.
    pub(crate) unsafe fn retire(&self, object: NonNull<Retired>, reclaim: ReclaimFn) {
        // SAFETY: the caller hands the object (and its link) over to us.
        unsafe {
            let link = object.as_ptr();
            *(*link).reclaim.get() = Some(reclaim);
            *(*link).next.get() = self.batch_head.get();
            *(*link).batch_next.get() = ptr::null_mut();
        }
        self.batch_head.set(object.as_ptr());
        let len = self.batch_len.get() + 1;
        self.batch_len.set(len);
        if len == cfg::BATCH_CAP {
            self.seal_batch();
        }
    }

    /// Seals the current bag with the global epoch and pushes it to the collector.
    fn seal_bag(&self) {
        let Some(bag) = NonNull::new(self.bag.get()) else { return };
        // SAFETY: the current bag is owned by this record.
        if unsafe { Bag::len(bag) } == 0 {
            return;
        }
        self.bag.set(ptr::null_mut());
        self.bag_age.set(0);
        let e = Self::seal_epoch(self.global());
        // SAFETY: we still own the bag; the push below publishes it.
        unsafe { (*bag.as_ptr()).epoch.with_mut(|slot| *slot = e) };
        self.global().push_bag(bag);
        self.after_seal();
    }

    /// Seals the current intrusive batch and pushes it to the collector.
    fn seal_batch(&self) {
        let Some(head) = NonNull::new(self.batch_head.get()) else { return };
        self.batch_head.set(ptr::null_mut());
        self.batch_len.set(0);
        let e = Self::seal_epoch(self.global());
        // SAFETY: we own the batch until the push below publishes it.
        unsafe { *(*head.as_ptr()).epoch.get() = e };
        self.global().push_batch(head);
        self.after_seal();
    }

    /// The epoch a batch is sealed with: the global epoch read after a full fence, so
    /// that every unlink of the batch's objects is visible to any thread that reads a
    /// later epoch (module doc, case 1b, second half).
    fn seal_epoch(global: &Global) -> usize {
        atomic_fence(Ordering::SeqCst);
        // Relaxed: ordered by the SeqCst fence above.
        global.epoch.load(Ordering::Relaxed)
    }

    /// After a seal: advance if enough garbage has accumulated, then collect a bounded
    /// amount. Skipped while unpinned (a thread finalising its record), where the
    /// deferred functions would run outside any pinned section.
    fn after_seal(&self) {
        let global = self.global();
        if global.note_sealed() {
            global.try_advance();
        }
        if self.is_pinned() {
            global.collect();
        }
    }

    /// Flushes this thread's garbage and drives the collector: seal, advance, collect.
    pub(crate) fn flush(&self) {
        self.seal_bag();
        self.seal_batch();
        self.global().try_advance();
        self.global().collect();
    }

    #[cold]
    #[inline(never)]
    fn maintain_slow(&self) {
        if !self.bag.get().is_null() {
            let age = self.bag_age.get() + 1;
            self.bag_age.set(age);
            if age >= cfg::PARTIAL_BAG_CHECKS {
                self.seal_bag();
            }
        }
        if self.batch_len.get() > 0 {
            self.seal_batch();
        }
        self.global().maintain();
    }

    /// An empty bag: from the private spares, else those collectors gave back, else a
    /// new chunk. Out of memory here is fatal, like `Box::new`.
    fn take_bag(&self) -> NonNull<Bag> {
        let take_spare = |local: &Local| {
            let bag = NonNull::new(local.spare.get())?;
            // SAFETY: spare bags are owned by this record.
            local.spare.set(unsafe { (*bag.as_ptr()).next.with(|n| *n) });
            Some(bag)
        };
        if let Some(bag) = take_spare(self) {
            return bag;
        }
        // Acquire: take ownership of the given-back bags (pairs with give_back_bag).
        let returned = self.free_bags.swap(ptr::null_mut(), Ordering::Acquire);
        if !returned.is_null() {
            self.spare.set(returned);
            if let Some(bag) = take_spare(self) {
                return bag;
            }
        }
        match BagChunk::map(self) {
            Ok((chunk, first)) => {
                push_list(&self.global().bag_chunks, chunk, chunk, |c, next| {
                    // SAFETY: we own the new chunk until the CAS publishes it.
                    unsafe { (*c.as_ptr()).next = next }
                });
                // SAFETY: the chunk's bags are ours; keep the rest as spares.
                self.spare.set(unsafe { (*first.as_ptr()).next.with(|n| *n) });
                first
            }
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<Bag>()),
        }
    }

    /// Returns an empty bag to the record that mapped it.
    ///
    /// # Safety
    /// The caller owns the bag and it is empty.
    pub(crate) unsafe fn give_back_bag(bag: NonNull<Bag>) {
        // SAFETY: bags record their owner at mapping time; records outlive their bags'
        // use (both are freed only at collector teardown).
        let owner = unsafe { &*(*bag.as_ptr()).owner };
        push_list(&owner.free_bags, bag, bag, |b, next| {
            // SAFETY: we own the bag until the CAS publishes it.
            unsafe { (*b.as_ptr()).next.with_mut(|n| *n = next) }
        });
    }
}

/// The header of a mapping of records (one page).
#[repr(C, align(128))]
struct RecordChunk {
    next: *mut RecordChunk,
}

impl RecordChunk {
    fn bytes() -> usize {
        core::mem::size_of::<RecordChunk>() + cfg::RECORDS_PER_CHUNK * core::mem::size_of::<Local>()
    }

    /// Maps a chunk of records, claims the first one for the caller and publishes all of
    /// them on the registry.
    fn map(global: &Global, this: NonNull<Global>) -> Result<NonNull<Local>, AllocError> {
        let base = os::map(Self::bytes())?;
        let chunk = base.cast::<RecordChunk>();
        // SAFETY: the fresh mapping holds the header and RECORDS_PER_CHUNK records, each
        // 128-aligned (page-aligned base, 128-byte header and record size); it is ours
        // until the CAS below publishes the records.
        let first = unsafe {
            chunk.as_ptr().write(RecordChunk { next: ptr::null_mut() });
            let first = chunk.as_ptr().add(1).cast::<Local>();
            for i in 0..cfg::RECORDS_PER_CHUNK {
                let next = if i + 1 < cfg::RECORDS_PER_CHUNK { first.add(i + 1) } else { ptr::null_mut() };
                first.add(i).write(Local {
                    epoch: AtomicUsize::new(0),
                    in_use: AtomicBool::new(i == 0),
                    free_bags: AtomicPtr::new(ptr::null_mut()),
                    next,
                    global: this,
                    guard_count: Cell::new(0),
                    handle_count: Cell::new(0),
                    pin_count: Cell::new(0),
                    bag: Cell::new(ptr::null_mut()),
                    bag_age: Cell::new(0),
                    spare: Cell::new(ptr::null_mut()),
                    batch_head: Cell::new(ptr::null_mut()),
                    batch_len: Cell::new(0),
                });
            }
            (*first).claim();
            NonNull::new_unchecked(first)
        };
        // SAFETY: the last record of the chunk is ours until published.
        let last = unsafe { NonNull::new_unchecked(first.as_ptr().add(cfg::RECORDS_PER_CHUNK - 1)) };
        push_list(&global.record_chunks, chunk, chunk, |c, next| {
            // SAFETY: we own the chunk header until the CAS publishes it.
            unsafe { (*c.as_ptr()).next = next }
        });
        push_list(&global.registry, first, last, |r, next| {
            // SAFETY: `next` is written before the Release CAS publishes the records and
            // never again, so readers that Acquire the registry see it.
            unsafe { (*r.as_ptr()).next = next }
        });
        Ok(first)
    }

    /// # Safety
    /// No record of the chunk is used any more.
    unsafe fn unmap(chunk: NonNull<RecordChunk>) {
        // SAFETY: per the contract; the records were initialised by map().
        unsafe {
            let first = chunk.as_ptr().add(1).cast::<Local>();
            for i in 0..cfg::RECORDS_PER_CHUNK {
                ptr::drop_in_place(first.add(i));
            }
            os::unmap(chunk.cast(), Self::bytes());
        }
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_two_epochs_and_wraps() {
        assert!(!expired(5, 5));
        assert!(!expired(5, 6));
        assert!(expired(5, 7));
        assert!(expired(usize::MAX, 1));
        assert!(!expired(usize::MAX, 0));
        // A bag sealed "in the future" (stale reader of `now`) is never expired.
        assert!(!expired(9, 7));
    }

    #[test]
    fn pinned_words_compare_modulo_the_lost_top_bit() {
        assert!(is_pinned_in(pinned(3), 3));
        assert!(!is_pinned_in(pinned(3), 4));
        let big = usize::MAX - 1;
        assert!(is_pinned_in(pinned(big), big));
        assert_eq!(pinned(0) & PINNED, PINNED);
    }

    #[test]
    fn sizes_fit_their_mappings() {
        assert_eq!(core::mem::size_of::<Local>(), 128);
        assert!(RecordChunk::bytes() <= 4096);
    }
}
