//! The report: markdown tables (stdout and `tables.md`), `index.html` with the plots
//! inlined, one SVG per group, and `results.json`.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::Config;
use crate::harness::{Measure, Probe};
use crate::json::Json;
use crate::machine::Machine;
use crate::model::{GroupReport, LatencyRow, RateCell, RateTable, StalledRow};

/// The marker of a cell whose threads were not all running at once.
pub const MARK: &str = "†";

pub const LEGEND: &str = "Cells: median over the repetitions of the total rate over all threads in Mops/s, \
± the largest deviation of a repetition from that median, and in brackets the time per operation as one \
thread sees it (threads × elapsed / operations). † marks a cell run on more threads than the parallelism \
probe (independent spin loops on that many threads, before and after the group) saw running at once: it \
requires T no larger than the CPUs available and, both times, at least 0.9 × T times one loop's rate.";

/// HTML-escapes text.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn command(config: &Config) -> String {
    let mut command = "cargo run --release --example scale".to_owned();
    if !config.args.is_empty() {
        command.push_str(" --");
        for arg in &config.args {
            command.push(' ');
            command.push_str(arg);
        }
    }
    command
}

fn mode(config: &Config) -> String {
    let threads: Vec<String> = config.threads.iter().map(usize::to_string).collect();
    format!(
        "{} mode: threads {}, {} s per cell, {} repetitions per cell",
        if config.full { "full" } else { "quick" },
        threads.join(","),
        config.secs,
        config.reps
    )
}

/// A rate with three significant figures or so (small rates too: the allocator group's
/// loops of 64 KiB blocks run at thousandths of a million per second).
pub fn fmt_num(x: f64) -> String {
    match x {
        x if !x.is_finite() => "-".to_owned(),
        x if x >= 100.0 => format!("{x:.0}"),
        x if x >= 10.0 => format!("{x:.1}"),
        x if x >= 1.0 => format!("{x:.2}"),
        x if x <= 0.0 => format!("{x:.3}"),
        x => {
            // Three significant figures, at most 9 decimals.
            let decimals = (2 - x.log10().floor() as i32).clamp(3, 9) as usize;
            format!("{x:.decimals$}")
        }
    }
}

/// A count with thousands separators.
pub fn fmt_count(x: f64) -> String {
    if !x.is_finite() {
        return "-".to_owned();
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 { format!("-{out}") } else { out }
}

fn rate_cell(cell: &RateCell) -> String {
    format!(
        "{} ±{:.0}% ({} ns){}",
        fmt_num(cell.mops.median),
        cell.mops.spread_pct(),
        fmt_num(cell.ns_per_op.median),
        if cell.parallel { String::new() } else { format!(" {MARK}") }
    )
}

fn count_cell(m: &Measure) -> String {
    if m.min == m.max {
        fmt_count(m.median)
    } else {
        format!("{} ({}-{})", fmt_count(m.median), fmt_count(m.min), fmt_count(m.max))
    }
}

fn threads_header(t: usize) -> String {
    format!("{t} thread{}", if t == 1 { "" } else { "s" })
}

/// The columns of a rate table: every thread count some row has.
fn columns(table: &RateTable) -> Vec<usize> {
    let mut threads: Vec<usize> = table.rows.iter().flat_map(|r| r.cells.iter().map(|c| c.threads)).collect();
    threads.sort_unstable();
    threads.dedup();
    threads
}

fn probe_line(probes: &[Probe]) -> String {
    let parts: Vec<String> = probes
        .iter()
        .filter(|p| p.threads > 1)
        .map(|p| {
            format!("{}: {:.2}x{}", p.threads, p.speedup, if p.parallel() { String::new() } else { format!(" {MARK}") })
        })
        .collect();
    if parts.is_empty() { "one thread only".to_owned() } else { parts.join(", ") }
}

pub fn markdown_header(config: &Config, machine: &Machine) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# scalemem scaling run\n");
    let _ = writeln!(s, "Command: `{}` ({})\n", command(config), mode(config));
    let fields: Vec<String> = machine.fields.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let _ = writeln!(s, "Machine: {}\n", fields.join("; "));
    let crates: Vec<String> = machine.crates.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(s, "Peers: {}\n", crates.join(", "));
    let _ = writeln!(s, "{LEGEND}");
    s
}

fn markdown_rate_table(s: &mut String, table: &RateTable) {
    let columns = columns(table);
    let _ = writeln!(s, "\n{}\n", table.title);
    let _ = write!(s, "| implementation |");
    for &t in &columns {
        let _ = write!(s, " {} |", threads_header(t));
    }
    let _ = write!(s, "\n|---|");
    for _ in &columns {
        let _ = write!(s, "---:|");
    }
    for row in &table.rows {
        let _ = write!(s, "\n| {} |", row.name);
        for &t in &columns {
            let cell = row.cells.iter().find(|c| c.threads == t).map_or_else(|| "-".to_owned(), rate_cell);
            let _ = write!(s, " {cell} |");
        }
    }
    s.push('\n');
}

fn latency_columns(rows: &[LatencyRow]) -> Vec<usize> {
    rows.first().map(|r| r.cells.iter().map(|c| c.threads).collect()).unwrap_or_default()
}

fn latency_header(t: usize) -> String {
    format!("{t} thread{} ({} reader{})", if t == 1 { "" } else { "s" }, t - 1, if t == 2 { "" } else { "s" })
}

fn latency_cell(cell: &crate::model::LatencyCell) -> String {
    format!(
        "{} / {}{}",
        fmt_count(cell.mean_ns.median),
        fmt_count(cell.p99_ns.median),
        if cell.parallel { String::new() } else { format!(" {MARK}") }
    )
}

const LATENCY_TITLE: &str = "writer latency with readers active: one write every 50 us on thread 0 while the \
other threads read; mean / p99 in ns (medians over the repetitions). A few very slow writes (a reader \
preempted inside its read section, on an oversubscribed machine) can pull the mean above the p99.";

const STALLED_COLUMNS: [&str; 4] =
    ["retired", "max unreclaimed", "unreclaimed at end (reader still stalled)", "alive after teardown"];

fn stalled_values(row: &StalledRow) -> [String; 4] {
    [
        format!("{}{}", count_cell(&row.retired), if row.capped { " (cap)" } else { "" }),
        count_cell(&row.max_unreclaimed),
        count_cell(&row.end_unreclaimed),
        count_cell(&row.after_teardown),
    ]
}

pub fn markdown_group(group: &GroupReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {}\n", group.title);
    let _ = writeln!(s, "{}\n", group.about);
    let _ = write!(
        s,
        "Parallelism probe (T spin loops' total rate over one loop's): before {}; after {}",
        probe_line(&group.probe_before),
        probe_line(&group.probe_after)
    );
    s.push('\n');
    for table in &group.rates {
        markdown_rate_table(&mut s, table);
    }
    if !group.latency.is_empty() {
        let columns = latency_columns(&group.latency);
        let _ = writeln!(s, "\n{LATENCY_TITLE}\n");
        let _ = write!(s, "| lock |");
        for &t in &columns {
            let _ = write!(s, " {} |", latency_header(t));
        }
        let _ = write!(s, "\n|---|");
        for _ in &columns {
            let _ = write!(s, "---:|");
        }
        for row in &group.latency {
            let _ = write!(s, "\n| {} |", row.name);
            for cell in &row.cells {
                let _ = write!(s, " {} |", latency_cell(cell));
            }
        }
        s.push('\n');
    }
    if !group.stalled.is_empty() {
        let _ = writeln!(
            s,
            "\nObjects (counts, not rates): median (min-max) over the repetitions; (cap) = the writer stopped at \
             the retire cap before the cell time\n"
        );
        let _ = write!(s, "| implementation | {} |\n|---|---:|---:|---:|---:|", STALLED_COLUMNS.join(" | "));
        for row in &group.stalled {
            let _ = write!(s, "\n| {} | {} |", row.name, stalled_values(row).join(" | "));
        }
        s.push('\n');
    }
    for note in &group.notes {
        let _ = writeln!(s, "\n{note}");
    }
    s
}

fn html_rate_table(s: &mut String, table: &RateTable) {
    let columns = columns(table);
    let _ = write!(s, "<table><caption>{}</caption><tr><th>implementation</th>", escape(&table.title));
    for &t in &columns {
        let _ = write!(s, "<th>{}</th>", threads_header(t));
    }
    s.push_str("</tr>\n");
    for row in &table.rows {
        let _ = write!(s, "<tr><th>{}</th>", escape(&row.name));
        for &t in &columns {
            match row.cells.iter().find(|c| c.threads == t) {
                Some(cell) => {
                    let _ = write!(
                        s,
                        "<td class=\"{}\" title=\"reps: {}\">{}</td>",
                        if cell.parallel { "par" } else { "nonpar" },
                        cell.mops.reps.iter().map(|r| fmt_num(*r)).collect::<Vec<_>>().join(", "),
                        escape(&rate_cell(cell))
                    );
                }
                None => s.push_str("<td>-</td>"),
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
}

fn html_group(s: &mut String, group: &GroupReport) {
    let _ = writeln!(
        s,
        "<section id=\"group-{id}\">\n<h2>{}</h2>\n<p>{}</p>",
        escape(group.title),
        escape(&group.about),
        id = group.id
    );
    let _ = writeln!(
        s,
        "<p class=\"probe\">Parallelism probe (T spin loops' total rate over one loop's): before {}; after {}</p>",
        escape(&probe_line(&group.probe_before)),
        escape(&probe_line(&group.probe_after))
    );
    let _ = writeln!(
        s,
        "<figure class=\"plot\" id=\"plot-{id}\" data-group=\"{id}\">\n{}\n</figure>",
        group.svg,
        id = group.id
    );
    for table in &group.rates {
        html_rate_table(s, table);
    }
    if !group.latency.is_empty() {
        let _ = write!(s, "<table><caption>{}</caption><tr><th>lock</th>", escape(LATENCY_TITLE));
        for &t in &latency_columns(&group.latency) {
            let _ = write!(s, "<th>{}</th>", latency_header(t));
        }
        s.push_str("</tr>\n");
        for row in &group.latency {
            let _ = write!(s, "<tr><th>{}</th>", escape(&row.name));
            for cell in &row.cells {
                let _ = write!(
                    s,
                    "<td class=\"{}\" title=\"writes timed: {}; slowest: {} ns\">{}</td>",
                    if cell.parallel { "par" } else { "nonpar" },
                    fmt_count(cell.writes.median),
                    fmt_count(cell.max_ns.median),
                    escape(&latency_cell(cell))
                );
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n");
    }
    if !group.stalled.is_empty() {
        s.push_str(
            "<table><caption>objects (counts, not rates): median (min-max) over the repetitions; (cap) = the \
             writer stopped at the retire cap</caption><tr><th>implementation</th>",
        );
        for c in STALLED_COLUMNS {
            let _ = write!(s, "<th>{}</th>", escape(c));
        }
        s.push_str("</tr>\n");
        for row in &group.stalled {
            let _ = write!(s, "<tr><th>{}</th>", escape(&row.name));
            for v in stalled_values(row) {
                let _ = write!(s, "<td>{}</td>", escape(&v));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n");
    }
    for note in &group.notes {
        let _ = writeln!(s, "<p>{}</p>", escape(note));
    }
    s.push_str("</section>\n");
}

/// Marks each figure with what the browser laid out: how many data polylines (`class=
/// "series"`, see `plot.rs`) have a nonzero length and box, how many distinct series
/// (colours) those belong to, and the SVG's rendered size; so a headless browser's dumped
/// DOM shows whether the plots rendered (`ci/report.sh` checks these attributes).
const RENDER_CHECK: &str = r#"<script>
for (const figure of document.querySelectorAll("figure.plot")) {
  let lines = 0;
  const series = new Set();
  for (const line of figure.querySelectorAll("svg polyline.series")) {
    try {
      if (line.getTotalLength() > 0 && (line.getBBox().width > 0 || line.getBBox().height > 0)) {
        lines++;
        series.add(line.getAttribute("stroke"));
      }
    } catch (e) {}
  }
  const svg = figure.querySelector("svg");
  const box = svg ? svg.getBoundingClientRect() : { width: 0, height: 0 };
  figure.dataset.renderedLines = String(lines);
  figure.dataset.renderedSeries = String(series.size);
  figure.dataset.renderedSize = Math.round(box.width) + "x" + Math.round(box.height);
}
document.body.dataset.renderCheck = "done";
</script>"#;

fn html(config: &Config, machine: &Machine, groups: &[GroupReport], elapsed: f64) -> String {
    let mut s = String::new();
    s.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>scalemem scaling run</title>\n<style>\n\
         body{font-family:sans-serif;max-width:1000px;margin:1em auto;padding:0 1em;color:#222}\n\
         table{border-collapse:collapse;margin:1em 0;font-size:0.9em}\n\
         th,td{border:1px solid #ccc;padding:0.25em 0.5em}td{text-align:right;font-variant-numeric:tabular-nums}\n\
         caption{text-align:left;font-weight:bold;padding:0.3em 0}\n\
         td.nonpar{background:#f3f3f3;color:#666}\n\
         figure.plot{margin:0.5em 0}.probe{font-size:0.9em;color:#555}code{background:#f4f4f4}\n\
         </style></head>\n<body>\n<h1>scalemem scaling run</h1>\n",
    );
    let _ = writeln!(
        s,
        "<p>Command: <code>{}</code> ({}); the run took {elapsed:.0} s.</p>",
        escape(&command(config)),
        escape(&mode(config))
    );
    s.push_str("<table><caption>machine</caption>\n");
    for (k, v) in &machine.fields {
        let _ = writeln!(s, "<tr><th>{}</th><td style=\"text-align:left\">{}</td></tr>", escape(k), escape(v));
    }
    s.push_str("</table>\n<table><caption>peer crate versions (Cargo.lock)</caption>\n");
    for (k, v) in &machine.crates {
        let _ = writeln!(s, "<tr><th>{}</th><td style=\"text-align:left\">{}</td></tr>", escape(k), escape(v));
    }
    let _ = writeln!(s, "</table>\n<p>{}</p>", escape(LEGEND));
    for group in groups {
        html_group(&mut s, group);
    }
    s.push_str(RENDER_CHECK);
    s.push_str("\n</body></html>\n");
    s
}

fn measure_json(m: &Measure) -> Json {
    Json::obj([
        ("median", Json::Num(m.median)),
        ("min", Json::Num(m.min)),
        ("max", Json::Num(m.max)),
        ("reps", Json::Arr(m.reps.iter().map(|&r| Json::Num(r)).collect())),
    ])
}

fn probes_json(probes: &[Probe]) -> Json {
    Json::Arr(
        probes
            .iter()
            .map(|p| {
                Json::obj([
                    ("threads", Json::Num(p.threads as f64)),
                    ("speedup", Json::Num(p.speedup)),
                    ("parallel", Json::Bool(p.parallel())),
                ])
            })
            .collect(),
    )
}

fn group_json(group: &GroupReport) -> Json {
    let rates = group.rates.iter().map(|table| {
        Json::obj([
            ("title", Json::str(&table.title)),
            (
                "rows",
                Json::Arr(
                    table
                        .rows
                        .iter()
                        .map(|row| {
                            Json::obj([
                                ("name", Json::str(&row.name)),
                                (
                                    "cells",
                                    Json::Arr(
                                        row.cells
                                            .iter()
                                            .map(|c| {
                                                Json::obj([
                                                    ("threads", Json::Num(c.threads as f64)),
                                                    ("mops", measure_json(&c.mops)),
                                                    ("ns_per_op_per_thread", measure_json(&c.ns_per_op)),
                                                    ("parallel", Json::Bool(c.parallel)),
                                                ])
                                            })
                                            .collect(),
                                    ),
                                ),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    });
    let latency = group.latency.iter().map(|row| {
        Json::obj([
            ("name", Json::str(&row.name)),
            (
                "cells",
                Json::Arr(
                    row.cells
                        .iter()
                        .map(|c| {
                            Json::obj([
                                ("threads", Json::Num(c.threads as f64)),
                                ("readers", Json::Num(c.threads as f64 - 1.0)),
                                ("mean_ns", measure_json(&c.mean_ns)),
                                ("p99_ns", measure_json(&c.p99_ns)),
                                ("max_ns", measure_json(&c.max_ns)),
                                ("writes_timed", measure_json(&c.writes)),
                                ("parallel", Json::Bool(c.parallel)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    });
    let stalled = group.stalled.iter().map(|row| {
        Json::obj([
            ("name", Json::str(&row.name)),
            ("retired", measure_json(&row.retired)),
            ("max_unreclaimed", measure_json(&row.max_unreclaimed)),
            ("end_unreclaimed", measure_json(&row.end_unreclaimed)),
            ("alive_after_teardown", measure_json(&row.after_teardown)),
            ("hit_retire_cap", Json::Bool(row.capped)),
            (
                "timeline_ms_unreclaimed",
                Json::Arr(row.timeline.iter().map(|&(t, n)| Json::Arr(vec![Json::Num(t), Json::Num(n)])).collect()),
            ),
        ])
    });
    Json::obj([
        ("id", Json::str(group.id)),
        ("title", Json::str(group.title)),
        ("operation", Json::str(&group.about)),
        ("probe_before", probes_json(&group.probe_before)),
        ("probe_after", probes_json(&group.probe_after)),
        ("rate_tables", Json::Arr(rates.collect())),
        ("writer_latency", Json::Arr(latency.collect())),
        ("stalled", Json::Arr(stalled.collect())),
        ("notes", Json::Arr(group.notes.iter().map(Json::str).collect())),
    ])
}

fn results_json(config: &Config, machine: &Machine, groups: &[GroupReport], elapsed: f64) -> String {
    let json = Json::obj([
        ("schema", Json::Num(1.0)),
        ("command", Json::str(command(config))),
        (
            "config",
            Json::obj([
                ("mode", Json::str(if config.full { "full" } else { "quick" })),
                ("threads", Json::Arr(config.threads.iter().map(|&t| Json::Num(t as f64)).collect())),
                ("secs_per_cell", Json::Num(config.secs)),
                ("reps", Json::Num(config.reps as f64)),
            ]),
        ),
        ("elapsed_secs", Json::Num(elapsed)),
        ("machine", Json::obj(machine.fields.iter().map(|(k, v)| (*k, Json::str(v))))),
        ("crates", Json::obj(machine.crates.iter().map(|(k, v)| (k.as_str(), Json::str(v))))),
        ("legend", Json::str(LEGEND)),
        ("groups", Json::Arr(groups.iter().map(group_json).collect())),
    ]);
    let mut out = String::new();
    json.write(&mut out, 0);
    out.push('\n');
    out
}

/// Writes every file of the report; returns the path of `index.html`.
pub fn write_all(config: &Config, machine: &Machine, groups: &[GroupReport], elapsed: f64) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(&config.out)?;
    let mut tables = markdown_header(config, machine);
    for group in groups {
        tables.push_str("\n\n");
        tables.push_str(&markdown_group(group));
        std::fs::write(config.out.join(format!("{}.svg", group.id)), &group.svg)?;
    }
    std::fs::write(config.out.join("tables.md"), tables)?;
    std::fs::write(config.out.join("results.json"), results_json(config, machine, groups, elapsed))?;
    let index = config.out.join("index.html");
    std::fs::write(&index, html(config, machine, groups, elapsed))?;
    Ok(index)
}
