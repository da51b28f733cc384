//! A will-it-scale style runner: every scalemem primitive beside its peers, at several
//! thread counts, in one run, with a parallelism check around each group.
//!
//! ```text
//! cargo run --release --example scale                 # quick mode: under 3 minutes on 2 cores
//! cargo run --release --example scale -- --full       # 1, 2, 4, 8, 16 threads, 1 s cells, 5 reps
//! cargo run --release --example scale -- --only refcount,rwlock --threads 1,2 --secs 0.5
//! ```
//!
//! Method (BENCHMARKING.md): for each operation and thread count, `T` threads start on a
//! barrier and repeat the operation until a stop flag is raised `--secs` later; a cell
//! is the median of `--reps` repetitions, shown with the largest deviation from the
//! median. Before and after each group a probe runs independent spin loops on each thread
//! count and compares their total rate with one thread's; cells whose thread count
//! exceeds the CPUs available, or did not get at least 90% of the ideal speedup in both
//! probes, are marked `†` (on a 2-core machine, every cell past 2 threads is).
//!
//! Output: markdown tables on stdout, and under `--out` (default
//! `target/scale-report/`): `index.html` (plots, tables, machine), one SVG per group,
//! `tables.md` and `results.json`. A progress line on stderr shows the cell and the time
//! left.
//!
//! Groups: `reclaim-read`, `reclaim-update`, `stalled-garbage`, `refcount`, `rwlock`,
//! `floors`, and `alloc`: umem's global allocator against glibc, jemalloc and mimalloc
//! on batch allocation and on remote (producer/consumer) frees (see each module).

mod alloc;
mod batch;
mod floors;
mod harness;
mod json;
mod machine;
mod model;
mod plot;
mod reclaim;
mod refcount;
mod report;
mod rwlock;

use std::cell::RefCell;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Instant;

use model::GroupReport;

/// What the command line asked for.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) full: bool,
    pub(crate) threads: Vec<usize>,
    pub(crate) secs: f64,
    pub(crate) reps: usize,
    pub(crate) only: Vec<String>,
    pub(crate) out: PathBuf,
    /// The arguments as given, for the report.
    pub(crate) args: Vec<String>,
}

/// One group: its id (for `--only`), how to run it, and how many cells it has (for the
/// time estimate).
struct GroupDef {
    id: &'static str,
    /// Cells per thread count, and cells that do not depend on the thread count, in full
    /// mode (`true`) or quick mode.
    cells: fn(bool) -> (usize, usize),
    run: fn(&Ctx) -> GroupReport,
}

const GROUPS: [GroupDef; 7] = [
    GroupDef { id: "reclaim-read", cells: |_| (reclaim::READ_PEERS, 0), run: reclaim::read_group },
    GroupDef { id: "reclaim-update", cells: |_| (reclaim::READ_PEERS, 0), run: reclaim::update_group },
    GroupDef { id: "stalled-garbage", cells: |_| (0, reclaim::STALLED_PEERS), run: reclaim::stalled_group },
    GroupDef { id: "refcount", cells: |_| (refcount::PEERS, 0), run: refcount::group },
    GroupDef { id: "rwlock", cells: |_| (2 * rwlock::PEERS, 0), run: rwlock::group },
    GroupDef { id: "floors", cells: |_| (floors::PEERS, 0), run: floors::group },
    GroupDef { id: "alloc", cells: |full| (alloc::cells(full), 0), run: alloc::group },
];

/// Seconds a cell costs beyond its run time (thread start, setup), for the estimate.
const CELL_OVERHEAD: f64 = 0.01;

const USAGE: &str = "\
scale: scalemem and its peers at several thread counts (will-it-scale style)

USAGE: cargo run --release --example scale -- [OPTIONS]

OPTIONS:
  --full             full mode: threads 1,2,4,8,16, 1 s cells, 5 repetitions
                     (quick mode, the default: threads 1,2,4,8, 0.2 s cells, 3 repetitions)
  --threads LIST     thread counts, e.g. 1,2,4 (overrides the mode's)
  --secs F           seconds per cell (overrides the mode's)
  --reps N           repetitions per cell, at least 1 (overrides the mode's)
  --only GROUP       run only these groups; repeatable or a comma list; groups:
                     reclaim-read, reclaim-update, stalled-garbage, refcount, rwlock, floors,
                     alloc
  --out DIR          where the report goes (default: target/scale-report in the crate)
  --help             this text

Cells are medians of the repetitions with the largest deviation from the median; a cell
marked † ran on more threads than the parallelism probe saw running at once.";

fn parse_args(args: Vec<String>) -> Result<Config, String> {
    let mut full = false;
    let (mut threads, mut secs, mut reps) = (None, None, None);
    let mut only = Vec::new();
    let mut out = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value =
            || inline.clone().or_else(|| iter.next().cloned()).ok_or_else(|| format!("{flag} needs a value"));
        match flag {
            "--help" | "-h" => return Err(String::new()),
            "--full" => full = true,
            "--threads" => {
                let list = value()?;
                let parsed: Result<Vec<usize>, _> = list.split(',').map(|t| t.trim().parse::<usize>()).collect();
                match parsed {
                    Ok(list) if !list.is_empty() && !list.contains(&0) => threads = Some(list),
                    _ => return Err(format!("--threads wants positive counts separated by commas, not {list:?}")),
                }
            }
            "--secs" => {
                let text = value()?;
                match text.parse::<f64>() {
                    Ok(s) if s > 0.0 && s.is_finite() => secs = Some(s),
                    _ => return Err(format!("--secs wants a positive number of seconds, not {text:?}")),
                }
            }
            "--reps" => {
                let text = value()?;
                match text.parse::<usize>() {
                    Ok(n) if n > 0 => reps = Some(n),
                    _ => return Err(format!("--reps wants a positive count, not {text:?}")),
                }
            }
            "--only" => {
                for group in value()?.split(',').map(str::trim).filter(|g| !g.is_empty()) {
                    if !GROUPS.iter().any(|g| g.id == group) {
                        let known: Vec<&str> = GROUPS.iter().map(|g| g.id).collect();
                        return Err(format!("unknown group {group:?}; groups: {}", known.join(", ")));
                    }
                    only.push(group.to_owned());
                }
            }
            "--out" => out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let mut threads = threads.unwrap_or_else(|| if full { vec![1, 2, 4, 8, 16] } else { vec![1, 2, 4, 8] });
    threads.sort_unstable();
    threads.dedup();
    Ok(Config {
        full,
        threads,
        secs: secs.unwrap_or(if full { 1.0 } else { 0.2 }),
        reps: reps.unwrap_or(if full { 5 } else { 3 }),
        only,
        out: out.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/scale-report")),
        args,
    })
}

/// The progress line on stderr, rewritten in place with `\r`. When stderr is not a
/// terminal (a CI log), one line per group instead.
struct Progress {
    start: Instant,
    /// Planned seconds of the whole run and of what is done.
    planned: f64,
    done: f64,
    width: usize,
    terminal: bool,
    /// The group of the last line shown (non-terminal mode).
    last_group: String,
}

impl Progress {
    fn show(&mut self, what: &str) {
        let elapsed = self.start.elapsed().as_secs_f64();
        // Scale what is left by how the run has gone so far (thread starts, a busy host).
        let pace = if self.done > 1.0 { (elapsed / self.done).clamp(0.5, 5.0) } else { 1.0 };
        let left = ((self.planned - self.done).max(0.0) * pace) as u64;
        let line = format!("[{:>3}s] {what} | about {}m{:02}s left", elapsed as u64, left / 60, left % 60);
        if !self.terminal {
            let group = what.split(':').next().unwrap_or_default();
            if group != self.last_group {
                self.last_group = group.to_owned();
                eprintln!("{line}");
            }
            return;
        }
        let pad = self.width.saturating_sub(line.chars().count());
        self.width = line.chars().count();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{:pad$}", "");
        let _ = err.flush();
    }

    fn clear(&mut self) {
        if !self.terminal {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{:width$}\r", "", width = self.width);
        let _ = err.flush();
        self.width = 0;
    }
}

/// What the groups get: the configuration, and the progress line.
pub(crate) struct Ctx {
    /// Full mode (the alloc group measures more block sizes).
    pub(crate) full: bool,
    pub(crate) threads: Vec<usize>,
    pub(crate) secs: f64,
    pub(crate) reps: usize,
    progress: RefCell<Progress>,
}

impl Ctx {
    /// Runs `cell(peer, threads)` for every thread count, repetition and peer, peers
    /// innermost (so that drifting load affects peers alike), and returns the results as
    /// `[peer][thread index][rep]`.
    pub(crate) fn measure<R>(
        &self,
        group: &str,
        peers: &[&str],
        threads: &[usize],
        mut cell: impl FnMut(usize, usize) -> R,
    ) -> Vec<Vec<Vec<R>>> {
        let mut results: Vec<Vec<Vec<R>>> =
            peers.iter().map(|_| threads.iter().map(|_| Vec::with_capacity(self.reps)).collect()).collect();
        for (t, &count) in threads.iter().enumerate() {
            for rep in 0..self.reps {
                for (peer, name) in peers.iter().enumerate() {
                    self.progress.borrow_mut().show(&format!(
                        "{group}: {name}, {count} thread{}, rep {}/{}",
                        if count == 1 { "" } else { "s" },
                        rep + 1,
                        self.reps
                    ));
                    results[peer][t].push(cell(peer, count));
                    self.progress.borrow_mut().done += self.secs + CELL_OVERHEAD;
                }
            }
        }
        results
    }

    /// The probe around a group, with progress.
    fn probe(&self, group: &str, when: &str) -> Vec<harness::Probe> {
        self.progress.borrow_mut().show(&format!("{group}: parallelism probe {when}"));
        let probe = harness::probe(&self.threads, probe_secs(self.secs), PROBE_TRIES);
        self.progress.borrow_mut().done += self.probe_cost();
        probe
    }

    fn probe_cost(&self) -> f64 {
        (PROBE_TRIES * self.threads.len().max(1)) as f64 * (probe_secs(self.secs) + CELL_OVERHEAD)
    }
}

const PROBE_TRIES: usize = 3;

/// Each probe run lasts this long: long enough that waking an idle vCPU does not pass
/// for a lack of parallelism, short beside the cells.
fn probe_secs(cell_secs: f64) -> f64 {
    (cell_secs / 4.0).clamp(0.02, 0.05)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse_args(args) {
        Ok(config) => config,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(message) => {
            eprintln!("scale: {message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let selected: Vec<&GroupDef> =
        GROUPS.iter().filter(|g| config.only.is_empty() || config.only.iter().any(|o| o == g.id)).collect();

    let ctx = Ctx {
        full: config.full,
        threads: config.threads.clone(),
        secs: config.secs,
        reps: config.reps,
        progress: RefCell::new(Progress {
            start: Instant::now(),
            planned: 0.0,
            done: 0.0,
            width: 0,
            terminal: std::io::stderr().is_terminal(),
            last_group: String::new(),
        }),
    };
    let cell_cost = (config.secs + CELL_OVERHEAD) * config.reps as f64;
    ctx.progress.borrow_mut().planned = selected
        .iter()
        .map(|g| {
            let (per_threads, fixed) = (g.cells)(config.full);
            (per_threads * config.threads.len() + fixed) as f64 * cell_cost + 2.0 * ctx.probe_cost()
        })
        .sum();

    let machine = machine::Machine::describe();
    println!("{}", report::markdown_header(&config, &machine));

    let started = Instant::now();
    let mut groups = Vec::new();
    for def in selected {
        let before = ctx.probe(def.id, "before");
        let mut group = (def.run)(&ctx);
        group.probe_before = before;
        group.probe_after = ctx.probe(def.id, "after");
        group.mark();
        group.svg = plot::group_svg(&group, &config.threads);
        ctx.progress.borrow_mut().clear();
        println!("{}", report::markdown_group(&group));
        groups.push(group);
    }
    ctx.progress.borrow_mut().clear();
    let elapsed = started.elapsed().as_secs_f64();

    match report::write_all(&config, &machine, &groups, elapsed) {
        Ok(index) => println!("report: {} (run took {elapsed:.0} s)", index.display()),
        Err(error) => {
            eprintln!("scale: could not write the report to {}: {error}", config.out.display());
            std::process::exit(1);
        }
    }
}
