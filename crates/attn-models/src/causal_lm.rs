//! Decoder-only language models from GGUF files or Hugging Face directories, one implementation
//! for the two families attn runs: **Llama** (Llama, SmolLM2, and by Hugging Face names Llama,
//! Mistral with its sliding window, Qwen2 with its q/k/v biases: RMSNorm, grouped-query attention
//! with RoPE, SwiGLU) and
//! **Gemma 3** (the same skeleton with QK-norm, sandwich norms around attention and feed-forward,
//! GeGLU with tanh-GELU, embeddings scaled by `√E`, and five sliding-window layers (512 keys, RoPE
//! θ 1e4) to every global one (RoPE θ from the file)). Attention runs through [`attn::sdpa()`],
//! causal and bottom-right aligned, the window as attn's structured window, against a KV cache.
//! Weights are dequantized to `f32` (the parity mode); the llama GGUF's interleaved
//! `attn_q`/`attn_k` rows are put back in half-split order on load, as transformers does.

use std::collections::HashMap;
use std::path::Path;

use attn::{Align, SdpaOptions};
use attn_nn::{Linear, RmsNorm, RopeConfig, StateDict};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::error::{ModelError, Result};
use crate::gguf::Gguf;
use crate::json::JsonFile;
use crate::kv_buffer::KvBuffer;

/// Which family's layer layout a model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama: pre-norm attention and SwiGLU.
    Llama,
    /// Gemma 3: QK-norm, sandwich norms, GeGLU, scaled embeddings, local/global layers.
    Gemma3,
}

/// How one layer attends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerAttention {
    /// RoPE's base θ.
    pub rope_base: f64,
    /// Keys a query sees: itself and the `window − 1` before it (`None`: every earlier key).
    pub window: Option<usize>,
}

/// A decoder's hyper-parameters (GGUF `{arch}.*` metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct CausalLmConfig {
    /// The layer layout.
    pub family: Family,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab_size: usize,
    /// Model width `E` (`{arch}.embedding_length`).
    pub hidden_size: usize,
    /// Query heads `Hq` (`{arch}.attention.head_count`).
    pub num_heads: usize,
    /// Key/value heads `Hkv` (`{arch}.attention.head_count_kv`).
    pub num_kv_heads: usize,
    /// Head width `D` (`{arch}.attention.key_length`, else `E / Hq`).
    pub head_dim: usize,
    /// Feed-forward width (`{arch}.feed_forward_length`).
    pub intermediate_size: usize,
    /// RMSNorm's epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f64,
    /// The longest sequence (`{arch}.context_length`).
    pub max_positions: usize,
    /// Each layer's RoPE base and window (`{arch}.block_count` of them).
    pub layers: Vec<LayerAttention>,
}

/// Gemma 3's pattern, which its files do not store: every sixth layer is global.
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's RoPE base on its sliding-window layers (not stored either).
const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;

impl CausalLmConfig {
    /// Reads the metadata of a `llama` or `gemma3` GGUF; refuses another architecture or RoPE
    /// scaling.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch = g.architecture()?;
        let family = match arch {
            "llama" => Family::Llama,
            "gemma3" => Family::Gemma3,
            other => {
                return Err(ModelError::field(
                    g.path(),
                    "general.architecture",
                    format!("`{other}` is not supported (supported: llama, gemma3)"),
                ))
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let scaling = key("rope.scaling.type");
        if g.has(&scaling) && g.string(&scaling)? != "none" {
            return Err(ModelError::field(g.path(), scaling, "RoPE scaling is not supported"));
        }
        let hidden_size = g.usize(&key("embedding_length"))?;
        let num_heads = g.usize(&key("attention.head_count"))?;
        let kv_key = key("attention.head_count_kv");
        let num_kv_heads = if g.has(&kv_key) { g.usize(&kv_key)? } else { num_heads };
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(ModelError::field(
                g.path(),
                key("attention.head_count"),
                format!("{num_heads} query heads are not a multiple of {num_kv_heads} key/value heads"),
            ));
        }
        let head_dim = if g.has(&key("attention.key_length")) {
            g.usize(&key("attention.key_length"))?
        } else if hidden_size.is_multiple_of(num_heads) {
            hidden_size / num_heads
        } else {
            return Err(ModelError::field(
                g.path(),
                key("attention.head_count"),
                format!("{num_heads} heads do not split width {hidden_size}"),
            ));
        };
        let rope_key = key("rope.freq_base");
        let rope_base = if g.has(&rope_key) { g.f64(&rope_key)? } else { 10_000.0 };
        let num_layers = g.usize(&key("block_count"))?;
        let layers = match family {
            Family::Llama => vec![LayerAttention { rope_base, window: None }; num_layers],
            Family::Gemma3 => {
                let window = g.usize(&key("attention.sliding_window"))?;
                (0..num_layers)
                    .map(|i| {
                        if (i + 1).is_multiple_of(GEMMA3_GLOBAL_EVERY) {
                            LayerAttention { rope_base, window: None }
                        } else {
                            LayerAttention { rope_base: GEMMA3_LOCAL_ROPE_BASE, window: Some(window) }
                        }
                    })
                    .collect()
            }
        };
        Ok(Self {
            family,
            vocab_size: g.strings("tokenizer.ggml.tokens")?.len(),
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: g.usize(&key("feed_forward_length"))?,
            rms_eps: g.f64(&key("attention.layer_norm_rms_epsilon"))?,
            max_positions: g.usize(&key("context_length"))?,
            layers,
        })
    }
}

impl CausalLmConfig {
    /// Reads a Hugging Face `config.json` of the Llama family (`model_type` `llama`, `mistral`,
    /// `qwen2`); refuses RoPE scaling and Qwen2's per-layer sliding windows, naming the field.
    pub fn from_hf_config(path: &Path) -> Result<Self> {
        let j = JsonFile::read(path)?;
        let model_type = j.str_or("model_type", None)?;
        if !["llama", "mistral", "qwen2"].contains(&model_type) {
            return Err(j.unsupported(
                "model_type",
                format!("`{model_type}` is not supported (supported: llama, mistral, qwen2)"),
            ));
        }
        for key in ["rope_scaling", "rope_parameters.rope_type"] {
            if j.has(key) && j.str_or(key, Some("default")).unwrap_or("scaled") != "default" {
                return Err(j.unsupported(key, "RoPE scaling is not supported"));
            }
        }
        if j.bool_or("use_sliding_window", false)? {
            return Err(j.unsupported("use_sliding_window", "Qwen2's per-layer sliding windows are not supported"));
        }
        let hidden_size = j.usize("hidden_size")?;
        let num_heads = j.usize("num_attention_heads")?;
        let num_kv_heads = j.usize_or("num_key_value_heads", Some(num_heads))?;
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(j.unsupported(
                "num_key_value_heads",
                format!("{num_heads} query heads are not a multiple of {num_kv_heads}"),
            ));
        }
        let head_dim = match j.usize_or("head_dim", None) {
            Ok(d) => d,
            Err(_) if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
            Err(_) => {
                return Err(
                    j.unsupported("num_attention_heads", format!("{num_heads} heads do not split width {hidden_size}"))
                )
            }
        };
        let rope_base = if j.has("rope_parameters.rope_theta") {
            j.f64_or("rope_parameters.rope_theta", None)?
        } else {
            j.f64_or("rope_theta", Some(10_000.0))?
        };
        let window = if model_type == "mistral" { j.first_usize("sliding_window")? } else { None };
        let num_layers = j.usize("num_hidden_layers")?;
        Ok(Self {
            family: Family::Llama,
            vocab_size: j.usize("vocab_size")?,
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: j.usize("intermediate_size")?,
            rms_eps: j.f64_or("rms_norm_eps", Some(1e-6))?,
            max_positions: j.usize_or("max_position_embeddings", Some(2048))?,
            layers: vec![LayerAttention { rope_base, window }; num_layers],
        })
    }
}

/// A Hugging Face Llama-family tensor name as the GGUF spells it (`model.layers.3.mlp.up_proj.weight`
/// → `blk.3.ffn_up.weight`), `None` for a name the model does not use.
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let to = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{to}.{kind}"))
}

/// Gemma 3's extra norms.
#[derive(Debug)]
struct GemmaNorms {
    q: RmsNorm,
    k: RmsNorm,
    post_attention: RmsNorm,
    post_ffw: RmsNorm,
}

#[derive(Debug)]
struct Layer {
    attention: LayerAttention,
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    gemma: Option<GemmaNorms>,
}

impl Layer {
    fn new(cfg: &CausalLmConfig, attention: LayerAttention, vb: VarBuilder) -> Result<Self> {
        let e = cfg.hidden_size;
        let (q, kv, f) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size);
        // Qwen2's q/k/v projections have biases; a bias the file holds is loaded.
        let w = |name: &str, rows, cols| {
            let load = if vb.contains_tensor(&format!("{name}.bias")) { Linear::load } else { Linear::load_no_bias };
            load(cols, rows, vb.pp(name))
        };
        let norm = |name: &str, dim| RmsNorm::new(dim, cfg.rms_eps, vb.pp(name));
        let gemma = match cfg.family {
            Family::Llama => None,
            Family::Gemma3 => Some(GemmaNorms {
                q: norm("attn_q_norm", cfg.head_dim)?,
                k: norm("attn_k_norm", cfg.head_dim)?,
                post_attention: norm("post_attention_norm", e)?,
                post_ffw: norm("post_ffw_norm", e)?,
            }),
        };
        Ok(Self {
            attention,
            attn_norm: norm("attn_norm", e)?,
            q: w("attn_q", q, e)?,
            k: w("attn_k", kv, e)?,
            v: w("attn_v", kv, e)?,
            o: w("attn_output", e, q)?,
            ffn_norm: norm("ffn_norm", e)?,
            gate: w("ffn_gate", f, e)?,
            up: w("ffn_up", f, e)?,
            down: w("ffn_down", e, f)?,
            gemma,
        })
    }

    /// `x: [B, L, E]`, row `b` at positions `caches[b].len()..` → `[B, L, E]`, each cache grown by
    /// `L`; the attention weights `[1, Hq, L, Lcache + L]` of each row pushed to `weights` when
    /// given. The projections and the feed-forward run on the whole batch, RoPE and attention per
    /// row against its own cache (rows of a batch have caches of different lengths).
    fn forward(
        &self,
        x: &Tensor,
        cfg: &CausalLmConfig,
        caches: &mut [&mut KvBuffer],
        mut weights: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let rope = RopeConfig { base: self.attention.rope_base };
        let h = self.attn_norm.forward(x)?;
        let heads =
            |t: Tensor, n: usize| -> Result<Tensor> { Ok(t.reshape((b, l, n, cfg.head_dim))?.transpose(1, 2)?) };
        let mut q = heads(self.q.forward(&h)?, cfg.num_heads)?;
        let mut k = heads(self.k.forward(&h)?, cfg.num_kv_heads)?;
        if let Some(g) = &self.gemma {
            q = g.q.forward(&q)?;
            k = g.k.forward(&k)?;
        }
        let v = heads(self.v.forward(&h)?, cfg.num_kv_heads)?;
        let mut opts = SdpaOptions::default()
            .causal(true)
            .align(Align::BottomRight)
            .scale(1.0 / (cfg.head_dim as f64).sqrt())
            .return_weights(weights.is_some());
        if let Some(w) = self.attention.window {
            opts = opts.window(Some(w.saturating_sub(1)), Some(0));
        }
        let mut rows = Vec::with_capacity(b);
        for (i, cache) in caches.iter_mut().enumerate() {
            let offset = cache.len();
            let qi = rope.apply(&q.narrow(0, i, 1)?, offset)?;
            let ki = rope.apply(&k.narrow(0, i, 1)?, offset)?;
            let (ck, cv) = cache.append(&ki, &v.narrow(0, i, 1)?)?;
            let out = attn::sdpa_full(&qi, &ck, &cv, &opts)?;
            if let (Some(sink), Some(w)) = (weights.as_deref_mut(), out.weights) {
                sink.push(w);
            }
            rows.push(out.out);
        }
        let out = if rows.len() == 1 { rows.remove(0) } else { Tensor::cat(&rows, 0)? };
        let mut a = self.o.forward(&out.transpose(1, 2)?.reshape((b, l, cfg.num_heads * cfg.head_dim))?)?;
        if let Some(g) = &self.gemma {
            a = g.post_attention.forward(&a)?;
        }
        let x = (a + x)?;
        let h = self.ffn_norm.forward(&x)?;
        let gate = self.gate.forward(&h)?;
        let act = match cfg.family {
            Family::Llama => candle_nn::ops::silu(&gate)?,
            Family::Gemma3 => gate.gelu()?,
        };
        let mut f = self.down.forward(&(act * self.up.forward(&h)?)?)?;
        if let Some(g) = &self.gemma {
            f = g.post_ffw.forward(&f)?;
        }
        Ok((f + x)?)
    }
}

/// The KV cache of a [`CausalLm`]: one per layer.
#[derive(Debug, Clone, Default)]
pub struct LmCache {
    layers: Vec<KvBuffer>,
}

impl LmCache {
    /// How many positions are cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvBuffer::len)
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
        if !weights.exists() {
            return Err(ModelError::file(&weights, "missing (sharded checkpoints are not supported)"));
        }
        let bytes = std::fs::read(&weights).map_err(|e| ModelError::file(&weights, e))?;
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
            ModelError::file(&weights, format!("not a safetensors file: {}", attn::error::one_line(&e)))
        })?;
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
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CausalLmConfig {
        &self.cfg
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> LmCache {
        LmCache { layers: vec![KvBuffer::default(); self.layers.len()] }
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
        self.run(ids, &mut self.new_cache(), Some(&mut weights), Positions::Last)?;
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
                **cache = self.new_cache();
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
            let mut kv: Vec<&mut KvBuffer> = caches.iter_mut().map(|c| &mut c.layers[i]).collect();
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
