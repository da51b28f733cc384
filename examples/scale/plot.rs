//! One SVG plot per group, drawn with plotters' SVG backend (no fonts needed: the text
//! is SVG `<text>`, laid out by plotters' built-in estimate).
//!
//! Throughput groups: Mops/s (median) against the thread count, one line per
//! implementation; thread counts are evenly spaced (1, 2, 4, 8, 16 is a log2 axis); the
//! y axis is logarithmic when the values span more than 20x. Thread counts past the
//! largest one the probe saw running in parallel are shaded and their segments dashed.
//! `stalled-garbage`: unreclaimed objects against time for the first repetition, on a
//! log y axis.

use std::error::Error;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::model::GroupReport;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 440;
/// The legend's column on the right.
const LEGEND: u32 = 300;

/// Line colours, distinct in print and for common colour blindness (Okabe-Ito and a few
/// more).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(150, 150, 150),
];

/// The stroke width of plotted data, and only of plotted data (the mesh and axes are 1,
/// the legend's samples 3): [`tag_series`] finds the data's polylines by it.
const SERIES_WIDTH: u32 = 2;

/// Marks the polylines of plotted data with `class="series"`, so that the page (and
/// `ci/report.sh`, through it) can tell them from the mesh and the legend.
fn tag_series(svg: String) -> String {
    let width = format!(" stroke-width=\"{SERIES_WIDTH}\"");
    svg.replace(&width, &format!(" class=\"series\"{width}"))
}

/// An axis label: 0.0025, 2.5, 40, 1.2k, 3M.
fn compact(y: f64) -> String {
    let trim = |s: String| if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s };
    match y.abs() {
        a if a >= 1e6 => format!("{}M", trim(format!("{:.1}", y / 1e6))),
        a if a >= 1e3 => format!("{}k", trim(format!("{:.1}", y / 1e3))),
        a if a >= 1.0 || a == 0.0 => trim(format!("{y:.1}")),
        a => {
            // Three significant figures (the alloc group's rates go down to thousandths).
            let decimals = (2 - a.log10().floor() as i32).clamp(3, 9) as usize;
            trim(format!("{y:.decimals$}"))
        }
    }
}

/// One line: a name and its points (x, y).
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// The group's plot as an SVG document (an SVG with an error message if plotting fails).
pub fn group_svg(group: &GroupReport, threads: &[usize]) -> String {
    let result = if group.stalled.is_empty() { rates_svg(group, threads) } else { stalled_svg(group) };
    result.map(tag_series).unwrap_or_else(|error| {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"40\"><text x=\"10\" y=\"25\">\
             plot failed: {}</text></svg>",
            crate::report::escape(&error.to_string())
        )
    })
}

fn rates_svg(group: &GroupReport, threads: &[usize]) -> Result<String, Box<dyn Error>> {
    let Some(table) = group.rates.first() else { return Ok(String::new()) };
    let index = |t: usize| threads.iter().position(|&x| x == t).unwrap_or(0) as f64;
    let series: Vec<Series> = table
        .rows
        .iter()
        .map(|row| Series {
            name: row.name.clone(),
            points: row.cells.iter().map(|c| (index(c.threads), c.mops.median)).collect(),
        })
        .collect();
    // Points at or below this x are parallel; the rest are shaded and dashed.
    let parallel_to = index(group.parallel_up_to(threads));
    let labels: Vec<String> = threads.iter().map(usize::to_string).collect();
    let x_label = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let x_range = -0.25..(threads.len().max(2) as f64 - 0.75);
    let caption = format!("{} ({})", group.id, table.title);
    draw(&caption, "threads", "Mops/s (median)", x_range, &x_label, &series, Some(parallel_to), threads.len())
}

fn stalled_svg(group: &GroupReport) -> Result<String, Box<dyn Error>> {
    let series: Vec<Series> = group
        .stalled
        .iter()
        .map(|row| Series {
            name: row.name.clone(),
            // Log axis: an empty list shows as 1.
            points: row.timeline.iter().map(|&(ms, n)| (ms, n.max(1.0))).collect(),
        })
        .collect();
    let end = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let x_label = |x: &f64| format!("{x:.0}");
    let caption = format!("{}: unreclaimed objects while a reader is stalled (first repetition)", group.id);
    draw(
        &caption,
        "milliseconds since the reader stalled",
        "retired, not yet freed",
        0.0..end * 1.02,
        &x_label,
        &series,
        None,
        8,
    )
}

/// Draws `series` against a linear x axis and a y axis that is logarithmic when the
/// values span more than 20x.
#[allow(clippy::too_many_arguments)]
fn draw(
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    x_range: std::ops::Range<f64>,
    x_label: &dyn Fn(&f64) -> String,
    series: &[Series],
    parallel_to: Option<f64>,
    x_ticks: usize,
) -> Result<String, Box<dyn Error>> {
    let ys = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(|y| y.is_finite() && *y > 0.0);
    let (lo, hi) = (ys().fold(f64::INFINITY, f64::min), ys().fold(0.0, f64::max));
    let (lo, hi) = if lo.is_finite() && hi > 0.0 { (lo, hi) } else { (1.0, 10.0) };
    let mut svg = String::new();
    if hi / lo > 20.0 {
        let y = (lo / 2.0..hi * 2.0).log_scale();
        draw_on(&mut svg, caption, x_desc, y_desc, x_range, x_label, y, series, parallel_to, x_ticks)?;
    } else {
        let y: RangedCoordf64 = (0.0..hi * 1.1).into();
        draw_on(&mut svg, caption, x_desc, y_desc, x_range, x_label, y, series, parallel_to, x_ticks)?;
    }
    Ok(svg)
}

#[allow(clippy::too_many_arguments)]
fn draw_on<Y>(
    svg: &mut String,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    x_range: std::ops::Range<f64>,
    x_label: &dyn Fn(&f64) -> String,
    y: Y,
    series: &[Series],
    parallel_to: Option<f64>,
    x_ticks: usize,
) -> Result<(), Box<dyn Error>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.clone(), y)?;
    let (y_lo, y_hi) = {
        let range = chart.y_range();
        (range.start, range.end)
    };
    if let Some(p) = parallel_to
        && p + 0.5 < x_range.end
    {
        chart.draw_series(std::iter::once(Rectangle::new(
            [(p + 0.5, y_lo), (x_range.end, y_hi)],
            RGBColor(120, 120, 120).mix(0.12).filled(),
        )))?;
    }
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(x_ticks.max(2))
        .x_label_formatter(x_label)
        .y_label_formatter(&|y: &f64| compact(*y))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(SERIES_WIDTH);
        let split = parallel_to.map_or(s.points.len(), |p| s.points.iter().filter(|q| q.0 <= p).count());
        chart.draw_series(LineSeries::new(s.points[..split].iter().copied(), style))?;
        if split < s.points.len() {
            let from = split.saturating_sub(1);
            chart.draw_series(DashedLineSeries::new(s.points[from..].iter().copied(), 6, 4, style))?;
        }
    }
    // The legend, in its own column so that it never hides a line.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 50 + 22 * i as i32;
        legend_area.draw(&PathElement::new(vec![(8, y), (38, y)], ShapeStyle::from(&color).stroke_width(3)))?;
        legend_area.draw(&Text::new(s.name.clone(), (46, y - 7), ("sans-serif", 13)))?;
    }
    if let Some(p) = parallel_to
        && p + 0.5 < x_range.end
    {
        let y = 50 + 22 * series.len() as i32 + 10;
        legend_area.draw(&Text::new("shaded, dashed: threads not", (8, y), ("sans-serif", 12)))?;
        legend_area.draw(&Text::new("running in parallel (probe)", (8, y + 15), ("sans-serif", 12)))?;
    }
    root.present()?;
    drop(chart);
    Ok(())
}
