//! [`RawRmLock`]: the lock's protocol without the value: the writer flag and the
//! writers' mutex (`state`), the word a writer sleeps on while readers leave (`drain`),
//! the lock's tag in the threads' reader slots, and the per-CPU reader counts. Not
//! generic, so the slow paths are compiled once and the fast paths inline into each
//! `RmLock<T>`. The protocol and its
//! argument are in the module doc of [`crate::rmlock`]; comments here name the step of
//! it each access implements.

use super::slots::{self, Lookup, Record};
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

/// How a read guard is held: the address of a slot of the thread's record, or for a
/// hold counted per CPU the sentinel record's first slot (`slots::sentinel`). The slot's
/// depth word says how the release goes: 0 (the last guard of a thread whose slot fences
/// are compiler fences) inline, a nested guard of such a thread inline, and anything
/// with `slots::OUT_OF_LINE` (a SeqCst-fence thread's hold, or a counted one) out of
/// line, so that the inline release tests one word it has to load anyway.
#[derive(Clone, Copy)]
pub(super) struct Ticket(*const AtomicUsize);

impl Ticket {
    /// A hold in `slot`, a slot of this thread's record.
    fn at(slot: &AtomicUsize) -> Self {
        Self(core::ptr::from_ref(slot))
    }

    /// A hold counted in the per-CPU counts.
    fn counted() -> Self {
        Self::at(slots::sentinel().slot(0))
    }

    /// True for a counted hold.
    fn is_counted(self) -> bool {
        core::ptr::eq(self.0, slots::sentinel().slot(0))
    }
}

/// R2/R5 on the slot path, of the kind the thread's registration chose (see
/// `slots::light_slots`): a compiler fence, or a SeqCst fence.
#[inline]
fn slot_fence(light: bool) {
    if light { fence::light_asymmetric() } else { atomic_fence(Ordering::SeqCst) }
}

/// The protocol state of one `RmLock`.
pub(super) struct RawRmLock {
    /// [`WRITER`] | [`PARKED`]: the writer flag readers check, the writers' mutex, and
    /// the word readers and writers sleep on while a writer holds the lock.
    state: Futex,
    /// [`WRITER_SLEEPING`] + departure notices: the word the writer sleeps on while
    /// readers are inside.
    drain: Futex,
    /// This lock's tag in the threads' reader slots (a never-reused identity); the slot
    /// it tries first is `slots::home_of(tag)`, computed, not loaded.
    tag: usize,
    /// The `slots::thread_token` of the thread holding the write lock (0: none), to
    /// turn a thread's wait for itself into a panic. Relaxed everywhere: a thread only
    /// ever compares it with its own token, which only that thread stores.
    owner: AtomicUsize,
    /// Per-CPU arrival and departure counts, for readers without a free slot.
    readers: Readers,
}

impl RawRmLock {
    /// An unlocked lock. Fails only if the kernel refuses memory for the counts.
    pub(super) fn try_new() -> Result<Self, AllocError> {
        let tag = slots::tag_of(crate::sync::unique_id());
        Ok(Self {
            state: Futex::new(0),
            drain: Futex::new(0),
            tag,
            owner: AtomicUsize::new(0),
            readers: Readers::try_new()?,
        })
    }

    /// Read lock, waiting while a writer holds the lock or waits for it. Returns how the
    /// hold is recorded, for [`read_unlock`](Self::read_unlock). The fast path: the
    /// thread's home slot for this lock is free (its first read of it) or holds it
    /// already (a nested read). A thread whose slot fences are SeqCst (registered in the
    /// symmetric mode), or that has not registered, finds the sentinel's slots, which
    /// are neither: it takes the slow path (the symmetric mode costs a SeqCst fence per
    /// step anyway).
    #[inline]
    pub(super) fn read_lock(&self) -> Ticket {
        let tag = self.tag;
        let slot = slots::mine_fast().slot(slots::home_of(tag));
        let word = slots::own(slot);
        if word == 0 && self.try_enter(slot, true) {
            return Ticket::at(slot);
        }
        if word == tag {
            // Laid out after the outermost read: a nested one is the rarer case.
            crate::util::cold_path();
            Self::nest(slot);
            return Ticket::at(slot);
        }
        self.read_lock_slow()
    }

    #[cold]
    #[inline(never)]
    fn read_lock_slow(&self) -> Ticket {
        // A writer that holds the lock and reads it would wait for itself forever.
        // Relaxed: only this thread stores its own token (see `owner`).
        if self.owner.load(Ordering::Relaxed) == slots::thread_token() {
            panic!("RmLock::read: this thread holds the write lock (it would wait for itself)");
        }
        let lookup = slots::mine().map_or(Lookup::Full, |record| record.lookup(self.tag));
        let light = slots::light_slots();
        match lookup {
            Lookup::Held(slot) => {
                Self::nest(slot);
                Ticket::at(slot)
            }
            Lookup::Free(slot) => loop {
                self.wait_while_write_locked();
                if self.try_enter(slot, light) {
                    return Ticket::at(slot);
                }
            },
            Lookup::Full => {
                if !self.try_arrive() {
                    self.arrive_slow();
                }
                Ticket::counted()
            }
        }
    }

    /// Read lock if no writer holds the lock or waits for it, or this thread holds it
    /// for reading already; never waits.
    #[inline]
    pub(super) fn try_read_lock(&self) -> Option<Ticket> {
        let lookup = slots::mine().map_or(Lookup::Full, |record| record.lookup(self.tag));
        let light = slots::light_slots();
        match lookup {
            Lookup::Held(slot) => {
                Self::nest(slot);
                Some(Ticket::at(slot))
            }
            Lookup::Free(slot) => self.try_enter(slot, light).then(|| Ticket::at(slot)),
            Lookup::Full => self.try_arrive().then(Ticket::counted),
        }
    }

    /// Releases a read lock held as `ticket`: one load of the slot's depth decides
    /// (see [`Ticket`]).
    #[inline]
    pub(super) fn read_unlock(&self, ticket: Ticket) {
        // SAFETY: a ticket is a slot of this thread's record (from `read_lock` or
        // `try_read_lock` on this thread: guards are not `Send`) or of the sentinel;
        // records are never freed and the sentinel is a static.
        let slot = unsafe { &*ticket.0 };
        // SAFETY: a slot of a record, as just said.
        let depth = unsafe { Record::depth_of(slot) };
        let nested = slots::own(depth);
        if nested == 0 {
            self.leave(slot, true);
        } else if nested & slots::OUT_OF_LINE == 0 {
            // Laid out after the last guard's release, as in `read_lock`.
            crate::util::cold_path();
            // Relaxed: only this thread reads its depths.
            depth.store(nested - 1, Ordering::Relaxed);
        } else {
            self.read_unlock_slow(ticket);
        }
    }

    /// The release of a counted hold, or of a slot hold with SeqCst fences: out of line,
    /// so that the inline release stays small (the rseq section needs registers the
    /// slot path does not).
    #[cold]
    #[inline(never)]
    fn read_unlock_slow(&self, ticket: Ticket) {
        if ticket.is_counted() {
            return self.depart();
        }
        // SAFETY: as in `read_unlock`.
        let slot = unsafe { &*ticket.0 };
        // SAFETY: a slot of this thread's record.
        let depth = unsafe { Record::depth_of(slot) };
        let nested = slots::own(depth) & !slots::OUT_OF_LINE;
        if nested == 0 {
            self.leave(slot, false);
        } else {
            // Relaxed: only this thread reads its depths.
            depth.store((nested - 1) | slots::OUT_OF_LINE, Ordering::Relaxed);
        }
    }

    /// A nested read of a lock held in `slot` (of this thread's record): one level
    /// deeper. No flag check: the outer hold keeps writers out, and one waiting would
    /// wait for us.
    #[inline]
    fn nest(slot: &AtomicUsize) {
        // SAFETY: `slot` is a slot of this thread's record.
        let depth = unsafe { Record::depth_of(slot) };
        // Relaxed: only this thread reads its depths. (A depth cannot reach
        // `OUT_OF_LINE` by counting: that takes 2^63 live guards.)
        depth.store(slots::own(depth) + 1, Ordering::Relaxed);
    }

    /// Read acquire on the slot path, R1-R3: claim the free `slot`, light fence, check
    /// the writer flag. On `false` the slot is free again (and the writer told) and the
    /// caller must wait.
    #[inline]
    fn try_enter(&self, slot: &AtomicUsize, light: bool) -> bool {
        // R1. Release: every store to a slot is (see `slots`' module doc).
        slot.store(self.tag, Ordering::Release);
        // R2: pairs with the writer's heavy fence (W2): either the writer's scan sees
        // our slot, or our load below sees its flag. (Of the kind the thread's
        // registration chose: no mode load, no call.)
        slot_fence(light);
        // R3. Acquire: pairs with the Release swap in `write_unlock` (W5), as in
        // `try_arrive`.
        if self.state.load(Ordering::Acquire) & WRITER == 0 {
            return true;
        }
        self.back_out_of(slot, light);
        false
    }

    /// A slot reader that saw the flag frees its slot again, having touched no data.
    #[cold]
    #[inline(never)]
    fn back_out_of(&self, slot: &AtomicUsize, light: bool) {
        self.leave(slot, light);
    }

    /// Read release on the slot path, R4-R6: free the slot (a Release store), light
    /// fence, and tell a writer that waits for readers.
    #[inline]
    fn leave(&self, slot: &AtomicUsize, light: bool) {
        // R4-R5. Release: pairs with the Acquire loads of the writer's scan (W3): our
        // critical section happens before whatever the writer does after it has seen
        // the slot free (or holding anything else).
        slot.store(0, Ordering::Release);
        // R5: pairs with the writer's heavy fence (W2), as R2 does.
        slot_fence(light);
        // R6. Relaxed: only decides whether to notify (see `notify_writer`).
        if self.state.load(Ordering::Relaxed) & WRITER != 0 {
            self.notify_writer();
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
        let me = slots::thread_token();
        // Relaxed: only this thread stores its own token (see `owner`).
        if self.owner.load(Ordering::Relaxed) == me {
            panic!("RmLock::write: this thread holds the write lock already");
        }
        if slots::mine().is_some_and(|record| matches!(record.lookup(self.tag), Lookup::Held(_))) {
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
        let me = slots::thread_token();
        // Relaxed: see `owner`.
        self.owner.store(me, Ordering::Relaxed);
        // W2.
        fence::heavy();
        // W3, once.
        if self.all_left() {
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

    /// W3's check: no reader slot holds this lock and every counted reader has
    /// departed.
    ///
    /// REQUIRES: called by the writer after W2 (see `slots::any_holds` and
    /// `Readers::all_departed`).
    fn all_left(&self) -> bool {
        !slots::any_holds(self.tag) && self.readers.all_departed()
    }

    /// W3: waits until every reader the writer can see has departed: spins, then sleeps
    /// on `drain` (woken by `notify_writer`).
    fn wait_for_readers(&self) {
        if self.all_left() {
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
            if self.all_left() {
                return;
            }
        }
        loop {
            // SeqCst: pairs with the SeqCst fetch_add in `notify_writer` (see there).
            let seen = self.drain.fetch_or(WRITER_SLEEPING, Ordering::SeqCst) | WRITER_SLEEPING;
            if self.all_left() {
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

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;
    use crate::cpu::fence::Mode;

    /// A slot hold's fences follow the mode its thread registered in: compiler fences
    /// (the inline release, a clear ticket bit) where the mode was asymmetric, SeqCst
    /// fences (the bit set, every read and release out of line) where it was symmetric.
    /// The mode is process-wide, so the symmetric case runs in a child process (this
    /// test again, with `SCALEMEM_FENCE=symmetric`).
    #[test]
    fn slot_tickets_follow_the_registration_mode() {
        let child = std::env::var_os("RMLOCK_RAW_CHILD").is_some();
        if !child {
            let exe = std::env::current_exe().expect("the test binary");
            let output = std::process::Command::new(exe)
                .args(["--exact", "rmlock::raw::tests::slot_tickets_follow_the_registration_mode"])
                .args(["--test-threads", "1"])
                .env("SCALEMEM_FENCE", "symmetric")
                .env("RMLOCK_RAW_CHILD", "1")
                .output()
                .expect("spawn the child test process");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success() && stdout.contains("1 passed"), "child failed:\n{stdout}");
        }
        let symmetric = fence::mode() == Mode::Symmetric;
        assert!(symmetric || !child, "SCALEMEM_FENCE=symmetric left the mode asymmetric");
        std::thread::spawn(move || {
            let lock = RawRmLock::try_new().expect("a page for the counts");
            let outer = lock.read_lock();
            let inner = lock.read_lock();
            assert!(!outer.is_counted(), "a fresh thread's read is not in a slot");
            assert_eq!(outer.0, inner.0);
            // SAFETY: a slot of this thread's record.
            let depth = unsafe { Record::depth_of(&*outer.0) };
            assert_eq!(slots::own(depth) & slots::OUT_OF_LINE != 0, symmetric, "the depth's release mode");
            assert_eq!(slots::own(depth) & !slots::OUT_OF_LINE, 1, "the nested guard's depth");
            assert_eq!(slots::light_slots(), !symmetric);
            assert!(!lock.try_write_lock(), "a writer got in beside two read holds");
            lock.read_unlock(outer);
            assert!(!lock.try_write_lock(), "a writer got in beside the nested hold");
            lock.read_unlock(inner);
            assert_eq!(slots::own(depth), if symmetric { slots::OUT_OF_LINE } else { 0 }, "the depth after release");
            assert!(lock.try_write_lock(), "the slot was not freed");
            lock.write_unlock();
        })
        .join()
        .expect("the reader thread");
    }
}
