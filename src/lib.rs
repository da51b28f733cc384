#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[cfg(all(scalemem_loom, feature = "loom"))]
extern crate loom;

pub mod cpu;
pub mod epoch;
mod os;
pub mod refcount;
pub mod rmlock;
mod sync;
pub mod umem;
pub mod util;
