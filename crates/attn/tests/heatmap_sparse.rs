//! Block-sparse masks drawn as heatmaps: full blocks in the top colour of a scale from 0 to 1,
//! forbidden pairs drawn masked where the mask says, partial blocks in between, and masks too
//! large to draw pair by pair refused without writing.

use crate::heatmap_parts;

use std::sync::Arc;

use attn::heatmap::{draw_block_mask, HeatmapStyle};
use attn::sparse::{BlockMask, BlockShape};
use heatmap_parts::{centroid, out, read_png, reason, VIRIDIS_HIGH};

/// Fill colour of masked cells.
const MASKED: [u8; 3] = [228, 228, 228];

fn causal(l: usize) -> BlockMask {
    BlockMask::build(BlockShape { batch: 1, heads: 1, lq: l, lk: l }, Arc::new(|_, _, q, kv| kv <= q)).unwrap()
}

#[test]
fn full_blocks_are_the_top_colour_and_forbidden_pairs_are_masked() {
    // Causal over two blocks: block (1, 0) full, (0, 1) empty, the diagonal blocks partial.
    let path = out("causal-blocks.png");
    draw_block_mask(&path, &causal(128), 0, 0, &HeatmapStyle::default()).unwrap();
    let img = read_png(&path);
    let (fx, fy, full) = centroid(&img, VIRIDIS_HIGH);
    let (mx, my, masked) = centroid(&img, MASKED);
    assert!(full > 5_000 && masked > 5_000, "{full} full px, {masked} masked px");
    // The full block is the lower left quarter, the masked pairs lie above the diagonal.
    assert!(fx < mx - 100.0 && fy > my + 100.0, "full at ({fx}, {fy}), masked at ({mx}, {my})");
    // Partial blocks (about half their pairs allowed) are neither colour: something else is
    // drawn, about as much as the full block.
    let other = img.pixels().filter(|p| p.0 != VIRIDIS_HIGH && p.0 != MASKED && p.0 != [255, 255, 255]).count();
    assert!(other > full / 2, "{other} px of partial blocks and text, {full} px full");
}

#[test]
fn the_scale_runs_from_0_to_1_whatever_the_shares() {
    // Only the diagonal: every block partial with a share of 1/64, drawn near the bottom of the
    // scale, not at its top (the top colour is left to the colour bar).
    let shape = BlockShape { batch: 1, heads: 1, lq: 128, lk: 128 };
    let diagonal = BlockMask::build(shape, Arc::new(|_, _, q, kv| kv == q)).unwrap();
    let path = out("diagonal-blocks.png");
    draw_block_mask(&path, &diagonal, 0, 0, &HeatmapStyle::default()).unwrap();
    let (_, _, top) = centroid(&read_png(&path), VIRIDIS_HIGH);
    let full = out("full-block.png");
    draw_block_mask(&full, &causal(128), 0, 0, &HeatmapStyle::default()).unwrap();
    let (_, _, full_top) = centroid(&read_png(&full), VIRIDIS_HIGH);
    // On a scale of the values' own (0 to 1/64) the 128 diagonal pairs would be the top colour:
    // some 3,000 px. The colour bar's top holds a few.
    assert!(
        full_top > 50_000 && top < 200,
        "{top} top-colour px on the diagonal's picture, {full_top} with a full block"
    );
}

#[test]
fn a_mask_too_large_to_draw_is_refused_and_nothing_written() {
    let path = out("too-large.png");
    let e = reason(draw_block_mask(&path, &causal(4097), 0, 0, &HeatmapStyle::default()), &path);
    assert!(e.contains("4097×4097") && e.contains("too large"), "{e}");
}
