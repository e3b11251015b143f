//! PyTorch's `nn.Linear` (`weight: [out, in]`, optional `bias: [out]`) as one differentiable op,
//! [`crate::fused::linear`]: the leading dimensions folded into rows, the forward one matrix
//! product into rows that start as the bias, and each gradient one product (the bias's one pass
//! over the rows), made only for the arguments that need it. candle-nn's `Linear` broadcasts the
//! weight over the batch instead (a product and a weight gradient per batch entry, then summed),
//! and its composition of reshapes, transpose, product and bias is five graph nodes whose
//! gradients candle's backward each accumulates with a pass of its own. [`Linear::with_bf16_products`]
//! and [`Linear::with_int8_products`] make the same map multiply in bfloat16
//! ([`crate::fused::linear_bf16`]), its weight stored as bfloat16 or as 8-bit blocks.

use attn_kernels::bf16_weights::{Bf16Weights, Packing};
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use crate::error::Result;

/// `y = x·weightᵀ + bias` over the last dimension.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    weight: Tensor,
    /// `[out]`.
    bias: Option<Tensor>,
    /// The weight rounded to bfloat16 (or quantized to 8 bits) and packed, when the products run
    /// in bfloat16.
    bf16: Option<Bf16Weights>,
}

impl Linear {
    /// A map from `weight: [out, in]` and `bias: [out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias, bf16: None }
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

    /// `bias: [out]`, when it has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// This map with its products in bfloat16 ([`crate::fused::linear_bf16`]): the weight rounded
    /// once (to nearest, ties to even), each input as it comes, the sums in f32 — what a
    /// `bfloat16` model's products compute, at twice the f32 rate on CPUs with AVX512-BF16 and
    /// with half the weight's bytes to read everywhere (the f32 weight is kept for training).
    pub fn with_bf16_products(&self) -> Result<Self> {
        self.packed(Bf16Weights::pack)
    }

    /// The weight kept as 8-bit codes, a step and a minimum per 32 inputs of a row
    /// ([`Bf16Weights::pack_int8`]; a GGUF's 4-bit Q4_1 and Q4_K blocks held exactly): a quarter
    /// of the f32 weight's bytes to read, each input rounded to bfloat16 as in
    /// [`Linear::with_bf16_products`] and multiplied by `min + q·s` unrounded.
    pub fn with_int8_products(&self) -> Result<Self> {
        self.packed(Bf16Weights::pack_int8)
    }

    fn packed(&self, pack: Packing) -> Result<Self> {
        let w = self.weight.to_dtype(DType::F32)?;
        let (out, inn) = w.dims2()?;
        let packed = pack(&w.flatten_all()?.to_vec1::<f32>()?, out, inn).map_err(attn::AttnLibError::from)?;
        Ok(Self { bf16: Some(packed), ..self.clone() })
    }

    /// This map with its products in f32 (as it is made).
    pub fn with_f32_products(&self) -> Self {
        Self { bf16: None, ..self.clone() }
    }

    /// `x: [.., in]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match &self.bf16 {
            Some(p) => crate::fused::linear_bf16(x, &self.weight, p, self.bias.as_ref())?,
            None => crate::fused::linear(x, &self.weight, self.bias.as_ref())?,
        })
    }
}

impl From<candle_nn::Linear> for Linear {
    fn from(l: candle_nn::Linear) -> Self {
        Self::new(l.weight().clone(), l.bias().cloned())
    }
}
