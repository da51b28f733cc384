//! Restartable sequences: per-CPU updates that commit with one ordinary store and that
//! the kernel restarts if the thread is preempted, migrated or signalled before the
//! commit, so they need no atomic (`lock`-prefixed) instruction.
//!
//! These are the raw critical sections, written in `asm!` for x86_64 Linux with glibc.
//! The safe structures built on them are [`PerCpuCounter`](crate::cpu::PerCpuCounter)
//! and [`PerCpuStack`](crate::cpu::PerCpuStack); use those unless you are building
//! another per-CPU structure.
//!
//! # Protocol
//!
//! glibc (2.35+) registers a `struct rseq` for every thread with the signature
//! `0x53053053` ([`thread_area`] finds it). Its `cpu_id` field (offset 4) is the CPU
//! the thread runs on, and its `rseq_cs` field (offset 8) points to the descriptor of the
//! critical section the thread is in, or is null. A descriptor, in the `__rseq_cs`
//! section, 32-byte aligned, reads
//!
//! ```text
//! struct rseq_cs { u32 version = 0; u32 flags = 0;
//!                  u64 start_ip; u64 post_commit_offset; u64 abort_ip; }
//! ```
//!
//! Each critical section here has this shape:
//!
//! ```text
//! 2:  (re)arm:  rseq_cs = &descriptor          -- last instruction before start_ip
//! 4:  start_ip: cpu = rseq.cpu_id
//!               bail out (to 9) if cpu >= ncpus, or the stack is full / empty
//!               loads, and stores that are harmless if never committed
//!               the commit: ONE store (or one `add` to memory)
//! 5:  post_commit_ip
//! 9:  done                                    -- the fast path falls through
//!
//!     in section __rseq_failure (out of line, as librseq lays it out):
//!     .byte 0x0f, 0xb9, 0x3d; .long 0x53053053 -- signature: abort_ip - 4 holds it
//! 6:  abort_ip: jmp 2                         -- re-arm and start again
//! ```
//!
//! When the kernel is about to return to user space in a thread that was preempted,
//! migrated, or is about to run a signal handler, it reads `rseq_cs`; if the interrupted
//! instruction pointer lies in `[start_ip, start_ip + post_commit_offset)`, it checks
//! that the four bytes before `abort_ip` equal the registered signature (a mismatch
//! kills the thread with `SIGSEGV`), clears `rseq_cs`, and resumes at `abort_ip` instead
//! (for a signal: the handler runs first, then returns to `abort_ip`). It also rewrites
//! `cpu_id` before the thread runs another user instruction on a new CPU.
//!
//! # Invariants, and why the sections are correct
//!
//! - **The commit is the last instruction of the section.** Every earlier instruction
//!   only reads, or writes registers, or writes memory no reader looks at (a stack slot
//!   beyond `len`). An x86 instruction is never interrupted half-way, so when the kernel
//!   sees the instruction pointer inside the section, the commit has not happened, and
//!   restarting from the top repeats nothing that anyone observed. Once the commit has
//!   executed, the instruction pointer is at `post_commit_ip`, outside the section, and
//!   the kernel leaves the thread alone.
//! - **Aborting before the commit is harmless**, for the same reason: the abort handler
//!   jumps back to the arming store, which re-reads `cpu_id` (possibly a new CPU) and
//!   recomputes everything.
//! - **Only the owning CPU ever writes a slot's rseq-managed words**, and between two
//!   threads that write it the CPU went through a context switch, which is a full
//!   barrier. So a plain `add` to memory or `mov` is as good as an atomic RMW for the
//!   CPU that owns the slot, and a thread that read `cpu_id == c` and then left CPU `c`
//!   is aborted before it can commit to `c`'s slot. Other CPUs may read these words
//!   concurrently (a counter sum, a length hint): an aligned 8-byte `mov` is
//!   single-copy atomic on x86_64, so to the Rust memory model each access in the
//!   sections behaves like a `Relaxed` atomic load or store of the same word, and the
//!   structures declare those words as atomics.
//! - **Ordering.** Within one CPU's slot, the CPU itself serialises every access (x86
//!   stores are seen in program order, and context switches and migrations are full
//!   barriers). A `push` therefore behaves as a Release of the pushed item and a `pop`
//!   as an Acquire: what the pusher wrote before pushing is visible to the popper. The
//!   `asm!` blocks are memory clobbers, so the compiler moves no access across them.
//! - **Arming.** The store of the descriptor's address into `rseq_cs` is the
//!   instruction right before `start_ip`. Preempted before it, the thread has no section
//!   armed (or a stale one whose range does not contain the instruction pointer, which
//!   the kernel clears); preempted after it, the instruction pointer is `start_ip`,
//!   inside the section. There is no window in between. The kernel clears `rseq_cs` on
//!   abort, which is why the abort handler jumps back to the arming store rather than to
//!   `start_ip`. After a section finishes `rseq_cs` keeps pointing at its descriptor,
//!   which is static data; the kernel clears it lazily once it sees the instruction
//!   pointer outside the range.
//! - **The area is valid**: [`thread_area`] computes it on the calling thread from the
//!   thread pointer and glibc's `__rseq_offset`; glibc registered it when the thread
//!   started and unregisters it only when the thread exits, and it lives in the thread's
//!   control block, so it outlives any call on that thread. Passing another thread's
//!   area would be wrong: the kernel only watches the registered area of the running
//!   thread. Every function here therefore takes the area as an argument that must come
//!   from [`thread_area`] on the calling thread, in the same call chain. Inside the
//!   crate, hot paths that chose rseq at construction use `thread_area_unchecked`
//!   instead, which skips the registration check: the address is this thread's area
//!   whether or not the kernel watches it, and an unwatched area's `cpu_id` is
//!   `u32::MAX` (glibc's initial value, and what the kernel writes when the thread
//!   unregisters at exit) or `u32::MAX - 1` (registration failed). Every section compares
//!   the CPU number with `ncpus` right after arming and fails before any other write; the
//!   arming store itself is harmless in an area the kernel ignores.
//! - **Signals**: a signal handler that runs its own critical section arms `rseq_cs`
//!   itself; the interrupted section had already been redirected to its abort handler,
//!   which re-arms. Nesting is therefore safe.
//! - Nothing here allocates, blocks, or touches the stack (`options(nostack)`).
//!
//! # Conditional sections (appended for `refcount`)
//!
//! Three more sections have the same shape, with one or two extra loads between
//! `start_ip` and the commit, each of which can send the section to `9:` without
//! committing:
//!
//! - [`add_if_clear`]: [`add`], but only while `*flags & mask == 0`, where `flags` is a
//!   word shared by all CPUs (a `PercpuRef`'s mode). Because the test is inside the
//!   section, a thread that read "clear" and has not yet committed is restarted by
//!   preemption, migration, a signal, or `membarrier(PRIVATE_EXPEDITED_RSEQ)`
//!   ([`heavy_rseq`](crate::cpu::fence::heavy_rseq)), and then reads the word again. So
//!   once a thread has set a bit of `mask` and `heavy_rseq` has returned `true`, no
//!   section that saw the bit clear can still commit: the per-CPU words are final.
//! - [`add_if_key`]: the hit path of a per-CPU cache. Each CPU's block starts with a
//!   lock word; the section adds to the delta word of an entry only if the lock word is
//!   zero and the entry's key word equals the caller's key.
//! - [`try_lock`]: stores a token into the current CPU's lock word (offset 0 of its
//!   block) if it is zero, and returns that CPU's number. Taking the lock inside a
//!   section means no [`add_if_key`] on that CPU is in flight (it would have been
//!   preempted, so restarted) and none that starts later commits (it sees the token).
//!
//! [`add_if_clear_in`] and [`add_if_key_in`] are the same sections for hot paths: the
//! section itself loads the flags word and the address of CPU 0's word (or block) from
//! a small block the structure keeps on the line its hot path reads anyway, and
//! `add_if_clear_in` multiplies by the constant [`BLOCK_STRIDE`]. Fewer loads stand
//! between the CPU number and the committing `add`: a `PercpuRef` get + put went from
//! about 7 to 5 ns on the AMD host (`BENCHMARKS.md`).
//!
//! The lock word of [`add_if_key`]/[`try_lock`] is the one word here that other threads
//! also write with atomics: a thread on another CPU may take it with a compare-exchange
//! from zero and release it with a store. A remote compare-exchange can land between a
//! [`try_lock`]'s test and its commit, and is then overwritten; a remote locker must
//! therefore call `heavy_rseq` after its compare-exchange and check that the word still
//! holds its own token before it touches the block (the refcount module's `Refcache`
//! does exactly that, and explains why it is enough).
//!
//! # Magazine sections (appended for `umem`)
//!
//! [`mag_pop`], [`mag_push`] and [`mag_exchange`] run on per-CPU *magazine slots*
//! (layout and protocol in [`mag_layout`]): a pop or push of a round in the loaded
//! magazine, and a compare-state transition (swap loaded/previous, install a magazine
//! from the depot) that stores a magazine into a scratch word and commits a new state
//! word. Each tests a per-slot stop word inside the section, so a reconfigurer that sets
//! it and calls [`heavy_rseq`](crate::cpu::fence::heavy_rseq) freezes the slot.
//!
//! On other targets, and under `cfg(scalemem_loom)`, [`thread_area`] is always `None`
//! and the functions report failure (`false` / null) without touching memory, so callers
//! always need their fallback path.

/// This thread's glibc-registered rseq area, or `None` when rseq is disabled
/// (`SCALEMEM_RSEQ=0`, `GLIBC_TUNABLES=glibc.pthread.rseq=0`, a target without our
/// critical sections, loom) or this thread's registration failed.
///
/// The pointer is valid for the calling thread only, as long as it runs; pass it only to
/// the functions of this module, on this thread.
///
/// ```
/// if scalemem::cpu::rseq::thread_area().is_some() {
///     assert!(scalemem::cpu::rseq_enabled());
/// }
/// ```
#[inline]
pub fn thread_area() -> Option<*mut u8> {
    #[cfg(not(scalemem_loom))]
    {
        super::rseq_area()
    }
    #[cfg(scalemem_loom)]
    {
        None
    }
}

/// This thread's rseq area without [`thread_area`]'s checks, for the crate's hot paths
/// (the checks cost as much as a section): for callers that decided on rseq after
/// seeing [`rseq_enabled`](super::rseq_enabled) (a per-process decision that never
/// changes) and pass the area only to the sections of this module, which reject a
/// thread whose registration failed or is over (see "The area is valid" above). Null
/// where there are no sections (their stand-ins ignore the area).
#[inline]
pub(crate) fn thread_area_unchecked() -> *mut u8 {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
    {
        super::rseq_area_unchecked()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
    {
        core::ptr::null_mut()
    }
}

/// This thread's rseq area as an offset from the thread pointer (glibc's
/// `__rseq_offset`, the same for every thread of the process), for the `_tp` sections,
/// which address the area through `fs`: the hot paths then load neither the thread
/// pointer nor glibc's variable through the GOT. The conditions are
/// [`thread_area_unchecked`]'s. 0 where there are no sections (their stand-ins ignore it).
#[inline]
pub(crate) fn thread_offset_unchecked() -> isize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
    {
        super::rseq_offset_unchecked()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
    {
        0
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
pub use x86_64::{add, pop, push};

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
pub use fallback::{add, pop, push};

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod x86_64 {
    use crate::cpu::rseq_abi::{CPU_ID, RSEQ_CS, SIGNATURE};

    /// Adds `delta` to the current CPU's word: the `isize` at `word0 + cpu * stride`
    /// bytes, where `cpu` is read inside the critical section. Returns `false`, having
    /// changed nothing, if the CPU number is not below `ncpus`.
    ///
    /// The update is a non-atomic read-modify-write that the owning CPU commits with one
    /// `add qword ptr [..], reg`; the sum wraps on overflow.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. For every `cpu < ncpus`, `word0.byte_add(cpu * stride)` is valid for reads and
    ///    writes of an 8-byte-aligned `isize` for the duration of the call, and the
    ///    product does not overflow.
    /// 3. Those words are written only by this function (possibly from many threads);
    ///    other code may read them concurrently with atomic loads, but never writes them
    ///    while anyone may call this function on them (an atomic RMW from a thread
    ///    without rseq would race with the plain `add`, losing updates).
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut words = vec![0isize; n]; // stride 8: correct, though CPUs share lines
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `words` holds `n` aligned isizes 8 bytes
    ///     // apart, and nothing else writes them.
    ///     let done = unsafe { rseq::add(area, words.as_mut_ptr(), 8, n, 5) };
    ///     assert!(done);
    ///     assert_eq!(words.iter().sum::<isize>(), 5);
    /// }
    /// ```
    #[inline]
    pub unsafe fn add(area: *mut u8, word0: *mut isize, stride: usize, ncpus: usize, delta: isize) -> bool {
        let ok: u32;
        // SAFETY: the section reads `cpu_id` and writes `rseq_cs` of this thread's live
        // area (1), and adds to the word of a CPU below `ncpus` (2, 3). See the module
        // documentation for why a restart can neither lose nor repeat the update. The
        // block does not use the stack, and declares every register it writes; flags
        // are clobbered (no `preserves_flags`), memory is clobbered (no `nomem`).
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {ok:e}, {ok:e}",
                "2:",
                "lea {cpu}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {cpu}",
                "4:",
                "mov {cpu:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {cpu}, {ncpus}",
                "jae 9f",
                "imul {cpu}, {stride}",
                // The commit.
                "add qword ptr [{word0} + {cpu}], {delta}",
                "5:",
                "mov {ok:e}, 1",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                word0 = in(reg) word0,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                delta = in(reg) delta,
                cpu = out(reg) _,
                ok = out(reg) ok,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        ok != 0
    }

    /// Pushes `item` on the current CPU's stack. Returns `false`, having changed
    /// nothing, if that stack is full or the CPU number is not below `ncpus`.
    ///
    /// The stack of CPU `cpu` has its header at `header0 + cpu * stride` bytes:
    ///
    /// ```text
    /// #[repr(C)] struct Header { len: usize, slots: [*mut (); cap] }
    /// ```
    ///
    /// The section stores `item` into `slots[len]` (beyond `len`, so harmless if never
    /// committed) and commits by storing `len + 1`.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. For every `cpu < ncpus` there is a valid, 8-byte-aligned header of that layout
    ///    with `cap` slots at `header0.byte_add(cpu * stride)`, readable and writable for
    ///    the duration of the call, with `len <= cap`.
    /// 3. While any thread may run [`push`] or [`pop`] on these headers, nothing else
    ///    writes them (other threads may read `len` with atomic loads).
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// #[repr(C)]
    /// struct Header { len: usize, slots: [*mut (); 4] }
    /// let n = possible();
    /// let mut headers: Vec<Header> =
    ///     (0..n).map(|_| Header { len: 0, slots: [std::ptr::null_mut(); 4] }).collect();
    /// let base = headers.as_mut_ptr().cast::<u8>();
    /// let stride = size_of::<Header>();
    /// let mut value = 7u32;
    /// let item = (&raw mut value).cast::<()>();
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `headers` holds `n` valid, empty headers
    ///     // `stride` bytes apart that nothing else touches.
    ///     unsafe {
    ///         if rseq::push(area, base, stride, n, 4, item) {
    ///             // Possibly on another CPU now: the item may sit in another stack.
    ///             let popped = rseq::pop(area, base, stride, n);
    ///             assert!(popped.is_null() || popped == item);
    ///         }
    ///     }
    ///     assert!(headers.iter().map(|h| h.len).sum::<usize>() <= 1);
    /// }
    /// ```
    #[inline]
    pub unsafe fn push(
        area: *mut u8,
        header0: *mut u8,
        stride: usize,
        ncpus: usize,
        cap: usize,
        item: *mut (),
    ) -> bool {
        let ok: u32;
        // SAFETY: as in `add`: this thread's live area (1); the header of a CPU below
        // `ncpus` (2), written only by these sections (3). The slot store lands beyond
        // `len`, where no reader looks, and is only published by the committing store of
        // `len + 1`, the last instruction of the section.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {ok:e}, {ok:e}",
                "2:",
                "lea {hdr}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {hdr}",
                "4:",
                "mov {hdr:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {hdr}, {ncpus}",
                "jae 9f",
                "imul {hdr}, {stride}",
                "add {hdr}, {header0}",
                "mov {len}, qword ptr [{hdr}]",
                "cmp {len}, {cap}",
                "jae 9f",
                "mov qword ptr [{hdr} + 8*{len} + 8], {item}",
                "add {len}, 1",
                // The commit.
                "mov qword ptr [{hdr}], {len}",
                "5:",
                "mov {ok:e}, 1",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                header0 = in(reg) header0,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                cap = in(reg) cap,
                item = in(reg) item,
                hdr = out(reg) _,
                len = out(reg) _,
                ok = out(reg) ok,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        ok != 0
    }

    /// Pops the top item of the current CPU's stack (layout as for [`push`]). Returns
    /// null, having changed nothing, if that stack is empty or the CPU number is not
    /// below `ncpus`.
    ///
    /// The section loads `slots[len - 1]` into a register and commits by storing
    /// `len - 1`; the item is returned only once the commit has executed, so an aborted
    /// attempt never hands out an item that stays on the stack.
    ///
    /// # Safety
    /// As for [`push`].
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut headers = vec![0usize; 2 * n]; // { len, slots: [_; 1] } per CPU
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `headers` holds `n` empty one-slot
    ///     // headers 16 bytes apart that nothing else touches.
    ///     let popped = unsafe { rseq::pop(area, headers.as_mut_ptr().cast(), 16, n) };
    ///     assert!(popped.is_null());
    /// }
    /// ```
    #[inline]
    pub unsafe fn pop(area: *mut u8, header0: *mut u8, stride: usize, ncpus: usize) -> *mut () {
        let item: *mut ();
        // SAFETY: as in `push`. The item register is zeroed at every (re)start, loaded
        // from below `len`, and the only store is the commit of `len - 1`.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "2:",
                "xor {item:e}, {item:e}",
                "lea {hdr}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {hdr}",
                "4:",
                "mov {hdr:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {hdr}, {ncpus}",
                "jae 9f",
                "imul {hdr}, {stride}",
                "add {hdr}, {header0}",
                "mov {len}, qword ptr [{hdr}]",
                "test {len}, {len}",
                "jz 9f",
                // slots[len - 1] is at hdr + 8 + 8 * (len - 1) = hdr + 8 * len.
                "mov {item}, qword ptr [{hdr} + 8*{len}]",
                "sub {len}, 1",
                // The commit.
                "mov qword ptr [{hdr}], {len}",
                "5:",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                header0 = in(reg) header0,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                hdr = out(reg) _,
                len = out(reg) _,
                item = out(reg) item,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        item
    }
}

/// Targets without our critical sections: every operation reports failure and touches
/// nothing. [`thread_area`] is always `None` there, so these are never reached through
/// the safe structures.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
mod fallback {
    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut words = vec![0isize; n];
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::add(std::ptr::null_mut(), words.as_mut_ptr(), 8, n, 5) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn add(_area: *mut u8, _word0: *mut isize, _stride: usize, _ncpus: usize, _delta: isize) -> bool {
        false
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut headers = vec![0usize; 2 * n]; // { len, slots: [_; 1] } per CPU
    /// let mut value = 7u32;
    /// let item = (&raw mut value).cast::<()>();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let pushed = unsafe { rseq::push(std::ptr::null_mut(), headers.as_mut_ptr().cast(), 16, n, 1, item) };
    /// assert!(!pushed); // the caller takes its fallback path
    /// assert!(headers.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn push(
        _area: *mut u8,
        _header0: *mut u8,
        _stride: usize,
        _ncpus: usize,
        _cap: usize,
        _item: *mut (),
    ) -> bool {
        false
    }

    /// No rseq on this target: returns null and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut value = 7u32;
    /// // One full one-slot stack per CPU: { len: 1, slots: [&value] }.
    /// let mut headers: Vec<usize> = (0..n).flat_map(|_| [1, (&raw mut value) as usize]).collect();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let popped = unsafe { rseq::pop(std::ptr::null_mut(), headers.as_mut_ptr().cast(), 16, n) };
    /// assert!(popped.is_null()); // nothing popped: the caller takes its fallback path
    /// assert!(headers.chunks(2).all(|h| h[0] == 1));
    /// ```
    #[inline]
    pub unsafe fn pop(_area: *mut u8, _header0: *mut u8, _stride: usize, _ncpus: usize) -> *mut () {
        core::ptr::null_mut()
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod tests {
    use super::*;

    #[repr(C, align(128))]
    struct Header {
        len: usize,
        slots: [*mut (); 2],
    }

    #[test]
    fn sections_work_on_one_thread() {
        let Some(area) = thread_area() else { return };
        let n = crate::cpu::possible();
        let mut words = vec![0isize; n * 16];
        for _ in 0..1000 {
            // SAFETY: this thread's area; n words 128 bytes apart, written only here.
            assert!(unsafe { add(area, words.as_mut_ptr(), 128, n, 3) });
        }
        // SAFETY: as above.
        assert!(unsafe { add(area, words.as_mut_ptr(), 128, n, -1) });
        assert_eq!(words.iter().sum::<isize>(), 2999);
        // ncpus = 0: every CPU number is out of range, nothing happens.
        // SAFETY: no word is touched when ncpus is 0.
        assert!(!unsafe { add(area, words.as_mut_ptr(), 128, 0, 1) });
        assert_eq!(words.iter().sum::<isize>(), 2999);

        let mut headers: Vec<Header> = (0..n).map(|_| Header { len: 0, slots: [core::ptr::null_mut(); 2] }).collect();
        let base = headers.as_mut_ptr().cast::<u8>();
        let stride = size_of::<Header>();
        let a = core::ptr::without_provenance_mut::<()>(0x1000);
        // Pin so the current CPU's stack stays the same one.
        let original = rustix::thread::sched_getaffinity(None).unwrap();
        let mut one = rustix::thread::CpuSet::new();
        one.set(crate::cpu::current());
        rustix::thread::sched_setaffinity(None, &one).unwrap();
        // SAFETY: this thread's area; n valid two-slot headers `stride` apart.
        unsafe {
            assert!(pop(area, base, stride, n).is_null());
            assert!(push(area, base, stride, n, 2, a));
            assert!(push(area, base, stride, n, 2, a.wrapping_byte_add(8)));
            assert!(!push(area, base, stride, n, 2, a.wrapping_byte_add(16)));
            assert!(!push(area, base, stride, 0, 2, a));
            assert!(pop(area, base, stride, 0).is_null());
            assert_eq!(pop(area, base, stride, n), a.wrapping_byte_add(8));
            assert_eq!(pop(area, base, stride, n), a);
            assert!(pop(area, base, stride, n).is_null());
        }
        rustix::thread::sched_setaffinity(None, &original).unwrap();
        assert!(headers.iter().all(|h| h.len == 0));
    }
}

// --- Conditional sections for `refcount` (appended; see "Conditional sections" above) ---

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
pub use x86_64_conditional::{add_if_clear, add_if_clear_in, add_if_key, add_if_key_in, try_lock};

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
pub use fallback_conditional::{add_if_clear, add_if_clear_in, add_if_key, add_if_key_in, try_lock};

/// The distance in bytes between two CPUs' words for [`add_if_clear_in`]: the slot
/// stride of a [`PerCpu`](crate::cpu::PerCpu) of any type of at most 128 bytes.
pub const BLOCK_STRIDE: usize = 1 << BLOCK_SHIFT;
/// `log2(`[`BLOCK_STRIDE`]`)`.
pub const BLOCK_SHIFT: u32 = 7;

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod x86_64_conditional {
    use crate::cpu::rseq_abi::{CPU_ID, RSEQ_CS, SIGNATURE};

    /// Adds `delta` to the current CPU's word (as [`add`](super::add)) only if
    /// `*flags & mask == 0`, testing the flags inside the critical section. Returns
    /// `false`, having changed nothing, if a bit of `mask` is set or the CPU number is not
    /// below `ncpus`.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. `flags` is valid for 8-byte-aligned reads for the duration of the call (other
    ///    threads may write it with atomics at any time).
    /// 3. For every `cpu < ncpus`, `word0.byte_add(cpu * stride)` is valid for reads and
    ///    writes of an 8-byte-aligned `isize` for the duration of the call, and the
    ///    product does not overflow.
    /// 4. Those words are written only by this function and [`add`](super::add), or by
    ///    code that knows no section can commit to them (a bit of `mask` has been set and
    ///    [`heavy_rseq`](crate::cpu::fence::heavy_rseq) has since returned `true`); other
    ///    code may read them with atomic loads at any time.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    /// use std::sync::atomic::AtomicUsize;
    ///
    /// let n = possible();
    /// let mut words = vec![0isize; n];
    /// let flags = AtomicUsize::new(0);
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `flags` is a live word; `words` holds `n`
    ///     // aligned isizes 8 bytes apart that only these sections write.
    ///     unsafe {
    ///         assert!(rseq::add_if_clear(area, flags.as_ptr(), 1, words.as_mut_ptr(), 8, n, 5));
    ///         flags.store(1, std::sync::atomic::Ordering::SeqCst);
    ///         assert!(!rseq::add_if_clear(area, flags.as_ptr(), 1, words.as_mut_ptr(), 8, n, 5));
    ///     }
    ///     assert_eq!(words.iter().sum::<isize>(), 5);
    /// }
    /// ```
    #[inline]
    pub unsafe fn add_if_clear(
        area: *mut u8,
        flags: *const usize,
        mask: usize,
        word0: *mut isize,
        stride: usize,
        ncpus: usize,
        delta: isize,
    ) -> bool {
        let ok: u32;
        // SAFETY: as in `add`: this thread's live area (1), the word of a CPU below
        // `ncpus` (3, 4); the flags word is only read (2). The test of the flags lies
        // between start_ip and the commit, so a thread that read them clear and is
        // preempted, migrated, signalled or fenced before committing restarts and reads
        // them again. The block does not use the stack and declares every register it
        // writes; flags and memory are clobbered.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {ok:e}, {ok:e}",
                "2:",
                "lea {cpu}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {cpu}",
                "4:",
                "mov {cpu:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {cpu}, {ncpus}",
                "jae 9f",
                "test qword ptr [{flags}], {mask}",
                "jnz 9f",
                "imul {cpu}, {stride}",
                // The commit.
                "add qword ptr [{word0} + {cpu}], {delta}",
                "5:",
                "mov {ok:e}, 1",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                flags = in(reg) flags,
                mask = in(reg) mask,
                word0 = in(reg) word0,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                delta = in(reg) delta,
                cpu = out(reg) _,
                ok = out(reg) ok,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        ok != 0
    }

    /// [`add_if_clear`] for a structure that keeps what the section reads in one block
    /// of two words: `block[0]` is the flags word, `block[1]` the address of CPU 0's
    /// word; CPU `cpu`'s word is [`BLOCK_STRIDE`](super::BLOCK_STRIDE)` * cpu` bytes
    /// further. Adds `delta` to the current CPU's word only if `block[0] & mask == 0`
    /// and the CPU number is below `ncpus`; otherwise returns `false`, having changed
    /// nothing.
    ///
    /// The section reads both words itself, and the stride is a constant: on the hot
    /// path the caller passes one pointer, and the address of the word depends on
    /// fewer loads than with [`add_if_clear`] (a get + put pair of
    /// [`PercpuRef`](crate::refcount::PercpuRef) got about a quarter faster).
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. `block` is valid for 8-byte-aligned reads of two words for the duration of the
    ///    call; the second word does not change while anyone may call this function
    ///    with `block` (other threads may write the flags word with atomics).
    /// 3. For every `cpu < ncpus`, the `isize` at `block[1] + cpu * BLOCK_STRIDE` obeys
    ///    [`add_if_clear`]'s (3) and (4).
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let stride = rseq::BLOCK_STRIDE / 8;
    /// let mut words = vec![0isize; n * stride];
    /// let block = [0usize, words.as_mut_ptr() as usize]; // flags clear
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `block` names `n` aligned isizes
    ///     // BLOCK_STRIDE bytes apart that only these sections write.
    ///     unsafe {
    ///         assert!(rseq::add_if_clear_in(area, block.as_ptr(), 1, n, 5));
    ///         assert!(!rseq::add_if_clear_in(area, [1, block[1]].as_ptr(), 1, n, 5));
    ///     }
    ///     assert_eq!(words.iter().sum::<isize>(), 5);
    /// }
    /// ```
    #[inline]
    pub unsafe fn add_if_clear_in(area: *mut u8, block: *const usize, mask: usize, ncpus: usize, delta: isize) -> bool {
        let ok: u32;
        // SAFETY: as in `add_if_clear`: this thread's live area (1), the word of a CPU
        // below `ncpus` (3); the block's two words are only read (2). The tests of the
        // CPU number and of the flags lie between start_ip and the commit, which is the
        // last instruction. No stack use; every written register is declared; flags and
        // memory are clobbered.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {ok:e}, {ok:e}",
                "2:",
                "lea {cpu}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {cpu}",
                "4:",
                "mov {cpu:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {cpu}, {ncpus}",
                "jae 9f",
                "test qword ptr [{block}], {mask}",
                "jnz 9f",
                "shl {cpu}, {shift}",
                "add {cpu}, qword ptr [{block} + 8]",
                // The commit.
                "add qword ptr [{cpu}], {delta}",
                "5:",
                "mov {ok:e}, 1",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                block = in(reg) block,
                mask = in(reg) mask,
                ncpus = in(reg) ncpus,
                delta = in(reg) delta,
                cpu = out(reg) _,
                ok = out(reg) ok,
                shift = const super::BLOCK_SHIFT,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        ok != 0
    }

    /// The hit path of a per-CPU cache. The current CPU's block is at
    /// `base + cpu * stride`; its first word is a lock (0 = free). If the lock is free
    /// and the word at `block + key_off` equals `key`, adds `delta` (wrapping) to the
    /// word right after it, at `block + key_off + 8`, and returns `true`. Otherwise
    /// (lock held, another key, CPU number not below `ncpus`) returns `false`, having
    /// changed nothing.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. For every `cpu < ncpus`, the block at `base.byte_add(cpu * stride)` is valid for
    ///    8-byte-aligned reads of its lock word and of the key word at `key_off`, and for
    ///    reads and writes of the delta word at `key_off + 8`, for the duration of the
    ///    call; the offsets do not overflow.
    /// 3. A block's key and delta words are written only by this function, or by the
    ///    holder of the block's lock taken either with [`try_lock`] or remotely (a
    ///    compare-exchange from zero followed by a successful
    ///    [`heavy_rseq`](crate::cpu::fence::heavy_rseq) and a re-check of the token; see
    ///    the module documentation). Other code may read them with atomic loads.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut blocks = vec![[0usize; 3]; n]; // { lock, key, delta } per CPU
    /// for block in &mut blocks { block[1] = 42; }
    /// if let Some(area) = rseq::thread_area() {
    ///     let base = blocks.as_mut_ptr().cast::<u8>();
    ///     // SAFETY: `area` is this thread's; `blocks` holds `n` free blocks 24 bytes
    ///     // apart that only these sections write.
    ///     unsafe {
    ///         assert!(rseq::add_if_key(area, base, 24, n, 8, 42, 3));
    ///         assert!(!rseq::add_if_key(area, base, 24, n, 8, 7, 3)); // another key
    ///     }
    ///     assert_eq!(blocks.iter().map(|b| b[2]).sum::<usize>(), 3);
    /// }
    /// ```
    #[inline]
    pub unsafe fn add_if_key(
        area: *mut u8,
        base: *mut u8,
        stride: usize,
        ncpus: usize,
        key_off: usize,
        key: usize,
        delta: isize,
    ) -> bool {
        // The same section, with the base in a word of our own that the section reads.
        let base_word = base as usize;
        // SAFETY: the caller's (1)-(3); `base_word` is an aligned local that outlives the
        // call and does not change.
        unsafe { add_if_key_in(area, &base_word, stride, ncpus, key_off, key, delta) }
    }

    /// [`add_if_key`] for a structure that keeps the address of CPU 0's block in a word
    /// the section reads itself (`*base_word`), next to whatever else its hot path
    /// reads: the block address then depends on one load fewer before the section (see
    /// [`add_if_clear_in`]). Otherwise the same: if the current CPU's lock is free and
    /// its key word at `key_off` equals `key`, adds `delta` to the word after it.
    ///
    /// # Safety
    /// As [`add_if_key`], with `base` the value of `*base_word`, which is valid for an
    /// 8-byte-aligned read for the duration of the call and does not change while
    /// anyone may call this function with it.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut blocks = vec![[0usize; 3]; n]; // { lock, key, delta } per CPU
    /// for block in &mut blocks { block[1] = 42; }
    /// let base_word = blocks.as_mut_ptr() as usize;
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `base_word` names `n` free blocks 24 bytes
    ///     // apart that only these sections write.
    ///     unsafe {
    ///         assert!(rseq::add_if_key_in(area, &base_word, 24, n, 8, 42, 3));
    ///         assert!(!rseq::add_if_key_in(area, &base_word, 24, n, 8, 7, 3)); // another key
    ///     }
    ///     assert_eq!(blocks.iter().map(|b| b[2]).sum::<usize>(), 3);
    /// }
    /// ```
    #[inline]
    pub unsafe fn add_if_key_in(
        area: *mut u8,
        base_word: *const usize,
        stride: usize,
        ncpus: usize,
        key_off: usize,
        key: usize,
        delta: isize,
    ) -> bool {
        let ok: u32;
        // SAFETY: as in `add_if_key`; the base word is only read.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "xor {ok:e}, {ok:e}",
                "2:",
                "lea {blk}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {blk}",
                "4:",
                "mov {blk:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {blk}, {ncpus}",
                "jae 9f",
                "imul {blk}, {stride}",
                "add {blk}, qword ptr [{base_word}]",
                "cmp qword ptr [{blk}], 0",
                "jne 9f",
                "cmp qword ptr [{blk} + {key_off}], {key}",
                "jne 9f",
                // The commit.
                "add qword ptr [{blk} + {key_off} + 8], {delta}",
                "5:",
                "mov {ok:e}, 1",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                base_word = in(reg) base_word,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                key_off = in(reg) key_off,
                key = in(reg) key,
                delta = in(reg) delta,
                blk = out(reg) _,
                ok = out(reg) ok,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        ok != 0
    }

    /// Takes the current CPU's lock: if the word at `base + cpu * stride` is zero, stores
    /// `token` there (the commit) and returns `Some(cpu)`. Returns `None`, having changed
    /// nothing, if the word is not zero or the CPU number is not below `ncpus`.
    ///
    /// The caller holds the lock from then on, wherever it runs (it may migrate at once),
    /// and releases it with an atomic store of zero.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. For every `cpu < ncpus`, `base.byte_add(cpu * stride)` is valid for reads and
    ///    writes of an 8-byte-aligned `usize` for the duration of the call, and the
    ///    product does not overflow.
    /// 3. Other threads write these words only by releasing a lock they hold (a store of
    ///    zero) or by taking one with a compare-exchange from zero; a thread that takes a
    ///    lock that way must not rely on it before
    ///    [`heavy_rseq`](crate::cpu::fence::heavy_rseq) has returned `true` and the word
    ///    still holds its token (module documentation).
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let n = possible();
    /// let mut locks = vec![0usize; n];
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: `area` is this thread's; `locks` holds `n` aligned words.
    ///     if let Some(cpu) = unsafe { rseq::try_lock(area, locks.as_mut_ptr().cast(), 8, n, 1) } {
    ///         assert_eq!(locks[cpu], 1);
    ///         locks[cpu] = 0; // release
    ///     }
    /// }
    /// ```
    #[inline]
    pub unsafe fn try_lock(area: *mut u8, base: *mut u8, stride: usize, ncpus: usize, token: usize) -> Option<usize> {
        let locked: usize;
        // SAFETY: this thread's live area (1), the lock word of a CPU below `ncpus` (2).
        // The test of the word lies between start_ip and the committing store, so a
        // section that saw it free and did not commit restarts; a remote writer is
        // handled by the contract (3).
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "mov {locked}, -1",
                "2:",
                "lea {off}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {off}",
                "4:",
                "mov {cpu:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {cpu}, {ncpus}",
                "jae 9f",
                "mov {off}, {cpu}",
                "imul {off}, {stride}",
                "cmp qword ptr [{base} + {off}], 0",
                "jne 9f",
                // The commit.
                "mov qword ptr [{base} + {off}], {token}",
                "5:",
                "mov {locked}, {cpu}",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                base = in(reg) base,
                stride = in(reg) stride,
                ncpus = in(reg) ncpus,
                token = in(reg) token,
                cpu = out(reg) _,
                off = out(reg) _,
                locked = out(reg) locked,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        (locked != usize::MAX).then_some(locked)
    }
}

/// Targets without our critical sections: every operation reports failure and touches
/// nothing ([`thread_area`] is always `None` there).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
mod fallback_conditional {
    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::add_if_clear(std::ptr::null_mut(), base, 1, base.cast(), 8, possible(), 5) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn add_if_clear(
        _area: *mut u8,
        _flags: *const usize,
        _mask: usize,
        _word0: *mut isize,
        _stride: usize,
        _ncpus: usize,
        _delta: isize,
    ) -> bool {
        false
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::add_if_clear_in(std::ptr::null_mut(), base, 1, possible(), 5) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn add_if_clear_in(
        _area: *mut u8,
        _block: *const usize,
        _mask: usize,
        _ncpus: usize,
        _delta: isize,
    ) -> bool {
        false
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::add_if_key_in(std::ptr::null_mut(), base, 128, possible(), 8, 42, 5) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn add_if_key_in(
        _area: *mut u8,
        _base_word: *const usize,
        _stride: usize,
        _ncpus: usize,
        _key_off: usize,
        _key: usize,
        _delta: isize,
    ) -> bool {
        false
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::add_if_key(std::ptr::null_mut(), base.cast(), 128, possible(), 8, 42, 5) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn add_if_key(
        _area: *mut u8,
        _base: *mut u8,
        _stride: usize,
        _ncpus: usize,
        _key_off: usize,
        _key: usize,
        _delta: isize,
    ) -> bool {
        false
    }

    /// No rseq on this target: returns `None` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::try_lock(std::ptr::null_mut(), base.cast(), 128, possible(), 7) };
    /// assert_eq!(done, None); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn try_lock(
        _area: *mut u8,
        _base: *mut u8,
        _stride: usize,
        _ncpus: usize,
        _token: usize,
    ) -> Option<usize> {
        None
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod conditional_tests {
    use super::*;

    #[test]
    fn conditional_sections_work_on_one_thread() {
        let Some(area) = thread_area() else { return };
        let n = crate::cpu::possible();
        // add_if_clear: 16 words per CPU (128 bytes apart).
        let mut words = vec![0isize; n * 16];
        let flags = 0usize;
        let mut set = 0usize;
        // SAFETY: this thread's area; `flags`/`set` are live words; n words 128 bytes
        // apart written only here.
        unsafe {
            assert!(add_if_clear(area, &flags, 1, words.as_mut_ptr(), 128, n, 4));
            assert!(add_if_clear(area, &flags, 1, words.as_mut_ptr(), 128, n, -1));
            set = core::hint::black_box(set | 2);
            assert!(add_if_clear(area, &set, 1, words.as_mut_ptr(), 128, n, 100)); // bit 1 not in mask
            set = core::hint::black_box(set | 1);
            assert!(!add_if_clear(area, &set, 1, words.as_mut_ptr(), 128, n, 100));
            assert!(!add_if_clear(area, &flags, 1, words.as_mut_ptr(), 128, 0, 100));
        }
        assert_eq!(words.iter().sum::<isize>(), 103);

        // Blocks of 16 words: lock at 0, key at 8, delta at 9 (word offsets).
        let mut blocks = vec![0usize; n * 16];
        for cpu in 0..n {
            blocks[cpu * 16 + 8] = 0xABC0;
        }
        let base = blocks.as_mut_ptr().cast::<u8>();
        // Pin so that the lock we take is the block we then test.
        let original = rustix::thread::sched_getaffinity(None).unwrap();
        let mut one = rustix::thread::CpuSet::new();
        one.set(crate::cpu::current());
        rustix::thread::sched_setaffinity(None, &one).unwrap();
        // SAFETY: this thread's area; n blocks of 128 bytes, written only here.
        unsafe {
            assert!(add_if_key(area, base, 128, n, 64, 0xABC0, 5));
            assert!(add_if_key(area, base, 128, n, 64, 0xABC0, -2));
            assert!(!add_if_key(area, base, 128, n, 64, 0xDEF0, 5));
            assert!(!add_if_key(area, base, 128, 0, 64, 0xABC0, 5));
            let cpu = try_lock(area, base, 128, n, 7).expect("the lock is free");
            assert_eq!(try_lock(area, base, 128, n, 7), None);
            assert!(!add_if_key(area, base, 128, n, 64, 0xABC0, 5)); // locked
            assert_eq!(blocks[cpu * 16], 7);
            base.byte_add(cpu * 128).cast::<usize>().write_volatile(0);
            assert!(add_if_key(area, base, 128, n, 64, 0xABC0, 1));
            assert_eq!(try_lock(area, base, 128, 0, 7), None);
        }
        rustix::thread::sched_setaffinity(None, &original).unwrap();
        assert_eq!((0..n).map(|cpu| blocks[cpu * 16 + 9] as isize).sum::<isize>(), 4);
    }
}

// --- Magazine sections for `umem` (appended; see "Magazine sections" below) ---

/// The layout the magazine sections ([`mag_pop`], [`mag_push`], [`mag_exchange`]) work
/// on: one *magazine slot* per CPU and the magazines it points to. `umem`'s per-CPU
/// caches are built on it; the constants are public so that their layout can be checked
/// against these at compile time.
///
/// # Magazine sections
///
/// Slots are [`SLOT_STRIDE`](mag_layout::SLOT_STRIDE) (128) bytes apart, CPU 0's first
/// (the spacing of [`PerCpu`](crate::cpu::PerCpu) for any slot of up to 128 bytes, so a
/// section finds its slot with a shift). A CPU's slot holds three words the sections use,
/// at these byte offsets:
///
/// ```text
/// STOP  (0):  0 while the fast path may run; non-zero while a reconfiguration owns the
///             slot. Sections only read it; they fail, changing nothing, when it is set.
/// STATE (8):  the packed state word (below); every section commits by storing it.
/// MAGS (16):  three magazine pointers; STATE says which one is "loaded", which one is
///             "previous"; the third is unreferenced (scratch for an exchange).
/// ```
///
/// The state word packs `rounds` (bits 0..16: rounds in the loaded magazine), `cap`
/// (bits 16..32: the loaded magazine's capacity, at most [`MAX_CAP`](mag_layout::MAX_CAP),
/// 0 when no magazine is loaded), the previous index (bits 32..40), the previous
/// magazine's rounds (bits 40..48) and capacity (bits 48..56, 0 when absent), and the
/// loaded index (bits 56..64). The hit sections get each field they need with one shift
/// and no mask: the loaded index is the top byte, and `rounds < cap` is a 16-bit compare
/// of the word with itself shifted by 16. (Reading the fields from the slot instead, with
/// narrower loads of the word the last section stored, measured slower: such a load waits
/// on store forwarding.) A magazine's rounds are the pointers at byte offset
/// [`ROUNDS`](mag_layout::ROUNDS) of the magazine, 8 bytes apart.
///
/// - [`mag_pop`]: if `rounds > 0`, loads `loaded.rounds[rounds - 1]` and commits
///   `STATE - 1`.
/// - [`mag_push`]: if `rounds < cap`, stores the item into `loaded.rounds[rounds]` (a
///   word beyond the count, which nobody reads) and commits `STATE + 1`. With `cap = 0`
///   (nothing loaded) it always fails, so it never touches a missing magazine.
/// - [`mag_exchange`]: if `STATE == expected`, stores a pointer into a magazine word the
///   expected state does not reference, loads another magazine word, and commits `new`.
///   Every other transition of a slot (swapping loaded and previous, installing a
///   magazine from the depot and evicting the previous one) is one such exchange.
///
/// Because every section tests `STOP` between `start_ip` and its commit, a thread that
/// sets `STOP` and then calls [`heavy_rseq`](crate::cpu::fence::heavy_rseq) (which
/// returned `true`) knows that no section that saw `STOP == 0` can still commit: the
/// slot is frozen until it clears `STOP`.
pub mod mag_layout {
    /// Bytes between two CPUs' slots.
    pub const SLOT_STRIDE: usize = 1 << SLOT_SHIFT;
    /// log2 of [`SLOT_STRIDE`].
    pub const SLOT_SHIFT: u32 = 7;
    /// Byte offset of the stop word in a CPU's magazine slot.
    pub const STOP: usize = 0;
    /// Byte offset of the state word in a CPU's magazine slot.
    pub const STATE: usize = 8;
    /// Byte offset of the three magazine pointers in a CPU's magazine slot.
    pub const MAGS: usize = 16;
    /// Byte offset of the rounds array in a magazine.
    pub const ROUNDS: usize = 64;
    /// Mask of the loaded magazine's round count in the state word.
    pub const ROUNDS_MASK: u64 = 0xFFFF;
    /// Shift of the loaded magazine's capacity (16 bits) in the state word.
    pub const CAP_SHIFT: u32 = 16;
    /// Mask of the capacity field, shifted down.
    pub const CAP_MASK: u64 = 0xFFFF;
    /// Shift of the previous magazine's index (8 bits) in the state word.
    pub const PREV_SHIFT: u32 = 32;
    /// Shift of the previous magazine's round count (8 bits) in the state word.
    pub const PREV_ROUNDS_SHIFT: u32 = 40;
    /// Shift of the previous magazine's capacity (8 bits) in the state word.
    pub const PREV_CAP_SHIFT: u32 = 48;
    /// Shift of the loaded magazine's index (8 bits, the top ones) in the state word.
    pub const LOADED_SHIFT: u32 = 56;
    /// Mask of each 8-bit field (loaded and previous index, previous rounds and
    /// capacity), shifted down.
    pub const BYTE_MASK: u64 = 0xFF;
    /// The largest magazine capacity the state word can describe.
    pub const MAX_CAP: usize = 255;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
pub use x86_64_magazine::{mag_exchange, mag_pop, mag_push};
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
pub(crate) use x86_64_magazine::{mag_pop_tp, mag_push_tp};

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
pub use fallback_magazine::{mag_exchange, mag_pop, mag_push};
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
pub(crate) use fallback_magazine::{mag_pop_tp, mag_push_tp};

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod x86_64_magazine {
    use super::mag_layout::{CAP_SHIFT, LOADED_SHIFT, MAGS, ROUNDS, SLOT_SHIFT, STATE, STOP};
    use crate::cpu::rseq_abi::{CPU_ID, RSEQ_CS, SIGNATURE};

    /// The body of [`mag_pop`] and [`mag_pop_tp`]: `$seg` is the segment prefix of the
    /// two rseq-area accesses (`""`: `$area` is the area's address; `"fs:"`: its offset
    /// from the thread pointer), so both address forms share one section text.
    macro_rules! mag_pop_asm {
        ($seg:literal, $area:expr, $base:expr, $ncpus:expr, $item:ident) => {
            {
                core::arch::asm!(
                    ".pushsection __rseq_cs, \"aw\"",
                    ".balign 32",
                    "3:",
                    ".long 0, 0",
                    ".quad 4f, (5f - 4f), 6f",
                    ".popsection",
                    "2:",
                    "xor {item:e}, {item:e}",
                    "lea {slot}, [rip + 3b]",
                    concat!("mov qword ptr ", $seg, "[{area} + {rseq_cs}], {slot}"),
                    "4:",
                    concat!("mov {slot:e}, dword ptr ", $seg, "[{area} + {cpu_id}]"),
                    "cmp {slot}, {ncpus}",
                    "jae 9f",
                    "shl {slot}, {slot_shift}",
                    "add {slot}, {base}",
                    "cmp qword ptr [{slot} + {stop}], 0",
                    "jne 9f",
                    "mov {st}, qword ptr [{slot} + {state}]",
                    "movzx {n:e}, {st:x}",
                    "test {n:e}, {n:e}",
                    "jz 9f",
                    // The item register holds the magazine first: no failure exit follows
                    // before the commit, and an abort restarts at 2, which clears it. The
                    // loaded index is the state's top byte.
                    "mov {item}, {st}",
                    "shr {item}, {loaded_shift}",
                    "mov {item}, qword ptr [{slot} + 8*{item} + {mags}]",
                    "mov {item}, qword ptr [{item} + 8*{n} + {rounds_m8}]",
                    "sub {st}, 1",
                    // The commit.
                    "mov qword ptr [{slot} + {state}], {st}",
                    "5:",
                    // The abort handler, out of line (librseq's layout): the success path falls
                    // through, and the signature sits in the four bytes before it.
                    ".pushsection __rseq_failure, \"ax\"",
                    ".byte 0x0f, 0xb9, 0x3d",
                    ".long {signature}",
                    "6:",
                    "jmp 2b",
                    ".popsection",
                    "9:",
                    area = in(reg) $area,
                    base = in(reg) $base,
                    ncpus = in(reg) $ncpus,
                    slot = out(reg) _,
                    st = out(reg) _,
                    n = out(reg) _,
                    item = out(reg) $item,
                    stop = const STOP,
                    state = const STATE,
                    mags = const MAGS,
                    rounds_m8 = const ROUNDS - 8,
                    loaded_shift = const LOADED_SHIFT,
                    slot_shift = const SLOT_SHIFT,
                    rseq_cs = const RSEQ_CS,
                    cpu_id = const CPU_ID,
                    signature = const SIGNATURE,
                    options(nostack),
                );
            }
        };
    }

    /// The body of [`mag_push`] and [`mag_push_tp`] (see `mag_pop_asm`).
    macro_rules! mag_push_asm {
        ($seg:literal, $area:expr, $base:expr, $ncpus:expr, $item:expr) => {
            {
                core::arch::asm!(
                    ".pushsection __rseq_cs, \"aw\"",
                    ".balign 32",
                    "3:",
                    ".long 0, 0",
                    ".quad 4f, (5f - 4f), 6f",
                    ".popsection",
                    "2:",
                    "lea {slot}, [rip + 3b]",
                    concat!("mov qword ptr ", $seg, "[{area} + {rseq_cs}], {slot}"),
                    "4:",
                    concat!("mov {slot:e}, dword ptr ", $seg, "[{area} + {cpu_id}]"),
                    "cmp {slot}, {ncpus}",
                    "jae {fail}",
                    "shl {slot}, {slot_shift}",
                    "add {slot}, {base}",
                    "cmp qword ptr [{slot} + {stop}], 0",
                    "jne {fail}",
                    "mov {st}, qword ptr [{slot} + {state}]",
                    // rounds < cap: a 16-bit compare of the low field with the next one (cap
                    // 0, nothing loaded, always fails).
                    "mov {t}, {st}",
                    "shr {t}, {cap_shift}",
                    "cmp {st:x}, {t:x}",
                    "jae {fail}",
                    "movzx {n:e}, {st:x}",
                    "mov {t}, {st}",
                    "shr {t}, {loaded_shift}",
                    "mov {t}, qword ptr [{slot} + 8*{t} + {mags}]",
                    "mov qword ptr [{t} + 8*{n} + {rounds}], {item}",
                    "add {st}, 1",
                    // The commit.
                    "mov qword ptr [{slot} + {state}], {st}",
                    "5:",
                    // The abort handler, out of line (librseq's layout): the success path falls
                    // through, and the signature sits in the four bytes before it.
                    ".pushsection __rseq_failure, \"ax\"",
                    ".byte 0x0f, 0xb9, 0x3d",
                    ".long {signature}",
                    "6:",
                    "jmp 2b",
                    ".popsection",
                    "9:",
                    area = in(reg) $area,
                    base = in(reg) $base,
                    ncpus = in(reg) $ncpus,
                    item = in(reg) $item,
                    slot = out(reg) _,
                    st = out(reg) _,
                    n = out(reg) _,
                    t = out(reg) _,
                    stop = const STOP,
                    state = const STATE,
                    mags = const MAGS,
                    rounds = const ROUNDS,
                    cap_shift = const CAP_SHIFT,
                    loaded_shift = const LOADED_SHIFT,
                    slot_shift = const SLOT_SHIFT,
                    rseq_cs = const RSEQ_CS,
                    cpu_id = const CPU_ID,
                    signature = const SIGNATURE,
                    fail = label { return false; },
                    options(nostack),
                );
            }
        };
    }

    /// Pops a round from the current CPU's loaded magazine (see
    /// [`mag_layout`](super::mag_layout)). Returns null, having changed nothing, if the
    /// slot is stopped, the loaded magazine is empty (or missing), or the CPU number is
    /// not below `ncpus`.
    ///
    /// # Safety
    /// 1. `area` was returned by [`thread_area`](super::thread_area) on the calling thread
    ///    (or, inside the crate, by `thread_area_unchecked` there; see the module doc).
    /// 2. For every `cpu < ncpus`, `base.byte_add(cpu * SLOT_STRIDE)` is a valid,
    ///    8-byte-aligned magazine slot (layout of [`mag_layout`](super::mag_layout)) for
    ///    the duration of the call, and the product does not overflow; whenever its state word says
    ///    `cap > 0`, the loaded magazine pointer refers to a live magazine with at least
    ///    `cap` round words, of which the first `rounds` hold rounds.
    /// 3. While any thread may run the magazine sections on these slots, the state words
    ///    and the magazine pointers are written only by these sections, or by a thread
    ///    that has stopped the slot (set `STOP`, then `heavy_rseq` returned `true`), and
    ///    the loaded magazine's round words only by these sections or that thread.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    /// let n = possible();
    /// let mut slots = vec![[0usize; 16]; n]; // stop, state (nothing loaded), mags, padding
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: this thread's area; `n` valid empty slots SLOT_STRIDE (128) bytes apart.
    ///     let round = unsafe { rseq::mag_pop(area, slots.as_mut_ptr().cast(), n) };
    ///     assert!(round.is_null());
    /// }
    /// ```
    #[inline]
    pub unsafe fn mag_pop(area: *mut u8, base: *mut u8, ncpus: usize) -> *mut () {
        let item: *mut ();
        // SAFETY: this thread's live area (1); the slot of a CPU below `ncpus` and its
        // loaded magazine are valid (2) and written only by these sections or a stopper
        // that these sections exclude by testing STOP inside the section (3). The item
        // register is zeroed at every (re)start; the only store is the commit, the last
        // instruction. No stack use; every written register is declared.
        unsafe { mag_pop_asm!("", area, base, ncpus, item) };
        item
    }

    /// Pushes `item` into the current CPU's loaded magazine (see
    /// [`mag_layout`](super::mag_layout)). Returns `false`, having changed nothing, if
    /// the slot is stopped, the loaded magazine is full or missing (`cap == 0`), or the
    /// CPU number is not below `ncpus`.
    ///
    /// # Safety
    /// As for [`mag_pop`].
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    /// let n = possible();
    /// let mut slots = vec![[0usize; 16]; n]; // nothing loaded: every push fails
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: this thread's area; `n` valid empty slots SLOT_STRIDE (128) bytes apart.
    ///     let pushed = unsafe { rseq::mag_push(area, slots.as_mut_ptr().cast(), n, 8 as *mut ()) };
    ///     assert!(!pushed);
    /// }
    /// ```
    #[inline]
    pub unsafe fn mag_push(area: *mut u8, base: *mut u8, ncpus: usize, item: *mut ()) -> bool {
        // SAFETY: as in `mag_pop`. The round store lands beyond the loaded magazine's
        // count (`rounds < cap`, so inside its `cap` round words), where nobody reads,
        // and is published only by the committing store of `STATE + 1`. Every failure
        // exit leaves by the `fail` label, before any store.
        unsafe { mag_push_asm!("", area, base, ncpus, item) };
        true
    }

    /// [`mag_pop`] with the rseq area given as its offset from the thread pointer
    /// ([`thread_offset_unchecked`](super::thread_offset_unchecked)): the section reads
    /// and writes the area through `fs`, so the hot path loads neither the thread
    /// pointer nor glibc's `__rseq_offset`.
    ///
    /// # Safety
    /// 1. `offset` is [`thread_offset_unchecked`](super::thread_offset_unchecked)'s value,
    ///    read after [`rseq_enabled`](crate::cpu::rseq_enabled) returned `true`. 2. and 3.
    ///    as for [`mag_pop`].
    #[inline]
    pub(crate) unsafe fn mag_pop_tp(offset: isize, base: *mut u8, ncpus: usize) -> *mut () {
        let item: *mut ();
        // SAFETY: as in `mag_pop`: `fs:offset` is this thread's live area (1).
        unsafe { mag_pop_asm!("fs:", offset, base, ncpus, item) };
        item
    }

    /// [`mag_push`] with the rseq area given as its offset from the thread pointer (see
    /// [`mag_pop_tp`]).
    ///
    /// # Safety
    /// As for [`mag_pop_tp`]; `item` as for [`mag_push`].
    #[inline]
    pub(crate) unsafe fn mag_push_tp(offset: isize, base: *mut u8, ncpus: usize, item: *mut ()) -> bool {
        // SAFETY: as in `mag_push`: `fs:offset` is this thread's live area (1).
        unsafe { mag_push_asm!("fs:", offset, base, ncpus, item) };
        true
    }

    /// The current CPU's slot makes one transition: if it is not stopped and its state
    /// word equals `expected`, stores `item` at byte `store_off` of the slot, loads the
    /// word at byte `load_off`, and commits by storing `new` as the state word. Returns
    /// the loaded word, or `None`, having changed nothing the state references, if the
    /// slot is stopped, its state differs, or the CPU number is not below `ncpus`.
    ///
    /// # Safety
    /// 1. and 2. as for [`mag_pop`]; 3. as for [`mag_pop`], and `new` describes the slot
    ///    correctly once `item` is stored (its loaded and previous magazines, with their
    ///    rounds and capacities).
    /// 4. `store_off` and `load_off` are `MAGS + 8 * i` for `i < 3`, and the magazine
    ///    word at `store_off` is neither the loaded nor the previous one in `expected` (so
    ///    the store is harmless if the section does not commit).
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    /// use scalemem::cpu::rseq::mag_layout::{MAGS, PREV_SHIFT};
    /// let n = possible();
    /// let mut slots = vec![[0usize; 16]; n];
    /// let empty = 1u64 << PREV_SHIFT; // nothing loaded, nothing previous: indices 0 and 1
    /// for slot in &mut slots { slot[1] = empty as usize; }
    /// if let Some(area) = rseq::thread_area() {
    ///     // SAFETY: this thread's area; `n` valid slots 128 bytes apart; index 2 is
    ///     // unreferenced and the new state (the same) still describes the slot.
    ///     let old = unsafe {
    ///         rseq::mag_exchange(area, slots.as_mut_ptr().cast(), n, empty, empty, std::ptr::null_mut(), MAGS + 16, MAGS)
    ///     };
    ///     assert_eq!(old, Some(std::ptr::null_mut()));
    /// }
    /// ```
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mag_exchange(
        area: *mut u8,
        base: *mut u8,
        ncpus: usize,
        expected: u64,
        new: u64,
        item: *mut (),
        store_off: usize,
        load_off: usize,
    ) -> Option<*mut ()> {
        let out: usize;
        // SAFETY: as in `mag_pop` (1-3). The state test lies between start_ip and the
        // commit; the scratch store goes to a word `expected` does not reference (4), so
        // it is harmless when the section restarts or fails; `out` is reset to the
        // failure value at every (re)start and loaded right before the commit.
        unsafe {
            core::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 4f, (5f - 4f), 6f",
                ".popsection",
                "2:",
                "mov {out}, -1",
                "lea {slot}, [rip + 3b]",
                "mov qword ptr [{area} + {rseq_cs}], {slot}",
                "4:",
                "mov {slot:e}, dword ptr [{area} + {cpu_id}]",
                "cmp {slot}, {ncpus}",
                "jae 9f",
                "shl {slot}, {slot_shift}",
                "add {slot}, {base}",
                "cmp qword ptr [{slot} + {stop}], 0",
                "jne 9f",
                "cmp qword ptr [{slot} + {state}], {expected}",
                "jne 9f",
                "mov qword ptr [{slot} + {store_off}], {item}",
                "mov {out}, qword ptr [{slot} + {load_off}]",
                // The commit.
                "mov qword ptr [{slot} + {state}], {new}",
                "5:",
                // The abort handler, out of line (librseq's layout): the success path falls
                // through, and the signature sits in the four bytes before it.
                ".pushsection __rseq_failure, \"ax\"",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long {signature}",
                "6:",
                "jmp 2b",
                ".popsection",
                "9:",
                area = in(reg) area,
                base = in(reg) base,
                ncpus = in(reg) ncpus,
                expected = in(reg) expected,
                new = in(reg) new,
                item = in(reg) item,
                store_off = in(reg) store_off,
                load_off = in(reg) load_off,
                slot = out(reg) _,
                out = out(reg) out,
                stop = const STOP,
                state = const STATE,
                slot_shift = const SLOT_SHIFT,
                rseq_cs = const RSEQ_CS,
                cpu_id = const CPU_ID,
                signature = const SIGNATURE,
                options(nostack),
            );
        }
        (out != usize::MAX).then_some(core::ptr::without_provenance_mut::<()>(out))
    }
}

/// Targets without our critical sections: every operation reports failure and touches
/// nothing ([`thread_area`] is always `None` there).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
mod fallback_magazine {
    /// No rseq on this target: returns null and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::mag_pop(std::ptr::null_mut(), base.cast(), possible()) };
    /// assert!(done.is_null()); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn mag_pop(_area: *mut u8, _base: *mut u8, _ncpus: usize) -> *mut () {
        core::ptr::null_mut()
    }

    /// No rseq on this target: returns null and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    #[inline]
    pub(crate) unsafe fn mag_pop_tp(_offset: isize, _base: *mut u8, _ncpus: usize) -> *mut () {
        core::ptr::null_mut()
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    #[inline]
    pub(crate) unsafe fn mag_push_tp(_offset: isize, _base: *mut u8, _ncpus: usize, _item: *mut ()) -> bool {
        false
    }

    /// No rseq on this target: returns `false` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::mag_push(std::ptr::null_mut(), base.cast(), possible(), base.cast()) };
    /// assert!(!done); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    pub unsafe fn mag_push(_area: *mut u8, _base: *mut u8, _ncpus: usize, _item: *mut ()) -> bool {
        false
    }

    /// No rseq on this target: returns `None` and changes nothing.
    ///
    /// # Safety
    /// None needed; `unsafe` only to match the x86_64 signature.
    ///
    /// ```
    /// use scalemem::cpu::{possible, rseq};
    ///
    /// let mut words = vec![0usize; 16 * possible()];
    /// let base = words.as_mut_ptr();
    /// assert!(rseq::thread_area().is_none()); // no area to pass on this target
    /// // SAFETY: the stand-in has no contract; it touches none of its arguments.
    /// let done = unsafe { rseq::mag_exchange(std::ptr::null_mut(), base.cast(), possible(), 0, 1, base.cast(), 0, 8) };
    /// assert_eq!(done, None); // the caller takes its fallback path
    /// assert!(words.iter().all(|&w| w == 0));
    /// ```
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mag_exchange(
        _area: *mut u8,
        _base: *mut u8,
        _ncpus: usize,
        _expected: u64,
        _new: u64,
        _item: *mut (),
        _store_off: usize,
        _load_off: usize,
    ) -> Option<*mut ()> {
        None
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod magazine_tests {
    use super::mag_layout::{CAP_SHIFT, MAGS, ROUNDS, SLOT_STRIDE, STATE};
    use super::*;

    /// The `_tp` sections (the area through `fs` and the cached offset) see the same
    /// area, CPU number and slot as the area-pointer ones: a round pushed by one form is
    /// popped by the other, and a stopped slot refuses both.
    #[test]
    fn offset_sections_and_area_sections_share_one_slot() {
        if !crate::cpu::rseq_enabled() {
            return;
        }
        let Some(area) = thread_area() else { return };
        let tp: *mut u8;
        // SAFETY: %fs:0 is the thread pointer on x86_64 glibc (see `cpu::id`).
        unsafe { core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly)) };
        assert_eq!(area.addr().wrapping_sub(tp.addr()) as isize, thread_offset_unchecked());

        let n = crate::cpu::possible();
        let words = SLOT_STRIDE / 8;
        let mut slots = vec![0usize; n * words];
        // One magazine of capacity 2 per CPU (header words, then its rounds).
        let mut mags = vec![[0usize; ROUNDS / 8 + 2]; n];
        let mag0 = mags.as_mut_ptr().cast::<usize>();
        for cpu in 0..n {
            slots[cpu * words + MAGS / 8] = mag0.wrapping_add(cpu * (ROUNDS / 8 + 2)).addr();
            slots[cpu * words + STATE / 8] = 2 << CAP_SHIFT; // loaded: magazine 0, cap 2, empty
        }
        let base = slots.as_mut_ptr().cast::<u8>();
        let off = thread_offset_unchecked();
        let a = core::ptr::without_provenance_mut::<()>(0x1000);
        let b = core::ptr::without_provenance_mut::<()>(0x2000);
        let original = rustix::thread::sched_getaffinity(None).unwrap();
        let mut one = rustix::thread::CpuSet::new();
        let cpu = crate::cpu::current();
        one.set(cpu);
        rustix::thread::sched_setaffinity(None, &one).unwrap();
        // SAFETY: this thread's area (and its offset); `n` valid slots of the mag_layout
        // layout, each with a live two-round magazine, written only by these sections
        // and, through the same pointers, by this thread between them (the reads and
        // the stop word's write stay inside both vectors).
        unsafe {
            assert!(mag_push_tp(off, base, n, a));
            assert!(mag_push(area, base, n, b));
            assert!(!mag_push_tp(off, base, n, a), "the magazine holds two");
            assert_eq!(mag0.add(cpu * (ROUNDS / 8 + 2) + ROUNDS / 8).read(), a.addr());
            assert_eq!(mag_pop_tp(off, base, n), b);
            assert_eq!(mag_pop(area, base, n), a);
            assert!(mag_pop_tp(off, base, n).is_null());
            assert!(mag_pop_tp(off, base, 0).is_null(), "no CPU below ncpus = 0");
            // Stopped: both forms refuse.
            base.cast::<usize>().add(cpu * words).write(1);
            assert!(!mag_push_tp(off, base, n, a));
            assert!(mag_pop_tp(off, base, n).is_null());
        }
        rustix::thread::sched_setaffinity(None, &original).unwrap();
    }
}
