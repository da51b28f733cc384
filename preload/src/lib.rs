//! `libscalemem.so`: the C `malloc` family over [`scalemem::umem::global`], for
//! `LD_PRELOAD`.
//!
//! ```text
//! cargo build --release -p scalemem-preload
//! LD_PRELOAD=$PWD/target/release/libscalemem.so sqlite3 db.sqlite < script.sql
//! ```
//!
//! # What is exported
//!
//! - The C and POSIX allocation functions: `malloc`, `free`, `calloc`, `realloc`,
//!   `reallocarray`, `memalign`, `posix_memalign`, `aligned_alloc`, `valloc`, `pvalloc`,
//!   `malloc_usable_size`, `cfree`, and C23's `free_sized` and `free_aligned_sized`.
//! - glibc's internal names for them, which some programs and libraries call directly:
//!   `__libc_malloc`, `__libc_free`, `__libc_calloc`, `__libc_realloc`, `__libc_memalign`,
//!   `__libc_valloc`, `__libc_pvalloc`. (glibc has no `__posix_memalign`, so neither do we.)
//! - glibc's tuning and introspection calls, so that a program using them gets answers
//!   about the allocator that really serves it: `malloc_trim` (gives cached memory back
//!   now), `mallopt` (accepts glibc's parameters and ignores them), `mallinfo` and
//!   `mallinfo2` (filled from [`stats`](scalemem::umem::global::stats)), `malloc_stats`
//!   (a few lines on standard error).
//!
//! Each behaves as glibc's does at the boundary: `errno` is `ENOMEM` whenever a null is
//! returned for want of memory, including `calloc` and `reallocarray` overflow;
//! `posix_memalign` returns `EINVAL` unless the alignment is a power-of-two multiple of
//! `sizeof(void *)` and then leaves `*memptr` alone; `memalign` rounds an alignment that
//! is not a power of two up to the next one; `aligned_alloc` refuses one with `EINVAL`
//! (glibc 2.38 and later); `valloc` aligns to the page and `pvalloc` also rounds the size
//! up to whole pages (0 to one page); `realloc(p, 0)` frees `p` and returns null;
//! `free(NULL)` does nothing; `malloc_usable_size(NULL)` is 0. The size arguments of
//! `free_sized` and `free_aligned_sized` are not checked.
//!
//! # Contract with the library
//!
//! This crate is a thin layer: argument checks, `errno`, and the glibc corner cases.
//! Everything else is [`scalemem::umem::global`]'s, whose functions are allocation-free
//! and reentrancy-safe, callable before `main` and in a forked child:
//!
//! - **Initialisation** is lazy, inside the first call (often from the dynamic loader or
//!   libc, before `main`). There is no `dlsym`; memory comes
//!   from `mmap` system calls. Making the heap does use `Box`, `Arc` and
//!   `pthread_atfork`, which call `malloc` — this library — again: the library marks
//!   the thread while it is inside the heap and serves such re-entrant calls from a
//!   bootstrap arena of mapped memory, so nothing recurses and nothing waits on itself.
//! - **Thread-local state**: only the library's, and only words of the initial-exec TLS
//!   model (the re-entrancy mark, a maintenance countdown, the thread's epoch record;
//!   the library carries `STATIC_TLS`), with no registration and no destructor, plus the
//!   CPU number from glibc's rseq area. No `malloc` path calls `__tls_get_addr`: after a
//!   `dlopen` of a library with TLS, that call grows the thread's DTV with `malloc` under
//!   the loader's TLS lock, and a `malloc` that called it again deadlocked
//!   (`preload/tests/dtv.c`). This layer has none.
//! - **Fork**: the library's `pthread_atfork` handlers hold every heap lock across the
//!   fork, so a child can allocate at once even if other threads of the parent were
//!   allocating at the fork.
//! - **Thread exit**: the caches are per CPU, not per thread, so an exiting thread
//!   leaves nothing behind and needs no hook; a block may be freed by any thread.
//! - **`vfork` children** (and any `clone(CLONE_VM)` child that keeps its parent's
//!   thread pointer) must not allocate before `exec` or `_exit`, as POSIX says: the
//!   kernel does not register such a child's rseq area (it is the suspended parent's),
//!   so the CPU number the library reads there is the parent's last one and a per-CPU
//!   magazine operation of the child is not restarted if it is preempted; it could
//!   race another thread of the parent on that CPU. glibc's `posix_spawn` (and Rust's
//!   `Command`) allocate nothing in the child.
//! - **No inlining into the standard library**: release builds are one LTO module
//!   (the workspace's `[profile.release]`), in which this crate's `malloc` and `free`
//!   are the definitions of the very symbols `std` calls. Each exported function is
//!   `#[inline(never)]`: inlined, it would bind some of `std`'s allocations here while
//!   its other calls still go through the PLT to whichever `malloc` wins interposition
//!   (an executable that exports its own, as `rustc` exports jemalloc, wins over a
//!   preload), and a block would be freed by an allocator that never made it (`rustc`
//!   under the preload crashed so; `ci/preload.sh` runs it).
//! - **Foreign pointers**: `free` ignores a pointer the library did not hand out (the
//!   dynamic loader's own minimal allocator predates us), `malloc_usable_size` says 0
//!   for one, and `realloc` of one fails (null, `ENOMEM`).
//! - **Address space**: loading the library reserves 8 MiB (the region registry, one
//!   bit per 2 MiB of the 47-bit address space, untouched pages cost nothing); the heap
//!   takes 2 MiB regions, and its set-up allocations a bootstrap chunk of 256 KiB. Under
//!   a tight `ulimit -v` (`RLIMIT_AS`) that the heap cannot live within, `malloc` returns
//!   null with `ENOMEM` and the constructor starts no maintenance thread: the program
//!   sees an allocator that is out of memory, never an abort (`ci/preload.sh` runs `ls`
//!   under 40 MB and 16 MB limits).
//! - **Memory back to the kernel**: by maintenance piggy-backed on allocations, at once
//!   on `malloc_trim`, and by the maintenance thread that this library's constructor
//!   starts ([`spawn_maintenance_thread`](scalemem::umem::global::spawn_maintenance_thread):
//!   a Refcache tick every 10 ms, working-set reaping and decay every second), so that a
//!   program that frees and goes quiet gets its memory back within some 11 s. The
//!   thread blocks every signal (glibc keeps its internal ones open), so a signal the
//!   program blocks in its own threads, to take it with `sigwait` or a `signalfd`, stays
//!   pending for the program (`preload/tests/signals.c`). The
//!   constructor runs at load time, outside any allocation (a thread started from
//!   inside `malloc` could wait on a loader lock its caller holds). Linux
//!   refuses some calls to a multi-threaded process (`unshare(CLONE_NEWUSER)` for
//!   `unshare -U` and rootless containers, `setns` into a user or mount namespace for
//!   `nsenter`): the library's `unshare` and `setns` stop the thread, make the system
//!   call and start it again, so a program single-threaded but for our thread behaves
//!   as without the library (`preload/tests/namespaces.c`). A program that makes those
//!   system calls through `syscall(2)` bypasses that: set `SCALEMEM_BACKGROUND=0` for
//!   it, which starts no thread. A program that counts its own threads sees one more:
//!   CPython 3.12 and later read the kernel's count before `os.fork()` and issue a
//!   `DeprecationWarning` ("multi-threaded, use of fork() may lead to deadlocks") in a
//!   process with a second thread, shown for `__main__` or under `-W`; set
//!   `SCALEMEM_BACKGROUND=0` where that matters (no later point is safe to start the
//!   thread lazily: see above). A `fork`ed child has no such thread (it calls
//!   `malloc_trim` or relies on the piggy-backed maintenance).
//!
//! # Why no `dlsym`
//!
//! Interposers usually find glibc's `malloc` with `dlsym(RTLD_NEXT, "malloc")` to
//! forward to it. We never forward: every block is umem's, so there is nothing to look
//! up. And `dlsym` itself may call `malloc` or `calloc` (its error buffer, the loader's
//! scope lists), which would re-enter this library before it has a pointer to forward
//! to; the usual fix, a static bootstrap buffer, is one more allocator to get right.
//!
//! # No panics, no formatting
//!
//! These functions run inside `malloc`: nothing in them may allocate, so nothing may
//! format or panic (an `extern "C"` function aborts on a panic anyway). Arithmetic is
//! checked or saturating, and `malloc_stats` turns numbers into decimal digits by hand
//! in a stack buffer.

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicUsize, Ordering};

use libc::size_t;
use scalemem::umem::global as umem;

/// The allocator's own alignment guarantee: `malloc` returns 16-byte-aligned blocks, so
/// `memalign` with an alignment at most this is `malloc` (glibc's `MALLOC_ALIGNMENT`).
const MALLOC_ALIGNMENT: usize = 16;

/// Sets the calling thread's `errno`.
#[inline]
fn set_errno(code: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's `errno`, a valid, aligned,
    // writable `int` for the life of the thread (glibc keeps it in the static TLS block,
    // set up before any code of the thread runs), and nothing else holds a reference.
    unsafe { *libc::__errno_location() = code };
}

/// Returns `ptr` as `void *`, setting `errno` to `ENOMEM` if it is null.
#[inline]
fn or_enomem(ptr: *mut u8) -> *mut c_void {
    if ptr.is_null() {
        set_errno(libc::ENOMEM);
    }
    ptr.cast()
}

/// The page size, read once from `sysconf` (which reads the loader's copy of the auxv
/// value and allocates nothing).
fn page_size() -> usize {
    // Relaxed: the value is the same whichever thread computed it; a race reads twice.
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let cached = PAGE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    // SAFETY: sysconf has no preconditions; with _SC_PAGESIZE it returns a constant.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 && (n as usize).is_power_of_two() => n as usize,
        _ => 4096,
    };
    PAGE.store(page, Ordering::Relaxed);
    page
}

/// glibc's `_mid_memalign`: an alignment at most [`MALLOC_ALIGNMENT`] is `malloc`, one
/// that is not a power of two is rounded up to the next, one above `SIZE_MAX / 2 + 1`
/// (which cannot be rounded) is `EINVAL`.
fn memalign_impl(align: usize, size: usize) -> *mut c_void {
    if align <= MALLOC_ALIGNMENT {
        return or_enomem(umem::malloc(size));
    }
    let Some(align) = align.checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    or_enomem(umem::aligned_alloc(align, size))
}

/// `realloc` with glibc's `errno`: `ENOMEM` when it fails, untouched when `realloc(p, 0)`
/// frees `p` and returns null.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
unsafe fn realloc_impl(ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: (1) is the caller's, and is `umem::realloc`'s only precondition.
    let new = unsafe { umem::realloc(ptr.cast(), size) };
    if new.is_null() && (size != 0 || ptr.is_null()) {
        set_errno(libc::ENOMEM);
    }
    new.cast()
}

// ---------------------------------------------------------------------------------------
// The C and POSIX allocation functions.
//
// Each `unsafe extern "C" fn` below has the C contract of its namesake as its safety
// contract: pointer arguments are null or live blocks from this library (`free`,
// `realloc`, ...), or writable (`posix_memalign`'s `memptr`). Functions with no pointer
// arguments are `unsafe` only because exporting an allocator is: they have no
// precondition.
// ---------------------------------------------------------------------------------------

/// C `malloc`: `size` bytes, 16-byte aligned; `malloc(0)` is a unique pointer; null and
/// `ENOMEM` when out of memory.
///
/// # Safety
///
/// None: callable from C at any time (see the crate docs).
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    or_enomem(umem::malloc(size))
}

/// C `free`: `free(NULL)` does nothing; pointers the library did not hand out are ignored.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: (1) is the caller's, and is `umem::free`'s only precondition.
    unsafe { umem::free(ptr.cast()) }
}

/// C `calloc`: `n * size` zeroed bytes; null and `ENOMEM` if the product overflows or
/// memory is out.
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    or_enomem(umem::calloc(n, size))
}

/// C `realloc`: `realloc(NULL, n)` is `malloc(n)`; `realloc(p, 0)` frees `p` and returns
/// null (glibc); on failure null, `ENOMEM`, and the old block intact.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: (1) is the caller's, as `realloc_impl` needs.
    unsafe { realloc_impl(ptr, size) }
}

/// glibc/BSD `reallocarray`: `realloc(ptr, n * size)`, but null and `ENOMEM` (and `ptr`
/// untouched) if the product overflows.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    let Some(bytes) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    // Through the exported `realloc`, not its body, as glibc's `reallocarray` does: a
    // tool that replaces the family by symbol (valgrind's memcheck replaces `realloc` and
    // `free` but has no `reallocarray`) then sees this block too, instead of freeing with
    // its own `free` a block it never made.
    // SAFETY: (1) is the caller's, and is `realloc`'s contract.
    unsafe { realloc(ptr, bytes) }
}

/// Obsolete `memalign`: `size` bytes aligned to `align`, rounded up to a power of two if
/// it is not one (glibc); null and `EINVAL` if it cannot be, `ENOMEM` if out of memory.
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    memalign_impl(align, size)
}

/// POSIX `posix_memalign`: 0 and `*memptr` set; `EINVAL` unless `align` is a power-of-two
/// multiple of `sizeof(void *)`; `ENOMEM` when out of memory. `*memptr` is written only
/// on success, and `errno` is left alone.
///
/// # Safety
///
/// 1. `memptr` is valid for a write of one pointer.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn posix_memalign(memptr: *mut *mut c_void, align: size_t, size: size_t) -> c_int {
    let word = size_of::<*mut c_void>();
    if !align.is_multiple_of(word) || !(align / word).is_power_of_two() {
        return libc::EINVAL;
    }
    let ptr = if align <= MALLOC_ALIGNMENT { umem::malloc(size) } else { umem::aligned_alloc(align, size) };
    if ptr.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: (1) `memptr` is valid for one pointer-sized write.
    unsafe { memptr.write(ptr.cast()) };
    0
}

/// C11 `aligned_alloc`: `size` bytes aligned to `align`; null and `EINVAL` unless
/// `align` is a power of two (as glibc 2.38 and later), `ENOMEM` when out of memory.
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    or_enomem(umem::aligned_alloc(align.max(MALLOC_ALIGNMENT), size))
}

/// Obsolete `valloc`: `size` bytes aligned to the page.
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    memalign_impl(page_size(), size)
}

/// Obsolete `pvalloc`: `size` rounded up to whole pages (0 to one page), page aligned;
/// null and `ENOMEM` if the rounding overflows.
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let page = page_size();
    let Some(rounded) = size.max(1).checked_next_multiple_of(page) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    // Through the exported `memalign` (as `reallocarray` goes through `realloc`): a tool
    // that replaces the family by symbol and has no `pvalloc` still sees the block.
    // SAFETY: `memalign` has no precondition.
    unsafe { memalign(page, rounded) }
}

/// glibc `malloc_usable_size`: the bytes usable at `ptr` (at least what was asked for);
/// 0 for null or a pointer the library did not hand out.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> size_t {
    // SAFETY: (1) is the caller's, and is `umem::usable_size`'s only precondition.
    unsafe { umem::usable_size(ptr.cast_const().cast()) }
}

/// Obsolete `cfree`: `free`.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn cfree(ptr: *mut c_void) {
    // SAFETY: (1) is `free`'s contract.
    unsafe { free(ptr) }
}

/// C23 `free_sized`: `free`; `size` is not checked.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn free_sized(ptr: *mut c_void, _size: size_t) {
    // SAFETY: (1) is `free`'s contract.
    unsafe { free(ptr) }
}

/// C23 `free_aligned_sized`: `free`; `align` and `size` are not checked.
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn free_aligned_sized(ptr: *mut c_void, _align: size_t, _size: size_t) {
    // SAFETY: (1) is `free`'s contract.
    unsafe { free(ptr) }
}

// ---------------------------------------------------------------------------------------
// glibc's internal names. Separate functions, not aliases (Rust has no symbol aliases);
// each is one call that the optimiser turns into a jump.
// ---------------------------------------------------------------------------------------

/// glibc's `__libc_malloc`: [`malloc`].
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_malloc(size: size_t) -> *mut c_void {
    // SAFETY: `malloc` has no precondition.
    unsafe { malloc(size) }
}

/// glibc's `__libc_free`: [`free`].
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_free(ptr: *mut c_void) {
    // SAFETY: (1) is `free`'s contract.
    unsafe { free(ptr) }
}

/// glibc's `__libc_calloc`: [`calloc`].
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: `calloc` has no precondition.
    unsafe { calloc(n, size) }
}

/// glibc's `__libc_realloc`: [`realloc`].
///
/// # Safety
///
/// 1. `ptr` is null or a live block from this library, not freed since.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: (1) is `realloc`'s contract.
    unsafe { realloc(ptr, size) }
}

/// glibc's `__libc_memalign`: [`memalign`].
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: `memalign` has no precondition.
    unsafe { memalign(align, size) }
}

/// glibc's `__libc_valloc`: [`valloc`].
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_valloc(size: size_t) -> *mut c_void {
    // SAFETY: `valloc` has no precondition.
    unsafe { valloc(size) }
}

/// glibc's `__libc_pvalloc`: [`pvalloc`].
///
/// # Safety
///
/// None: callable from C at any time.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn __libc_pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: `pvalloc` has no precondition.
    unsafe { pvalloc(size) }
}

// ---------------------------------------------------------------------------------------
// glibc's tuning and introspection calls.
// ---------------------------------------------------------------------------------------

/// glibc `malloc_trim`: gives cached memory back to the kernel now; 1 if any was
/// released, else 0. `pad` is ignored.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn malloc_trim(_pad: size_t) -> c_int {
    c_int::from(umem::trim())
}

/// glibc `mallopt`: 1 for the parameters glibc knows (`M_MXFAST` .. `M_ARENA_MAX`),
/// which are accepted and ignored (umem has no such knobs); 0 for any other.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mallopt(param: c_int, _value: c_int) -> c_int {
    // M_ARENA_MAX (-8) .. M_TRIM_THRESHOLD (-1), and M_MXFAST, M_NLBLKS, M_GRAIN, M_KEEP (1..4).
    c_int::from(matches!(param, -8..=-1 | 1..=4))
}

/// glibc's `struct mallinfo2` (glibc 2.33), field for field; see [`mallinfo2`] for what
/// each holds here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallinfo2 {
    /// Bytes mapped from the kernel.
    pub arena: size_t,
    /// Always 0.
    pub ordblks: size_t,
    /// Always 0.
    pub smblks: size_t,
    /// Always 0.
    pub hblks: size_t,
    /// Bytes in large blocks (above the largest size class) in use.
    pub hblkhd: size_t,
    /// Always 0 (as in glibc).
    pub usmblks: size_t,
    /// Bytes of freed small (size-class) objects cached in magazines and depots.
    pub fsmblks: size_t,
    /// Bytes handed out (approximate).
    pub uordblks: size_t,
    /// Bytes mapped but not handed out: `arena - uordblks`.
    pub fordblks: size_t,
    /// Bytes of freed blocks cached for reuse, small and large, which `malloc_trim` can
    /// give back: `fsmblks` plus the large blocks kept.
    pub keepcost: size_t,
}

/// glibc's older `struct mallinfo`, with `int` fields; [`Mallinfo2`]'s values, saturated
/// at `INT_MAX` (glibc wraps them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallinfo {
    /// See [`Mallinfo2::arena`].
    pub arena: c_int,
    /// See [`Mallinfo2::ordblks`].
    pub ordblks: c_int,
    /// See [`Mallinfo2::smblks`].
    pub smblks: c_int,
    /// See [`Mallinfo2::hblks`].
    pub hblks: c_int,
    /// See [`Mallinfo2::hblkhd`].
    pub hblkhd: c_int,
    /// See [`Mallinfo2::usmblks`].
    pub usmblks: c_int,
    /// See [`Mallinfo2::fsmblks`].
    pub fsmblks: c_int,
    /// See [`Mallinfo2::uordblks`].
    pub uordblks: c_int,
    /// See [`Mallinfo2::fordblks`].
    pub fordblks: c_int,
    /// See [`Mallinfo2::keepcost`].
    pub keepcost: c_int,
}

// The layouts are glibc's (the libc crate's declarations of them are the reference).
const _: () = assert!(size_of::<Mallinfo2>() == size_of::<libc::mallinfo2>());
const _: () = assert!(size_of::<Mallinfo>() == size_of::<libc::mallinfo>());

/// glibc `mallinfo2`: the allocator's counts from `umem::global::stats()` in glibc's
/// fields: `arena` = mapped, `uordblks` = in use, `fordblks` = the difference, `hblkhd` =
/// large blocks in use, `fsmblks` = small objects cached, `keepcost` = all blocks
/// cached; the others are 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mallinfo2() -> Mallinfo2 {
    let s = umem::stats();
    Mallinfo2 {
        arena: s.mapped,
        hblkhd: s.large_in_use,
        uordblks: s.in_use,
        fordblks: s.mapped.saturating_sub(s.in_use),
        fsmblks: s.small_cached,
        keepcost: s.large_cached.saturating_add(s.small_cached),
        ..Mallinfo2::default()
    }
}

/// glibc `mallinfo`: [`mallinfo2`] with each field saturated at `INT_MAX`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mallinfo() -> Mallinfo {
    let m = mallinfo2();
    let int = |v: size_t| c_int::try_from(v).unwrap_or(c_int::MAX);
    Mallinfo {
        arena: int(m.arena),
        ordblks: int(m.ordblks),
        smblks: int(m.smblks),
        hblks: int(m.hblks),
        hblkhd: int(m.hblkhd),
        usmblks: int(m.usmblks),
        fsmblks: int(m.fsmblks),
        uordblks: int(m.uordblks),
        fordblks: int(m.fordblks),
        keepcost: int(m.keepcost),
    }
}

/// A fixed stack buffer that text and decimal numbers are appended to; whatever does not
/// fit is dropped (it cannot overflow, it cannot panic, it never allocates).
struct StackText {
    buf: [u8; 512],
    len: usize,
}

impl StackText {
    fn push(&mut self, text: &[u8]) {
        for &b in text {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    /// Appends `label`, `value` right-aligned in 14 columns, and a newline.
    fn line(&mut self, label: &[u8], value: usize) {
        let mut digits = [b' '; 20];
        let mut i = digits.len();
        let mut v = value;
        loop {
            i -= 1;
            // `v % 10` < 10: the cast cannot truncate.
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 || i == 0 {
                break;
            }
        }
        self.push(label);
        let width = 14usize.max(digits.len() - i);
        self.push(digits.get(digits.len() - width..).unwrap_or(&digits));
        self.push(b"\n");
    }
}

/// glibc `malloc_stats`: the allocator's counts on standard error (fd 2), glibc's
/// layout of `label = value` lines, written with `write(2)` from a stack buffer;
/// `errno` is preserved.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn malloc_stats() {
    let saved_errno = errno();
    let s = umem::stats();
    let mut out = StackText { buf: [0; 512], len: 0 };
    out.push(b"scalemem umem:\n");
    out.line(b"system bytes     = ", s.mapped);
    out.line(b"in use bytes     = ", s.in_use);
    out.line(b"large in use     = ", s.large_in_use);
    out.line(b"large cached     = ", s.large_cached);
    out.line(b"small cached     = ", s.small_cached);
    out.line(b"bootstrap bytes  = ", s.bootstrap);
    out.line(b"returned bytes   = ", s.returned);
    let mut done = 0;
    while done < out.len {
        let rest = out.buf.get(done..out.len).unwrap_or(&[]);
        // SAFETY: `rest` is a live, initialised slice of `rest.len()` bytes that write(2)
        // only reads; fd 2 being closed or odd just makes write fail.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            break;
        }
    }
    set_errno(saved_errno);
}

/// The calling thread's `errno`.
fn errno() -> c_int {
    // SAFETY: as in `set_errno`: a valid, aligned `int` of the calling thread.
    unsafe { *libc::__errno_location() }
}

// ---------------------------------------------------------------------------------------
// Namespaces: calls Linux refuses to a multi-threaded process.
// ---------------------------------------------------------------------------------------

/// Runs `call` (a namespace system call) with this library's maintenance thread
/// stopped, so that a program single-threaded but for it is single-threaded for the
/// kernel's check, and starts the thread again after (if it ran before); returns
/// `call`'s result with its `errno`.
fn without_maintenance_thread(call: impl FnOnce() -> libc::c_long) -> c_int {
    let stopped = umem::stop_maintenance_thread();
    let result = call() as c_int;
    if stopped {
        let saved_errno = errno();
        // A thread that cannot start again leaves the piggy-backed maintenance.
        let _ = umem::spawn_maintenance_thread();
        set_errno(saved_errno);
    }
    result
}

/// Linux `unshare`, as glibc's (one system call), with the maintenance thread stopped
/// around it: `unshare(CLONE_NEWUSER)` (`unshare -U`, rootless containers) fails with
/// `EINVAL` in a process with a second thread, and the maintenance thread would be that
/// thread. A call through `syscall(SYS_unshare, ...)` bypasses this: see the module
/// documentation.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn unshare(flags: c_int) -> c_int {
    // SAFETY: `unshare` takes one integer and reads no memory of ours.
    without_maintenance_thread(|| unsafe { libc::syscall(libc::SYS_unshare, flags) })
}

/// Linux `setns`, as glibc's, with the maintenance thread stopped around it: joining a
/// user or mount namespace (`nsenter -U`, `nsenter -m`) fails with `EINVAL` in a
/// multi-threaded process.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn setns(fd: c_int, nstype: c_int) -> c_int {
    // SAFETY: `setns` takes two integers and reads no memory of ours; a bad descriptor
    // is the kernel's `EBADF`.
    without_maintenance_thread(|| unsafe { libc::syscall(libc::SYS_setns, fd, nstype) })
}

/// The library constructor: starts the maintenance thread unless `SCALEMEM_BACKGROUND`
/// is `0` (module documentation, "Memory back to the kernel").
extern "C" fn start_maintenance() {
    // SAFETY: a NUL-terminated name; `getenv` reads the environment and allocates
    // nothing. The result is null or a NUL-terminated string owned by the environment.
    let off = unsafe {
        let value = libc::getenv(c"SCALEMEM_BACKGROUND".as_ptr());
        !value.is_null() && *value == b'0' as libc::c_char && *value.add(1) == 0
    };
    if !off {
        // A process that cannot start a thread still has piggy-backed maintenance.
        let _ = umem::spawn_maintenance_thread();
    }
}

/// Runs [`start_maintenance`] when the library is loaded, after libc is initialised.
#[used]
#[unsafe(link_section = ".init_array")]
static START_MAINTENANCE: extern "C" fn() = start_maintenance;
