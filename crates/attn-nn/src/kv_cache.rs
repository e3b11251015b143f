//! The key/value cache of incremental decoding. A self-attention cache grows by the new tokens'
//! keys and values at every step; a cross-attention cache holds the encoder memory's projected
//! keys and values, computed on the first step and reused after.

use candle_core::Tensor;

use crate::error::Result;

/// Projected (and, with RoPE, rotated) keys and values `[B, Hkv, L, head_dim]` of the tokens seen.
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
