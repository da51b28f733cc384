//! Hazard records ([`Block`]: a thread's slots and retired list in one domain) and the
//! domain's shared state ([`DomainInner`]: the registry of blocks, counters, teardown).
//!
//! See the module doc of [`crate::hazard`] for the protocol and the proof; this file
//! implements it. The orderings named there appear here as:
//! - publish (in `pointer.rs`): `slot.store(Release)`, `fence::light()`, `src.load(Acquire)`;
//! - scan: `fence::heavy()`, then `slot.load(Acquire)` for every slot of the domain;
//! - claim and release of a block: Acquire CAS / Release store of `state`, which hands the
//!   owner-only fields (and the retired list) from one owner to the next.
//!
//! # Ownership protocol
//! A block is either FREE or CLAIMED. Only its claimer touches its owner-only fields
//! (`Cell`s) and writes its slots; ownership moves through the Release store of FREE and
//! the Acquire CAS of the next claim. Two parties may take a block's *retired list*
//! without claiming it: a scanning thread adopting an exited thread's garbage (it claims
//! the FREE block for the duration), and the sweep that runs when a user domain's last
//! handle is dropped (no hazard pointer or retire of the domain can run any more).

use core::cell::Cell;
use core::ptr::{self, NonNull};

use crate::cpu::fence;
use crate::epoch::{ReclaimFn, Retired};
use crate::os;
use crate::push_list::push_list;
use crate::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use crate::util::{AllocError, CachePadded};

/// Every tunable of the hazard domain, sized down under loom so that overflow blocks,
/// new chunks and threshold scans run in small models.
pub(crate) mod cfg {
    /// Hazard slots per block (one block per thread and domain; more are chained).
    pub(crate) const SLOTS: usize = if cfg!(scalemem_loom) { 2 } else { 8 };
    /// Blocks per mmap'd chunk (a 4 KiB page: a 128-byte header and 15 blocks).
    pub(crate) const BLOCKS_PER_CHUNK: usize = if cfg!(scalemem_loom) { 2 } else { 15 };
    /// `C` of the scan threshold `R = max(C, K * H)`.
    pub(crate) const THRESHOLD_MIN: usize = if cfg!(scalemem_loom) { 2 } else { 1024 };
    /// `K` of the scan threshold `R = max(C, K * H)`.
    pub(crate) const THRESHOLD_FACTOR: usize = 2;
    /// A thread whose list is non-empty scans at least this often (nanoseconds), checked
    /// every [`TIME_CHECK_EVERY`] retires.
    pub(crate) const SCAN_INTERVAL_NS: u64 = 10_000_000;
    /// Retires between two looks at the clock. Off under loom (no time there).
    pub(crate) const TIME_CHECK_EVERY: usize = if cfg!(scalemem_loom) { usize::MAX } else { 8 };
    /// Hazards the first scan buffer holds (it doubles when a scan finds more).
    pub(crate) const SCAN_BUFFER_MIN: usize = if cfg!(scalemem_loom) { 2 } else { 512 };
}

/// Coarse monotonic time in nanoseconds (the vDSO, no syscall); 0 under loom.
pub(crate) fn now_ns() -> u64 {
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

const FREE: usize = 0;
const CLAIMED: usize = 1;

/// The scan threshold for a domain with `hazards` slots: `max(C, K * H)`.
#[inline]
pub(crate) fn threshold_for(hazards: usize) -> usize {
    cfg::THRESHOLD_MIN.max(cfg::THRESHOLD_FACTOR.saturating_mul(hazards))
}

/// One thread's record in one domain: `SLOTS` hazard slots (the only words other threads
/// read on the fast path), and the owner's retired list and scan buffer.
#[repr(C, align(128))]
pub(crate) struct Block {
    /// The hazard slots: null, or the address a hazard pointer protects.
    pub(crate) slots: [AtomicPtr<u8>; cfg::SLOTS],
    /// FREE or CLAIMED.
    state: AtomicUsize,
    /// Retired objects on this block's list. Written by the owner (or an adopter or the
    /// sweep, who own the list at that moment); read by `stats` and adopters.
    retired: AtomicUsize,
    /// Next block in the registry; written before the block is published, then fixed.
    next: *mut Block,
    /// The domain.
    domain: NonNull<DomainInner>,

    // Owner-only state, handed over by the Release store of FREE / Acquire CAS of CLAIMED.
    /// Bit `i` set: slot `i` is free.
    free: Cell<u32>,
    /// The block whose retired list and chain this block belongs to (itself if primary).
    primary: Cell<*mut Block>,
    /// Further blocks of the same owner in the same domain (when more than SLOTS hazard
    /// pointers are held at once). Only the primary's is used.
    overflow: Cell<*mut Block>,
    /// Release the chain once its last hazard pointer is dropped (the thread exited, or the
    /// block was claimed for one call only).
    release_when_idle: Cell<bool>,
    /// The retired list (linked through `Retired::next`; `Retired::epoch` holds the
    /// protected address) and its last link.
    head: Cell<*mut Retired>,
    tail: Cell<*mut Retired>,
    /// Scan when `retired` reaches this: `threshold_for(H)` as of the last scan.
    threshold: Cell<usize>,
    /// `now_ns()` at the last scan.
    last_scan: Cell<u64>,
    /// The scan buffer (mmap'd; doubled when a scan finds more hazards) and its capacity.
    buffer: Cell<*mut usize>,
    buffer_cap: Cell<usize>,
}

impl Block {
    /// The domain this block belongs to.
    #[inline]
    pub(crate) fn domain(&self) -> &DomainInner {
        // SAFETY: a claimed block holds a reference to its domain (claim()); callers
        // reach blocks through a claim, a hazard pointer of the claim, or the domain.
        unsafe { self.domain.as_ref() }
    }

    /// Takes a free slot of this block or its chain, claiming an overflow block if every
    /// slot is taken. Owner only. Returns the block and slot index.
    #[inline]
    pub(crate) fn take_slot(this: NonNull<Block>) -> Result<(NonNull<Block>, usize), AllocError> {
        // SAFETY: the caller owns the chain; blocks stay mapped while the domain lives.
        let block = unsafe { this.as_ref() };
        let free = block.free.get();
        if free != 0 {
            let index = free.trailing_zeros() as usize;
            block.free.set(free & !(1 << index));
            return Ok((this, index));
        }
        Self::take_slot_slow(this)
    }

    #[cold]
    #[inline(never)]
    fn take_slot_slow(this: NonNull<Block>) -> Result<(NonNull<Block>, usize), AllocError> {
        // SAFETY: as in take_slot.
        let block = unsafe { this.as_ref() };
        match NonNull::new(block.overflow.get()) {
            Some(next) => Self::take_slot(next),
            None => {
                let next = DomainInner::claim(block.domain)?;
                // SAFETY: just claimed by this thread; the primary is ours too.
                let (extra, primary) = unsafe { (next.as_ref(), &*block.primary.get()) };
                extra.primary.set(block.primary.get());
                // Only the primary's list is scanned: move any inherited garbage there.
                let (head, tail, len) = extra.take_list();
                if len > 0 {
                    primary.push_list(head, tail, len);
                }
                block.overflow.set(next.as_ptr());
                Self::take_slot(next)
            }
        }
    }

    /// Returns slot `index` (clearing it) and releases the chain if it was waiting for its
    /// last hazard pointer. Owner only.
    #[inline]
    pub(crate) fn put_slot(this: NonNull<Block>, index: usize) {
        // SAFETY: the caller owns the chain (a hazard pointer of it).
        let block = unsafe { this.as_ref() };
        // Release: the reader's accesses to the object happen before any scan that reads
        // this null (module doc: the scan reads a later value than the publish).
        block.slots[index].store(ptr::null_mut(), Ordering::Release);
        block.free.set(block.free.get() | (1 << index));
        // SAFETY: the primary of a claimed chain is claimed by the same owner.
        let primary = unsafe { &*block.primary.get() };
        if primary.release_when_idle.get() {
            // SAFETY: we own the chain; release_chain checks it is idle.
            unsafe { Self::release_chain(NonNull::from(primary)) };
        }
    }

    /// Whether no slot of the chain is taken.
    fn chain_idle(&self) -> bool {
        let mut cursor: *const Block = self;
        while let Some(block) = NonNull::new(cursor as *mut Block) {
            // SAFETY: chain blocks are claimed by the caller's thread.
            let block = unsafe { block.as_ref() };
            if block.free.get() != all_free() {
                return false;
            }
            cursor = block.overflow.get();
        }
        true
    }

    /// Releases the chain of `primary` if it is idle (else marks it to be released when
    /// its last hazard pointer goes). In the global domain, scans first so that at most
    /// the protected objects are handed over.
    ///
    /// # Safety
    /// The caller owns the chain and drops its own reference to it (its cache entry, or
    /// its one-call claim); it does not use the chain afterwards.
    pub(crate) unsafe fn release_chain(primary: NonNull<Block>) {
        // SAFETY: per the contract.
        let block = unsafe { primary.as_ref() };
        if !block.chain_idle() {
            block.release_when_idle.set(true);
            return;
        }
        block.release_when_idle.set(false);
        if block.domain().is_static && !block.head.get().is_null() {
            // SAFETY: we own the block; the global domain is never torn down.
            let _ = unsafe { block.domain().scan(primary) };
        }
        let mut cursor = primary.as_ptr();
        while let Some(b) = NonNull::new(cursor) {
            // SAFETY: we own the chain; read the link before giving the block up.
            let b_ref = unsafe { b.as_ref() };
            cursor = b_ref.overflow.get();
            b_ref.overflow.set(ptr::null_mut());
            let domain = b_ref.domain;
            // SAFETY: `domain` is alive: the block holds a reference, released below.
            let inner = unsafe { domain.as_ref() };
            // Relaxed: a hint for scanners (counted before the block becomes FREE, so the
            // adopter's decrement never comes first).
            if b_ref.retired.load(Ordering::Relaxed) > 0 {
                inner.orphans.fetch_add(1, Ordering::Relaxed);
            }
            // Release: hands the owner-only state (and the retired list: every unlink of
            // its objects) to the next claimer or adopter, whose CAS is Acquire.
            b_ref.state.store(FREE, Ordering::Release);
            // SAFETY: the block's reference is given up; we do not touch it again.
            unsafe { DomainInner::release_ref(domain) };
        }
    }

    /// Appends an object to the retired list and scans if the threshold or the time bound
    /// says so. Returns the number of objects freed by a scan (0 if none ran).
    ///
    /// # Safety
    /// The caller owns the chain of `this` (a primary block). For the object: as for
    /// `Domain::retire`.
    pub(crate) unsafe fn retire(
        this: NonNull<Block>,
        object: usize,
        link: NonNull<Retired>,
        reclaim: ReclaimFn,
    ) -> usize {
        // SAFETY: the caller owns the block and hands the link over.
        let block = unsafe { this.as_ref() };
        // SAFETY: the link is ours until reclaim runs (the caller's contract).
        unsafe {
            let l = link.as_ptr();
            *(*l).next.get() = ptr::null_mut();
            *(*l).epoch.get() = object;
            *(*l).reclaim.get() = Some(reclaim);
        }
        block.push_list(link.as_ptr(), link.as_ptr(), 1);
        // Relaxed: the owner's own counter.
        let count = block.retired.load(Ordering::Relaxed);
        if count >= block.threshold.get()
            || (count % cfg::TIME_CHECK_EVERY == 0
                && now_ns().wrapping_sub(block.last_scan.get()) >= cfg::SCAN_INTERVAL_NS)
        {
            // SAFETY: we own the block.
            return unsafe { block.domain().scan(this) };
        }
        0
    }

    /// Appends the list `head..=tail` of `len` objects. Owner (or list owner) only.
    fn push_list(&self, head: *mut Retired, tail: *mut Retired, len: usize) {
        let old_tail = self.tail.get();
        if old_tail.is_null() {
            self.head.set(head);
        } else {
            // SAFETY: links on our list are ours.
            unsafe { *(*old_tail).next.get() = head };
        }
        self.tail.set(tail);
        // Relaxed: the counter is read by the owner and, as a statistic, by `stats`.
        self.retired.store(self.retired.load(Ordering::Relaxed) + len, Ordering::Relaxed);
    }

    /// Takes the whole retired list: (head, tail, len).
    fn take_list(&self) -> (*mut Retired, *mut Retired, usize) {
        let head = self.head.replace(ptr::null_mut());
        let tail = self.tail.replace(ptr::null_mut());
        // Relaxed: as in push_list.
        let len = self.retired.swap(0, Ordering::Relaxed);
        (head, tail, len)
    }

    /// The scan buffer with room for at least `cap` entries, keeping its first `keep`
    /// entries (grown by doubling; mmap'd, never on the protect path).
    fn buffer_with(&self, keep: usize, cap: usize) -> Result<*mut usize, AllocError> {
        let old = self.buffer.get();
        if self.buffer_cap.get() >= cap && !old.is_null() {
            return Ok(old);
        }
        let mut new_cap = self.buffer_cap.get().max(cfg::SCAN_BUFFER_MIN);
        while new_cap < cap {
            new_cap *= 2;
        }
        let new = os::map(new_cap * core::mem::size_of::<usize>())?.cast::<usize>();
        if keep > 0 {
            // SAFETY: the old buffer holds `keep <= old capacity` initialised entries and
            // the new one has room for more; the mappings are distinct.
            unsafe { ptr::copy_nonoverlapping(old, new.as_ptr(), keep) };
        }
        self.drop_buffer();
        self.buffer.set(new.as_ptr());
        self.buffer_cap.set(new_cap);
        Ok(new.as_ptr())
    }

    fn drop_buffer(&self) {
        if let Some(old) = NonNull::new(self.buffer.replace(ptr::null_mut())) {
            // SAFETY: mapped by buffer_with with this capacity; no scan is using it.
            unsafe { os::unmap(old.cast(), self.buffer_cap.get() * core::mem::size_of::<usize>()) };
        }
        self.buffer_cap.set(0);
    }
}

/// A mask with one bit set per slot.
#[inline]
const fn all_free() -> u32 {
    if cfg::SLOTS == 32 { u32::MAX } else { (1u32 << cfg::SLOTS) - 1 }
}

/// Runs `reclaim` on every object of a private list; returns how many.
///
/// # Safety
/// The caller owns the list and no hazard pointer protects its objects.
unsafe fn reclaim_list(mut cursor: *mut Retired) -> usize {
    let mut freed = 0;
    while let Some(link) = NonNull::new(cursor) {
        // SAFETY: per the contract; read the link before the object is freed.
        unsafe {
            let (next, reclaim) = (*(*link.as_ptr()).next.get(), *(*link.as_ptr()).reclaim.get());
            cursor = next;
            if let Some(reclaim) = reclaim {
                reclaim(link);
            }
        }
        freed += 1;
    }
    freed
}

/// The state one domain shares between all its threads.
pub(crate) struct DomainInner {
    /// Registered blocks (push-only list; blocks are never unlinked before teardown).
    registry: CachePadded<AtomicPtr<Block>>,
    /// Mappings holding blocks (for teardown).
    chunks: AtomicPtr<Chunk>,
    /// Blocks in the registry: `H = SLOTS * blocks`.
    blocks: AtomicUsize,
    /// FREE blocks that still hold retired objects (a hint for scanners).
    orphans: AtomicUsize,
    /// Scans run and objects reclaimed by them (statistics).
    scans: AtomicUsize,
    reclaimed: AtomicUsize,
    /// `Domain` handles plus claimed blocks; torn down at zero.
    refs: AtomicUsize,
    /// `Domain` handles; at zero the remaining garbage is swept.
    handles: AtomicUsize,
    /// Set by the sweep: threads drop their cached blocks of this domain when they see it.
    dead: AtomicBool,
    /// The process-wide default domain (a static, never torn down).
    pub(crate) is_static: bool,
}

macro_rules! inner_init {
    ($is_static:expr) => {
        DomainInner {
            registry: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
            chunks: AtomicPtr::new(ptr::null_mut()),
            blocks: AtomicUsize::new(0),
            orphans: AtomicUsize::new(0),
            scans: AtomicUsize::new(0),
            reclaimed: AtomicUsize::new(0),
            refs: AtomicUsize::new(1),
            handles: AtomicUsize::new(1),
            dead: AtomicBool::new(false),
            is_static: $is_static,
        }
    };
}

/// A snapshot of a domain's counters (see `DomainStats`).
pub(crate) struct Counts {
    pub(crate) blocks: usize,
    pub(crate) claimed: usize,
    pub(crate) retired: usize,
    pub(crate) scans: usize,
    pub(crate) reclaimed: usize,
}

impl DomainInner {
    /// The process-wide default domain (a `static`).
    #[cfg(not(scalemem_loom))]
    pub(crate) const fn new_static() -> Self {
        inner_init!(true)
    }

    /// A domain in memory of its own, with one handle.
    pub(crate) fn new_mapped() -> Result<NonNull<DomainInner>, AllocError> {
        let mem = os::map(core::mem::size_of::<DomainInner>())?.cast::<DomainInner>();
        // SAFETY: a fresh page-aligned mapping at least size_of::<DomainInner>() long.
        unsafe { mem.as_ptr().write(inner_init!(false)) };
        Ok(mem)
    }

    /// Whether the domain's last handle is gone (cached blocks should be dropped).
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        // Relaxed: a hint; dropping a dead domain's blocks needs no other data.
        self.dead.load(Ordering::Relaxed)
    }

    /// Adds a handle (a `Domain` clone).
    pub(crate) fn acquire_handle(&self) {
        // Relaxed: the caller holds a handle already, as in Arc::clone.
        self.handles.fetch_add(1, Ordering::Relaxed);
        self.refs.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a handle; the last one sweeps the garbage, and the last reference tears the
    /// domain down.
    ///
    /// # Safety
    /// The caller held a handle and does not use `this` afterwards.
    pub(crate) unsafe fn release_handle(this: NonNull<DomainInner>) {
        // SAFETY: our handle keeps the domain alive until release_ref below.
        let inner = unsafe { this.as_ref() };
        // AcqRel: the last dropper sees every other handle holder's retires (their
        // decrements are Release) before it sweeps.
        if inner.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: no handle remains, so no hazard pointer (they borrow a handle) and
            // no retire or scan of this domain can run any more.
            unsafe { inner.sweep() };
        }
        // SAFETY: the handle's reference is given up here.
        unsafe { Self::release_ref(this) };
    }

    /// Frees every retired object of every block and marks the domain dead.
    ///
    /// # Safety
    /// No hazard pointer of the domain exists and no retire, scan or adoption can start.
    unsafe fn sweep(&self) {
        // Relaxed: threads look at it as a hint only.
        self.dead.store(true, Ordering::Relaxed);
        let mut freed = 0;
        // Acquire: see claim().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(block) = NonNull::new(cursor) {
            // SAFETY: blocks stay mapped while the domain lives. Their owners no longer
            // touch the retired list (the contract), so it is ours.
            let b = unsafe { block.as_ref() };
            let (head, _, _) = b.take_list();
            // SAFETY: no hazard pointer exists: nothing can be protected.
            freed += unsafe { reclaim_list(head) };
            cursor = b.next;
        }
        // Relaxed: statistics and hints.
        self.orphans.store(0, Ordering::Relaxed);
        self.reclaimed.fetch_add(freed, Ordering::Relaxed);
    }

    /// Drops a reference; the last one tears the domain down.
    ///
    /// # Safety
    /// The caller held a reference and does not use `this` afterwards.
    pub(crate) unsafe fn release_ref(this: NonNull<DomainInner>) {
        // SAFETY: the caller's reference keeps the domain alive until this RMW.
        let inner = unsafe { this.as_ref() };
        if inner.is_static {
            return;
        }
        // AcqRel: the last releaser sees every other holder's writes before teardown.
        if inner.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: the last reference is gone: no handle, claimed block or hazard.
            unsafe { Self::destroy(this) };
        }
    }

    /// Frees what is left and unmaps everything.
    ///
    /// # Safety
    /// No reference to the domain remains.
    unsafe fn destroy(this: NonNull<DomainInner>) {
        // SAFETY: per the contract we are the only user of the domain and its memory.
        unsafe {
            let inner = this.as_ref();
            // Acquire (here and for `chunks` below): pairs with the Release CASes in
            // push_list (the last put's AcqRel has ordered them before us already).
            let mut cursor = inner.registry.load(Ordering::Acquire);
            while let Some(block) = NonNull::new(cursor) {
                let b = block.as_ref();
                reclaim_list(b.take_list().0);
                b.drop_buffer();
                cursor = b.next;
            }
            let mut chunk = inner.chunks.swap(ptr::null_mut(), Ordering::Acquire);
            while let Some(c) = NonNull::new(chunk) {
                chunk = (*c.as_ptr()).next;
                Chunk::unmap(c);
            }
            ptr::drop_in_place(this.as_ptr());
            os::unmap(this.cast(), core::mem::size_of::<DomainInner>());
        }
    }

    /// Claims a free block or maps new ones; the block holds a reference to `this`.
    pub(crate) fn claim(this: NonNull<DomainInner>) -> Result<NonNull<Block>, AllocError> {
        // SAFETY: the caller holds a reference (a handle or a claimed block).
        let inner = unsafe { this.as_ref() };
        // Acquire: pairs with the Release CAS that published each chunk's blocks, making
        // their initialisation (including `next`) visible.
        let mut cursor = inner.registry.load(Ordering::Acquire);
        while let Some(block) = NonNull::new(cursor) {
            // SAFETY: blocks stay mapped while the domain lives.
            let b = unsafe { block.as_ref() };
            // Relaxed pre-check to skip busy blocks without an RMW. Acquire on the CAS:
            // pairs with the Release store in release_chain, handing us the owner-only
            // fields and any retired list left on the block.
            if b.state.load(Ordering::Relaxed) == FREE
                && b.state.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                if b.retired.load(Ordering::Relaxed) > 0 {
                    // Relaxed: a hint (we inherit the garbage).
                    inner.orphans.fetch_sub(1, Ordering::Relaxed);
                }
                b.reset_owner(block);
                // Relaxed: we hold a reference already.
                inner.refs.fetch_add(1, Ordering::Relaxed);
                return Ok(block);
            }
            cursor = b.next;
        }
        let block = Chunk::map(inner, this)?;
        // Relaxed: we hold a reference already.
        inner.refs.fetch_add(1, Ordering::Relaxed);
        Ok(block)
    }

    /// Counters for `stats` (walks the registry).
    pub(crate) fn counts(&self) -> Counts {
        let (mut blocks, mut claimed, mut retired) = (0, 0, 0);
        // Acquire: see claim().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(block) = NonNull::new(cursor) {
            // SAFETY: blocks stay mapped while the domain lives.
            let b = unsafe { block.as_ref() };
            blocks += 1;
            // Relaxed: statistics.
            claimed += usize::from(b.state.load(Ordering::Relaxed) == CLAIMED);
            retired += b.retired.load(Ordering::Relaxed);
            cursor = b.next;
        }
        // Relaxed: statistics.
        let scans = self.scans.load(Ordering::Relaxed);
        let reclaimed = self.reclaimed.load(Ordering::Relaxed);
        Counts { blocks, claimed, retired, scans, reclaimed }
    }

    /// Takes the retired lists of FREE blocks (exited threads) onto `into`'s list.
    fn adopt(&self, into: &Block) {
        // Acquire: see claim().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(block) = NonNull::new(cursor) {
            // SAFETY: blocks stay mapped while the domain lives.
            let b = unsafe { block.as_ref() };
            cursor = b.next;
            // Relaxed pre-checks; Acquire CAS as in claim(): the previous owner's unlinks
            // of these objects happen before our heavy fence (module doc, adoption).
            if b.state.load(Ordering::Relaxed) != FREE || b.retired.load(Ordering::Relaxed) == 0 {
                continue;
            }
            if b.state.compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_err() {
                continue;
            }
            let (head, tail, len) = b.take_list();
            if len > 0 {
                into.push_list(head, tail, len);
                // Relaxed: a hint.
                self.orphans.fetch_sub(1, Ordering::Relaxed);
            }
            // Release: as in release_chain.
            b.state.store(FREE, Ordering::Release);
        }
    }

    /// Scans: frees every object on `primary`'s retired list that no hazard slot of the
    /// domain holds. Returns the number freed.
    ///
    /// # Safety
    /// The caller owns `primary`, a block of this domain.
    pub(crate) unsafe fn scan(&self, primary: NonNull<Block>) -> usize {
        // SAFETY: per the contract.
        let block = unsafe { primary.as_ref() };
        // Relaxed: a hint; adoption itself synchronises through the blocks' states.
        if self.orphans.load(Ordering::Relaxed) > 0 {
            self.adopt(block);
        }
        // The heavy side of the publish protocol: every hazard a reader stored before its
        // light fence is visible to the loads below, or that reader's validating re-load
        // sees every unlink that happens before this point (module doc).
        fence::heavy();
        // Relaxed: an estimate for sizing; the walk below counts exactly.
        let estimate = self.blocks.load(Ordering::Relaxed) * cfg::SLOTS;
        let Ok(mut buffer) = block.buffer_with(0, estimate) else {
            // Out of memory for the buffer: keep everything; a later scan retries.
            return 0;
        };
        let (mut len, mut hazards) = (0, 0);
        // Acquire: see claim().
        let mut cursor = self.registry.load(Ordering::Acquire);
        while let Some(b) = NonNull::new(cursor) {
            // SAFETY: blocks stay mapped while the domain lives.
            let b = unsafe { b.as_ref() };
            for slot in &b.slots {
                hazards += 1;
                // Acquire: pairs with the Release stores of publish and reset, so a
                // reader's accesses before a later reset happen before our frees.
                let p = slot.load(Ordering::Acquire) as usize;
                if p == 0 {
                    continue;
                }
                if len == block.buffer_cap.get() {
                    // A block was added since `estimate`: double, keeping what we have.
                    match block.buffer_with(len, len * 2) {
                        Ok(grown) => buffer = grown,
                        // Out of memory mid-scan: keep everything; a later scan retries.
                        Err(_) => return 0,
                    }
                }
                // SAFETY: len < capacity.
                unsafe { buffer.add(len).write(p) };
                len += 1;
            }
            cursor = b.next;
        }
        // SAFETY: the first `len` entries are initialised and the buffer is ours.
        let protected = unsafe { core::slice::from_raw_parts_mut(buffer, len) };
        protected.sort_unstable();
        let (head, _, _) = block.take_list();
        let (mut keep_head, mut keep_tail, mut kept) = (ptr::null_mut::<Retired>(), ptr::null_mut::<Retired>(), 0);
        let mut free_head = ptr::null_mut::<Retired>();
        let mut cursor = head;
        while let Some(link) = NonNull::new(cursor) {
            // SAFETY: the list is ours; read each link before relinking it.
            let (next, object) = unsafe { (*(*link.as_ptr()).next.get(), *(*link.as_ptr()).epoch.get()) };
            cursor = next;
            if protected.binary_search(&object).is_ok() {
                // SAFETY: as above.
                unsafe { *(*link.as_ptr()).next.get() = ptr::null_mut() };
                if keep_tail.is_null() {
                    keep_head = link.as_ptr();
                } else {
                    // SAFETY: as above.
                    unsafe { *(*keep_tail).next.get() = link.as_ptr() };
                }
                keep_tail = link.as_ptr();
                kept += 1;
            } else {
                // SAFETY: as above.
                unsafe { *(*link.as_ptr()).next.get() = free_head };
                free_head = link.as_ptr();
            }
        }
        if kept > 0 {
            block.push_list(keep_head, keep_tail, kept);
        }
        block.threshold.set(threshold_for(hazards));
        block.last_scan.set(now_ns());
        // Free outside the buffer's use: reclaim functions may retire (and scan) again.
        // SAFETY: unprotected objects of our list: no hazard published before our heavy
        // fence holds them, and no later one can validate (module doc).
        let freed = unsafe { reclaim_list(free_head) };
        // Relaxed: statistics.
        self.scans.fetch_add(1, Ordering::Relaxed);
        self.reclaimed.fetch_add(freed, Ordering::Relaxed);
        freed
    }
}

impl Block {
    /// Resets the owner-only fields for a new owner (right after claiming). The retired
    /// list, threshold and scan buffer stay (inherited).
    fn reset_owner(&self, this: NonNull<Block>) {
        self.free.set(all_free());
        self.primary.set(this.as_ptr());
        self.overflow.set(ptr::null_mut());
        self.release_when_idle.set(false);
    }
}

/// The header of a mapping of blocks (one page).
#[repr(C, align(128))]
struct Chunk {
    next: *mut Chunk,
}

impl Chunk {
    fn bytes() -> usize {
        core::mem::size_of::<Chunk>() + cfg::BLOCKS_PER_CHUNK * core::mem::size_of::<Block>()
    }

    /// Maps a chunk of blocks, claims the first for the caller, publishes all of them.
    fn map(inner: &DomainInner, this: NonNull<DomainInner>) -> Result<NonNull<Block>, AllocError> {
        let base = os::map(Self::bytes())?;
        let chunk = base.cast::<Chunk>();
        // SAFETY: the fresh mapping holds the header and BLOCKS_PER_CHUNK blocks, each
        // 128-aligned (page-aligned base, 128-byte header and block size); it is ours
        // until the CAS below publishes the blocks.
        let first = unsafe {
            chunk.as_ptr().write(Chunk { next: ptr::null_mut() });
            let first = chunk.as_ptr().add(1).cast::<Block>();
            for i in 0..cfg::BLOCKS_PER_CHUNK {
                let next = if i + 1 < cfg::BLOCKS_PER_CHUNK { first.add(i + 1) } else { ptr::null_mut() };
                first.add(i).write(Block {
                    slots: core::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
                    state: AtomicUsize::new(if i == 0 { CLAIMED } else { FREE }),
                    retired: AtomicUsize::new(0),
                    next,
                    domain: this,
                    free: Cell::new(all_free()),
                    primary: Cell::new(first.add(i)),
                    overflow: Cell::new(ptr::null_mut()),
                    release_when_idle: Cell::new(false),
                    head: Cell::new(ptr::null_mut()),
                    tail: Cell::new(ptr::null_mut()),
                    threshold: Cell::new(cfg::THRESHOLD_MIN),
                    last_scan: Cell::new(now_ns()),
                    buffer: Cell::new(ptr::null_mut()),
                    buffer_cap: Cell::new(0),
                });
            }
            NonNull::new_unchecked(first)
        };
        // SAFETY: the last block of the chunk is ours until published.
        let last = unsafe { NonNull::new_unchecked(first.as_ptr().add(cfg::BLOCKS_PER_CHUNK - 1)) };
        // Relaxed: a count for sizing and statistics; counted before publication so that
        // a scan never finds more slots than `blocks` says.
        inner.blocks.fetch_add(cfg::BLOCKS_PER_CHUNK, Ordering::Relaxed);
        push_list(&inner.chunks, chunk, chunk, |c, next| {
            // SAFETY: we own the chunk header until the CAS publishes it.
            unsafe { (*c.as_ptr()).next = next }
        });
        push_list(&inner.registry, first, last, |b, next| {
            // SAFETY: `next` is written before the Release CAS publishes the blocks and
            // never again, so readers that Acquire the registry see it.
            unsafe { (*b.as_ptr()).next = next }
        });
        Ok(first)
    }

    /// # Safety
    /// No block of the chunk is used any more.
    unsafe fn unmap(chunk: NonNull<Chunk>) {
        // SAFETY: per the contract; the blocks were initialised by map().
        unsafe {
            let first = chunk.as_ptr().add(1).cast::<Block>();
            for i in 0..cfg::BLOCKS_PER_CHUNK {
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
    fn sizes_fit_their_mappings() {
        assert_eq!(core::mem::size_of::<Block>(), 256);
        assert!(Chunk::bytes() <= 4096);
        assert_eq!(all_free().count_ones() as usize, cfg::SLOTS);
    }

    #[test]
    fn threshold_is_max_of_constant_and_multiple() {
        assert_eq!(threshold_for(0), cfg::THRESHOLD_MIN);
        assert_eq!(threshold_for(10_000), 20_000);
    }
}
