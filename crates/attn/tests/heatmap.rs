//! Heatmap drawing: PNG, SVG and JPEG output by extension, what the pictures contain (masked cells
//! apart from zero weights, the caller's axis titles), candle tensors with their masks, and input
//! errors.

use std::path::{Path, PathBuf};

use attn::heatmap::{draw_head_grid, draw_heatmap, draw_tensor, HeatmapError, HeatmapErrorKind, HeatmapStyle};
use attn::picture::{PictureFormat, PictureFormatError};
use attn::{padding_mask, sdpa_full, AttnLibError, Mask, SdpaOptions};
use candle_core::{DType, Device, Tensor};

/// Viridis at the bottom and top of the scale.
const VIRIDIS_LOW: [u8; 3] = [68, 1, 84];
const VIRIDIS_HIGH: [u8; 3] = [254, 232, 37];

/// A fresh path for `name` under Cargo's temporary directory for integration tests.
fn out(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("heatmap");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_ihdr_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24, "PNG too short: {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk is IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// Decodes the PNG at `path`, checking that the decoded size matches its header.
fn read_png(path: &Path) -> image::RgbImage {
    let bytes = std::fs::read(path).unwrap();
    let (w, h) = png_ihdr_size(&bytes);
    let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (w, h));
    img
}

/// Mean position of the pixels of exactly `color`, and how many there are.
fn centroid(img: &image::RgbImage, color: [u8; 3]) -> (f64, f64, usize) {
    let (mut sx, mut sy, mut n) = (0.0, 0.0, 0usize);
    for (x, y, p) in img.enumerate_pixels() {
        if p.0 == color {
            sx += f64::from(x);
            sy += f64::from(y);
            n += 1;
        }
    }
    (sx / n.max(1) as f64, sy / n.max(1) as f64, n)
}

/// `[lq, lk]` zeros with a 1 at `(i, j)`.
fn one_hot(lq: usize, lk: usize, i: usize, j: usize) -> Vec<f32> {
    let mut w = vec![0.0; lq * lk];
    w[i * lk + j] = 1.0;
    w
}

/// The texts of all `<text>` elements of an SVG document, trimmed.
fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG: {}", &svg[..svg.len().min(80)]);
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
        .collect()
}

/// Asserts that every needle is one of `texts`.
fn assert_has(texts: &[String], needles: &[&str]) {
    for needle in needles {
        assert!(texts.iter().any(|t| t == needle), "SVG lacks the text {needle:?}");
    }
}

fn labels(words: &[&str]) -> Option<Vec<String>> {
    Some(words.iter().map(|s| s.to_string()).collect())
}

fn reason(result: Result<(), HeatmapError>, path: &Path) -> String {
    let err = result.expect_err("expected an error");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "error does not name the file: {text}");
    assert!(!path.exists(), "nothing may be written on error");
    err.kind.to_string()
}

#[test]
fn png_is_written_with_viridis_cells_in_reading_order() {
    let path = out("one_hot.png");
    draw_heatmap(&path, &one_hot(4, 4, 0, 3), None, 4, 4, &HeatmapStyle::default()).unwrap();
    let img = read_png(&path);
    let (w, h) = img.dimensions();
    assert!((4 * 34..2000).contains(&w) && (4 * 34..2000).contains(&h), "size {w}x{h}");
    let background = img.pixels().filter(|p| p.0 == [255, 255, 255]).count();
    assert!(background < (w * h) as usize, "picture is blank");

    let (hx, hy, hot) = centroid(&img, VIRIDIS_HIGH);
    let (cx, cy, cold) = centroid(&img, VIRIDIS_LOW);
    assert!(hot > 500 && cold > 15 * 500, "hot {hot} px, cold {cold} px");
    assert!(hx > cx, "query 0 / key 3 must lie right of the other cells");
    assert!(hy < cy, "query 0 must be the top row");
}

#[test]
fn grid_png_is_larger_than_one_panel() {
    let (lq, lk) = (3, 5);
    let single = out("single_3x5.png");
    draw_heatmap(&single, &one_hot(lq, lk, 1, 2), None, lq, lk, &HeatmapStyle::default()).unwrap();
    let grid = out("grid_4x3x5.png");
    let weights: Vec<f32> = (0..4).flat_map(|h| one_hot(lq, lk, h % lq, h)).collect();
    draw_head_grid(&grid, &weights, None, 4, lq, lk, &HeatmapStyle::default()).unwrap();
    let (sw, sh) = read_png(&single).dimensions();
    let (gw, gh) = read_png(&grid).dimensions();
    assert!(gw > sw && gh > sh, "2x2 grid {gw}x{gh} vs single {sw}x{sh}");
}

#[test]
fn extension_decides_the_format_and_unknown_ones_are_refused() {
    let png = out("upper.PNG");
    draw_heatmap(&png, &[0.5, 0.5], None, 1, 2, &HeatmapStyle::default()).unwrap();
    let size = read_png(&png).dimensions();
    for name in ["cells.jpg", "cells.JPEG"] {
        let jpeg = out(name);
        draw_heatmap(&jpeg, &[0.5, 0.5], None, 1, 2, &HeatmapStyle::default()).unwrap();
        let bytes = std::fs::read(&jpeg).unwrap();
        let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Jpeg).unwrap();
        assert_eq!((img.width(), img.height()), size, "{name}: same picture as the PNG");
    }
    for (name, found) in [("no_extension", "no picture extension"), ("cells.gif", "unknown picture extension '.gif'")] {
        let path = out(name);
        let r = reason(draw_heatmap(&path, &[0.5, 0.5], None, 1, 2, &HeatmapStyle::default()), &path);
        assert!(r.contains(found) && r.contains(".png, .svg, .jpg or .jpeg"), "{r}");
    }
    assert_eq!(PictureFormat::from_path(Path::new("a.b.Svg")), Ok(PictureFormat::Svg));
    assert_eq!(PictureFormat::from_path(Path::new("jpg")).unwrap_err().found, None);
}

#[test]
fn svg_has_title_labels_axis_titles_and_values() {
    let path = out("labelled.SVG");
    let style = HeatmapStyle {
        title: Some("Layer 3 attention".into()),
        query_labels: labels(&["<s>", "The", "cat"]),
        key_labels: labels(&["<s>", "The", "cat", "sat"]),
        ..Default::default()
    };
    let weights = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.25, 0.25, 0.3, 0.2];
    draw_heatmap(&path, &weights, None, 3, 4, &style).unwrap();
    let texts = svg_texts(&path);
    assert_has(&texts, &["Layer 3 attention", "&lt;s&gt;", "The", "cat", "sat", "Key", "Query"]);
    assert_has(&texts, &["1.00", "0.50", "0.25", "0.30", "0.20"]);
    let count = |s: &str| texts.iter().filter(|t| *t == s).count();
    assert_eq!(count("&lt;s&gt;"), 2, "one <s> per axis");
    assert_eq!(count("0.00"), 5);
}

#[test]
fn svg_without_labels_uses_indices() {
    let path = out("indices.svg");
    draw_heatmap(&path, &one_hot(2, 7, 1, 6), None, 2, 7, &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&path);
    assert_has(&texts, &["0", "1", "6", "Key", "Query"]);
    assert!(!texts.iter().any(|t| t == "7"), "there is no key 7");
}

#[test]
fn values_are_written_only_in_small_matrices() {
    let small = out("small_values.svg");
    draw_heatmap(&small, &[0.123; 16 * 16], None, 16, 16, &HeatmapStyle::default()).unwrap();
    let values = svg_texts(&small).iter().filter(|t| *t == "0.12").count();
    assert_eq!(values, 16 * 16);
    let large = out("large_values.svg");
    draw_heatmap(&large, &[0.123; 17 * 40], None, 17, 40, &HeatmapStyle::default()).unwrap();
    assert!(!svg_texts(&large).iter().any(|t| t == "0.12"));
}

#[test]
fn grid_svg_titles_each_head() {
    let path = out("grid.svg");
    let weights = vec![0.2; 5 * 2 * 3];
    draw_head_grid(&path, &weights, None, 5, 2, 3, &HeatmapStyle::default()).unwrap();
    let texts = svg_texts(&path);
    assert_has(&texts, &["head 0", "head 1", "head 2", "head 3", "head 4"]);
    assert!(!texts.iter().any(|t| t == "head 5"));
    assert_eq!(texts.iter().filter(|t| *t == "Key").count(), 5, "one key axis per panel");
}

#[test]
fn non_finite_weights_are_drawn_distinctly() {
    let path = out("non_finite.svg");
    let weights = [0.5, f32::NAN, f32::INFINITY, 0.25];
    draw_heatmap(&path, &weights, None, 2, 2, &HeatmapStyle::default()).unwrap();
    assert_has(&svg_texts(&path), &["NaN", "inf", "0.50", "0.25", "NaN / inf"]);
    let finite = out("finite.svg");
    draw_heatmap(&finite, &[0.5, 0.5], None, 1, 2, &HeatmapStyle::default()).unwrap();
    assert!(!svg_texts(&finite).iter().any(|t| t == "NaN / inf"), "legend only when needed");
    let png = out("non_finite.png");
    let large: Vec<f32> = (0..40 * 40).map(|i| if i == 41 { f32::NAN } else { 0.1 }).collect();
    draw_heatmap(&png, &large, None, 40, 40, &HeatmapStyle::default()).unwrap();
    read_png(&png);
}

#[test]
fn large_matrix_is_drawn_at_bounded_size() {
    let path = out("large.png");
    let (lq, lk) = (700, 1500);
    let weights: Vec<f32> = (0..lq * lk).map(|i| (i % lk) as f32 / lk as f32).collect();
    draw_heatmap(&path, &weights, None, lq, lk, &HeatmapStyle::default()).unwrap();
    let (w, h) = read_png(&path).dimensions();
    assert!(w < 1200 && h < 1200, "size {w}x{h}");
}

#[test]
fn wrong_weight_count_is_an_error() {
    let path = out("wrong_len.png");
    let r = reason(draw_heatmap(&path, &[0.0; 5], None, 2, 3, &HeatmapStyle::default()), &path);
    assert!(r.contains("5 values") && r.contains("= 6"), "{r}");
    let r = reason(draw_head_grid(&path, &[0.0; 6], None, 2, 2, 3, &HeatmapStyle::default()), &path);
    assert!(r.contains("6 values") && r.contains("heads") && r.contains("= 12"), "{r}");
}

#[test]
fn label_count_mismatch_is_an_error() {
    let path = out("labels.svg");
    let style = HeatmapStyle { query_labels: labels(&["a", "b"]), ..Default::default() };
    let r = reason(draw_heatmap(&path, &[0.0; 12], None, 3, 4, &style), &path);
    assert!(r.contains("query_labels has 2 labels, expected lq = 3"), "{r}");
    let style = HeatmapStyle { key_labels: labels(&["a", "b", "c", "d", "e"]), ..Default::default() };
    let r = reason(draw_head_grid(&path, &[0.0; 24], None, 2, 3, 4, &style), &path);
    assert!(r.contains("key_labels has 5 labels, expected lk = 4"), "{r}");
}

#[test]
fn empty_sizes_are_errors_naming_what_is_empty() {
    let path = out("empty.png");
    let style = HeatmapStyle::default();
    assert!(reason(draw_heatmap(&path, &[], None, 0, 4, &style), &path).contains("lq is 0"));
    assert!(reason(draw_heatmap(&path, &[], None, 4, 0, &style), &path).contains("lk is 0"));
    assert!(reason(draw_head_grid(&path, &[], None, 0, 2, 2, &style), &path).contains("heads is 0"));
}

#[test]
fn unwritable_path_and_oversized_grid_are_errors() {
    let dir = out("missing_dir");
    let path = dir.join("x.png");
    let r = reason(draw_heatmap(&path, &[1.0], None, 1, 1, &HeatmapStyle::default()), &path);
    assert!(r.contains("cannot write the PNG file"), "{r}");
    let path = out("too_many_heads.png");
    let r = reason(draw_head_grid(&path, &[0.5; 20_000], None, 20_000, 1, 1, &HeatmapStyle::default()), &path);
    assert!(r.contains("pixels"), "{r}");
}

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
