#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
// Under loom only the modelled protocols are built: `umem::global` (the C family, the
// fork handlers) is not, so what only it calls (page tags, fork locks, registries) is
// dead there. Ordinary builds keep the lint.
#![cfg_attr(scalemem_loom, allow(dead_code))]

#[cfg(all(scalemem_loom, feature = "loom"))]
extern crate loom;

pub mod cpu;
pub mod ds;
pub mod epoch;
pub mod hazard;
mod os;
mod push_list;
pub mod reclaim;
pub mod refcount;
pub mod rmlock;
mod sync;
#[cfg(not(scalemem_loom))]
mod thread_exit;
pub mod umem;
pub mod util;

/// The global allocator: `#[global_allocator] static A: scalemem::Umem = scalemem::Umem::new();`
/// (see [`umem::global`]).
#[cfg(not(scalemem_loom))]
pub use umem::Umem;
