//! Dropout as one `CustomOp1`: `y = x · m`, `m_i = 1/(1 − p)` where the `i`-th value of the
//! SplitMix64 stream from `seed` is at least `p` and 0 elsewhere, and `dx = dy · m`. The forward
//! draws the stream in parallel, each task of [`PER_TASK`] elements from its own first index
//! ([`SplitMix64::at`]), so the mask is the serial stream's whatever the thread count, and keeps
//! its decisions as bits (1/32 of an `f32` tensor's size) for the backward, which draws nothing.
//! candle's `x * mask` was a serial draw, a mask tensor and a product whose backward also made
//! (and accumulated) a gradient for the constant mask.

use std::sync::OnceLock;

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
    prepared(x)?.apply_op1(DropoutOp { p, seed, kept: OnceLock::new() })?.to_dtype(x.dtype())
}

struct DropoutOp {
    p: f32,
    seed: u64,
    /// The forward's keep decisions, a bit per element (`[elements / 64]`), for the backward.
    kept: OnceLock<Vec<u64>>,
}

/// Keep bits per task: [`PER_TASK`] is a multiple of 64, so tasks own whole words.
const WORDS: usize = PER_TASK / 64;

/// `v · m` for the keep bits `bits` of `v`'s elements (bit `i % 64` of word `i / 64`).
fn masked<T: WithDType>(v: T, bits: u64, i: usize, scale: T) -> T {
    v * if bits >> (i % 64) & 1 == 1 { scale } else { T::zero() }
}

impl DropoutOp {
    fn scale<T: WithDType>(&self) -> T {
        T::from_f64(f64::from(1.0 / (1.0 - self.p)))
    }

    /// `x · m`, drawing the stream: each task from its own first index, keeping its bits.
    fn forward<T: WithDType>(&self, x: &[T]) -> Vec<T> {
        let scale = self.scale::<T>();
        let mut y = vec![T::zero(); x.len()];
        let mut kept = vec![0u64; x.len().div_ceil(64)];
        y.par_chunks_mut(PER_TASK).zip(x.par_chunks(PER_TASK)).zip(kept.par_chunks_mut(WORDS)).enumerate().for_each(
            |(task, ((ys, xs), words))| {
                let mut rng = SplitMix64::at(self.seed, (task * PER_TASK) as u64);
                for ((ys, xs), word) in ys.chunks_mut(64).zip(xs.chunks(64)).zip(words) {
                    for (i, (y, &x)) in ys.iter_mut().zip(xs).enumerate() {
                        *word |= u64::from(rng.unit_f32() >= self.p) << i;
                        *y = masked(x, *word, i, scale);
                    }
                }
            },
        );
        // A second forward of the same op (none in candle) would draw the same bits.
        let _ = self.kept.set(kept);
        y
    }

    /// `dy · m` with the forward's bits.
    fn backward<T: WithDType>(&self, dy: &[T]) -> Result<Vec<T>> {
        let kept = self.kept.get().ok_or_else(|| candle_core::Error::Msg("dropout: backward before forward".into()))?;
        let scale = self.scale::<T>();
        let mut dx = vec![T::zero(); dy.len()];
        dx.par_chunks_mut(PER_TASK).zip(dy.par_chunks(PER_TASK)).zip(kept.par_chunks(WORDS)).for_each(
            |((dxs, dys), words)| {
                for ((dxs, dys), &word) in dxs.chunks_mut(64).zip(dys.chunks(64)).zip(words) {
                    for (i, (dx, &dy)) in dxs.iter_mut().zip(dys).enumerate() {
                        *dx = masked(dy, word, i, scale);
                    }
                }
            },
        );
        Ok(dx)
    }
}

impl CustomOp1 for DropoutOp {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = per_float!(s, "dropout", |T| contiguous::<T>(s, l).map(|x| self.forward(x)));
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dy = dy.to_dtype(x.dtype())?.contiguous()?;
        let dx = match x.dtype() {
            candle_core::DType::F64 => {
                Tensor::from_vec(with_values::<f64, _>(&dy, |d| self.backward(d))?, x.shape(), x.device())
            }
            _ => Tensor::from_vec(with_values::<f32, _>(&dy, |d| self.backward(d))?, x.shape(), x.device()),
        };
        Ok(Some(dx?))
    }
}
