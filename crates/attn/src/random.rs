//! Seeded random tensors for examples and tests: candle's CPU generator cannot be seeded, so this
//! draws from SplitMix64, giving the same values on every machine for the same seed.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// An `f32` CPU tensor of `shape` (any rank) with values uniform in `[lo, hi)`, a pure function
/// of `(shape, lo, hi, seed)`.
pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data = attn_kernels::rng::SplitMix64::new(seed).uniform(n, lo, hi);
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}
