//! Thread-exit hooks that allocate nothing: a pthread key whose destructor runs when a
//! thread that set a non-null value for it exits. std's `thread_local!` destructors are
//! registered lazily in an allocating list, which code serving the global allocator must
//! not use; a key's destructor is glibc's own bookkeeping. Shared by the epoch
//! collector's and the hazard domains' thread registration.

use crate::sync::atomic::{AtomicUsize, Ordering};

/// A lazily created pthread key with a fixed destructor.
pub(crate) struct ExitKey {
    /// 0 until created, then key + 1. Acquire/Release: the winner's key value is all that
    /// is published.
    key: AtomicUsize,
    destructor: unsafe extern "C" fn(*mut libc::c_void),
}

impl ExitKey {
    /// A key whose `destructor` runs at the exit of every thread that set a value.
    pub(crate) const fn new(destructor: unsafe extern "C" fn(*mut libc::c_void)) -> Self {
        Self { key: AtomicUsize::new(0), destructor }
    }

    /// The key, created on first use; `None` if the process is out of keys.
    pub(crate) fn get(&self) -> Option<libc::pthread_key_t> {
        // Acquire: pairs with the Release CAS below.
        match self.key.load(Ordering::Acquire) {
            0 => {}
            k => return Some((k - 1) as libc::pthread_key_t),
        }
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a valid out-pointer and the destructor has the signature
        // pthread destructors need.
        if unsafe { libc::pthread_key_create(&mut key, Some(self.destructor)) } != 0 {
            return None;
        }
        // Release: publishes the created key to the Acquire loads above.
        match self.key.compare_exchange(0, key as usize + 1, Ordering::Release, Ordering::Acquire) {
            Ok(_) => Some(key),
            Err(winner) => {
                // SAFETY: our key was never used; another thread's won.
                unsafe { libc::pthread_key_delete(key) };
                Some((winner - 1) as libc::pthread_key_t)
            }
        }
    }
}
