//! A [`BlockMask`] drawn as a heatmap ([`draw_block_mask`]): which query may attend which key, with
//! the 64×64 block structure visible.

use std::path::Path;

use attn_kernels::sparse::{BlockMask, SPARSE_BLOCK};

use super::scale::ColorScale;
use super::{draw_figure_on, Cells, HeatmapError, HeatmapErrorKind, HeatmapStyle};

/// The most cells [`draw_block_mask`] lays out (`Lq·Lk`): 4096 × 4096.
pub const MAX_MASK_CELLS: usize = 1 << 24;

/// Draws the mask of `(b, h)` of `mask` alone (`[Lq, Lk]`) to `path` (PNG, SVG or JPEG by
/// extension): an allowed pair is coloured by the share of its 64×64 block's pairs that are
/// allowed, on a scale from 0 to 1 (1 in a full block, less in a partial one, so blocks show as
/// tiles of one colour), a pair the mask forbids is drawn as masked (every pair of an empty
/// block). Fails, writing nothing, as [`draw_heatmap`](super::draw_heatmap) does, and when
/// `Lq·Lk` is over [`MAX_MASK_CELLS`].
pub fn draw_block_mask(
    path: &Path,
    mask: &BlockMask,
    b: usize,
    h: usize,
    style: &HeatmapStyle,
) -> Result<(), HeatmapError> {
    let shape = mask.shape();
    let (lq, lk) = (shape.lq, shape.lk);
    if lq.saturating_mul(lk) > MAX_MASK_CELLS {
        let reason = format!("{lq}×{lk} is too large to draw pair by pair (at most {MAX_MASK_CELLS} pairs)");
        return Err(HeatmapError { path: path.display().to_string(), kind: Box::new(HeatmapErrorKind::Draw(reason)) });
    }
    let mut keep = vec![false; lq * lk];
    let mut row = vec![0f32; lk];
    let nk = shape.kv_blocks();
    let mut allowed = vec![0usize; shape.q_blocks() * nk];
    for (i, flags) in keep.chunks_mut(lk.max(1)).enumerate().take(lq) {
        row.fill(0.0);
        mask.mask_row(b, h, i, 0, &mut row);
        for (j, (flag, s)) in flags.iter_mut().zip(&row).enumerate() {
            *flag = s.is_finite();
            allowed[i / SPARSE_BLOCK * nk + j / SPARSE_BLOCK] += usize::from(*flag);
        }
    }
    let share = |i: usize, j: usize| {
        let (qs, ks) = shape.block(i / SPARSE_BLOCK, j / SPARSE_BLOCK);
        allowed[i / SPARSE_BLOCK * nk + j / SPARSE_BLOCK] as f32 / (qs.len() * ks.len()) as f32
    };
    let values: Vec<f32> = (0..lq * lk).map(|x| if keep[x] { share(x / lk, x % lk) } else { 0.0 }).collect();
    let cells = Cells { values: &values, keep: Some(&keep), heads: None, lq, lk };
    draw_figure_on(path, cells, style, Some(ColorScale::unit()))
}
