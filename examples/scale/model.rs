//! What a run produces: per group, tables of cells, each the median of its repetitions
//! with its range, and the parallelism probe taken before and after the group.

use crate::harness::{Measure, Probe, Run};

/// A throughput cell: total rate over all threads and time per operation per thread.
#[derive(Debug)]
pub struct RateCell {
    pub threads: usize,
    /// Millions of operations per second, summed over the threads.
    pub mops: Measure,
    /// Nanoseconds per operation as one thread sees it.
    pub ns_per_op: Measure,
    /// Whether the probe before and after the group showed this many threads running in
    /// parallel.
    pub parallel: bool,
}

#[derive(Debug)]
pub struct RateRow {
    pub name: String,
    pub cells: Vec<RateCell>,
}

/// A throughput table: rows are implementations, columns thread counts.
#[derive(Debug)]
pub struct RateTable {
    pub title: String,
    pub rows: Vec<RateRow>,
}

/// Write latency with readers active, for one lock and one thread count.
#[derive(Debug)]
pub struct LatencyCell {
    pub threads: usize,
    pub mean_ns: Measure,
    pub p99_ns: Measure,
    pub max_ns: Measure,
    pub writes: Measure,
    pub parallel: bool,
}

#[derive(Debug)]
pub struct LatencyRow {
    pub name: String,
    pub cells: Vec<LatencyCell>,
}

/// One reclamation scheme with a stalled reader: counts of objects, not rates.
#[derive(Debug)]
pub struct StalledRow {
    pub name: String,
    /// Objects the writer retired while the reader was stalled.
    pub retired: Measure,
    /// The most retired-but-unreclaimed objects seen.
    pub max_unreclaimed: Measure,
    /// Retired-but-unreclaimed objects when the writer stopped (reader still stalled).
    pub end_unreclaimed: Measure,
    /// Objects the writer allocated that were still not freed after the reader left and
    /// the domain or collector was dropped (0 means nothing leaked).
    pub after_teardown: Measure,
    /// Whether any repetition stopped at the retire cap rather than at the cell time.
    pub capped: bool,
    /// (milliseconds since the start, unreclaimed objects) of the first repetition.
    pub timeline: Vec<(f64, f64)>,
}

/// One group's results.
#[derive(Debug, Default)]
pub struct GroupReport {
    pub id: &'static str,
    pub title: &'static str,
    /// What one operation is, for the table's caption.
    pub about: String,
    pub probe_before: Vec<Probe>,
    pub probe_after: Vec<Probe>,
    /// Throughput tables; the first is the one plotted.
    pub rates: Vec<RateTable>,
    pub latency: Vec<LatencyRow>,
    pub stalled: Vec<StalledRow>,
    pub notes: Vec<String>,
    /// The group's plot, an SVG document.
    pub svg: String,
}

impl GroupReport {
    /// Sets every cell's `parallel` from the probes around the group.
    pub fn mark(&mut self) {
        let parallel = |threads: usize| {
            let ok = |probes: &[Probe]| probes.iter().find(|p| p.threads == threads).is_some_and(Probe::parallel);
            threads == 1 || (ok(&self.probe_before) && ok(&self.probe_after))
        };
        for table in &mut self.rates {
            for row in &mut table.rows {
                for cell in &mut row.cells {
                    cell.parallel = parallel(cell.threads);
                }
            }
        }
        for row in &mut self.latency {
            for cell in &mut row.cells {
                cell.parallel = parallel(cell.threads);
            }
        }
    }

    /// The largest thread count of the run whose cells are all parallel.
    pub fn parallel_up_to(&self, threads: &[usize]) -> usize {
        let parallel = |t: usize| {
            let ok = |probes: &[Probe]| probes.iter().find(|p| p.threads == t).is_some_and(Probe::parallel);
            t == 1 || (ok(&self.probe_before) && ok(&self.probe_after))
        };
        threads.iter().copied().take_while(|&t| parallel(t)).last().unwrap_or(1)
    }
}

/// Builds a rate row from `runs[thread index][rep]` with `metric(run) -> (Mops/s, ns/op
/// per thread)`; a `None` metric leaves the cell out (an update group's readers at one
/// thread).
pub fn rate_row(
    name: &str,
    threads: &[usize],
    runs: &[Vec<Run>],
    metric: impl Fn(&Run) -> Option<(f64, f64)>,
) -> RateRow {
    let cells = threads
        .iter()
        .zip(runs)
        .filter_map(|(&threads, reps)| {
            let values: Vec<(f64, f64)> = reps.iter().filter_map(&metric).collect();
            (!values.is_empty()).then(|| RateCell {
                threads,
                mops: Measure::of(values.iter().map(|v| v.0).collect()),
                ns_per_op: Measure::of(values.iter().map(|v| v.1).collect()),
                parallel: true,
            })
        })
        .collect();
    RateRow { name: name.to_owned(), cells }
}

/// The whole-cell metric: total Mops/s and ns per operation per thread.
pub fn whole(run: &Run) -> Option<(f64, f64)> {
    Some((run.mops(), run.ns_per_op_thread()))
}
