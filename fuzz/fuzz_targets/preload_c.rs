//! `preload_c`: the C API of the `LD_PRELOAD` library (`preload/src/lib.rs`) — `malloc`,
//! `calloc`, `realloc`, `reallocarray`, `memalign`, `posix_memalign`, `aligned_alloc`,
//! `valloc`, `pvalloc`, `malloc_usable_size`, `free`, `cfree`, `free_sized`,
//! `free_aligned_sized`, the `__libc_*` names, `malloc_trim`, `mallopt`, `mallinfo`,
//! `mallinfo2` — called with sizes and alignments from the fuzzer, absurd ones included
//! (0, odd and non-power-of-two alignments, sizes near `SIZE_MAX`, `n * size` that
//! overflows), and checked against glibc's semantics as the library documents them:
//! null with `errno` `ENOMEM` for a failure or an overflow, `EINVAL` for an alignment
//! `aligned_alloc` or `memalign` cannot take, `posix_memalign`'s return codes with
//! `*memptr` and `errno` untouched, zeroed `calloc` memory, `realloc(p, 0)` freeing `p`
//! and returning null with `errno` untouched, a failed `realloc` leaving the block intact,
//! `pvalloc`'s whole pages, `malloc_usable_size` at least the size asked (0 for null and
//! for pointers that are not the library's, which `free` ignores). Live blocks carry a
//! fill pattern checked before every resize and free, as in `alloc_api`.
//!
//! # How the library is linked: the whole process runs on it
//!
//! The library's functions are `#[no_mangle] extern "C"` definitions of `malloc` and
//! friends. Linking them into a fuzzer binary (as an rlib, or as here, with
//! `preload/src/lib.rs` compiled as a module of this target) makes them the process's
//! `malloc`: the executable's definition interposes on glibc's, so libFuzzer's own C++
//! allocations, Rust's `System` allocator and glibc's internal `malloc` calls all land
//! in scalemem. That clashes with AddressSanitizer, which must own `malloc` itself
//! (duplicate symbols, or ASan's interceptors never seeing the blocks), so this target
//! is built with `--sanitizer none` (ci/fuzz.sh does), and every byte the fuzzer touches
//! is served by the library under test: a real `LD_PRELOAD`-style run in itself. The
//! first input checks that interposition took (a block from glibc's `strdup` is one of
//! the library's). The library's constructor starts its maintenance thread, as under
//! `LD_PRELOAD` (`SCALEMEM_BACKGROUND=0` turns it off).
//!
//! The module is compiled from the library's own source, unchanged, rather than through
//! an rlib of `scalemem-preload`: an rlib crate type there would share the name
//! `libscalemem.rlib` with the main crate's in `target/`, a collision cargo warns about
//! in every workspace build; a `#[path]` module needs no change to `preload/`.

#![no_main]

mod common;

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use std::sync::Once;

use arbitrary::Arbitrary;
use common::{IMPOSSIBLE, MAX_BYTES, MAX_LIVE, RawAlign, Size};
use libfuzzer_sys::fuzz_target;

#[path = "../../preload/src/lib.rs"]
#[allow(dead_code, clippy::all)]
mod preload;

use preload as c;

#[derive(Arbitrary, Debug)]
enum Op {
    Malloc {
        size: Size,
        libc_name: bool,
    },
    Calloc {
        n: Size,
        size: Size,
        libc_name: bool,
    },
    /// `realloc` of a live block, or of null when `null` (then it is `malloc`).
    Realloc {
        slot: u8,
        null: bool,
        size: Size,
        libc_name: bool,
    },
    ReallocArray {
        slot: u8,
        null: bool,
        n: Size,
        size: Size,
    },
    Memalign {
        align: RawAlign,
        size: Size,
        libc_name: bool,
    },
    PosixMemalign {
        align: RawAlign,
        size: Size,
    },
    AlignedAlloc {
        align: RawAlign,
        size: Size,
    },
    Valloc {
        size: Size,
        libc_name: bool,
    },
    Pvalloc {
        size: Size,
        libc_name: bool,
    },
    /// Frees a live block through one of the seven ways to (see [`free_by`]).
    Free {
        slot: u8,
        how: u8,
    },
    UsableSize {
        slot: u8,
    },
    /// `free`, `malloc_usable_size` or `realloc` of null or of a pointer that is not the
    /// library's (static or stack memory).
    Foreign {
        how: u8,
        size: Size,
    },
    Trim,
    Mallopt {
        param: i8,
        value: c_int,
    },
    Mallinfo,
}

/// What a request may do: succeed (it must), fail (it must), or either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Succeed,
    Fail,
    Either,
}

fn expect(size: usize, align: usize) -> Expect {
    if size >= IMPOSSIBLE || align >= IMPOSSIBLE {
        Expect::Fail
    } else if size <= 4 << 20 && align <= 1 << 30 {
        Expect::Succeed
    } else {
        Expect::Either
    }
}

const SENTINEL: c_int = 12345;

fn errno() -> c_int {
    // SAFETY: the calling thread's errno: valid, aligned, ours.
    unsafe { *libc::__errno_location() }
}

fn set_errno(v: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = v };
}

fn page() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

struct Block {
    ptr: *mut c_void,
    size: usize,
    tag: u8,
}

impl Block {
    fn check(&self, what: &str) {
        // SAFETY: a live block of `size` bytes.
        unsafe { common::check(self.ptr.cast(), self.size, self.size, self.tag, what) };
    }
}

struct State {
    live: Vec<Block>,
    bytes: usize,
    next_tag: u8,
}

impl State {
    /// Whether a possible request of `size` more bytes is to be skipped (the bounds).
    fn too_big(&self, size: usize) -> bool {
        size < IMPOSSIBLE && (self.live.len() >= MAX_LIVE || size > MAX_BYTES - self.bytes)
    }

    /// Checks the outcome of an allocation: null with `errno` `err` where it must fail, a
    /// block aligned to `align` with `size` usable bytes (zero if `zeroed`) where it
    /// must succeed; a block is filled and kept.
    fn outcome(&mut self, p: *mut c_void, size: usize, align: usize, ex: Expect, err: c_int, zeroed: bool, what: &str) {
        if p.is_null() {
            assert_ne!(ex, Expect::Succeed, "{what}: null");
            assert_eq!(errno(), err, "{what}: null, errno");
            return;
        }
        assert_ne!(ex, Expect::Fail, "{what}: succeeded");
        assert_eq!(p as usize % align, 0, "{what}: {p:?} is not aligned to {align}");
        // SAFETY: a live block of the library.
        let usable = unsafe { c::malloc_usable_size(p) };
        assert!(usable >= size, "{what}: malloc_usable_size {usable} < {size}");
        if zeroed {
            // SAFETY: `size` readable bytes.
            unsafe { common::check_zero(p.cast(), size, what) };
        }
        self.keep(p, size);
    }

    fn keep(&mut self, p: *mut c_void, size: usize) {
        self.next_tag = self.next_tag.wrapping_add(101);
        // SAFETY: `size` writable bytes.
        unsafe { common::fill(p.cast(), size, self.next_tag) };
        self.bytes += size;
        self.live.push(Block { ptr: p, size, tag: self.next_tag });
    }

    fn take(&mut self, slot: u8) -> Option<Block> {
        if self.live.is_empty() {
            return None;
        }
        let b = self.live.swap_remove(usize::from(slot) % self.live.len());
        self.bytes -= b.size;
        b.check("before resize or free");
        Some(b)
    }

    fn put_back(&mut self, b: Block) {
        self.bytes += b.size;
        self.live.push(b);
    }

    /// `realloc`-family semantics for `old` (None: a null pointer) to `size` bytes, with
    /// `p` the result; `errno` was [`SENTINEL`] before the call.
    fn resized(&mut self, old: Option<Block>, p: *mut c_void, size: usize, what: &str) {
        let Some(old) = old else {
            return self.outcome(p, size, 16, expect(size, 16), libc::ENOMEM, false, what);
        };
        if size == 0 {
            // glibc: the block is freed and null returned, errno untouched.
            assert!(p.is_null(), "{what}(p, 0) returned {p:?}");
            assert_eq!(errno(), SENTINEL, "{what}(p, 0): errno");
            return;
        }
        if p.is_null() {
            assert_ne!(expect(size, 16), Expect::Succeed, "{what}({:?}, {size}): null", old.ptr);
            assert_eq!(errno(), libc::ENOMEM, "{what}: null, errno");
            old.check("after a failed realloc");
            return self.put_back(old);
        }
        assert_ne!(expect(size, 16), Expect::Fail, "{what}(_, {size}) succeeded");
        // SAFETY: the new block holds `min(old, new)` bytes of the old content.
        unsafe { common::check(p.cast(), old.size, old.size.min(size), old.tag, "after realloc") };
        self.outcome(p, size, 16, Expect::Succeed, 0, false, what);
    }
}

/// Frees `b` through `free`, `cfree`, `free_sized`, `free_aligned_sized`, `__libc_free`,
/// `realloc(p, 0)` or `__libc_realloc(p, 0)`.
fn free_by(b: Block, how: u8) {
    // SAFETY: a live block of the library, freed once.
    unsafe {
        match how % 7 {
            0 => c::free(b.ptr),
            1 => c::cfree(b.ptr),
            2 => c::free_sized(b.ptr, b.size),
            3 => c::free_aligned_sized(b.ptr, 16, b.size),
            4 => c::__libc_free(b.ptr),
            5 => assert!(c::realloc(b.ptr, 0).is_null()),
            _ => assert!(c::__libc_realloc(b.ptr, 0).is_null()),
        }
    }
}

/// Memory that is not the library's, for the foreign-pointer cases.
static mut FOREIGN: [u64; 8] = [0; 8];

fuzz_target!(|ops: Vec<Op>| {
    static INTERPOSED: Once = Once::new();
    INTERPOSED.call_once(|| {
        // SAFETY: a NUL-terminated string; the copy is freed once, by the library (it is
        // glibc's `malloc` that `strdup` called, if interposition took).
        unsafe {
            let s = libc::strdup(c"interposed?".as_ptr());
            assert!(c::malloc_usable_size(s.cast()) >= 12, "glibc's strdup did not allocate from scalemem");
            c::free(s.cast());
        }
    });
    let mut st = State { live: Vec::new(), bytes: 0, next_tag: 0 };
    for op in ops.into_iter().take(512) {
        set_errno(SENTINEL);
        match op {
            Op::Malloc { size, libc_name } => {
                let size = size.get();
                if st.too_big(size) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { if libc_name { c::__libc_malloc(size) } else { c::malloc(size) } };
                st.outcome(p, size, 16, expect(size, 16), libc::ENOMEM, false, "malloc");
            }
            Op::Calloc { n, size, libc_name } => {
                let (n, size) = (n.get(), size.get());
                let total = n.checked_mul(size);
                if total.is_some_and(|t| st.too_big(t)) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { if libc_name { c::__libc_calloc(n, size) } else { c::calloc(n, size) } };
                let ex = total.map_or(Expect::Fail, |t| expect(t, 16));
                st.outcome(p, total.unwrap_or(0), 16, ex, libc::ENOMEM, true, "calloc");
            }
            Op::Realloc { slot, null, size, libc_name } => {
                let size = size.get();
                if st.too_big(size) {
                    continue;
                }
                let old = if null { None } else { st.take(slot) };
                let ptr = old.as_ref().map_or(null_mut(), |b| b.ptr);
                // SAFETY: null or a live block of the library (given up unless null comes back).
                let p = unsafe { if libc_name { c::__libc_realloc(ptr, size) } else { c::realloc(ptr, size) } };
                st.resized(old, p, size, "realloc");
            }
            Op::ReallocArray { slot, null, n, size } => {
                let (n, size) = (n.get(), size.get());
                let total = n.checked_mul(size);
                if total.is_some_and(|t| st.too_big(t)) {
                    continue;
                }
                let old = if null { None } else { st.take(slot) };
                let ptr = old.as_ref().map_or(null_mut(), |b| b.ptr);
                // SAFETY: as for `realloc`.
                let p = unsafe { c::reallocarray(ptr, n, size) };
                match total {
                    None => {
                        assert!(p.is_null(), "reallocarray({n}, {size}) overflows, yet succeeded");
                        assert_eq!(errno(), libc::ENOMEM, "reallocarray overflow: errno");
                        if let Some(old) = old {
                            old.check("after an overflowing reallocarray");
                            st.put_back(old);
                        }
                    }
                    Some(total) => st.resized(old, p, total, "reallocarray"),
                }
            }
            Op::Memalign { align, size, libc_name } => {
                let (align, size) = (align.get(), size.get());
                if st.too_big(size) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { if libc_name { c::__libc_memalign(align, size) } else { c::memalign(align, size) } };
                // glibc: at most 16 is malloc; else rounded up to a power of two, EINVAL
                // if that overflows.
                match align.max(16).checked_next_power_of_two() {
                    None => {
                        assert!(p.is_null(), "memalign({align:#x}, {size}) succeeded");
                        assert_eq!(errno(), libc::EINVAL, "memalign({align:#x}): errno");
                    }
                    Some(a) => st.outcome(p, size, a, expect(size, a), libc::ENOMEM, false, "memalign"),
                }
            }
            Op::PosixMemalign { align, size } => {
                let (align, size) = (align.get(), size.get());
                if st.too_big(size) {
                    continue;
                }
                let mut out: *mut c_void = 0xdead_0000 as *mut c_void;
                // SAFETY: `out` is writable.
                let r = unsafe { c::posix_memalign(&mut out, align, size) };
                assert_eq!(errno(), SENTINEL, "posix_memalign changed errno");
                let word = size_of::<*mut c_void>();
                if align % word != 0 || !(align / word).is_power_of_two() {
                    assert_eq!(r, libc::EINVAL, "posix_memalign({align:#x}, {size})");
                    assert_eq!(out as usize, 0xdead_0000, "posix_memalign wrote *memptr on EINVAL");
                    continue;
                }
                let ex = expect(size, align);
                if r != 0 {
                    assert_eq!(r, libc::ENOMEM, "posix_memalign({align:#x}, {size})");
                    assert_ne!(ex, Expect::Succeed, "posix_memalign({align:#x}, {size}): ENOMEM");
                    assert_eq!(out as usize, 0xdead_0000, "posix_memalign wrote *memptr on ENOMEM");
                    continue;
                }
                assert!(!out.is_null(), "posix_memalign returned 0 and null");
                st.outcome(out, size, align, ex, 0, false, "posix_memalign");
            }
            Op::AlignedAlloc { align, size } => {
                let (align, size) = (align.get(), size.get());
                if st.too_big(size) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { c::aligned_alloc(align, size) };
                if !align.is_power_of_two() {
                    assert!(p.is_null(), "aligned_alloc({align:#x}, {size}) succeeded");
                    assert_eq!(errno(), libc::EINVAL, "aligned_alloc({align:#x}): errno");
                    continue;
                }
                st.outcome(p, size, align.max(16), expect(size, align), libc::ENOMEM, false, "aligned_alloc");
            }
            Op::Valloc { size, libc_name } => {
                let size = size.get();
                if st.too_big(size) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { if libc_name { c::__libc_valloc(size) } else { c::valloc(size) } };
                st.outcome(p, size, page(), expect(size, page()), libc::ENOMEM, false, "valloc");
            }
            Op::Pvalloc { size, libc_name } => {
                let size = size.get();
                let rounded = size.max(1).checked_next_multiple_of(page());
                if rounded.is_some_and(|r| st.too_big(r)) {
                    continue;
                }
                // SAFETY: no preconditions.
                let p = unsafe { if libc_name { c::__libc_pvalloc(size) } else { c::pvalloc(size) } };
                let ex = rounded.map_or(Expect::Fail, |r| expect(r, page()));
                st.outcome(p, rounded.unwrap_or(0), page(), ex, libc::ENOMEM, false, "pvalloc");
            }
            Op::Free { slot, how } => {
                if let Some(b) = st.take(slot) {
                    free_by(b, how);
                }
            }
            Op::UsableSize { slot } => {
                if let Some(b) = st.live.get(usize::from(slot) % st.live.len().max(1)) {
                    // SAFETY: a live block of the library.
                    let usable = unsafe { c::malloc_usable_size(b.ptr) };
                    assert!(usable >= b.size, "malloc_usable_size {usable} < {}", b.size);
                }
            }
            Op::Foreign { how, size } => {
                let mut stack = [0u64; 4];
                let ptr: *mut c_void = match how % 3 {
                    0 => null_mut(),
                    1 => (&raw mut FOREIGN).cast(),
                    _ => stack.as_mut_ptr().cast(),
                };
                // SAFETY: null, or a pointer the library did not hand out, which its
                // documentation says `free` ignores, `malloc_usable_size` says 0 for, and
                // `realloc` refuses.
                unsafe {
                    assert_eq!(c::malloc_usable_size(ptr), 0, "malloc_usable_size({ptr:?})");
                    match (how / 3) % 2 {
                        0 => c::free(ptr),
                        _ if ptr.is_null() => {}
                        _ => {
                            let size = size.get().max(1);
                            let p = c::realloc(ptr, size);
                            assert!(p.is_null(), "realloc of a foreign pointer succeeded");
                            assert_eq!(errno(), libc::ENOMEM, "realloc of a foreign pointer: errno");
                        }
                    }
                }
                assert_eq!(stack, [0; 4], "stack memory changed");
            }
            Op::Trim => {
                let r = c::malloc_trim(0);
                assert!(r == 0 || r == 1, "malloc_trim: {r}");
                for b in &st.live {
                    b.check("after malloc_trim");
                }
            }
            Op::Mallopt { param, value } => {
                let known = matches!(param, -8..=-1 | 1..=4);
                assert_eq!(c::mallopt(c_int::from(param), value), c_int::from(known), "mallopt({param}, {value})");
            }
            Op::Mallinfo => {
                let m = c::mallinfo2();
                assert_eq!(m.fordblks, m.arena.saturating_sub(m.uordblks), "mallinfo2: fordblks");
                assert!(m.keepcost >= m.fsmblks && m.uordblks >= m.hblkhd, "mallinfo2: {m:?}");
                assert_eq!((m.ordblks, m.smblks, m.hblks, m.usmblks), (0, 0, 0, 0), "mallinfo2: {m:?}");
                let old = c::mallinfo();
                assert!(old.arena >= 0 && old.uordblks >= 0 && old.fordblks >= 0, "mallinfo: {old:?}");
            }
        }
    }
    while let Some(b) = st.take(0) {
        free_by(b, 0);
    }
});
