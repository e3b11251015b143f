//! Dropout with a seedable, reproducible mask (candle's CPU generator cannot be seeded, and
//! `attn train --resume` must replay a run exactly), and the per-module seed streams that feed it
//! and the attention kernel's own dropout.
//!
//! Each module that drops owns a [`SeedStream`] keyed by its `VarBuilder` path, so two layers
//! built from the same config never share masks; every training call draws a fresh seed.

use std::sync::atomic::{AtomicU64, Ordering};

use attn_kernels::rng::{splitmix64, SplitMix64};
use candle_core::Tensor;

use crate::error::Result;

/// A stream of seeds: `splitmix64(key + n)` for the `n`-th draw.
#[derive(Debug)]
pub struct SeedStream {
    key: u64,
    drawn: AtomicU64,
}

impl SeedStream {
    /// The stream keyed by `seed` and a module path (e.g. `layers.0.self_attn`).
    pub fn new(seed: u64, path: &str) -> Self {
        let key = path.bytes().fold(splitmix64(seed), |h, b| splitmix64(h ^ u64::from(b)));
        Self { key, drawn: AtomicU64::new(0) }
    }

    /// The next seed.
    pub fn next(&self) -> u64 {
        splitmix64(self.key.wrapping_add(self.drawn.fetch_add(1, Ordering::Relaxed)))
    }

    /// How many seeds were drawn (saved by checkpoints so a resumed run continues the stream).
    pub fn position(&self) -> u64 {
        self.drawn.load(Ordering::Relaxed)
    }

    /// Continues the stream after `drawn` draws.
    pub fn set_position(&self, drawn: u64) {
        self.drawn.store(drawn, Ordering::Relaxed);
    }
}

/// Inverted dropout with probability `p` (`0 <= p < 1`): in training each element is zeroed with
/// probability `p` and the survivors are scaled by `1/(1-p)`; in evaluation it is the identity.
#[derive(Debug)]
pub struct Dropout {
    p: f32,
    seeds: SeedStream,
}

impl Dropout {
    /// Dropout with probability `p`, its seeds keyed by `(seed, path)`.
    pub fn new(p: f32, seed: u64, path: &str) -> Self {
        Self { p, seeds: SeedStream::new(seed, path) }
    }

    /// `x: [..]` → the same shape; differentiable (a product with a constant mask).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        let mut rng = SplitMix64::new(self.seeds.next());
        let scale = 1.0 / (1.0 - self.p);
        let mask: Vec<f32> = (0..x.elem_count()).map(|_| if rng.unit_f32() >= self.p { scale } else { 0.0 }).collect();
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        Ok((x * mask)?)
    }

    /// The seed stream (for checkpoints).
    pub fn seeds(&self) -> &SeedStream {
        &self.seeds
    }
}
