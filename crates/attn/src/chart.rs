//! Line charts of experiment results and training curves: several named series of `(x, y)` points
//! on shared axes, linear or base-10 logarithmic, written as PNG, SVG or JPEG by the path's extension
//! ([`PictureFormat::from_path`]) with the embedded font, so drawing needs no system fonts. Nothing is
//! written on failure, and an unknown extension is refused before anything is drawn.
//!
//! Logarithmic axes plot `log10` of the values with ticks labelled in the original units; points
//! that are not finite, or not positive on a logarithmic axis, are left out of their line.
//! [`log_log_slope`] fits the exponent of a power law to points, as a log-log chart shows it.
//!
//! Series are told apart by more than colour, so lines that coincide stay visible: every second
//! series is dashed with hollow, larger markers (rings), the others solid with filled dots.
//! The legend goes in the first corner (upper right, upper left, lower right, lower left) where it
//! covers no line or point; when every corner would, the vertical axis grows to make room above.

use std::path::Path;

use plotters::chart::SeriesLabelPosition;
use plotters::coord::Shift;
use plotters::element::IntoDynElement;
use plotters::prelude::{
    ChartBuilder, Circle, DashedLineSeries, DrawingArea, DrawingBackend, EmptyElement, IntoFont, LineSeries, Palette,
    Palette99, PathElement, BLACK, WHITE,
};
use plotters::style::{Color, RGBAColor, ShapeStyle};

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
    let (legend, y) = legend_place(chart, &lines, x, y);
    write(path, format, &Picture { chart, lines, x, y, legend }).map_err(fail)
}

/// The slope of the least-squares line through `(log x, log y)` of the points with both
/// coordinates positive and finite: the exponent `k` of a power law `y ∝ x^k` that a log-log
/// chart shows as a straight line. `None` with fewer than two such points of different `x`.
pub fn log_log_slope(points: &[(f64, f64)]) -> Option<f64> {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    let n = logs.len() as f64;
    let (mx, my) = (logs.iter().map(|p| p.0).sum::<f64>() / n, logs.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (logs.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
}

/// Pixels of the plotting area (the picture less margins, caption and axis labels), about.
const PLOT_PIXELS: (f64, f64) = (696.0, 380.0);

/// Where the legend of `chart` covers none of `lines` (plot coordinates in the ranges `x`, `y`),
/// and the vertical range to draw: `y` itself, or `y` grown upwards to make room above the data
/// when every corner is taken.
fn legend_place(
    chart: &LineChart,
    lines: &[Vec<(f64, f64)>],
    x: (f64, f64),
    y: (f64, f64),
) -> (SeriesLabelPosition, (f64, f64)) {
    // The legend's size as a fraction of the plot, with a margin: rows of 20 px, glyph and text.
    let longest = chart.series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0) as f64;
    let width = (48.0 + 7.5 * longest) / PLOT_PIXELS.0 + 0.03;
    let height = (14.0 + 20.0 * chart.series.len() as f64) / PLOT_PIXELS.1 + 0.04;
    // Points along every line in [0, 1]², 32 per segment.
    let unit = |(px, py): (f64, f64)| ((px - x.0) / (x.1 - x.0), (py - y.0) / (y.1 - y.0));
    let mut samples: Vec<(f64, f64)> = Vec::new();
    for line in lines {
        samples.extend(line.iter().map(|&p| unit(p)));
        for w in line.windows(2) {
            let (a, b) = (unit(w[0]), unit(w[1]));
            samples.extend((1..32).map(|k| {
                let t = f64::from(k) / 32.0;
                (a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1))
            }));
        }
    }
    let corners = [
        (SeriesLabelPosition::UpperRight, 1.0 - width, 1.0 - height),
        (SeriesLabelPosition::UpperLeft, 0.0, 1.0 - height),
        (SeriesLabelPosition::LowerRight, 1.0 - width, 0.0),
        (SeriesLabelPosition::LowerLeft, 0.0, 0.0),
    ];
    for (position, left, bottom) in corners {
        let covers = |&(sx, sy): &(f64, f64)| sx >= left && sx <= left + width && sy >= bottom && sy <= bottom + height;
        if !samples.iter().any(covers) {
            return (position, y);
        }
    }
    // The data keep the lower `1 - height` of the plot, less a small gap; the legend has the rest.
    let top = y.0 + (y.1 - y.0) / (1.0 - height - 0.02).max(0.2);
    (SeriesLabelPosition::UpperRight, (y.0, top))
}

/// How series `i` is drawn: every second series dashed with hollow, larger markers, so one that
/// coincides with the series before it leaves that one visible (solid line through the dashes,
/// filled markers inside the rings).
#[derive(Debug, Clone, Copy)]
struct Look {
    colour: RGBAColor,
    dashed: bool,
}

impl Look {
    fn of(i: usize) -> Self {
        Self { colour: Palette99::pick(i).to_rgba(), dashed: i % 2 == 1 }
    }

    fn line(self) -> ShapeStyle {
        self.colour.stroke_width(2)
    }

    /// The marker at `at`: a filled dot, or a ring around where the dot would be when dashed.
    fn marker<C>(self, at: C) -> Circle<C, i32> {
        if self.dashed {
            Circle::new(at, 5, self.colour.stroke_width(2))
        } else {
            Circle::new(at, 3, self.colour.filled())
        }
    }

    /// The legend's sample: 18 pixels of the line (dashed like the series) with the marker.
    fn sample<'a, DB: DrawingBackend + 'a>(self, at: (i32, i32)) -> impl IntoDynElement<'a, DB, (i32, i32)> {
        let stretch = if self.dashed { [(0, 4), (7, 11), (14, 18)] } else { [(0, 6), (6, 12), (12, 18)] };
        let [a, b, c] = stretch.map(|(from, to)| PathElement::new([(from, 0), (to, 0)], self.line()));
        EmptyElement::at(at) + a + b + c + self.marker((9, 0))
    }
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
    legend: SeriesLabelPosition,
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
            let look = Look::of(i);
            let line = points.iter().copied();
            let drawn = if look.dashed {
                plot.draw_series(DashedLineSeries::new(line, 8, 5, look.line()))
            } else {
                plot.draw_series(LineSeries::new(line, look.line()))
            };
            drawn.map_err(err)?.label(&series.name).legend(move |at| look.sample(at));
            plot.draw_series(points.iter().map(|&at| look.marker(at))).map_err(err)?;
        }
        plot.configure_series_labels()
            .position(self.legend.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FAMILY, 13).into_font())
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(series: usize) -> LineChart {
        let series = (0..series).map(|i| Series { name: format!("series {i}"), points: Vec::new() }).collect();
        LineChart { series, ..LineChart::default() }
    }

    /// A rising diagonal fills the upper-right and lower-left corners: the legend goes upper left.
    #[test]
    fn the_legend_takes_a_corner_free_of_data() {
        let diagonal: Vec<(f64, f64)> = (0..=10).map(|i| (f64::from(i) / 10.0, f64::from(i) / 10.0)).collect();
        let (position, y) = legend_place(&chart(2), &[diagonal], (0.0, 1.0), (0.0, 1.0));
        assert!(matches!(position, SeriesLabelPosition::UpperLeft), "{position:?}");
        assert_eq!(y, (0.0, 1.0));
    }

    /// Lines along the top and the bottom leave no corner: the vertical axis grows so the data keep
    /// below the legend.
    #[test]
    fn with_every_corner_taken_the_axis_makes_room_above() {
        let top = vec![(0.0, 1.0), (1.0, 1.0)];
        let bottom = vec![(0.0, 0.0), (1.0, 0.0)];
        let (position, (lo, hi)) = legend_place(&chart(4), &[top.clone(), bottom], (0.0, 1.0), (0.0, 1.0));
        assert!(matches!(position, SeriesLabelPosition::UpperRight), "{position:?}");
        let (again, _) = legend_place(&chart(4), &[top], (0.0, 1.0), (lo, hi));
        assert!(matches!(again, SeriesLabelPosition::UpperRight) && hi > 1.2, "{again:?}, top {hi}");
    }
}
