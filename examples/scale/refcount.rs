//! The `refcount` group: one operation is a get and a put (an increment and a decrement),
//! so a count is back where it started after each.
//!
//! - `PercpuRef` get + put, every thread on one `PercpuRef` in per-CPU mode.
//! - `PercpuArc` clone + drop, every thread on one handle of a live `PercpuOwner`.
//! - `RcRef` clone + drop, every thread on one object of a `Refcache` with its default
//!   background ticker (10 ms epochs).
//! - `Arc` clone + drop, every thread on one shared `Arc`.
//! - `Arc` clone + drop, each thread on its own `Arc` (the uncontended floor of an atomic
//!   count).
//! - `AtomicUsize` `fetch_add` + `fetch_sub` on one shared counter (what `Arc` does,
//!   without the pointer).
//!
//! Each cell makes its objects afresh, outside the timed part.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Relaxed, Release};

use scalemem::refcount::{PercpuOwner, PercpuRef, Refcache};

use crate::Ctx;
use crate::harness::{self, Run};
use crate::model::{self, GroupReport, RateTable};

pub const PEERS: usize = 6;

const NAMES: [&str; PEERS] = [
    "scalemem PercpuRef get+put",
    "scalemem PercpuArc clone+drop",
    "scalemem RcRef (Refcache) clone+drop",
    "Arc clone+drop, one shared",
    "Arc clone+drop, one per thread",
    "AtomicUsize fetch_add+fetch_sub, shared",
];

fn cell(peer: usize, threads: usize, secs: f64) -> Run {
    match peer {
        0 => {
            let percpu = PercpuRef::new(|| {}).expect("a PercpuRef");
            harness::run(threads, secs, |_| {
                || {
                    percpu.get();
                    percpu.put();
                }
            })
        }
        1 => {
            let owner = PercpuOwner::new(42u64).expect("a PercpuOwner");
            let handle = owner.share();
            harness::run(threads, secs, |_| {
                let handle = &handle;
                move || drop(black_box(handle.clone()))
            })
        }
        2 => {
            let cache = Refcache::new().expect("a Refcache");
            let object = cache.alloc(42u64);
            harness::run(threads, secs, |_| {
                let object = &object;
                move || drop(black_box(object.clone()))
            })
        }
        3 => {
            let arc = Arc::new(42u64);
            harness::run(threads, secs, |_| {
                let arc = &arc;
                move || drop(black_box(arc.clone()))
            })
        }
        4 => harness::run(threads, secs, |_| {
            let arc = Arc::new(42u64);
            move || drop(black_box(arc.clone()))
        }),
        _ => {
            let shared = AtomicUsize::new(1);
            harness::run(threads, secs, |_| {
                || {
                    // Relaxed/Release: what Arc's clone and drop use.
                    black_box(shared.fetch_add(1, Relaxed));
                    black_box(shared.fetch_sub(1, Release));
                }
            })
        }
    }
}

pub fn group(ctx: &Ctx) -> GroupReport {
    let runs = ctx.measure("refcount", &NAMES, &ctx.threads, |peer, threads| cell(peer, threads, ctx.secs));
    GroupReport {
        id: "refcount",
        title: "refcount: get + put on a reference count",
        about: "one op = one increment and one decrement (get+put, clone+drop); every thread on one shared \
                object except \"one per thread\""
            .to_owned(),
        rates: vec![RateTable {
            title: "get+put pairs, Mops/s over all threads".to_owned(),
            rows: NAMES
                .iter()
                .zip(&runs)
                .map(|(name, runs)| model::rate_row(name, &ctx.threads, runs, model::whole))
                .collect(),
        }],
        ..GroupReport::default()
    }
}
