//! Heatmaps of masked weights and of candle tensors: masked cells drawn apart from zero weights,
//! where the mask says and outside the colour scale, through downsampling and grids; axis titles;
//! `draw_tensor` with its masks and typed errors.

use crate::heatmap_parts;

use attn::heatmap::{draw_head_grid, draw_heatmap, draw_tensor, HeatmapErrorKind, HeatmapStyle};
use attn::picture::PictureFormatError;
use attn::{padding_mask, sdpa_full, AttnLibError, Mask, SdpaOptions};
use candle_core::{DType, Device, Tensor};
use heatmap_parts::{assert_has, centroid, one_hot, out, read_png, reason, svg_texts, VIRIDIS_HIGH};

/// Fill colour of masked cells.
const MASKED: [u8; 3] = [228, 228, 228];

#[test]
fn masked_cells_are_drawn_apart_from_zero_weights() {
    let path = out("masked.svg");
    // Row 0 keeps keys 0 and 1 (key 1's weight is exactly 0 but not masked); row 1 keeps all.
    let weights = [1.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.25, 0.25];
    let keep = [true, true, false, false, true, true, true, true];
    draw_heatmap(&path, &weights, Some(&keep), 2, 4, &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&path);
    assert_has(&texts, &["masked", "1.00", "0.25"]);
    assert_eq!(texts.iter().filter(|t| *t == "0.00").count(), 1, "only the kept zero shows a value: {texts:?}");
    assert!(!texts.iter().any(|t| t == "NaN / inf"), "{texts:?}");
    let unmasked = out("unmasked.svg");
    draw_heatmap(&unmasked, &weights, None, 2, 4, &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&unmasked);
    assert_eq!(texts.iter().filter(|t| *t == "0.00").count(), 3);
    assert!(!texts.iter().any(|t| t == "masked"), "legend only when needed: {texts:?}");
}

#[test]
fn masked_cells_sit_where_the_mask_says_and_stay_out_of_the_scale() {
    let path = out("masked.png");
    // Key 3 of query 0 holds the only 1.0; query 3's keys 0..2 are masked and hold a huge value
    // that must not stretch the colour scale.
    let mut weights = one_hot(4, 4, 0, 3);
    let mut keep = vec![true; 16];
    for j in 0..2 {
        weights[3 * 4 + j] = 1000.0;
        keep[3 * 4 + j] = false;
    }
    draw_heatmap(&path, &weights, Some(&keep), 4, 4, &HeatmapStyle::default()).unwrap();
    let img = read_png(&path);
    let (hx, hy, hot) = centroid(&img, VIRIDIS_HIGH);
    assert!(hot > 500, "the 1.0 cell is the top of the scale: {hot} px");
    // Masked pixels left of the hot cell (the legend swatch lies right of everything).
    let (mut n, mut sx, mut sy) = (0usize, 0.0, 0.0);
    for (x, y, p) in img.enumerate_pixels() {
        if p.0 == MASKED && f64::from(x) < hx {
            n += 1;
            sx += f64::from(x);
            sy += f64::from(y);
        }
    }
    assert!(n > 2 * 500, "{n} masked px");
    assert!(sy / n as f64 > hy + 100.0, "masked cells are in the bottom row");
    assert!(sx / (n as f64) < hx - 100.0, "masked cells are on the left");
}

#[test]
fn masks_survive_downsampling_and_grids() {
    let path = out("masked_large.png");
    let (lq, lk) = (700, 900);
    let weights = vec![0.001f32; lq * lk];
    let keep: Vec<bool> = (0..lq * lk).map(|i| i % lk < 600).collect();
    draw_heatmap(&path, &weights, Some(&keep), lq, lk, &HeatmapStyle::default()).unwrap();
    let img = read_png(&path);
    let masked = img.pixels().filter(|p| p.0 == MASKED).count();
    assert!(masked > 100_000, "{masked} masked px");
    let grid = out("masked_grid.svg");
    let keep = [true, false, true, true, false, true];
    draw_head_grid(&grid, &[0.5; 6], Some(&keep), 3, 1, 2, &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&grid);
    assert_eq!(texts.iter().filter(|t| *t == "0.50").count(), 4, "{texts:?}");
    assert_has(&texts, &["masked", "head 2"]);
}

#[test]
fn keep_flags_of_the_wrong_count_are_an_error() {
    let path = out("keep_len.svg");
    let r = reason(draw_heatmap(&path, &[0.5; 6], Some(&[true; 5]), 2, 3, &HeatmapStyle::default()), &path);
    assert!(r.contains("keep has 5 flags") && r.contains("= 6"), "{r}");
}

#[test]
fn axis_titles_are_the_callers() {
    let path = out("titles.svg");
    let style =
        HeatmapStyle { row_title: Some("Row".into()), column_title: Some("Value dim".into()), ..Default::default() };
    draw_head_grid(&path, &[0.5; 8], None, 2, 2, 2, &style).unwrap();
    let texts = svg_texts(&path);
    assert_eq!(texts.iter().filter(|t| *t == "Value dim").count(), 2, "{texts:?}");
    assert_has(&texts, &["Row"]);
    assert!(!texts.iter().any(|t| t == "Key" || t == "Query"), "{texts:?}");
}

#[test]
fn tensors_are_drawn_with_their_masks() {
    let cpu = &Device::Cpu;
    let uniform = |shape: &[usize], seed| attn::random::uniform(shape, -1.0, 1.0, seed).unwrap();
    let (q, k) = (uniform(&[2, 2, 3, 8], 1), uniform(&[2, 2, 4, 8], 2));
    let ids = Tensor::new(&[[4u32, 5, 0, 0], [6, 7, 8, 0]], cpu).unwrap();
    let mask = padding_mask(&ids, 0).unwrap();
    let opts = SdpaOptions::default().mask(mask.clone()).return_weights(true);
    let weights = sdpa_full(&q, &k, &k, &opts).unwrap().weights.unwrap().to_dtype(DType::F16).unwrap();
    // Batch entry 1 of [B, H, Lq, Lk] with its [1, 1, Lk] mask: one padded key, 2 heads × 3 queries.
    let path = out("tensor_masked.svg");
    let entry = Mask::keep(mask.tensor().get(1).unwrap());
    draw_tensor(&path, &weights.get(1).unwrap(), Some(&entry), &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&path);
    assert_has(&texts, &["head 0", "head 1", "masked"]);
    assert!(!texts.iter().any(|t| t == "0.00" || t == "head 2"), "{texts:?}");
    // Rank 4 with a single batch entry, and rank 2, with a block-polarity mask.
    let one = weights.narrow(0, 0, 1).unwrap();
    draw_tensor(
        &out("tensor_rank4.svg"),
        &one,
        Some(&mask.tensor().narrow(0, 0, 1).map(Mask::keep).unwrap()),
        &HeatmapStyle::default(),
    )
    .unwrap();
    let block = Mask::block(Tensor::new(&[0u8, 0, 1, 1], cpu).unwrap());
    let rank2 = out("tensor_rank2.svg");
    draw_tensor(&rank2, &weights.get(0).unwrap().get(1).unwrap(), Some(&block), &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&rank2);
    assert_has(&texts, &["masked", "Key", "Query"]);
    assert!(!texts.iter().any(|t| t == "0.00" || t == "head 0"), "{texts:?}");
}

#[test]
fn unusable_tensors_are_typed_errors() {
    let cpu = &Device::Cpu;
    let path = out("tensor_bad.png");
    let kind = |values: &Tensor, mask: Option<&Mask>| {
        let err = draw_tensor(&path, values, mask, &HeatmapStyle::default()).unwrap_err();
        assert!(err.to_string().contains("tensor_bad.png"), "{err}");
        assert!(!path.exists());
        *err.kind
    };
    let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, cpu).unwrap();
    for shape in [&[4][..], &[2, 1, 3, 3], &[1, 1, 1, 2, 2]] {
        match kind(&zeros(shape), None) {
            HeatmapErrorKind::Tensor(AttnLibError::Shape { tensor: "values", found, expected }) => {
                assert_eq!(found, shape);
                assert!(expected.contains("rank 2 [Lq, Lk], 3 [H, Lq, Lk] or 4 [1, H, Lq, Lk]"), "{expected}");
            }
            other => panic!("{shape:?}: {other:?}"),
        }
    }
    let ints = Tensor::zeros((2, 2), DType::U32, cpu).unwrap();
    assert!(matches!(kind(&ints, None), HeatmapErrorKind::Tensor(AttnLibError::DType { tensor: "values", .. })));
    let mask = Mask::keep(Tensor::ones(3, DType::U8, cpu).unwrap());
    match kind(&zeros(&[2, 4]), Some(&mask)) {
        HeatmapErrorKind::Tensor(AttnLibError::Shape { tensor: "mask", found, expected }) => {
            assert_eq!(found, [3]);
            assert!(expected.contains("[2, 4]"), "{expected}");
        }
        other => panic!("{other:?}"),
    }
    let gif = out("tensor.gif");
    let err = draw_tensor(&gif, &zeros(&[2, 2]), None, &HeatmapStyle::default()).unwrap_err();
    assert!(matches!(*err.kind, HeatmapErrorKind::Format(PictureFormatError { found: Some(ref e) }) if e == "gif"));
}
