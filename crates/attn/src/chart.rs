//! Line charts of experiment results and training curves: several named series of `(x, y)` points
//! on shared axes, linear or base-10 logarithmic, written as PNG, SVG or JPEG by the path's extension
//! ([`PictureFormat::from_path`]) with the embedded font, so drawing needs no system fonts. Nothing is
//! written on failure, and an unknown extension is refused before anything is drawn.
//!
//! Logarithmic axes plot `log10` of the values with ticks labelled in the original units; points
//! that are not finite, or not positive on a logarithmic axis, are left out of their line.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::{
    ChartBuilder, Circle, DrawingArea, DrawingBackend, IntoFont, LineSeries, Palette, Palette99, PathElement, BLACK,
    WHITE,
};
use plotters::style::Color;

use crate::picture::font::FAMILY;
use crate::picture::{write, PictureFormat, Render};

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels and scales, and its lines.
#[derive(Debug, Clone, Default)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// Label of the horizontal axis.
    pub x_label: String,
    /// Label of the vertical axis.
    pub y_label: String,
    /// Logarithmic horizontal axis.
    pub log_x: bool,
    /// Logarithmic vertical axis.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
}

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("chart {path}: {reason}")]
pub struct ChartError {
    /// The output file.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// Draws `chart` to `path` (800×500 pixels). Fails, writing nothing, when the extension is not
/// `.png`, `.svg`, `.jpg` or `.jpeg`, no series has a drawable point or the file cannot be written.
pub fn draw_lines(path: &Path, chart: &LineChart) -> Result<(), ChartError> {
    let fail = |reason: String| ChartError { path: path.display().to_string(), reason };
    let format = PictureFormat::from_path(path).map_err(|e| fail(e.to_string()))?;
    let lines: Vec<Vec<(f64, f64)>> =
        chart.series.iter().map(|s| s.points.iter().filter_map(|&p| chart.place(p)).collect()).collect();
    let all: Vec<(f64, f64)> = lines.iter().flatten().copied().collect();
    if all.is_empty() {
        return Err(fail("no series has a drawable point".into()));
    }
    let span = |v: &mut dyn Iterator<Item = f64>| -> (f64, f64) {
        let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let pad = if hi > lo { (hi - lo) * 0.05 } else { 0.5 };
        (lo - pad, hi + pad)
    };
    let x = span(&mut all.iter().map(|p| p.0));
    let y = span(&mut all.iter().map(|p| p.1));
    write(path, format, &Picture { chart, lines, x, y }).map_err(fail)
}

impl LineChart {
    /// `(x, y)` in plot coordinates, or `None` when it cannot be drawn.
    fn place(&self, (x, y): (f64, f64)) -> Option<(f64, f64)> {
        let axis = |v: f64, log: bool| match (log, v.is_finite()) {
            (_, false) => None,
            (true, _) if v <= 0.0 => None,
            (true, _) => Some(v.log10()),
            (false, _) => Some(v),
        };
        Some((axis(x, self.log_x)?, axis(y, self.log_y)?))
    }
}

struct Picture<'a> {
    chart: &'a LineChart,
    /// Per series, its points in plot coordinates.
    lines: Vec<Vec<(f64, f64)>>,
    x: (f64, f64),
    y: (f64, f64),
}

/// Tick text of plot coordinate `v` with three significant digits: the value itself, or `10^v`
/// on a logarithmic axis.
fn tick(v: f64, log: bool) -> String {
    let v = if log { 10f64.powf(v) } else { v };
    if v == 0.0 {
        return "0".into();
    }
    let magnitude = v.abs().log10().floor();
    if !(-3.0..5.0).contains(&magnitude) {
        return format!("{v:.2e}");
    }
    format!("{v:.*}", (2.0 - magnitude).max(0.0) as usize)
}

impl Render for Picture<'_> {
    fn size(&self) -> (u32, u32) {
        (800, 500)
    }

    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let err = |e: plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        area.fill(&WHITE).map_err(err)?;
        let c = self.chart;
        let mut plot = ChartBuilder::on(area)
            .caption(&c.title, (FAMILY, 22).into_font())
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(self.x.0..self.x.1, self.y.0..self.y.1)
            .map_err(err)?;
        plot.configure_mesh()
            .x_desc(&c.x_label)
            .y_desc(&c.y_label)
            .label_style((FAMILY, 13).into_font())
            .axis_desc_style((FAMILY, 15).into_font())
            .x_label_formatter(&|v| tick(*v, c.log_x))
            .y_label_formatter(&|v| tick(*v, c.log_y))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (i, (series, points)) in c.series.iter().zip(&self.lines).enumerate() {
            let colour = Palette99::pick(i).to_rgba();
            plot.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(err)?;
            plot.draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
                .map_err(err)?
                .label(&series.name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        }
        plot.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 13).into_font())
            .draw()
            .map_err(err)?;
        Ok(())
    }
}
