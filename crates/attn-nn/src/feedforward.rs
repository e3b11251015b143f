//! The position-wise feed-forward block of a Transformer layer, `linear2(dropout(act(linear1(x))))`,
//! with PyTorch's names (`linear1`, `linear2`) and activations (`relu`, exact `gelu`).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::linear::Linear;

use crate::dropout::{Dropout, Mode};
use crate::error::Result;

/// The activation between the two linear maps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)` (PyTorch's default).
    #[default]
    Relu,
    /// The exact, erf-based GELU (PyTorch's `"gelu"`).
    Gelu,
}

impl Activation {
    /// `x: [..]` → the same shape.
    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Relu => crate::fused::relu(x)?,
            Activation::Gelu => crate::fused::gelu(x, crate::fused::Approximate::None)?,
        })
    }
}

/// Configuration of a [`FeedForward`] block (a layer's:
/// [`LayerConfig::feedforward`](crate::LayerConfig::feedforward)).
#[derive(Debug, Clone, Copy)]
pub struct FeedForwardConfig {
    /// Model width (the input and output).
    pub d_model: usize,
    /// Hidden width.
    pub dim_feedforward: usize,
    /// The activation between the maps.
    pub activation: Activation,
    /// Dropout after the activation.
    pub dropout: f32,
    /// Biases in both maps.
    pub bias: bool,
    /// Seed of the dropout stream.
    pub seed: u64,
}

/// `linear1: d_model → dim_feedforward`, activation, dropout, `linear2: dim_feedforward → d_model`.
#[derive(Debug)]
pub struct FeedForward {
    linear1: Linear,
    linear2: Linear,
    activation: Activation,
    dropout: Dropout,
}

impl FeedForward {
    /// Loads `linear1.weight` `[dim_feedforward, d_model]`, `linear2.weight`
    /// `[d_model, dim_feedforward]` and, with `cfg.bias`, their biases from `vb`; `cfg.dropout`
    /// applies after the activation `cfg.activation` (PyTorch's `dropout`), its seeds keyed by
    /// `cfg.seed` and `vb`'s path.
    pub fn new(cfg: &FeedForwardConfig, vb: VarBuilder) -> Result<Self> {
        let load = if cfg.bias { Linear::load } else { Linear::load_no_bias };
        Ok(Self {
            linear1: load(cfg.d_model, cfg.dim_feedforward, vb.pp("linear1"))?,
            linear2: load(cfg.dim_feedforward, cfg.d_model, vb.pp("linear2"))?,
            activation: cfg.activation,
            dropout: Dropout::new(cfg.dropout, cfg.seed, &format!("{}.ff_dropout", vb.prefix())),
        })
    }

    /// `x: [.., d_model]` → `[.., d_model]`.
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let h = self.activation.forward(&self.linear1.forward(x)?)?;
        self.linear2.forward(&self.dropout.forward(&h, mode)?)
    }
}
