//! Normalisation over the last dimension: PyTorch's `nn.LayerNorm` (`weight`, `bias`, `eps`,
//! `elementwise_affine`, `bias=False`), through this crate's fused op with its own backward
//! ([`crate::fused::layer_norm`]): candle-nn's `LayerNorm` takes a fused fast path with no
//! backward for contiguous inputs, which would silently cut gradients; and `nn.RMSNorm` (Llama's
//! `LlamaRMSNorm`) and Gated DeltaNet's gated RMSNorm, from differentiable tensor ops.

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use crate::error::Result;

/// PyTorch's `nn.LayerNorm` arguments beyond the width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormConfig {
    /// Added to the variance (PyTorch: 1e-5).
    pub eps: f64,
    /// Learned `weight` (and `bias` when `bias`); without, `y = (x − mean) / sqrt(var + eps)` and
    /// the module has no parameters (PyTorch's `elementwise_affine=False`).
    pub elementwise_affine: bool,
    /// A learned `bias` (with `elementwise_affine`; PyTorch's `bias=False` drops it).
    pub bias: bool,
}

impl LayerNormConfig {
    /// PyTorch's defaults with `eps`: affine, with a bias.
    pub fn new(eps: f64) -> Self {
        Self { eps, elementwise_affine: true, bias: true }
    }
}

/// `y = (x − mean) / sqrt(var + eps) · weight + bias` over the last dimension (biased variance).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `[D]`: the learned weight, or ones.
    weight: Tensor,
    /// `[D]`: the learned bias, or zeros.
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Loads `weight` and `bias` of width `dim` (PyTorch initialises them to ones and zeros).
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Self::with_config(dim, LayerNormConfig::new(eps), vb)
    }

    /// Loads what `cfg` asks for under `vb`: `weight` with `elementwise_affine`, `bias` with
    /// both; the missing ones are constants (ones, zeros) that take no gradient.
    pub fn with_config(dim: usize, cfg: LayerNormConfig, vb: VarBuilder) -> Result<Self> {
        let learned = |on: bool, name: &str, value: f64| -> Result<Tensor> {
            Ok(if on {
                vb.get_with_hints(dim, name, candle_nn::Init::Const(value))?
            } else {
                (Tensor::ones(dim, DType::F32, vb.device())? * value)?.to_dtype(vb.dtype())?
            })
        };
        let weight = learned(cfg.elementwise_affine, "weight", 1.0)?;
        let bias = learned(cfg.elementwise_affine && cfg.bias, "bias", 0.0)?;
        Ok(Self { weight, bias, eps: cfg.eps })
    }

    /// `x: [.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::fused::layer_norm(x, &self.weight, &self.bias, self.eps)?)
    }
}

/// `y = x / sqrt(mean(x²) + eps) · weight` over the last dimension, computed in `f32` whatever
/// `x`'s dtype (as Hugging Face's `LlamaRMSNorm`); PyTorch's `nn.RMSNorm` with a learned weight.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[D]`.
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `weight` of width `dim` (initialised to ones).
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self { weight: vb.get_with_hints(dim, "weight", candle_nn::Init::Const(1.0))?, eps })
    }

    /// `x: [.., D]` → `[.., D]` in `x`'s dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let x32 = x.to_dtype(DType::F32)?;
        let mean_square = x32.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        let normed = x32.broadcast_div(&(mean_square + self.eps)?.sqrt()?)?.to_dtype(dtype)?;
        Ok(normed.broadcast_mul(&self.weight.to_dtype(dtype)?)?)
    }
}

/// `y = weight · x / sqrt(mean(x²) + eps) · silu(gate)` over the last dimension: the gated
/// RMSNorm of Gated DeltaNet's output heads (Hugging Face's `Qwen3NextRMSNormGated`, fla's
/// `FusedRMSNormGated`), normalising before the gate. Computed in `f32` for half-precision inputs
/// (as transformers does), in the input's dtype otherwise.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm {
    /// `[D]`.
    weight: Tensor,
    eps: f64,
}

impl GatedRmsNorm {
    /// Loads `weight` of width `dim` (initialised to ones).
    pub fn new(dim: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self { weight: vb.get_with_hints(dim, "weight", candle_nn::Init::Const(1.0))?, eps })
    }

    /// `x, gate: [.., D]` → `[.., D]` in `x`'s dtype.
    pub fn forward(&self, x: &Tensor, gate: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let wide = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        let x = x.to_dtype(wide)?;
        let mean_square = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
        let normed = x.broadcast_div(&(mean_square + self.eps)?.sqrt()?)?;
        let gated = (normed.broadcast_mul(&self.weight.to_dtype(wide)?)? * gate.to_dtype(wide)?.silu()?)?;
        Ok(gated.to_dtype(dtype)?)
    }
}
