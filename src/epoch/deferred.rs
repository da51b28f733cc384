//! [`Deferred`]: a type-erased `FnOnce()` stored inline in three words, so that a bag of
//! them is plain memory (no allocation per deferred function unless the closure is
//! larger than three words, in which case it is boxed once).

use core::mem::{self, MaybeUninit};

/// Inline storage for a closure's captures.
type Data = [usize; 3];

/// A deferred function call.
pub(crate) struct Deferred {
    call: unsafe fn(*mut Data),
    data: MaybeUninit<Data>,
}

impl Deferred {
    /// Wraps `f`. Closures up to three words (a `Shared` pointer, an `Arc`, a few
    /// integers) are stored inline; larger ones are boxed.
    pub(crate) fn new<F: FnOnce()>(f: F) -> Self {
        let mut data = MaybeUninit::<Data>::uninit();
        if mem::size_of::<F>() <= mem::size_of::<Data>() && mem::align_of::<F>() <= mem::align_of::<Data>() {
            // SAFETY: F fits in Data's size and alignment (checked just above).
            unsafe { data.as_mut_ptr().cast::<F>().write(f) };
            Self { call: call_inline::<F>, data }
        } else {
            let boxed: Box<F> = Box::new(f);
            // SAFETY: a thin Box pointer is one word, which Data holds.
            unsafe { data.as_mut_ptr().cast::<*mut F>().write(Box::into_raw(boxed)) };
            Self { call: call_boxed::<F>, data }
        }
    }

    /// Runs the function, consuming it.
    pub(crate) fn call(mut self) {
        let call = self.call;
        // SAFETY: `data` holds the value `call` was made for, and `self` is consumed, so
        // it runs once (Deferred has no Drop: the value is moved out exactly here).
        unsafe { call(self.data.as_mut_ptr()) };
    }
}

/// # Safety
/// `data` holds an initialised `F`, which this call moves out.
unsafe fn call_inline<F: FnOnce()>(data: *mut Data) {
    // SAFETY: per the contract, `data` holds an F written by Deferred::new.
    let f: F = unsafe { data.cast::<F>().read() };
    f();
}

/// # Safety
/// `data` holds a `*mut F` from `Box::into_raw`, which this call takes back.
unsafe fn call_boxed<F: FnOnce()>(data: *mut Data) {
    // SAFETY: per the contract, the word is a Box::into_raw pointer not yet reclaimed.
    let f: Box<F> = unsafe { Box::from_raw(data.cast::<*mut F>().read()) };
    (*f)();
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::Deferred;
    use std::cell::Cell;

    #[test]
    fn runs_small_and_large_closures_once() {
        let count = Cell::new(0);
        let small = &count;
        Deferred::new(move || small.set(small.get() + 1)).call();
        let big = [7usize; 8];
        let total = &count;
        Deferred::new(move || total.set(total.get() + big.iter().sum::<usize>())).call();
        assert_eq!(count.get(), 1 + 56);
    }

    #[test]
    fn drops_captures_when_run() {
        let token = std::rc::Rc::new(());
        let captured = token.clone();
        let d = Deferred::new(move || drop(captured));
        assert_eq!(std::rc::Rc::strong_count(&token), 2);
        d.call();
        assert_eq!(std::rc::Rc::strong_count(&token), 1);
    }
}
