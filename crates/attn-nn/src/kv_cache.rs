//! The key/value cache of incremental decoding. A self-attention cache grows by the new tokens'
//! keys and values at every step; a cross-attention cache holds the encoder memory's projected
//! keys and values, computed on the first step and reused after.

use candle_core::Tensor;

use crate::error::Result;

/// Projected (and, with RoPE, rotated) keys and values `[B, Hkv, L, head_dim]` of the tokens seen.
///
/// ```
/// use attn_nn::{AttnMasks, Cache, KvCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, RopeConfig};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let cfg = MultiHeadAttentionConfig { rope: Some(RopeConfig::default()), ..MultiHeadAttentionConfig::new(8, 2) };
/// let mha = MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[1, 4, 8], -1.0, 1.0, 1)?; // [B, L, E]
/// let full = mha.forward(MhaInput::self_attention(&x).masks(AttnMasks::causal()))?.out;
/// let mut cache = KvCache::new();
/// for i in 0..4 {
///     let step = x.narrow(1, i, 1)?; // one new token [B, 1, E]
///     let input = MhaInput::self_attention(&step).masks(AttnMasks::causal()).cache(Cache::SelfAttn(&mut cache));
///     let out = mha.forward(input)?.out;
///     let want = full.narrow(1, i, 1)?;
///     let diff = (out - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
///     assert!(diff < 1e-5);
/// }
/// assert_eq!(cache.len(), 4);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    kv: Option<(Tensor, Tensor)>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many positions are cached.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.kv.is_none()
    }

    /// Forgets everything (a new sequence).
    pub fn clear(&mut self) {
        self.kv = None;
    }

    /// The cached `(k, v)`, if any.
    pub fn get(&self) -> Option<&(Tensor, Tensor)> {
        self.kv.as_ref()
    }

    /// Appends `k: [B, Hkv, L, d]`, `v: [B, Hkv, L, dv]` along the positions and returns the whole
    /// cached `(k, v)`.
    pub fn append(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let kv = match self.kv.take() {
            None => (k, v),
            Some((ck, cv)) => (Tensor::cat(&[&ck, &k], 2)?, Tensor::cat(&[&cv, &v], 2)?),
        };
        self.kv = Some(kv.clone());
        Ok(kv)
    }
}

/// How one attention call uses a cache.
#[derive(Debug)]
pub enum Cache<'a> {
    /// Self-attention decoding: the new keys/values are appended, the queries are the last
    /// positions (bottom-right causal alignment, RoPE offset by the cached length).
    SelfAttn(&'a mut KvCache),
    /// Cross-attention decoding: keys/values are projected from `key`/`value` on the first call
    /// and reused (the inputs ignored) after.
    Cross(&'a mut KvCache),
}
