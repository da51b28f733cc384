//! Memory from the kernel: anonymous `mmap`/`munmap` through `rustix` (libc's syscall
//! wrappers, never libc's `malloc`; each call keeps `errno`, see [`KeepErrno`]).
//! Everything in the crate that needs memory outside the global allocator (per-CPU
//! arrays, epoch records and bags) takes it from here.

use core::ptr::NonNull;

use crate::util::AllocError;

/// Keeps the calling thread's `errno` across the system calls made while it lives.
///
/// rustix runs on libc here (its `use-libc` backend: the raw backend crashes under
/// valgrind), so a refused `mmap`, an `EAGAIN` from `futex` or a refused `membarrier`
/// writes `errno` as a side effect. The allocator behind `malloc` must not: a C caller
/// may read `errno` after a successful `malloc` or `free` (POSIX 2024 requires `free` to
/// keep it), and `posix_memalign` reports errors only through its return value. So every
/// system call the crate makes runs under one of these, and the C entry points set
/// `errno` themselves where the standard says so. Costs one `__errno_location` call and
/// a load at creation, a store when dropped: nothing next to a system call.
#[cfg(not(scalemem_loom))]
pub(crate) struct KeepErrno {
    #[cfg(target_os = "linux")]
    saved: core::ffi::c_int,
}

#[cfg(not(scalemem_loom))]
impl KeepErrno {
    /// Saves the current `errno`.
    #[inline]
    pub(crate) fn new() -> Self {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `__errno_location` returns this thread's errno, valid for the
            // thread's life.
            Self { saved: unsafe { *libc::__errno_location() } }
        }
        #[cfg(not(target_os = "linux"))]
        {
            Self {}
        }
    }
}

#[cfg(not(scalemem_loom))]
impl Drop for KeepErrno {
    #[inline]
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: as in `new`: the calling thread's errno. (Every guard is a local
            // dropped on the thread that made it, so this restores that thread's value.)
            unsafe { *libc::__errno_location() = self.saved };
        }
    }
}

/// The system page size.
#[inline]
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// Rounds `len` up to a whole number of pages; `None` on overflow.
#[inline]
pub(crate) fn page_round(len: usize) -> Option<usize> {
    let page = page_size();
    Some(len.checked_add(page - 1)? & !(page - 1))
}

/// Maps `len` bytes (rounded up to pages) of zeroed, private, read-write memory.
#[cfg(not(scalemem_loom))]
pub(crate) fn map(len: usize) -> Result<NonNull<u8>, AllocError> {
    let _errno = KeepErrno::new();
    let len = page_round(len.max(1)).ok_or(AllocError)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases
    // nothing; `len` is non-zero and page-rounded.
    let ptr = unsafe {
        rustix::mm::mmap_anonymous(
            core::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .map_err(|_| AllocError)?;
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(AllocError)?;
    lsan::register(ptr, len);
    Ok(ptr)
}

/// Under loom: page-aligned zeroed memory from the global allocator, which loom runs
/// thousands of times per model (an mmap per iteration dominated their run time).
#[cfg(scalemem_loom)]
pub(crate) fn map(len: usize) -> Result<NonNull<u8>, AllocError> {
    let layout = loom_layout(len)?;
    // SAFETY: the layout has a non-zero size.
    NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(AllocError)
}

#[cfg(scalemem_loom)]
fn loom_layout(len: usize) -> Result<std::alloc::Layout, AllocError> {
    let len = page_round(len.max(1)).ok_or(AllocError)?;
    std::alloc::Layout::from_size_align(len, page_size()).map_err(|_| AllocError)
}

/// Under loom: frees memory from the loom [`map`].
///
/// # Safety
/// As for the non-loom `unmap`.
#[cfg(scalemem_loom)]
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    let layout = loom_layout(len).expect("length was accepted by map");
    // SAFETY: allocated by map() with this layout; no longer used.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
}

/// Unmaps memory returned by [`map`].
///
/// # Safety
/// 1. `ptr` and `len` are exactly what a call to [`map`] was given and returned.
/// 2. Nothing refers to the memory any more.
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    let _errno = KeepErrno::new();
    let len = page_round(len.max(1)).expect("length was accepted by map");
    lsan::unregister(ptr, len);
    // SAFETY: (1) the range is a whole mapping of ours; (2) nothing uses it.
    let result = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len) };
    // munmap of a range we mapped cannot fail short of a kernel bug; keep the memory
    // (a leak) rather than panic on a reclamation path.
    debug_assert!(result.is_ok());
}

/// Maps `len` bytes (a multiple of the page size) of zeroed memory whose address is a
/// multiple of `align` (a power of two, at least the page size): maps `len + align -
/// page` bytes and unmaps the misaligned head and the tail, so that only `len` bytes stay
/// mapped. Free it with [`unmap_aligned`].
#[cfg(not(scalemem_loom))]
pub(crate) fn map_aligned(len: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
    let _errno = KeepErrno::new();
    let page = page_size();
    if len == 0 || !len.is_multiple_of(page) || !align.is_power_of_two() || align < page {
        return Err(AllocError);
    }
    let total = len.checked_add(align - page).ok_or(AllocError)?;
    // SAFETY: as in `map`: a fresh anonymous private mapping aliases nothing.
    let raw = unsafe {
        rustix::mm::mmap_anonymous(
            core::ptr::null_mut(),
            total,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .map_err(|_| AllocError)?;
    let start = raw as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = total - head - len;
    if head != 0 {
        // SAFETY: the head is part of the mapping made above, used by nobody.
        let result = unsafe { rustix::mm::munmap(raw, head) };
        debug_assert!(result.is_ok());
    }
    if tail != 0 {
        // SAFETY: the tail is part of the mapping made above, used by nobody.
        let result = unsafe { rustix::mm::munmap((aligned + len) as *mut core::ffi::c_void, tail) };
        debug_assert!(result.is_ok());
    }
    let ptr = NonNull::new(aligned as *mut u8).ok_or(AllocError)?;
    lsan::register(ptr, len);
    Ok(ptr)
}

/// Unmaps memory returned by [`map_aligned`].
///
/// # Safety
/// 1. `ptr`, `len` and `align` are exactly what a call to [`map_aligned`] was given and
///    returned.
/// 2. Nothing refers to the memory any more.
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn unmap_aligned(ptr: NonNull<u8>, len: usize, align: usize) {
    let _ = align;
    // SAFETY: (1) what stayed mapped is exactly `len` bytes at `ptr`, registered with
    // LSan as `map` registers; (2) as the caller promises.
    unsafe { unmap(ptr, len) };
}

/// Under loom: zeroed memory aligned to `align` from the global allocator.
#[cfg(scalemem_loom)]
pub(crate) fn map_aligned(len: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
    let layout = std::alloc::Layout::from_size_align(len.max(1), align).map_err(|_| AllocError)?;
    // SAFETY: the layout has a non-zero size.
    NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or(AllocError)
}

/// Under loom: frees memory from the loom [`map_aligned`].
///
/// # Safety
/// As for the non-loom `unmap_aligned`.
#[cfg(scalemem_loom)]
pub(crate) unsafe fn unmap_aligned(ptr: NonNull<u8>, len: usize, align: usize) {
    let layout = std::alloc::Layout::from_size_align(len.max(1), align).expect("accepted by map_aligned");
    // SAFETY: allocated by map_aligned with this layout; no longer used.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
}

/// Gives the pages of `[ptr, ptr + len)` back to the kernel (`madvise(MADV_DONTNEED)`):
/// the range stays mapped and reads as zeros afterwards, and it no longer counts in the
/// resident set. Returns whether the kernel accepted.
///
/// # Safety
/// 1. The range is page-aligned and lies in a mapping of ours.
/// 2. Nothing needs its contents any more.
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn dontneed(ptr: NonNull<u8>, len: usize) -> bool {
    let _errno = KeepErrno::new();
    // SAFETY: (1) our own mapping, page-aligned; (2) the contents are dead.
    unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), len, rustix::mm::Advice::LinuxDontNeed) }.is_ok()
}

/// Under loom: zeroes the range (what `MADV_DONTNEED` makes the next reader see).
///
/// # Safety
/// As for the non-loom `dontneed`.
#[cfg(scalemem_loom)]
pub(crate) unsafe fn dontneed(ptr: NonNull<u8>, len: usize) -> bool {
    // SAFETY: (1) the range is ours and writable; (2) its contents are dead.
    unsafe { core::ptr::write_bytes(ptr.as_ptr(), 0, len) };
    true
}

/// `madvise(MADV_NOHUGEPAGE)`: the kernel no longer backs the range with transparent
/// huge pages, at fault time or by `khugepaged` collapsing it later. Returns whether the
/// kernel accepted.
///
/// # Safety
/// The range is page-aligned and inside a mapping of ours.
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn no_huge_pages(ptr: NonNull<u8>, len: usize) -> bool {
    let _errno = KeepErrno::new();
    // SAFETY: our own mapping, page-aligned (the caller's); the advice changes only how
    // the kernel backs it, never its contents.
    unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), len, rustix::mm::Advice::LinuxNoHugepage) }.is_ok()
}

/// Whether the system backs anonymous memory with transparent huge pages by default
/// (`/sys/kernel/mm/transparent_hugepage/enabled` reads `[always]`), read once and
/// without allocating. Under `madvise` or `never`, or where the file cannot be read, no
/// range of ours gets huge pages, since we never ask for them.
#[cfg(not(scalemem_loom))]
pub(crate) fn thp_always() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    /// 0: not read yet; 1: always; 2: not always.
    static MODE: AtomicU8 = AtomicU8::new(0);
    // Relaxed: the value is a pure function of the system's setting; two threads that
    // both read the file store the same answer.
    match MODE.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let _errno = KeepErrno::new();
    let mut buf = [0u8; 64];
    let mut len = 0;
    if let Ok(fd) = rustix::fs::open(
        c"/sys/kernel/mm/transparent_hugepage/enabled",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        len = rustix::io::read(&fd, &mut buf).unwrap_or(0);
    }
    // `get`, not indexing: no allocator path may hold a formatting panic.
    let always = buf.get(..len).unwrap_or(&[]).windows(8).any(|w| w == b"[always]");
    MODE.store(if always { 1 } else { 2 }, Ordering::Relaxed);
    always
}

#[cfg(not(scalemem_loom))]
/// Reads an environment variable without allocating (glibc's `getenv` copies nothing).
/// `name` must end with a NUL byte. Returns the value's bytes.
pub(crate) fn getenv(name: &'static [u8]) -> Option<&'static [u8]> {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is NUL-terminated. getenv returns a pointer into the environment
    // block, which lives as long as no one calls setenv/putenv on this name; we read it
    // at once, during initialisation, as std::env::var does.
    let value = unsafe { libc::getenv(name.as_ptr().cast()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: getenv returned a NUL-terminated string.
    Some(unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes())
}

/// LeakSanitizer hooks. Our mappings hold the only pointers to garbage that waits for
/// reclamation (deferred `Box`es in epoch bags); LSan does not scan anonymous mappings
/// unless told to, and would report that garbage as leaked. Built with
/// `--cfg scalemem_asan` (the CI's sanitizer lane) the mappings are registered as root
/// regions; otherwise these are no-ops.
/// Spawns one of the library's background threads (the Refcache ticker, the object
/// caches' reaper, the global heap's maintenance thread) with every signal blocked, as
/// jemalloc does for its background threads. A process-directed signal (`kill`, a
/// terminal's `SIGINT`, a timer) goes to a thread that does not block it; a program
/// that blocks a signal in all of its own threads, to take it with `sigwait` or a
/// `signalfd`, would otherwise have it delivered to our thread instead: its handler run
/// there, or its default action (for `SIGTERM`, the end of the process) taken. The mask
/// is set in the calling thread around the spawn, so the new thread starts with it
/// (`pthread_create` copies the creator's mask) and there is no window in which it
/// could take a signal; the caller's mask is restored before returning. glibc's
/// `pthread_sigmask` leaves its internal signals (cancellation, `setxid`) unblocked,
/// so `setuid` from another thread still reaches ours.
#[cfg(not(scalemem_loom))]
pub(crate) fn spawn_signal_free<F, T>(
    builder: std::thread::Builder,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: plain-data C types, all-zero is a valid (empty) value before the calls
    // below fill them.
    let (mut all, mut saved): (libc::sigset_t, libc::sigset_t) = unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
    // SAFETY: `all` and `saved` are valid, writable sigsets of this frame; the calls only
    // change the calling thread's mask, which is restored below whatever the spawn did.
    let blocked =
        unsafe { libc::sigfillset(&mut all) == 0 && libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved) == 0 };
    let spawned = builder.spawn(f);
    if blocked {
        // SAFETY: `saved` holds the mask `pthread_sigmask` returned above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, core::ptr::null_mut()) };
    }
    spawned
}

#[cfg(not(scalemem_loom))]
mod lsan {
    use core::ptr::NonNull;

    #[cfg(scalemem_asan)]
    unsafe extern "C" {
        fn __lsan_register_root_region(p: *const core::ffi::c_void, size: usize);
        fn __lsan_unregister_root_region(p: *const core::ffi::c_void, size: usize);
    }

    #[inline]
    pub(super) fn register(_ptr: NonNull<u8>, _len: usize) {
        #[cfg(scalemem_asan)]
        // SAFETY: the sanitizer runtime is linked (the cfg is set only with it); the
        // region is a live mapping of ours.
        unsafe {
            __lsan_register_root_region(_ptr.as_ptr().cast(), _len)
        };
    }

    #[inline]
    pub(super) fn unregister(_ptr: NonNull<u8>, _len: usize) {
        #[cfg(scalemem_asan)]
        // SAFETY: as in register; the region was registered by map().
        unsafe {
            __lsan_unregister_root_region(_ptr.as_ptr().cast(), _len)
        };
    }
}

#[cfg(all(test, target_os = "linux", not(scalemem_loom)))]
mod errno_tests {
    use core::ptr::NonNull;

    const SENTINEL: i32 = 12345;

    fn set_errno(value: i32) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = value };
    }

    fn errno() -> i32 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() }
    }

    #[test]
    fn failed_system_calls_keep_errno() {
        // A refused mmap (more address space than x86-64 user space has).
        set_errno(SENTINEL);
        assert!(super::map(1 << 60).is_err());
        assert_eq!(errno(), SENTINEL, "a refused map changed errno");
        assert!(super::map_aligned(1 << 59, 1 << 59).is_err());
        assert_eq!(errno(), SENTINEL, "a refused aligned map changed errno");
        // A refused madvise (a range that is not mapped: the page at address 4096).
        let unmapped = NonNull::new(super::page_size() as *mut u8).unwrap();
        // SAFETY: nothing of ours lives at that page; the kernel refuses or ignores it.
        let _ = unsafe { super::dontneed(unmapped, super::page_size()) };
        assert_eq!(errno(), SENTINEL, "madvise changed errno");
        // A futex wait whose word has moved on returns EAGAIN at once.
        let word = crate::sync::Futex::new(1);
        word.wait(0);
        word.wake_one();
        word.wake_all();
        assert_eq!(errno(), SENTINEL, "futex changed errno");
        crate::cpu::fence::heavy();
        let _ = crate::cpu::fence::heavy_rseq();
        assert_eq!(errno(), SENTINEL, "membarrier changed errno");
        // A successful map and unmap leave it too.
        let p = super::map(1).unwrap();
        // SAFETY: just mapped with this length; unused.
        unsafe { super::unmap(p, 1) };
        assert_eq!(errno(), SENTINEL);
    }
}
