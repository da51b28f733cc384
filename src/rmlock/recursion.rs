//! The thread's table of the `RmLock`s it holds for reading: what lets a thread that
//! already holds a read lock read it again while a writer waits (FreeBSD's
//! `RM_RECURSE`).
//!
//! A thread counts itself among a lock's readers once, on its outermost read; nested
//! reads (and their releases) only move the depth recorded here, and the last release
//! departs. A nested read therefore never checks the writer flag: the outer read still
//! counts, so no writer can be inside, and waiting for the writer would wait for
//! ourselves.
//!
//! The table is [`SLOTS`] `(lock id, depth)` pairs in a `const`-initialised thread-local
//! without a destructor: reaching it is a thread-pointer-relative address, it never
//! allocates, and it stays usable during thread exit. Keys are lock identities from
//! [`crate::sync::unique_id`], never addresses: a guard leaked with `mem::forget` leaves
//! its entry behind forever, and an address could later belong to another lock, which
//! this thread would then read without counting itself.
//!
//! A thread that holds read locks of [`SLOTS`] different `RmLock`s at once reads any
//! further one *untracked*: counted per guard, like an outer read, and without
//! recursion: a nested read of an untracked lock waits for a pending writer, which
//! waits for the outer read, a deadlock (`read`'s documentation says so; `try_read`
//! returns `None` instead).

use core::cell::Cell;

/// How many different locks a thread can hold for reading with recursion supported.
pub(super) const SLOTS: usize = 8;

/// The marker of a guard that is not in the table.
pub(super) const UNTRACKED: u8 = u8::MAX;

/// One thread's table. `ids[i] == 0` marks a free entry (lock ids start at 1); `used`
/// counts the entries that are not free.
struct Held {
    used: Cell<usize>,
    ids: [Cell<u64>; SLOTS],
    depths: [Cell<usize>; SLOTS],
}

impl Held {
    const fn new() -> Self {
        Self { used: Cell::new(0), ids: [const { Cell::new(0) }; SLOTS], depths: [const { Cell::new(0) }; SLOTS] }
    }
}

#[cfg(not(scalemem_loom))]
crate::sync::thread_local! {
    static HELD: Held = const { Held::new() };
}

// loom's `thread_local!` takes no `const` initialiser (its tables are per model thread).
#[cfg(scalemem_loom)]
crate::sync::thread_local! {
    static HELD: Held = Held::new();
}

/// What the table says about a lock this thread is about to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// This thread already holds it, at entry `i`.
    Held(u8),
    /// Not held; entry `i` is free for it.
    Free(u8),
    /// Not held, and the table is full.
    Full,
}

/// The entry a lock prefers: where a nested read finds it with one comparison.
#[inline]
fn home(id: u64) -> usize {
    (id % SLOTS as u64) as usize
}

/// Looks `id` up in this thread's table. The common cases take one or two loads: a
/// thread that holds no `RmLock` (the first read), and a nested read of a lock that sits
/// in its home entry. Everything else scans the table, out of line.
#[inline]
pub(super) fn lookup(id: u64) -> Lookup {
    HELD.with(|held| {
        let home = home(id);
        if held.used.get() == 0 {
            return Lookup::Free(home as u8);
        }
        if held.ids[home].get() == id {
            return Lookup::Held(home as u8);
        }
        lookup_slow(held, id)
    })
}

#[cold]
#[inline(never)]
fn lookup_slow(held: &Held, id: u64) -> Lookup {
    if let Some(i) = held.ids.iter().position(|slot| slot.get() == id) {
        return Lookup::Held(i as u8);
    }
    if held.ids[home(id)].get() == 0 {
        return Lookup::Free(home(id) as u8);
    }
    held.ids.iter().position(|slot| slot.get() == 0).map_or(Lookup::Full, |i| Lookup::Free(i as u8))
}

/// True if this thread holds lock `id` for reading (tracked).
pub(super) fn holds(id: u64) -> bool {
    matches!(lookup(id), Lookup::Held(_))
}

/// Records the outermost read of lock `id` in the free entry `i` (from [`lookup`]).
#[inline]
pub(super) fn claim(i: u8, id: u64) {
    HELD.with(|held| {
        let i = usize::from(i) % SLOTS;
        held.ids[i].set(id);
        held.depths[i].set(1);
        held.used.set(held.used.get() + 1);
    });
}

/// A nested read of the lock held at entry `i`.
#[inline]
pub(super) fn nest(i: u8) {
    HELD.with(|held| {
        let depth = &held.depths[usize::from(i) % SLOTS];
        depth.set(depth.get() + 1);
    });
}

/// A release of the lock held at entry `i`; true if it was the outermost (the entry is
/// free again and the caller must depart).
#[inline]
pub(super) fn release(i: u8) -> bool {
    HELD.with(|held| {
        let i = usize::from(i) % SLOTS;
        let depth = held.depths[i].get() - 1;
        held.depths[i].set(depth);
        if depth == 0 {
            held.ids[i].set(0);
            held.used.set(held.used.get() - 1);
        }
        depth == 0
    })
}

/// An address that identifies the calling thread while it runs (its table's), for the
/// write owner check.
#[inline]
pub(super) fn thread_token() -> usize {
    HELD.with(|held| core::ptr::from_ref(held).addr())
}
