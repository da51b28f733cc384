//! Size classes: the fixed table of object sizes that the size-class caches (libumem's
//! `umem_alloc_8`, `umem_alloc_16`, ... caches) will serve, from 8 bytes to 128 KiB (the
//! largest object a slab cache serves, [`slab::MAX_SIZE`](super::slab::MAX_SIZE)). A
//! request larger than the last class, or aligned beyond [`MAX_ALIGN`], goes to the
//! large path ([`large`](super::large)), as does a request aligned beyond a cache line
//! whose class is a coloured one (below).
//!
//! ```
//! use scalemem::umem::sizeclass::{class_of, class_size, CLASSES};
//!
//! let i = class_of(100, 8).unwrap();
//! assert_eq!(class_size(i), 104);
//! assert_eq!(class_size(class_of(100, 16).unwrap()), 112); // a multiple of 16
//! assert_eq!(class_of((128 << 10) + 1, 8), None); // the large path's
//! assert_eq!(CLASSES.len(), 93);
//! ```
//!
//! # Derivation and bound
//!
//! - **Up to 64 bytes**: 8, then the multiples of 16 (16, 32, 48, 64). Tiny requests are
//!   few in kind, and every class from 16 up is 16-byte aligned, as C's `malloc`
//!   promises; no fragmentation bound is kept here (a 17-byte request takes 32 bytes).
//! - **Above 64 bytes**: eight classes per power of two. The classes in `(2^k, 2^(k+1)]`
//!   (for `k >= 6`) are `2^k + j * 2^(k-3)` for `j = 1 ..= 8`: all the multiples of the
//!   spacing `2^(k-3)` in that range (72, 80, ..., 128, 144, 160, ..., 256, 288, ...).
//!   The worst request in the range is one byte above the previous class, which wastes
//!   `2^(k-3) - 1` bytes of a class of at least `9 * 2^(k-3)`: internal fragmentation
//!   `(class - size) / class < 1/9`, under the 12.5% the design asks for. (Four classes
//!   per power of two would waste up to 1/5, 20%: a request of 129 bytes in a class of
//!   160.) The tests check the bound for every size from 65 bytes to 128 KiB.
//! - 5 small classes, then 8 for each of the 11 powers of two from `(64, 128]` to
//!   `(64 KiB, 128 KiB]`: 93 classes.
//!
//! # Alignment
//!
//! A request `(size, align)` gets the smallest class that is at least `size` and a
//! multiple of `align` (for `align` a power of two up to [`MAX_ALIGN`]). That class is
//! `class_of_size(round_up(max(size, align), align))`: the classes of one power-of-two
//! range are every multiple of its spacing, so a rounded size either is a class itself
//! (when `align` is at least the spacing) or rounds up to a multiple of the spacing, which
//! `align` divides. The cache of class `i` must place its objects at multiples of
//! [`class_align`]`(i)` (the largest power of two dividing the class size, at most
//! [`MAX_ALIGN`]); slab colouring must keep to multiples of it.
//!
//! **Coloured classes** (from [`COLOURED_MIN`], 16 KiB, up: the sizes jemalloc calls
//! large) are the exception. Their sizes are multiples of 1 KiB or more, so with objects
//! at page multiples every object of a class would start at the same offset in its page,
//! and a program that touches each block's pages at the same offsets (a page-by-page
//! scan, a header per block) would put every touch of every block into the few cache
//! sets that offset indexes: colouring made the 64 KiB batch workload 1.6x faster at
//! one thread and 2.0x at two on the AMD host (`BENCHMARKS.md`, "Batch"), for about
//! 6% more resident memory at 16 and 64 KiB. Their objects are aligned to a cache line only
//! ([`COLOURED_ALIGN`], what [`class_align`] says for them), so that the slab layer can
//! colour them by cache line within a page of slack per slab, as jemalloc's
//! cache-oblivious large allocations are; a request for more alignment than that maps to
//! no class and takes the large path.
//!
//! # Cost
//!
//! [`class_of`] is constant time: a 129-byte lookup table for sizes up to 1 KiB (and a
//! 65-byte one for 16-byte alignment, `malloc`'s, which then needs no rounding), and a
//! 1 KiB one by 128-byte granule above (every class boundary above 1 KiB is a multiple of
//! 128). Nothing here allocates or panics.
//!
//! The granule table replaced a computation (a count of leading zeros, then a shift by an
//! amount computed from it). x86-64 takes a variable shift amount in `cl`, and the
//! compiler wrote it there with byte-sized instructions; inlined into a caller's loop,
//! that made a 4 KiB batch loop through `#[global_allocator]` take 1.5x the time on the
//! AMD EPYC host of BENCHMARKS.md ("The class lookup without a variable shift"), likely
//! because a byte write merges into the whole `rcx` and so waits for its last writer,
//! there the previous allocation's lookup. A table load by a constant shift has no such
//! input.

/// The largest alignment a size class serves: the smallest page size umem supports.
/// Stricter alignments go to the large path.
pub const MAX_ALIGN: usize = 4096;

/// The smallest coloured class (module documentation, "Alignment").
pub const COLOURED_MIN: usize = 16 << 10;

/// The alignment the coloured classes' objects get: a cache line.
pub const COLOURED_ALIGN: usize = 64;

/// The largest class: the largest object a slab cache serves.
pub const MAX_CLASS_SIZE: usize = 128 << 10;

/// The number of size classes.
pub const NCLASSES: usize = 93;

/// The classes up to 64 bytes.
const SMALL: [u32; 5] = [8, 16, 32, 48, 64];

/// Sizes up to this are looked up in [`LOOKUP`]; sizes above are computed.
pub(crate) const LOOKUP_MAX: usize = 1024;

/// log2 of the number of classes per power of two above 64 bytes.
const SPLIT_SHIFT: u32 = 3;

/// The size-class table, smallest first (see the module doc for its derivation).
pub const CLASSES: [u32; NCLASSES] = build_classes();

/// `LOOKUP[(size + 7) / 8]` is the class of `size` for sizes up to [`LOOKUP_MAX`].
const LOOKUP: [u8; LOOKUP_MAX / 8 + 1] = build_lookup();

/// Sizes above [`LOOKUP_MAX`] are looked up by 128-byte granule in [`LOOKUP_COARSE`].
const COARSE_SHIFT: u32 = 7;

/// `LOOKUP_COARSE[(size - 1) >> 7]` is the class of `size` for sizes in
/// `(LOOKUP_MAX, MAX_CLASS_SIZE]`: the classes there are spaced by 128 bytes or more,
/// all multiples of 128, so the sizes of one granule, `(128 g, 128 (g + 1)]`, share a
/// class (the entries below `LOOKUP_MAX`'s granule are unused).
const LOOKUP_COARSE: [u8; COARSE_LEN] = build_lookup_coarse();

/// The granules up to [`MAX_CLASS_SIZE`]'s.
const COARSE_LEN: usize = ((MAX_CLASS_SIZE - 1) >> COARSE_SHIFT) + 1;

// The granule divides every class boundary it covers: the spacing above LOOKUP_MAX,
// LOOKUP_MAX / 2^SPLIT_SHIFT, is at least a granule.
const _: () = assert!(LOOKUP_MAX >> SPLIT_SHIFT >= 1 << COARSE_SHIFT);

/// `LOOKUP16[(size + 15) / 16]` is the class of `size` aligned to 16 (C `malloc`'s
/// alignment, and `u128`'s) for sizes up to [`LOOKUP_MAX`]: one load, without rounding
/// the size first.
const LOOKUP16: [u8; LOOKUP_MAX / 16 + 1] = build_lookup16();

// The table and the slab layer agree on the largest object (outside loom, whose slab
// layer is shrunk for the model checker).
#[cfg(not(scalemem_loom))]
const _: () = assert!(MAX_CLASS_SIZE == super::slab::MAX_SIZE);
const _: () = assert!(CLASSES[NCLASSES - 1] as usize == MAX_CLASS_SIZE);

const fn build_classes() -> [u32; NCLASSES] {
    let mut table = [0u32; NCLASSES];
    let mut i = 0;
    while i < SMALL.len() {
        table[i] = SMALL[i];
        i += 1;
    }
    let mut k = 6; // the range (2^k, 2^(k+1)]
    while i < NCLASSES {
        let mut j = 1;
        while j <= 1 << SPLIT_SHIFT {
            table[i] = (1 << k) + j * (1 << (k - SPLIT_SHIFT));
            i += 1;
            j += 1;
        }
        k += 1;
    }
    table
}

const fn build_lookup() -> [u8; LOOKUP_MAX / 8 + 1] {
    let mut table = [0u8; LOOKUP_MAX / 8 + 1];
    let mut slot = 0;
    let mut class = 0;
    while slot < table.len() {
        // Slot `slot` holds the sizes (8 * (slot - 1), 8 * slot]; its class is the first
        // one at least 8 * slot (slot 0 is size 0, served as 1 byte).
        let size = if slot == 0 { 1 } else { slot * 8 };
        while (CLASSES[class] as usize) < size {
            class += 1;
        }
        table[slot] = class as u8;
        slot += 1;
    }
    table
}

const fn build_lookup_coarse() -> [u8; COARSE_LEN] {
    let mut table = [0u8; COARSE_LEN];
    let mut granule = LOOKUP_MAX >> COARSE_SHIFT;
    while granule < table.len() {
        // The granule's largest size, 128 (granule + 1), has the granule's class (all
        // its sizes share one: see LOOKUP_COARSE), which the computation gives.
        let Some(class) = class_by_bits((granule + 1) << COARSE_SHIFT) else { panic!("a size above the classes") };
        table[granule] = class.0;
        granule += 1;
    }
    table
}

const fn build_lookup16() -> [u8; LOOKUP_MAX / 16 + 1] {
    let mut table = [0u8; LOOKUP_MAX / 16 + 1];
    let mut slot = 0;
    while slot < table.len() {
        // Slot `slot` holds the sizes (16 * (slot - 1), 16 * slot], which round up to
        // 16 * slot (slot 0 is size 0, served as 16 bytes); that multiple of 16 has the
        // class the 8-byte table gives it (every class it can reach is a multiple of 16:
        // the rounding argument of the module doc).
        let size = if slot == 0 { 16 } else { slot * 16 };
        table[slot] = LOOKUP[size / 8];
        slot += 1;
    }
    table
}

/// The index of a size class in [`CLASSES`] (below [`NCLASSES`]).
///
/// ```
/// use scalemem::umem::sizeclass::{class_of, class_size, CLASSES};
///
/// let i = class_of(24, 8).unwrap();
/// assert_eq!(class_size(i), 32);
/// assert_eq!(CLASSES[i.get()], 32);
/// assert!(class_of(8, 8).unwrap() < i); // indices order as the sizes do
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassIndex(u8);

/// Conversion between a class and its index in [`CLASSES`].
///
/// ```
/// use scalemem::umem::sizeclass::{ClassIndex, NCLASSES};
///
/// for i in 0..NCLASSES {
///     assert_eq!(ClassIndex::new(i).unwrap().get(), i);
/// }
/// ```
impl ClassIndex {
    /// The class with index `i`, if there is one.
    ///
    /// ```
    /// use scalemem::umem::sizeclass::{ClassIndex, NCLASSES};
    ///
    /// assert_eq!(ClassIndex::new(0).map(ClassIndex::get), Some(0));
    /// assert_eq!(ClassIndex::new(NCLASSES), None);
    /// ```
    #[inline]
    pub const fn new(i: usize) -> Option<Self> {
        if i < NCLASSES { Some(Self(i as u8)) } else { None }
    }

    /// The index, below [`NCLASSES`].
    ///
    /// ```
    /// use scalemem::umem::sizeclass::{class_of, CLASSES, NCLASSES};
    ///
    /// let i = class_of(100, 8).unwrap().get();
    /// assert!(i < NCLASSES);
    /// assert_eq!(CLASSES[i], 104);
    /// ```
    #[inline]
    pub const fn get(self) -> usize {
        self.0 as usize
    }
}

/// The size of class `i` in bytes.
///
/// ```
/// use scalemem::umem::sizeclass::{class_size, ClassIndex};
///
/// assert_eq!(class_size(ClassIndex::new(0).unwrap()), 8);
/// assert_eq!(class_size(ClassIndex::new(92).unwrap()), 128 << 10);
/// ```
#[inline]
pub const fn class_size(i: ClassIndex) -> usize {
    // The index is below NCLASSES by construction; the clamp lets the compiler see that,
    // so that no bounds check (and no formatting panic) is left on the allocator's paths.
    let i = i.get();
    CLASSES[if i < NCLASSES { i } else { NCLASSES - 1 }] as usize
}

/// The alignment that objects of class `i` get: the largest power of two dividing its
/// size, at most [`MAX_ALIGN`]; [`COLOURED_ALIGN`] for the coloured classes (from
/// [`COLOURED_MIN`] up). Every request [`class_of`] maps to `i` asks for at most this.
///
/// ```
/// use scalemem::umem::sizeclass::{class_align, class_of};
///
/// assert_eq!(class_align(class_of(72, 8).unwrap()), 8); // 72 = 8 * 9
/// assert_eq!(class_align(class_of(4096, 8).unwrap()), 4096);
/// assert_eq!(class_align(class_of(128 << 10, 8).unwrap()), 64); // coloured
/// ```
#[inline]
pub const fn class_align(i: ClassIndex) -> usize {
    if is_coloured(i) {
        return COLOURED_ALIGN;
    }
    let align = 1 << class_size(i).trailing_zeros();
    if align < MAX_ALIGN { align } else { MAX_ALIGN }
}

/// Whether class `i` is a coloured one (from [`COLOURED_MIN`] up; module documentation,
/// "Alignment"): objects aligned to [`COLOURED_ALIGN`], slabs with room to colour them.
///
/// ```
/// use scalemem::umem::sizeclass::{class_of, is_coloured};
///
/// assert!(!is_coloured(class_of(8192, 8).unwrap()));
/// assert!(is_coloured(class_of(16 << 10, 8).unwrap()));
/// ```
#[inline]
pub const fn is_coloured(i: ClassIndex) -> bool {
    class_size(i) >= COLOURED_MIN
}

/// The class of a request of `size` bytes (the smallest class at least `size`), ignoring
/// alignment; `None` above [`MAX_CLASS_SIZE`]. A size of 0 is served as 1 byte.
#[inline]
const fn class_of_size(size: usize) -> Option<ClassIndex> {
    if size <= LOOKUP_MAX {
        return Some(ClassIndex(LOOKUP[size.div_ceil(8)]));
    }
    if size > MAX_CLASS_SIZE {
        return None;
    }
    // No overflow and in bounds: LOOKUP_MAX < size <= MAX_CLASS_SIZE.
    Some(ClassIndex(LOOKUP_COARSE[(size - 1) >> COARSE_SHIFT]))
}

/// [`class_of_size`] above [`LOOKUP_MAX`] by computation, which [`LOOKUP_COARSE`] is
/// built from (the tests check every size's class against a search of [`CLASSES`]).
const fn class_by_bits(size: usize) -> Option<ClassIndex> {
    if size <= LOOKUP_MAX || size > MAX_CLASS_SIZE {
        return None;
    }
    // size - 1 lies in [2^k, 2^(k+1)) with k >= 10; its class is the j-th (0-based) of
    // the eight in (2^k, 2^(k+1)], where j is the next three bits below the top one.
    let k = usize::BITS - 1 - (size - 1).leading_zeros();
    let j = ((size - 1) >> (k - SPLIT_SHIFT)) & ((1 << SPLIT_SHIFT) - 1);
    let i = SMALL.len() + ((k as usize - 6) << SPLIT_SHIFT) + j;
    Some(ClassIndex(i as u8))
}

/// The class for a request of `size` bytes aligned to `align`: the smallest class that
/// is at least `size` and a multiple of `align`. `None` when the request belongs to the
/// large path (`size` or the rounded size above [`MAX_CLASS_SIZE`], `align` above
/// [`MAX_ALIGN`], or above [`COLOURED_ALIGN`] for a coloured class) or is impossible
/// (`align` not a power of two). A size of 0 is served as 1 byte. Constant time.
///
/// ```
/// use scalemem::umem::sizeclass::{class_of, class_size};
///
/// assert_eq!(class_size(class_of(1, 1).unwrap()), 8);
/// assert_eq!(class_size(class_of(65, 8).unwrap()), 72);
/// assert_eq!(class_size(class_of(65, 64).unwrap()), 128);
/// assert_eq!(class_size(class_of(5000, 4096).unwrap()), 8192);
/// assert_eq!(class_of(8, 8192), None); // beyond the page: the large path
/// assert_eq!(class_size(class_of(65536, 64).unwrap()), 65536);
/// assert_eq!(class_of(65536, 128), None); // coloured class, more than a cache line
/// assert_eq!(class_of(8, 3), None); // not a power of two
/// ```
#[inline]
pub const fn class_of(size: usize, align: usize) -> Option<ClassIndex> {
    if !align.is_power_of_two() || align > MAX_ALIGN || size > MAX_CLASS_SIZE {
        return None;
    }
    if align <= 8 {
        // Every class is a multiple of 8.
        return class_of_size(size);
    }
    if align == 16 && size <= LOOKUP_MAX {
        // `malloc`'s alignment: one load (the same class as the rounding below).
        return Some(ClassIndex(LOOKUP16[size.div_ceil(16)]));
    }
    let size = if size < align { align } else { size };
    // Cannot overflow: size <= MAX_CLASS_SIZE and align <= MAX_ALIGN.
    let class = class_of_size((size + align - 1) & !(align - 1));
    match class {
        Some(i) if align > COLOURED_ALIGN && is_coloured(i) => None,
        _ => class,
    }
}
