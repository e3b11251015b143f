//! Rotary position embedding (RoPE, Su et al.), in the half-split ("rotate_half") layout of
//! GPT-NeoX and Hugging Face's Llama: for a head of width `d`, feature `c < d/2` pairs with
//! `c + d/2`, rotated by the angle `p · base^(-2c/d)` of position `p`.

use candle_core::{Device, Tensor, D};

use crate::error::{NnError, Result};

/// RoPE's parameters.
///
/// ```
/// use attn_nn::RopeConfig;
/// # fn main() -> attn_nn::Result<()> {
/// let q = attn::random::uniform(&[1, 2, 5, 8], -1.0, 1.0, 1)?; // [B, H, L, d]
/// let rotated = RopeConfig::default().apply(&q, 0)?; // positions 0..5
/// assert_eq!(rotated.dims(), q.dims());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// The frequency base (10000 in the paper and Llama).
    pub base: f64,
}

impl Default for RopeConfig {
    fn default() -> Self {
        Self { base: 10000.0 }
    }
}

impl RopeConfig {
    /// `x: [B, H, L, d]` (`d` even) rotated for positions `offset..offset+L`; differentiable.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (_, _, l, d) = x.dims4()?;
        if !d.is_multiple_of(2) {
            return Err(NnError::Input {
                module: "RoPE",
                input: "x",
                found: x.dims().to_vec(),
                expected: "an even head width".into(),
            });
        }
        let half = d / 2;
        let mut cos = Vec::with_capacity(l * d);
        let mut sin = Vec::with_capacity(l * d);
        for p in offset..offset + l {
            for c in 0..d {
                let a = p as f64 * self.base.powf(-2.0 * (c % half) as f64 / d as f64);
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let cos = Tensor::from_vec(cos, (l, d), &Device::Cpu)?.to_dtype(x.dtype())?;
        let sin = Tensor::from_vec(sin, (l, d), &Device::Cpu)?.to_dtype(x.dtype())?;
        let rotated =
            Tensor::cat(&[&x.narrow(D::Minus1, half, half)?.neg()?, &x.narrow(D::Minus1, 0, half)?], D::Minus1)?;
        Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
    }
}
