//! How a model's linear layers multiply: [`Weights`], chosen when the model is loaded.

use std::fmt;
use std::str::FromStr;

use attn_nn::Linear;

use crate::error::{ModelError, Result};

/// The products of a model's linear layers (projections, feed-forward, output layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weights {
    /// In f32, the weights dequantized from a GGUF or read as stored: the parity mode, equal to
    /// transformers' float32 model.
    #[default]
    F32,
    /// The weights rounded to bfloat16 once, each layer's input rounded as it comes, the sums
    /// in f32 ([`attn_nn::Linear::with_bf16_products`]): twice the f32 rate on CPUs with
    /// AVX512-BF16, half the weight bytes a decode step reads everywhere. Norms, attention and
    /// the residual stream stay f32.
    Bf16,
    /// The weights kept as 8-bit codes with a step and a minimum per 32 inputs of a row
    /// ([`attn_nn::Linear::with_int8_products`]; the GGUF's 4-bit Q4_1 and Q4_K blocks held
    /// exactly, and never rounded to bfloat16), each layer's input rounded as with
    /// [`Weights::Bf16`]: a quarter of the f32 weight bytes a decode step reads.
    Int8,
}

impl Weights {
    /// Makes each of `linears` multiply this way.
    pub(crate) fn apply<'a>(self, linears: impl IntoIterator<Item = &'a mut Linear>) -> Result<()> {
        for l in linears {
            *l = match self {
                Weights::F32 => l.with_f32_products(),
                Weights::Bf16 => l.with_bf16_products()?,
                Weights::Int8 => l.with_int8_products()?,
            };
        }
        Ok(())
    }
}

impl FromStr for Weights {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Weights::F32),
            "bf16" => Ok(Weights::Bf16),
            "int8" => Ok(Weights::Int8),
            _ => Err(ModelError::Input(format!("weights {s:?}: expected f32, bf16 or int8"))),
        }
    }
}

impl fmt::Display for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Weights::F32 => "f32",
            Weights::Bf16 => "bf16",
            Weights::Int8 => "int8",
        })
    }
}
