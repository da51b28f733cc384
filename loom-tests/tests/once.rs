//! loom models of `umem::once`, how the global heap is made once and published: two
//! threads make their first allocation at once (so both may find the heap missing and
//! race for the lock), one of whose makers may find the kernel refusing memory, while a
//! third thread only looks. Whoever gets the value must see it fully made (its contents
//! are in a cell loom checks for unsynchronised access), and a successful maker runs
//! once.
//!
//! ```text
//! ci/loom.sh once
//! ```
#![cfg(scalemem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::Relaxed;

use scalemem::umem::once::{OncePtr, OnceRef, SpinLock};
use scalemem_loom_tests::run_model;

/// What a maker makes: contents written before publication.
struct Value(UnsafeCell<u64>);

// SAFETY: the cell is written only by the one maker before publication and read after;
// loom checks exactly that.
unsafe impl Sync for Value {}

impl Value {
    /// The value's contents, read as a user of the published value reads them.
    fn read(&self) -> u64 {
        // SAFETY: a read; loom reports it if it is not ordered after the maker's write.
        self.0.with(|p| unsafe { *p })
    }
}

/// Makes `value` (writes its contents) and counts the makers that ran; `refuse` makes
/// nothing, as when the kernel refuses the heap's memory.
fn make<'a>(value: &'a Value, makers: &AtomicUsize, refuse: bool) -> Option<&'a Value> {
    // Relaxed: a count read after the threads are joined.
    makers.fetch_add(1, Relaxed);
    if refuse {
        return None;
    }
    // SAFETY: only a maker writes, under the lock, before publication.
    value.0.with_mut(|p| unsafe { *p = 42 });
    Some(value)
}

/// Two first uses at once, the other thread's maker refusing if `refuse`, and a reader.
fn race(refuse: bool) {
    // Leaked: the model's value lives for 'static, as the heap does.
    let value: &'static Value = Box::leak(Box::new(Value(UnsafeCell::new(0))));
    let once: Arc<OncePtr<'static, Value>> = Arc::new(OncePtr::new());
    let makers = Arc::new(AtomicUsize::new(0));
    let other = {
        let (once, makers) = (once.clone(), makers.clone());
        thread::spawn(move || once.get_or_make(|| make(value, &makers, refuse)).map(Value::read))
    };
    let reader = {
        let once = once.clone();
        thread::spawn(move || once.get().map(Value::read))
    };
    let mine = once.get_or_make(|| make(value, &makers, false)).map(Value::read);
    assert_eq!(mine, Some(42), "a successful maker's caller gets its value");
    let theirs = other.join().unwrap();
    // A refusing maker that ran before ours gives None (nothing remembered); otherwise
    // the other thread gets the published value.
    assert!(theirs == Some(42) || (refuse && theirs.is_none()), "{theirs:?}");
    assert!(matches!(reader.join().unwrap(), None | Some(42)), "a reader saw a half-made value");
    // One successful maker, plus the refusing one if it ran; none after publication.
    let ran = makers.load(Relaxed);
    assert_eq!(ran, if theirs.is_none() { 2 } else { 1 }, "a maker ran after publication");
    assert!(core::ptr::eq(once.get().unwrap(), value));
}

#[test]
fn two_first_uses_make_the_value_once() {
    run_model("once: two first uses race while a reader looks", || race(false));
}

#[test]
fn a_refused_first_use_is_not_remembered() {
    run_model("once: a first use whose maker refuses races a successful one and a reader", || race(true));
}

/// Two values under one shared lock, as the global heap makes its size classes' caches:
/// one thread makes the first value while another looks at it and then makes the
/// second. Each value is made once and seen fully made.
#[test]
fn two_values_under_one_lock() {
    run_model("once: two values made under one shared lock", || {
        let values: &'static [Value; 2] = Box::leak(Box::new([Value(UnsafeCell::new(0)), Value(UnsafeCell::new(0))]));
        let onces: Arc<([OnceRef<'static, Value>; 2], SpinLock)> =
            Arc::new(([OnceRef::new(), OnceRef::new()], SpinLock::new()));
        let makers = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let second = {
            let (onces, makers) = (onces.clone(), makers.clone());
            thread::spawn(move || {
                let looked = onces.0[0].get().map(Value::read);
                (onces.0[1].get_or_make(&onces.1, || make(&values[1], &makers[1], false)).map(Value::read), looked)
            })
        };
        let mine = onces.0[0].get_or_make(&onces.1, || make(&values[0], &makers[0], false)).map(Value::read);
        assert_eq!(mine, Some(42));
        let (theirs, looked) = second.join().unwrap();
        assert_eq!(theirs, Some(42));
        assert!(matches!(looked, None | Some(42)), "a reader saw a half-made value");
        assert_eq!(onces.0[0].get_or_make(&onces.1, || unreachable!("made twice")).map(Value::read), Some(42));
        assert_eq!((makers[0].load(Relaxed), makers[1].load(Relaxed)), (1, 1), "a value was made twice");
    });
}
