//! PyTorch's `nn.Linear` (`weight: [out, in]`, optional `bias: [out]`) with the leading dimensions
//! folded into one before the product. candle-nn's `Linear` broadcasts the weight over the batch
//! instead: one product per batch entry, and in the backward a weight gradient per batch entry
//! that is then summed. Folded, the forward is one matrix product and each gradient one more; the
//! bias is added by [`crate::fused::add_bias`], whose gradient is one pass over the rows.

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
        let dims = x.dims();
        let Some((&in_dim, lead)) = dims.split_last() else {
            return Ok(x.matmul(&self.weight.t()?)?);
        };
        let rows = lead.iter().product::<usize>();
        let y = x.reshape((rows, in_dim))?.matmul(&self.weight.t()?)?; // [rows, out]
        let y = match &self.bias {
            Some(b) => crate::fused::add_bias(&y, b)?,
            None => y,
        };
        Ok(y.reshape([lead, &[self.weight.dim(0)?]].concat())?)
    }
}

impl From<candle_nn::Linear> for Linear {
    fn from(l: candle_nn::Linear) -> Self {
        Self::new(l.weight().clone(), l.bias().cloned())
    }
}
