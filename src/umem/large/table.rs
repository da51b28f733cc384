//! [`Table`]: the large heap's open-addressed maps from block addresses to their records,
//! in memory mapped from the kernel (never the global allocator). Used under the heap's
//! lock only.

use core::mem::size_of;
use core::ptr::NonNull;

use super::LargeError;
use crate::umem::os;

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot<V> {
    /// 0: empty (no block starts at address 0).
    key: usize,
    val: V,
}

/// A map from non-zero addresses to `V`: linear probing, deletion by backward shift, at
/// most half full, doubled into fresh mapped memory. Grown only by [`reserve`](Self::reserve),
/// so that an insert after a successful reserve cannot fail.
pub(super) struct Table<V: Copy> {
    slots: NonNull<Slot<V>>,
    /// A power of two, or 0 before the first reserve.
    cap: usize,
    pub(super) len: usize,
}

// SAFETY: the table owns its mapping outright (nobody else has its address), so moving
// it to another thread moves that ownership; `V: Send` covers the values.
unsafe impl<V: Copy + Send> Send for Table<V> {}

impl<V: Copy> Table<V> {
    const MIN_CAP: usize = 256;

    pub(super) const fn new() -> Self {
        Self { slots: NonNull::dangling(), cap: 0, len: 0 }
    }

    #[inline]
    fn home(&self, key: usize) -> usize {
        // Fibonacci hashing of the page number; `cap >= MIN_CAP`, so the shift is < 64.
        let h = ((key >> 12) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> (64 - self.cap.trailing_zeros())) as usize
    }

    #[inline]
    fn slot(&self, i: usize) -> *mut Slot<V> {
        // In bounds: the index is masked to the capacity (only called with `cap > 0`).
        self.slots.as_ptr().wrapping_add(i & (self.cap - 1))
    }

    #[inline]
    fn key_at(&self, i: usize) -> usize {
        // SAFETY: `slot` is in bounds of the live mapping (cap > 0 at every call site);
        // the key word of a zeroed or written slot is initialised.
        unsafe { (*self.slot(i)).key }
    }

    /// The slot index holding `key`.
    fn find(&self, key: usize) -> Option<usize> {
        if self.cap == 0 || key == 0 {
            return None;
        }
        let mut i = self.home(key);
        loop {
            match self.key_at(i) {
                0 => return None,
                k if k == key => return Some(i & (self.cap - 1)),
                _ => i = (i + 1) & (self.cap - 1),
            }
        }
    }

    pub(super) fn get(&self, key: usize) -> Option<V> {
        let i = self.find(key)?;
        // SAFETY: slot `i` is in bounds and holds `key`, so its value was written.
        Some(unsafe { (*self.slot(i)).val })
    }

    /// A mutable reference to the value of `key`.
    pub(super) fn get_mut(&mut self, key: usize) -> Option<&mut V> {
        let i = self.find(key)?;
        // SAFETY: as in `get`; `&mut self` makes the reference unique, and it borrows
        // `self`, so the mapping outlives it.
        Some(unsafe { &mut (*self.slot(i)).val })
    }

    /// Makes room for `extra` more keys (maps a bigger table if needed).
    pub(super) fn reserve(&mut self, extra: usize) -> Result<(), LargeError> {
        let need = self.len.checked_add(extra).and_then(|n| n.checked_mul(2)).ok_or(LargeError::OutOfMemory)?;
        if need <= self.cap {
            return Ok(());
        }
        let mut cap = (self.cap * 2).max(Self::MIN_CAP);
        while cap < need {
            cap = cap.checked_mul(2).ok_or(LargeError::OutOfMemory)?;
        }
        let bytes = cap.checked_mul(size_of::<Slot<V>>()).ok_or(LargeError::OutOfMemory)?;
        let new = os::map(bytes).map_err(|_| LargeError::OutOfMemory)?.cast::<Slot<V>>();
        let (old, old_cap) = (self.slots, self.cap);
        // Fresh mappings read as zeros: every key is 0, every slot empty.
        self.slots = new;
        self.cap = cap;
        self.len = 0;
        for i in 0..old_cap {
            // SAFETY: `i < old_cap`, inside the old mapping, which is still mapped.
            let slot = unsafe { old.as_ptr().add(i).read() };
            if slot.key != 0 {
                self.insert(slot.key, slot.val);
            }
        }
        if old_cap > 0 {
            // SAFETY: (1) the old mapping is what `os::map` returned for
            // `old_cap * size_of::<Slot<V>>()` bytes; (2) its contents were copied out.
            unsafe { os::unmap(old.cast(), old_cap * size_of::<Slot<V>>()) };
        }
        Ok(())
    }

    /// Inserts or replaces. REQUIRES: room reserved (`2 * (len + 1) <= cap`).
    pub(super) fn insert(&mut self, key: usize, val: V) {
        debug_assert!(key != 0 && 2 * (self.len + 1) <= self.cap);
        let mut i = self.home(key);
        loop {
            let k = self.key_at(i);
            if k == 0 || k == key {
                // SAFETY: slot `i` is in bounds (masked) of the live mapping; `&mut self`.
                unsafe { self.slot(i).write(Slot { key, val }) };
                if k == 0 {
                    self.len += 1;
                }
                return;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    /// Removes `key`, shifting later members of its probe run back over the hole.
    pub(super) fn remove(&mut self, key: usize) -> Option<V> {
        let mut hole = self.find(key)?;
        // SAFETY: slot `hole` holds `key` (found above).
        let val = unsafe { (*self.slot(hole)).val };
        let mask = self.cap - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.key_at(j);
            if k == 0 {
                break;
            }
            let home = self.home(k);
            // The member at `j` may move into the hole unless its home lies cyclically
            // in (hole, j]: then the hole is before its home and lookups would miss it.
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                // SAFETY: both slots are in bounds; `&mut self`.
                unsafe { self.slot(hole).write(self.slot(j).read()) };
                hole = j;
            }
        }
        // SAFETY: in bounds; marks the final hole empty.
        unsafe { (*self.slot(hole)).key = 0 };
        self.len -= 1;
        Some(val)
    }

    /// Calls `f` on every entry.
    pub(super) fn for_each(&self, mut f: impl FnMut(usize, V)) {
        for i in 0..self.cap {
            // SAFETY: `i < cap`: in bounds of the live mapping; a non-zero key marks a
            // written value.
            let slot = unsafe { self.slot(i).read() };
            if slot.key != 0 {
                f(slot.key, slot.val);
            }
        }
    }
}

impl<V: Copy> Drop for Table<V> {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: (1) the mapping `reserve` made for `cap` slots; (2) the table is
            // being dropped.
            unsafe { os::unmap(self.slots.cast(), self.cap * size_of::<Slot<V>>()) };
        }
    }
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use std::collections::BTreeMap;

    use super::Table;

    /// Random inserts, replacements and removals of page-aligned keys (many colliding in
    /// the hash), checked against a `BTreeMap` after every step, through several growths.
    #[test]
    fn matches_a_btreemap() {
        let mut table: Table<usize> = Table::new();
        let mut model = BTreeMap::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for step in 0..40_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Keys from a small range so that removals hit and probe runs wrap.
            let key = (1 + (x as usize % 3000)) << 12;
            if x.is_multiple_of(3) {
                assert_eq!(table.remove(key), model.remove(&key), "step {step}");
            } else {
                table.reserve(1).unwrap();
                table.insert(key, step);
                model.insert(key, step);
            }
            if step % 1000 == 0 {
                assert_eq!(table.len, model.len());
                for (&k, &v) in &model {
                    assert_eq!(table.get(k), Some(v));
                }
                let mut n = 0;
                table.for_each(|k, v| {
                    assert_eq!(model.get(&k), Some(&v));
                    n += 1;
                });
                assert_eq!(n, model.len());
            }
        }
        for (&k, &v) in &model {
            assert_eq!(table.get(k), Some(v));
            *table.get_mut(k).unwrap() += 1;
            assert_eq!(table.remove(k), Some(v + 1));
        }
        assert_eq!(table.len, 0);
        assert_eq!(table.get(4096), None);
    }
}
