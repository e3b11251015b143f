//! The embedded DejaVu Sans font: registration with plotters and text measurement.

use std::sync::OnceLock;

use plotters::style::{register_font, FontDesc, FontFamily, FontStyle};

/// DejaVu Sans Book; license in `assets/LICENSE-DejaVu.txt`.
const DEJAVU_SANS: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Font family name under which the embedded font is registered (and written into SVG files).
pub(crate) const FAMILY: &str = "sans-serif";

/// Registers the embedded font with plotters once per process.
pub(crate) fn ensure_registered() -> Result<(), String> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FAMILY, FontStyle::Normal, DEJAVU_SANS).is_ok());
    if ok {
        Ok(())
    } else {
        Err("the embedded font DejaVuSans.ttf could not be loaded".into())
    }
}

/// Width and height in pixels of `text` at font size `size`; needs [`ensure_registered`] first.
pub(crate) fn text_size(text: &str, size: f64) -> Result<(u32, u32), String> {
    FontDesc::new(FontFamily::Name(FAMILY), size, FontStyle::Normal)
        .box_size(text)
        .map_err(|e| format!("cannot measure the text {text:?}: {e}"))
}
