//! Layer normalisation over the last dimension as one `CustomOp3` on `(x, weight, bias)`.
//!
//! Forward, per row of `D` values: `mean`, biased `var` (two passes, in the input's precision as
//! PyTorch's CPU kernel does),
//! `rstd = 1/sqrt(var + eps)`, `y = (x − mean)·rstd·weight + bias`.
//! Backward, per row, with `x̂ = (x − mean)·rstd` and `g = dy·weight` (statistics recomputed from
//! `x`, one pass, rather than kept from the forward):
//! `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))`, `dweight = Σ_rows dy·x̂`, `dbias = Σ_rows dy`.
//! Rows are split into a number of groups fixed by the shape; each group sums its own `dweight`
//! and `dbias` and the groups are added in order, so the result does not depend on scheduling.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{add_partials, contiguous, group_len, prepared, rows_per_task, with_values};

/// `x: [.., D]`, `weight: [D]`, `bias: [D]` → `[.., D]`, normalised over the last dimension with
/// the biased variance (PyTorch's `nn.LayerNorm`); differentiable in all three.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    let (x, weight, bias) = (prepared(x)?, prepared(weight)?, prepared(bias)?);
    let weight = weight.to_dtype(x.dtype())?;
    let bias = bias.to_dtype(x.dtype())?;
    x.apply_op3(&weight, &bias, LayerNormOp { eps })
}

struct LayerNormOp {
    eps: f64,
}

/// `mean` and `rstd` of one row.
fn stats<T: WithDType>(row: &[T], eps: f64) -> (T, T) {
    let n = T::from_f64(row.len() as f64);
    let mean = row.iter().fold(T::zero(), |s, &v| s + v) / n;
    let var = row.iter().fold(T::zero(), |s, &v| s + (v - mean) * (v - mean)) / n;
    (mean, T::one() / T::from_f64((var + T::from_f64(eps)).to_f64().sqrt()))
}

fn forward<T: WithDType>(x: &[T], w: &[T], b: &[T], eps: f64) -> Vec<T> {
    let d = w.len();
    let mut y = vec![T::zero(); x.len()];
    y.par_chunks_mut(d * rows_per_task(d)).zip(x.par_chunks(d * rows_per_task(d))).for_each(|(ys, xs)| {
        for (yr, xr) in ys.chunks_mut(d).zip(xs.chunks(d)) {
            let (mean, rstd) = stats(xr, eps);
            for (((yv, &xv), &wv), &bv) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                *yv = (xv - mean) * rstd * wv + bv;
            }
        }
    });
    y
}

/// `(dx, dweight, dbias)` for `x: [rows·D]`, `w: [D]` and `dy: [rows·D]`.
fn backward<T: WithDType>(x: &[T], w: &[T], dy: &[T], eps: f64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let d = w.len();
    let group = group_len(x.len(), d);
    let n = T::from_f64(d as f64);
    let mut dx = vec![T::zero(); x.len()];
    let partials: Vec<Vec<T>> = dx
        .par_chunks_mut(group)
        .zip(x.par_chunks(group))
        .zip(dy.par_chunks(group))
        .map(|((dxs, xs), dys)| {
            let mut sums = vec![T::zero(); 2 * d]; // [dweight | dbias]
            let (dw, db) = sums.split_at_mut(d);
            for ((dxr, xr), dyr) in dxs.chunks_mut(d).zip(xs.chunks(d)).zip(dys.chunks(d)) {
                let (mean, rstd) = stats(xr, eps);
                let (mut g_sum, mut gx_sum) = (T::zero(), T::zero());
                for ((&xv, &gv), &wv) in xr.iter().zip(dyr).zip(w) {
                    g_sum += gv * wv;
                    gx_sum += gv * wv * ((xv - mean) * rstd);
                }
                let (g_mean, gx_mean) = (g_sum / n, gx_sum / n);
                for (j, ((dxv, &xv), &gv)) in dxr.iter_mut().zip(xr).zip(dyr).enumerate() {
                    let xhat = (xv - mean) * rstd;
                    *dxv = rstd * (gv * w[j] - g_mean - xhat * gx_mean);
                    dw[j] += gv * xhat;
                    db[j] += gv;
                }
            }
            sums
        })
        .collect();
    let mut total = add_partials(partials, 2 * d);
    let db = total.split_off(d);
    (dx, total, db)
}

/// The three arguments' values, checked: `weight` and `bias` of the width of `x`'s last dimension.
fn operands<'a, T: WithDType>(
    (s1, l1): (&'a CpuStorage, &Layout),
    (s2, l2): (&'a CpuStorage, &Layout),
    (s3, l3): (&'a CpuStorage, &Layout),
) -> Result<(&'a [T], &'a [T], &'a [T])> {
    let d = l1.dims().last().copied().unwrap_or(0);
    if l2.dims() != [d] || l3.dims() != [d] {
        return Err(candle_core::Error::Msg(format!(
            "layer_norm: weight {:?} and bias {:?} must both be [{d}] for input {:?}",
            l2.dims(),
            l3.dims(),
            l1.dims()
        )));
    }
    Ok((contiguous(s1, l1)?, contiguous(s2, l2)?, contiguous(s3, l3)?))
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let args = ((s1, l1), (s2, l2), (s3, l3));
        let y = per_float!(s1, "layer_norm", |T| operands::<T>(args.0, args.1, args.2)
            .map(|(x, w, b)| forward(x, w, b, self.eps)));
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _bias: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = match x.dtype() {
            candle_core::DType::F64 => grads::<f64>(x, weight, dy, self.eps)?,
            _ => grads::<f32>(x, weight, dy, self.eps)?,
        };
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// The backward on tensors: `x` and `weight` are the op's contiguous arguments.
fn grads<T: WithDType>(x: &Tensor, weight: &Tensor, dy: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let dy = dy.to_dtype(T::DTYPE)?.contiguous()?;
    let (dx, dw, db) = with_values::<T, _>(x, |x| {
        with_values::<T, _>(weight, |w| with_values::<T, _>(&dy, |dy| Ok(backward(x, w, dy, eps))))
    })?;
    let dev = x.device();
    Ok((
        Tensor::from_vec(dx, x.shape(), dev)?,
        Tensor::from_vec(dw, weight.shape(), dev)?,
        Tensor::from_vec(db, weight.shape(), dev)?,
    ))
}
