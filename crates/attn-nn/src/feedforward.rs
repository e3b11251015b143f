//! The position-wise feed-forward block of a Transformer layer, `linear2(dropout(act(linear1(x))))`,
//! with PyTorch's names (`linear1`, `linear2`) and activations (`relu`, exact `gelu`).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::linear::Linear;

use crate::dropout::{Dropout, Mode};
use crate::error::Result;
use crate::layer::LayerConfig;

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
            Activation::Gelu => x.gelu_erf()?,
        })
    }
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
    pub fn new(cfg: &LayerConfig, vb: VarBuilder) -> Result<Self> {
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
