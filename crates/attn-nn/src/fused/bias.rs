//! `y + bias` over the last dimension as one `CustomOp2` on `(y, bias)`: the forward one pass,
//! the backward `dy` itself for `y` and the column sums of `dy` for `bias`, summed row by row in
//! groups fixed by the shape (see [`group_len`]) and added in order.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{add_partials, contiguous, group_len, prepared, rows_per_task, with_values};

/// `y: [.., N]`, `bias: [N]` → `[.., N]`, `y + bias` on every row; differentiable in both.
pub fn add_bias(y: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let y = prepared(y)?;
    let bias = prepared(bias)?.to_dtype(y.dtype())?;
    y.apply_op2(&bias, AddBiasOp)
}

struct AddBiasOp;

fn forward<T: WithDType>(y: &[T], b: &[T]) -> Vec<T> {
    let n = b.len().max(1);
    let mut out = vec![T::zero(); y.len()];
    out.par_chunks_mut(n * rows_per_task(n)).zip(y.par_chunks(n * rows_per_task(n))).for_each(|(os, ys)| {
        for (or, yr) in os.chunks_mut(n).zip(ys.chunks(n)) {
            or.iter_mut().zip(yr).zip(b).for_each(|((o, &y), &b)| *o = y + b);
        }
    });
    out
}

/// `Σ_rows dy` for `dy: [rows·N]`.
fn column_sums<T: WithDType>(dy: &[T], n: usize) -> Vec<T> {
    let partials: Vec<Vec<T>> = dy
        .par_chunks(group_len(dy.len(), n))
        .map(|rows| {
            let mut sums = vec![T::zero(); n];
            for r in rows.chunks(n) {
                sums.iter_mut().zip(r).for_each(|(s, &v)| *s += v);
            }
            sums
        })
        .collect();
    add_partials(partials, n)
}

impl CustomOp2 for AddBiasOp {
    fn name(&self) -> &'static str {
        "add-bias"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = l1.dims().last().copied().unwrap_or(1);
        if l2.dims() != [n] {
            return Err(candle_core::Error::Msg(format!(
                "add_bias: bias {:?} must be [{n}] for input {:?}",
                l2.dims(),
                l1.dims()
            )));
        }
        // `add_bias` gave the bias the input's dtype; `contiguous` refuses any other.
        let out =
            per_float!(s1, "add_bias", |T| contiguous::<T>(s1, l1).and_then(|y| Ok(forward(y, contiguous(s2, l2)?))));
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, _y: &Tensor, bias: &Tensor, _out: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = bias.elem_count();
        let dyc = dy.to_dtype(bias.dtype())?.contiguous()?;
        let db = match bias.dtype() {
            candle_core::DType::F64 => {
                Tensor::new(with_values::<f64, _>(&dyc, |v| Ok(column_sums(v, n)))?, bias.device())?
            }
            _ => Tensor::new(with_values::<f32, _>(&dyc, |v| Ok(column_sums(v, n)))?, bias.device())?,
        };
        Ok((Some(dy.clone()), Some(db)))
    }
}
