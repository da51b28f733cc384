//! The body of the `global_*` examples: the batch workload ([`batch`]) through
//! `std::alloc`, so through whatever the example installed as its `#[global_allocator]`,
//! with a runtime layout, in the scaling runner's cells ([`harness`]: threads
//! started on a barrier, a stop flag `--secs` later).
//!
//! This is the shape a Rust program gives its allocator: with fat LTO (this crate's
//! release profile) `__rust_alloc` is inlined into the caller, so an allocator written
//! in Rust has its fast path compiled into the loop, while a C allocator (mimalloc,
//! jemalloc, glibc) is called. The runner's `alloc` group calls every allocator's
//! `GlobalAlloc` impl directly instead, in one process.
//!
//! Output: one tab-separated line per cell, `cell`, the allocator, the block size, the
//! thread count, then nanoseconds per loop per thread (threads x elapsed / loops): the
//! median, the minimum and the maximum of the repetitions. `bench/alloc/global.sh` runs
//! the four examples in turn and tabulates them.

use std::alloc::{GlobalAlloc, Layout};

// The runner's batch operation and harness, shared by path (relative to this file), so
// that each example declares only this module.
#[path = "../scale/batch.rs"]
mod batch;
#[path = "../scale/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::Measure;

/// The process's global allocator as a `GlobalAlloc` value, for [`batch::op`].
struct Global;

// SAFETY: forwards to `std::alloc`, whose contract is `GlobalAlloc`'s.
unsafe impl GlobalAlloc for Global {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's: a nonzero-size layout.
        unsafe { std::alloc::alloc(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's: a live block from `alloc` with `layout`, freed once.
        unsafe { std::alloc::dealloc(block, layout) }
    }
}

const USAGE: &str = "\
USAGE: cargo run --release --example global_<allocator> -- [OPTIONS]
  --secs F        seconds per cell (default 1)
  --reps N        repetitions per cell (default 3)
  --threads LIST  thread counts (default 1,2)
  --sizes LIST    block sizes in bytes (default 256,4096,65536)";

fn list(value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|v| v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("not a positive count: {v}")))
        .collect()
}

struct Config {
    secs: f64,
    reps: usize,
    threads: Vec<usize>,
    sizes: Vec<usize>,
}

fn parse(args: &[String]) -> Result<Config, String> {
    let mut config = Config { secs: 1.0, reps: 3, threads: vec![1, 2], sizes: vec![256, 4096, 65536] };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        if !["--secs", "--reps", "--threads", "--sizes"].contains(&flag.as_str()) {
            return Err(format!("unknown option {flag}"));
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--secs" => {
                config.secs = value.parse().ok().filter(|s: &f64| *s > 0.0).ok_or("--secs needs a positive number")?
            }
            "--reps" => config.reps = value.parse().ok().filter(|&n| n > 0).ok_or("--reps needs a positive count")?,
            "--threads" => config.threads = list(value)?,
            "--sizes" => config.sizes = list(value)?,
            _ => unreachable!("checked above"),
        }
    }
    Ok(config)
}

/// Runs every cell with the global allocator named `allocator` and prints them.
pub fn main(allocator: &str) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse(&args) {
        Ok(config) => config,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    println!(
        "# global allocator: {allocator}; batch loops of {} blocks; ns per loop per thread over {} repetition(s) of {} s",
        batch::BLOCKS,
        config.reps,
        config.secs
    );
    for &size in &config.sizes {
        let Ok(layout) = Layout::from_size_align(size, 8) else {
            eprintln!("no layout of {size} bytes");
            std::process::exit(2);
        };
        for &threads in &config.threads {
            let reps: Vec<f64> = (0..config.reps)
                .map(|_| {
                    harness::run_batched(threads, config.secs, 1, |_| batch::op(&Global, layout)).ns_per_op_thread()
                })
                .collect();
            let m = Measure::of(reps);
            println!("cell\t{allocator}\t{size}\t{threads}\t{:.1}\t{:.1}\t{:.1}", m.median, m.min, m.max);
        }
    }
}
