//! Writing pictures: a figure is rendered in memory onto a plotters backend chosen by the path
//! (SVG when it ends in `.svg`, any case; PNG otherwise) and only then written, whole or not at
//! all, by [`write_atomically`], so a failure leaves no file behind. Text uses the embedded font ([`font`]). Heatmaps and line charts both go through
//! [`write`].

pub(crate) mod font;

use std::path::Path;

use image::codecs::png::PngEncoder;
use image::{ColorType, ImageEncoder};
use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, DrawingBackend, IntoDrawingArea, SVGBackend};

use crate::write_file::write_atomically;

/// A figure that can draw itself on any plotters backend.
pub(crate) trait Render {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the whole figure onto `area`.
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Renders `pic` and writes it to `path` as SVG or PNG.
pub(crate) fn write(path: &Path, pic: &impl Render) -> Result<(), String> {
    font::ensure_registered()?;
    let (w, h) = pic.size();
    let svg = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let (bytes, kind) = if svg {
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
            pic.render(&area)?;
            area.present().map_err(|e| format!("cannot finish the SVG: {e}"))?;
        }
        (text.into_bytes(), "SVG")
    } else {
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let area = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            pic.render(&area)?;
            area.present().map_err(|e| format!("cannot finish the bitmap: {e}"))?;
        }
        let mut png = Vec::new();
        PngEncoder::new(&mut png)
            .write_image(&rgb, w, h, ColorType::Rgb8)
            .map_err(|e| format!("cannot encode the PNG: {e}"))?;
        (png, "PNG")
    };
    write_atomically(path, |w| w.write_all(&bytes)).map_err(|e| format!("cannot write the {kind} file: {}", e.source))
}
