//! Output files: picks SVG or PNG from the path, renders in memory, then writes the file.

use std::path::Path;

use image::codecs::png::PngEncoder;
use image::{ColorType, ImageEncoder};
use plotters::prelude::{BitMapBackend, IntoDrawingArea, SVGBackend};

use super::draw;
use super::layout::Figure;
use super::scale::ColorScale;

/// Renders `fig` for `weights: [heads, Lq, Lk]` and writes it to `path`: SVG when the extension is
/// `svg` (any case), PNG otherwise. Nothing is written when rendering fails.
pub(super) fn write(path: &Path, fig: &Figure, weights: &[f32], scale: &ColorScale) -> Result<(), String> {
    let (w, h) = fig.size;
    let svg = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let (bytes, kind) = if svg {
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
            draw::figure(&area, fig, weights, scale)?;
            area.present().map_err(|e| format!("cannot finish the SVG: {e}"))?;
        }
        (text.into_bytes(), "SVG")
    } else {
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let area = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            draw::figure(&area, fig, weights, scale)?;
            area.present().map_err(|e| format!("cannot finish the bitmap: {e}"))?;
        }
        let mut png = Vec::new();
        PngEncoder::new(&mut png)
            .write_image(&rgb, w, h, ColorType::Rgb8)
            .map_err(|e| format!("cannot encode the PNG: {e}"))?;
        (png, "PNG")
    };
    std::fs::write(path, bytes).map_err(|e| format!("cannot write the {kind} file: {e}"))
}
