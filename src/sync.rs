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
            AtomicBool, AtomicI32, AtomicIsize, AtomicPtr, AtomicU8, AtomicUsize, Ordering, compiler_fence, fence,
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
            AtomicBool, AtomicI32, AtomicIsize, AtomicPtr, AtomicU8, AtomicUsize, Ordering, fence,
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

// --- Futex: sleeping on a word until another thread changes it (appended for `rmlock`) ---

/// A 32-bit atomic word that threads can sleep on ([`Futex::wait`]) until another
/// thread changes it and wakes them ([`Futex::wake_one`], [`Futex::wake_all`]).
///
/// The protocol is Linux's futex: a waiter sleeps only if the word still holds the value
/// it expects, checked atomically with going to sleep; a waker first changes the word,
/// then wakes. A wake that comes before the waiter sleeps is therefore never lost (the
/// waiter sees the new value and returns at once). `wait` may also return spuriously:
/// callers re-check their condition in a loop. The word itself is reached through
/// `Deref` (an `AtomicU32`).
///
/// Under loom the sleep is a `loom::sync::Condvar` wait under a `Mutex` that the waker
/// also takes, which keeps exactly that atomicity, so a model in which a wake-up can be
/// lost ends in a deadlock that loom reports.
pub(crate) use futex_imp::Futex;

#[cfg(not(scalemem_loom))]
mod futex_imp {
    use core::ops::Deref;
    use core::sync::atomic::AtomicU32;
    use rustix::thread::futex;

    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct Futex(AtomicU32);

    impl Futex {
        pub(crate) const fn new(value: u32) -> Self {
            Self(AtomicU32::new(value))
        }

        /// Sleeps while the word equals `expected` (`FUTEX_WAIT`, process-private).
        /// Returns at once if it does not; otherwise when woken, on a signal, or
        /// spuriously.
        pub(crate) fn wait(&self, expected: u32) {
            // EAGAIN (the word changed) and EINTR both mean "re-check": ignore the result.
            let _errno = crate::os::KeepErrno::new();
            let _ = futex::wait(&self.0, futex::Flags::PRIVATE, expected, None);
        }

        /// As [`wait`](Self::wait), but sleeps at most `timeout` (a relative
        /// `FUTEX_WAIT` timeout): returns when woken, on a signal, spuriously, or when
        /// the time has passed, and the caller cannot tell which.
        pub(crate) fn wait_timeout(&self, expected: u32, timeout: core::time::Duration) {
            let timeout = futex::Timespec {
                tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: i64::from(timeout.subsec_nanos()),
            };
            let _errno = crate::os::KeepErrno::new();
            let _ = futex::wait(&self.0, futex::Flags::PRIVATE, expected, Some(&timeout));
        }

        /// Wakes one thread sleeping in [`wait`](Self::wait) on this word.
        pub(crate) fn wake_one(&self) {
            let _errno = crate::os::KeepErrno::new();
            let _ = futex::wake(&self.0, futex::Flags::PRIVATE, 1);
        }

        /// Wakes every thread sleeping in [`wait`](Self::wait) on this word.
        pub(crate) fn wake_all(&self) {
            let _errno = crate::os::KeepErrno::new();
            let _ = futex::wake(&self.0, futex::Flags::PRIVATE, i32::MAX as u32);
        }
    }

    impl Deref for Futex {
        type Target = AtomicU32;
        #[inline]
        fn deref(&self) -> &AtomicU32 {
            &self.0
        }
    }
}

#[cfg(scalemem_loom)]
mod futex_imp {
    use core::ops::Deref;
    use loom::sync::atomic::{AtomicU32, Ordering};
    use loom::sync::{Condvar, Mutex};

    #[derive(Debug)]
    pub(crate) struct Futex {
        word: AtomicU32,
        /// Taken by a waiter from its check of the word until it sleeps, and by wakers:
        /// the kernel's futex hash-bucket lock.
        sleepers: Mutex<()>,
        wakeup: Condvar,
    }

    impl Futex {
        pub(crate) fn new(value: u32) -> Self {
            Self { word: AtomicU32::new(value), sleepers: Mutex::new(()), wakeup: Condvar::new() }
        }

        pub(crate) fn wait(&self, expected: u32) {
            let sleepers = self.sleepers.lock().unwrap();
            // SeqCst: the kernel's check is ordered after the waiter's earlier accesses
            // (futex_wait issues a full barrier before reading the word).
            if self.word.load(Ordering::SeqCst) == expected {
                drop(self.wakeup.wait(sleepers).unwrap());
            }
        }

        /// The model of a timed wait is [`wait`](Self::wait): no timeout fires, so a
        /// protocol that needs its waiter woken must wake it itself.
        pub(crate) fn wait_timeout(&self, expected: u32, _timeout: core::time::Duration) {
            self.wait(expected);
        }

        pub(crate) fn wake_one(&self) {
            let _sleepers = self.sleepers.lock().unwrap();
            self.wakeup.notify_one();
        }

        pub(crate) fn wake_all(&self) {
            let _sleepers = self.sleepers.lock().unwrap();
            self.wakeup.notify_all();
        }
    }

    impl Deref for Futex {
        type Target = AtomicU32;
        fn deref(&self) -> &AtomicU32 {
            &self.word
        }
    }
}

/// A process-wide source of unique, non-zero 64-bit identities (an `RmLock`'s tag in the
/// threads' reader slots). Not modelled under loom: an identity synchronises nothing.
pub(crate) fn unique_id() -> u64 {
    static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
    // Relaxed: only uniqueness matters, and every fetch_add returns a distinct value.
    NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
}

/// Moves the value out of an [`UnsafeCell`] (the std-side wrapper has no `into_inner`).
#[cfg(not(scalemem_loom))]
pub(crate) fn into_inner<T>(cell: UnsafeCell<T>) -> T {
    let cell = core::mem::ManuallyDrop::new(cell);
    // SAFETY: we own the cell, read its value once, and never drop or use the cell again
    // (ManuallyDrop); the wrapper has no drop glue of its own besides the value's.
    cell.with(|value| unsafe { value.read() })
}

/// Moves the value out of an [`UnsafeCell`].
#[cfg(scalemem_loom)]
pub(crate) fn into_inner<T>(cell: UnsafeCell<T>) -> T {
    cell.into_inner()
}

// --- Canary: a node's lifetime made visible to loom (appended for `ds`) ---

/// A marker that data-structure nodes embed: zero-sized and free in normal builds; under
/// loom a cell that readers [`touch`](Canary::touch) after reaching the node and that is
/// written when the node is dropped, so loom reports a free that is not ordered after
/// every read (what a reclamation bug looks like) as a causality violation.
pub(crate) use canary_imp::Canary;

#[cfg(not(scalemem_loom))]
mod canary_imp {
    #[derive(Debug, Default)]
    pub(crate) struct Canary;

    impl Canary {
        pub(crate) const fn new() -> Self {
            Self
        }

        #[inline]
        pub(crate) fn touch(&self) {}
    }
}

#[cfg(scalemem_loom)]
mod canary_imp {
    #[derive(Debug, Default)]
    pub(crate) struct Canary(loom::cell::UnsafeCell<()>);

    impl Canary {
        pub(crate) fn new() -> Self {
            Self(loom::cell::UnsafeCell::new(()))
        }

        /// A read of the node, checked against its drop.
        pub(crate) fn touch(&self) {
            self.0.with(|_| ());
        }
    }

    impl Drop for Canary {
        fn drop(&mut self) {
            self.0.with_mut(|_| ());
        }
    }
}

// --- Initial-exec thread-local words (appended for `umem` as the process's malloc) ---

/// A value that [`ie_thread_local!`] keeps in a thread-local 64-bit word.
pub(crate) trait TlsWord: Copy {
    /// The word that stores `self`.
    fn to_word(self) -> u64;
    /// The value a word stores; 0 is the value a word starts with.
    fn from_word(word: u64) -> Self;
}

impl TlsWord for bool {
    #[inline(always)]
    fn to_word(self) -> u64 {
        u64::from(self)
    }
    #[inline(always)]
    fn from_word(word: u64) -> Self {
        word != 0
    }
}

impl TlsWord for u32 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        u64::from(self)
    }
    #[inline(always)]
    fn from_word(word: u64) -> Self {
        word as u32
    }
}

impl TlsWord for u64 {
    #[inline(always)]
    fn to_word(self) -> u64 {
        self
    }
    #[inline(always)]
    fn from_word(word: u64) -> Self {
        word
    }
}

impl TlsWord for usize {
    #[inline(always)]
    fn to_word(self) -> u64 {
        self as u64
    }
    #[inline(always)]
    fn from_word(word: u64) -> Self {
        word as usize
    }
}

impl<T> TlsWord for *const T {
    #[inline(always)]
    fn to_word(self) -> u64 {
        self.expose_provenance() as u64
    }
    #[inline(always)]
    fn from_word(word: u64) -> Self {
        core::ptr::with_exposed_provenance(word as usize)
    }
}

/// Declares thread-local words that every thread starts at 0 (`false`, 0, null) and
/// that need no registration and have no destructor:
///
/// ```text
/// ie_thread_local! {
///     /// Set while this thread is inside the heap.
///     static GUARD: bool;
/// }
/// GUARD.set(true);
/// assert!(GUARD.get());
/// ```
///
/// Each `NAME` is a unit value whose `get`/`set` read and write the calling thread's
/// word. On x86-64 Linux (outside loom) the word is a symbol of the initial-exec TLS
/// model, read with one `fs:`-relative load of an offset from the GOT: unlike the
/// general-dynamic model of `thread_local!` in a shared library, it never calls
/// `__tls_get_addr`, which may take the dynamic loader's lock and call `malloc` (to grow
/// a thread's DTV after a `dlopen`); from inside `malloc`, as the library's slow paths
/// are, that deadlocks (preload lane, `preload/tests/dtv`). The library gets the
/// `STATIC_TLS` flag: its words live in the static TLS block, which `LD_PRELOAD` and
/// linking provide (glibc also keeps a reserve for a library loaded with `dlopen`).
/// Elsewhere, and under loom, the words are `thread_local!` cells.
///
/// The symbols are named after the crate's version and `NAME`, hidden, so two words of
/// one name in one crate version fail to link rather than alias.
#[cfg_attr(scalemem_loom, allow(unused_macros))] // no user is built under loom
macro_rules! ie_thread_local {
    ($($(#[$attr:meta])* $vis:vis static $name:ident: $ty:ty;)+) => {
        $($crate::sync::ie_thread_local_one!($(#[$attr])* $vis static $name: $ty);)+
    };
}
#[cfg_attr(scalemem_loom, allow(unused_imports))] // no user is built under loom
pub(crate) use ie_thread_local;

/// One word of [`ie_thread_local!`]: its storage ([`ie_word!`]) and its accessors, which
/// move the value through [`TlsWord`] and [`ie_load!`]/[`ie_store!`].
#[cfg_attr(scalemem_loom, allow(unused_macros))] // no user is built under loom
macro_rules! ie_thread_local_one {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $ty:ty) => {
        $crate::sync::ie_word!($name);

        $(#[$attr])*
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        $vis struct $name;

        impl $name {
            /// The fallback's storage: a `thread_local!` cell (loom's under loom).
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
            #[inline(always)]
            fn cell<R>(f: impl FnOnce(&core::cell::Cell<u64>) -> R) -> R {
                $crate::sync::thread_local! {
                    static WORD: core::cell::Cell<u64> = core::cell::Cell::new(0);
                }
                WORD.with(f)
            }

            /// The calling thread's value.
            #[inline(always)]
            #[allow(dead_code)]
            $vis fn get(self) -> $ty {
                <$ty as $crate::sync::TlsWord>::from_word($crate::sync::ie_load!($name))
            }

            /// Sets the calling thread's value.
            #[inline(always)]
            #[allow(dead_code)]
            $vis fn set(self, value: $ty) {
                $crate::sync::ie_store!($name, <$ty as $crate::sync::TlsWord>::to_word(value));
            }
        }
    };
}
#[cfg_attr(scalemem_loom, allow(unused_imports))] // no user is built under loom
pub(crate) use ie_thread_local_one;

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom)))]
mod ie_imp {
    /// The storage of word `NAME`: a zero-filled `.tbss` symbol, so every thread's copy
    /// starts at 0.
    macro_rules! ie_word {
        ($name:ident) => {
            core::arch::global_asm!(
                concat!(".pushsection .tbss.__scalemem_tls_", stringify!($name), ",\"awT\",@nobits"),
                ".p2align 3",
                concat!(".globl ", $crate::sync::ie_symbol!($name)),
                concat!(".hidden ", $crate::sync::ie_symbol!($name)),
                concat!(".type ", $crate::sync::ie_symbol!($name), ",@object"),
                concat!(".size ", $crate::sync::ie_symbol!($name), ",8"),
                concat!($crate::sync::ie_symbol!($name), ":"),
                ".zero 8",
                ".popsection",
            );
        };
    }
    pub(crate) use ie_word;

    /// The calling thread's word `NAME` (a `u64`).
    macro_rules! ie_load {
        ($name:ident) => {{
            let word: u64;
            // SAFETY: the GOT entry holds the word's offset from the thread pointer
            // (initial-exec model; the loader fills it when it places the library's
            // static TLS), so `fs:[offset]` is this thread's 8-byte word, which only this
            // thread reads and writes. Reads memory only; no stack.
            unsafe {
                core::arch::asm!(
                    concat!("mov {off}, qword ptr [rip + ", $crate::sync::ie_symbol!($name), "@GOTTPOFF]"),
                    "mov {word}, qword ptr fs:[{off}]",
                    off = out(reg) _,
                    word = out(reg) word,
                    options(nostack, readonly, preserves_flags),
                );
            }
            word
        }};
    }
    pub(crate) use ie_load;

    /// Stores `WORD` (a `u64`) into the calling thread's word `NAME`.
    macro_rules! ie_store {
        ($name:ident, $word:expr) => {{
            let word: u64 = $word;
            // SAFETY: as in `ie_load!`; the store is to this thread's own word.
            unsafe {
                core::arch::asm!(
                    concat!("mov {off}, qword ptr [rip + ", $crate::sync::ie_symbol!($name), "@GOTTPOFF]"),
                    "mov qword ptr fs:[{off}], {word}",
                    off = out(reg) _,
                    word = in(reg) word,
                    options(nostack, preserves_flags),
                );
            }
        }};
    }
    pub(crate) use ie_store;
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(scalemem_loom))))]
mod ie_imp {
    /// No storage of its own: the word is `NAME::cell`'s `thread_local!`.
    #[cfg_attr(scalemem_loom, allow(unused_macros))] // no user is built under loom
    macro_rules! ie_word {
        ($name:ident) => {};
    }
    pub(crate) use ie_word;

    /// The calling thread's word `NAME` (a `u64`).
    #[cfg_attr(scalemem_loom, allow(unused_macros))] // no user is built under loom
    macro_rules! ie_load {
        ($name:ident) => {
            $name::cell(core::cell::Cell::get)
        };
    }
    pub(crate) use ie_load;

    /// Stores `WORD` (a `u64`) into the calling thread's word `NAME`.
    #[cfg_attr(scalemem_loom, allow(unused_macros))] // no user is built under loom
    macro_rules! ie_store {
        ($name:ident, $word:expr) => {{
            let word: u64 = $word;
            $name::cell(|cell| cell.set(word));
        }};
    }
    pub(crate) use ie_store;
}

#[allow(unused_imports)]
pub(crate) use ie_imp::{ie_load, ie_store, ie_word};

/// The assembler symbol of the initial-exec word `NAME`.
#[allow(unused_macros)]
macro_rules! ie_symbol {
    ($name:ident) => {
        concat!(
            "__scalemem_",
            env!("CARGO_PKG_VERSION_MAJOR"),
            "_",
            env!("CARGO_PKG_VERSION_MINOR"),
            "_",
            env!("CARGO_PKG_VERSION_PATCH"),
            "_tls_",
            stringify!($name)
        )
    };
}
#[allow(unused_imports)]
pub(crate) use ie_symbol;
