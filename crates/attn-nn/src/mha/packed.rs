//! [`MultiHeadAttention`] over packed batches ([`Packed`]): the same projections, heads and
//! weights as the padded call, with attention run by [`attn::sdpa_varlen`] within each sequence
//! (self-attention, or cross-attention from sequence `s` of the queries to sequence `s` of the
//! keys), grouped-query heads, RoPE positions restarting at 0 in every sequence, causal masking
//! within each sequence, and attention dropout keyed per sequence. No padding is computed, so no
//! key padding mask is needed. bf16 products (`compute`) reach the packed kernels as they reach
//! the padded call's, and so do the sinks (the same logits joining every sequence's rows).
//! `add_bias_kv` and `add_zero_attn` have no packed form yet and are refused, as is asking for the
//! weights (sequences of different lengths form no tensor).

use attn::SdpaOptions;

use crate::dropout::Mode;
use crate::error::{NnError, Result};
use crate::packed::Packed;

use super::{MultiHeadAttention, MODULE};

/// The inputs of one packed call.
#[derive(Debug, Clone, Copy)]
pub struct PackedMhaInput<'a> {
    /// `[total_q, E]` rows of `B` sequences.
    pub query: &'a Packed,
    /// `[total_k, kdim]` rows of `B` sequences.
    pub key: &'a Packed,
    /// `[total_k, vdim]`, cut like `key`.
    pub value: &'a Packed,
    /// Causal masking within each sequence (top-left aligned, as PyTorch's `is_causal`).
    pub causal: bool,
    /// Evaluation or training (dropout on the weights).
    pub mode: Mode,
}

impl<'a> PackedMhaInput<'a> {
    /// Attention of each query sequence over the key/value sequence of the same index, not
    /// causal, evaluation mode.
    pub fn new(query: &'a Packed, key: &'a Packed, value: &'a Packed) -> Self {
        Self { query, key, value, causal: false, mode: Mode::Eval }
    }

    /// Self-attention of `x: [total, E]` within each sequence.
    pub fn self_attention(x: &'a Packed) -> Self {
        Self::new(x, x, x)
    }

    /// Sets causal masking within each sequence.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Sets evaluation or training mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

impl MultiHeadAttention {
    /// Packed `query: [total_q, E]`, `key: [total_k, kdim]`, `value: [total_k, vdim]` →
    /// `[total_q, E]` cut like `query`. Equal to [`Self::forward`] on the padded batch with key
    /// padding, at the real rows.
    ///
    /// ```
    /// use attn_nn::{MultiHeadAttention, MultiHeadAttentionConfig, Packed, PackedMhaInput, RopeConfig};
    /// # fn main() -> attn_nn::Result<()> {
    /// let map = candle_nn::VarMap::new();
    /// let cfg = MultiHeadAttentionConfig {
    ///     num_kv_heads: Some(2),
    ///     rope: Some(RopeConfig::default()),
    ///     ..MultiHeadAttentionConfig::new(16, 4)
    /// };
    /// let mha = MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0))?;
    /// let seqs = [attn::random::uniform(&[5, 16], -1.0, 1.0, 1)?, attn::random::uniform(&[3, 16], -1.0, 1.0, 2)?];
    /// let x = Packed::from_sequences(&seqs)?; // [8, 16], cu_seqlens [0, 5, 8]
    /// let out = mha.forward_packed(PackedMhaInput::self_attention(&x).causal(true))?;
    /// assert_eq!((out.data().dims(), out.cu_seqlens()), (&[8, 16][..], &[0, 5, 8][..]));
    /// # Ok(()) }
    /// ```
    pub fn forward_packed(&self, input: PackedMhaInput) -> Result<Packed> {
        let cfg = &self.cfg;
        let unsupported = [("add_bias_kv", cfg.add_bias_kv), ("add_zero_attn", cfg.add_zero_attn)];
        if let Some((field, _)) = unsupported.iter().find(|(_, on)| *on) {
            return Err(NnError::Config {
                module: MODULE,
                field,
                reason: "has no packed form yet; use the padded forward".into(),
            });
        }
        let (e, h, hkv) = (cfg.embed_dim, cfg.num_heads, cfg.kv_heads());
        let hd = e / h;
        let dtype = self.proj.out.weight().dtype();
        let PackedMhaInput { query, key, value, causal, mode } = input;
        query.expect_rows(MODULE, "query", e, dtype)?;
        key.expect_rows(MODULE, "key", cfg.kdim.unwrap_or(e), dtype)?;
        value.expect_rows(MODULE, "value", cfg.vdim.unwrap_or(e), dtype)?;
        if key.cu_seqlens() != value.cu_seqlens() || key.batch() != query.batch() {
            return Err(NnError::Input {
                module: MODULE,
                input: "key/value cu_seqlens",
                found: [key.cu_seqlens(), value.cu_seqlens()].concat(),
                expected: format!("key and value cut alike into the query's {} sequences", query.batch()),
            });
        }
        let heads = |p: &crate::linear::Linear, x: &Packed, n: usize| -> Result<candle_core::Tensor> {
            let y = p.forward(x.data())?.reshape((x.total(), n, hd))?; // [total, n, hd]
            match &cfg.rope {
                Some(rope) => rope.apply_packed(&y, &x.positions()),
                None => Ok(y),
            }
        };
        let q = heads(&self.proj.q, query, h)?;
        let k = heads(&self.proj.k, key, hkv)?;
        let v = self.proj.v.forward(value.data())?.reshape((value.total(), hkv, hd))?;
        let mut opts = SdpaOptions::default().kernel(cfg.kernel).compute(cfg.compute).causal(causal);
        // The same sink logits join every sequence's rows.
        opts.sinks = self.sinks.clone();
        if cfg.dropout > 0.0 {
            if let Some(seed) = self.seeds.seed(mode) {
                opts = opts.dropout(cfg.dropout, seed);
            }
        }
        let out = attn::sdpa_varlen(&q, &k, &v, query.cu_seqlens(), key.cu_seqlens(), &opts)?; // [total_q, H, hd]
        query.with_data(self.proj.out.forward(&out.reshape((query.total(), e))?)?)
    }
}
