//! Exhaustive checks of the size-class table: every size from 1 byte to 128 KiB, with
//! every power-of-two alignment up to 4096, against a brute-force search of the table.

use scalemem::umem::sizeclass::{
    CLASSES, COLOURED_ALIGN, COLOURED_MIN, ClassIndex, MAX_ALIGN, MAX_CLASS_SIZE, NCLASSES, class_align, class_of,
    class_size,
};

/// The answer by definition: the first class (the table is sorted) at least `size` and a
/// multiple of `align`, unless that class is a coloured one and `align` asks for more
/// than a cache line (the large path's, then).
fn brute(size: usize, align: usize) -> Option<usize> {
    let i = CLASSES.iter().position(|&c| c as usize >= size.max(1) && (c as usize).is_multiple_of(align))?;
    (align <= COLOURED_ALIGN || (CLASSES[i] as usize) < COLOURED_MIN).then_some(i)
}

#[test]
fn table_shape() {
    assert_eq!(CLASSES.len(), NCLASSES);
    assert_eq!(CLASSES[0], 8);
    assert_eq!(CLASSES[NCLASSES - 1] as usize, MAX_CLASS_SIZE);
    assert_eq!(&CLASSES[..13], &[8, 16, 32, 48, 64, 72, 80, 88, 96, 104, 112, 120, 128]);
    for w in CLASSES.windows(2) {
        assert!(w[0] < w[1], "classes not strictly increasing: {} then {}", w[0], w[1]);
    }
    for (i, &c) in CLASSES.iter().enumerate() {
        assert_eq!(c % 8, 0, "class {c} not a multiple of 8");
        let idx = ClassIndex::new(i).unwrap();
        assert_eq!(idx.get(), i);
        assert_eq!(class_size(idx), c as usize);
        let a = class_align(idx);
        assert!(a.is_power_of_two() && a <= MAX_ALIGN && (c as usize).is_multiple_of(a));
        // The largest power of two dividing the class, at most a page; from 16 KiB up
        // (coloured) a cache line, so that slabs can colour by cache line.
        let natural = (1usize << c.trailing_zeros()).min(MAX_ALIGN);
        let want = if c as usize >= COLOURED_MIN { COLOURED_ALIGN } else { natural };
        assert_eq!(a, want, "class {c}");
        if (16..=64).contains(&c) {
            assert_eq!(c % 16, 0, "classes from 16 bytes to 64 are multiples of 16");
        }
    }
    // Eight classes per power of two above 64 bytes.
    let mut lo = 64usize;
    while lo < MAX_CLASS_SIZE {
        let n = CLASSES.iter().filter(|&&c| (c as usize) > lo && (c as usize) <= 2 * lo).count();
        assert_eq!(n, 8, "classes in ({lo}, {}]", 2 * lo);
        lo *= 2;
    }
    assert_eq!(ClassIndex::new(NCLASSES), None);
}

#[test]
fn every_size_maps_to_the_smallest_fitting_class() {
    assert_eq!(class_of(0, 1).map(class_size), Some(8));
    // malloc's alignment (its own table): size 0 gets the 16-byte class.
    assert_eq!(class_of(0, 16).map(class_size), Some(16));
    for size in 1..=MAX_CLASS_SIZE {
        let got = class_of(size, 1).map(ClassIndex::get);
        assert_eq!(got, brute(size, 1), "size {size}");
        let c = class_size(class_of(size, 1).unwrap());
        assert!(c >= size);
        // Same answer for every alignment up to 8 (every class is a multiple of 8).
        assert_eq!(class_of(size, 2), class_of(size, 1));
        assert_eq!(class_of(size, 4), class_of(size, 1));
        assert_eq!(class_of(size, 8), class_of(size, 1));
    }
    assert_eq!(class_of(MAX_CLASS_SIZE + 1, 1), None);
    assert_eq!(class_of(usize::MAX, 1), None);
}

#[test]
fn fragmentation_is_bounded_above_64_bytes() {
    let mut worst = (0usize, 0usize); // (waste * 1000 / class, size)
    for size in 65..=MAX_CLASS_SIZE {
        let c = class_size(class_of(size, 1).unwrap());
        // (c - size) / c <= 1/8, in integers.
        assert!(8 * (c - size) <= c, "size {size} in class {c} wastes more than 12.5%");
        // Relative to the request too: (c - size) / size <= 1/8.
        assert!(8 * (c - size) <= size, "size {size} in class {c} wastes more than 12.5% of the request");
        let permille = (c - size) * 1000 / c;
        if permille > worst.0 {
            worst = (permille, size);
        }
    }
    // The derivation's bound: under 1/9.
    assert!(worst.0 < 112, "worst waste {} per mille at size {}", worst.0, worst.1);
}

#[test]
fn monotone_in_size() {
    for align in (0..=12).map(|s| 1usize << s) {
        let mut prev = 0;
        for size in 1..=MAX_CLASS_SIZE {
            let Some(i) = class_of(size, align) else {
                // Only the largest sizes of the largest alignments may round past the
                // table, and alignments past a cache line past the uncoloured classes;
                // once they do, every larger size does too.
                assert_eq!(brute(size, align), None, "size {size} align {align}");
                assert!(size > MAX_CLASS_SIZE - align || align > COLOURED_ALIGN);
                for s in size..=MAX_CLASS_SIZE {
                    assert_eq!(class_of(s, align), None);
                }
                break;
            };
            assert!(i.get() >= prev, "size {size} align {align}: class went down");
            prev = i.get();
        }
    }
}

#[test]
fn every_power_of_two_alignment_up_to_the_page() {
    for shift in 0..=12 {
        let align = 1usize << shift;
        for size in 1..=MAX_CLASS_SIZE {
            let got = class_of(size, align);
            assert_eq!(got.map(ClassIndex::get), brute(size, align), "size {size} align {align}");
            if let Some(i) = got {
                let c = class_size(i);
                assert!(c >= size && c.is_multiple_of(align));
                assert!(class_align(i) >= align, "class {c} aligns to less than {align}");
            }
        }
    }
}

#[test]
fn impossible_or_large_alignments_are_refused() {
    for align in [0, 3, 5, 6, 12, 24, 4097, usize::MAX] {
        assert_eq!(class_of(8, align), None, "align {align}");
    }
    for shift in 13..usize::BITS {
        assert_eq!(class_of(8, 1 << shift), None);
    }
}
