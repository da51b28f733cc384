//! The `floors` group: what the hardware charges, to read the other groups against
//! (BENCHMARKING.md's physical floors).
//!
//! - a plain load + add + store of the thread's own cache line;
//! - an uncontended atomic RMW (`fetch_add`, a `lock xadd` on x86_64) on the thread's own
//!   line;
//! - a `SeqCst` fence (`mfence`);
//! - `fetch_add` on one line shared by every thread (the contended line).

use std::hint::black_box;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicU64, fence};

use crossbeam_utils::CachePadded;

use crate::Ctx;
use crate::harness::{self, Run};
use crate::model::{self, GroupReport, RateTable};

pub const PEERS: usize = 4;

const NAMES: [&str; PEERS] =
    ["plain increment, own line", "atomic fetch_add, own line", "SeqCst fence", "atomic fetch_add, one shared line"];

fn cell(peer: usize, threads: usize, secs: f64) -> Run {
    match peer {
        0 => harness::run(threads, secs, |_| {
            let mut line = Box::new(CachePadded::new(0u64));
            move || {
                // black_box: the compiler must load and store the word every time.
                let word = black_box(&mut **line);
                *word = word.wrapping_add(1);
            }
        }),
        1 => harness::run(threads, secs, |_| {
            let line = Box::new(CachePadded::new(AtomicU64::new(0)));
            // Relaxed: a private counter; the RMW's cost is the point.
            move || {
                black_box(line.fetch_add(1, Relaxed));
            }
        }),
        2 => harness::run(threads, secs, |_| {
            || {
                fence(SeqCst);
                // A compiler barrier between fences: LLVM merges adjacent fences, which
                // would leave one `mfence` per batch.
                black_box(());
            }
        }),
        _ => {
            let shared = CachePadded::new(AtomicU64::new(0));
            harness::run(threads, secs, |_| {
                let shared = &shared;
                // Relaxed: a counter; the line's transfers are the point.
                move || {
                    black_box(shared.fetch_add(1, Relaxed));
                }
            })
        }
    }
}

pub fn group(ctx: &Ctx) -> GroupReport {
    let runs = ctx.measure("floors", &NAMES, &ctx.threads, |peer, threads| cell(peer, threads, ctx.secs));
    GroupReport {
        id: "floors",
        title: "floors: what the hardware charges",
        about: "one op = one increment of the thread's own cache line, one atomic RMW on it, one SeqCst fence, or \
                one fetch_add on a line every thread shares"
            .to_owned(),
        rates: vec![RateTable {
            title: "operations, Mops/s over all threads".to_owned(),
            rows: NAMES
                .iter()
                .zip(&runs)
                .map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, model::whole))
                .collect(),
        }],
        ..GroupReport::default()
    }
}
