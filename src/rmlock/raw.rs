//! [`RawRmLock`]: the lock's protocol without the value: the writer flag and the
//! writers' mutex (`state`), the word a writer sleeps on while readers leave (`drain`),
//! the per-CPU reader counts and the recursion table. Not generic, so the slow paths are
//! compiled once and the fast paths inline into each `RmLock<T>`. The protocol and its
//! argument are in the module doc of [`crate::rmlock`]; comments here name the step of
//! it each access implements.

use super::recursion::{self, Lookup, UNTRACKED};
use super::tracker::Readers;
use crate::cpu::fence;
use crate::sync::Futex;
use crate::sync::atomic::{AtomicUsize, Ordering, fence as atomic_fence};
use crate::util::{AllocError, Backoff};

/// `state`: a writer holds the lock or is waiting for readers to leave. New readers
/// back out and wait while it is set.
const WRITER: u32 = 1;
/// `state`: some thread sleeps on `state` until `WRITER` clears. Only ever set together
/// with `WRITER` (a waiter sets it by compare-exchange from a value with `WRITER`, and
/// releasing the write lock stores 0), so a clear `WRITER` means a zero `state`.
const PARKED: u32 = 2;

/// `drain`: the writer sleeps on `drain` until readers leave. The other bits of `drain`
/// count departures that saw `WRITER` (in steps of [`DRAIN_TICK`]), which changes the
/// word under the sleeping writer.
const WRITER_SLEEPING: u32 = 1;
/// `drain`: the increment of a reader's departure notice.
const DRAIN_TICK: u32 = 2;

/// Whether waiters spin (with [`Backoff`]) before they sleep. Under loom they sleep at
/// once: the models are about the sleep and the wake-up, and spinning only multiplies
/// their interleavings.
const SPIN_FIRST: bool = !cfg!(scalemem_loom);

/// The protocol state of one `RmLock`.
pub(super) struct RawRmLock {
    /// [`WRITER`] | [`PARKED`]: the writer flag readers check, the writers' mutex, and
    /// the word readers and writers sleep on while a writer holds the lock.
    state: Futex,
    /// [`WRITER_SLEEPING`] + departure notices: the word the writer sleeps on while
    /// readers are inside.
    drain: Futex,
    /// This lock's key in the threads' recursion tables; never reused.
    id: u64,
    /// The `recursion::thread_token` of the thread holding the write lock (0: none), to
    /// turn a thread's wait for itself into a panic. Relaxed everywhere: a thread only
    /// ever compares it with its own token, which only that thread stores.
    owner: AtomicUsize,
    /// Per-CPU arrival and departure counts.
    readers: Readers,
}

impl RawRmLock {
    /// An unlocked lock. Fails only if the kernel refuses memory for the counts.
    pub(super) fn try_new() -> Result<Self, AllocError> {
        Ok(Self {
            state: Futex::new(0),
            drain: Futex::new(0),
            id: crate::sync::unique_id(),
            owner: AtomicUsize::new(0),
            readers: Readers::try_new()?,
        })
    }

    /// Read lock, waiting while a writer holds the lock or waits for it. Returns the
    /// recursion-table entry the guard must hand back to [`read_unlock`](Self::read_unlock).
    #[inline]
    pub(super) fn read_lock(&self) -> u8 {
        let entry = match recursion::lookup(self.id) {
            Lookup::Held(entry) => {
                recursion::nest(entry);
                return entry;
            }
            Lookup::Free(entry) => entry,
            Lookup::Full => UNTRACKED,
        };
        if !self.try_arrive() {
            self.arrive_slow();
        }
        if entry != UNTRACKED {
            recursion::claim(entry, self.id);
        }
        entry
    }

    /// Read lock if no writer holds the lock or waits for it, or this thread holds it
    /// for reading already; never waits.
    #[inline]
    pub(super) fn try_read_lock(&self) -> Option<u8> {
        let entry = match recursion::lookup(self.id) {
            Lookup::Held(entry) => {
                recursion::nest(entry);
                return Some(entry);
            }
            Lookup::Free(entry) => entry,
            Lookup::Full => UNTRACKED,
        };
        if !self.try_arrive() {
            return None;
        }
        if entry != UNTRACKED {
            recursion::claim(entry, self.id);
        }
        Some(entry)
    }

    /// Releases a read lock taken with the recursion-table `entry`.
    #[inline]
    pub(super) fn read_unlock(&self, entry: u8) {
        if entry == UNTRACKED || recursion::release(entry) {
            self.depart();
        }
    }

    /// Read acquire, step R1-R3: arrive, light fence, check the writer flag. On `false`
    /// the arrival has been taken back (and the writer told) and the caller must wait.
    #[inline]
    fn try_arrive(&self) -> bool {
        // R1: count ourselves on this CPU (publishes nothing by itself).
        self.readers.arrive();
        // R2: pairs with the writer's heavy fence (W2): either the writer's drain sees
        // our arrival, or our load below sees its flag.
        fence::light();
        // R3. Acquire: pairs with the Release swap in `write_unlock` (W5): when we read
        // the flag clear from it, the last writer's critical section happens before ours.
        if self.state.load(Ordering::Acquire) & WRITER == 0 {
            return true;
        }
        self.back_out();
        false
    }

    /// A reader that saw the flag takes its arrival back (a departure, which may wake
    /// the writer), having touched no data.
    #[cold]
    #[inline(never)]
    fn back_out(&self) {
        self.depart();
    }

    /// Waits until no writer holds the lock, then arrives, as often as it takes.
    #[cold]
    #[inline(never)]
    fn arrive_slow(&self) {
        // A writer that holds the lock and reads it would wait for itself forever.
        // Relaxed: only this thread stores its own token (see `owner`).
        if self.owner.load(Ordering::Relaxed) == recursion::thread_token() {
            panic!("RmLock::read: this thread holds the write lock (it would wait for itself)");
        }
        loop {
            self.wait_while_write_locked();
            if self.try_arrive() {
                return;
            }
        }
    }

    /// Read release, step R4-R6: Release fence, depart, light fence, and tell a writer
    /// that waits for readers.
    #[inline]
    fn depart(&self) {
        // R4. Release: pairs with the Acquire fence in `Readers::all_departed` (W3): our
        // critical section, and our arrival, happen before whatever the writer does
        // after it has counted this departure.
        atomic_fence(Ordering::Release);
        self.readers.depart();
        // R5: pairs with the writer's heavy fence (W2), as R2 does: either the writer's
        // drain sees our departure, or the load below sees its flag.
        fence::light();
        // R6. Relaxed: only decides whether to notify; the notification itself is a
        // SeqCst RMW of `drain` (see `notify_writer`).
        if self.state.load(Ordering::Relaxed) & WRITER != 0 {
            self.notify_writer();
        }
    }

    /// Tells the writer that a reader left: changes `drain`, and wakes the writer if it
    /// sleeps on it.
    #[cold]
    #[inline(never)]
    fn notify_writer(&self) {
        // SeqCst: pairs with the SeqCst fetch_or in `wait_for_readers`. If ours comes
        // first in the word's order, that fetch_or reads our change, so our departure
        // (sequenced before) is visible to the writer's re-check; if it comes second, we
        // read WRITER_SLEEPING and wake it, and the word it sleeps on has changed. (In
        // the symmetric mode R5's SeqCst fence already releases the departure; with a
        // compiler fence at R5 this RMW is what does.)
        let seen = self.drain.fetch_add(DRAIN_TICK, Ordering::SeqCst);
        if seen & WRITER_SLEEPING != 0 {
            self.drain.wake_one();
        }
    }

    /// Spins, then sleeps on `state`, until `WRITER` is clear (it may be set again by
    /// the time the caller looks).
    fn wait_while_write_locked(&self) {
        let backoff = Backoff::new();
        loop {
            // Relaxed: a hint; the caller re-checks with the ordered protocol (R1-R3).
            let state = self.state.load(Ordering::Relaxed);
            if state & WRITER == 0 {
                return;
            }
            if SPIN_FIRST && !backoff.is_completed() {
                backoff.snooze();
                continue;
            }
            // Relaxed: PARKED only asks the releasing writer to wake us; the futex
            // re-checks the word atomically with going to sleep.
            if state & PARKED == 0
                && self.state.compare_exchange(state, state | PARKED, Ordering::Relaxed, Ordering::Relaxed).is_err()
            {
                continue;
            }
            self.state.wait(state | PARKED);
        }
    }

    /// Write lock: W1-W3. Panics if this thread holds the lock already (see
    /// `RmLock::write`).
    pub(super) fn write_lock(&self) {
        let me = recursion::thread_token();
        // Relaxed: only this thread stores its own token (see `owner`).
        if self.owner.load(Ordering::Relaxed) == me {
            panic!("RmLock::write: this thread holds the write lock already");
        }
        if recursion::holds(self.id) {
            panic!("RmLock::write: this thread holds a read guard of this lock (it would wait for itself)");
        }
        self.lock_writers(me);
        // W2: pairs with every reader's light fences (R2, R5).
        fence::heavy();
        self.wait_for_readers();
    }

    /// Write lock if no other writer holds it and no reader is inside; never waits.
    pub(super) fn try_write_lock(&self) -> bool {
        // W1 without waiting. Acquire: as in `lock_writers`.
        if self.state.compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        let me = recursion::thread_token();
        // Relaxed: see `owner`.
        self.owner.store(me, Ordering::Relaxed);
        // W2.
        fence::heavy();
        // W3, once.
        if self.readers.all_departed() {
            return true;
        }
        // Readers inside: let them be, and wake those that backed out meanwhile.
        self.write_unlock();
        false
    }

    /// W1: takes the writers' mutex, which sets the flag readers check.
    fn lock_writers(&self, me: usize) {
        // Acquire: pairs with the Release swap in `write_unlock` (W5): the previous
        // writer's critical section happens before ours. (W2's SeqCst fence would order
        // it too; the Acquire keeps W1 a mutex in its own right.)
        if self.state.compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_writers_slow();
        }
        // Relaxed: see `owner`.
        self.owner.store(me, Ordering::Relaxed);
    }

    #[cold]
    #[inline(never)]
    fn lock_writers_slow(&self) {
        let backoff = Backoff::new();
        loop {
            // Relaxed: a hint for the compare-exchange below.
            let state = self.state.load(Ordering::Relaxed);
            if state & WRITER == 0 {
                // `state` is 0 here (see PARKED). Acquire: as in `lock_writers`.
                if self.state.compare_exchange(state, WRITER, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            if SPIN_FIRST && !backoff.is_completed() {
                backoff.snooze();
                continue;
            }
            // Relaxed: as in `wait_while_write_locked`.
            if state & PARKED == 0
                && self.state.compare_exchange(state, state | PARKED, Ordering::Relaxed, Ordering::Relaxed).is_err()
            {
                continue;
            }
            self.state.wait(state | PARKED);
        }
    }

    /// W3: waits until every reader the writer can see has departed: spins, then sleeps
    /// on `drain` (woken by `notify_writer`).
    fn wait_for_readers(&self) {
        if self.readers.all_departed() {
            return;
        }
        self.wait_for_readers_slow();
    }

    #[cold]
    #[inline(never)]
    fn wait_for_readers_slow(&self) {
        let backoff = Backoff::new();
        while SPIN_FIRST && !backoff.is_completed() {
            backoff.snooze();
            if self.readers.all_departed() {
                return;
            }
        }
        loop {
            // SeqCst: pairs with the SeqCst fetch_add in `notify_writer` (see there).
            let seen = self.drain.fetch_or(WRITER_SLEEPING, Ordering::SeqCst) | WRITER_SLEEPING;
            if self.readers.all_departed() {
                break;
            }
            self.drain.wait(seen);
        }
        // Relaxed: the bit only asks departing readers to wake us; left set, it would
        // cost the next writer's readers a spurious wake, nothing more.
        self.drain.fetch_and(!WRITER_SLEEPING, Ordering::Relaxed);
    }

    /// W5: releases the write lock and wakes everyone that sleeps on `state`.
    pub(super) fn write_unlock(&self) {
        // Relaxed: see `owner`.
        self.owner.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire load of readers (R3) and the Acquire
        // compare-exchange of writers (W1): our critical section happens before theirs.
        let state = self.state.swap(0, Ordering::Release);
        if state & PARKED != 0 {
            self.state.wake_all();
        }
    }

    /// True while a writer holds the lock or waits for readers to leave.
    pub(super) fn is_write_locked(&self) -> bool {
        // Relaxed: a snapshot that orders nothing.
        self.state.load(Ordering::Relaxed) & WRITER != 0
    }
}
