//! The one facade over the synchronisation primitives the crate uses.
//!
//! Everything in `scalemem` that touches an atomic, an `UnsafeCell`, a thread-local, a
//! spin hint or a fence goes through this module, so that building with
//! `RUSTFLAGS="--cfg scalemem_loom"` and the `loom` feature swaps every one of them for
//! [loom]'s model-checked version at once. No other file names `std::sync::atomic` or
//! `loom` directly.
//!
//! [loom]: https://docs.rs/loom

#[cfg(all(scalemem_loom, not(feature = "loom")))]
compile_error!("`--cfg scalemem_loom` needs the `loom` feature: build with `--features loom`");

#[cfg(not(scalemem_loom))]
mod imp {
    #[allow(unused_imports)] // the facade offers the full set; each mode uses a subset
    pub(crate) mod atomic {
        pub(crate) use core::sync::atomic::{
            AtomicBool, AtomicIsize, AtomicPtr, AtomicU8, AtomicUsize, Ordering, compiler_fence, fence,
        };
    }
    pub(crate) use std::thread::yield_now;
    pub(crate) use std::thread_local;

    /// A spin-wait hint (`pause` on x86).
    #[inline]
    pub(crate) fn spin_loop() {
        core::hint::spin_loop();
    }

    /// `core::cell::UnsafeCell` with loom's `with`/`with_mut` access style, so that code
    /// written once is checked for unsynchronised access under loom.
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T: ?Sized>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        #[inline]
        pub(crate) const fn new(value: T) -> Self {
            Self(core::cell::UnsafeCell::new(value))
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        /// Calls `f` with a shared raw pointer to the contents.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Calls `f` with a mutable raw pointer to the contents.
        #[inline]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(scalemem_loom)]
mod imp {
    #[allow(unused_imports)] // the facade offers the full set; each mode uses a subset
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{
            AtomicBool, AtomicIsize, AtomicPtr, AtomicU8, AtomicUsize, Ordering, fence,
        };

        /// Loom has no compiler fence; a SeqCst fence is the conservative model of it.
        pub(crate) fn compiler_fence(order: Ordering) {
            fence(order);
        }
    }
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::lazy_static;
    pub(crate) use loom::thread::yield_now;
    pub(crate) use loom::thread_local;

    /// Under loom a spin is a yield, so the scheduler can run the thread we wait for.
    pub(crate) fn spin_loop() {
        loom::thread::yield_now();
    }

    /// The index loom gave the current model thread (0 for the main thread): the
    /// modelled CPU number is derived from it.
    pub(crate) fn thread_index() -> usize {
        use core::fmt::Write;
        // loom's ThreadId has no accessor; its Debug form is "ThreadId(<n>)".
        struct Digits(usize);
        impl Write for Digits {
            fn write_str(&mut self, s: &str) -> core::fmt::Result {
                for b in s.bytes().filter(u8::is_ascii_digit) {
                    self.0 = self.0 * 10 + usize::from(b - b'0');
                }
                Ok(())
            }
        }
        let mut digits = Digits(0);
        let _ = write!(digits, "{:?}", loom::thread::current().id());
        digits.0
    }
}

pub(crate) use imp::*;
