//! Heatmap drawing: PNG, SVG and JPEG output by extension, what the pictures contain, the
//! caller's labels and titles, and input errors (masked cells and candle tensors are in
//! `heatmap_masks.rs`).

use crate::heatmap_parts;

use std::path::Path;

use attn::heatmap::{draw_head_grid, draw_heatmap, HeatmapStyle};
use attn::picture::PictureFormat;
use heatmap_parts::{assert_has, centroid, one_hot, out, read_png, reason, svg_texts, VIRIDIS_HIGH};

/// Viridis at the bottom of the scale.
const VIRIDIS_LOW: [u8; 3] = [68, 1, 84];

fn labels(words: &[&str]) -> Option<Vec<String>> {
    Some(words.iter().map(|s| s.to_string()).collect())
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
