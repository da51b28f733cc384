//! Shared helpers for scalemem's loom models.
//!
//! Run them with:
//!
//! ```text
//! RUSTFLAGS="--cfg scalemem_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p scalemem-loom-tests --release
//! ```
//!
//! Without `--cfg scalemem_loom` this crate compiles to nothing, so a plain
//! `cargo test --workspace` skips it.

/// Runs `f` under loom's model checker, after printing the model's name so a failing
/// CI log says which story broke. Preemption bounds come from `LOOM_MAX_PREEMPTIONS`
/// (CI sets 2); a default of 2 is used when it is unset.
#[cfg(scalemem_loom)]
pub fn run_model<F>(name: &str, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    eprintln!("loom model: {name}");
    builder.check(f);
}

/// [`run_model`] for models whose executions are long (an object cache over real slab
/// and region layers): loom's limit of branches per execution raised to `max_branches`
/// (its default is 1,000), unless `LOOM_MAX_BRANCHES` sets it.
#[cfg(scalemem_loom)]
pub fn run_model_long<F>(name: &str, max_branches: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = max_branches;
    }
    eprintln!("loom model: {name}");
    builder.check(f);
}
