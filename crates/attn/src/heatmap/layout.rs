//! Pixel geometry of a heatmap figure: axes (blocks, ticks, labels), panel boxes, grid placement,
//! colour bar and overall size. Coordinates are pixels from the top-left corner.

use std::ops::Range;

use super::scale::ColorScale;
use super::HeatmapStyle;
use crate::picture::font::text_size;

/// Font size of the figure title.
pub(super) const FONT_TITLE: f64 = 20.0;
/// Font size of the `head h` panel titles.
pub(super) const FONT_PANEL_TITLE: f64 = 16.0;
/// Font size of the axis titles (`Key` and `Query` by default).
pub(super) const FONT_AXIS: f64 = 15.0;
/// Font size of tick labels.
pub(super) const FONT_TICK: f64 = 12.0;
/// Length of tick marks.
pub(super) const TICK_LEN: u32 = 4;
/// Space between a text and what it labels.
pub(super) const GAP: u32 = 6;
/// Width of the colour bar.
pub(super) const BAR_W: u32 = 18;
/// Side of a legend entry's box.
pub(super) const LEGEND_BOX: u32 = 12;

const MARGIN: u32 = 16;
const PANEL_GAP: u32 = 24;
const BAR_GAP: u32 = 24;
const MIN_BAR_H: u32 = 160;
const MAX_CELL_PX: u32 = 56;
const MIN_VALUE_CELL_PX: u32 = 34;
const MAX_VALUE_CELLS: usize = 16;
const SINGLE_PANEL_PX: u32 = 640;
const GRID_WIDTH_PX: u32 = 1800;
const MIN_GRID_PANEL_PX: u32 = 160;
const MAX_GRID_PANEL_PX: u32 = 480;
const MAX_LABEL_CHARS: usize = 14;
const MAX_PIXELS: u64 = 32 << 20;

/// One tick: the row or column it marks and its label.
#[derive(Debug, Clone)]
pub(super) struct Tick {
    /// Row or column index.
    pub index: usize,
    /// Label text (token or index).
    pub text: String,
}

/// One axis of a panel: `n` cells drawn as `blocks` blocks of `block_px` pixels each.
#[derive(Debug, Clone)]
pub(super) struct Axis {
    /// Number of cells (rows or columns).
    pub n: usize,
    /// Number of drawn blocks, `min(n, panel target)`.
    pub blocks: usize,
    /// Pixels per block.
    pub block_px: u32,
    /// Labelled rows or columns, thinned so labels do not overlap.
    pub ticks: Vec<Tick>,
    /// Width in pixels of the widest tick label.
    pub label_w: u32,
}

impl Axis {
    /// Lays out `n` cells in about `target` pixels; `spacing(label_w)` is the room one label needs
    /// along the axis.
    fn new(n: usize, target: u32, labels: Option<&[String]>, spacing: impl Fn(u32) -> u32) -> Result<Self, String> {
        let blocks = n.min(target as usize);
        let block_px = (target / blocks as u32).clamp(1, MAX_CELL_PX);
        let text = |i: usize| labels.map_or_else(|| i.to_string(), |l| label_text(&l[i]));
        let label_w = match labels {
            Some(labels) => {
                labels.iter().try_fold(0, |w, l| Ok::<_, String>(w.max(text_size(&label_text(l), FONT_TICK)?.0)))?
            }
            None => text_size(&(n - 1).to_string(), FONT_TICK)?.0,
        };
        let cell_px = f64::from(blocks as u32 * block_px) / n as f64;
        let step = nice_step((f64::from(spacing(label_w)) / cell_px).ceil() as usize);
        let ticks = (0..n).step_by(step).map(|index| Tick { index, text: text(index) }).collect();
        Ok(Self { n, blocks, block_px, ticks, label_w })
    }

    /// Length of the axis in pixels.
    pub(super) fn extent(&self) -> u32 {
        self.blocks as u32 * self.block_px
    }

    /// Offset in pixels of the middle of cell `i` from the start of the axis.
    pub(super) fn center(&self, i: usize) -> i32 {
        ((i as f64 + 0.5) * f64::from(self.extent()) / self.n as f64) as i32
    }

    /// Cells covered by block `b`.
    pub(super) fn block_cells(&self, b: usize) -> Range<usize> {
        let at = |b: usize| (b as u128 * self.n as u128 / self.blocks as u128) as usize;
        at(b)..at(b + 1)
    }

    /// Whether each block is exactly one cell.
    fn one_cell_per_block(&self) -> bool {
        self.blocks == self.n
    }
}

/// Smallest of 1, 2, 5, 10, 20, 50, ... that is at least `at_least`.
fn nice_step(at_least: usize) -> usize {
    let mut base = 1usize;
    loop {
        for m in [1, 2, 5] {
            let step = base.saturating_mul(m);
            if step >= at_least || step == usize::MAX {
                return step.max(1);
            }
        }
        base = base.saturating_mul(10);
    }
}

/// A token label as drawn: control characters escaped, cut to `MAX_LABEL_CHARS` characters.
fn label_text(label: &str) -> String {
    let mut visible = String::new();
    for c in label.chars() {
        if c.is_control() {
            visible.extend(c.escape_debug());
        } else {
            visible.push(c);
        }
    }
    if visible.chars().count() > MAX_LABEL_CHARS {
        visible.chars().take(MAX_LABEL_CHARS - 1).chain(Some('…')).collect()
    } else {
        visible
    }
}

/// Box of one panel: title band, left band (axis title and row labels), plot, bottom band (column
/// labels and axis title), right padding.
#[derive(Debug, Clone)]
pub(super) struct Panel {
    /// Column axis (keys).
    pub x: Axis,
    /// Row axis (queries).
    pub y: Axis,
    /// Whether column labels are drawn vertically.
    pub x_rotated: bool,
    /// Height of the `head h` title band (0 for a single heatmap).
    pub title_h: u32,
    /// Width of the band left of the plot.
    pub left_w: u32,
    /// Height of the band below the plot.
    pub bottom_h: u32,
    /// Width of the padding right of the plot.
    pub right_w: u32,
    /// Font size of the values written in the cells, when they are written.
    pub value_font: Option<f64>,
}

impl Panel {
    fn new(lq: usize, lk: usize, target: u32, titled: bool, style: &HeatmapStyle) -> Result<Self, String> {
        let row_spacing = FONT_TICK as u32 + 3;
        let y = Axis::new(lq, target, style.query_labels.as_deref(), |_| row_spacing)?;
        let horizontal = |w: u32| w + 2 * GAP;
        let x_try = Axis::new(lk, target, style.key_labels.as_deref(), horizontal)?;
        let x_rotated = style.key_labels.is_some() && horizontal(x_try.label_w) > x_try.block_px;
        let x = if x_rotated { Axis::new(lk, target, style.key_labels.as_deref(), |_| row_spacing)? } else { x_try };
        let value_cells = lq <= MAX_VALUE_CELLS && lk <= MAX_VALUE_CELLS;
        let value_font = (value_cells
            && x.one_cell_per_block()
            && y.one_cell_per_block()
            && x.block_px.min(y.block_px) >= MIN_VALUE_CELL_PX)
            .then(|| (f64::from(x.block_px) / 3.2).clamp(9.0, 14.0));
        let x_labels_h = if x_rotated { x.label_w } else { FONT_TICK as u32 };
        let last_x_label_w = x.ticks.last().map_or(Ok(0), |t| text_size(&t.text, FONT_TICK).map(|s| s.0))?;
        let right_w = if x_rotated { GAP } else { (last_x_label_w / 2).max(GAP) };
        Ok(Self {
            title_h: if titled { FONT_PANEL_TITLE as u32 + 2 * GAP } else { 0 },
            left_w: FONT_AXIS as u32 + 2 * GAP + y.label_w + TICK_LEN,
            bottom_h: TICK_LEN + GAP + x_labels_h + 2 * GAP + FONT_AXIS as u32,
            right_w,
            x,
            y,
            x_rotated,
            value_font,
        })
    }

    /// Top-left corner of the plot relative to the panel.
    pub(super) fn plot_offset(&self) -> (i32, i32) {
        (self.left_w as i32, self.title_h as i32)
    }

    /// Width and height of the panel.
    pub(super) fn size(&self) -> (u32, u32) {
        (self.left_w + self.x.extent() + self.right_w, self.title_h + self.y.extent() + self.bottom_h)
    }
}

/// An entry of the legend under the colour bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LegendEntry {
    /// Cells holding NaN or ±inf.
    NonFinite,
    /// Masked cells.
    Masked,
}

impl LegendEntry {
    /// The entry's text.
    pub(super) fn text(self) -> &'static str {
        match self {
            LegendEntry::NonFinite => "NaN / inf",
            LegendEntry::Masked => "masked",
        }
    }
}

/// Which legend entries a figure needs.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Legend {
    /// Some kept cell is NaN or ±inf.
    pub non_finite: bool,
    /// Some cell is masked.
    pub masked: bool,
}

impl Legend {
    /// The entries needed, top to bottom.
    fn entries(self) -> Vec<LegendEntry> {
        let wanted = [(self.non_finite, LegendEntry::NonFinite), (self.masked, LegendEntry::Masked)];
        wanted.into_iter().filter_map(|(needed, entry)| needed.then_some(entry)).collect()
    }
}

/// Placement of the colour bar.
#[derive(Debug, Clone)]
pub(super) struct Bar {
    /// Left edge.
    pub x: i32,
    /// Top edge (value `hi`).
    pub top: i32,
    /// Height in pixels.
    pub height: u32,
    /// Tick values and texts.
    pub ticks: Vec<(f64, String)>,
    /// The legend entries needed, each with its top edge.
    pub legend: Vec<(LegendEntry, i32)>,
}

/// Whole figure: title, panels in a grid, colour bar.
#[derive(Debug, Clone)]
pub(super) struct Figure {
    /// Box of every panel.
    pub panel: Panel,
    /// Number of panels.
    pub heads: usize,
    /// Whether panels carry `head h` titles.
    pub panel_titles: bool,
    /// Figure title and the centre of its band.
    pub title: Option<(String, (i32, i32))>,
    /// Titles of the row and column axes.
    pub axis_titles: (String, String),
    /// Colour bar.
    pub bar: Bar,
    /// Width and height in pixels.
    pub size: (u32, u32),
    cols: usize,
    grid_origin: (i32, i32),
}

impl Figure {
    /// Lays out `heads` panels (`None`: one panel without a title) of `[lq, lk]` cells.
    pub(super) fn new(
        heads: Option<usize>,
        lq: usize,
        lk: usize,
        style: &HeatmapStyle,
        scale: &ColorScale,
        legend: Legend,
    ) -> Result<Self, String> {
        let n_panels = heads.unwrap_or(1);
        let cols = (n_panels as f64).sqrt().ceil().max(1.0) as usize;
        let rows = n_panels.div_ceil(cols);
        let target = match heads {
            None => SINGLE_PANEL_PX,
            Some(_) => {
                (GRID_WIDTH_PX / cols.min(GRID_WIDTH_PX as usize) as u32).clamp(MIN_GRID_PANEL_PX, MAX_GRID_PANEL_PX)
            }
        };
        let panel = Panel::new(lq, lk, target, heads.is_some(), style)?;
        let (pw, ph) = panel.size();
        let grid_w = cols as u64 * u64::from(pw) + (cols as u64 - 1) * u64::from(PANEL_GAP);
        let grid_h = rows as u64 * u64::from(ph) + (rows as u64 - 1) * u64::from(PANEL_GAP);

        let title_h = if style.title.is_some() { FONT_TITLE as u32 + 2 * GAP } else { 0 };
        let title_w = match &style.title {
            Some(t) => text_size(t, FONT_TITLE)?.0,
            None => 0,
        };
        let grid_origin = (MARGIN as i32, (MARGIN + title_h) as i32);

        let ticks = scale.ticks();
        let tick_w = ticks.iter().try_fold(0, |w, (_, t)| Ok::<_, String>(w.max(text_size(t, FONT_TICK)?.0)))?;
        let entries = legend.entries();
        let legend_w = entries
            .iter()
            .try_fold(0, |w, e| Ok::<_, String>(w.max(LEGEND_BOX + GAP + text_size(e.text(), FONT_TICK)?.0)))?;
        let bar_col_w = BAR_GAP + (BAR_W + TICK_LEN + GAP + tick_w).max(legend_w);
        let bar_top = u64::from(MARGIN + title_h + panel.title_h);
        let bar_bottom = u64::from(MARGIN + title_h) + grid_h - u64::from(panel.bottom_h);
        let bar_h = (bar_bottom - bar_top).max(u64::from(MIN_BAR_H));
        let legend_top = bar_top + bar_h + u64::from(FONT_TICK as u32 + 2 * GAP);
        let entry_top = |i: usize| legend_top + i as u64 * u64::from(LEGEND_BOX + GAP);
        let bar_end = match entries.len() {
            0 => bar_top + bar_h + u64::from(FONT_TICK as u32),
            n => entry_top(n - 1) + u64::from(LEGEND_BOX),
        };

        let width = (u64::from(MARGIN) + grid_w + u64::from(bar_col_w + MARGIN)).max(u64::from(title_w + 2 * MARGIN));
        let height = (u64::from(MARGIN + title_h) + grid_h).max(bar_end) + u64::from(MARGIN);
        if width.saturating_mul(height) > MAX_PIXELS {
            return Err(format!(
                "the picture would be {width}x{height} pixels, more than the limit of {MAX_PIXELS} \
                 pixels; draw fewer heads or a smaller matrix"
            ));
        }
        let bar_x = (u64::from(MARGIN) + grid_w + u64::from(BAR_GAP)) as i32;
        Ok(Self {
            panel,
            heads: n_panels,
            panel_titles: heads.is_some(),
            title: style.title.clone().map(|t| (t, ((width / 2) as i32, (MARGIN + title_h / 2) as i32))),
            axis_titles: (
                style.row_title.clone().unwrap_or_else(|| "Query".into()),
                style.column_title.clone().unwrap_or_else(|| "Key".into()),
            ),
            bar: Bar {
                x: bar_x,
                top: bar_top as i32,
                height: bar_h as u32,
                ticks,
                legend: entries.iter().enumerate().map(|(i, &e)| (e, entry_top(i) as i32)).collect(),
            },
            size: (width as u32, height as u32),
            cols,
            grid_origin,
        })
    }

    /// Top-left corner of the panel of head `h`.
    pub(super) fn panel_origin(&self, h: usize) -> (i32, i32) {
        let (pw, ph) = self.panel.size();
        let (row, col) = ((h / self.cols) as i32, (h % self.cols) as i32);
        (self.grid_origin.0 + col * (pw + PANEL_GAP) as i32, self.grid_origin.1 + row * (ph + PANEL_GAP) as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0), 1);
        assert_eq!(nice_step(1), 1);
        assert_eq!(nice_step(3), 5);
        assert_eq!(nice_step(11), 20);
        assert_eq!(nice_step(51), 100);
    }

    #[test]
    fn labels_are_escaped_and_cut() {
        assert_eq!(label_text("a\nb"), "a\\nb");
        assert_eq!(label_text("<s>"), "<s>");
        assert_eq!(label_text("abcdefghijklmnopq"), "abcdefghijklm…");
    }
}
