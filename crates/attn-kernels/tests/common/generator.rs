//! Seeded random inputs: the generator [`Rng`] (every test input is reproducible from its seed)
//! and random keep-masks and biases of a given broadcast shape.

use attn_kernels::rng::SplitMix64;

use super::dense::Dense;

/// A small seeded generator (the crate's SplitMix64): every test input is reproducible from its
/// seed.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed ^ 0x5DEE_CE66_D1CE_4E5B))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.unit_f64()
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit() as f32
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `n` values uniform in `[-amp, amp)`.
    pub fn values(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-amp, amp)).collect()
    }
}

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
