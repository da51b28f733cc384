//! Push-only, take-all intrusive lists: the registries of epoch records and hazard
//! records, and the lists of their mappings. Such lists have no ABA problem: a CAS that
//! succeeds links the pushed tail to the head it just saw, and nothing is ever popped
//! singly.

use core::ptr::NonNull;

use crate::sync::atomic::{AtomicPtr, Ordering};

/// Pushes the private list `head..=tail` onto `list`; `set_next(node, next)` writes a
/// node's link.
pub(crate) fn push_list<T>(
    list: &AtomicPtr<T>,
    head: NonNull<T>,
    tail: NonNull<T>,
    set_next: impl Fn(NonNull<T>, *mut T),
) {
    // Relaxed: the CAS below re-validates the value.
    let mut current = list.load(Ordering::Relaxed);
    loop {
        set_next(tail, current);
        // Release: publishes the list's contents to the Acquire loads or swap that take it.
        match list.compare_exchange_weak(current, head.as_ptr(), Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}
