//! Attention heatmaps: one `[Lq, Lk]` weight matrix, or a grid with one panel per head, written as PNG,
//! SVG or JPEG by the path's extension ([`PictureFormat::from_path`](crate::picture::PictureFormat::from_path);
//! any other extension is refused before anything is drawn).
//!
//! Rows run top to bottom from query 0, columns left to right from key 0. Colours follow viridis on a
//! scale from `min(0, smallest weight)` to `max(0, largest weight)`, shown by a colour bar with tick
//! values; a grid shares one scale across its panels. Small matrices (at most 16×16, with cells wide
//! enough) show each value with 2 decimals in black or white, whichever contrasts more with the cell.
//! Large matrices are drawn with at most 640 blocks per axis (480 or fewer in a grid), each block showing the
//! mean of the cells it covers.
//!
//! Non-finite weights (NaN, ±inf) are not rejected: their cells are drawn grey and crossed out (or
//! labelled `NaN`/`inf`/`-inf` when values are shown), they stay out of the colour scale, and the colour
//! bar gets a legend entry for them. A block that covers any non-finite weight is drawn that way too.
//!
//! Text uses DejaVu Sans embedded in the crate (`assets/`), so drawing needs no system fonts.

mod draw;
mod layout;
mod scale;
mod validate;

use std::path::Path;

use crate::picture::PictureFormat;
use scale::ColorScale;

/// Labels and title of a heatmap.
#[derive(Debug, Clone, Default)]
pub struct HeatmapStyle {
    /// Title above the picture.
    pub title: Option<String>,
    /// One label per query row, `[Lq]`; row indices when `None`.
    pub query_labels: Option<Vec<String>>,
    /// One label per key column, `[Lk]`; column indices when `None`.
    pub key_labels: Option<Vec<String>>,
}

/// Why a heatmap could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("heatmap {path}: {reason}")]
pub struct HeatmapError {
    /// The output file.
    pub path: String,
    /// What went wrong.
    pub reason: String,
}

/// Draws one heatmap of `weights: [Lq, Lk]` (row-major) to `path` (PNG, SVG or JPEG by extension).
///
/// Fails, writing nothing, when the extension is not `.png`, `.svg`, `.jpg` or `.jpeg`, `lq` or `lk` is 0, `weights.len() != lq * lk`, a label list has the
/// wrong length, or the file cannot be written.
pub fn draw_heatmap(
    path: &Path,
    weights: &[f32],
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    draw_figure(path, weights, None, lq, lk, style)
}

/// Draws a grid with one panel per head of `weights: [H, Lq, Lk]` (row-major) to `path` (PNG, SVG or
/// JPEG by extension).
///
/// Panels are titled `head h`, laid out in a near-square grid and share one colour scale. Fails, writing
/// nothing, when the extension is not a picture's, `heads`, `lq` or `lk` is 0, `weights.len() != heads * lq * lk`, a label list has the
/// wrong length, the picture would be unreasonably large, or the file cannot be written.
pub fn draw_head_grid(
    path: &Path,
    weights: &[f32],
    heads: usize,
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    draw_figure(path, weights, Some(heads), lq, lk, style)
}

/// Shared body of both entry points; `heads` is `None` for a single heatmap without panel titles.
fn draw_figure(
    path: &Path,
    weights: &[f32],
    heads: Option<usize>,
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    let fail = |reason: String| HeatmapError { path: path.display().to_string(), reason };
    let format = PictureFormat::from_path(path).map_err(|e| fail(e.to_string()))?;
    validate::check(weights, heads, lq, lk, style).map_err(fail)?;
    crate::picture::font::ensure_registered().map_err(fail)?; // the layout measures text
    let scale = ColorScale::from_weights(weights);
    let has_non_finite = weights.iter().any(|w| !w.is_finite());
    let figure = layout::Figure::new(heads, lq, lk, style, &scale, has_non_finite).map_err(fail)?;
    crate::picture::write(path, format, &draw::Picture { fig: &figure, weights, scale: &scale }).map_err(fail)
}
