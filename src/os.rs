//! Memory from the kernel: anonymous `mmap`/`munmap` through `rustix` (raw syscalls, so
//! never libc's `malloc`). Everything in the crate that needs memory outside the global
//! allocator (per-CPU arrays, epoch records and bags) takes it from here.

use core::ptr::NonNull;

use crate::util::AllocError;

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
    let len = page_round(len.max(1)).expect("length was accepted by map");
    lsan::unregister(ptr, len);
    // SAFETY: (1) the range is a whole mapping of ours; (2) nothing uses it.
    let result = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len) };
    // munmap of a range we mapped cannot fail short of a kernel bug; keep the memory
    // (a leak) rather than panic on a reclamation path.
    debug_assert!(result.is_ok());
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
