//! `max(x, 0)` as one `CustomOp1` with PyTorch's gradient: `dx = dy` where the output is
//! positive, 0 elsewhere (0 at `x = 0`), computed in one pass from the saved output. NaN inputs stay
//! NaN in the output (PyTorch's `relu` propagates them; `f32::max` would not).

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous, prepared, with_values, PER_TASK};

/// `x: [..]` → the same shape, `max(x, 0)` with NaN kept; differentiable.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    prepared(x)?.apply_op1(ReluOp)
}

struct ReluOp;

/// `f(a, b)` over two equally long slices, split over rayon's threads.
fn zip_map<T: WithDType>(a: &[T], b: &[T], f: impl Fn(T, T) -> T + Sync) -> Vec<T> {
    let mut out = vec![T::zero(); a.len()];
    out.par_chunks_mut(PER_TASK).zip(a.par_chunks(PER_TASK).zip(b.par_chunks(PER_TASK))).for_each(|(o, (a, b))| {
        o.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (&a, &b))| *o = f(a, b));
    });
    out
}

/// `max(x, 0)`, keeping NaN.
fn positive<T: WithDType>(x: T) -> T {
    if x.partial_cmp(&T::zero()) == Some(std::cmp::Ordering::Greater) || x.to_f64().is_nan() {
        x
    } else {
        T::zero()
    }
}

/// `dy` where `y > 0`, else 0.
fn gated<T: WithDType>(y: T, dy: T) -> T {
    if y > T::zero() {
        dy
    } else {
        T::zero()
    }
}

fn backward<T: WithDType>(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let dy = dy.to_dtype(T::DTYPE)?.contiguous()?;
    let dx = with_values::<T, _>(y, |ys| with_values::<T, _>(&dy, |dys| Ok(zip_map(ys, dys, gated))))?;
    Tensor::from_vec(dx, y.shape(), y.device())
}

impl CustomOp1 for ReluOp {
    fn name(&self) -> &'static str {
        "relu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = per_float!(s, "relu", |T| contiguous::<T>(s, l).map(|x| zip_map(x, x, |x, _| positive(x))));
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let y = y.contiguous()?;
        Ok(Some(match y.dtype() {
            candle_core::DType::F64 => backward::<f64>(&y, dy)?,
            _ => backward::<f32>(&y, dy)?,
        }))
    }
}
