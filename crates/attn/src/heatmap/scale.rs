//! Colour scale of a heatmap: value range, viridis colours, colour-bar ticks, cell text colour.

use plotters::style::colors::colormaps::ViridisRGB;
use plotters::style::{RGBColor, BLACK, WHITE};

/// Fill colour of cells holding NaN or ±inf (not part of viridis).
pub(super) const NON_FINITE: RGBColor = RGBColor(150, 150, 150);
/// Fill colour of masked cells, under their hatching (not part of viridis).
pub(super) const MASKED: RGBColor = RGBColor(228, 228, 228);

/// Linear map from `[lo, hi]` (with `lo <= 0 <= hi` and `lo < hi`) onto viridis.
#[derive(Debug, Clone, Copy)]
pub(super) struct ColorScale {
    lo: f64,
    hi: f64,
}

impl ColorScale {
    /// Range `[min(0, smallest), max(0, largest)]` of the finite `weights`; `[0, 1]` when that is empty
    /// or a single point.
    pub(super) fn from_weights(weights: &[f32]) -> Self {
        let (lo, hi) = weights
            .iter()
            .filter(|w| w.is_finite())
            .fold((0.0f64, 0.0f64), |(lo, hi), &w| (lo.min(f64::from(w)), hi.max(f64::from(w))));
        if hi > lo {
            Self { lo, hi }
        } else {
            Self { lo, hi: lo + 1.0 }
        }
    }

    /// The range `[0, 1]`, whatever the values (for shares).
    pub(super) fn unit() -> Self {
        Self { lo: 0.0, hi: 1.0 }
    }

    /// Lower end of the scale.
    pub(super) fn lo(&self) -> f64 {
        self.lo
    }

    /// Upper end of the scale.
    pub(super) fn hi(&self) -> f64 {
        self.hi
    }

    /// Position of finite `value` on the scale, clamped to `[0, 1]`.
    pub(super) fn fraction(&self, value: f64) -> f64 {
        ((value - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }

    /// Viridis colour of finite `value`.
    pub(super) fn color(&self, value: f64) -> RGBColor {
        ViridisRGB::get_color(self.fraction(value))
    }

    /// About five evenly spaced round values (steps of 1, 2 or 5 times a power of ten) inside the
    /// scale, each with its text.
    pub(super) fn ticks(&self) -> Vec<(f64, String)> {
        let raw = (self.hi - self.lo) / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw * (1.0 - 1e-9))
            .unwrap_or(10.0 * magnitude);
        let decimals = (-step.log10().floor()).max(0.0) as usize;
        let first = (self.lo / step - 1e-9).ceil() as i64;
        let last = (self.hi / step + 1e-9).floor() as i64;
        (first..=last)
            .map(|k| {
                let v = k as f64 * step;
                (v, format!("{v:.decimals$}"))
            })
            .collect()
    }
}

/// Black or white, whichever contrasts more (WCAG contrast ratio) with `background`.
pub(super) fn text_color_on(background: RGBColor) -> RGBColor {
    let linear = |c: u8| {
        let c = f64::from(c) / 255.0;
        if c <= 0.04045 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    let RGBColor(r, g, b) = background;
    let luminance = 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
    let against_black = (luminance + 0.05) / 0.05;
    let against_white = 1.05 / (luminance + 0.05);
    if against_black >= against_white {
        BLACK
    } else {
        WHITE
    }
}

/// Text of a cell: 2 decimals, or `NaN`, `inf`, `-inf`.
pub(super) fn value_text(value: f32) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_includes_zero_and_ignores_non_finite() {
        let s = ColorScale::from_weights(&[0.2, f32::NAN, 0.7, f32::INFINITY]);
        assert_eq!((s.lo(), s.hi()), (0.0, f64::from(0.7f32)));
        let s = ColorScale::from_weights(&[-2.0, -1.0]);
        assert_eq!((s.lo(), s.hi()), (-2.0, 0.0));
        let s = ColorScale::from_weights(&[0.0, f32::NAN]);
        assert_eq!((s.lo(), s.hi()), (0.0, 1.0));
    }

    #[test]
    fn ticks_are_round_and_inside() {
        let s = ColorScale::from_weights(&[1.0]);
        let texts: Vec<String> = s.ticks().into_iter().map(|(_, t)| t).collect();
        assert_eq!(texts, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        let s = ColorScale::from_weights(&[0.37]);
        let ticks = s.ticks();
        assert!(ticks.len() >= 3 && ticks.len() <= 8, "{ticks:?}");
        assert!(ticks.iter().all(|(v, _)| (0.0..=0.37 + 1e-9).contains(v)));
        let s = ColorScale::from_weights(&[-30.0, 20.0]);
        let texts: Vec<String> = s.ticks().into_iter().map(|(_, t)| t).collect();
        assert_eq!(texts, ["-30", "-20", "-10", "0", "10", "20"]);
    }

    #[test]
    fn text_contrasts_with_viridis_ends() {
        let s = ColorScale::from_weights(&[1.0]);
        assert_eq!(text_color_on(s.color(0.0)), WHITE);
        assert_eq!(text_color_on(s.color(1.0)), BLACK);
    }

    #[test]
    fn value_texts() {
        assert_eq!(value_text(0.254), "0.25");
        assert_eq!(value_text(f32::NAN), "NaN");
        assert_eq!(value_text(f32::NEG_INFINITY), "-inf");
    }
}
