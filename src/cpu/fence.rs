//! Asymmetric fences: a nearly free [`light`] fence for the frequent side of a protocol
//! and an expensive [`heavy`] fence for the rare side.
//!
//! # Protocol
//!
//! Dekker-style protocols (an epoch pin against an epoch advance, a hazard publication
//! against a scan, a read-lock against a writer) need, on both sides, "my store is
//! visible before my next load". The symmetric way is a SeqCst fence on each side. The
//! asymmetric way makes the frequent side a compiler fence only and lets the rare side
//! call `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every CPU currently
//! running a thread of this process execute a full memory barrier before the call
//! returns (threads that are not running pass through a context switch, which is a full
//! barrier too). For any light-side thread the barrier falls somewhere in its program:
//! either before its store (then its following loads see everything the heavy side
//! published before the call) or after it (then the heavy side's following loads see
//! its store). That is exactly what the SeqCst-fence pair gives.
//!
//! # Modes
//!
//! The mode is chosen once per process, at the first fence:
//! - **asymmetric** (the default where the kernel allows it): `light()` is a compiler
//!   fence; `heavy()` is SeqCst fence + `membarrier` + SeqCst fence.
//! - **symmetric**: where membarrier registration is refused (old kernels, seccomp), or
//!   when `SCALEMEM_FENCE=symmetric` is set, or after [`use_symmetric`]: both sides are
//!   SeqCst fences.
//!
//! Switching from asymmetric to symmetric at run time is safe, because `heavy()` keeps
//! issuing membarrier once registered: a thread still using compiler fences is still
//! covered. The other direction is never taken.
//!
//! Under loom both sides are SeqCst fences (loom models SeqCst fences exactly).
//!
//! Cost on our 2-vCPU machines: `light()` is free, a SeqCst fence about 5-8 ns, and
//! membarrier 0.1 us alone but 10-35 us with other threads running: callers must issue
//! `heavy()` once per batch, never once per operation.

#[cfg(not(scalemem_loom))]
use crate::sync::atomic::{AtomicBool, AtomicU8};
use crate::sync::atomic::{Ordering, compiler_fence, fence};

#[cfg(not(scalemem_loom))]
const UNKNOWN: u8 = 0;
#[cfg(not(scalemem_loom))]
const ASYMMETRIC: u8 = 1;
#[cfg(not(scalemem_loom))]
const SYMMETRIC: u8 = 2;

/// The fence mode. Every store is Release and every load outside `light` is Acquire, so
/// a thread that reads any mode other than UNKNOWN also sees `REGISTERED` as it was when
/// the mode was first decided. `light` may load Relaxed: it does not read `REGISTERED`,
/// and a stale ASYMMETRIC after a switch to SYMMETRIC is still correct (module doc).
#[cfg(not(scalemem_loom))]
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Whether `MEMBARRIER_CMD_PRIVATE_EXPEDITED` is registered (then `heavy` always uses it).
#[cfg(not(scalemem_loom))]
static REGISTERED: AtomicBool = AtomicBool::new(false);
/// Whether `MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ` is registered.
#[cfg(not(scalemem_loom))]
static REGISTERED_RSEQ: AtomicBool = AtomicBool::new(false);

/// The mode fences are running in.
///
/// ```
/// use scalemem::cpu::fence::{self, Mode};
/// match fence::mode() {
///     // Asymmetric fences exist only where membarrier registration succeeded.
///     Mode::Asymmetric => assert!(fence::membarrier_registered()),
///     Mode::Symmetric => {}
/// }
/// fence::use_symmetric();
/// assert_eq!(fence::mode(), Mode::Symmetric); // and it never switches back
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `light` is a compiler fence, `heavy` a membarrier.
    Asymmetric,
    /// Both sides are SeqCst fences.
    Symmetric,
}

/// The current mode, deciding it if no fence has run yet.
///
/// ```
/// use scalemem::cpu::fence;
/// let mode = fence::mode();
/// assert!(matches!(mode, fence::Mode::Asymmetric | fence::Mode::Symmetric));
/// ```
pub fn mode() -> Mode {
    #[cfg(scalemem_loom)]
    {
        Mode::Symmetric
    }
    #[cfg(not(scalemem_loom))]
    {
        // Acquire: pairs with the Release stores of MODE (see there).
        match MODE.load(Ordering::Acquire) {
            ASYMMETRIC => Mode::Asymmetric,
            SYMMETRIC => Mode::Symmetric,
            _ => init_slow(),
        }
    }
}

/// Switches the process to symmetric fences (both sides SeqCst) from now on. Safe at any
/// time, from any thread; used by tests and by users who would rather not interrupt other
/// CPUs.
///
/// ```
/// use scalemem::cpu::fence;
/// fence::use_symmetric();
/// assert_eq!(fence::mode(), fence::Mode::Symmetric);
/// fence::light();
/// fence::heavy();
/// ```
pub fn use_symmetric() {
    #[cfg(not(scalemem_loom))]
    {
        // Decide first so that a racing init_slow cannot overwrite SYMMETRIC with
        // ASYMMETRIC afterwards (init_slow only CASes from UNKNOWN).
        let _ = mode();
        // Release: see MODE.
        MODE.store(SYMMETRIC, Ordering::Release);
    }
}

/// The light side: orders this thread's earlier stores before its later loads, relative
/// to any thread that calls [`heavy`].
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
/// static FLAG: AtomicBool = AtomicBool::new(false);
/// FLAG.store(true, Relaxed);
/// scalemem::cpu::fence::light(); // a heavy() caller now sees the store, or we see its
/// let _ = FLAG.load(Relaxed);    // stores from before its heavy() call
/// ```
#[inline]
pub fn light() {
    #[cfg(scalemem_loom)]
    {
        fence(Ordering::SeqCst);
    }
    #[cfg(not(scalemem_loom))]
    {
        // Relaxed: see MODE.
        match MODE.load(Ordering::Relaxed) {
            ASYMMETRIC => compiler_fence(Ordering::SeqCst),
            SYMMETRIC => fence(Ordering::SeqCst),
            _ => {
                let _ = init_slow();
                fence(Ordering::SeqCst);
            }
        }
    }
}

/// [`light`] for a caller that has seen [`mode`] return [`Mode::Asymmetric`] (at any
/// earlier time, on this thread): a compiler fence, with no load of the mode. Correct
/// even after a later switch to symmetric, because [`heavy`] keeps issuing membarrier
/// once registered (module doc). Under loom, a SeqCst fence.
#[inline]
pub(crate) fn light_asymmetric() {
    #[cfg(scalemem_loom)]
    {
        fence(Ordering::SeqCst);
    }
    #[cfg(not(scalemem_loom))]
    {
        compiler_fence(Ordering::SeqCst);
    }
}

/// The heavy side: a full barrier on this thread and on every CPU running a thread of
/// this process. Expensive (10-35 us with other threads running): amortise it.
///
/// ```
/// scalemem::cpu::fence::heavy();
/// ```
pub fn heavy() {
    fence(Ordering::SeqCst);
    #[cfg(not(scalemem_loom))]
    {
        // mode() loads MODE with Acquire, which makes init_slow's store to REGISTERED
        // visible here (see MODE); the Relaxed load below is then exact.
        let _ = mode();
        if REGISTERED.load(Ordering::Relaxed) {
            let _errno = crate::os::KeepErrno::new();
            let result = rustix::thread::membarrier(rustix::thread::MembarrierCommand::PrivateExpedited);
            // Registered commands cannot fail; if the kernel disagrees, stop relying on it.
            if result.is_err() {
                use_symmetric();
            }
        }
        fence(Ordering::SeqCst);
    }
    // Keep the compiler from moving memory accesses across the syscall.
    compiler_fence(Ordering::SeqCst);
}

/// Like [`heavy`], and also restarts every rseq critical section that is running on
/// another CPU of this process (`MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ`), so that after
/// it returns no CPU is in the middle of a per-CPU update that began before the call.
/// Returns `false` (having still issued [`heavy`]) where the kernel lacks the command,
/// in which case per-CPU data must be drained another way.
///
/// ```
/// let restarted = scalemem::cpu::fence::heavy_rseq();
/// if !restarted { /* fall back to per-CPU locks */ }
/// ```
pub fn heavy_rseq() -> bool {
    #[cfg(scalemem_loom)]
    {
        heavy();
        false
    }
    #[cfg(not(scalemem_loom))]
    {
        // Acquire through mode(), as in heavy().
        let _ = mode();
        if REGISTERED_RSEQ.load(Ordering::Relaxed) {
            fence(Ordering::SeqCst);
            let cmd = rustix::thread::MembarrierCommand::PrivateExpeditedRseq;
            let _errno = crate::os::KeepErrno::new();
            if rustix::thread::membarrier(cmd).is_ok() {
                fence(Ordering::SeqCst);
                return true;
            }
        }
        heavy();
        false
    }
}

/// Registers membarrier once and publishes the mode. Idempotent and race-free: every
/// racer registers (the kernel accepts repeats) and only the first CAS from UNKNOWN wins.
#[cfg(not(scalemem_loom))]
#[cold]
#[inline(never)]
fn init_slow() -> Mode {
    use rustix::thread::{MembarrierCommand, membarrier};
    let _errno = crate::os::KeepErrno::new();
    let forced = matches!(crate::os::getenv(b"SCALEMEM_FENCE\0"), Some(b"symmetric"));
    let registered = membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok();
    if registered {
        // Relaxed: published by the Release CAS of MODE below.
        REGISTERED.store(true, Ordering::Relaxed);
        if membarrier(MembarrierCommand::RegisterPrivateExpeditedRseq).is_ok() {
            REGISTERED_RSEQ.store(true, Ordering::Relaxed);
        }
    }
    let wanted = if registered && !forced { ASYMMETRIC } else { SYMMETRIC };
    // Release: publishes the REGISTERED stores above (see MODE). Losing the race is fine:
    // the winner computed the same answer, or use_symmetric() overrode it.
    let _ = MODE.compare_exchange(UNKNOWN, wanted, Ordering::Release, Ordering::Relaxed);
    // Acquire: see MODE.
    match MODE.load(Ordering::Acquire) {
        ASYMMETRIC => Mode::Asymmetric,
        _ => Mode::Symmetric,
    }
}

/// Whether `heavy()` issues a real membarrier (registration succeeded).
///
/// ```
/// let _ = scalemem::cpu::fence::membarrier_registered();
/// ```
pub fn membarrier_registered() -> bool {
    #[cfg(scalemem_loom)]
    {
        false
    }
    #[cfg(not(scalemem_loom))]
    {
        // Acquire through mode(), as in heavy().
        let _ = mode();
        REGISTERED.load(Ordering::Relaxed)
    }
}
