//! Decoder-only language models from GGUF files or Hugging Face directories, one implementation
//! for the two families attn runs: **Llama** (Llama, SmolLM2, and by Hugging Face names Llama,
//! Mistral with its sliding window, Qwen2 with its q/k/v biases: RMSNorm, grouped-query attention
//! with RoPE, SwiGLU) and
//! **Gemma 3** (the same skeleton with QK-norm, sandwich norms around attention and feed-forward,
//! GeGLU with tanh-GELU, embeddings scaled by `√E`, and five sliding-window layers (512 keys, RoPE
//! θ 1e4) to every global one (RoPE θ from the file)). Attention runs through [`attn::sdpa()`],
//! causal and bottom-right aligned, the window as attn's structured window, against a KV cache.
//! Weights are dequantized to `f32` (the parity mode), their products optionally in bfloat16
//! ([`crate::Weights`]); the llama GGUF's interleaved
//! `attn_q`/`attn_k` rows are put back in half-split order on load, as transformers does.
mod config;
mod layer;

use std::collections::HashMap;
use std::path::Path;

use attn::cache::{CacheConfig, KvDtype, PagedCache};
use attn_nn::{Linear, RmsNorm, StateDict};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use config::gguf_name;
pub use config::{CausalLmConfig, Family, LayerAttention};
use layer::Layer;

use crate::error::{ModelError, Result};
use crate::gguf::Gguf;
use crate::kv_buffer::KvBuffer;
use crate::weights::Weights;
use layer::LayerCache;

/// Positions per page of a paged cache: FlashAttention's smallest page size.
const PAGE_SIZE: usize = 16;

/// The KV cache of one sequence of a [`CausalLm`]: one per layer.
#[derive(Debug, Clone, Default)]
pub struct LmCache {
    layers: Vec<LayerCache>,
}

impl LmCache {
    /// How many positions are cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A decoder-only language model.
#[derive(Debug)]
pub struct CausalLm {
    cfg: CausalLmConfig,
    kv_dtype: Option<KvDtype>,
    embedding: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
}

impl CausalLm {
    /// Loads a `llama` or `gemma3` GGUF, every tensor dequantized to `f32`; refuses a missing,
    /// mis-shaped or unused tensor by name.
    pub fn from_gguf(g: &mut Gguf) -> Result<Self> {
        let cfg = CausalLmConfig::from_gguf(g)?;
        let mut tensors = g.dequantize_all()?;
        if cfg.family == Family::Llama {
            for (suffix, heads) in [("attn_q.weight", cfg.num_heads), ("attn_k.weight", cfg.num_kv_heads)] {
                for (name, t) in tensors.iter_mut().filter(|(n, _)| n.ends_with(suffix)) {
                    *t = unpermute(t, heads).map_err(|e| ModelError::field(g.path(), name.clone(), e))?;
                }
            }
        }
        let origin = g.path().display().to_string();
        StateDict::from_tensors(tensors, origin).build(DType::F32, &Device::Cpu, |vb| Self::new(&cfg, vb))
    }

    /// Loads a Hugging Face directory of the Llama family (`config.json`, `model.safetensors`);
    /// refuses a tensor missing, mis-shaped, or not the model's, by its Hugging Face name.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let cfg = CausalLmConfig::from_hf_config(&dir.join("config.json"))?;
        let weights = dir.join("model.safetensors");
        let tensors = crate::weights_file::read(&weights, "missing (sharded checkpoints are not supported)")?;
        let mut renamed = HashMap::with_capacity(tensors.len());
        for (name, t) in tensors {
            let to = gguf_name(&name)
                .ok_or_else(|| ModelError::field(&weights, &name, "not a tensor of a Llama-family model"))?;
            renamed.insert(to, t.to_dtype(DType::F32)?);
        }
        StateDict::from_tensors(renamed, weights.display().to_string())
            .build(DType::F32, &Device::Cpu, |vb| Self::new(&cfg, vb))
    }

    /// Builds the decoder from GGUF-named tensors under `vb` (`token_embd.weight`,
    /// `blk.N.attn_q.weight`, ..., `output_norm.weight`, and `output.weight` when the output
    /// embedding is not tied).
    pub fn new(cfg: &CausalLmConfig, vb: VarBuilder) -> Result<Self> {
        let e = cfg.hidden_size;
        let embedding = vb.get((cfg.vocab_size, e), "token_embd.weight").map_err(attn_nn::NnError::from)?;
        let lm_head = if vb.contains_tensor("output.weight") {
            Linear::load_no_bias(e, cfg.vocab_size, vb.pp("output"))?
        } else {
            Linear::new(embedding.clone(), None)
        };
        let layers = cfg.layers.iter().enumerate().map(|(i, &a)| Layer::new(cfg, a, vb.pp(format!("blk.{i}"))));
        Ok(Self {
            layers: layers.collect::<Result<_>>()?,
            norm: RmsNorm::new(e, cfg.rms_eps, vb.pp("output_norm"))?,
            embedding,
            lm_head,
            cfg: cfg.clone(),
            kv_dtype: None,
        })
    }

    /// Makes every linear layer (projections, feed-forward, the output layer) multiply as
    /// `weights` says; the embeddings, norms and attention stay f32.
    pub fn set_weights(&mut self, weights: Weights) -> Result<()> {
        weights.apply(self.layers.iter_mut().flat_map(Layer::linears_mut).chain([&mut self.lm_head]))
    }

    /// The configuration.
    pub fn config(&self) -> &CausalLmConfig {
        &self.cfg
    }

    /// How the caches of [`new_cache`](Self::new_cache) keep keys and values: `None` (the
    /// default) in dense f32 buffers attended by the flash kernels; `Some(dtype)` in an
    /// [`attn::cache::PagedCache`] of 16-position pages stored as `dtype` (quantized on write),
    /// attended by the paged kernel, prefill included, so every query reads the stored values.
    pub fn set_kv_dtype(&mut self, kv: Option<KvDtype>) {
        self.kv_dtype = kv;
    }

    /// An empty cache for this model (see [`set_kv_dtype`](Self::set_kv_dtype)).
    pub fn new_cache(&self) -> Result<LmCache> {
        let Some(dtype) = self.kv_dtype else { return Ok(self.dense_cache()) };
        let c = &self.cfg;
        let cfg = CacheConfig { page_size: PAGE_SIZE, heads: c.num_kv_heads, dk: c.head_dim, dv: c.head_dim, dtype };
        let layers = (0..self.layers.len())
            .map(|_| {
                let mut pages = PagedCache::new(cfg)?;
                let seq = pages.allocate();
                Ok(LayerCache::Paged(Box::new(pages), seq))
            })
            .collect::<Result<_>>()?;
        Ok(LmCache { layers })
    }

    fn dense_cache(&self) -> LmCache {
        LmCache { layers: vec![LayerCache::Dense(KvBuffer::default()); self.layers.len()] }
    }

    /// The logits `[L, V]` of `ids` following the cached positions (a prompt's prefill, one
    /// decoded token, or a chunk), the cache grown by `ids.len()`; refuses to go past the
    /// model's context.
    pub fn forward(&self, ids: &[u32], cache: &mut LmCache) -> Result<Tensor> {
        self.run(ids, cache, None, Positions::All)
    }

    /// The logits `[1, V]` of the last of `ids` only (as [`CausalLm::forward`] otherwise): what
    /// generation needs, without the output layer's product for every prompt position.
    pub fn forward_last(&self, ids: &[u32], cache: &mut LmCache) -> Result<Tensor> {
        self.run(ids, cache, None, Positions::Last)
    }

    /// The attention weights `[Hq, L, L]` of every layer for the sequence `ids` (causal).
    pub fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>> {
        let mut weights = Vec::with_capacity(self.layers.len());
        self.run(ids, &mut self.dense_cache(), Some(&mut weights), Positions::Last)?;
        weights.into_iter().map(|w| Ok(w.squeeze(0)?)).collect()
    }

    /// One new token for each of several sequences, `ids[b]` after `caches[b]`'s positions (a
    /// batched decode step: every weight read once for the batch): the logits `[B, V]`, each
    /// cache grown by one.
    pub fn decode_batch(&self, ids: &[u32], caches: &mut [LmCache]) -> Result<Tensor> {
        if ids.len() != caches.len() {
            return Err(ModelError::Input(format!("{} tokens for {} sequences' caches", ids.len(), caches.len())));
        }
        let mut refs: Vec<&mut LmCache> = caches.iter_mut().collect();
        Ok(self.run_rows(ids, 1, &mut refs, None, Positions::Last)?.squeeze(1)?)
    }

    fn run(
        &self,
        ids: &[u32],
        cache: &mut LmCache,
        weights: Option<&mut Vec<Tensor>>,
        logits: Positions,
    ) -> Result<Tensor> {
        Ok(self.run_rows(ids, ids.len(), &mut [cache], weights, logits)?.squeeze(0)?)
    }

    /// `ids: [B, L]` row-major, row `b` after `caches[b]` → logits `[B, L or 1, V]`.
    fn run_rows(
        &self,
        ids: &[u32],
        l: usize,
        caches: &mut [&mut LmCache],
        mut weights: Option<&mut Vec<Tensor>>,
        logits: Positions,
    ) -> Result<Tensor> {
        if l == 0 || ids.is_empty() {
            return Err(ModelError::Input("no tokens".into()));
        }
        for cache in caches.iter_mut() {
            let total = cache.len() + l;
            if total > self.cfg.max_positions {
                return Err(ModelError::Input(format!(
                    "{total} tokens, longer than the model's context of {}",
                    self.cfg.max_positions
                )));
            }
            if cache.layers.len() != self.layers.len() {
                **cache = self.new_cache()?;
            }
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let b = caches.len();
        let idx = Tensor::new(ids, &Device::Cpu)?;
        let mut x = self.embedding.index_select(&idx, 0)?.reshape((b, l, self.cfg.hidden_size))?;
        if self.cfg.family == Family::Gemma3 {
            // transformers rounds √E to the activations' dtype before scaling.
            x = (x * f64::from((self.cfg.hidden_size as f32).sqrt()))?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let mut kv: Vec<&mut LayerCache> = caches.iter_mut().map(|c| &mut c.layers[i]).collect();
            x = layer.forward(&x, &self.cfg, &mut kv, weights.as_deref_mut())?;
        }
        if logits == Positions::Last {
            x = x.narrow(1, l - 1, 1)?;
        }
        Ok(self.lm_head.forward(&self.norm.forward(&x)?)?)
    }
}

/// Which positions' logits a pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Positions {
    All,
    Last,
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
