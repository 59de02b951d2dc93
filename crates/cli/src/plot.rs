//! The sweep's plot, as SVG or PNG: bandwidth (average and peak) and latency (p50 and p99)
//! against block size, with ticks at the swept powers of two, the robust plateau and its 90 %
//! line, and the knee and every hint marked on both panels; each panel's legend stands beside it,
//! off the data. The PNG's text is drawn with the DejaVu Sans font shipped in `assets/` (no
//! system fonts); the SVG names that family (with `sans-serif` as the fallback), so a viewer
//! without it substitutes its own sans-serif.

use crate::sweep::SweepReport;
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
/// The family the plot's text asks for (registered with the shipped font for layout).
const FAMILY: &str = "DejaVu Sans, sans-serif";

const SIZE: (u32, u32) = (1380, 720);
/// Width of the legend strip right of both panels, in pixels.
const LEGEND_WIDTH: u32 = 340;
const MEDIAN: RGBColor = RGBColor(31, 119, 180);
const PEAK: RGBColor = RGBColor(140, 190, 230);
const P50: RGBColor = RGBColor(44, 160, 44);
const P99: RGBColor = RGBColor(214, 39, 40);
const PLATEAU: RGBColor = RGBColor(90, 90, 90);

/// A vertical marker: a block size with its label, colour and line width.
struct Marker {
    bytes: u64,
    label: String,
    color: RGBColor,
    width: u32,
}

fn markers(report: &SweepReport) -> Vec<Marker> {
    let mut out = vec![Marker {
        bytes: report.knee_bytes,
        label: format!("knee {}", format_bytes(report.knee_bytes)),
        color: RGBColor(255, 127, 14),
        width: 7,
    }];
    let hints = &report.hints;
    for (name, verdict, color) in [
        ("model hint", Some(&hints.model), RGBColor(148, 103, 189)),
        ("calibrated hint", hints.calibrated.as_ref(), RGBColor(23, 190, 207)),
        ("recorded hint", hints.recorded.as_ref(), RGBColor(140, 86, 75)),
    ] {
        if let Some(v) = verdict {
            out.push(Marker {
                bytes: v.block_bytes,
                label: format!("{name} {} ({:.2} of plateau)", format_bytes(v.block_bytes), v.efficiency),
                color,
                width: 2,
            });
        }
    }
    out
}

/// `--plot`: a path ending in `.svg` or `.png` (any case); anything else would get a format its
/// name does not say.
pub(crate) fn parse_plot_path(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg" | "png") => Ok(path),
        _ => Err(format!("`{text}`: the plot is written as SVG or PNG; name it FILE.svg or FILE.png")),
    }
}

/// Writes the plot to `path`: PNG when it ends in `.png`, SVG otherwise.
pub(crate) fn write(report: &SweepReport, path: &Path) -> anyhow::Result<()> {
    plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the shipped font is invalid"))?;
    let is_png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
    let drawn = if is_png {
        let backend = crate::png_text::GlyphText::new(BitMapBackend::new(path, SIZE), FONT)
            .map_err(|e| anyhow::anyhow!(e))?;
        draw(report, backend.into_drawing_area())
    } else {
        draw(report, SVGBackend::new(path, SIZE).into_drawing_area())
    };
    drawn.map_err(|e| anyhow::anyhow!("plotting {}: {e}", path.display()))
}

/// Base-2 logarithm of a block size: the x coordinate, so ticks fall on powers of two.
fn log2(bytes: u64) -> f64 {
    (bytes as f64).log2()
}

fn tick_label(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
        format_bytes(1u64 << (x.round() as u32).min(62))
    } else {
        String::new()
    }
}

/// A legend line: what a series looks like and what it is.
struct LegendEntry {
    label: String,
    color: RGBColor,
    width: u32,
    dashed: bool,
    marker: Option<Shape>,
}

#[derive(Clone, Copy)]
enum Shape {
    Circle,
    Triangle,
}

impl LegendEntry {
    fn line(label: impl Into<String>, color: RGBColor, width: u32) -> LegendEntry {
        LegendEntry { label: label.into(), color, width, dashed: false, marker: None }
    }

    fn dashed(mut self) -> LegendEntry {
        self.dashed = true;
        self
    }

    fn marked(mut self, shape: Shape) -> LegendEntry {
        self.marker = Some(shape);
        self
    }
}

/// The legend of one panel, in its own strip beside it (never on the data).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let font = (FAMILY, 13).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for (row, entry) in entries.iter().enumerate() {
        let y = 48 + 22 * row as i32;
        let style = entry.color.stroke_width(entry.width);
        if entry.dashed {
            for start in [6, 20] {
                area.draw(&PathElement::new(vec![(start, y), (start + 9, y)], style))
                    .map_err(|e| error(&e))?;
            }
        } else {
            area.draw(&PathElement::new(vec![(6, y), (34, y)], style)).map_err(|e| error(&e))?;
        }
        match entry.marker {
            Some(Shape::Circle) => area.draw(&Circle::new((20, y), 4, entry.color.filled())),
            Some(Shape::Triangle) => area.draw(&TriangleMarker::new((20, y), 5, entry.color.filled())),
            None => Ok(()),
        }
        .map_err(|e| error(&e))?;
        area.draw(&Text::new(entry.label.clone(), (42, y), font.clone())).map_err(|e| error(&e))?;
    }
    Ok(())
}

/// Latency ticks at 1, 2 and 5 of every decade in `range` (µs).
fn latency_ticks(range: &std::ops::Range<f64>) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(range.start.log10().floor());
    while decade <= range.end {
        for step in [1.0, 2.0, 5.0] {
            let tick = decade * step;
            if range.contains(&tick) {
                ticks.push(tick);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// A latency tick's label: as many decimals as its one significant digit needs (0.05, 2, 500).
fn latency_label(us: &f64) -> String {
    let decimals = (-us.log10().floor()).max(0.0) as usize;
    format!("{us:.decimals$}")
}

fn draw<DB: DrawingBackend>(report: &SweepReport, root: DrawingArea<DB, Shift>) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let (charts, legends) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let split = SIZE.1 * 11 / 20;
    let (top, bottom) = charts.split_vertically(split);
    let (top_legend, bottom_legend) = legends.split_vertically(split);
    let points = &report.points;
    let low = points.iter().map(|p| p.block_bytes).min().unwrap_or(4096);
    let high = points.iter().map(|p| p.block_bytes).max().unwrap_or(1 << 20);
    let x_range = (log2(low) - 0.25)..(log2(high) + 0.25);
    let powers = (log2(high).floor() - log2(low).ceil()) as usize + 1;
    let markers = markers(report);
    let axis = Axis { range: x_range, powers };
    draw_bandwidth(report, &top, &top_legend, &axis, &markers)?;
    draw_latency(report, &bottom, &bottom_legend, axis, &markers)?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

/// The block-size axis both panels share: its range (log2 of bytes) and its ticks.
struct Axis {
    range: std::ops::Range<f64>,
    powers: usize,
}

/// The bandwidth panel: plateau and 90 % lines, peak and median curves, the knee and the hints.
fn draw_bandwidth<DB: DrawingBackend>(
    report: &SweepReport,
    area: &DrawingArea<DB, Shift>,
    legend: &DrawingArea<DB, Shift>,
    axis: &Axis,
    markers: &[Marker],
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let (points, plateau) = (&report.points, report.plateau_gbps);
    let (x_range, powers) = (axis.range.clone(), axis.powers);
    // Bandwidth: from just under the slowest point (or the 90 % line) to just over the fastest.
    let fastest = points.iter().map(|p| p.peak_gbps.max(p.median_gbps)).fold(plateau, f64::max);
    let slowest = points.iter().map(|p| p.median_gbps).fold(0.9 * plateau, f64::min);
    let span = (fastest - slowest).max(fastest * 0.05);
    let y_range = (slowest - span * 0.08).max(0.0)..(fastest + span * 0.3);
    let mut bandwidth = ChartBuilder::on(area)
        .caption(
            format!(
                "{} from {}: bandwidth per block size ({} per transfer, {} iterations)",
                report.transport,
                report.source,
                format_bytes(report.transfer_bytes),
                report.iters
            ),
            (FAMILY, 18),
        )
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range.clone(), y_range.clone())
        .map_err(|e| error(&e))?;
    bandwidth
        .configure_mesh()
        .x_labels(powers.max(2))
        .x_label_formatter(&tick_label)
        .y_desc("GB/s")
        .x_desc("block size")
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(|e| error(&e))?;
    let mut bandwidth_legend = Vec::new();
    for (level, label, dashed) in [
        (plateau, format!("plateau {plateau:.3} GB/s (median of the 3 best)"), false),
        (0.9 * plateau, format!("90 % of plateau: {:.3} GB/s", 0.9 * plateau), true),
    ] {
        let style = PLATEAU.stroke_width(if dashed { 1 } else { 2 });
        let line: Vec<(f64, f64)> = vec![(x_range.start, level), (x_range.end, level)];
        if dashed {
            bandwidth.draw_series(DashedLineSeries::new(line, 6, 4, style)).map_err(|e| error(&e))?;
            bandwidth_legend.push(LegendEntry::line(label, PLATEAU, 1).dashed());
        } else {
            bandwidth.draw_series(LineSeries::new(line, style)).map_err(|e| error(&e))?;
            bandwidth_legend.push(LegendEntry::line(label, PLATEAU, 2));
        }
    }
    let median = bandwidth_series(points);
    let peak: Vec<(f64, f64)> = points.iter().map(|p| (log2(p.block_bytes), p.peak_gbps)).collect();
    bandwidth.draw_series(LineSeries::new(peak.clone(), PEAK.stroke_width(2))).map_err(|e| error(&e))?;
    bandwidth
        .draw_series(peak.iter().map(|&(x, y)| TriangleMarker::new((x, y), 5, PEAK.filled())))
        .map_err(|e| error(&e))?;
    bandwidth_legend.push(LegendEntry::line("peak (best iteration)", PEAK, 2).marked(Shape::Triangle));
    bandwidth.draw_series(LineSeries::new(median.clone(), MEDIAN.stroke_width(2))).map_err(|e| error(&e))?;
    bandwidth
        .draw_series(median.iter().map(|&(x, y)| Circle::new((x, y), 4, MEDIAN.filled())))
        .map_err(|e| error(&e))?;
    bandwidth_legend.push(
        LegendEntry::line("median of the timed transfers (plateau and knee read from it)", MEDIAN, 2)
            .marked(Shape::Circle),
    );
    draw_markers(&mut bandwidth, markers, y_range, true)?;
    for (index, marker) in markers.iter().enumerate() {
        let entry = LegendEntry::line(marker.label.clone(), marker.color, marker.width.min(5));
        bandwidth_legend.push(if coincides(markers, index) { entry.dashed() } else { entry });
    }
    draw_legend(legend, &bandwidth_legend)
}

/// The latency panel: p50 and p99 of one block at a time, on a log scale.
fn draw_latency<DB: DrawingBackend>(
    report: &SweepReport,
    area: &DrawingArea<DB, Shift>,
    legend: &DrawingArea<DB, Shift>,
    axis: Axis,
    markers: &[Marker],
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let (points, x_range, powers) = (&report.points, axis.range, axis.powers);
    // Latency: one block at a time, p50 and p99, log scale from the fastest p50 to the slowest p99,
    // ticked at 1, 2 and 5 of each decade.
    let fastest_us = points.iter().map(|p| p.p50_us).fold(f64::INFINITY, f64::min).max(0.01);
    let slowest_us = points.iter().map(|p| p.p99_us).fold(fastest_us, f64::max);
    let latency_range = (fastest_us / 1.3)..(slowest_us * 1.6);
    let ticks = latency_ticks(&latency_range);
    let mut latency = ChartBuilder::on(area)
        .caption("latency of one block (p50 and p99)", (FAMILY, 16))
        .margin(10)
        .x_label_area_size(34)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range, latency_range.clone().log_scale().with_key_points(ticks))
        .map_err(|e| error(&e))?;
    latency
        .configure_mesh()
        .x_labels(powers.max(2))
        .x_label_formatter(&tick_label)
        .y_label_formatter(&latency_label)
        .y_desc("µs")
        .x_desc("block size")
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| error(&e))?;
    let mut latency_legend = Vec::new();
    for (name, color, pick) in [
        ("p50", P50, (|p: &crate::sweep::Point| p.p50_us) as fn(&crate::sweep::Point) -> f64),
        ("p99", P99, |p: &crate::sweep::Point| p.p99_us),
    ] {
        let series: Vec<(f64, f64)> =
            points.iter().map(|p| (log2(p.block_bytes), pick(p).max(latency_range.start))).collect();
        latency.draw_series(LineSeries::new(series.clone(), color.stroke_width(2))).map_err(|e| error(&e))?;
        latency
            .draw_series(series.iter().map(|&(x, y)| Circle::new((x, y), 4, color.filled())))
            .map_err(|e| error(&e))?;
        latency_legend.push(LegendEntry::line(name, color, 2).marked(Shape::Circle));
    }
    draw_markers(&mut latency, markers, latency_range, false)?;
    latency_legend.push(LegendEntry::line("knee and hints: as above", RGBColor(120, 120, 120), 1));
    draw_legend(legend, &latency_legend)
}

/// Whether marker `index` sits on the block of an earlier one (then it is drawn dashed, so the
/// earlier shows through its gaps).
fn coincides(markers: &[Marker], index: usize) -> bool {
    markers[..index].iter().any(|earlier| earlier.bytes == markers[index].bytes)
}

/// Vertical lines at the knee and the hints; wide ones first so a hint on the knee stays
/// visible, and a hint on the block of another dashed, so both do. On the bandwidth panel each
/// gets a label of its own height, so labels of coinciding markers do not overlap.
fn draw_markers<DB: DrawingBackend, Y>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    markers: &[Marker],
    y_range: std::ops::Range<f64>,
    labelled: bool,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let x_range = chart.x_range();
    let middle = (x_range.start + x_range.end) / 2.0;
    for (row, marker) in markers.iter().enumerate() {
        let x = log2(marker.bytes);
        let line = vec![(x, y_range.start), (x, y_range.end)];
        let style = marker.color.mix(if marker.width > 2 { 0.45 } else { 1.0 }).stroke_width(marker.width);
        if coincides(markers, row) {
            chart.draw_series(DashedLineSeries::new(line, 8, 8, style)).map_err(|e| error(&e))?;
        } else {
            chart.draw_series(LineSeries::new(line, style)).map_err(|e| error(&e))?;
        }
        if labelled {
            // Labels hang from the top, one row each, on the right of their line.
            let y = y_range.end - (y_range.end - y_range.start) * (0.05 + 0.065 * row as f64);
            // Right of the line in the left half, left of it in the right half: inside the chart.
            let font = (FAMILY, 13).into_font().color(&marker.color);
            let (at, font) = if x <= middle {
                (x + 0.06, font.pos(Pos::new(HPos::Left, VPos::Center)))
            } else {
                (x - 0.06, font.pos(Pos::new(HPos::Right, VPos::Center)))
            };
            chart
                .draw_series(std::iter::once(Text::new(marker.label.clone(), (at, y), font)))
                .map_err(|e| error(&e))?;
        }
    }
    Ok(())
}

/// The bandwidth curve drawn: each size's median, what the plateau, the knee and every
/// verdict are read from (the average drew every point below the plateau line, and the knee's
/// own point below its 90 % line).
fn bandwidth_series(points: &[crate::sweep::Point]) -> Vec<(f64, f64)> {
    points.iter().map(|p| (log2(p.block_bytes), p.median_gbps)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_ticks_fall_at_one_two_and_five_of_each_decade() {
        assert_eq!(latency_ticks(&(0.7..60.0)), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(latency_ticks(&(0.04..0.3)), vec![0.05, 0.1, 0.2]);
        assert_eq!(latency_label(&0.05), "0.05");
        assert_eq!(latency_label(&2.0), "2");
        assert_eq!(latency_label(&500.0), "500");
    }

    /// The knee's own point sits on or above the 90 % line it was read from: the curve drawn
    /// is the medians (the averages of #52's report put it at 4.01 GB/s under a 4.28 line).
    #[test]
    fn the_curve_drawn_is_the_one_the_verdicts_read() {
        let point = |block_bytes: u64, avg_gbps: f64, median_gbps: f64| crate::sweep::Point {
            block_bytes,
            avg_gbps,
            median_gbps,
            peak_gbps: median_gbps * 1.05,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            max_us: 4.0,
            sharpness: 2.0,
            cpu_util: 1.0,
            is_hint: false,
            hints: Vec::new(),
        };
        let points = [point(128 << 10, 3.2, 3.9), point(256 << 10, 4.01, 4.76), point(512 << 10, 4.5, 4.8)];
        let plateau = 4.76;
        let drawn = bandwidth_series(&points);
        assert_eq!(drawn[1], (18.0, 4.76));
        assert!(drawn[1].1 >= 0.9 * plateau, "the knee's point under its own 90 % line");
    }
}
