//! What the heatmap tests share: output paths, reading PNGs and SVGs back, and the error check.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use attn::heatmap::HeatmapError;

/// Viridis at the top of the scale.
pub const VIRIDIS_HIGH: [u8; 3] = [254, 232, 37];

/// A fresh path for `name` under Cargo's temporary directory for integration tests.
pub fn out(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("heatmap");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
pub fn png_ihdr_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24, "PNG too short: {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk is IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// Decodes the PNG at `path`, checking that the decoded size matches its header.
pub fn read_png(path: &Path) -> image::RgbImage {
    let bytes = std::fs::read(path).unwrap();
    let (w, h) = png_ihdr_size(&bytes);
    let img = image::load_from_memory_with_format(&bytes, image::ImageFormat::Png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (w, h));
    img
}

/// Mean position of the pixels of exactly `color`, and how many there are.
pub fn centroid(img: &image::RgbImage, color: [u8; 3]) -> (f64, f64, usize) {
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
pub fn one_hot(lq: usize, lk: usize, i: usize, j: usize) -> Vec<f32> {
    let mut w = vec![0.0; lq * lk];
    w[i * lk + j] = 1.0;
    w
}

/// The texts of all `<text>` elements of an SVG document, trimmed.
pub fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG: {}", &svg[..svg.len().min(80)]);
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
        .collect()
}

/// Asserts that every needle is one of `texts`.
pub fn assert_has(texts: &[String], needles: &[&str]) {
    for needle in needles {
        assert!(texts.iter().any(|t| t == needle), "SVG lacks the text {needle:?}");
    }
}

/// The kind of the error `result` must be, after checking that it names `path` and that nothing
/// was written there.
pub fn reason(result: Result<(), HeatmapError>, path: &Path) -> String {
    let err = result.expect_err("expected an error");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "error does not name the file: {text}");
    assert!(!path.exists(), "nothing may be written on error");
    err.kind.to_string()
}
