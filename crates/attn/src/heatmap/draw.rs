//! Rendering of a laid-out heatmap figure onto a plotters drawing area (any backend): viridis
//! cells, grey crossed-out non-finite cells, light grey hatched masked cells, axes, colour bar and
//! legend.

use std::ops::Range;

use plotters::coord::Shift;
use plotters::prelude::{
    Color, DrawingArea, DrawingBackend, IntoFont, PathElement, RGBColor, Rectangle, TextStyle, BLACK, WHITE,
};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontTransform;

use super::layout::{
    Bar, Figure, LegendEntry, BAR_W, FONT_AXIS, FONT_PANEL_TITLE, FONT_TICK, FONT_TITLE, GAP, LEGEND_BOX, TICK_LEN,
};
use super::scale::{text_color_on, value_text, ColorScale, MASKED, NON_FINITE};
use crate::picture::font::FAMILY;
use crate::picture::Render;

/// Colour of frames and tick marks.
const AXIS_COLOR: RGBColor = RGBColor(70, 70, 70);
/// Colour of the hatching of masked cells.
const HATCH_COLOR: RGBColor = RGBColor(150, 150, 150);
/// Pixels between hatching lines.
const HATCH_STEP: i32 = 6;

/// What one drawn block shows.
#[derive(Debug, Clone, Copy)]
enum Block {
    /// Mean of the covered cells, all finite.
    Finite(f64),
    /// The first non-finite weight among the covered cells.
    NonFinite(f32),
    /// Every covered cell is masked.
    Masked,
}

/// A laid-out heatmap figure with its values `[heads, Lq, Lk]`, their keep flags (same layout,
/// `false` = masked) and colour scale.
pub(super) struct Picture<'a> {
    pub(super) fig: &'a Figure,
    pub(super) values: &'a [f32],
    pub(super) keep: Option<&'a [bool]>,
    pub(super) scale: &'a ColorScale,
}

impl Render for Picture<'_> {
    fn size(&self) -> (u32, u32) {
        self.fig.size
    }

    fn render<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        drawn(area.fill(&WHITE))?;
        let fig = self.fig;
        if let Some((title, center)) = &fig.title {
            text(area, title, *center, FONT_TITLE, BLACK, centered(), false)?;
        }
        let per_head = self.values.len() / fig.heads;
        for (h, head) in self.values.chunks(per_head).enumerate() {
            let keep = self.keep.map(|k| &k[h * per_head..(h + 1) * per_head]);
            panel(area, fig, h, head, keep, self.scale)?;
        }
        color_bar(area, &fig.bar, self.scale)
    }
}

/// Draws the panel of head `h` showing `values: [Lq, Lk]` with keep flags `keep: [Lq, Lk]`.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    fig: &Figure,
    h: usize,
    values: &[f32],
    keep: Option<&[bool]>,
    scale: &ColorScale,
) -> Result<(), String> {
    let p = &fig.panel;
    let origin = fig.panel_origin(h);
    let (px, py) = (origin.0 + p.plot_offset().0, origin.1 + p.plot_offset().1);
    let (w, ht) = (p.x.extent() as i32, p.y.extent() as i32);
    if fig.panel_titles {
        let center = (px + w / 2, origin.1 + p.title_h as i32 / 2);
        text(area, &format!("head {h}"), center, FONT_PANEL_TITLE, BLACK, centered(), false)?;
    }
    for bi in 0..p.y.blocks {
        let y0 = py + bi as i32 * p.y.block_px as i32;
        for bj in 0..p.x.blocks {
            let x0 = px + bj as i32 * p.x.block_px as i32;
            let block = block_value(values, keep, p.x.n, p.y.block_cells(bi), p.x.block_cells(bj));
            cell(area, (x0, y0), (p.x.block_px, p.y.block_px), block, p.value_font, scale)?;
        }
    }
    drawn(area.draw(&Rectangle::new([(px - 1, py - 1), (px + w, py + ht)], AXIS_COLOR)))?;

    let (tick, gap) = (TICK_LEN as i32, GAP as i32);
    for t in &p.x.ticks {
        let cx = px + p.x.center(t.index);
        line(area, (cx, py + ht), (cx, py + ht + tick))?;
        let at = (cx, py + ht + tick + gap);
        if p.x_rotated {
            text(area, &t.text, at, FONT_TICK, BLACK, Pos::new(HPos::Right, VPos::Center), true)?;
        } else {
            text(area, &t.text, at, FONT_TICK, BLACK, Pos::new(HPos::Center, VPos::Top), false)?;
        }
    }
    for t in &p.y.ticks {
        let cy = py + p.y.center(t.index);
        line(area, (px - 1 - tick, cy), (px - 1, cy))?;
        let at = (px - 1 - tick - gap, cy);
        text(area, &t.text, at, FONT_TICK, BLACK, Pos::new(HPos::Right, VPos::Center), false)?;
    }

    let x_labels_h = if p.x_rotated { p.x.label_w } else { FONT_TICK as u32 } as i32;
    let key_y = py + ht + tick + gap + x_labels_h + gap + FONT_AXIS as i32 / 2;
    let (row_title, column_title) = &fig.axis_titles;
    text(area, column_title, (px + w / 2, key_y), FONT_AXIS, BLACK, centered(), false)?;
    let query_x = origin.0 + FONT_AXIS as i32 / 2;
    text(area, row_title, (query_x, py + ht / 2), FONT_AXIS, BLACK, centered(), true)
}

/// What the block covering `rows × cols` of `values: [Lq, lk]` shows: the mean of its kept cells,
/// the first kept non-finite value, or masked when no cell is kept.
fn block_value(values: &[f32], keep: Option<&[bool]>, lk: usize, rows: Range<usize>, cols: Range<usize>) -> Block {
    let mut sum = 0.0;
    let mut count = 0usize;
    for i in rows {
        for j in cols.clone() {
            let at = i * lk + j;
            if keep.is_some_and(|k| !k[at]) {
                continue;
            }
            let w = values[at];
            if !w.is_finite() {
                return Block::NonFinite(w);
            }
            sum += f64::from(w);
            count += 1;
        }
    }
    match count {
        0 => Block::Masked,
        n => Block::Finite(sum / n as f64),
    }
}

/// Fills one block at `(x0, y0)` of size `(bw, bh)`, writing its value when `value_font` is set and
/// crossing it out when it is non-finite and no value is written; a masked block is hatched and
/// shows no value.
fn cell<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, y0): (i32, i32),
    (bw, bh): (u32, u32),
    block: Block,
    value_font: Option<f64>,
    scale: &ColorScale,
) -> Result<(), String> {
    let (x1, y1) = (x0 + bw as i32, y0 + bh as i32);
    let (fill, value) = match block {
        Block::Finite(v) => (scale.color(v), v as f32),
        Block::NonFinite(v) => (NON_FINITE, v),
        Block::Masked => {
            drawn(area.draw(&Rectangle::new([(x0, y0), (x1, y1)], MASKED.filled())))?;
            return if bw.min(bh) >= 6 { hatch(area, (x0, y0), (x1, y1)) } else { Ok(()) };
        }
    };
    drawn(area.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill.filled())))?;
    if let Some(size) = value_font {
        let center = ((x0 + x1) / 2, (y0 + y1) / 2);
        text(area, &value_text(value), center, size, text_color_on(fill), centered(), false)
    } else if matches!(block, Block::NonFinite(_)) && bw.min(bh) >= 6 {
        cross(area, (x0, y0), (x1, y1))
    } else {
        Ok(())
    }
}

/// Draws the colour bar with its ticks and, when needed, the legend entries for non-finite and
/// masked cells.
fn color_bar<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, bar: &Bar, scale: &ColorScale) -> Result<(), String> {
    let (x, top, h) = (bar.x, bar.top, bar.height as i32);
    let span = f64::from((h - 1).max(1));
    for r in 0..h {
        let v = scale.hi() - f64::from(r) / span * (scale.hi() - scale.lo());
        let row = Rectangle::new([(x, top + r), (x + BAR_W as i32, top + r + 1)], scale.color(v).filled());
        drawn(area.draw(&row))?;
    }
    drawn(area.draw(&Rectangle::new([(x - 1, top - 1), (x + BAR_W as i32, top + h)], AXIS_COLOR)))?;
    let right = x + BAR_W as i32;
    for (v, label) in &bar.ticks {
        let y = top + ((1.0 - scale.fraction(*v)) * span).round() as i32;
        line(area, (right, y), (right + TICK_LEN as i32, y))?;
        let at = (right + (TICK_LEN + GAP) as i32, y);
        text(area, label, at, FONT_TICK, BLACK, Pos::new(HPos::Left, VPos::Center), false)?;
    }
    for &(entry, ly) in &bar.legend {
        let (x1, y1) = (x + LEGEND_BOX as i32, ly + LEGEND_BOX as i32);
        let fill = if entry == LegendEntry::Masked { MASKED } else { NON_FINITE };
        drawn(area.draw(&Rectangle::new([(x, ly), (x1, y1)], fill.filled())))?;
        match entry {
            LegendEntry::NonFinite => cross(area, (x, ly), (x1, y1))?,
            LegendEntry::Masked => hatch(area, (x, ly), (x1, y1))?,
        }
        let at = (x1 + GAP as i32, ly + LEGEND_BOX as i32 / 2);
        text(area, entry.text(), at, FONT_TICK, BLACK, Pos::new(HPos::Left, VPos::Center), false)?;
    }
    Ok(())
}

/// Diagonal hatching, lines rising to the right `HATCH_STEP` pixels apart, inside the box from
/// `(x0, y0)` to `(x1, y1)` (exclusive).
fn hatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
) -> Result<(), String> {
    // Line `s` joins the points `u + v = s`, with `u` rightwards from `x0` and `v` upwards from
    // the bottom row, clipped to the box.
    let (w, h, bottom) = (x1 - x0 - 1, y1 - y0 - 1, y1 - 1);
    let mut s = HATCH_STEP / 2;
    while s < w + h {
        let (u_end, v_end) = (s.min(w), s.min(h));
        let from = (x0 + s - v_end, bottom - v_end);
        let to = (x0 + u_end, bottom - (s - u_end));
        drawn(area.draw(&PathElement::new(vec![from, to], HATCH_COLOR)))?;
        s += HATCH_STEP;
    }
    Ok(())
}

/// White diagonal cross inside the box from `(x0, y0)` to `(x1, y1)` (exclusive).
fn cross<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
) -> Result<(), String> {
    let style = WHITE.stroke_width(1);
    drawn(area.draw(&PathElement::new(vec![(x0 + 1, y0 + 1), (x1 - 2, y1 - 2)], style)))?;
    drawn(area.draw(&PathElement::new(vec![(x0 + 1, y1 - 2), (x1 - 2, y0 + 1)], style)))
}

/// Tick mark from `a` to `b`.
fn line<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, a: (i32, i32), b: (i32, i32)) -> Result<(), String> {
    drawn(area.draw(&PathElement::new(vec![a, b], AXIS_COLOR)))
}

/// Writes `s` at `at` with the embedded font; `rotated` turns it to read bottom to top.
fn text<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &str,
    at: (i32, i32),
    size: f64,
    color: RGBColor,
    anchor: Pos,
    rotated: bool,
) -> Result<(), String> {
    let style = TextStyle::from((FAMILY, size).into_font()).color(&color).pos(anchor);
    let style = if rotated { style.transform(FontTransform::Rotate270) } else { style };
    drawn(area.draw_text(s, &style, at))
}

/// Anchor at the centre of a text.
fn centered() -> Pos {
    Pos::new(HPos::Center, VPos::Center)
}

/// Turns a plotters drawing error into the crate's error text.
fn drawn<T, E: std::fmt::Display>(result: Result<T, E>) -> Result<T, String> {
    result.map_err(|e| format!("drawing failed: {e}"))
}
