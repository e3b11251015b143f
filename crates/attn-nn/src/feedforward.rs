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
    /// Loads `linear1.{weight,bias}` and `linear2.{weight,bias}` from `vb`; `dropout` applies after
    /// the activation (PyTorch's `dropout`), its seeds keyed by `seed` and `vb`'s path.
    pub fn new(
        d_model: usize,
        dim_feedforward: usize,
        activation: Activation,
        dropout: f32,
        seed: u64,
        vb: VarBuilder,
    ) -> Result<Self> {
        Ok(Self {
            linear1: Linear::load(d_model, dim_feedforward, vb.pp("linear1"))?,
            linear2: Linear::load(dim_feedforward, d_model, vb.pp("linear2"))?,
            activation,
            dropout: Dropout::new(dropout, seed, &format!("{}.ff_dropout", vb.prefix())),
        })
    }

    /// `x: [B, L, d_model]` → `[B, L, d_model]`.
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let h = self.activation.forward(&self.linear1.forward(x)?)?;
        self.linear2.forward(&self.dropout.forward(&h, mode)?)
    }
}
