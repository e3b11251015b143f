//! PyTorch's `nn.Linear` (`weight: [out, in]`, optional `bias: [out]`) as one differentiable op,
//! [`crate::fused::linear`]: the leading dimensions folded into rows, the forward one matrix
//! product into rows that start as the bias, and each gradient one product (the bias's one pass
//! over the rows), made only for the arguments that need it. candle-nn's `Linear` broadcasts the
//! weight over the batch instead (a product and a weight gradient per batch entry, then summed),
//! and its composition of reshapes, transpose, product and bias is five graph nodes whose
//! gradients candle's backward each accumulates with a pass of its own.

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::error::Result;

/// `y = x·weightᵀ + bias` over the last dimension.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    weight: Tensor,
    /// `[out]`.
    bias: Option<Tensor>,
}

impl Linear {
    /// A map from `weight: [out, in]` and `bias: [out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// Loads `weight` and `bias` under `vb` (created, from a `VarMap`, with `candle_nn::linear`'s
    /// initialisation: Kaiming-normal weights, std `√(2/in)`, where PyTorch draws uniformly within
    /// `±1/√in`; biases uniform within `±1/√in` as in PyTorch).
    pub fn load(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Self> {
        Ok(candle_nn::linear(in_dim, out_dim, vb)?.into())
    }

    /// Loads `weight` only, without a bias.
    pub fn load_no_bias(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Self> {
        Ok(candle_nn::linear_no_bias(in_dim, out_dim, vb)?.into())
    }

    /// `weight: [out, in]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `x: [.., in]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::fused::linear(x, &self.weight, self.bias.as_ref())?)
    }
}

impl From<candle_nn::Linear> for Linear {
    fn from(l: candle_nn::Linear) -> Self {
        Self::new(l.weight().clone(), l.bias().cloned())
    }
}
