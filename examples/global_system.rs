//! The batch workload with glibc (`std::alloc::System`) as the process's global
//! allocator, the default made explicit: one of four examples that differ only in the
//! allocator they install; see `global_umem.rs`.
//!
//! ```text
//! cargo run --release --example global_system -- --threads 1,2 --sizes 256,4096
//! ```

#[global_allocator]
static GLOBAL: std::alloc::System = std::alloc::System;

#[path = "global_alloc/cells.rs"]
mod cells;

fn main() {
    cells::main("glibc (System)");
}
