//! The per-CPU critical sections `refcount` is built on, behind one small interface, and
//! the model of them that loom checks.
//!
//! Outside loom these are [`cpu::rseq`](crate::cpu::rseq)'s conditional sections and
//! [`fence::heavy_rseq`](crate::cpu::fence::heavy_rseq). A structure decides once, when
//! it is built, whether it uses sections at all ([`usable`]): only if this process has
//! rseq *and* the kernel has `membarrier(PRIVATE_EXPEDITED_RSEQ)`, because every protocol
//! here that lets a section commit without an atomic instruction relies on the rseq fence
//! to close the per-CPU words afterwards. Even then a thread whose own rseq registration
//! failed gets no [`Area`] and takes the structure's atomic path.
//!
//! # The loom model
//!
//! loom cannot run the `asm!` sections or restart a thread, so under `cfg(scalemem_loom)`
//! a section is modelled by what the kernel guarantees about it:
//!
//! - sections on one CPU never overlap (a thread preempted inside one is restarted, so
//!   only its last, uninterrupted attempt has any effect): the model runs a section while
//!   holding that CPU's *section lock*;
//! - a section's loads and stores behave like x86's plain `mov`s: Acquire loads and
//!   Release stores (TSO), not SeqCst;
//! - accesses by other CPUs interleave freely with a section (the model takes no lock
//!   for them);
//! - `heavy_rseq` returns only once every section that was running has committed or been
//!   restarted; a restarted one behaves as if it had started after the fence. The model:
//!   a SeqCst fence, then take and release every CPU's section lock, then a SeqCst fence.
//!
//! Every real execution is one of the model's: take each section at its last attempt.
//! Which model threads get an [`Area`] is chosen per model with
//! `model::set_sections` (under `cfg(scalemem_loom)`) (none, all, or the first two
//! threads), so the atomic fallbacks, the sections, and a mix of both on one CPU are all
//! checked.
//!
//! # ThreadSanitizer
//!
//! TSan sees neither the `asm!` sections nor the membarrier, so it would miss the edge
//! the rseq fence makes: a put that commits in a section, then the fold that sums it and
//! the release that frees the object (a report "in free" against a reader's earlier
//! load, about one run in thirty of the refcount tests). Under `cfg(scalemem_tsan)` the
//! edge is told to it as the kernel makes it: every section entry is a release on one
//! process-wide sync address (`tsan::before_section`), and the rseq fence is an acquire
//! of it (`tsan::after_fence`). That is exactly `membarrier`'s guarantee (everything any
//! thread did before the call, in real time, is ordered before the caller's next access),
//! restricted to threads that entered a section: nothing more is hidden from TSan.

#[cfg(not(scalemem_loom))]
use crate::cpu::rseq;
#[cfg(scalemem_loom)]
use crate::sync::atomic::AtomicIsize;
use crate::sync::atomic::AtomicUsize;

/// The rseq fence's happens-before edge, told to ThreadSanitizer (module documentation,
/// "ThreadSanitizer"). Only in `cfg(scalemem_tsan)` builds, whose runtime defines these.
#[cfg(all(scalemem_tsan, not(scalemem_loom)))]
mod tsan {
    use core::ffi::c_void;

    // SAFETY: both are defined by the ThreadSanitizer runtime that every
    // `-Zsanitizer=thread` binary links (tsan_interface_ann); they take any address as
    // a sync object's name and never dereference it.
    unsafe extern "C" {
        fn __tsan_acquire(addr: *mut c_void);
        fn __tsan_release(addr: *mut c_void);
    }

    /// The sync object's name: any fixed address will do.
    static SYNC: u8 = 0;

    fn name() -> *mut c_void {
        (&raw const SYNC).cast_mut().cast()
    }

    /// Before a section: everything this thread did so far is ordered before the next
    /// rseq fence (in real time) that any thread completes.
    #[inline]
    pub(super) fn before_section() {
        // SAFETY: see the declarations; `name()` is a valid address.
        unsafe { __tsan_release(name()) };
    }

    /// After the rseq fence: acquire what every earlier section entry released.
    pub(super) fn after_fence() {
        // SAFETY: as above.
        unsafe { __tsan_acquire(name()) };
    }
}

/// Proof that the calling thread may run sections, and the handle they need. Obtained
/// with [`area`] on the thread that uses it; never sent to another thread (`!Send`).
#[derive(Clone, Copy)]
pub(crate) struct Area {
    #[cfg(not(scalemem_loom))]
    ptr: *mut u8,
    #[cfg(scalemem_loom)]
    _not_send: core::marker::PhantomData<*mut u8>,
}

/// The raw layout of a [`PerCpu`](crate::cpu::PerCpu): base address, stride, slots.
pub(crate) type Layout = (*mut u8, usize, usize);

/// Whether a structure built now may use sections: the process has rseq and the rseq
/// fence works. Probed once (the probe issues one `heavy_rseq`, about 0.1 us while no
/// other thread of the process runs).
pub(crate) fn usable() -> bool {
    #[cfg(not(scalemem_loom))]
    {
        use crate::sync::atomic::{AtomicU8, Ordering};
        const UNKNOWN: u8 = 0;
        const YES: u8 = 1;
        const NO: u8 = 2;
        // Relaxed: the answer is derived from process facts that do not change (the rseq
        // decision and the membarrier registration), and it publishes nothing.
        static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
        match STATE.load(Ordering::Relaxed) {
            YES => true,
            NO => false,
            _ => {
                let yes = crate::cpu::rseq_enabled() && crate::cpu::fence::heavy_rseq();
                STATE.store(if yes { YES } else { NO }, Ordering::Relaxed);
                yes
            }
        }
    }
    #[cfg(scalemem_loom)]
    {
        model::sections() != model::NONE
    }
}

/// This thread's [`Area`] (see the module documentation). Call only in a structure built
/// while [`usable`] was true. Outside loom the answer is always `Some`: on a thread
/// whose rseq registration failed or is over every section fails (see
/// [`rseq::thread_area_unchecked`]) and the caller takes its fallback.
#[inline]
pub(crate) fn area() -> Option<Area> {
    #[cfg(not(scalemem_loom))]
    {
        // Only domains that saw `usable()` (so rseq_enabled()) call this.
        Some(Area { ptr: rseq::thread_area_unchecked() })
    }
    #[cfg(scalemem_loom)]
    {
        let on = match model::sections() {
            model::ALL => true,
            model::FIRST_TWO => crate::sync::thread_index() < 2,
            _ => false,
        };
        on.then_some(Area { _not_send: core::marker::PhantomData })
    }
}

/// The rseq fence: once it returns, every section that was running anywhere has either
/// committed (and its store is visible to the caller) or will restart and re-read
/// everything. Only called by structures built while [`usable`] was true.
///
/// # Panics
/// If the kernel refuses `membarrier(PRIVATE_EXPEDITED_RSEQ)` after having accepted it
/// when [`usable`] probed it: registered membarrier commands cannot fail, and going on
/// would silently lose per-CPU updates.
pub(crate) fn fence() {
    #[cfg(not(scalemem_loom))]
    {
        assert!(
            crate::cpu::fence::heavy_rseq(),
            "membarrier(PRIVATE_EXPEDITED_RSEQ) failed after it had succeeded: per-CPU counts cannot be closed"
        );
        #[cfg(scalemem_tsan)]
        tsan::after_fence();
    }
    #[cfg(scalemem_loom)]
    {
        model::fence();
    }
}

/// A flags word and what a section needs to find the current CPU's word, kept
/// together so that the hot path reads one small block ([`rseq::add_if_clear_in`]).
/// The structure embeds it where its flags word would be.
#[repr(C)]
pub(crate) struct AddBlock {
    /// The structure's flags word (the section tests it).
    pub(crate) flags: AtomicUsize,
    /// Address of CPU 0's word; CPU `c`'s is `c * stride` bytes further. Fixed.
    words: usize,
    /// Number of words; 0 when the structure does not use sections (then
    /// [`add_if_clear_block`] fails at once). Fixed.
    ncpus: usize,
    /// The distance between two CPUs' words: [`rseq::BLOCK_STRIDE`] outside loom.
    #[cfg(scalemem_loom)]
    stride: usize,
}

impl AddBlock {
    /// A block over the `isize` words at byte offset `off` of every slot of `slots`,
    /// with flags `flags`, used by sections if `sections` and the slots' stride is the
    /// one the sections assume (it is for every `PerCpu` slot of at most 128 bytes).
    pub(crate) fn new(flags: usize, slots: Layout, off: usize, sections: bool) -> Self {
        let (base, stride, ncpus) = slots;
        #[cfg(not(scalemem_loom))]
        let sections = sections && stride == rseq::BLOCK_STRIDE;
        Self {
            flags: AtomicUsize::new(flags),
            words: base as usize + off,
            ncpus: if sections { ncpus } else { 0 },
            #[cfg(scalemem_loom)]
            stride,
        }
    }

    /// Whether [`add_if_clear_block`] may commit on this block.
    pub(crate) fn sections(&self) -> bool {
        self.ncpus != 0
    }
}

/// [`rseq::add_if_clear_in`] through an [`AddBlock`]: adds `delta` to the current CPU's
/// word if `block.flags & mask == 0`, tested inside the section. `false` (nothing done)
/// also when the block was built without sections.
///
/// # Safety
/// 1. `area` comes from [`area`] on the calling thread.
/// 2. The block's words obey [`rseq::add_if_clear`]'s contract (4): written only by
///    this function, or by code that knows no section can commit to them.
#[inline]
pub(crate) unsafe fn add_if_clear_block(area: Area, block: &AddBlock, mask: usize, delta: isize) -> bool {
    let ncpus = block.ncpus;
    if ncpus == 0 {
        return false;
    }
    #[cfg(not(scalemem_loom))]
    {
        #[cfg(scalemem_tsan)]
        tsan::before_section();
        // SAFETY: (1) area from this thread. The block is a live repr(C) AddBlock: its
        // first two words are the flags (an AtomicUsize) and the fixed words address,
        // 8-byte aligned. Its `ncpus` words at BLOCK_STRIDE apart lie in the live PerCpu
        // mapping it was built over (`new` checked the stride); (2) passed on.
        unsafe { rseq::add_if_clear_in(area.ptr, (block as *const AddBlock).cast(), mask, ncpus, delta) }
    }
    #[cfg(scalemem_loom)]
    {
        let _ = area;
        let cpu = crate::cpu::current();
        if cpu >= ncpus {
            return false;
        }
        model::section(cpu, || {
            // Acquire: a plain x86 load (see the module documentation).
            if block.flags.load(crate::sync::atomic::Ordering::Acquire) & mask != 0 {
                return false;
            }
            // SAFETY: the block was built over live AtomicIsize words `stride` apart.
            let word = unsafe { &*((block.words + cpu * block.stride) as *const AtomicIsize) };
            // Relaxed load, Release store: the plain `add` to memory; the section lock
            // orders it against every other writer of the word.
            let v = word.load(crate::sync::atomic::Ordering::Relaxed);
            word.store(v.wrapping_add(delta), crate::sync::atomic::Ordering::Release);
            true
        })
    }
}

/// Where a structure's per-CPU blocks are, for [`add_if_key_block`]: the address of CPU
/// 0's block, and the number of blocks (0 when the structure does not use sections).
/// Fixed once built.
#[repr(C)]
pub(crate) struct Blocks {
    base: usize,
    ncpus: usize,
}

impl Blocks {
    /// The blocks of `layout`, used by sections if `sections`.
    pub(crate) fn new(layout: Layout, sections: bool) -> Self {
        let (base, _stride, ncpus) = layout;
        Self { base: base as usize, ncpus: if sections { ncpus } else { 0 } }
    }

    /// Whether the structure uses sections.
    #[inline]
    pub(crate) fn sections(&self) -> bool {
        self.ncpus != 0
    }
}

/// [`rseq::add_if_key_in`] on the blocks `blocks` names, `stride` bytes apart (lock word
/// at offset 0, key word at `key_off`, delta word at `key_off + 8`): the section reads
/// the blocks' address itself. `false`, nothing done, also when the blocks are not used
/// by sections.
///
/// # Safety
/// 1. `area` comes from [`area`] on the calling thread.
/// 2. `blocks` was built from the layout of a live `PerCpu<B>` whose stride is `stride`
///    and whose `B` starts with an `AtomicUsize` lock and has an `AtomicUsize` key at
///    `key_off` followed by an `AtomicIsize` delta.
/// 3. [`rseq::add_if_key`]'s contract (3) holds for those words.
#[inline]
pub(crate) unsafe fn add_if_key_block(
    area: Area,
    blocks: &Blocks,
    stride: usize,
    key_off: usize,
    key: usize,
    delta: isize,
) -> bool {
    let ncpus = blocks.ncpus;
    if ncpus == 0 {
        return false;
    }
    #[cfg(not(scalemem_loom))]
    {
        #[cfg(scalemem_tsan)]
        tsan::before_section();
        // SAFETY: (1)-(3) passed on; the words are 8-byte-aligned atomics in the
        // mapping, and `blocks.base` is a fixed, aligned word that outlives the call.
        unsafe { rseq::add_if_key_in(area.ptr, &blocks.base, stride, ncpus, key_off, key, delta) }
    }
    #[cfg(scalemem_loom)]
    {
        use crate::sync::atomic::Ordering;
        let _ = area;
        let base = blocks.base as *mut u8;
        let cpu = crate::cpu::current();
        if cpu >= ncpus {
            return false;
        }
        model::section(cpu, || {
            // SAFETY: (2) the block of `cpu` has these words at these offsets.
            let (lock, key_word, delta_word) = unsafe {
                let block = base.add(cpu * stride);
                (
                    &*block.cast::<AtomicUsize>(),
                    &*block.add(key_off).cast::<AtomicUsize>(),
                    &*block.add(key_off + 8).cast::<AtomicIsize>(),
                )
            };
            // Acquire: plain x86 loads (module documentation).
            if lock.load(Ordering::Acquire) != 0 || key_word.load(Ordering::Acquire) != key {
                return false;
            }
            // Relaxed/Release: the plain `add` to memory, as in add_if_clear_block.
            let v = delta_word.load(Ordering::Relaxed);
            delta_word.store(v.wrapping_add(delta), Ordering::Release);
            true
        })
    }
}

/// [`rseq::try_lock`]: takes the current CPU's lock word (offset 0 of its block) if it is
/// zero, storing `token`; returns the CPU whose lock was taken.
///
/// # Safety
/// 1. `area` comes from [`area`] on the calling thread.
/// 2. `blocks` is the layout of a live `PerCpu<B>` whose `B` starts with an
///    `AtomicUsize` lock word.
/// 3. [`rseq::try_lock`]'s contract (3) holds for those words.
#[inline]
pub(crate) unsafe fn try_lock(area: Area, blocks: Layout, token: usize) -> Option<usize> {
    let (base, stride, ncpus) = blocks;
    #[cfg(not(scalemem_loom))]
    {
        // SAFETY: (1)-(3) passed on.
        unsafe { rseq::try_lock(area.ptr, base, stride, ncpus, token) }
    }
    #[cfg(scalemem_loom)]
    {
        use crate::sync::atomic::Ordering;
        let _ = area;
        let cpu = crate::cpu::current();
        if cpu >= ncpus {
            return None;
        }
        model::section(cpu, || {
            // SAFETY: (2) the block of `cpu` starts with the lock word.
            let lock = unsafe { &*base.add(cpu * stride).cast::<AtomicUsize>() };
            // Acquire load: the plain `cmp`. The load and the commit are separate steps,
            // so a remote compare-exchange can land between them, as on the machine.
            if lock.load(Ordering::Acquire) != 0 {
                return None;
            }
            // The committing `mov`, modelled as a swap whose result is ignored (Release).
            // loom 0.7 lets a compare-exchange that races with a plain store read the
            // value from before that store and still succeed, after which the storing
            // thread reads the compare-exchange's value: an execution no machine has
            // (it breaks read-modify-write atomicity). A swap is placed last in the
            // modification order when it runs, which is where the store lands once it
            // leaves the store buffer; nothing else in the section reads the word after it.
            let _ = lock.swap(token, Ordering::Release);
            Some(cpu)
        })
    }
}

/// The loom model of sections: per-CPU section locks and the knob that says which model
/// threads have rseq.
#[cfg(scalemem_loom)]
pub(crate) mod model {
    use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};

    /// No thread has sections: every structure takes its atomic paths.
    pub(crate) const NONE: u8 = 0;
    /// Every model thread has sections.
    pub(crate) const ALL: u8 = 1;
    /// Model threads 0 and 1 (the main thread and the first spawned one) have sections,
    /// the others do not: with threads 0 and 2 both on CPU 0, a section and an atomic
    /// access meet on one CPU's words.
    pub(crate) const FIRST_TWO: u8 = 2;

    crate::sync::lazy_static! {
        static ref SECTIONS: AtomicU8 = AtomicU8::new(NONE);
        static ref CPU_LOCKS: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    }

    pub(crate) fn set(which: u8) {
        // SeqCst: set once at the start of a model, before any thread is spawned.
        SECTIONS.store(which, Ordering::SeqCst);
    }

    pub(crate) fn sections() -> u8 {
        // SeqCst: see `set`.
        SECTIONS.load(Ordering::SeqCst)
    }

    /// Runs `body` as a section on `cpu`: no other section on `cpu` runs meanwhile.
    pub(crate) fn section<R>(cpu: usize, body: impl FnOnce() -> R) -> R {
        lock(cpu);
        let result = body();
        unlock(cpu);
        result
    }

    fn lock(cpu: usize) {
        // Acquire: pairs with the Release in `unlock`, ordering this section (or fence)
        // after the previous one on this CPU.
        while CPU_LOCKS[cpu].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            crate::sync::spin_loop();
        }
    }

    fn unlock(cpu: usize) {
        // Release: see `lock`.
        CPU_LOCKS[cpu].store(false, Ordering::Release);
    }

    /// `heavy_rseq`: wait out every running section.
    pub(crate) fn fence() {
        crate::sync::atomic::fence(Ordering::SeqCst);
        for cpu in 0..2 {
            lock(cpu);
            unlock(cpu);
        }
        crate::sync::atomic::fence(Ordering::SeqCst);
    }
}
