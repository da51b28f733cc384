//! Per-thread reader slots: how a thread counts itself among an [`RmLock`](super::RmLock)'s
//! readers by writing one word of its own, and how a writer finds the readers inside.
//!
//! Every thread that reads an `RmLock` claims a [`Record`] from a process-wide registry
//! on its first read: a cache line of [`SLOTS`] words that only that thread writes. A
//! slot holds a lock's identity (its *tag*: from [`crate::sync::unique_id`], never 0,
//! never reused) while the thread holds read guards of that lock, and 0 when free; the
//! record's `depths` (a second line, which only the owner reads) count the guards past
//! the first. A read therefore writes only the reader's own line: no per-CPU counter,
//! no atomic read-modify-write, no shared line.
//!
//! # Synchronization protocol
//!
//! Local operations (the owning thread only, on its own record):
//! - *enter* (outermost read): store the tag into a free slot (Release), then the
//!   lock's R2 fence and R3 check (`raw.rs`); a reader that sees the writer flag clears
//!   the slot again (Release) before it waits.
//! - *nest* / *unnest*: the slot's depth word one higher or lower, its
//!   [`OUT_OF_LINE`] bit kept (Relaxed: only the owner reads it; the slot, which is all a
//!   writer looks at, does not change).
//! - *leave* (the last guard, depth 0): store 0 (Release), then R5-R6.
//!
//! Every store to a slot is a Release store by its owner (there are only the two
//! above), so a writer's Acquire load that reads *any* value of a slot synchronises
//! with a store sequenced after everything the owner did before it, including every
//! earlier critical section it left (C++20 release sequences no longer continue through
//! plain stores, so the Release is on every store, not only on the clearing one; on
//! x86-64 all of them are plain `mov`s).
//!
//! Remote operation (a writer after its heavy fence): [`any_holds`] walks every page of
//! the registry and, in each claimed record, loads every slot (Acquire) and compares its
//! tag. A record that is not claimed is skipped: a reader that claimed it did so before
//! its R2 fence, so by the fence rule (rmlock's module doc) either the writer sees the
//! claim and then the slot, or the reader sees the flag.
//!
//! Registry: pages of [`PER_PAGE`] records, mapped from the kernel (never the global
//! allocator) and pushed onto a lock-free list (Release CAS on the head; walkers load it
//! with Acquire); pages are never unmapped. A thread claims a record with a CAS of its
//! `claimed` word from 0 to 1 (Acquire: pairs with the Release store that gave it back),
//! caches the pointer in a `const`-initialised thread-local without a destructor, and
//! gives the record back from a pthread key destructor at exit (Release) if every slot
//! is free; a record with a slot still in use at exit (a guard leaked with
//! `mem::forget`, or one dropped by a later thread-local destructor) stays claimed
//! forever, which costs its 192 bytes and nothing else. After its exit hook a thread,
//! and a thread whose registration failed (the kernel refused a page, or no pthread key
//! was left), has no record: its reads use the lock's per-CPU counts (`tracker.rs`).
//!
//! Why the depth is not in the slot word: the slot then holds the full identity (no
//! two locks can share a tag) and nesting has no limit short of 2^64 guards. (The
//! depth packed into the slot's low bits measured the same speed here.)
//!
//! The inline read and release test only words they load anyway. A thread that must
//! not take the inline path (not registered yet, without a record, or registered in
//! the symmetric mode, whose slot fences are SeqCst) finds the *sentinel* record in its
//! fast thread-local: its slots hold `usize::MAX`, neither free nor any lock's tag, so
//! the read goes to its slow path. A release goes out of line when the depth word
//! carries [`OUT_OF_LINE`]: every depth of a symmetric-mode thread's record does (set
//! when the thread registers), and so does the sentinel's first slot, which is the
//! ticket of a hold counted per CPU.

use core::cell::Cell;
use core::ptr;

use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Slots per record: how many different locks a thread can hold for reading at once on
/// the slot path (a further one is counted per CPU, without recursion support). Two under
/// loom, to keep the models small while still reaching the scan and the full table.
#[cfg(not(scalemem_loom))]
pub(super) const SLOTS: usize = 8;
#[cfg(scalemem_loom)]
pub(super) const SLOTS: usize = 2;

/// Records per registry page: a 4 KiB page holds a 64-byte header and 21 records of
/// 192 bytes. Two under loom.
#[cfg(not(scalemem_loom))]
const PER_PAGE: usize = 21;
#[cfg(scalemem_loom)]
const PER_PAGE: usize = 2;

/// The high bit of a depth word: set in every depth of a record whose thread's slot
/// fences are SeqCst (it registered in the symmetric mode), and in the sentinel's, so
/// that a release which finds a depth other than 0 (the last guard) and without this bit
/// (a nested one) leaves the inline path. No depth reaches it by counting: that takes
/// 2^63 live guards.
pub(super) const OUT_OF_LINE: usize = 1 << (usize::BITS - 1);

/// The slot word of a lock with identity `id` (never 0: identities start at 1).
pub(super) fn tag_of(id: u64) -> usize {
    id as usize
}

/// The slot a lock with tag word `tag` tries first: where a thread that holds it finds
/// it with one comparison.
pub(super) fn home_of(tag: usize) -> usize {
    // Under loom every lock's home is slot 0: lock identities come from a process-wide
    // counter that does not restart per execution, and a home that moved between
    // executions would make the model non-deterministic.
    if cfg!(scalemem_loom) { 0 } else { tag % SLOTS }
}

/// Reads one of the calling thread's own slots.
///
/// Relaxed: only the calling thread stores to its slots, so the value is its own last
/// store.
#[inline]
pub(super) fn own(slot: &AtomicUsize) -> usize {
    slot.load(Ordering::Relaxed)
}

/// One thread's slots (one cache line that only the owner writes), their depths (one
/// that only the owner touches) and the registry's claim word (written only when a
/// thread claims or gives back the record). `repr(C)`: `depths` follows `slots`
/// directly, so slot `i`'s depth is `SLOTS` words past it ([`Record::depth_of`]).
#[repr(C, align(64))]
pub(super) struct Record {
    slots: [AtomicUsize; SLOTS],
    /// Guards held past the first, per slot; 0 while the slot is free.
    depths: [AtomicUsize; SLOTS],
    /// 1 while a thread owns the record.
    claimed: AtomicUsize,
}

impl Record {
    #[cfg(scalemem_loom)]
    fn new() -> Self {
        Self {
            slots: core::array::from_fn(|_| AtomicUsize::new(0)),
            depths: core::array::from_fn(|_| AtomicUsize::new(0)),
            claimed: AtomicUsize::new(0),
        }
    }

    /// The sentinel: every slot holds `usize::MAX` (neither free nor any lock's tag, so
    /// the inline read always leaves for its slow path) and every depth [`OUT_OF_LINE`]
    /// (so a release through it does too). Never in the registry, never written.
    #[cfg(not(scalemem_loom))]
    const fn sentinel() -> Self {
        Self {
            slots: [const { AtomicUsize::new(usize::MAX) }; SLOTS],
            depths: [const { AtomicUsize::new(OUT_OF_LINE) }; SLOTS],
            claimed: AtomicUsize::new(1),
        }
    }

    #[cfg(scalemem_loom)]
    fn sentinel() -> Self {
        Self {
            slots: core::array::from_fn(|_| AtomicUsize::new(usize::MAX)),
            depths: core::array::from_fn(|_| AtomicUsize::new(OUT_OF_LINE)),
            claimed: AtomicUsize::new(1),
        }
    }

    /// Sets every depth to what the owner's release mode says: 0 for a thread whose
    /// slot fences are compiler fences (`light`), [`OUT_OF_LINE`] otherwise. Called by
    /// the owner when it registers, every slot free (a record given back keeps the
    /// depths of its last owner's mode).
    #[cfg(not(scalemem_loom))]
    fn set_release_mode(&self, light: bool) {
        for depth in &self.depths {
            // Relaxed: only the owner reads its depths.
            depth.store(if light { 0 } else { OUT_OF_LINE }, Ordering::Relaxed);
        }
    }

    /// The depth word of `slot`, a slot of some record.
    ///
    /// # Safety
    /// `slot` is an element of a record's `slots` (records are never freed).
    #[inline]
    pub(super) unsafe fn depth_of(slot: &AtomicUsize) -> &AtomicUsize {
        // SAFETY: `slot` is `slots[i]` of a `repr(C)` record, whose `depths` array (the
        // same element type, so no padding between) follows `slots` at once: `SLOTS`
        // elements further is `depths[i]`, inside the same record.
        unsafe { &*ptr::from_ref(slot).add(SLOTS) }
    }

    /// Slot `i` (taken modulo [`SLOTS`]).
    #[inline]
    pub(super) fn slot(&self, i: usize) -> &AtomicUsize {
        &self.slots[i % SLOTS]
    }

    /// Looks the lock with tag word `tag` up in this (the calling thread's) record.
    pub(super) fn lookup(&self, tag: usize) -> Lookup<'_> {
        if let Some(slot) = self.slots.iter().find(|s| own(s) == tag) {
            return Lookup::Held(slot);
        }
        let home = self.slot(home_of(tag));
        if own(home) == 0 {
            return Lookup::Free(home);
        }
        self.slots.iter().find(|s| own(s) == 0).map_or(Lookup::Full, Lookup::Free)
    }

    /// True if every slot is free (called by the owner).
    fn is_idle(&self) -> bool {
        self.slots.iter().all(|s| own(s) == 0)
    }
}

/// What a thread's record says about a lock it is about to read.
pub(super) enum Lookup<'a> {
    /// The thread holds the lock already, in this slot.
    Held(&'a AtomicUsize),
    /// Not held; this slot is free for it.
    Free(&'a AtomicUsize),
    /// Not held, and every slot is in use.
    Full,
}

/// A registry page: the list link, then the records.
#[repr(C, align(64))]
struct Page {
    next: AtomicPtr<Page>,
    records: [Record; PER_PAGE],
}

#[cfg(not(scalemem_loom))]
const _: () = assert!(core::mem::size_of::<Page>() == 4096);

/// The registry: the head of the page list. Pages are pushed, never removed.
struct Registry {
    head: AtomicPtr<Page>,
}

impl Registry {
    #[cfg(not(scalemem_loom))]
    const fn new() -> Self {
        Self { head: AtomicPtr::new(ptr::null_mut()) }
    }

    #[cfg(scalemem_loom)]
    fn new() -> Self {
        Self { head: AtomicPtr::new(ptr::null_mut()) }
    }

    /// Every page, newest first.
    fn pages(&'static self) -> impl Iterator<Item = &'static Page> {
        // Acquire: pairs with the Release CAS in `claim`: the page's initialisation is
        // visible.
        let mut page = self.head.load(Ordering::Acquire);
        core::iter::from_fn(move || {
            // SAFETY: pages are published fully initialised and never freed.
            let current = unsafe { page.as_ref() }?;
            // Acquire: as above (`next` was set before the page was published).
            page = current.next.load(Ordering::Acquire);
            Some(current)
        })
    }

    /// Claims a free record, mapping a new page if every record is taken; `None` if the
    /// kernel refuses the page.
    fn claim(&'static self) -> Option<&'static Record> {
        for page in self.pages() {
            for record in &page.records {
                // Relaxed: a hint for the CAS. Acquire on success: pairs with the Release
                // store in `give_back`, so the last owner's slot stores (all 0) are seen.
                if record.claimed.load(Ordering::Relaxed) == 0
                    && record.claimed.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
                {
                    return Some(record);
                }
            }
        }
        let page = new_page()?;
        // SAFETY: just made, not yet shared.
        let page_ref = unsafe { &*page };
        // Relaxed: the page is not published yet; the CAS below publishes it.
        page_ref.records[0].claimed.store(1, Ordering::Relaxed);
        // Relaxed: a first guess for the CAS, which re-reads on failure.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // Relaxed: published by the Release CAS below.
            page_ref.next.store(head, Ordering::Relaxed);
            // Release: publishes the page's contents to `pages`' Acquire loads.
            match self.head.compare_exchange_weak(head, page, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Some(&page_ref.records[0]),
                Err(now) => head = now,
            }
        }
    }
}

/// A zeroed page of records (zero is a valid, unclaimed record).
#[cfg(not(scalemem_loom))]
fn new_page() -> Option<*mut Page> {
    // The mapping is page-aligned and zeroed; every field of a Page is an atomic whose
    // all-zero bits are a valid value (0, null).
    crate::os::map(core::mem::size_of::<Page>()).ok().map(|p| p.as_ptr().cast::<Page>())
}

/// Under loom atomics must be constructed: a leaked box (a few per execution).
#[cfg(scalemem_loom)]
fn new_page() -> Option<*mut Page> {
    let page = Page { next: AtomicPtr::new(ptr::null_mut()), records: core::array::from_fn(|_| Record::new()) };
    Some(Box::into_raw(Box::new(page)))
}

/// True if some thread's record has a slot with tag word `tag`: some reader of that lock
/// is inside (or about to back out).
///
/// REQUIRES: called by a writer after its heavy fence (W2); then `false` means every
/// slot reader of the lock has left, and their critical sections happen before what the
/// caller does next (module doc).
pub(super) fn any_holds(tag: usize) -> bool {
    registry().pages().any(|page| {
        page.records.iter().any(|record| {
            // Relaxed: see the module doc (the fence rule covers the claim).
            record.claimed.load(Ordering::Relaxed) != 0
                // Acquire: pairs with the owner's Release stores (module doc).
                && record.slots.iter().any(|s| s.load(Ordering::Acquire) == tag)
        })
    })
}

// ---------------------------------------------------------------------------------------
// The thread's record.

#[cfg(not(scalemem_loom))]
mod imp {
    use super::*;
    use crate::thread_exit::ExitKey;

    pub(super) static REGISTRY: Registry = Registry::new();

    /// Marks a thread with no record (its exit hook ran, or registration failed).
    const NONE: *const Record = ptr::dangling::<Record>();

    /// What [`FAST`] holds for a thread without a fast record.
    static SENTINEL: Record = Record::sentinel();

    crate::sync::thread_local! {
        /// Null: not registered yet; [`NONE`]: no record; else this thread's record.
        static MINE: Cell<*const Record> = const { Cell::new(ptr::null()) };
        /// This thread's record if its slot operations may use compiler fences (the
        /// fence mode was asymmetric when it registered); [`SENTINEL`] otherwise, so
        /// that the inline read needs no null test.
        static FAST: Cell<*const Record> = const { Cell::new(&raw const SENTINEL) };
    }

    /// The pthread key whose destructor gives the record back.
    static KEY: ExitKey = ExitKey::new(give_back_at_exit);

    /// Thread-exit hook.
    unsafe extern "C" fn give_back_at_exit(record: *mut libc::c_void) {
        MINE.with(|mine| mine.set(NONE));
        FAST.with(|fast| fast.set(&raw const SENTINEL));
        // SAFETY: the key's value is this thread's record (set in `register`), and
        // records are never freed.
        if let Some(record) = unsafe { record.cast::<Record>().as_ref() }
            && record.is_idle()
        {
            // Release: pairs with the Acquire CAS in `Registry::claim`.
            record.claimed.store(0, Ordering::Release);
        }
    }

    /// This thread's record, registering it on first use; `None` if it has none.
    #[inline]
    pub(in crate::rmlock) fn mine() -> Option<&'static Record> {
        let p = MINE.with(Cell::get);
        if p.addr() > NONE.addr() {
            // SAFETY: a record this thread claimed; records are never freed and stay
            // claimed until the thread's exit hook, which also clears MINE.
            return Some(unsafe { &*p });
        }
        if p.is_null() { register() } else { None }
    }

    /// This thread's record if it is registered and its slot operations may use
    /// compiler fences (see [`light_slots`]), else the [`sentinel`]: one thread-local
    /// load, no call, no test. A thread that has not read yet, has no record, or
    /// registered in symmetric mode gets the sentinel, whose slots send the inline fast
    /// path to its slow path, which calls [`mine`].
    #[inline]
    pub(in crate::rmlock) fn mine_fast() -> &'static Record {
        // SAFETY: FAST holds either the sentinel (a static) or the record this thread
        // claimed (set in `register` beside MINE, reset with it by the exit hook), and
        // records are never freed.
        unsafe { &*FAST.with(Cell::get) }
    }

    /// The record no thread owns: its slots never hold a tag or 0 and its depths are
    /// [`OUT_OF_LINE`]. Counted holds carry its first slot as their ticket.
    #[inline]
    pub(in crate::rmlock) fn sentinel() -> &'static Record {
        &SENTINEL
    }

    /// Whether this thread's slot operations use compiler fences for R2 and R5: the
    /// fence mode was asymmetric when the thread registered. It stays so for the
    /// thread's life, even after a switch to symmetric: `heavy` keeps issuing the
    /// membarrier once registered, which covers a compiler-fence reader
    /// ([`crate::cpu::fence`]'s module doc).
    #[inline]
    pub(in crate::rmlock) fn light_slots() -> bool {
        FAST.with(Cell::get) != &raw const SENTINEL
    }

    #[cold]
    #[inline(never)]
    fn register() -> Option<&'static Record> {
        // Decide the fence mode now: it says whether this thread's slot path may use
        // compiler fences (FAST) for the rest of its life.
        let asymmetric = crate::cpu::fence::mode() == crate::cpu::fence::Mode::Asymmetric;
        let registered = (|| {
            let key = KEY.get()?;
            let record = REGISTRY.claim()?;
            // SAFETY: `key` is live; the value is this thread's record.
            if unsafe { libc::pthread_setspecific(key, ptr::from_ref(record).cast()) } != 0 {
                // Release: as in the exit hook (the record was never used).
                record.claimed.store(0, Ordering::Release);
                return None;
            }
            Some(record)
        })();
        if let Some(record) = registered {
            record.set_release_mode(asymmetric);
        }
        MINE.with(|mine| mine.set(registered.map_or(NONE, ptr::from_ref)));
        if asymmetric && let Some(record) = registered {
            FAST.with(|fast| fast.set(record));
        }
        registered
    }

    /// An address that identifies the calling thread while it runs.
    #[inline]
    pub(in crate::rmlock) fn thread_token() -> usize {
        MINE.with(|mine| ptr::from_ref(mine).addr())
    }

    pub(super) fn registry() -> &'static Registry {
        &REGISTRY
    }
}

#[cfg(scalemem_loom)]
mod imp {
    use super::*;

    crate::sync::lazy_static! {
        static ref REGISTRY: Registry = Registry::new();
        static ref SENTINEL: Record = Record::sentinel();
    }

    /// A model thread's claim, given back when the thread ends.
    struct Claim {
        record: Option<&'static Record>,
        /// Set by [`force_counts`]: this thread reads with the per-CPU counts.
        counts: Cell<bool>,
    }

    impl Drop for Claim {
        fn drop(&mut self) {
            if let Some(record) = self.record
                && record.is_idle()
            {
                // Release: pairs with the Acquire CAS in `Registry::claim`.
                record.claimed.store(0, Ordering::Release);
            }
        }
    }

    crate::sync::thread_local! {
        static MINE: Claim = Claim { record: registry().claim(), counts: Cell::new(false) };
    }

    pub(in crate::rmlock) fn mine() -> Option<&'static Record> {
        MINE.with(|claim| if claim.counts.get() { None } else { claim.record })
    }

    /// Every model thread with a record takes the fast path (its fences are SeqCst
    /// under loom whichever kind the registration chose); one reading with the counts
    /// gets the sentinel.
    pub(in crate::rmlock) fn mine_fast() -> &'static Record {
        mine().unwrap_or_else(sentinel)
    }

    pub(in crate::rmlock) fn sentinel() -> &'static Record {
        // Deref of the model's lazy static: valid for the whole execution.
        let sentinel: &'static Record = &SENTINEL;
        sentinel
    }

    pub(in crate::rmlock) fn light_slots() -> bool {
        true
    }

    /// Makes this model thread read with the per-CPU counts (the path of a thread
    /// without a record), so that models cover it too.
    pub(in crate::rmlock) fn force_counts() {
        MINE.with(|claim| claim.counts.set(true));
    }

    pub(in crate::rmlock) fn thread_token() -> usize {
        MINE.with(|claim| ptr::from_ref(claim).addr())
    }

    pub(super) fn registry() -> &'static Registry {
        // Deref of the model's lazy static: valid for the whole execution.
        let registry: &'static Registry = &REGISTRY;
        registry
    }
}

#[cfg(scalemem_loom)]
pub(super) use imp::force_counts;
use imp::registry;
pub(super) use imp::{light_slots, mine, mine_fast, sentinel, thread_token};

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    /// Threads that come and go one after another give their records back and claim
    /// them again: the registry does not grow with the number of threads ever started.
    #[test]
    fn thread_churn_reuses_records() {
        let lock = crate::rmlock::RmLock::new(0u8);
        let pages = || registry().pages().count();
        std::thread::scope(|s| s.spawn(|| *lock.read()).join().unwrap());
        let before = pages();
        for _ in 0..4 * PER_PAGE {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _outer = lock.read();
                    assert!(mine().is_some(), "a fresh thread got no record");
                    *lock.read()
                })
                .join()
                .unwrap()
            });
        }
        // Other tests of this binary run at the same time and may claim a page or two.
        assert!(pages() <= before + 2, "{} pages after churn, {before} before", pages());
        // Every record of a thread that ended is free again, except those of threads
        // still running (other tests); this thread's own is claimed.
        let me = mine().expect("this thread's record");
        assert!(me.claimed.load(Ordering::Relaxed) == 1);
    }
}
