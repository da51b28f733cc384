//! The batch workload with jemalloc (`tikv-jemallocator`) as the process's global allocator: one of
//! four examples that differ only in the allocator they install; see `global_umem.rs`.
//! jemalloc is not built under `--cfg scalemem_asan`, `scalemem_tsan` or `scalemem_loom`
//! (Cargo.toml); there this example says so and measures nothing.
//!
//! ```text
//! cargo run --release --example global_jemalloc -- --threads 1,2 --sizes 256,4096
//! ```

#[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "global_alloc/cells.rs"]
#[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
mod cells;

#[cfg(not(any(scalemem_asan, scalemem_tsan, scalemem_loom)))]
fn main() {
    cells::main("jemalloc");
}

#[cfg(any(scalemem_asan, scalemem_tsan, scalemem_loom))]
fn main() {
    println!("jemalloc is not built in this configuration (a sanitizer or loom cfg): nothing measured");
}
