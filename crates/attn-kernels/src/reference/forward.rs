//! The reference forward: attention computed as the formula in the parent module's header reads,
//! one query row at a time (steps 1 to 5 there), in the caller's precision.

use super::{row_scores, softmax_stats, Real, Score};
use crate::alloc;
use crate::error::Result;
use crate::lse::lse_parts;
use crate::output::AttnOutput;
use crate::problem::{AttnParams, Problem};
use crate::view::View4;

/// Reference attention. `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`;
/// returns `out: [B, Hq, Lq, Dv]`, `lse: [B, Hq, Lq]` and, with `want_weights`,
/// `weights: [B, Hq, Lq, Lk]`.
pub fn reference<T: Real>(
    q: &View4<T>,
    k: &View4<T>,
    v: &View4<T>,
    params: &AttnParams<T>,
    want_weights: bool,
) -> Result<AttnOutput<T>> {
    let pb = Problem::new(q.dims(), k.dims(), v.dims(), params)?;
    let d = pb.dims;
    let AttnOutput { mut out, mut lse, mut lse_residue, mut weights, .. } =
        AttnOutput::alloc(&d, want_weights, T::neg_infinity())?;
    let mut scores: Vec<Option<Score<T>>> = alloc::filled("scores of a row", &[d.lk], None)?;
    for b in 0..d.b {
        for h in 0..d.hq {
            let kvh = h / d.group();
            for i in 0..d.lq {
                let row = (b * d.hq + h) * d.lq + i;
                // Steps 1 and 2.
                row_scores(&pb, q, k, [b, h, i], &mut scores);
                // Step 3: softmax statistics (the sink only joins them).
                let Some((m, l)) = softmax_stats(&scores, pb.sink(h)) else { continue };
                (lse[row], lse_residue[row]) = lse_parts(m, l);
                // Steps 3 to 5: weights, dropout, weighted sum of values.
                let key = pb.dropout.map(|dr| dr.row_key(b, h, i, [d.hq, d.lq]));
                let oi = &mut out[row * d.dv..(row + 1) * d.dv];
                for (j, s) in scores.iter().enumerate() {
                    let Some(sc) = s else { continue };
                    let w = (sc.s - m).exp() / l;
                    if let Some(ws) = weights.as_mut() {
                        ws[row * d.lk + j] = w;
                    }
                    let w = match (pb.dropout, key) {
                        (Some(dr), Some(key)) if !dr.keeps(key, j) => continue,
                        (Some(dr), _) => w * T::from_f32(dr.scale()).unwrap(),
                        _ => w,
                    };
                    for (o, &x) in oi.iter_mut().zip(v.row(b, kvh, j)) {
                        *o = *o + w * x;
                    }
                }
            }
        }
    }
    Ok(AttnOutput { out, lse, lse_residue, weights, path: None })
}
