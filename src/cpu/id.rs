//! Which CPU am I on, and how many CPU slots are there.
//!
//! On Linux with glibc 2.35 or later, glibc registers a restartable-sequences area for
//! every thread and exports `__rseq_offset` (its offset from the thread pointer) and
//! `__rseq_size` (0 when glibc did not register, for example under
//! `GLIBC_TUNABLES=glibc.pthread.rseq=0`). The kernel keeps the area's `cpu_id` field
//! current, so the CPU number costs one thread-pointer-relative load. Where the area is
//! missing we call `sched_getcpu` (the vDSO `getcpu`, tens of nanoseconds).
//!
//! We never register an rseq area of our own: a thread may hold only one registration,
//! and the programs that turn glibc's off (`glibc.pthread.rseq=0`) do so because another
//! runtime (tcmalloc, for one) wants that slot. Taking it would break them.
//!
//! Under loom the CPU is the model thread's index modulo 2, and there are 2 CPUs.

#[cfg(not(scalemem_loom))]
use crate::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Offsets of the fields of the kernel's `struct rseq` that glibc's 20-byte registration
/// makes usable.
#[cfg(not(scalemem_loom))]
pub(crate) mod rseq_abi {
    /// `cpu_id`: the current CPU, or `u32::MAX`/`u32::MAX - 1` when not registered.
    pub(crate) const CPU_ID: usize = 4;
    /// `rseq_cs`: pointer to the active critical-section descriptor.
    pub(crate) const RSEQ_CS: usize = 8;
    /// The abort signature glibc registers on x86.
    pub(crate) const SIGNATURE: u32 = 0x5305_3053;
}

#[cfg(all(not(scalemem_loom), target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// glibc (2.35+): offset of the thread's `struct rseq` from the thread pointer.
    static __rseq_offset: isize;
    /// glibc (2.35+): size of the registered area, 0 if glibc did not register.
    static __rseq_size: u32;
}

#[cfg(not(scalemem_loom))]
const RSEQ_UNKNOWN: u8 = 0;
#[cfg(not(scalemem_loom))]
const RSEQ_ON: u8 = 1;
#[cfg(not(scalemem_loom))]
const RSEQ_OFF: u8 = 2;

/// Whether rseq may be used, decided once per process. The value is derived from
/// immutable process facts, so any thread that computes it computes the same answer;
/// what it publishes is [`RSEQ_OFFSET`] (Release store, Acquire loads).
#[cfg(not(scalemem_loom))]
static RSEQ_STATE: AtomicU8 = AtomicU8::new(RSEQ_UNKNOWN);

/// glibc's `__rseq_offset`, copied once rseq is on (0 before): a plain word of ours, so
/// that the hot paths reach it with one load instead of two through the GOT. Stored
/// before the Release store of [`RSEQ_STATE`] that says "on"; a hot path reads it only
/// after it, or a thread it synchronised with, saw `rseq_enabled()` return true.
#[cfg(all(not(scalemem_loom), target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
static RSEQ_OFFSET: core::sync::atomic::AtomicIsize = core::sync::atomic::AtomicIsize::new(0);

/// True if this process uses glibc's rseq registration: glibc registered an area
/// (`__rseq_size >= 20`), the target has our critical sections (x86_64), and
/// `SCALEMEM_RSEQ=0` is not set. A given thread's registration can still have failed;
/// [`rseq::thread_area`](crate::cpu::rseq::thread_area) checks that per thread.
///
/// ```
/// use scalemem::cpu::{rseq, rseq_enabled};
///
/// let on = rseq_enabled();
/// if std::env::var("SCALEMEM_RSEQ").as_deref() == Ok("0") {
///     assert!(!on); // switched off for the process
/// }
/// if !on {
///     assert!(rseq::thread_area().is_none()); // and so for every thread
/// }
/// assert_eq!(rseq_enabled(), on); // decided once: it never changes
/// ```
#[inline]
pub fn rseq_enabled() -> bool {
    #[cfg(scalemem_loom)]
    {
        false
    }
    #[cfg(not(scalemem_loom))]
    {
        // Acquire: pairs with the Release store in `rseq_init_slow` (RSEQ_OFFSET).
        match RSEQ_STATE.load(Ordering::Acquire) {
            RSEQ_ON => true,
            RSEQ_OFF => false,
            _ => rseq_init_slow(),
        }
    }
}

#[cfg(not(scalemem_loom))]
#[cold]
fn rseq_init_slow() -> bool {
    let wanted = !matches!(crate::os::getenv(b"SCALEMEM_RSEQ\0"), Some(b"0"));
    let on = wanted && glibc_rseq_size() >= 20 && cfg!(target_arch = "x86_64");
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    if on {
        // SAFETY: glibc exports `__rseq_offset` as a constant of the process (set before
        // any user code runs); reading it has no side effects.
        // Relaxed: published by the Release store below.
        RSEQ_OFFSET.store(unsafe { __rseq_offset }, Ordering::Relaxed);
    }
    // Release: pairs with the Acquire load in `rseq_enabled` (RSEQ_OFFSET).
    RSEQ_STATE.store(if on { RSEQ_ON } else { RSEQ_OFF }, Ordering::Release);
    on
}

#[cfg(all(not(scalemem_loom), target_os = "linux", target_env = "gnu"))]
fn glibc_rseq_size() -> u32 {
    // SAFETY: glibc writes __rseq_size once, before any user code runs.
    unsafe { __rseq_size }
}

#[cfg(all(not(scalemem_loom), not(all(target_os = "linux", target_env = "gnu"))))]
fn glibc_rseq_size() -> u32 {
    0
}

/// The address of this thread's rseq area, if [`rseq_enabled`] and this thread's
/// registration succeeded (its `cpu_id` is a CPU number).
#[cfg(all(not(scalemem_loom), target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[inline]
pub(crate) fn rseq_area() -> Option<*mut u8> {
    if !rseq_enabled() {
        return None;
    }
    let area = rseq_area_unchecked();
    // SAFETY: `area` points to this thread's live struct rseq; cpu_id is a u32 at offset 4
    // that only the kernel writes (on this thread's behalf), so a volatile read is exact.
    let cpu = unsafe { core::ptr::read_volatile(area.add(rseq_abi::CPU_ID).cast::<u32>()) };
    // cpu_id is u32::MAX (uninitialised) or u32::MAX - 1 (registration failed) otherwise.
    (cpu < 0x8000_0000).then_some(area)
}

/// This thread's rseq area, registered or not: thread pointer + `__rseq_offset`, without
/// the checks of [`rseq_area`]. The caller must have seen [`rseq_enabled`] (once is
/// enough: the decision never changes); `rseq::thread_area_unchecked` is the hot paths'
/// way in.
#[cfg(all(not(scalemem_loom), target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[inline]
pub(crate) fn rseq_area_unchecked() -> *mut u8 {
    let tp: *mut u8;
    // SAFETY: on x86_64 glibc the word at %fs:0 is the thread control block's pointer to
    // itself (the thread pointer); reading it has no side effects, and it is the same
    // for the whole life of the thread (`pure`).
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags, pure));
    }
    // SAFETY: rseq_enabled() (the caller's precondition) saw __rseq_size >= 20, so glibc
    // placed a struct rseq at thread pointer + __rseq_offset in every thread's TCB; it
    // lives as long as the thread.
    unsafe { tp.offset(__rseq_offset) }
}

/// glibc's `__rseq_offset` as [`RSEQ_OFFSET`] holds it: this thread's rseq area is at
/// the thread pointer plus this. The caller must have seen [`rseq_enabled`] return true,
/// itself or through a thread it synchronised with (the hot paths reach their per-CPU
/// slots through such a chain: a cache is built after that decision and published).
#[cfg(all(not(scalemem_loom), target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
#[inline]
pub(crate) fn rseq_offset_unchecked() -> isize {
    // Relaxed: ordered by the caller's chain from the Acquire load in `rseq_enabled`.
    RSEQ_OFFSET.load(Ordering::Relaxed)
}

/// The address of this thread's rseq area: never available on this target.
#[cfg(all(not(scalemem_loom), not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))))]
#[inline]
pub(crate) fn rseq_area() -> Option<*mut u8> {
    None
}

/// The CPU this thread is running on, in `0..possible()`.
///
/// The answer may be stale by the time it is used (the thread can migrate at any
/// moment); per-CPU structures built on it must be correct for any answer and merely
/// fast for the right one.
///
/// ```
/// let cpu = scalemem::cpu::current();
/// assert!(cpu < scalemem::cpu::possible());
/// ```
#[inline]
pub fn current() -> usize {
    #[cfg(scalemem_loom)]
    {
        crate::sync::thread_index() % 2
    }
    #[cfg(not(scalemem_loom))]
    {
        let cpu = match rseq_area() {
            // SAFETY: rseq_area() returned this thread's live area; see there.
            Some(area) => unsafe { core::ptr::read_volatile(area.add(rseq_abi::CPU_ID).cast::<u32>()) as usize },
            None => rustix::thread::sched_getcpu(),
        };
        let n = possible();
        // A CPU number past the possible mask (CPU hotplug races, a container lying about
        // /sys) still lands in a valid slot.
        if cpu < n { cpu } else { cpu % n }
    }
}

/// The number of CPU slots per-CPU structures allocate: one more than the highest
/// possible CPU number (`/sys/devices/system/cpu/possible`), else the affinity mask's.
///
/// ```
/// assert!(scalemem::cpu::possible() >= 1);
/// ```
#[inline]
pub fn possible() -> usize {
    #[cfg(scalemem_loom)]
    {
        2
    }
    #[cfg(not(scalemem_loom))]
    {
        // Relaxed: a pure function of the machine, computed identically by every thread.
        static POSSIBLE: AtomicUsize = AtomicUsize::new(0);
        match POSSIBLE.load(Ordering::Relaxed) {
            0 => {
                let n = possible_slow().max(1);
                POSSIBLE.store(n, Ordering::Relaxed);
                n
            }
            n => n,
        }
    }
}

#[cfg(not(scalemem_loom))]
#[cold]
fn possible_slow() -> usize {
    let _errno = crate::os::KeepErrno::new();
    if let Some(n) = read_possible_mask() {
        return n;
    }
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).rev().find(|&cpu| set.is_set(cpu)).map_or(1, |cpu| cpu + 1),
        Err(_) => 1,
    }
}

/// Parses `/sys/devices/system/cpu/possible` ("0-15", "0,2-3") into highest + 1, with a
/// stack buffer: this runs inside allocator initialisation.
#[cfg(not(scalemem_loom))]
fn read_possible_mask() -> Option<usize> {
    use rustix::fs::{Mode, OFlags, open};
    let fd = open("/sys/devices/system/cpu/possible", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut buf = [0u8; 256];
    let n = rustix::io::read(&fd, &mut buf).ok()?;
    // `get`, not indexing: no allocator path may hold a formatting panic.
    parse_cpu_list(buf.get(..n)?)
}

/// Highest CPU number in a kernel CPU list ("0-3,8,10-11\n"), plus one.
#[cfg(not(scalemem_loom))]
pub(crate) fn parse_cpu_list(text: &[u8]) -> Option<usize> {
    let mut highest: Option<usize> = None;
    let mut number: Option<usize> = None;
    for &byte in text {
        match byte {
            b'0'..=b'9' => {
                let digit = usize::from(byte - b'0');
                number = Some(number.unwrap_or(0).checked_mul(10)?.checked_add(digit)?);
            }
            b'-' | b',' | b'\n' | b' ' => {
                if let Some(n) = number.take() {
                    highest = Some(highest.map_or(n, |h: usize| h.max(n)));
                }
            }
            _ => return None,
        }
    }
    if let Some(n) = number {
        highest = Some(highest.map_or(n, |h: usize| h.max(n)));
    }
    highest.map(|h| h + 1)
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_cpu_lists() {
        assert_eq!(parse_cpu_list(b"0-1\n"), Some(2));
        assert_eq!(parse_cpu_list(b"0\n"), Some(1));
        assert_eq!(parse_cpu_list(b"0-3,8,10-11\n"), Some(12));
        assert_eq!(parse_cpu_list(b""), None);
        assert_eq!(parse_cpu_list(b"zero"), None);
        assert_eq!(parse_cpu_list(b"99999999999999999999999"), None);
    }

    #[test]
    fn current_is_in_range_and_follows_affinity() {
        let n = possible();
        assert!(current() < n);
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Pin to each CPU we may run on in turn and check current() agrees.
        let original = rustix::thread::sched_getaffinity(None).unwrap();
        for cpu in (0..online.min(n)).filter(|&c| original.is_set(c)) {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpu);
            rustix::thread::sched_setaffinity(None, &set).unwrap();
            assert_eq!(current(), cpu);
        }
        rustix::thread::sched_setaffinity(None, &original).unwrap();
    }

    #[test]
    fn glibc_rseq_is_used_here() {
        // Our machines run glibc 2.36, which registers rseq for every thread, unless the
        // environment turned it off (CI runs the suite once that way).
        // SCALEMEM_EXPECT_REFUSED: the suite runs under a seccomp filter that refuses the
        // rseq system call (ci/modes.sh), so glibc's registration fails.
        let turned_off = std::env::var("SCALEMEM_RSEQ").as_deref() == Ok("0")
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("rseq=0"))
            || std::env::var_os("SCALEMEM_EXPECT_REFUSED").is_some();
        if cfg!(all(target_arch = "x86_64", target_env = "gnu")) && !turned_off {
            assert!(rseq_enabled());
            assert!(rseq_area().is_some());
            let other = std::thread::spawn(|| rseq_area().map(|p| p as usize)).join().unwrap();
            assert!(other.is_some());
            assert_ne!(other, rseq_area().map(|p| p as usize));
        } else if turned_off {
            assert!(!rseq_enabled());
            assert!(rseq_area().is_none());
        }
    }
}
