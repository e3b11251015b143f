//! Seeded random tensors for examples and tests: candle's CPU generator cannot be seeded, so this
//! draws from SplitMix64, giving the same values on every machine for the same seed.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// An `f32` CPU tensor of `shape` (any rank) with values uniform in `[lo, hi)`, a pure function
/// of `(shape, lo, hi, seed)`.
pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let mut state = seed;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * unit
        })
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}
