//! Llama-family decoders (Llama, SmolLM2) from GGUF files: RMSNorm, grouped-query attention with
//! rotary embeddings (half-split; the GGUF's interleaved `attn_q`/`attn_k` rows un-permuted on
//! load, as transformers does), SwiGLU feed-forward, tied or separate output embeddings.
//! Attention runs through [`attn::sdpa()`], causal and bottom-right aligned, against a KV cache.
//! Weights are dequantized to `f32` (the parity mode).

use attn::{Align, SdpaOptions};
use attn_nn::{KvCache, Linear, RmsNorm, RopeConfig, StateDict};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::error::{ModelError, Result};
use crate::gguf::Gguf;

/// A Llama decoder's hyper-parameters (GGUF `llama.*` metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size (rows of `token_embd`).
    pub vocab_size: usize,
    /// Model width `E` (`llama.embedding_length`).
    pub hidden_size: usize,
    /// `llama.block_count`.
    pub num_layers: usize,
    /// Query heads `Hq` (`llama.attention.head_count`).
    pub num_heads: usize,
    /// Key/value heads `Hkv` (`llama.attention.head_count_kv`).
    pub num_kv_heads: usize,
    /// Head width `D` (`E / Hq`).
    pub head_dim: usize,
    /// Feed-forward width (`llama.feed_forward_length`).
    pub intermediate_size: usize,
    /// RoPE's base θ (`llama.rope.freq_base`).
    pub rope_base: f64,
    /// RMSNorm's epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f64,
    /// The longest sequence (`llama.context_length`).
    pub max_positions: usize,
}

impl LlamaConfig {
    /// Reads the metadata of a `llama` GGUF; refuses another architecture or RoPE scaling.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch = g.architecture()?;
        if arch != "llama" {
            return Err(ModelError::field(g.path(), "general.architecture", format!("`{arch}` is not `llama`")));
        }
        if g.has("llama.rope.scaling.type") && g.string("llama.rope.scaling.type")? != "none" {
            return Err(ModelError::field(g.path(), "llama.rope.scaling.type", "RoPE scaling is not supported"));
        }
        let hidden_size = g.usize("llama.embedding_length")?;
        let num_heads = g.usize("llama.attention.head_count")?;
        let num_kv_heads =
            if g.has("llama.attention.head_count_kv") { g.usize("llama.attention.head_count_kv")? } else { num_heads };
        if num_heads == 0
            || num_kv_heads == 0
            || !hidden_size.is_multiple_of(num_heads)
            || !num_heads.is_multiple_of(num_kv_heads)
        {
            return Err(ModelError::field(
                g.path(),
                "llama.attention.head_count",
                format!("{num_heads} query heads and {num_kv_heads} key/value heads do not split width {hidden_size}"),
            ));
        }
        let vocab_size = g.strings("tokenizer.ggml.tokens")?.len();
        Ok(Self {
            vocab_size,
            hidden_size,
            num_layers: g.usize("llama.block_count")?,
            num_heads,
            num_kv_heads,
            head_dim: hidden_size / num_heads,
            intermediate_size: g.usize("llama.feed_forward_length")?,
            rope_base: if g.has("llama.rope.freq_base") { g.f64("llama.rope.freq_base")? } else { 10000.0 },
            rms_eps: g.f64("llama.attention.layer_norm_rms_epsilon")?,
            max_positions: g.usize("llama.context_length")?,
        })
    }
}

#[derive(Debug)]
struct LlamaLayer {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl LlamaLayer {
    fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let (e, kv, f) = (cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size);
        let w = |name: &str, rows, cols| Linear::load_no_bias(cols, rows, vb.pp(name));
        Ok(Self {
            attn_norm: RmsNorm::new(e, cfg.rms_eps, vb.pp("attn_norm"))?,
            q: w("attn_q", e, e)?,
            k: w("attn_k", kv, e)?,
            v: w("attn_v", kv, e)?,
            o: w("attn_output", e, e)?,
            ffn_norm: RmsNorm::new(e, cfg.rms_eps, vb.pp("ffn_norm"))?,
            gate: w("ffn_gate", f, e)?,
            up: w("ffn_up", f, e)?,
            down: w("ffn_down", e, f)?,
        })
    }

    /// `x: [1, L, E]` at positions `cache.len()..` → `[1, L, E]`, the cache grown by `L`; the
    /// attention weights `[1, Hq, L, Lcache + L]` pushed to `weights` when given.
    fn forward(
        &self,
        x: &Tensor,
        cfg: &LlamaConfig,
        rope: &RopeConfig,
        cache: &mut KvCache,
        weights: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let (b, l, e) = x.dims3()?;
        let offset = cache.len();
        let h = self.attn_norm.forward(x)?;
        let heads =
            |t: Tensor, n: usize| -> Result<Tensor> { Ok(t.reshape((b, l, n, cfg.head_dim))?.transpose(1, 2)?) };
        let q = rope.apply(&heads(self.q.forward(&h)?, cfg.num_heads)?, offset)?;
        let k = rope.apply(&heads(self.k.forward(&h)?, cfg.num_kv_heads)?, offset)?;
        let v = heads(self.v.forward(&h)?, cfg.num_kv_heads)?.contiguous()?;
        let (k, v) = cache.append(k.contiguous()?, v)?;
        let opts = SdpaOptions::default().causal(true).align(Align::BottomRight).return_weights(weights.is_some());
        let out = attn::sdpa_full(&q, &k, &v, &opts)?;
        if let (Some(sink), Some(w)) = (weights, out.weights) {
            sink.push(w);
        }
        let a = out.out.transpose(1, 2)?.reshape((b, l, e))?;
        let x = (self.o.forward(&a)? + x)?;
        let h = self.ffn_norm.forward(&x)?;
        let gated = (candle_nn::ops::silu(&self.gate.forward(&h)?)? * self.up.forward(&h)?)?;
        Ok((self.down.forward(&gated)? + x)?)
    }
}

/// The KV cache of a [`Llama`]: one per layer.
#[derive(Debug, Clone, Default)]
pub struct LlamaCache {
    layers: Vec<KvCache>,
}

impl LlamaCache {
    /// How many positions are cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A Llama decoder.
#[derive(Debug)]
pub struct Llama {
    cfg: LlamaConfig,
    rope: RopeConfig,
    embedding: Tensor,
    layers: Vec<LlamaLayer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl Llama {
    /// Loads a `llama` GGUF, every tensor dequantized to `f32`; refuses a missing, mis-shaped or
    /// unused tensor by name.
    pub fn from_gguf(g: &mut Gguf) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(g)?;
        let mut tensors = g.dequantize_all()?;
        for (suffix, heads) in [("attn_q.weight", cfg.num_heads), ("attn_k.weight", cfg.num_kv_heads)] {
            for (name, t) in tensors.iter_mut().filter(|(n, _)| n.ends_with(suffix)) {
                *t = unpermute(t, heads).map_err(|e| ModelError::field(g.path(), name.clone(), e))?;
            }
        }
        let origin = g.path().display().to_string();
        StateDict::from_tensors(tensors, origin).build(DType::F32, &Device::Cpu, |vb| Self::new(&cfg, vb))
    }

    /// Builds the decoder from GGUF-named tensors under `vb` (`token_embd.weight`,
    /// `blk.N.attn_q.weight`, ..., `output_norm.weight`, and `output.weight` when the output
    /// embedding is not tied).
    pub fn new(cfg: &LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let e = cfg.hidden_size;
        let embedding = vb.get((cfg.vocab_size, e), "token_embd.weight").map_err(attn_nn::NnError::from)?;
        let lm_head = if vb.contains_tensor("output.weight") {
            Linear::load_no_bias(e, cfg.vocab_size, vb.pp("output"))?
        } else {
            Linear::new(embedding.clone(), None)
        };
        Ok(Self {
            rope: RopeConfig { base: cfg.rope_base },
            layers: (0..cfg.num_layers)
                .map(|i| LlamaLayer::new(cfg, vb.pp(format!("blk.{i}"))))
                .collect::<Result<_>>()?,
            norm: RmsNorm::new(e, cfg.rms_eps, vb.pp("output_norm"))?,
            embedding,
            lm_head,
            cfg: cfg.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> LlamaCache {
        LlamaCache { layers: vec![KvCache::new(); self.cfg.num_layers] }
    }

    /// The logits `[L, V]` of `ids` following the cached positions (a prompt's prefill, one
    /// decoded token, or a chunk), the cache grown by `ids.len()`; refuses to go past the
    /// model's context.
    pub fn forward(&self, ids: &[u32], cache: &mut LlamaCache) -> Result<Tensor> {
        self.run(ids, cache, None)
    }

    /// The attention weights `[Hq, L, L]` of every layer for the sequence `ids` (causal).
    pub fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>> {
        let mut weights = Vec::with_capacity(self.layers.len());
        self.run(ids, &mut self.new_cache(), Some(&mut weights))?;
        weights.into_iter().map(|w| Ok(w.squeeze(0)?)).collect()
    }

    fn run(&self, ids: &[u32], cache: &mut LlamaCache, mut weights: Option<&mut Vec<Tensor>>) -> Result<Tensor> {
        let total = cache.len() + ids.len();
        if total > self.cfg.max_positions {
            return Err(ModelError::Input(format!(
                "{total} tokens, longer than the model's context of {}",
                self.cfg.max_positions
            )));
        }
        if ids.is_empty() {
            return Err(ModelError::Input("no tokens".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        if cache.layers.len() != self.layers.len() {
            *cache = self.new_cache();
        }
        let idx = Tensor::new(ids, &Device::Cpu)?;
        let mut x = self.embedding.index_select(&idx, 0)?.unsqueeze(0)?;
        for (layer, kv) in self.layers.iter().zip(&mut cache.layers) {
            x = layer.forward(&x, &self.cfg, &self.rope, kv, weights.as_deref_mut())?;
        }
        Ok(self.lm_head.forward(&self.norm.forward(&x)?)?.squeeze(0)?)
    }
}

/// A GGUF `attn_q`/`attn_k` weight `[heads·D, E]` with its rows back in half-split order: llama.cpp
/// interleaves each head's two halves (row `2i + p` holds half `p`, pair `i`).
fn unpermute(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        candle_core::bail!("{rows} rows do not split into {heads} heads of pairs");
    }
    w.reshape((heads, rows / heads / 2, 2, cols))?.transpose(1, 2)?.reshape((rows, cols))
}
