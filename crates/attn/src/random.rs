//! Seeded random tensors for examples, tests and benchmarks: candle's CPU generator cannot be
//! seeded, so this draws from SplitMix64, giving the same values on every machine for the same
//! seed. A shape too large to hold is an error, never an abort.

use attn_kernels::alloc::{self, Elem};
/// The generator behind these tensors, for crates that draw plain values (parameter
/// initialisation, data sampling): the SplitMix64 stream and its output function.
pub use attn_kernels::rng::{splitmix64, SplitMix64};
use candle_core::{DType, Device, Tensor, WithDType};
use half::{bf16, f16};

use crate::error::{AttnLibError, Result};

/// An `f32` CPU tensor of `shape` (any rank) with values uniform in `[lo, hi)`, a pure function
/// of `(shape, lo, hi, seed)`.
pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Result<Tensor> {
    uniform_as(shape, lo, hi, seed, DType::F32)
}

/// [`uniform`]'s values rounded to `dtype` (`f32`, `f16`, `bf16` or `f64`), drawn straight into
/// a tensor of that type.
pub fn uniform_as(shape: &[usize], lo: f32, hi: f32, seed: u64, dtype: DType) -> Result<Tensor> {
    fn draw<T: Elem + WithDType>(shape: &[usize], lo: f32, hi: f32, seed: u64, f: fn(f32) -> T) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        let data = alloc::collect("random values", shape, rng.uniform_iter(lo, hi).map(f))?;
        Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
    }
    match dtype {
        DType::F32 => draw(shape, lo, hi, seed, |x| x),
        DType::F16 => draw(shape, lo, hi, seed, f16::from_f32),
        DType::BF16 => draw(shape, lo, hi, seed, bf16::from_f32),
        DType::F64 => draw(shape, lo, hi, seed, f64::from),
        found => Err(AttnLibError::DType { tensor: "random values", found, expected: "f32, f16, bf16 or f64" }),
    }
}
