//! Seeded random inputs: the generator [`Rng`] (attn-testkit's; every test input is reproducible
//! from its seed) and random keep-masks and biases of a given broadcast shape.

pub use attn_testkit::rng::Rng;

use super::dense::Dense;

/// A random keep-mask of `shape`, each element `true` with probability `p_true`.
pub fn random_keep(shape: &[usize], p_true: f64, rng: &mut Rng) -> Dense<bool> {
    let n = shape.iter().product();
    Dense { shape: shape.to_vec(), data: (0..n).map(|_| rng.chance(p_true)).collect() }
}

/// A random bias of `shape`: multiples of 2⁻¹⁰ in `[-amp, amp]` (so adding a small integer is exact
/// in `f32`), each element −∞ with probability `p_neg_inf`.
pub fn random_bias(shape: &[usize], amp: f32, p_neg_inf: f64, rng: &mut Rng) -> Dense<f32> {
    let n = shape.iter().product();
    let data =
        (0..n)
            .map(|_| {
                if rng.chance(p_neg_inf) {
                    f32::NEG_INFINITY
                } else {
                    (rng.uniform(-amp, amp) * 1024.0).round() / 1024.0
                }
            })
            .collect();
    Dense { shape: shape.to_vec(), data }
}
