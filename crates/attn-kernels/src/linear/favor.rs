//! FAVOR+ positive orthogonal random features (Performer, Choromanski et al. 2021): the projection
//! `W: [m, D]` whose rows come in blocks of `D` mutually orthogonal directions, each row scaled to
//! the norm of an independent Gaussian vector, so that `E[φ(x)·φ(y)] = exp(x·y)` with
//! `φ(x)_r = exp(w_r·x − |x|²/2) / √m`. Seeded and redrawable.

use super::gemm::cast;
use crate::error::{AttnError, Result};
use crate::reference::Real;
use crate::rng::SplitMix64;

/// A drawn FAVOR+ projection.
#[derive(Debug, Clone, PartialEq)]
pub struct FavorFeatures {
    /// `W: [m, D]` (row-major) and `Wᵀ` in the types the kernels compute in, made once per draw
    /// (not per chunk); the `f64` one is the draw itself.
    f64: Projection<f64>,
    f32: Projection<f32>,
    d: usize,
    m: usize,
    seed: u64,
}

/// `W: [m, D]` and `Wᵀ: [D, m]` in one type.
#[derive(Debug, Clone, PartialEq)]
struct Projection<T> {
    w: Vec<T>,
    wt: Vec<T>,
}

impl<T: Real> Projection<T> {
    /// `w: [m, d]` in `T`, and transposed.
    fn of(w: &[f64], d: usize, m: usize) -> Self {
        let to = |v: f64| T::from_f64(v).expect("finite");
        let wt = (0..d * m).map(|i| to(w[(i % m) * d + i / m])).collect();
        Self { w: w.iter().map(|&v| to(v)).collect(), wt }
    }
}

impl FavorFeatures {
    /// `m` features for head dimension `d`, drawn from `seed`. Errors when `m` or `d` is 0.
    pub fn new(d: usize, m: usize, seed: u64) -> Result<Self> {
        if m == 0 {
            return Err(AttnError::Param {
                field: "features",
                reason: "0 random features, expected at least 1".into(),
            });
        }
        if d == 0 {
            return Err(AttnError::Param { field: "head dim", reason: "0, expected at least 1".into() });
        }
        let mut g = SplitMix64::new(seed);
        let mut w = Vec::with_capacity(m * d);
        while w.len() < m * d {
            let block = orthonormal_block(&mut g, d);
            for row in block.chunks(d).take(m - w.len() / d) {
                let norm = (0..d).map(|_| gaussian(&mut g).powi(2)).sum::<f64>().sqrt();
                w.extend(row.iter().map(|x| x * norm));
            }
        }
        Ok(Self { f64: Projection::of(&w, d, m), f32: Projection::of(&w, d, m), d, m, seed })
    }

    /// A fresh draw of the same size from another seed (Performer redraws during training).
    pub fn redraw(&self, seed: u64) -> Self {
        Self::new(self.d, self.m, seed).expect("sizes were valid")
    }

    /// `W: [m, D]`, row-major.
    pub fn weights(&self) -> &[f64] {
        &self.f64.w
    }

    /// `W: [m, D]` and `Wᵀ: [D, m]` in `T` (`f32` or `f64`).
    pub(crate) fn projection<T: Real>(&self) -> (&[T], &[T]) {
        fn pick<'a, T: Real>(w: &'a [f64], w32: &'a [f32]) -> &'a [T] {
            cast::<f64, T>(w).or_else(|| cast::<f32, T>(w32)).expect("f32 or f64")
        }
        (pick(&self.f64.w, &self.f32.w), pick(&self.f64.wt, &self.f32.wt))
    }

    /// The head dimension `D`.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// The number of features `m`.
    pub fn features(&self) -> usize {
        self.m
    }

    /// The seed of this draw.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// A standard normal value (Box–Muller).
fn gaussian(g: &mut SplitMix64) -> f64 {
    let u = 1.0 - g.unit_f64();
    let v = g.unit_f64();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// `d` orthonormal rows of length `d` (Gram–Schmidt on Gaussian rows, redrawn if degenerate).
fn orthonormal_block(g: &mut SplitMix64, d: usize) -> Vec<f64> {
    let mut q: Vec<f64> = Vec::with_capacity(d * d);
    while q.len() < d * d {
        let mut x: Vec<f64> = (0..d).map(|_| gaussian(g)).collect();
        for _ in 0..2 {
            for prev in q.chunks(d) {
                let dot: f64 = prev.iter().zip(&x).map(|(a, b)| a * b).sum();
                x.iter_mut().zip(prev).for_each(|(a, b)| *a -= dot * b);
            }
        }
        let n = x.iter().map(|a| a * a).sum::<f64>().sqrt();
        if n > 1e-6 {
            q.extend(x.iter().map(|a| a / n));
        }
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_block_are_orthogonal_and_draws_are_seeded() {
        let f = FavorFeatures::new(8, 20, 3).unwrap();
        let w = f.weights();
        assert_eq!(w.len(), 160);
        for i in 0..8 {
            for j in 0..i {
                let dot: f64 = (0..8).map(|c| w[i * 8 + c] * w[j * 8 + c]).sum();
                assert!(dot.abs() < 1e-9, "rows {i} {j}: {dot}");
            }
        }
        assert_eq!(f, FavorFeatures::new(8, 20, 3).unwrap());
        assert_ne!(f.weights(), f.redraw(4).weights());
        assert!(FavorFeatures::new(8, 0, 1).is_err());
    }

    #[test]
    fn features_estimate_the_softmax_kernel() {
        let d = 4;
        let f = FavorFeatures::new(d, 4096, 11).unwrap();
        let (x, y) = ([0.3, -0.2, 0.1, 0.4], [-0.1, 0.25, 0.3, 0.2]);
        let phi = |v: &[f64; 4]| -> Vec<f64> {
            let sq: f64 = v.iter().map(|a| a * a).sum::<f64>() / 2.0;
            f.weights().chunks(d).map(|w| ((w.iter().zip(v).map(|(a, b)| a * b).sum::<f64>()) - sq).exp()).collect()
        };
        let est: f64 = phi(&x).iter().zip(phi(&y)).map(|(a, b)| a * b).sum::<f64>() / 4096.0;
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum::<f64>().exp();
        assert!((est - exact).abs() < 0.02 * exact, "{est} vs {exact}");
    }
}
