//! Dropout with a seedable, reproducible mask (candle's CPU generator cannot be seeded, and
//! `attn train --resume` must replay a run exactly), and the per-module seed streams that feed it
//! and the attention kernel's own dropout.
//!
//! Each module that drops owns a [`SeedStream`] keyed by its `VarBuilder` path, so two layers
//! built from the same config never share masks. In [`Mode::Train`] every call draws the stream's
//! next seed; in [`Mode::TrainStep`] the seed is a pure function of the module and the step, so a
//! training run resumed at step `k` draws exactly the masks the uninterrupted run would have.

use std::sync::atomic::{AtomicU64, Ordering};

use attn::random::splitmix64;
use candle_core::Tensor;

use crate::error::Result;

/// Evaluation or training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// No dropout: deterministic.
    #[default]
    Eval,
    /// Dropout with a fresh seed per call from each module's stream.
    Train,
    /// Dropout with seeds keyed by the module and this training step (for exact resumption; each
    /// module is expected to run once per step).
    TrainStep(u64),
}

impl Mode {
    /// Whether dropout is on.
    pub fn is_train(self) -> bool {
        self != Mode::Eval
    }
}

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

    /// The stream's key: a pure function of the seed and the path (for draws made once, such as
    /// FAVOR+'s projection).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The seed of a call in `mode`: none in evaluation, the next draw in `Train`, a function of
    /// the key and the step in `TrainStep`.
    pub fn seed(&self, mode: Mode) -> Option<u64> {
        match mode {
            Mode::Eval => None,
            Mode::Train => Some(splitmix64(self.key.wrapping_add(self.drawn.fetch_add(1, Ordering::Relaxed)))),
            Mode::TrainStep(step) => Some(splitmix64(self.key ^ splitmix64(step))),
        }
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

    /// `x: [..]` → the same shape; differentiable ([`crate::fused::dropout`]).
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let seed = match self.seeds.seed(mode) {
            Some(seed) if self.p > 0.0 => seed,
            _ => return Ok(x.clone()),
        };
        Ok(crate::fused::dropout(x, self.p, seed)?)
    }
}
