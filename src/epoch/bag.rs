//! [`Bag`]: a fixed-size batch of deferred functions, and the mmap'd chunks bags live in.
//!
//! # Ownership protocol
//! A bag is owned by exactly one party at a time, and ownership moves only through a
//! Release store/CAS that the next owner reads with Acquire:
//! 1. the record ([`Local`]) filling it (its private `bag` or `spare` list);
//! 2. the collector's garbage queue, once sealed (pushed onto its inbox with a Release
//!    CAS, then moved to its FIFO by the collector-lock holder);
//! 3. the collector thread that popped it from the FIFO and runs it;
//! 4. the record that mapped it (`owner`), which receives it back empty on its
//!    multi-producer `free_bags` list (Release CAS push, Acquire swap take-all).
//!
//! Bags are never unmapped while their collector lives, so a bag pointer is always valid
//! memory; the lists use only push and take-all, which have no ABA problem.

use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};

use super::deferred::Deferred;
use super::internal::{Local, cfg};
use crate::os;
use crate::sync::UnsafeCell;
use crate::util::AllocError;

/// A batch of up to [`cfg::BAG_CAP`] deferred functions.
#[repr(C)]
pub(crate) struct Bag {
    /// Link in whichever list currently owns the bag.
    pub(crate) next: UnsafeCell<*mut Bag>,
    /// The global epoch read when the bag was sealed.
    pub(crate) epoch: UnsafeCell<usize>,
    /// The record that mapped this bag and takes it back when it is empty.
    pub(crate) owner: *const Local,
    /// Number of initialised entries in `items`.
    len: UnsafeCell<usize>,
    items: [MaybeUninit<Deferred>; cfg::BAG_CAP],
}

impl Bag {
    /// # Safety
    /// The caller owns `bag` (see the module doc).
    pub(crate) unsafe fn len(bag: NonNull<Bag>) -> usize {
        // SAFETY: the caller owns the bag, so no one writes `len` concurrently.
        unsafe { (*bag.as_ptr()).len.with(|len| *len) }
    }

    /// Adds `deferred`; returns true if the bag is now full.
    ///
    /// # Safety
    /// The caller owns `bag` and it is not full.
    pub(crate) unsafe fn push(bag: NonNull<Bag>, deferred: Deferred) -> bool {
        let bag = bag.as_ptr();
        // SAFETY: the caller owns the bag; len < BAG_CAP so the slot is in bounds and free.
        unsafe {
            let len = (*bag).len.with(|len| *len);
            debug_assert!(len < cfg::BAG_CAP);
            (*bag).items.as_mut_ptr().add(len).cast::<Deferred>().write(deferred);
            (*bag).len.with_mut(|l| *l = len + 1);
            len + 1 == cfg::BAG_CAP
        }
    }

    /// Runs every deferred function in the bag and leaves it empty.
    ///
    /// # Safety
    /// The caller owns `bag`, and every object its functions free is unreachable by any
    /// thread that could still dereference it (the bag's epoch has expired).
    pub(crate) unsafe fn run(bag: NonNull<Bag>) {
        let bag = bag.as_ptr();
        // SAFETY: the caller owns the bag; entries 0..len are initialised and each is
        // moved out exactly once before len is reset.
        unsafe {
            let len = (*bag).len.with(|len| *len);
            (*bag).len.with_mut(|l| *l = 0);
            for i in 0..len {
                (*bag).items.as_ptr().add(i).cast::<Deferred>().read().call();
            }
        }
    }
}

/// The header at the start of each mapping of bags.
#[repr(C)]
pub(crate) struct BagChunk {
    /// Next chunk of the same collector (push-only list, walked at collector teardown).
    pub(crate) next: *mut BagChunk,
    bytes: usize,
}

impl BagChunk {
    /// Maps a chunk of [`cfg::BAGS_PER_CHUNK`] empty bags owned by `owner`, linked
    /// through `next` from the returned first bag.
    pub(crate) fn map(owner: *const Local) -> Result<(NonNull<BagChunk>, NonNull<Bag>), AllocError> {
        let header = core::mem::size_of::<BagChunk>().next_multiple_of(core::mem::align_of::<Bag>());
        let bytes = header + cfg::BAGS_PER_CHUNK * core::mem::size_of::<Bag>();
        let base = os::map(bytes)?;
        let chunk = base.cast::<BagChunk>();
        // SAFETY: the fresh mapping is large enough for the header and BAGS_PER_CHUNK
        // bags at `header` (a multiple of Bag's alignment, on a page-aligned base); we
        // own it exclusively until we return it.
        unsafe {
            chunk.as_ptr().write(BagChunk { next: ptr::null_mut(), bytes });
            let first = base.as_ptr().add(header).cast::<Bag>();
            for i in 0..cfg::BAGS_PER_CHUNK {
                let next = if i + 1 < cfg::BAGS_PER_CHUNK { first.add(i + 1) } else { ptr::null_mut() };
                let bag = first.add(i);
                ptr::addr_of_mut!((*bag).next).write(UnsafeCell::new(next));
                ptr::addr_of_mut!((*bag).epoch).write(UnsafeCell::new(0));
                ptr::addr_of_mut!((*bag).owner).write(owner);
                ptr::addr_of_mut!((*bag).len).write(UnsafeCell::new(0));
            }
            Ok((chunk, NonNull::new_unchecked(first)))
        }
    }

    /// Unmaps a chunk.
    ///
    /// # Safety
    /// No bag of the chunk is in use or referenced any more.
    pub(crate) unsafe fn unmap(chunk: NonNull<BagChunk>) {
        // SAFETY: the header was written by map(); per the contract nothing uses the
        // chunk, so dropping the bags' cells and unmapping the whole mapping is sound.
        unsafe {
            let bytes = (*chunk.as_ptr()).bytes;
            let header = core::mem::size_of::<BagChunk>().next_multiple_of(core::mem::align_of::<Bag>());
            let first = chunk.as_ptr().cast::<u8>().add(header).cast::<Bag>();
            for i in 0..cfg::BAGS_PER_CHUNK {
                let bag = first.add(i);
                ptr::drop_in_place(ptr::addr_of_mut!((*bag).next));
                ptr::drop_in_place(ptr::addr_of_mut!((*bag).epoch));
                ptr::drop_in_place(ptr::addr_of_mut!((*bag).len));
            }
            os::unmap(chunk.cast(), bytes);
        }
    }
}
