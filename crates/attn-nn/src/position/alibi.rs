//! ALiBi (Press et al.): no position embeddings; each head adds `-m_h · distance` to its scores,
//! with geometric slopes `m_h`. Passed to attention as an additive bias.

use attn::Align;
use candle_core::{Device, Tensor};

use crate::error::Result;

/// The slopes of `num_heads` heads ([`attn::score_mod::Alibi::slopes`]): `2^(-8h/n)` for
/// `h = 1..n` when `n` is a power of two, else the paper's interleaving.
pub fn alibi_slopes(num_heads: usize) -> Vec<f64> {
    attn::score_mod::Alibi::slopes(num_heads)
}

/// The bias `[1, H, Lq, Lk]`: `-m_h · |i' − j|` with `i'` query `i`'s position on the key axis
/// under `align` (`i` top-left, `i + Lk − Lq` bottom-right, as when decoding with a KV cache).
/// With causal masking only `j <= i'` remain, giving the paper's `-m_h · (i' − j)`.
///
/// ```
/// use attn_nn::position::alibi::alibi_bias;
/// use attn_nn::{AttnMask, AttnMasks, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(16, 4), attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[1, 6, 16], -1.0, 1.0, 1)?;
/// let bias = alibi_bias(4, 6, 6, attn::Align::TopLeft)?; // [1, H, Lq, Lk]
/// let masks = AttnMasks::causal().attn_mask(AttnMask::Additive(bias));
/// assert_eq!(mha.forward(MhaInput::self_attention(&x).masks(masks))?.out.dims(), [1, 6, 16]);
/// # Ok(()) }
/// ```
pub fn alibi_bias(num_heads: usize, lq: usize, lk: usize, align: Align) -> Result<Tensor> {
    let shift = match align {
        Align::TopLeft => 0.0,
        Align::BottomRight => lk as f64 - lq as f64,
    };
    let mut data = Vec::with_capacity(num_heads * lq * lk);
    for m in alibi_slopes(num_heads) {
        for i in 0..lq {
            data.extend((0..lk).map(|j| (-m * (i as f64 + shift - j as f64).abs()) as f32));
        }
    }
    Ok(Tensor::from_vec(data, (1, num_heads, lq, lk), &Device::Cpu)?)
}
