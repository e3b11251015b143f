//! Input checks for heatmaps: sizes, value and keep-flag counts, label counts.

use super::{Cells, HeatmapStyle};

/// Checks `cells` (values `[heads, lq, lk]`, `heads` being `None` for a single `[lq, lk]` matrix,
/// and keep flags of the same length) and the label counts in `style`; the error says what is
/// wrong, with expected and found values.
pub(super) fn check(cells: &Cells, style: &HeatmapStyle) -> Result<(), String> {
    let Cells { values: weights, keep, heads, lq, lk } = *cells;
    if heads == Some(0) {
        return Err("heads is 0: there are no heads to draw".into());
    }
    if lq == 0 {
        return Err("lq is 0: there are no query rows to draw".into());
    }
    if lk == 0 {
        return Err("lk is 0: there are no key columns to draw".into());
    }
    let h = heads.unwrap_or(1);
    let shape = match heads {
        Some(h) => format!("heads*lq*lk = {h}*{lq}*{lk}"),
        None => format!("lq*lk = {lq}*{lk}"),
    };
    let expected =
        h.checked_mul(lq).and_then(|n| n.checked_mul(lk)).ok_or_else(|| format!("{shape} overflows usize"))?;
    if weights.len() != expected {
        return Err(format!("weights has {} values, expected {shape} = {expected}", weights.len()));
    }
    if let Some(keep) = keep.filter(|k| k.len() != expected) {
        return Err(format!("keep has {} flags, expected {shape} = {expected}", keep.len()));
    }
    check_labels("query_labels", style.query_labels.as_deref(), "lq", lq)?;
    check_labels("key_labels", style.key_labels.as_deref(), "lk", lk)
}

/// Checks that `labels` (if given) has one entry per row or column.
fn check_labels(field: &str, labels: Option<&[String]>, dim: &str, n: usize) -> Result<(), String> {
    match labels {
        Some(labels) if labels.len() != n => {
            Err(format!("style.{field} has {} labels, expected {dim} = {n}", labels.len()))
        }
        _ => Ok(()),
    }
}
