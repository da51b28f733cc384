//! The batch workload with [`scalemem::Umem`] as the process's `#[global_allocator]`:
//! one of four examples that differ only in the allocator they install (`global_umem`,
//! `global_mimalloc`, `global_jemalloc`, `global_system`); `bench/alloc/global.sh` runs
//! them in turn and tabulates them. See `global_alloc/cells.rs` for the cells.
//!
//! ```text
//! cargo run --release --example global_umem -- --threads 1,2 --sizes 256,4096
//! ```

#[global_allocator]
static GLOBAL: scalemem::Umem = scalemem::Umem::new();

#[path = "global_alloc/cells.rs"]
mod cells;

fn main() {
    cells::main("scalemem Umem");
}
