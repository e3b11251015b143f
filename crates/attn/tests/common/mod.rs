//! Helpers shared by the library's test suites: random tensors, flattening to `f32`, the largest
//! difference of two results.

// Each test binary uses its own subset.
#![allow(dead_code)]

use candle_core::{DType, Tensor};

/// A tensor of `shape` uniform in `[-1, 1)` from `seed`.
pub fn uniform(shape: &[usize], seed: u64) -> Tensor {
    attn::random::uniform(shape, -1.0, 1.0, seed).unwrap()
}

/// The elements of `t` as `f32`, flattened.
pub fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `max |a − b|`.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
