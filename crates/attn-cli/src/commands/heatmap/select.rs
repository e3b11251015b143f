//! What `attn heatmap` draws out of a weights tensor: one batch entry and one head (or all heads)
//! of a rank 2 `[Lq, Lk]`, 3 `[H, Lq, Lk]` or 4 `[B, H, Lq, Lk]` float tensor, as `f32`, with the
//! same cells of a keep-mask broadcast to the tensor's shape. Each refusal names the file, the
//! tensor and what was expected versus found.

use crate::io::{HostTensor, IoError, IoErrorKind};

/// Which heads to draw.
#[derive(Debug, Clone, Copy)]
pub(super) enum Heads {
    /// One head, by index.
    One(usize),
    /// Every head, one panel each.
    All,
}

/// The matrices to draw.
#[derive(Debug)]
pub(super) struct Picked {
    /// `[heads, lq, lk]`, row-major.
    pub data: Vec<f32>,
    /// The keep flags of the same cells (`false` = masked), when a mask was given.
    pub keep: Option<Vec<bool>>,
    /// Number of matrices in `data` (1 unless all heads were asked for).
    pub heads: usize,
    /// Query rows per matrix.
    pub lq: usize,
    /// Key columns per matrix.
    pub lk: usize,
    /// Which batch entry and heads were picked, e.g. `batch 1, head 0`; empty for a rank 2 tensor.
    pub place: String,
}

/// The dimension names of each accepted rank, from rank 2 up.
const LAYOUTS: [&str; 3] = ["[Lq, Lk]", "[H, Lq, Lk]", "[B, H, Lq, Lk]"];

/// Picks batch entry `batch` and `heads` of tensor `name` of `file`; `t` is `[Lq, Lk]` (batch and
/// head must then be 0), `[H, Lq, Lk]` (batch must be 0) or `[B, H, Lq, Lk]`, of any float type.
/// `keep`, when given, holds one flag per element of `t` (see [`keep_flags`]).
pub(super) fn pick(
    file: &str,
    name: &str,
    t: &HostTensor,
    keep: Option<&[bool]>,
    batch: usize,
    heads: Heads,
) -> Result<Picked, IoError> {
    let fail = |kind| IoError::tensor(file, name, kind);
    let shape = t.shape.as_slice();
    let (b, h, lq, lk) = match *shape {
        [lq, lk] => (1, 1, lq, lk),
        [h, lq, lk] => (1, h, lq, lk),
        [b, h, lq, lk] => (b, h, lq, lk),
        _ => {
            let expected = format!("rank 2 {}, 3 {} or 4 {}", LAYOUTS[0], LAYOUTS[1], LAYOUTS[2]);
            return Err(fail(IoErrorKind::Shape { found: shape.to_vec(), expected }));
        }
    };
    let layout = LAYOUTS[shape.len() - 2];
    if lq == 0 || lk == 0 {
        let expected = format!("{layout} with Lq > 0 and Lk > 0");
        return Err(fail(IoErrorKind::Shape { found: shape.to_vec(), expected }));
    }
    // `present`: whether the dimension is in the shape (an absent one has the single index 0).
    let out_of_range = |flag: &str, value: usize, dim: &str, n: usize, present: bool| {
        let expected = match n {
            _ if !present => format!("0, as {layout} has no {dim} dimension"),
            0 => format!("none, as {dim} is 0"),
            1 => "0".to_string(),
            n => format!("0 to {}", n - 1),
        };
        fail(IoErrorKind::Value(format!(
            "{flag} {value} is out of range for shape {shape:?} {layout}, expected {expected}"
        )))
    };
    if batch >= b {
        return Err(out_of_range("--batch", batch, "B", b, shape.len() == 4));
    }
    let (first, count) = match heads {
        Heads::One(head) if head >= h => return Err(out_of_range("--head", head, "H", h, shape.len() >= 3)),
        Heads::One(head) => (head, 1),
        Heads::All if h == 0 => {
            let expected = format!("{layout} with H > 0 for --all-heads");
            return Err(fail(IoErrorKind::Shape { found: shape.to_vec(), expected }));
        }
        Heads::All => (0, h),
    };
    let values = t.to_f32_vec().map_err(fail)?;
    let matrix = lq * lk;
    let start = (batch * h + first) * matrix;
    let data = values[start..start + count * matrix].to_vec();
    let keep = keep.map(|k| k[start..start + count * matrix].to_vec());
    let mut parts = Vec::new();
    if shape.len() == 4 {
        parts.push(format!("batch {batch}"));
    }
    if shape.len() >= 3 {
        parts.push(match heads {
            Heads::One(head) => format!("head {head}"),
            Heads::All => format!("all {h} heads"),
        });
    }
    Ok(Picked { data, keep, heads: count, lq, lk, place: parts.join(", ") })
}

/// The keep flags (`true` = may attend) of the mask tensor `mask` of `file` (BOOL or U8)
/// broadcast, right-aligned, to `shape`, row-major.
pub(super) fn keep_flags(file: &str, mask: HostTensor, shape: &[usize]) -> Result<Vec<bool>, IoError> {
    let fail = |kind| IoError::tensor(file, "mask", kind);
    let found = mask.shape.clone();
    let broadcast = mask.into_mask_tensor().map_err(fail)?.broadcast_as(shape).map_err(|_| {
        fail(IoErrorKind::Shape { found, expected: format!("broadcastable to the weights' shape {shape:?}") })
    })?;
    let flags = broadcast.flatten_all().and_then(|f| f.to_vec1::<u8>());
    Ok(flags.map_err(|e| fail(IoErrorKind::Value(format!("candle: {e}"))))?.into_iter().map(|x| x != 0).collect())
}
