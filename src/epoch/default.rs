//! The process-wide default collector and each thread's registration with it.
//!
//! Registration must not allocate through the global allocator (the allocator pins on
//! its own paths), and must not rely on `thread_local!` destructors, which std
//! registers lazily in an allocating list. So the thread's record pointer lives in a
//! destructor-free thread-local word of the initial-exec TLS model
//! ([`ie_thread_local!`](crate::sync::ie_thread_local), which never calls
//! `__tls_get_addr` from inside `malloc`), and thread exit
//! is observed with a pthread key whose destructor releases the record. A thread that
//! pins after its key destructor ran (from another thread-local destructor) gets a
//! temporary record for the duration of the call, as does every call where the key
//! could not be created.

use super::collector::Collector;
use super::guard::Guard;

/// Registers the default collector's `fork` child handler (`imp::register_fork_handler`).
#[cfg(not(scalemem_loom))]
pub(crate) use imp::register_fork_handler;

#[cfg(not(scalemem_loom))]
mod imp {
    use core::ptr::{self, NonNull};

    use super::super::collector::Collector;
    use super::super::internal::{Global, Local};
    use crate::thread_exit::ExitKey;

    static DEFAULT_GLOBAL: Global = Global::new_static();

    /// The default collector: a reference to a static that is never torn down.
    pub(super) static COLLECTOR: Collector = Collector {
        // SAFETY: the address of a static is never null.
        global: unsafe { NonNull::new_unchecked(&DEFAULT_GLOBAL as *const Global as *mut Global) },
    };

    /// Marks a thread whose key destructor has run: later pins use temporary records.
    const EXITED: *const Local = ptr::dangling::<Local>();

    crate::sync::ie_thread_local! {
        /// This thread's record, [`EXITED`] after its key destructor ran; null before it
        /// registers.
        static RECORD: *const Local;
    }

    /// The pthread key whose destructor releases a thread's record.
    static KEY: ExitKey = ExitKey::new(release_at_exit);

    /// Thread-exit hook: releases the thread's handle on its record.
    unsafe extern "C" fn release_at_exit(record: *mut libc::c_void) {
        RECORD.set(EXITED);
        if let Some(local) = NonNull::new(record.cast::<Local>()) {
            // SAFETY: the key's value is the record this thread registered, on which it
            // holds the handle released here; the thread no longer uses it.
            unsafe { Local::release_handle(local) };
        }
    }

    /// Calls `f` with this thread's record, registering the thread on first use.
    #[inline]
    pub(super) fn with_local<R>(f: impl FnOnce(NonNull<Local>) -> R) -> R {
        let current = RECORD.get();
        match NonNull::new(current as *mut Local) {
            Some(local) if current != EXITED => f(local),
            _ => with_local_slow(current, f),
        }
    }

    /// Whether the fork handler is registered.
    static AT_FORK: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

    /// `pthread_atfork` child handler: see [`Global::after_fork_in_child`].
    extern "C" fn after_fork_in_child() {
        let me = RECORD.get();
        let me = if me == EXITED { ptr::null() } else { me };
        // SAFETY: the child of fork, in its handler: the only thread, which was in
        // `fork`, not in a collection or an advance; `me` is its registered record.
        unsafe { DEFAULT_GLOBAL.after_fork_in_child(me) };
    }

    /// Registers the fork handler once. glibc's registration allocates, and takes the
    /// lock that `fork` holds while it runs every prepare handler: so it must not run
    /// under a lock that a prepare handler takes. umem calls this from its own
    /// registration, before it takes any lock; a thread's first pin calls it too.
    pub(crate) fn register_fork_handler() {
        // Relaxed: only one caller registers; the handler reads nothing published here.
        if !AT_FORK.swap(true, core::sync::atomic::Ordering::Relaxed) {
            // SAFETY: the handler is an `extern "C"` function that does not unwind.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        }
    }

    #[cold]
    #[inline(never)]
    fn with_local_slow<R>(current: *const Local, f: impl FnOnce(NonNull<Local>) -> R) -> R {
        register_fork_handler();
        let local = Global::register(COLLECTOR.global)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Local>()));
        if current.is_null()
            && let Some(key) = KEY.get()
        {
            // SAFETY: `key` is a live key; the value is this thread's record.
            if unsafe { libc::pthread_setspecific(key, local.as_ptr().cast()) } == 0 {
                RECORD.set(local.as_ptr());
                return f(local);
            }
        }
        // A temporary registration: the thread is exiting, or exit cannot be observed.
        struct Release(NonNull<Local>);
        impl Drop for Release {
            fn drop(&mut self) {
                // SAFETY: the temporary handle taken by register() above.
                unsafe { Local::release_handle(self.0) };
            }
        }
        let _release = Release(local);
        f(local)
    }
}

#[cfg(scalemem_loom)]
mod imp {
    use core::ptr::NonNull;

    use super::super::internal::Local;

    crate::sync::lazy_static! {
        pub(super) static ref COLLECTOR: super::super::collector::Collector = super::super::collector::Collector::new();
    }

    crate::sync::thread_local! {
        static HANDLE: super::super::collector::LocalHandle = COLLECTOR.register();
    }

    pub(super) fn with_local<R>(f: impl FnOnce(NonNull<Local>) -> R) -> R {
        HANDLE.with(|handle| f(handle.local))
    }
}

/// Pins the current thread in the default collector.
///
/// ```
/// let guard = scalemem::epoch::pin();
/// assert!(scalemem::epoch::is_pinned());
/// drop(guard);
/// assert!(!scalemem::epoch::is_pinned());
/// ```
#[inline]
pub fn pin() -> Guard {
    // SAFETY: with_local passes a record claimed by this thread, which stays claimed
    // while the guard's pin lives (unpin finalises only after the last guard).
    imp::with_local(|local| unsafe { Guard::enter(local) })
}

/// Whether the current thread is pinned in the default collector.
///
/// ```
/// assert!(!scalemem::epoch::is_pinned());
/// ```
#[inline]
pub fn is_pinned() -> bool {
    // SAFETY: with_local passes a live, claimed record of this thread.
    imp::with_local(|local| unsafe { local.as_ref() }.is_pinned())
}

/// The process-wide default collector.
///
/// ```
/// let c = scalemem::epoch::default_collector();
/// let _ = c.epoch();
/// ```
pub fn default_collector() -> &'static Collector {
    &imp::COLLECTOR
}
