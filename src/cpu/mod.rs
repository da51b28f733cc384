//! The CPU layer: which CPU a thread runs on, per-CPU slots, asymmetric fences and
//! restartable sequences.
//!
//! - [`current`] and [`possible`]: the CPU number from glibc's rseq area (one load), or
//!   `sched_getcpu`; the number of slots per-CPU structures need.
//! - [`PerCpu<T>`]: one cache-padded `T` per CPU, in mmap'd memory.
//! - [`fence`]: `light()` (a compiler fence) against `heavy()` (membarrier), with a
//!   SeqCst fallback chosen at run time.
//! - [`rseq`]: per-CPU operations that commit with one store and restart if the thread is
//!   preempted, migrated or signalled, so they need no atomic instruction.
//! - [`PerCpuCounter`] and [`PerCpuStack`]: a sloppy counter and bounded pointer stacks
//!   built on them, with try-lock/atomic fallbacks chosen at run time.
//!
//! # Invariants
//! - Nothing here allocates through the global allocator: memory comes from `mmap`,
//!   environment reads from glibc's `getenv`, file reads go into stack buffers.
//! - A CPU number is a hint. Everything built on it is correct for any answer; rseq
//!   sections re-read it inside the section, where it is exact.

mod counter;
pub mod fence;
mod id;
mod percpu;
pub mod rseq;
mod stack;

pub use counter::PerCpuCounter;
pub use id::{current, possible, rseq_enabled};
pub use percpu::PerCpu;
pub use stack::PerCpuStack;

#[cfg(all(not(scalemem_loom), target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
pub(crate) use id::rseq_offset_unchecked;
#[cfg(not(scalemem_loom))]
pub(crate) use id::{rseq_abi, rseq_area, rseq_area_unchecked};
