//! Shared by the allocator targets: sizes and alignments decoded from fuzzer bytes, the
//! bounds that keep a run's memory small, and the fill pattern of live blocks.

// Each target uses part of this module.
#![allow(dead_code)]

use arbitrary::Arbitrary;

/// At most this many live blocks at once.
pub const MAX_LIVE: usize = 64;

/// At most this many bytes live at once; a possible request that would go past it is
/// skipped (not made), so the fuzzer never holds more than this.
pub const MAX_BYTES: usize = 64 << 20;

/// A request at least this large cannot be served (x86-64 user space is 2^47 bytes), so
/// it is made and must fail; between [`MAX_BYTES`] and this a request might succeed and
/// is skipped.
pub const IMPOSSIBLE: usize = 1 << 48;

/// Sizes that sit on the allocator's edges: zero, the smallest classes, a page, the
/// largest size class (128 KiB) and a huge page either side, and the overflow limits.
const EDGES: [usize; 24] = [
    0,
    1,
    8,
    15,
    16,
    17,
    255,
    4095,
    4096,
    4097,
    (128 << 10) - 1,
    128 << 10,
    (128 << 10) + 1,
    (2 << 20) - 1,
    2 << 20,
    (2 << 20) + 1,
    1 << 48,
    isize::MAX as usize - 4096,
    isize::MAX as usize - 4095,
    isize::MAX as usize,
    isize::MAX as usize + 1,
    usize::MAX - 4095,
    usize::MAX - 1,
    usize::MAX,
];

/// A size: one of [`EDGES`], or a random value at a random magnitude (mostly small).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Size {
    sel: u8,
    raw: u32,
}

impl Size {
    pub fn get(self) -> usize {
        let sel = usize::from(self.sel);
        if sel < EDGES.len() {
            EDGES[sel]
        } else {
            // Shift by 0..=31: values from 0 .. 4 GiB down to 0 or 1, weighted to the
            // small ones (which the fuzzer then tunes bit by bit).
            (self.raw >> (sel % 32)) as usize
        }
    }
}

/// A power-of-two alignment, 2^0 ..= 2^30.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Align(u8);

impl Align {
    pub fn get(self) -> usize {
        1 << (self.0 % 31)
    }
}

/// Any alignment a C caller could pass: mostly powers of two, but also 0, odd values,
/// near-powers, multiples of the word that are not powers, and huge ones.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct RawAlign {
    sel: u8,
    raw: u64,
}

impl RawAlign {
    pub fn get(self) -> usize {
        let shift = u32::from(self.sel % 64);
        match self.sel / 64 {
            0 | 1 => 1usize << shift.min(30),
            2 => match self.sel % 8 {
                0 => 0,
                1 => usize::MAX,
                2 => 1 << 63,
                3 => (1 << 63) + 1,
                4 => 24,
                5 => 48,
                6 => (1usize << shift.min(30)) + 1,
                _ => (1usize << shift.min(30)) - 1,
            },
            _ => self.raw as usize,
        }
    }
}

/// The byte a live block holds at `at`, from the block's tag: every byte differs from
/// its neighbours and from the same offset of another block.
#[inline]
pub fn pattern(tag: u8, at: usize) -> u8 {
    tag ^ (at as u8) ^ ((at >> 8) as u8).rotate_left(3)
}

/// The offsets of a `size`-byte block that are filled and checked: every byte of a
/// small block; for a big one, its first and last 256 bytes and one per 4 KiB (so a
/// 64 MiB block costs some 16 K writes, not 64 M).
pub fn probes(size: usize) -> impl Iterator<Item = usize> {
    let full = size <= 16 << 10;
    let head = if full { size } else { 256 };
    let tail_from = if full { size } else { size - 256 };
    let stride = (0..size).step_by(4096).filter(move |&at| !full && at >= head && at < tail_from);
    (0..head).chain(stride).chain(tail_from..size)
}

/// Fills the probes of `[ptr, ptr + size)` with `tag`'s pattern.
///
/// # Safety
/// 1. `ptr` is valid for writes of `size` bytes.
pub unsafe fn fill(ptr: *mut u8, size: usize, tag: u8) {
    for at in probes(size) {
        // SAFETY: (1), and `at < size`.
        unsafe { ptr.add(at).write(pattern(tag, at)) };
    }
}

/// Checks the probes of a `size`-byte block below `len` against `tag`'s pattern.
///
/// # Safety
/// 1. `ptr` is valid for reads of `len` bytes.
pub unsafe fn check(ptr: *const u8, size: usize, len: usize, tag: u8, what: &str) {
    for at in probes(size).filter(|&at| at < len) {
        // SAFETY: (1), and `at < len`.
        let got = unsafe { ptr.add(at).read() };
        assert_eq!(got, pattern(tag, at), "{what}: block {ptr:?} of {size} bytes: byte {at} changed");
    }
}

/// Checks that the probes of `[ptr, ptr + size)` are zero.
///
/// # Safety
/// 1. `ptr` is valid for reads of `size` bytes.
pub unsafe fn check_zero(ptr: *const u8, size: usize, what: &str) {
    for at in probes(size) {
        // SAFETY: (1), and `at < size`.
        let got = unsafe { ptr.add(at).read() };
        assert_eq!(got, 0, "{what}: block {ptr:?} of {size} bytes: byte {at} is not zero");
    }
}
