//! [`ObjectCache`]: libumem's object cache (`umem_cache_create`), the layer that joins the
//! per-CPU magazines ([`CpuCaches`]) to the slab layer ([`SlabCache`]); and its typed
//! face, [`TypedCache<T>`] handing out [`CacheBox<T>`]es.
//!
//! ```
//! use scalemem::umem::cache::TypedCache;
//!
//! // The constructor runs when an object enters the cache from a slab, not on every
//! // allocation: a freed buffer keeps its capacity for the next user.
//! let cache = TypedCache::new("buffers", || Vec::<u8>::with_capacity(4096))?;
//! let mut buf = cache.alloc()?;
//! buf.clear();
//! buf.extend_from_slice(b"hello");
//! assert!(buf.capacity() >= 4096);
//! drop(buf); // back to this CPU's magazine, still constructed
//! # Ok::<(), scalemem::umem::cache::CacheError>(())
//! ```
//!
//! # Protocol
//!
//! Objects outside the slab layer are always **constructed**: the constructor runs as a
//! chunk leaves a slab, the destructor as it goes back.
//!
//! - **alloc**: if the cache is destroyed, fail. Pop a round from [`CpuCaches::alloc`]:
//!   a hit is a constructed object. A miss takes a reference on the cache's [`PercpuRef`]
//!   ([`tryget_live`](PercpuRef::tryget_live); failing: destroyed), a chunk from
//!   [`SlabCache::alloc`], and runs the constructor; if either fails, the chunk goes back
//!   and the reference is dropped ([`CacheError`]).
//! - **free**: unless destroyed, push the object with [`CpuCaches::free`]; if refused
//!   (`Err`), or destroyed, the object leaves: destructor, [`SlabCache::free`], put.
//! - **reap / update / decay / destroy** drain rounds out of the magazines; each drained
//!   round leaves the same way (destructor, slab free, put).
//!
//! So the `PercpuRef` counts the *constructed objects outside the slab layer* (in hands
//! or in magazines), plus its initial reference. Its gets and puts happen only on the
//! slab paths, which take the slab lock anyway; the magazine fast path touches no
//! counter. (Each object in hand holding a per-CPU reference would cost two rseq
//! additions per alloc/free pair for the same result.)
//!
//! # Destroy and teardown
//!
//! [`destroy`](ObjectCache::destroy): set the `dead` flag, [`fence::heavy`], drain every
//! magazine, kill the `PercpuRef` (dropping its initial reference). From then on
//! every alloc fails ([`CacheError::Destroyed`]) and every free goes straight to the slab
//! layer. The reference reaches zero when the last constructed object has gone back to
//! the slab layer, which is exactly "the last outstanding object is freed" (or the kill,
//! if none is outstanding); its release callback, the **teardown**, gives every (now
//! empty) slab back to the regions. It runs exactly once, on the thread of that last put.
//!
//! Why no round is stranded in a magazine after the drain: an alloc or free that began
//! before `dead` was set may still be moving rounds (a full magazine in hand on its way
//! to the depot, an empty one being installed in a CPU's slot) while the drain runs.
//! Every alloc and free that goes past the loaded magazine (a **miss**) therefore ends
//! with [`fence::light`] and a load of `dead`; destroy stores `dead` and calls
//! [`fence::heavy`] before draining. Either the operation's load sees `dead` (it then
//! drains again itself, serialised with destroy's drain by the magazine layer's
//! reconfiguration mutex), or its stores, all before its light fence, are visible to
//! the drain.
//!
//! A **hit** (one pop or push in the current CPU's loaded magazine) needs neither: it
//! moves a round within a slot, never a magazine. If it commits before a drain stops
//! that slot, the drain takes what it pushed; a drain leaves the slot with nothing
//! loaded, so a hit after it fails and becomes a miss, unless a miss installed a
//! magazine there since, and that miss, having installed it after destroy's heavy
//! fence, sees `dead` in its own ending and drains again. So after the last drain no
//! hit can succeed, and every push before it was drained. The alloc hit still tests
//! `dead` first, so that an allocation starting after `destroy` returned fails even
//! while such a miss has a magazine installed. The hit path is a load of `dead` (alloc
//! only), one of the checking flag, and one rseq section or try-lock.
//!
//! # Magazine sizing
//!
//! Magazines start at [`cpu_cache::Config::initial_rounds`] (15) and move along
//! libumem's ladder at the end of each working-set interval
//! ([`update`](ObjectCache::update)), by two rules:
//!
//! - **contention** (libumem's): more failed depot CAS attempts in the interval than
//!   [`cpu_cache::Config::grow_contention`] grows them a step; none, with magazines idle
//!   in the depot, shrinks them a step ([`CpuCaches::update`]);
//! - **exchanges** (tcmalloc and jemalloc size their caches on misses the same way):
//!   if the contention rule left the size as it was and the CPUs installed more than
//!   [`Config::grow_exchanges`] magazines from the depot during the interval (default
//!   [`GROW_EXCHANGES`]: a CPU trading a magazine every 150 us), they grow a step, to at
//!   most [`EXCHANGE_GROWTH_BYTES`] of objects per magazine
//!   ([`CpuCaches::grow_if_exchanging`]). One thread whose bursts outgrow its CPU's two
//!   magazines never contends, so libumem's rule alone would leave it trading
//!   magazines with the depot for ever: a burst of 100 objects of 256 bytes on
//!   15-round magazines costs 1.3-1.6 times what it costs on 63-round ones
//!   (`examples/cache_sizing.rs`).
//!
//! Each step drains every CPU (a stop and an rseq fence), at most once per interval and
//! per rule. umem's global heap turns the exchange rule off here and applies it on its
//! own 10 ms maintenance tick, within its per-CPU budget of cached bytes.
//!
//! # Reaping and returning memory (defaults)
//!
//! - **Working set** (libumem's): every interval, [`update`](ObjectCache::update) ends
//!   the depot's interval ([`CpuCaches::update`], which may also resize magazines) and
//!   frees the magazines that stayed idle in the depot for the whole previous interval
//!   ([`CpuCaches::reap`]): the minimum number of magazines used per interval stays, the
//!   excess goes (rounds destructed into the slabs).
//! - **Idle CPUs**: each interval also drains the magazines of the CPUs that did nothing
//!   with the cache since the previous one and hold at least [`Config::idle_drain`]
//!   bytes of objects (64 KiB by default; [`CpuCaches::drain_idle`]: their full
//!   magazines go to the depot, for the working-set reap), so a CPU the program stopped
//!   running on gives its cached objects back while the others keep using the cache.
//!   Each such drain costs a stop and an rseq fence (a `membarrier`); the threshold
//!   keeps them to the CPUs holding enough to repay one.
//! - **Decay**: a cache whose slab layer saw no traffic (no miss) for
//!   [`Config::decay_intervals`] intervals (default 10) is drained entirely and its empty
//!   slabs are given back ([`SlabCache::shrink`]).
//! - **Explicit**: [`reap`](ObjectCache::reap) drains every magazine and gives back every
//!   empty slab now.
//! - Slabs go back to their [`Regions`], whose Refcache releases a region after its count
//!   of slabs has stayed zero for two epochs (the default regions tick in the background
//!   every 10 ms) and gives its pages back to the kernel.
//! - **Free-time trim** (opt-in, [`Config::trim_threshold`]; on in umem's global heap):
//!   a free that went past the loaded magazine (so it may have pushed a full magazine
//!   into the depot) compares the depot's full magazines, in bytes of objects, with the
//!   threshold. Past it, that thread (one at a time: a try-lock; the others leave a
//!   request that the trimming thread serves with another round before it lets go, so
//!   none is lost) empties full magazines into the slab layer at once until half the threshold is
//!   left (a batch per trim, not a magazine per push; destructors run;
//!   the magazines stay in the depot, empty: [`CpuCaches::trim_depot`]), and then
//!   [`Regions::purge`] gives the pages of the slabs that went back to the kernel (of
//!   each region with at least 64 pages, 256 KiB, freed since its last purge: fewer
//!   are left to a later trim, the decay or the region's release). The
//!   fast paths are not stopped and no fence is issued. This is glibc's trim at free
//!   time (`M_TRIM_THRESHOLD`) for a heap that has just freed much more than it keeps
//!   using: its resident set drops when the frees happen, not a working-set interval
//!   later. The other ways rounds leave a trimming cache purge the same way after
//!   their drain: the working-set reap and the decay always, a magazine resize (which
//!   drains the depot) only if it drained more than half the threshold (a busy
//!   cache's objects are wanted again at once; what the trim would keep keeps its
//!   pages). **Adaptive**: if a trim finds that since the previous one (in the same or
//!   the previous interval) the slab layer had to make slabs again, the previous trim
//!   was premature: the threshold becomes twice the old threshold plus what that trim
//!   gave back, so a program that frees and re-allocates a large working set pays the
//!   page faults for a few cycles, not for ever. For every interval past
//!   `decay_intervals` without a trim the threshold halves back towards the configured
//!   one.
//! - **The background reaper**: a thread, started lazily by the first cache made with
//!   [`Config::reaper`] on (the default), calls `update` on every such cache every
//!   [`REAP_INTERVAL`] (1 s). Memory freed by the program therefore goes back to the OS
//!   within about `(decay_intervals + 2) * REAP_INTERVAL` plus two Refcache epochs (about
//!   12 s by default) even if the program never calls the cache again. Tests turn the
//!   reaper off and drive `update`, `reap` and [`Regions::tick`] by hand.
//!
//! # Checking mode
//!
//! [`Config::checking`] bypasses the magazines (every alloc constructs, every free
//! destructs) and puts the slab layer in its checking mode: before the destructor runs,
//! the pointer is looked up in the regions, so a foreign pointer, an interior pointer, a
//! pointer of another cache and a double free are refused with a [`FreeError`] and
//! nothing is changed; the slab layer adds redzones and poisoning. Off by default:
//! without it, [`free`](ObjectCache::free) trusts its contract.
//!
//! # Faults
//!
//! When the kernel refuses memory (a new slab, a magazine), alloc returns
//! [`CacheError::OutOfMemory`] having changed nothing (the reference taken for it is
//! dropped); a free whose magazine cannot be made sends the object to the slab layer.
//! A panicking constructor or destructor leaks its chunk and its reference (the cache
//! then never tears down; it stays usable). The background reaper runs destructors
//! while it holds the registry lock: a destructor must not create or drop an
//! [`ObjectCache`] (it would deadlock).
//!
//! # fork
//!
//! Registered caches (every cache but the ones umem's global heap makes for itself) are
//! fork-safe, as libumem's are: umem's
//! `pthread_atfork` handlers take the registry lock, each registered cache's
//! reconfiguration and slab locks, and their region managers' locks (the Refcache's too)
//! before the process is copied, and release them in the parent and in the child, so a
//! child never inherits a lock held by a thread it does not have. In the child the
//! caches work as in the parent; the background reaper and Refcache ticker threads are
//! not copied (memory still goes back through explicit reaps and callers' slow paths).
//! The global heap's own caches are kept out of the registry and handled by the same
//! handlers, with the heap. The child recounts every depot (a vanished thread can leave
//! a list's count one too high); an object or magazine that a vanished thread had in
//! hand at the fork is lost to the child, like the rest of that thread's memory
//! ([`assert_valid_after_fork`](ObjectCache::assert_valid_after_fork) checks the bound).
//!
//! # Invariants
//!
//! - Count of the `PercpuRef` = 1 (until destroy) + constructed objects outside the slab
//!   layer; the slab layer's allocated count equals the latter whenever no slab path is
//!   mid-flight.
//! - Constructor calls - destructor calls = constructed objects outside the slab layer.
//! - After destroy, no round is cached once every operation that began before it has
//!   returned; teardown runs once, after which the slab layer holds no slab.
//! - Nothing on the alloc/free paths allocates through the global allocator (the
//!   constructor and destructor are the caller's); creation and destruction may.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr::NonNull;
use std::sync::Arc;

use super::cpu_cache::{self, CpuCaches};
use super::region::{PAGE, RegionStats, Regions};
use super::slab::{FreeError, MAX_SIZE, SlabCache};
use crate::cpu::fence;
use crate::refcount::PercpuRef;
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::util::AllocError;

mod registry;
mod typed;

pub use typed::{CacheBox, TypedCache};

/// How often the background reaper visits every cache (one working-set interval).
pub const REAP_INTERVAL: core::time::Duration = core::time::Duration::from_secs(1);

/// The default of [`Config::grow_exchanges`]: magazines installed from the depot in one
/// working-set interval past which the magazines grow a step. 6,400 in the reaper's
/// 1 s interval is a CPU trading a magazine every 150 us, the rate at which umem's
/// global heap grows its size classes (64 per 10 ms tick).
pub const GROW_EXCHANGES: usize = 6_400;

/// The most a magazine may hold, in bytes of objects, when the exchange rule
/// ([`Config::grow_exchanges`]) grows it: 1 MiB, so a CPU caches at most 2 MiB of a
/// cache's objects in its two magazines on that rule's account (objects of 4 KiB may
/// reach the ladder's 143 rounds, 16 KiB ones 63; from 64 KiB up only contention grows
/// the magazines).
pub const EXCHANGE_GROWTH_BYTES: usize = 1 << 20;

/// The default of [`Config::idle_drain`]: an idle CPU's magazines are drained when they
/// hold at least 64 KiB of objects (31 rounds of 2 KiB, 256 of 256 bytes).
pub const IDLE_DRAIN_BYTES: usize = 64 << 10;

/// A constructor: makes the raw chunk at the pointer (`size` bytes, aligned) a valid
/// object, or fails (the chunk goes back to the slab layer).
pub type Ctor = Box<dyn Fn(NonNull<u8>) -> Result<(), AllocError> + Send + Sync>;
/// A destructor: ends the object at the pointer, leaving raw memory.
pub type Dtor = Box<dyn Fn(NonNull<u8>) + Send + Sync>;

/// Why an allocation failed. Every layer is unchanged.
///
/// ```
/// use scalemem::umem::cache::{CacheError, Config, ObjectCache};
/// use scalemem::util::AllocError;
///
/// assert_eq!(ObjectCache::new("empty", 0, 8, None, None).unwrap_err(), CacheError::InvalidLayout);
/// assert_eq!(CacheError::InvalidLayout.to_string(), "invalid object size or alignment");
/// let config = Config { reaper: false, ..Config::default() };
/// let cache = ObjectCache::builder("picky", 16, 8).ctor(Box::new(|_| Err(AllocError))).config(config).build()?;
/// assert_eq!(cache.alloc(), Err(CacheError::Constructor));
/// cache.destroy();
/// assert_eq!(cache.alloc(), Err(CacheError::Destroyed));
/// assert_eq!(CacheError::Destroyed.to_string(), "the cache was destroyed");
/// # Ok::<(), CacheError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheError {
    /// The kernel refused memory (a slab, or the cache's own state at creation).
    OutOfMemory,
    /// At creation: a size of zero or above [`MAX_SIZE`], or an alignment that is not a
    /// power of two or is above [`PAGE`].
    InvalidLayout,
    /// The constructor failed.
    Constructor,
    /// The cache was destroyed.
    Destroyed,
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OutOfMemory => "out of memory",
            Self::InvalidLayout => "invalid object size or alignment",
            Self::Constructor => "the constructor failed",
            Self::Destroyed => "the cache was destroyed",
        })
    }
}

impl std::error::Error for CacheError {}

impl From<AllocError> for CacheError {
    fn from(_: AllocError) -> Self {
        Self::OutOfMemory
    }
}

/// Tuning of an [`ObjectCache`].
///
/// ```
/// let config = scalemem::umem::cache::Config { reaper: false, ..Default::default() };
/// assert_eq!(config.decay_intervals, 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The magazine layer's tuning (default: [`cpu_cache::Config::default`], 15 rounds).
    pub magazines: cpu_cache::Config,
    /// Magazines in locked mode even where rseq is available (default: off).
    pub locked: bool,
    /// Checking mode (module documentation; default: off).
    pub checking: bool,
    /// Empty slabs the slab layer keeps between reaps (default: 2).
    pub max_empty_slabs: usize,
    /// Intervals without slab traffic after which the cache is drained (default: 10).
    pub decay_intervals: usize,
    /// Whether the background reaper maintains this cache (default: on).
    pub reaper: bool,
    /// The free-time trim (module documentation, "Free-time trim"): when a free finds
    /// more than this many bytes of objects in the depot's full magazines, the excess
    /// leaves the cache at once (destructors, slabs) and the regions give the freed
    /// pages to the kernel, as glibc's `M_TRIM_THRESHOLD` does for its heap top. The
    /// threshold adapts upwards when a trim turns out premature. `None` (the default
    /// for object caches, whose point is to keep constructed objects): only the
    /// working-set reaper and the decay give memory back. umem's global heap uses
    /// [`global::TRIM_THRESHOLD`](crate::umem::global::TRIM_THRESHOLD).
    pub trim_threshold: Option<usize>,
    /// The exchange rule of magazine sizing (module documentation, "Magazine sizing"):
    /// more than this many magazines installed from the depot in one working-set
    /// interval ([`update`](ObjectCache::update)) grows the magazines a step, contended
    /// or not, up to [`EXCHANGE_GROWTH_BYTES`] of objects per magazine (and
    /// [`cpu_cache::Config::max_rounds`]). `None`: contention alone grows them, as in
    /// libumem. Default: `Some(`[`GROW_EXCHANGES`]`)`.
    pub grow_exchanges: Option<usize>,
    /// The idle-CPU drain (module documentation, "Reaping and returning memory"): a CPU
    /// that did nothing with the cache for a whole working-set interval gives its
    /// magazines back if they hold at least this many bytes of objects (so that a stop
    /// and an rseq fence, a `membarrier`, are spent only where they return something
    /// worth it). `None`: never. Default: `Some(`[`IDLE_DRAIN_BYTES`]`)`.
    pub idle_drain: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            magazines: cpu_cache::Config::default(),
            locked: false,
            checking: false,
            max_empty_slabs: 2,
            decay_intervals: 10,
            reaper: true,
            trim_threshold: None,
            grow_exchanges: Some(GROW_EXCHANGES),
            idle_drain: Some(IDLE_DRAIN_BYTES),
        }
    }
}

/// A snapshot of one cache: relaxed loads of the per-CPU state words and counters, plus
/// the slab lock and the regions lock each taken once, briefly (no reconfiguration, no
/// stop of the fast paths). Exact when quiescent, a hint otherwise; `in_use` counts each
/// full depot magazine at the current magazine size.
///
/// ```
/// use scalemem::umem::cache::{Config, ObjectCache};
///
/// let config = Config { reaper: false, ..Config::default() };
/// let cache = ObjectCache::builder("stats", 64, 8).config(config).build()?;
/// let p = cache.alloc()?;
/// let s = cache.stats();
/// assert_eq!((s.size, s.in_use, s.constructed), (64, 1, 1));
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// let s = cache.stats(); // the object is cached (constructed) or back in its slab
/// assert_eq!(s.in_use, 0);
/// assert_eq!(s.ctor_calls - s.dtor_calls, s.constructed);
/// assert_eq!(s.constructed, s.in_use + s.cpu_rounds + s.depot_full * s.magazine_size);
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// The cache's name.
    pub name: &'static str,
    /// Object size.
    pub size: usize,
    /// Objects handed out and not freed (constructed, outside the magazines).
    pub in_use: usize,
    /// Constructed objects outside the slab layer (in use or cached).
    pub constructed: usize,
    /// Rounds in the CPUs' loaded and previous magazines.
    pub cpu_rounds: usize,
    /// Full magazines in the depot.
    pub depot_full: usize,
    /// Empty magazines in the depot.
    pub depot_empty: usize,
    /// Rounds per magazine now.
    pub magazine_size: usize,
    /// Failed depot CAS attempts since creation.
    pub depot_contention: usize,
    /// Magazines the CPUs installed from the depot since creation (a full one taken for
    /// an empty one, or an empty one for a full one): jemalloc's fills and flushes.
    pub depot_exchanges: usize,
    /// Magazine resizes since creation (each a reconfiguration of every CPU).
    pub resizes: usize,
    /// CPUs whose magazines were given back because they sat idle, since creation
    /// ([`CpuCaches::drain_idle`]).
    pub idle_drains: usize,
    /// Constructor calls so far.
    pub ctor_calls: usize,
    /// Destructor calls so far.
    pub dtor_calls: usize,
    /// Slabs the cache holds now.
    pub slabs: usize,
    /// Bytes of those slabs.
    pub slab_bytes: usize,
    /// Bytes mapped for the slabs' external headers (objects above an eighth of a page,
    /// whose slabs keep their header apart: one per slab); pages whose headers are all
    /// spare go back when the cache shrinks (a reap, or the decay of an idle cache).
    pub header_bytes: usize,
    /// Free-time trims so far (each gave something back).
    pub trims: usize,
    /// The free-time trim threshold now in force, in bytes (0: no free-time trim).
    pub trim_threshold: usize,
    /// Whether [`ObjectCache::destroy`] ran.
    pub destroyed: bool,
    /// Whether the teardown ran (destroyed and every object back).
    pub torn_down: bool,
    /// Times the teardown ran (0 or 1).
    pub teardowns: usize,
    /// The counters of the cache's region manager (bytes from and back to the OS).
    pub regions: RegionStats,
}

/// Sums over every live cache, plus the default region manager (see [`global_stats`]).
///
/// ```
/// use scalemem::umem::cache::{Config, ObjectCache, global_stats};
///
/// let config = Config { reaper: false, ..Config::default() };
/// let cache = ObjectCache::builder("counted", 32, 8).config(config).build()?;
/// let p = cache.alloc()?;
/// let (g, mine) = (global_stats(), cache.stats().slab_bytes);
/// assert!(g.caches >= 1 && g.in_use >= 1);
/// assert!(g.slab_bytes >= mine && mine > 0);
/// assert!(g.regions.mapped_bytes >= mine); // its slabs are in the default regions
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GlobalStats {
    /// Live caches.
    pub caches: usize,
    /// Objects in use, over all caches.
    pub in_use: usize,
    /// Rounds in CPU magazines, over all caches.
    pub cpu_rounds: usize,
    /// Full depot magazines, over all caches.
    pub depot_full: usize,
    /// Empty depot magazines, over all caches.
    pub depot_empty: usize,
    /// Failed depot CAS attempts, over all caches.
    pub depot_contention: usize,
    /// Bytes of slabs, over all caches.
    pub slab_bytes: usize,
    /// The default region manager's counters (mapped bytes, bytes given back).
    pub regions: RegionStats,
}

/// What the release callback (the teardown) needs.
struct Shared {
    slab: SlabCache<'static>,
    torn_down: AtomicUsize,
}

/// The cache's state, at a stable address (the reaper's registry points at it).
struct Inner {
    name: &'static str,
    size: usize,
    checking: bool,
    decay_intervals: usize,
    /// [`Config::grow_exchanges`].
    grow_exchanges: Option<usize>,
    /// [`Config::idle_drain`], in rounds (at least 1).
    idle_drain: Option<usize>,
    cpu: CpuCaches,
    shared: Arc<Shared>,
    regions: &'static Regions,
    /// Counts constructed objects outside the slab layer (module documentation).
    live: ManuallyDrop<PercpuRef<Box<dyn Fn() + Send + Sync>>>,
    dead: AtomicBool,
    ctor: Option<Ctor>,
    dtor: Option<Dtor>,
    ctor_calls: AtomicUsize,
    dtor_calls: AtomicUsize,
    /// Slab-path operations so far (the decay's activity measure).
    misses: AtomicUsize,
    /// Misses seen by the last `update`, and intervals since they last changed.
    decay: AtomicUsize,
    /// `update` calls so far: the working-set intervals (the free-time trim's clock).
    updates: AtomicUsize,
    /// The free-time trim, if configured.
    trim: Option<Trim>,
}

/// `Trim::at` before the first trim.
const NEVER: usize = usize::MAX;
/// A region is purged after a trim only if at least this many of its pages (256 KiB)
/// were freed since its last purge: fewer are not worth a `madvise`.
const PURGE_DIRTY_PAGES: usize = 64;
/// The adaptive threshold's ceiling (1 TiB: in effect, no trim).
const TRIM_MAX: usize = 1 << 40;

/// `Trim::state`: a thread is trimming.
const TRIM_BUSY: usize = 1;
/// `Trim::state`: a free asked for a trim since the trimming thread's round began.
const TRIM_AGAIN: usize = 2;

/// The free-time trim's state (module documentation, "Free-time trim"). Every field but
/// `state` is a hint read and written with Relaxed atomics, serialised by `state`.
///
/// `state` is a try-lock that loses no request: a free past the threshold sets
/// `TRIM_BUSY | TRIM_AGAIN` with one read-modify-write. If `TRIM_BUSY` was clear, that
/// free trims: each round first clears `TRIM_AGAIN`, then trims, and the trimmer leaves
/// only with a compare-exchange from exactly `TRIM_BUSY` to 0, so a request that landed
/// during a round (after its clear) makes it run another. A plain try-lock lost them:
/// while one thread trimmed (and purged, which takes a while), the others' frees found
/// it taken and went on, and if they had all finished by the time it let go, the depot
/// stayed far past the threshold until the next interval.
struct Trim {
    /// The configured threshold: where the adaptive one starts and decays back to.
    floor: usize,
    /// Bytes of full depot magazines past which a free trims.
    threshold: AtomicUsize,
    /// `TRIM_BUSY` and `TRIM_AGAIN` (above).
    state: AtomicUsize,
    /// `Inner::updates` at the last trim (`NEVER`: none yet).
    at: AtomicUsize,
    /// The slab layer's `slabs_created` right after the last trim.
    created: AtomicUsize,
    /// Bytes of objects the last trim gave back.
    bytes: AtomicUsize,
    /// Trims so far.
    trims: AtomicUsize,
}

/// The busy bit of a trim in progress ([`Inner::trim_now`]), cleared if the trim unwinds
/// (a destructor panicked in a round): without it every later free past the threshold
/// would take the bit for another thread's trim and return, and the cache would never
/// trim again. Requests pending then are dropped with it; the next free past the
/// threshold makes a new one. The normal exit clears the bit itself and forgets this.
struct TrimHeld<'a>(&'a Trim);

impl Drop for TrimHeld<'_> {
    fn drop(&mut self) {
        // Release: as the normal exit's, pairs with the next trimmer's Acquire.
        self.0.state.store(0, Ordering::Release);
    }
}

impl Trim {
    fn new(floor: usize) -> Self {
        let floor = floor.min(TRIM_MAX);
        Self {
            floor,
            threshold: AtomicUsize::new(floor),
            state: AtomicUsize::new(0),
            at: AtomicUsize::new(NEVER),
            created: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            trims: AtomicUsize::new(0),
        }
    }
}

/// An object cache: objects of one size and alignment, constructed once as they enter
/// from the slab layer and cached constructed in per-CPU magazines (see the module
/// documentation for the protocol, reaping and teardown). `Send + Sync`.
///
/// ```
/// use std::ptr::NonNull;
/// use scalemem::umem::cache::ObjectCache;
///
/// let cache = ObjectCache::new(
///     "u64x4",
///     32,
///     8,
///     Some(Box::new(|p: NonNull<u8>| {
///         // SAFETY: the constructor gets 32 writable bytes aligned to 8.
///         unsafe { p.cast::<[u64; 4]>().write([7; 4]) };
///         Ok(())
///     })),
///     None,
/// )?;
/// let p = cache.alloc()?;
/// // SAFETY: a constructed [u64; 4].
/// assert_eq!(unsafe { p.cast::<[u64; 4]>().read() }, [7; 4]);
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
pub struct ObjectCache {
    inner: NonNull<Inner>,
}

// SAFETY: `Inner` is made of Send + Sync parts (atomics, the Send + Sync magazine and
// slab layers, `Send + Sync` callbacks, a `&'static Regions`), owned through a box:
// - Send: nothing in it is tied to the creating thread;
// - Sync: every method takes `&self` and synchronises through those parts.
unsafe impl Send for ObjectCache {}
// SAFETY: see `Send` above.
unsafe impl Sync for ObjectCache {}

/// Builds an [`ObjectCache`].
///
/// ```
/// use scalemem::umem::cache::{Config, ObjectCache};
/// let cache = ObjectCache::builder("raw", 100, 16).config(Config { reaper: false, ..Config::default() }).build()?;
/// assert_eq!(cache.stats().size, 100);
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
pub struct CacheBuilder {
    name: &'static str,
    size: usize,
    align: usize,
    ctor: Option<Ctor>,
    dtor: Option<Dtor>,
    config: Config,
    regions: Option<&'static Regions>,
    /// Whether the cache joins the registry (`global_stats`, the background reaper).
    registered: bool,
    /// The tag of the cache's slab pages (`SlabCacheBuilder::page_tag`).
    page_tag: u8,
    /// [`SlabCacheBuilder::colour_room`](crate::umem::slab::SlabCacheBuilder::colour_room).
    colour_room: usize,
}

impl fmt::Debug for CacheBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("align", &self.align)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The options; each setter takes and returns the builder, so they chain.
///
/// ```
/// use std::ptr::NonNull;
/// use scalemem::umem::cache::{Config, ObjectCache};
///
/// let cache = ObjectCache::builder("pairs", 16, 8)
///     .ctor(Box::new(|p: NonNull<u8>| {
///         // SAFETY: the constructor gets 16 writable bytes aligned to 8.
///         unsafe { p.cast::<[u64; 2]>().write([1, 2]) };
///         Ok(())
///     }))
///     .dtor(Box::new(|_| {})) // nothing to end: plain integers
///     .config(Config { reaper: false, ..Config::default() })
///     .build()?;
/// let p = cache.alloc()?;
/// // SAFETY: a constructed [u64; 2].
/// assert_eq!(unsafe { p.cast::<[u64; 2]>().read() }, [1, 2]);
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// cache.reap();
/// let s = cache.stats();
/// assert_eq!((s.ctor_calls, s.dtor_calls), (1, 1));
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
impl CacheBuilder {
    /// The constructor (default: none, objects are raw memory).
    ///
    /// ```
    /// use std::ptr::NonNull;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use scalemem::umem::cache::{Config, ObjectCache};
    ///
    /// let made = Arc::new(AtomicUsize::new(0));
    /// let counter = Arc::clone(&made);
    /// let ctor = move |p: NonNull<u8>| {
    ///     counter.fetch_add(1, Ordering::Relaxed);
    ///     // SAFETY: the constructor gets 8 writable bytes aligned to 8.
    ///     unsafe { p.cast::<u64>().write(42) };
    ///     Ok(())
    /// };
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("answers", 8, 8).ctor(Box::new(ctor)).config(config).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: a constructed u64.
    /// assert_eq!(unsafe { p.cast::<u64>().read() }, 42);
    /// assert_eq!(made.load(Ordering::Relaxed), 1);
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn ctor(mut self, ctor: Ctor) -> Self {
        self.ctor = Some(ctor);
        self
    }

    /// The destructor (default: none).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use scalemem::umem::cache::{Config, ObjectCache};
    ///
    /// let ended = Arc::new(AtomicUsize::new(0));
    /// let counter = Arc::clone(&ended);
    /// let dtor = move |_| {
    ///     counter.fetch_add(1, Ordering::Relaxed);
    /// };
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("ended", 8, 8).dtor(Box::new(dtor)).config(config).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// cache.reap(); // a cached object leaves the cache: its destructor runs
    /// assert_eq!(ended.load(Ordering::Relaxed), 1);
    /// assert_eq!(cache.stats().dtor_calls, 1);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn dtor(mut self, dtor: Dtor) -> Self {
        self.dtor = Some(dtor);
        self
    }

    /// The configuration (default: [`Config::default`]).
    ///
    /// ```
    /// use scalemem::umem::cache::{Config, ObjectCache};
    ///
    /// let config = Config { checking: true, reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("checked", 32, 8).config(config).build()?;
    /// let p = cache.alloc()?;
    /// // SAFETY: from this cache, freed once; no constructor: raw memory.
    /// unsafe { cache.free(p) }.unwrap();
    /// // SAFETY: in checking mode a double free is refused, not undefined.
    /// assert!(unsafe { cache.free(p) }.is_err());
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The region manager (default: the process-wide one, made on first use and never
    /// dropped).
    ///
    /// ```
    /// use std::sync::OnceLock;
    /// use scalemem::umem::cache::{Config, ObjectCache};
    /// use scalemem::umem::region::Regions;
    ///
    /// // A manager of our own, ticked by hand.
    /// static REGIONS: OnceLock<Regions> = OnceLock::new();
    /// let regions = REGIONS.get_or_init(|| {
    ///     Regions::builder().refcache(scalemem::refcount::Config::manual()).build().unwrap()
    /// });
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("mine", 64, 8).regions(regions).config(config).build()?;
    /// let p = cache.alloc()?;
    /// assert_eq!(regions.stats().runs, 1); // the cache's slab came from `regions`
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// cache.reap();
    /// assert_eq!(regions.stats().runs, 0);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn regions(mut self, regions: &'static Regions) -> Self {
        self.regions = Some(regions);
        self
    }

    /// Keeps the cache out of the registry of live caches (so out of
    /// [`global_stats`] and the background reaper, and away from the registry's lock):
    /// the global allocator's size classes, which it maintains and counts itself, and
    /// which its `fork` handlers must be able to use in a child whatever lock another
    /// thread held.
    pub(crate) fn unregistered(mut self) -> Self {
        self.registered = false;
        self
    }

    /// Tags the cache's slab pages (`SlabCacheBuilder::page_tag`).
    pub(crate) fn page_tag(mut self, tag: u8) -> Self {
        self.page_tag = tag;
        self
    }

    /// Room for colouring in each slab of a cache of large objects
    /// ([`SlabCacheBuilder::colour_room`](crate::umem::slab::SlabCacheBuilder::colour_room)):
    /// for objects of a page multiple, whose slabs would otherwise all start them at one
    /// offset in the page. Default 0.
    ///
    /// ```
    /// use scalemem::umem::cache::{Config, ObjectCache};
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("bufs", 64 << 10, 64).config(config).colour_room(4096 - 64).build()?;
    /// let (a, b) = (cache.alloc()?, cache.alloc()?);
    /// assert_ne!(a.as_ptr() as usize % 4096, b.as_ptr() as usize % 4096); // two slabs, two colours
    /// # // SAFETY: from this cache, freed once.
    /// # unsafe { cache.free(a) }.unwrap();
    /// # // SAFETY: as above.
    /// # unsafe { cache.free(b) }.unwrap();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn colour_room(mut self, bytes: usize) -> Self {
        self.colour_room = bytes;
        self
    }

    /// Makes the cache. Fails for a size of zero or above [`MAX_SIZE`], an alignment
    /// that is not a power of two or is above [`PAGE`], or if the kernel refuses memory.
    ///
    /// ```
    /// use scalemem::umem::cache::{CacheError, Config, ObjectCache};
    ///
    /// assert_eq!(ObjectCache::builder("odd", 64, 3).build().unwrap_err(), CacheError::InvalidLayout);
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("lines", 64, 64).config(config).build()?;
    /// let p = cache.alloc()?;
    /// assert_eq!(p.as_ptr() as usize % 64, 0);
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), CacheError>(())
    /// ```
    pub fn build(self) -> Result<ObjectCache, CacheError> {
        let Self { name, size, align, ctor, dtor, config, regions, registered, page_tag, colour_room } = self;
        if size == 0 || size > MAX_SIZE || !align.is_power_of_two() || align > PAGE {
            return Err(CacheError::InvalidLayout);
        }
        let regions = match regions {
            Some(regions) => regions,
            None => default_regions()?,
        };
        let slab = SlabCache::builder(regions, name, size, align)
            .checking(config.checking)
            .max_empty(config.max_empty_slabs)
            .page_tag(page_tag)
            .colour_room(colour_room)
            .build()?;
        let shared = Arc::new(Shared { slab, torn_down: AtomicUsize::new(0) });
        let for_release = Arc::clone(&shared);
        let release: Box<dyn Fn() + Send + Sync> = Box::new(move || {
            // The teardown: every constructed object is back in the slab layer, so
            // every slab is empty; give them all back.
            for_release.slab.shrink();
            // Release: pairs with the Acquire in `stats`.
            for_release.torn_down.fetch_add(1, Ordering::Release);
        });
        let live = PercpuRef::new(release)?;
        let cpu =
            if config.locked { CpuCaches::new_locked(config.magazines) } else { CpuCaches::new(config.magazines) }?;
        let inner = Box::new(Inner {
            name,
            size,
            checking: config.checking,
            decay_intervals: config.decay_intervals.max(1),
            grow_exchanges: config.grow_exchanges,
            idle_drain: config.idle_drain.map(|bytes| (bytes / size.max(1)).max(1)),
            cpu,
            shared,
            regions,
            live: ManuallyDrop::new(live),
            dead: AtomicBool::new(false),
            ctor,
            dtor,
            ctor_calls: AtomicUsize::new(0),
            dtor_calls: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            decay: AtomicUsize::new(0),
            updates: AtomicUsize::new(0),
            trim: config.trim_threshold.map(Trim::new),
        });
        let cache = ObjectCache { inner: NonNull::from(Box::leak(inner)) };
        if registered {
            registry::add(cache.inner, config.reaper);
        }
        Ok(cache)
    }
}

/// The process-wide region manager (default Refcache: a background ticker).
#[cfg(not(scalemem_loom))]
fn default_regions() -> Result<&'static Regions, AllocError> {
    if let Some(regions) = DEFAULT_REGIONS.get() {
        return Ok(regions);
    }
    let regions = Regions::new()?;
    // A racing thread may have won; its manager is the one kept (ours drops).
    Ok(DEFAULT_REGIONS.get_or_init(|| regions))
}

/// The process-wide region manager, once made.
#[cfg(not(scalemem_loom))]
static DEFAULT_REGIONS: std::sync::OnceLock<Regions> = std::sync::OnceLock::new();

/// Under loom there is no process-wide manager: use [`CacheBuilder::regions`].
#[cfg(scalemem_loom)]
fn default_regions() -> Result<&'static Regions, AllocError> {
    Err(AllocError)
}

/// Making a cache, allocating and freeing, and giving memory back.
///
/// ```
/// use scalemem::umem::cache::{Config, ObjectCache};
///
/// let config = Config { reaper: false, ..Config::default() };
/// let cache = ObjectCache::builder("tour", 128, 16).config(config).build()?;
/// let p = cache.alloc()?;
/// // SAFETY: from this cache, freed once.
/// unsafe { cache.free(p) }.unwrap();
/// cache.reap(); // magazines drained, empty slabs given back
/// let s = cache.stats();
/// assert_eq!((s.in_use, s.constructed, s.slabs), (0, 0, 0));
/// cache.assert_valid();
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
impl ObjectCache {
    /// libumem's `umem_cache_create`: a cache of `size`-byte objects aligned to `align`
    /// over the process-wide region manager, with the default [`Config`] (the
    /// background reaper on).
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("plain", 24, 8, None, None)?;
    /// let p = cache.alloc()?;
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn new(
        name: &'static str,
        size: usize,
        align: usize,
        ctor: Option<Ctor>,
        dtor: Option<Dtor>,
    ) -> Result<Self, CacheError> {
        let mut builder = Self::builder(name, size, align);
        builder.ctor = ctor;
        builder.dtor = dtor;
        builder.build()
    }

    /// [`new`](Self::new) over `regions` (for instance one with a manual Refcache, ticked
    /// by hand), with the given configuration.
    ///
    /// ```
    /// use scalemem::umem::cache::{Config, ObjectCache};
    /// use scalemem::umem::region::Regions;
    /// use std::sync::OnceLock;
    ///
    /// // The manager must outlive every cache over it: a static.
    /// static REGIONS: OnceLock<Regions> = OnceLock::new();
    /// let regions = REGIONS.get_or_init(|| {
    ///     Regions::builder().refcache(scalemem::refcount::Config::manual()).build().unwrap()
    /// });
    /// let config = Config { reaper: false, ..Config::default() };
    /// let cache = ObjectCache::new_in(regions, "mine", 64, 64, None, None, config)?;
    /// let p = cache.alloc()?;
    /// assert_eq!(p.as_ptr() as usize % 64, 0);
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_in(
        regions: &'static Regions,
        name: &'static str,
        size: usize,
        align: usize,
        ctor: Option<Ctor>,
        dtor: Option<Dtor>,
        config: Config,
    ) -> Result<Self, CacheError> {
        let mut builder = Self::builder(name, size, align).regions(regions).config(config);
        builder.ctor = ctor;
        builder.dtor = dtor;
        builder.build()
    }

    /// A builder, for the options [`new`](Self::new) does not take.
    ///
    /// ```
    /// use scalemem::umem::cache::{Config, ObjectCache};
    /// use scalemem::umem::cpu_cache;
    ///
    /// let magazines = cpu_cache::Config { initial_rounds: 4, ..cpu_cache::Config::default() };
    /// let config = Config { magazines, reaper: false, ..Config::default() };
    /// let cache = ObjectCache::builder("small-mags", 48, 8).config(config).build()?;
    /// assert_eq!((cache.stats().size, cache.stats().magazine_size), (48, 4));
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn builder(name: &'static str, size: usize, align: usize) -> CacheBuilder {
        CacheBuilder {
            name,
            size,
            align,
            ctor: None,
            dtor: None,
            config: Config::default(),
            regions: None,
            registered: true,
            page_tag: 0,
            colour_room: 0,
        }
    }

    fn inner(&self) -> &Inner {
        // SAFETY: leaked from a box in `build`, freed only in `drop`.
        unsafe { self.inner.as_ref() }
    }

    /// A constructed object: from this CPU's magazines if they hold one, else a chunk
    /// from the slab layer, constructed now. Never allocates through the global
    /// allocator (beyond what the constructor does).
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("a", 8, 8, None, None)?;
    /// cache.destroy();
    /// assert_eq!(cache.alloc(), Err(scalemem::umem::cache::CacheError::Destroyed));
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    #[inline]
    pub fn alloc(&self) -> Result<NonNull<u8>, CacheError> {
        self.inner().alloc()
    }

    /// Gives back an object: to this CPU's magazines (still constructed), or, if they
    /// have no room, the cache is destroyed, or checking mode is on, destructed into
    /// the slab layer. `Err` only when the slab layer refuses the pointer (always
    /// checked in checking mode, where nothing is changed then; otherwise only when the
    /// object reaches the slab layer, after its destructor ran).
    ///
    /// # Safety
    /// 1. Outside checking mode: `ptr` came from [`alloc`](Self::alloc) of this cache
    ///    and is freed once (in checking mode a violation is refused, not undefined).
    /// 2. The object is constructed (as the constructor or an earlier user left it,
    ///    in a state the destructor accepts), and nobody uses it any more.
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("f", 8, 8, None, None)?;
    /// let p = cache.alloc()?;
    /// // SAFETY: (1) from this cache, once. (2) No constructor: raw memory.
    /// unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    #[inline]
    pub unsafe fn free(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        // SAFETY: the caller's (1) and (2).
        unsafe { self.inner().free(ptr) }
    }

    /// Kills the cache: allocation fails from now on, every cached object is destructed
    /// into the slab layer, and objects still in use stay valid and may be freed (each
    /// goes straight to the slab layer). When the last one is freed (at once if none is
    /// out) the teardown gives every slab back to the regions. Idempotent.
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("d", 16, 8, None, None)?;
    /// let p = cache.alloc()?;
    /// cache.destroy();
    /// assert!(!cache.stats().torn_down);
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// assert!(cache.stats().torn_down);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn destroy(&self) {
        self.inner().destroy();
    }

    /// Reaps now: drains every magazine (destructing the rounds into the slab layer) and
    /// gives every empty slab back to the regions. Returns the rounds drained. The
    /// regions give the memory back to the kernel after two Refcache epochs.
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("r", 64, 8, None, None)?;
    /// let p = cache.alloc()?;
    /// // SAFETY: from this cache, freed once.
    /// unsafe { cache.free(p) }.unwrap();
    /// cache.reap();
    /// assert_eq!((cache.stats().cpu_rounds, cache.stats().slabs), (0, 0));
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn reap(&self) -> usize {
        self.inner().reap()
    }

    /// One working-set interval (what the background reaper calls every
    /// [`REAP_INTERVAL`]): magazine sizing (its contention and exchange rules), the
    /// depot's idle magazines freed, the idle CPUs' magazines drained, and the decay
    /// (module documentation). Returns the rounds sent to the slab layer.
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("u", 64, 8, None, None)?;
    /// assert_eq!(cache.update(), 0);
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn update(&self) -> usize {
        self.inner().update()
    }

    /// [`CpuCaches::grow_if_contended`], then [`CpuCaches::grow_if_exchanging`] with
    /// magazines of at most `max_bytes` of objects, for this cache's magazines (drained
    /// rounds leave the cache): at most one step per call. Nothing for a destroyed cache
    /// or one in checking mode.
    pub(crate) fn grow_if_busy(&self, failures: usize, exchanges: usize, max_bytes: usize) -> bool {
        let inner = self.inner();
        self.resize_with(|sink| {
            inner.cpu.grow_if_contended(failures, &mut *sink)
                || inner.cpu.grow_if_exchanging(exchanges, max_bytes / inner.size.max(1), sink)
        })
    }

    /// Runs `resize` on this cache's magazines with a sink for the rounds it drains
    /// (`resize` says whether it resized), then purges as a resize must
    /// (`purge_after_resize`). Nothing for a cache in checking mode or destroyed.
    fn resize_with(&self, resize: impl FnOnce(&mut dyn FnMut(NonNull<u8>)) -> bool) -> bool {
        let inner = self.inner();
        if inner.checking || inner.is_dead() {
            return false;
        }
        let mut drained = 0usize;
        let mut sink = inner.sink();
        let resized = resize(&mut |round| {
            drained += 1;
            sink(round);
        });
        if resized {
            inner.purge_after_resize(drained);
        }
        resized
    }

    /// What this cache's magazines can hold on one CPU, in bytes of objects: its loaded
    /// and previous magazines at the size in force (what a CPU may cache beyond the
    /// depot).
    pub(crate) fn magazine_bytes(&self) -> usize {
        let inner = self.inner();
        2 * inner.cpu.magazine_size() * inner.size
    }

    /// The rounds of the magazines in force.
    pub(crate) fn magazine_rounds(&self) -> usize {
        self.inner().cpu.magazine_size()
    }

    /// Caps the growth rules so that [`magazine_bytes`](Self::magazine_bytes) stays
    /// within `bytes` (see `CpuCaches::set_growth_cap`).
    pub(crate) fn cap_growth(&self, bytes: usize) {
        let inner = self.inner();
        inner.cpu.set_growth_cap(bytes / (2 * inner.size.max(1)));
    }

    /// Whether only the cap of [`cap_growth`](Self::cap_growth) holds back the next
    /// growth step, for magazines of at most `max_bytes` of objects.
    pub(crate) fn growth_capped(&self, max_bytes: usize) -> bool {
        let inner = self.inner();
        inner.cpu.growth_capped(max_bytes / inner.size.max(1))
    }

    /// Magazines installed from the depot so far (a running count).
    pub(crate) fn exchanges(&self) -> usize {
        self.inner().cpu.exchanges()
    }

    /// Shrinks the magazines one step of the ladder (`CpuCaches::shrink_step`), giving
    /// the drained objects back as a resize does. Returns whether it shrank.
    pub(crate) fn shrink_step(&self) -> bool {
        self.resize_with(|sink| self.inner().cpu.shrink_step(sink))
    }

    /// Counters (see [`CacheStats`]).
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("s", 64, 8, None, None)?;
    /// let p = cache.alloc()?;
    /// assert_eq!(cache.stats().in_use, 1);
    /// # // SAFETY: from this cache, freed once.
    /// # unsafe { cache.free(p) }.unwrap();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn stats(&self) -> CacheStats {
        self.inner().stats()
    }

    /// This cache's per-CPU layer, for the global allocator's fast paths: a `try_pop`
    /// there is the magazine-hit half of [`alloc`](Self::alloc), a `try_push` that of
    /// [`free`](Self::free) (for a live object of this cache, freed once). Both skip the
    /// destroyed-flag protocol and checking mode, so only for caches that are never
    /// destroyed and not in checking mode (the global allocator's size classes).
    #[inline]
    pub(crate) fn cpu_caches(&self) -> &CpuCaches {
        let inner = self.inner();
        debug_assert!(!inner.checking && !inner.is_dead());
        &inner.cpu
    }

    /// Takes the cache's locks (reconfiguration, then slab) without a scope, for the
    /// global allocator's `fork` handlers.
    pub(crate) fn fork_lock(&self) {
        self.inner().fork_lock();
    }

    /// Releases what [`fork_lock`](Self::fork_lock) took.
    ///
    /// # Safety
    /// As `Regions::fork_unlock`.
    pub(crate) unsafe fn fork_unlock(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.inner().fork_unlock() };
    }

    /// The `fork` child's repairs (`CpuCaches::after_fork_in_child`).
    ///
    /// # Safety
    /// Called in the child of a `fork`, before it has started any other thread.
    #[cfg(not(scalemem_loom))]
    pub(crate) unsafe fn after_fork_in_child(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.inner().cpu.after_fork_in_child() };
        if let Some(trim) = &self.inner().trim {
            // A trimmer that vanished with the fork must not keep the child from trimming.
            // Relaxed: no other thread runs yet.
            trim.state.store(0, Ordering::Relaxed);
        }
    }

    /// Panics if a layer's invariants fail (quiescent use only: tests).
    ///
    /// ```
    /// scalemem::umem::cache::ObjectCache::new("v", 8, 8, None, None)?.assert_valid();
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn assert_valid(&self) {
        self.assert_valid_after_fork(0);
    }

    /// [`assert_valid`](Self::assert_valid) in a `fork`ed child whose parent had
    /// `vanished` other threads using the cache. A thread can be between the slab layer
    /// and the cache's counters when the process is copied (its chunk taken from a slab,
    /// its constructor not yet counted; or its destructor counted, its chunk not yet back
    /// in the slab): that object stays allocated in the child's slab layer with no thread
    /// to finish the operation, like any other memory the vanished thread owned. So the
    /// slab layer may hold up to one object per vanished thread more than the counters
    /// say are constructed, never fewer; every other invariant is exact.
    ///
    /// ```
    /// let cache = scalemem::umem::cache::ObjectCache::new("w", 8, 8, None, None)?;
    /// cache.assert_valid_after_fork(4); // no fork here: the exact check passes too
    /// # Ok::<(), scalemem::umem::cache::CacheError>(())
    /// ```
    pub fn assert_valid_after_fork(&self, vanished: usize) {
        let inner = self.inner();
        inner.cpu.assert_valid();
        inner.shared.slab.assert_valid();
        let stats = inner.stats();
        assert_eq!(stats.ctor_calls - stats.dtor_calls, stats.constructed, "cache: constructed objects");
        let allocated = inner.shared.slab.stats().allocated;
        assert!(
            (stats.constructed..=stats.constructed + vanished).contains(&allocated),
            "cache: {allocated} slab objects vs {} constructed ({vanished} vanished threads)",
            stats.constructed
        );
    }
}

impl Inner {
    #[inline]
    fn is_dead(&self) -> bool {
        // Acquire: pairs with the SeqCst swap in `destroy`. For allocations: one that
        // starts after `destroy` returned fails. For frees a hint that sends them
        // straight to the slab layer; `settle` gives the guarantee that matters.
        self.dead.load(Ordering::Acquire)
    }

    /// The end of every alloc and free that missed the loaded magazine (module
    /// documentation, "Destroy and teardown"): if destroy may have missed rounds or
    /// magazines this operation moved, drain them. Hits need no settle.
    #[inline]
    fn settle(&self) {
        // Light side: pairs with the heavy fence in `destroy`; orders this operation's
        // magazine stores before the load of `dead`.
        fence::light();
        if self.dead.load(Ordering::Relaxed) {
            self.drain_all_cold();
        }
    }

    /// [`drain_all`](Self::drain_all) out of line, for `settle` (after a destroy only).
    #[cold]
    #[inline(never)]
    fn drain_all_cold(&self) {
        self.drain_all();
    }

    /// The hit path inline (the caller's frame, no `Result` in memory); everything else
    /// out of line in [`alloc_miss`](Self::alloc_miss). A hit does not settle (module
    /// documentation, "Destroy and teardown").
    #[inline(always)]
    fn alloc(&self) -> Result<NonNull<u8>, CacheError> {
        if !self.is_dead()
            && !self.checking
            && let Some(round) = self.cpu.try_pop()
        {
            return Ok(round);
        }
        self.alloc_miss()
    }

    /// Everything but a hit in the loaded magazine: destroyed, checking mode, the
    /// magazine layer's own slow path (swap, depot), then the slab layer.
    #[cold]
    #[inline(never)]
    fn alloc_miss(&self) -> Result<NonNull<u8>, CacheError> {
        if self.is_dead() {
            return Err(CacheError::Destroyed);
        }
        if !self.checking
            && let Some(round) = self.cpu.alloc()
        {
            self.settle();
            return Ok(round);
        }
        let result = self.alloc_slow();
        if !self.checking {
            self.settle();
        }
        result
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self) -> Result<NonNull<u8>, CacheError> {
        if !self.live.tryget_live() {
            return Err(CacheError::Destroyed);
        }
        // Relaxed: a statistic and the decay's activity measure.
        self.misses.fetch_add(1, Ordering::Relaxed);
        let chunk = match self.shared.slab.alloc() {
            Ok(chunk) => chunk,
            Err(AllocError) => {
                self.live.put();
                return Err(CacheError::OutOfMemory);
            }
        };
        if let Some(ctor) = &self.ctor
            && ctor(chunk).is_err()
        {
            // SAFETY: just allocated from this slab cache, freed once.
            let freed = unsafe { self.shared.slab.free(chunk) };
            debug_assert!(freed.is_ok());
            self.live.put();
            return Err(CacheError::Constructor);
        }
        // Relaxed: a statistic.
        self.ctor_calls.fetch_add(1, Ordering::Relaxed);
        Ok(chunk)
    }

    /// # Safety
    /// As [`ObjectCache::free`].
    ///
    /// The hit path tests neither `dead` nor settles: after destroy's drain the slots
    /// hold no magazine, so a push fails and the miss path sends the object to the slab
    /// layer (module documentation, "Destroy and teardown").
    #[inline(always)]
    unsafe fn free(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        if !self.checking && self.cpu.try_push(ptr) {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.free_miss(ptr) }
    }

    /// Everything but a push into the loaded magazine (see [`free`](Self::free)).
    ///
    /// # Safety
    /// As [`ObjectCache::free`].
    #[cold]
    #[inline(never)]
    unsafe fn free_miss(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        if self.checking {
            // SAFETY: the caller's (2); checking mode validates (1) before any change.
            return unsafe { self.free_checked(ptr) };
        }
        if self.is_dead() {
            // SAFETY: the caller's (1) and (2).
            return unsafe { self.to_slab(ptr) };
        }
        let result = match self.cpu.free(ptr) {
            Ok(()) => {
                self.maybe_trim();
                Ok(())
            }
            // SAFETY: the caller's (1) and (2).
            Err(ptr) => unsafe { self.to_slab(ptr) },
        };
        self.settle();
        result
    }

    /// The free-time trim's test, after a free that went past the loaded magazine (the
    /// only frees that can add a full magazine to the depot): one relaxed load of the
    /// depot's count and a comparison.
    #[inline]
    fn maybe_trim(&self) {
        if let Some(trim) = &self.trim
            // Relaxed: a hint; the trim recounts.
            && self.depot_bytes() > trim.threshold.load(Ordering::Relaxed)
        {
            self.trim_now(trim);
        }
    }

    /// Bytes of objects in the depot's full magazines (a hint: the counts are read
    /// without a lock).
    #[inline]
    fn depot_bytes(&self) -> usize {
        self.cpu.depot_full() * self.cpu.magazine_size() * self.size
    }

    /// A cache with a free-time trim gives back at once the pages of slabs that a drain
    /// (a reap, the decay; a large resize, [`purge_after_resize`](Self::purge_after_resize))
    /// just sent to the slab layer, as the trim does for its own: without this their
    /// pages would stay resident until their regions emptied and were released, however
    /// far under the trim threshold the cache then was.
    fn purge_if_trimming(&self) {
        if self.trim.is_some() {
            self.regions.purge(PURGE_DIRTY_PAGES);
        }
    }

    /// [`purge_if_trimming`](Self::purge_if_trimming) after a magazine resize that sent
    /// `drained` objects to the slab layer, only if they were more than the trim leaves
    /// cached (half its threshold now in force). A resize is a busy cache's (it grows
    /// magazines on traffic), whose objects will be wanted again at once: a drain the
    /// trim would have kept keeps its pages, where a purge made the next allocations
    /// fault them back (a producer/consumer pair of mixed sizes, whose classes climb the
    /// magazine ladder in its first second, made 76 purges and 2,264 `madvise` calls in
    /// half a second). A resize amid a burst of frees still gives back what it drained
    /// past the threshold, which no trim would otherwise see (the depot is empty after).
    fn purge_after_resize(&self, drained: usize) {
        let Some(trim) = &self.trim else { return };
        // Relaxed: a hint, as every trim field but `state`.
        if drained.saturating_mul(self.size) > trim.threshold.load(Ordering::Relaxed) / 2 {
            self.regions.purge(PURGE_DIRTY_PAGES);
        }
    }

    /// The free-time trim (module documentation): full depot magazines past the
    /// threshold go to the slab layer, then the regions give the freed pages back.
    #[cold]
    #[inline(never)]
    fn trim_now(&self, trim: &Trim) {
        if self.is_dead() {
            return;
        }
        // AcqRel. Release: this free's push into the depot is seen by the round that
        // serves the request (its Acquire clear, or the leaving compare-exchange, reads
        // this write or a later one of the same RMW chain). Acquire: pairs with the
        // Release that ended the previous trimmer's rounds (the hint fields).
        if trim.state.fetch_or(TRIM_BUSY | TRIM_AGAIN, Ordering::AcqRel) & TRIM_BUSY != 0 {
            return; // the trimmer runs another round for us
        }
        // A destructor run by a round may panic: the busy bit must not outlive it.
        let held = TrimHeld(trim);
        loop {
            // Acquire: pairs with the requests' Release (their pushes).
            trim.state.fetch_and(!TRIM_AGAIN, Ordering::Acquire);
            self.trim_round(trim);
            // Release: pairs with the next trimmer's Acquire (the hint fields). On
            // failure a request came in during the round: another round.
            if trim.state.compare_exchange(TRIM_BUSY, 0, Ordering::Release, Ordering::Relaxed).is_ok() {
                core::mem::forget(held);
                return;
            }
        }
    }

    /// One round of the trim (the caller holds `Trim::state`'s `TRIM_BUSY`): nothing if
    /// the depot is no longer past the threshold (an earlier round served the request).
    fn trim_round(&self, trim: &Trim) {
        // Relaxed (every field): hints, serialised by `Trim::state`.
        let mut threshold = trim.threshold.load(Ordering::Relaxed);
        if self.depot_bytes() <= threshold {
            return;
        }
        let now = self.updates.load(Ordering::Relaxed);
        let at = trim.at.load(Ordering::Relaxed);
        // Slabs made since the last trim, if it was in this interval or the one before.
        let made_since = (at != NEVER && now.wrapping_sub(at) <= 1)
            .then(|| self.shared.slab.stats().slabs_created)
            .filter(|&created| created != trim.created.load(Ordering::Relaxed));
        if let Some(created) = made_since {
            // The last trim, in this interval or the one before, gave back objects that
            // the program then needed again (the slab layer made slabs since): it was
            // premature. Raise the threshold past the demand it saw.
            threshold = threshold.saturating_add(trim.bytes.load(Ordering::Relaxed)).saturating_mul(2).min(TRIM_MAX);
            trim.threshold.store(threshold, Ordering::Relaxed);
            // One raise per premature trim: the next is judged from here.
            trim.at.store(now, Ordering::Relaxed);
            trim.created.store(created, Ordering::Relaxed);
        }
        // Down to half the threshold, not to it: each trim gives back a batch, so that
        // a stream of frees trims (and purges) every few megabytes, not on every push.
        let magazine = (self.cpu.magazine_size() * self.size).max(1);
        let mut sink = self.sink();
        let rounds = self.cpu.trim_depot(threshold / 2 / magazine, &mut sink);
        if rounds > 0 {
            self.regions.purge(PURGE_DIRTY_PAGES);
            // The headers of the slabs the trim destroyed go back with their pages.
            self.shared.slab.release_header_pages();
            trim.at.store(now, Ordering::Relaxed);
            trim.created.store(self.shared.slab.stats().slabs_created, Ordering::Relaxed);
            trim.bytes.store(rounds * self.size, Ordering::Relaxed);
            trim.trims.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// # Safety
    /// The object is constructed and unused (pointer validity is checked here).
    #[cold]
    #[inline(never)]
    unsafe fn free_checked(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        let Some(found) = self.regions.lookup(ptr.as_ptr()) else { return Err(FreeError::Foreign) };
        if found.cache != self.shared.slab.id() {
            return Err(FreeError::WrongCache);
        }
        if found.base != ptr {
            return Err(FreeError::NotObjectBase);
        }
        if !found.allocated {
            return Err(FreeError::NotAllocated);
        }
        // SAFETY: validated above as an allocated object of ours; constructed and unused
        // by the caller's contract. (Two threads racing to free one pointer both pass
        // the check; the slab layer then refuses the second after its destructor ran:
        // checking mode catches sequential double frees.)
        unsafe { self.to_slab(ptr) }
    }

    /// The way out of the cache: destructor, slab free, put.
    ///
    /// # Safety
    /// `ptr` is a constructed object of this cache, outside the magazines, unused.
    unsafe fn to_slab(&self, ptr: NonNull<u8>) -> Result<(), FreeError> {
        if let Some(dtor) = &self.dtor {
            dtor(ptr);
        }
        // Relaxed: a statistic (the decay's activity measure too).
        self.dtor_calls.fetch_add(1, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        // SAFETY: an allocated chunk of our slab cache (the caller's), freed once.
        let result = unsafe { self.shared.slab.free(ptr) };
        if result.is_ok() {
            // The object's reference; the last one runs the teardown.
            self.live.put();
        }
        result
    }

    /// [`ObjectCache::fork_lock`]: reconfiguration (and, in locked mode, every slot),
    /// then the slab lock, the order in which reaping nests them.
    fn fork_lock(&self) {
        self.cpu.fork_lock();
        self.shared.slab.fork_lock();
    }

    /// [`ObjectCache::fork_unlock`].
    ///
    /// # Safety
    /// As `Regions::fork_unlock`.
    unsafe fn fork_unlock(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.shared.slab.fork_unlock() };
        self.cpu.fork_unlock();
    }

    /// The region manager the cache's slabs come from.
    fn regions(&self) -> &'static Regions {
        self.regions
    }

    /// A sink for the magazine layer's drains: each round leaves the cache.
    fn sink(&self) -> impl FnMut(NonNull<u8>) + '_ {
        |round| {
            // SAFETY: a round is a constructed object of this cache that the magazine
            // layer has just handed over (it is nowhere else).
            let freed = unsafe { self.to_slab(round) };
            debug_assert!(freed.is_ok());
        }
    }

    fn drain_all(&self) -> usize {
        let mut count = 0;
        let mut sink = self.sink();
        self.cpu.drain(|round| {
            count += 1;
            sink(round);
        });
        count
    }

    fn destroy(&self) {
        // SeqCst, then the heavy fence: pairs with the light fence in `settle`.
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        fence::heavy();
        // Dropping the initial reference cannot release: not while objects are cached.
        // If none is (and none in use), the drain below does nothing and the kill's own
        // put runs the teardown.
        self.drain_all();
        self.live.kill();
    }

    fn reap(&self) -> usize {
        let drained = self.drain_all();
        self.shared.slab.shrink();
        super::magazine::trim(true);
        drained
    }

    fn update(&self) -> usize {
        if self.is_dead() {
            return 0;
        }
        // Decay: intervals without slab traffic. Traffic is what users caused since the
        // last update, so the misses are read before this update's own reap, whose
        // drains go through `to_slab` and count as misses: read after it, an update
        // that reaped anything would always look busy, and a reap that takes several
        // intervals to empty the depot would keep the decay from ever running (the
        // cache then kept `max_empty` empty slabs, and their region, for good).
        // Relaxed: statistics; concurrent updates at worst count an interval twice.
        let misses = self.misses.load(Ordering::Relaxed) & 0xFFFF_FFFF;
        let now = self.updates.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if let Some(trim) = &self.trim {
            // Relaxed (trim fields): hints. A threshold raised by premature trims halves
            // back towards the configured one for every interval past `decay_intervals`
            // without a trim.
            let at = trim.at.load(Ordering::Relaxed);
            let threshold = trim.threshold.load(Ordering::Relaxed);
            if threshold > trim.floor && (at == NEVER || now.wrapping_sub(at) > self.decay_intervals) {
                trim.threshold.store((threshold / 2).max(trim.floor), Ordering::Relaxed);
            }
        }
        let mut count = 0;
        let mut sink = self.sink();
        let mut counted = |round| {
            count += 1;
            sink(round);
        };
        let size = self.cpu.magazine_size();
        self.cpu.update(&mut counted);
        // The exchange rule, unless the contention rule has just resized (module
        // documentation, "Magazine sizing").
        if let Some(exchanges) = self.grow_exchanges
            && self.cpu.magazine_size() == size
        {
            self.cpu.grow_if_exchanging(exchanges, EXCHANGE_GROWTH_BYTES / self.size.max(1), &mut counted);
        }
        self.cpu.reap(&mut counted);
        // The CPUs that did nothing with this cache for a whole interval give their
        // magazines back (`CpuCaches::drain_idle`), if they hold enough to be worth it.
        if let Some(rounds) = self.idle_drain {
            self.cpu.drain_idle(rounds, &mut counted);
        }
        // The word packs (idle intervals << 32 | low 32 bits of the misses seen).
        // Relaxed: a heuristic; concurrent updates at worst miscount an interval.
        let word = self.decay.load(Ordering::Relaxed);
        let (seen, idle) = (word & 0xFFFF_FFFF, word >> 32);
        let idle = if seen == misses { idle + 1 } else { 0 };
        let mut idle = idle.min(u32::MAX as usize);
        let decayed = idle >= self.decay_intervals;
        if decayed {
            // An idle cache that already gave everything back skips the drain's stop and
            // rseq fence (a `membarrier` every `decay_intervals` for ever otherwise).
            if !self.cpu.holds_nothing() {
                count += self.drain_all();
            }
            self.shared.slab.shrink();
            idle = 0;
        }
        // The magazines freed by this and earlier intervals give their pages back; after
        // the decay's drain at once (an idle cache may see no further update that
        // matters).
        super::magazine::trim(decayed);
        if count > 0 {
            self.purge_if_trimming();
        }
        // Re-read the misses: this update's reap and the decay's drain are not traffic.
        // (User traffic that lands while this update runs is missed for one interval.)
        // Relaxed: statistics and the heuristic word, as above.
        let misses = self.misses.load(Ordering::Relaxed) & 0xFFFF_FFFF;
        self.decay.store(idle << 32 | misses, Ordering::Relaxed);
        count
    }

    fn stats(&self) -> CacheStats {
        let cpu = self.cpu.stats();
        let slab = self.shared.slab.stats();
        // Relaxed: statistics.
        let ctor_calls = self.ctor_calls.load(Ordering::Relaxed);
        let dtor_calls = self.dtor_calls.load(Ordering::Relaxed);
        let constructed = ctor_calls.saturating_sub(dtor_calls);
        let cached = cpu.cpu_rounds + cpu.depot_full * cpu.magazine_size;
        let slabs = slab.partial + slab.full + slab.empty;
        // Acquire: pairs with the Release in the teardown.
        let teardowns = self.shared.torn_down.load(Ordering::Acquire);
        CacheStats {
            name: self.name,
            size: self.size,
            in_use: constructed.saturating_sub(cached),
            constructed,
            cpu_rounds: cpu.cpu_rounds,
            depot_full: cpu.depot_full,
            depot_empty: cpu.depot_empty,
            magazine_size: cpu.magazine_size,
            depot_contention: cpu.contention,
            depot_exchanges: cpu.exchanges,
            resizes: cpu.resizes,
            idle_drains: cpu.idle_drains,
            ctor_calls,
            dtor_calls,
            slabs,
            slab_bytes: slabs * slab.slab_pages * PAGE,
            header_bytes: slab.header_pages * PAGE,
            // Relaxed (three): statistics.
            trims: self.trim.as_ref().map_or(0, |t| t.trims.load(Ordering::Relaxed)),
            trim_threshold: self.trim.as_ref().map_or(0, |t| t.threshold.load(Ordering::Relaxed)),
            destroyed: self.dead.load(Ordering::Relaxed),
            torn_down: teardowns > 0,
            teardowns,
            regions: self.regions.stats(),
        }
    }
}

impl Drop for ObjectCache {
    /// Destroys the cache if needed and frees its state. Objects still in use (from the
    /// raw API) are lost with the slabs.
    fn drop(&mut self) {
        registry::remove(self.inner);
        self.inner().destroy();
        // SAFETY: leaked from a box in `build`; the registry no longer names it and
        // `&mut self` means no other user.
        let mut inner = unsafe { Box::from_raw(self.inner.as_ptr()) };
        // SAFETY: dropped once, here. Its release callback holds its own `Arc<Shared>`.
        unsafe { ManuallyDrop::drop(&mut inner.live) };
    }
}

impl fmt::Debug for ObjectCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectCache").field("name", &self.inner().name).field("stats", &self.stats()).finish()
    }
}

/// The `fork` prepare step for registered caches (see `umem::fork`).
#[cfg(not(scalemem_loom))]
pub(crate) fn fork_lock_registered() {
    registry::fork_lock();
}

/// The `fork` child's repairs for every registered cache, while the registry lock that
/// [`fork_lock_registered`] took is still held.
///
/// # Safety
/// Called in the child of a `fork`, before it has started any other thread, between
/// `fork_lock_registered` (in the parent) and [`fork_unlock_registered`].
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn after_fork_in_child_registered() {
    // SAFETY: the caller's contract.
    unsafe { registry::after_fork_in_child() };
}

/// Releases what [`fork_lock_registered`] took.
///
/// # Safety
/// `fork_lock_registered` ran (here, or in the parent before the `fork` that made this
/// process) and nothing released its locks since.
#[cfg(not(scalemem_loom))]
pub(crate) unsafe fn fork_unlock_registered() {
    // SAFETY: the caller's contract.
    unsafe { registry::fork_unlock() };
}

/// Counters summed over every live cache, and the default region manager's (if made).
///
/// ```
/// let cache = scalemem::umem::cache::ObjectCache::new("g", 40, 8, None, None)?;
/// let p = cache.alloc()?;
/// assert!(scalemem::umem::cache::global_stats().in_use >= 1);
/// # // SAFETY: from this cache, freed once.
/// # unsafe { cache.free(p) }.unwrap();
/// # Ok::<(), scalemem::umem::cache::CacheError>(())
/// ```
#[cfg(not(scalemem_loom))]
pub fn global_stats() -> GlobalStats {
    let mut total = registry::sum();
    if let Some(regions) = DEFAULT_REGIONS.get() {
        total.regions = regions.stats();
    }
    total
}

#[cfg(all(test, not(scalemem_loom)))]
mod tests {
    use super::*;
    use crate::refcount::Config as RefcacheConfig;

    const SIZE: usize = PAGE;

    /// Managers leaked for `'static`, kept reachable from here so that LeakSanitizer does
    /// not report them.
    static LEAKED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
    static LEAKED_NEXT: AtomicUsize = AtomicUsize::new(0);

    /// A trimming cache of page-sized objects on a manager ticked by hand (nothing but
    /// the cache's own purges gives pages back), with one-round magazines that may grow.
    fn trimming(threshold: usize) -> (&'static Regions, ObjectCache) {
        let regions: &'static Regions =
            Box::leak(Box::new(Regions::builder().refcache(RefcacheConfig::manual()).retain(0).build().unwrap()));
        let slot = LEAKED_NEXT.fetch_add(1, Ordering::Relaxed);
        LEAKED[slot].store(core::ptr::from_ref(regions) as usize, Ordering::Relaxed);
        let magazines = cpu_cache::Config { initial_rounds: 1, min_rounds: 1, max_rounds: 143, ..Default::default() };
        let config = Config { reaper: false, magazines, trim_threshold: Some(threshold), ..Config::default() };
        (regions, ObjectCache::new_in(regions, "resize-purge", SIZE, 8, None, None, config).unwrap())
    }

    /// Allocates `n` objects, touching each page, then frees them all: the depot ends
    /// with about `n` objects in full one-round magazines, and the CPUs traded
    /// magazines with it on the way.
    fn cycle(cache: &ObjectCache, n: usize) {
        let held: Vec<_> = (0..n).map(|_| cache.alloc().unwrap()).collect();
        for p in held {
            // SAFETY: an object of this cache, SIZE writable bytes.
            unsafe { p.as_ptr().write_bytes(0x5a, SIZE) };
            // SAFETY: from this cache, freed once.
            unsafe { cache.free(p) }.unwrap();
        }
    }

    /// A resize of a busy cache keeps the pages of a drain the trim would have kept
    /// (under half its threshold); one that drains more gives them back.
    #[test]
    fn a_resize_purges_only_what_the_trim_would_not_keep() {
        // 300 pages (1.2 MiB) against a 4 MiB threshold: no free trims, and the resize
        // drains under half of it.
        let (regions, cache) = trimming(4 << 20);
        cycle(&cache, 300);
        let before = cache.stats();
        assert_eq!(before.trims, 0, "{before:?}");
        assert!(cache.grow_if_busy(usize::MAX, 0, usize::MAX), "no exchange seen: {before:?}");
        assert!(cache.stats().magazine_size > before.magazine_size);
        assert_eq!(regions.stats().returned_bytes, 0, "a small resize purged: {:?}", regions.stats());

        // 1,000 pages (3.9 MiB) against 6 MiB: still no free trim, but the drain is past
        // half the threshold, and its pages go back at once.
        let (regions, cache) = trimming(6 << 20);
        cycle(&cache, 1000);
        assert_eq!(cache.stats().trims, 0);
        assert!(cache.grow_if_busy(usize::MAX, 0, usize::MAX));
        let returned = regions.stats().returned_bytes;
        // (A purge skips a region with fewer than PURGE_DIRTY_PAGES pages freed since its
        // last one.)
        assert!(returned >= (1000 - PURGE_DIRTY_PAGES) * SIZE, "only {returned} bytes given back");
        cache.assert_valid();
        regions.assert_valid();
    }
}
