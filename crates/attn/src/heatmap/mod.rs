//! Attention heatmaps: one `[Lq, Lk]` matrix, or a grid with one panel per head, written as PNG, SVG
//! or JPEG by the path's extension ([`PictureFormat::from_path`]; any other extension is refused
//! before anything is drawn).
//!
//! Entry points: [`draw_heatmap`] and [`draw_head_grid`] take row-major `f32` slices; [`draw_tensor`]
//! takes a candle tensor of rank 2 to 4 and an optional [`Mask`]; [`draw_block_mask`] draws a
//! block-sparse mask itself, its 64×64 blocks visible. Each accepts a keep-mask: masked
//! cells are drawn light grey and hatched, without a value, stay out of the colour scale, and the
//! colour bar gets a `masked` legend entry (a masked weight is 0, like a tiny one: the mask is what
//! tells them apart).
//!
//! Rows run top to bottom from row 0, columns left to right from column 0; the axis titles are
//! `Query` and `Key` unless the style names others (for a tensor that is not attention weights).
//! Colours follow viridis on a scale from `min(0, smallest value)` to `max(0, largest value)`, shown
//! by a colour bar with tick values; a grid shares one scale across its panels. Small matrices (at
//! most 16×16, with cells wide enough) show each value with 2 decimals in black or white, whichever
//! contrasts more with the cell. Large matrices are drawn with at most 640 blocks per axis (480 or
//! fewer in a grid), each block showing the mean of the kept cells it covers.
//!
//! Non-finite values (NaN, ±inf) are not rejected: their cells are drawn grey and crossed out (or
//! labelled `NaN`/`inf`/`-inf` when values are shown), they stay out of the colour scale, and the colour
//! bar gets a legend entry for them. A block that covers any kept non-finite value is drawn that way too.
//!
//! Text uses DejaVu Sans embedded in the crate (`assets/`), so drawing needs no system fonts.

mod block_mask;
mod draw;
mod layout;
mod scale;
mod validate;

use std::path::Path;

use candle_core::{DType, Tensor};

use crate::error::AttnLibError;
use crate::mask::Mask;
use crate::picture::{PictureFormat, PictureFormatError};
use scale::ColorScale;

pub use block_mask::{draw_block_mask, MAX_MASK_CELLS};

/// Labels and titles of a heatmap.
#[derive(Debug, Clone, Default)]
pub struct HeatmapStyle {
    /// Title above the picture.
    pub title: Option<String>,
    /// One label per row, `[Lq]`; row indices when `None`.
    pub query_labels: Option<Vec<String>>,
    /// One label per column, `[Lk]`; column indices when `None`.
    pub key_labels: Option<Vec<String>>,
    /// Title of the row axis; `Query` when `None`.
    pub row_title: Option<String>,
    /// Title of the column axis; `Key` when `None`.
    pub column_title: Option<String>,
}

/// Why a heatmap could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("heatmap {path}: {kind}")]
pub struct HeatmapError {
    /// The output file.
    pub path: String,
    /// What went wrong (boxed: it may hold a whole [`AttnLibError`], and a `Result` should stay
    /// small).
    pub kind: Box<HeatmapErrorKind>,
}

/// What kept a heatmap from being drawn.
#[derive(Debug, thiserror::Error)]
pub enum HeatmapErrorKind {
    /// The path's extension names no picture format this crate writes.
    #[error(transparent)]
    Format(#[from] PictureFormatError),
    /// [`draw_tensor`]'s values or mask have an unusable rank, shape or dtype (the tensor is named
    /// `values` or `mask`), or candle failed to read them.
    #[error(transparent)]
    Tensor(#[from] AttnLibError),
    /// Sizes or label counts that do not fit, a picture too large, or a file that cannot be written.
    #[error("{0}")]
    Draw(String),
}

/// The cells of a figure: `heads` matrices `[Lq, Lk]` of values, row-major, and their keep flags.
#[derive(Debug, Clone, Copy)]
struct Cells<'a> {
    values: &'a [f32],
    /// `true` = kept, `false` = masked; same layout as `values`.
    keep: Option<&'a [bool]>,
    /// `None` for a single heatmap without a panel title.
    heads: Option<usize>,
    lq: usize,
    lk: usize,
}

/// Draws one heatmap of `weights: [Lq, Lk]` (row-major) to `path` (PNG, SVG or JPEG by extension),
/// with the cells where `keep: [Lq, Lk]` is `false` drawn as masked.
///
/// Fails, writing nothing, when the extension is not `.png`, `.svg`, `.jpg` or `.jpeg`, `lq` or `lk`
/// is 0, `weights` or `keep` does not hold `lq * lk` values, a label list has the wrong length, or the
/// file cannot be written.
pub fn draw_heatmap(
    path: &Path,
    weights: &[f32],
    keep: Option<&[bool]>,
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    draw_figure(path, Cells { values: weights, keep, heads: None, lq, lk }, style)
}

/// Draws a grid with one panel per head of `weights: [H, Lq, Lk]` (row-major) to `path` (PNG, SVG
/// or JPEG by extension), with the cells where `keep: [H, Lq, Lk]` is `false` drawn as masked.
///
/// Panels are titled `head h`, laid out in a near-square grid and share one colour scale. Fails, writing
/// nothing, when the extension is not a picture's, `heads`, `lq` or `lk` is 0, `weights` or `keep` does
/// not hold `heads * lq * lk` values, a label list has the wrong length, the picture would be
/// unreasonably large, or the file cannot be written.
pub fn draw_head_grid(
    path: &Path,
    weights: &[f32],
    keep: Option<&[bool]>,
    heads: usize,
    lq: usize,
    lk: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    draw_figure(path, Cells { values: weights, keep, heads: Some(heads), lq, lk }, style)
}

/// Draws `values` to `path` (PNG, SVG or JPEG by extension): rank 2 `[Lq, Lk]` as one heatmap,
/// rank 3 `[H, Lq, Lk]` or rank 4 `[1, H, Lq, Lk]` as a grid of heads (pick a batch entry of a
/// larger batch with `values.get(b)`). Any float dtype, on any device. `mask`, when given, must
/// broadcast (right-aligned) to `values`' shape: its masked cells are drawn as masked, so
/// [`padding_mask`](crate::padding_mask)'s `[B, 1, 1, Lk]` mask of batch entry `b` is
/// `Mask::keep(mask.tensor().get(b)?)`.
///
/// Fails with [`HeatmapErrorKind::Tensor`] naming `values` or `mask` and the expected shape or dtype,
/// and otherwise as [`draw_heatmap`] and [`draw_head_grid`] do; nothing is written on failure.
pub fn draw_tensor(
    path: &Path,
    values: &Tensor,
    mask: Option<&Mask>,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    let fail = |kind: HeatmapErrorKind| HeatmapError { path: path.display().to_string(), kind: Box::new(kind) };
    let (heads, lq, lk) = match *values.dims() {
        [lq, lk] => (None, lq, lk),
        [h, lq, lk] | [1, h, lq, lk] => (Some(h), lq, lk),
        _ => {
            return Err(fail(
                AttnLibError::Shape {
                    tensor: "values",
                    found: values.dims().to_vec(),
                    expected: "rank 2 [Lq, Lk], 3 [H, Lq, Lk] or 4 [1, H, Lq, Lk] (pick a batch entry with .get(b))"
                        .into(),
                }
                .into(),
            ))
        }
    };
    let data = tensor_values(values).map_err(|e| fail(e.into()))?;
    let keep = mask.map(|m| keep_flags(m, values.dims())).transpose().map_err(|e| fail(e.into()))?;
    draw_figure(path, Cells { values: &data, keep: keep.as_deref(), heads, lq, lk }, style)
}

/// The elements of float tensor `t` as `f32`, row-major.
fn tensor_values(t: &Tensor) -> Result<Vec<f32>, AttnLibError> {
    match t.dtype() {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?),
        found => Err(AttnLibError::DType { tensor: "values", found, expected: "a float dtype (f16, bf16, f32, f64)" }),
    }
}

/// The keep flags of `mask` broadcast to `shape`, row-major.
fn keep_flags(mask: &Mask, shape: &[usize]) -> Result<Vec<bool>, AttnLibError> {
    let keep = mask.to_keep_tensor()?;
    let broadcast = keep.broadcast_as(shape).map_err(|_| AttnLibError::Shape {
        tensor: "mask",
        found: mask.shape().to_vec(),
        expected: format!("broadcastable to the values' shape {shape:?}"),
    })?;
    Ok(broadcast.flatten_all()?.to_vec1::<u8>()?.into_iter().map(|k| k != 0).collect())
}

/// Shared body of the entry points: checks the format and the cells, lays out and writes.
fn draw_figure(path: &Path, cells: Cells, style: &HeatmapStyle) -> Result<(), HeatmapError> {
    draw_figure_on(path, cells, style, None)
}

/// [`draw_figure`] on the colour scale `fixed`, or when `None` on the kept values' own.
fn draw_figure_on(
    path: &Path,
    cells: Cells,
    style: &HeatmapStyle,
    fixed: Option<ColorScale>,
) -> Result<(), HeatmapError> {
    let fail = |kind: HeatmapErrorKind| HeatmapError { path: path.display().to_string(), kind: Box::new(kind) };
    let format = PictureFormat::from_path(path).map_err(|e| fail(e.into()))?;
    let draw = |reason: String| fail(HeatmapErrorKind::Draw(reason));
    validate::check(&cells, style).map_err(draw)?;
    crate::picture::font::ensure_registered().map_err(draw)?; // the layout measures text
    let kept: Vec<f32> = match cells.keep {
        Some(keep) => cells.values.iter().zip(keep).filter(|(_, &k)| k).map(|(&v, _)| v).collect(),
        None => cells.values.to_vec(),
    };
    let scale = fixed.unwrap_or_else(|| ColorScale::from_weights(&kept));
    let legend = layout::Legend {
        non_finite: kept.iter().any(|w| !w.is_finite()),
        masked: cells.keep.is_some_and(|k| k.contains(&false)),
    };
    let figure = layout::Figure::new(cells.heads, cells.lq, cells.lk, style, &scale, legend).map_err(draw)?;
    let picture = draw::Picture { fig: &figure, values: cells.values, keep: cells.keep, scale: &scale };
    crate::picture::write(path, format, &picture).map_err(draw)
}
