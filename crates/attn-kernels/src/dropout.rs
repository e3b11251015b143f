//! Dropout on attention weights with a counter-based generator: whether weight `(b, h, i, j)` is
//! kept is a pure function of `(seed, b, h, i, j)`, so any kernel, tile order or thread count
//! gives the same result and a backward pass can replay the forward's decisions.
//!
//! Per row `(b, h, i)` a 64-bit key is derived with SplitMix64; per key `j` a 32-bit value is
//! `fmix32(lo(key) + j·φ32) ^ hi(key)`, cheap enough to compute inside vectorised kernels.

use crate::error::{AttnError, Result};
use crate::rng::splitmix64;

/// Dropout probability and seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of dropping a weight, in `[0, 1)`.
    pub p: f32,
    /// Seed of the counter-based generator.
    pub seed: u64,
}

impl Dropout {
    /// Checks `p` is in `[0, 1)`.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.p) {
            return Err(AttnError::Param { field: "dropout", reason: format!("p = {}, expected 0 <= p < 1", self.p) });
        }
        Ok(())
    }

    /// Threshold on the 32-bit draw: a weight is kept iff `draw >= threshold`.
    pub fn threshold(&self) -> u32 {
        ((self.p as f64) * 4294967296.0).min(u32::MAX as f64) as u32
    }

    /// Factor applied to kept weights, `1 / (1 - p)`.
    pub fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// Whether weight `j` of the row keyed `row_key` ([`Dropout::row_key`]) is kept: the one
    /// keep decision of the reference, the flash forward and every backward.
    #[inline]
    pub fn keeps(&self, row_key: u64, j: usize) -> bool {
        draw(row_key, j) >= self.threshold()
    }

    /// The key of row `(b, h, i)` with `h` the query head; `dims = [Hq, Lq]`.
    #[inline]
    pub fn row_key(&self, b: usize, h: usize, i: usize, dims: [usize; 2]) -> u64 {
        let row = ((b as u64).wrapping_mul(dims[0] as u64).wrapping_add(h as u64))
            .wrapping_mul(dims[1] as u64)
            .wrapping_add(i as u64);
        splitmix64(self.seed ^ splitmix64(row))
    }
}

/// The 32-bit draw for key `j` of a row with key `row_key`.
#[inline]
pub fn draw(row_key: u64, j: usize) -> u32 {
    fmix32((row_key as u32).wrapping_add((j as u32).wrapping_mul(0x9E37_79B9))) ^ ((row_key >> 32) as u32)
}

/// MurmurHash3's 32-bit finaliser.
#[inline]
pub fn fmix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}
