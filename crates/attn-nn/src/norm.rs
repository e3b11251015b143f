//! Layer normalisation over the last dimension, PyTorch's `nn.LayerNorm` (`weight`, `bias`, `eps`),
//! through this crate's fused op with its own backward ([`crate::fused::layer_norm`]): candle-nn's
//! `LayerNorm` takes a fused fast path with no backward for contiguous inputs, which would silently
//! cut gradients.

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::error::Result;

/// `y = (x − mean) / sqrt(var + eps) · weight + bias` over the last dimension (biased variance).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `[D]`.
    weight: Tensor,
    /// `[D]`.
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Loads `weight` and `bias` of width `dim` (PyTorch initialises them to ones and zeros).
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(dim, "weight", candle_nn::Init::Const(1.0))?;
        let bias = vb.get_with_hints(dim, "bias", candle_nn::Init::Const(0.0))?;
        Ok(Self { weight, bias, eps })
    }

    /// `x: [.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::fused::layer_norm(x, &self.weight, &self.bias, self.eps)?)
    }
}
