//! The sweep's SVG: bandwidth and p99 latency against block size on log axes, knee and hint
//! marked. Text is laid out with the DejaVu Sans font shipped in `assets/`, so no system fonts
//! are needed.

use crate::sweep::SweepReport;
use plotters::prelude::*;
use std::path::Path;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() -> anyhow::Result<()> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the shipped font is invalid"))
}

/// Writes the plot to `path`.
pub(crate) fn write_svg(report: &SweepReport, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let error = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting {}: {e}", path.display());
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let (top, bottom) = root.split_vertically(270);
    let x_range = {
        let low = report.points.iter().map(|p| p.block_bytes).min().unwrap_or(4096) as f64;
        let high = report.points.iter().map(|p| p.block_bytes).max().unwrap_or(1 << 20) as f64;
        (low / 1.5)..(high * 1.5)
    };
    let bandwidth_top = report.plateau_gbps.max(1e-3) * 1.2;
    let mut bandwidth = ChartBuilder::on(&top)
        .caption(format!("{} from {}: bandwidth", report.transport, report.source), ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range.clone().log_scale(), 0.0..bandwidth_top)
        .map_err(|e| error(&e))?;
    bandwidth
        .configure_mesh()
        .x_desc("block bytes")
        .y_desc("GB/s")
        .x_label_formatter(&|x| crate::units::format_bytes(*x as u64))
        .draw()
        .map_err(|e| error(&e))?;
    let curve: Vec<(f64, f64)> = report.points.iter().map(|p| (p.block_bytes as f64, p.avg_gbps)).collect();
    bandwidth.draw_series(LineSeries::new(curve.clone(), &BLUE)).map_err(|e| error(&e))?;
    bandwidth
        .draw_series(curve.iter().map(|&(x, y)| Circle::new((x, y), 3, BLUE.filled())))
        .map_err(|e| error(&e))?;
    for (bytes, color, label) in [(report.knee_bytes, &GREEN, "knee"), (report.hint_bytes, &RED, "hint")] {
        let x = bytes as f64;
        bandwidth
            .draw_series(LineSeries::new(vec![(x, 0.0), (x, bandwidth_top)], color))
            .map_err(|e| error(&e))?
            .label(format!("{label} {}", crate::units::format_bytes(bytes)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    bandwidth
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| error(&e))?;

    let latency_top = report.points.iter().map(|p| p.p99_us).fold(1.0, f64::max) * 2.0;
    let mut latency = ChartBuilder::on(&bottom)
        .caption("p99 latency per block", ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range.log_scale(), (0.1..latency_top).log_scale())
        .map_err(|e| error(&e))?;
    latency
        .configure_mesh()
        .x_desc("block bytes")
        .y_desc("µs")
        .x_label_formatter(&|x| crate::units::format_bytes(*x as u64))
        .draw()
        .map_err(|e| error(&e))?;
    let p99: Vec<(f64, f64)> =
        report.points.iter().map(|p| (p.block_bytes as f64, p.p99_us.max(0.1))).collect();
    latency.draw_series(LineSeries::new(p99, &MAGENTA)).map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}
