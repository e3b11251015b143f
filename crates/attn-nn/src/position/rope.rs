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
        let (cos, sin) = self.tables(x, offset..offset + l, d)?; // [L, d]
        rotate(x, &cos, &sin)
    }

    /// [`RopeConfig::apply`] to queries `q: [B, Hq, L, d]` and keys `k: [B, Hk, L, d]` at the
    /// same positions, the angles computed once for both.
    pub fn apply_pair(&self, q: &Tensor, k: &Tensor, offset: usize) -> Result<(Tensor, Tensor)> {
        let (_, _, l, d) = q.dims4()?;
        if k.dims4()?.2 != l || k.dim(3)? != d {
            return Err(NnError::Input {
                module: "RoPE",
                input: "k",
                found: k.dims().to_vec(),
                expected: format!("the positions and head width of q {:?}", q.dims()),
            });
        }
        let (cos, sin) = self.tables(q, offset..offset + l, d)?;
        Ok((rotate(q, &cos, &sin)?, rotate(k, &cos, &sin)?))
    }

    /// Packed rows `x: [total, n, d]` (`d` even), row `i` rotated for position `positions[i]`
    /// (positions restart per sequence: [`crate::Packed::positions`]); differentiable.
    pub fn apply_packed(&self, x: &Tensor, positions: &[usize]) -> Result<Tensor> {
        let (total, _, d) = x.dims3()?;
        if positions.len() != total {
            return Err(NnError::Input {
                module: "RoPE",
                input: "positions",
                found: vec![positions.len()],
                expected: format!("one position per row of x {:?}", x.dims()),
            });
        }
        let (cos, sin) = self.tables(x, positions.iter().copied(), d)?; // [total, d]
        rotate(x, &cos.unsqueeze(1)?, &sin.unsqueeze(1)?)
    }

    /// `cos` and `sin` `[positions, d]` of the angles, in `x`'s dtype; refuses an odd `d`.
    fn tables(
        &self,
        x: &Tensor,
        positions: impl ExactSizeIterator<Item = usize>,
        d: usize,
    ) -> Result<(Tensor, Tensor)> {
        if !d.is_multiple_of(2) {
            return Err(NnError::Input {
                module: "RoPE",
                input: "x",
                found: x.dims().to_vec(),
                expected: "an even head width".into(),
            });
        }
        let (half, l) = (d / 2, positions.len());
        let freqs: Vec<f64> = (0..half).map(|c| self.base.powf(-2.0 * c as f64 / d as f64)).collect();
        let (mut cos, mut sin) = (vec![0f32; l * d], vec![0f32; l * d]);
        for ((p, cos), sin) in positions.zip(cos.chunks_exact_mut(d)).zip(sin.chunks_exact_mut(d)) {
            for (c, f) in freqs.iter().enumerate() {
                let (s, co) = (p as f64 * f).sin_cos();
                (cos[c], cos[c + half]) = (co as f32, co as f32);
                (sin[c], sin[c + half]) = (s as f32, s as f32);
            }
        }
        let cos = Tensor::from_vec(cos, (l, d), &Device::Cpu)?.to_dtype(x.dtype())?;
        let sin = Tensor::from_vec(sin, (l, d), &Device::Cpu)?.to_dtype(x.dtype())?;
        Ok((cos, sin))
    }
}

/// `x·cos + rotate_half(x)·sin`, `cos` and `sin` broadcast over `x`'s leading dimensions.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let rotated = Tensor::cat(&[&x.narrow(D::Minus1, half, half)?.neg()?, &x.narrow(D::Minus1, 0, half)?], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}
