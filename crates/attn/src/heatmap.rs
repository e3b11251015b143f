//! Attention heatmaps.

use std::path::Path;

/// Labels and title of a heatmap.
#[derive(Debug, Clone, Default)]
pub struct HeatmapStyle {
    /// Title above the picture.
    pub title: Option<String>,
    /// One label per query row, `[Lq]`.
    pub query_labels: Option<Vec<String>>,
    /// One label per key column, `[Lk]`.
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

/// Draws one heatmap of `weights: [Lq, Lk]` (row-major) to `path` (PNG, or SVG when it ends in `.svg`).
pub fn draw_heatmap(
    path: &Path,
    weights: &[f32],
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    let _ = (weights, lq, lk, style);
    Err(HeatmapError { path: path.display().to_string(), reason: "not implemented yet".into() })
}

/// Draws a grid with one panel per head of `weights: [H, Lq, Lk]` (row-major) to `path`.
pub fn draw_head_grid(
    path: &Path,
    weights: &[f32],
    heads: usize,
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    let _ = (weights, heads, lq, lk, style);
    Err(HeatmapError { path: path.display().to_string(), reason: "not implemented yet".into() })
}
