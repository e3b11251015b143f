//! Dropout as one `CustomOp1`: `y = x · m`, `m_i = 1/(1 − p)` where the `i`-th value of the
//! SplitMix64 stream from `seed` is at least `p` and 0 elsewhere, and `dx = dy · m` from the same
//! stream. The mask is never stored: each task of [`PER_TASK`] elements draws its part of the
//! stream from its own first index ([`SplitMix64::at`]), so the mask is the serial stream's
//! whatever the thread count. candle's `x * mask` was a serial draw, a mask tensor and a product
//! whose backward also made (and accumulated) a gradient for the constant mask.

use attn::random::SplitMix64;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous, prepared, with_values, PER_TASK};

/// `x: [..]` → the same shape, each element kept and scaled by `1/(1 − p)` or zeroed as the
/// stream from `seed` draws (`0 ≤ p < 1`); differentiable. A dropped NaN stays NaN (`NaN · 0`), as
/// with a mask product. Other dtypes than `f32`, `f64` are computed in `f32` and cast back.
pub fn dropout(x: &Tensor, p: f32, seed: u64) -> Result<Tensor> {
    if !(0.0..1.0).contains(&p) {
        return Err(candle_core::Error::Msg(format!("dropout: probability {p} outside [0, 1)")));
    }
    prepared(x)?.apply_op1(DropoutOp { p, seed })?.to_dtype(x.dtype())
}

struct DropoutOp {
    p: f32,
    seed: u64,
}

impl DropoutOp {
    /// `x · m` over the whole stream.
    fn apply<T: WithDType>(&self, x: &[T]) -> Vec<T> {
        let scale = T::from_f64(f64::from(1.0 / (1.0 - self.p)));
        let mut y = vec![T::zero(); x.len()];
        y.par_chunks_mut(PER_TASK).zip(x.par_chunks(PER_TASK)).enumerate().for_each(|(task, (ys, xs))| {
            let mut rng = SplitMix64::at(self.seed, (task * PER_TASK) as u64);
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = x * if rng.unit_f32() >= self.p { scale } else { T::zero() };
            }
        });
        y
    }
}

impl CustomOp1 for DropoutOp {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = per_float!(s, "dropout", |T| contiguous::<T>(s, l).map(|x| self.apply(x)));
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dy = dy.to_dtype(x.dtype())?.contiguous()?;
        let dx = match x.dtype() {
            candle_core::DType::F64 => {
                Tensor::from_vec(with_values::<f64, _>(&dy, |d| Ok(self.apply(d)))?, x.shape(), x.device())
            }
            _ => Tensor::from_vec(with_values::<f32, _>(&dy, |d| Ok(self.apply(d)))?, x.shape(), x.device()),
        };
        Ok(Some(dx?))
    }
}
