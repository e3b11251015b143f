//! Writing pictures: [`PictureFormat::from_path`] is the one place a picture's format is chosen,
//! by the path's extension (any case): `.png` → PNG, `.svg` → SVG, `.jpg`/`.jpeg` → JPEG; any other
//! extension, or none, is refused with the accepted ones named. Heatmaps and line charts decide
//! the format before drawing anything and go through `write`, which renders the figure in memory
//! onto the plotters backend of that format and only then writes it, whole or not at all, by
//! `write_atomically`, so a failure leaves no file behind. Text uses the embedded font (`font`).

pub(crate) mod font;

use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ColorType, ImageEncoder};
use plotters::coord::Shift;
use plotters::prelude::{BitMapBackend, DrawingArea, DrawingBackend, IntoDrawingArea, SVGBackend};

use crate::write_file::write_atomically;
/// JPEG quality (1–100): high enough that cell texts stay sharp.
const JPEG_QUALITY: u8 = 92;

/// A picture file format this crate writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PictureFormat {
    /// PNG, lossless bitmap (`.png`).
    Png,
    /// SVG, vector drawing with real text (`.svg`).
    Svg,
    /// JPEG, lossy bitmap (`.jpg`, `.jpeg`).
    Jpeg,
}

/// The extensions [`PictureFormat::from_path`] accepts, for messages.
pub const PICTURE_EXTENSIONS: &str = ".png, .svg, .jpg or .jpeg";

/// A path whose extension names no picture format this crate writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}, expected {PICTURE_EXTENSIONS}", match .found {
    Some(ext) => format!("unknown picture extension '.{ext}'"),
    None => "no picture extension".to_string(),
})]
pub struct PictureFormatError {
    /// The extension found (without the dot), `None` when the path has none.
    pub found: Option<String>,
}

impl PictureFormat {
    /// The format named by `path`'s extension (any case); refuses any other extension, or none.
    pub fn from_path(path: &Path) -> Result<Self, PictureFormatError> {
        let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
        match ext.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("png") => Ok(Self::Png),
            Some("svg") => Ok(Self::Svg),
            Some("jpg" | "jpeg") => Ok(Self::Jpeg),
            _ => Err(PictureFormatError { found: ext }),
        }
    }

    /// The format's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Png => "PNG",
            Self::Svg => "SVG",
            Self::Jpeg => "JPEG",
        }
    }
}

/// A figure that can draw itself on any plotters backend.
pub(crate) trait Render {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the whole figure onto `area`.
    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Renders `pic` and writes it to `path` in `format`.
pub(crate) fn write(path: &Path, format: PictureFormat, pic: &impl Render) -> Result<(), String> {
    font::ensure_registered()?;
    let (w, h) = pic.size();
    let bytes = if format == PictureFormat::Svg {
        let mut text = String::new();
        {
            let area = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
            pic.render(&area)?;
            area.present().map_err(|e| format!("cannot finish the SVG: {e}"))?;
        }
        text.into_bytes()
    } else {
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let area = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
            pic.render(&area)?;
            area.present().map_err(|e| format!("cannot finish the bitmap: {e}"))?;
        }
        let mut encoded = Vec::new();
        let result = match format {
            PictureFormat::Jpeg => {
                JpegEncoder::new_with_quality(&mut encoded, JPEG_QUALITY).write_image(&rgb, w, h, ColorType::Rgb8)
            }
            _ => PngEncoder::new(&mut encoded).write_image(&rgb, w, h, ColorType::Rgb8),
        };
        result.map_err(|e| format!("cannot encode the {}: {e}", format.name()))?;
        encoded
    };
    let kind = format.name();
    write_atomically(path, |w| w.write_all(&bytes)).map_err(|e| format!("cannot write the {kind} file: {}", e.source))
}
