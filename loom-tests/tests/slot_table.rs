//! loom models of `umem::slot_table`: how the global heap publishes a size class's
//! per-CPU slots to `malloc`'s and `free`'s hit paths. A publisher initialises a class's
//! slots (here an `UnsafeCell` that loom checks for unsynchronised access) and publishes
//! them while other threads look the class up by size and by tag, or take a run whose
//! pages copy the tag's entry into their tag word and hand an object of it to a thread
//! that frees it through that word. Whoever finds a base must find the published slot
//! count and the slots' initialised contents; a table entry never names anything else.
//!
//! ```text
//! ci/loom.sh slot_table
//! ```
#![cfg(scalemem_loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicPtr};
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use scalemem::umem::slot_table::{Published, SlotTable, word_for_run};
use scalemem_loom_tests::run_model;

/// A table sized down: 4 tags, 4 entries by 8 bytes, 4 by 16 bytes.
type Table = SlotTable<4, 4, 4>;

/// Two CPUs' slots, as a class's layer would have them.
const NCPUS: usize = 2;

/// One class's slots: words the publisher writes before publishing.
struct Slots(UnsafeCell<[usize; NCPUS]>);

impl Slots {
    fn new() -> Self {
        Self(UnsafeCell::new([0; NCPUS]))
    }

    /// The publisher's initialisation (what making a layer writes into its slots).
    fn init(&self, value: usize) {
        // SAFETY: only the publisher writes, before it publishes; loom reports a race
        // with any reader that is not ordered after the publication.
        self.0.with_mut(|p| unsafe { *p = [value; NCPUS] });
    }

    /// The slots' address, as a table entry names them (the cell's own address: no
    /// access to its contents for loom to track).
    fn base(&self) -> *mut u8 {
        core::ptr::from_ref(&self.0).cast_mut().cast::<u8>()
    }
}

/// What a hit path does with a base it found: the count must be the published one, and
/// the slots must hold what the publisher wrote (loom checks the read is ordered after
/// the write).
fn use_slots(found: Published, slots: &Slots, value: usize) {
    assert_eq!(found.base, slots.base(), "an entry names other slots");
    assert_eq!(found.ncpus, NCPUS, "a base seen without its slot count");
    // SAFETY: a read of the slots' words; loom reports it if it races with `init`.
    let words = slots.0.with(|p| unsafe { *p });
    assert_eq!(words, [value; NCPUS], "a base seen before its slots were initialised");
}

/// Publishes `slots` as the class with tag `tag` whose requests are sizes `8 * size8`
/// (alignment 8) and `16 * size16` (alignment 16), after initialising them with `value`.
fn publish(table: &Table, tag: u8, slots: &Slots, value: usize, size8: usize, size16: usize) -> bool {
    slots.init(value);
    table.publish(tag, slots.base(), NCPUS, |i| i == size8, |i| i == size16)
}

/// A publisher against a reader that looks the class up by size (as `malloc` and
/// `GlobalAlloc::alloc` do) and by tag (as a `free` of a run without a word does).
#[test]
fn a_hit_that_finds_an_entry_finds_the_slots() {
    run_model("slot_table: publish against lookups by size and tag", || {
        let table = Arc::new(Table::new());
        let slots = Arc::new(Slots::new());
        let publisher = {
            let (table, slots) = (table.clone(), slots.clone());
            thread::spawn(move || assert!(publish(&table, 1, &slots, 7, 1, 1)))
        };
        // SAFETY: 8.div_ceil(8) = 1 < 4 and 16.div_ceil(16) = 1 < 4, in range.
        let (by8, by16) = unsafe { (table.by8_unchecked(8), table.by16_unchecked(16)) };
        if let Some(found) = table.slots_at(by16) {
            use_slots(found, &slots, 7);
        }
        if let Some(found) = table.slots_at(table.by_tag(1).unwrap()) {
            use_slots(found, &slots, 7);
        }
        if let Some(found) = table.slots_at(by8) {
            use_slots(found, &slots, 7);
        }
        publisher.join().unwrap();
        // Once published, every entry of the class names the slots, and no other does.
        for entry in [by8, by16, table.by_tag(1).unwrap()] {
            use_slots(table.slots_at(entry).expect("a published entry"), &slots, 7);
        }
        // SAFETY: in range (sizes 0, 24 and 48: entries 0, 3 and 3).
        let others = unsafe { [table.by8_unchecked(0), table.by8_unchecked(24), table.by16_unchecked(48)] };
        for entry in others.into_iter().chain([table.by_tag(0).unwrap(), table.by_tag(2).unwrap()]) {
            assert_eq!(table.slots_at(entry), None, "an entry of no class was published");
        }
    });
}

/// A publisher against a thread that takes a run with the class's tag (copying the tag's
/// entry into the page's word under the region lock, as `Regions::alloc_run` does) and
/// hands an object of it to a third thread, which frees it through the page's word as
/// `free` does: a word it finds non-null leads to the published count and slots.
#[test]
fn a_page_word_leads_to_the_published_slots() {
    run_model("slot_table: publish against a run's tag word and a remote free", || {
        let table = Arc::new(Table::new());
        let slots = Arc::new(Slots::new());
        // The page's tag word, and the object's hand-off from allocator to freer.
        let page_word = Arc::new(AtomicPtr::new(core::ptr::null_mut()));
        let handed = Arc::new(AtomicBool::new(false));
        let publisher = {
            let (table, slots) = (table.clone(), slots.clone());
            thread::spawn(move || assert!(publish(&table, 2, &slots, 9, 2, 2)))
        };
        let allocator = {
            let (table, page_word, handed) = (table.clone(), page_word.clone(), handed.clone());
            thread::spawn(move || {
                // Under the region manager's lock (no other run taker here).
                let word = word_for_run(table.tag_words(), 2);
                // Relaxed: as `alloc_run` stores the page's word (ordered for the freer by
                // the hand-off below).
                page_word.store(word, Relaxed);
                // Release: the program's own hand-off of the object to another thread.
                handed.store(true, Release);
            })
        };
        // Acquire: pairs with the hand-off's Release.
        if handed.load(Acquire) {
            // Relaxed: as `region::page_word` loads it.
            let word = page_word.load(Relaxed);
            if !word.is_null() {
                use_slots(Published { base: word, ncpus: table.ncpus() }, &slots, 9);
            }
        }
        publisher.join().unwrap();
        allocator.join().unwrap();
    });
}

/// Two classes published one after the other under the set-up lock, in either order,
/// while a reader looks up the second: the second publication finds the count set and
/// publishes; a layer with another count changes nothing.
#[test]
fn a_second_class_publishes_under_the_count_already_set() {
    run_model("slot_table: two publications and a mismatched count", || {
        let table = Arc::new(Table::new());
        let (a, b) = (Arc::new(Slots::new()), Arc::new(Slots::new()));
        let set_up_lock = Arc::new(Mutex::new(()));
        let first = {
            let (table, a, set_up_lock) = (table.clone(), a.clone(), set_up_lock.clone());
            thread::spawn(move || {
                let _set_up = set_up_lock.lock().unwrap();
                assert!(publish(&table, 1, &a, 5, 1, 1));
            })
        };
        let second = {
            let (table, b, set_up_lock) = (table.clone(), b.clone(), set_up_lock.clone());
            thread::spawn(move || {
                let _set_up = set_up_lock.lock().unwrap();
                assert!(publish(&table, 2, &b, 6, 2, 2));
            })
        };
        // SAFETY: 32.div_ceil(16) = 2 < 4, in range.
        if let Some(found) = table.slots_at(unsafe { table.by16_unchecked(32) }) {
            use_slots(found, &b, 6);
        }
        first.join().unwrap();
        second.join().unwrap();
        let c = Slots::new();
        let _set_up = set_up_lock.lock().unwrap();
        c.init(8);
        assert!(!table.publish(3, c.base(), NCPUS + 1, |i| i == 3, |i| i == 3), "a mismatched count was published");
        assert_eq!(table.slots_at(table.by_tag(3).unwrap()), None);
        // SAFETY: 24.div_ceil(8) = 3 < 4, in range.
        assert_eq!(table.slots_at(unsafe { table.by8_unchecked(24) }), None);
        assert_eq!(table.ncpus(), NCPUS);
        use_slots(table.slots_at(table.by_tag(1).unwrap()).unwrap(), &a, 5);
        use_slots(table.slots_at(table.by_tag(2).unwrap()).unwrap(), &b, 6);
    });
}
