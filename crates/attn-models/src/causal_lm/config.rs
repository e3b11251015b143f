//! A decoder's hyper-parameters: from a GGUF's `{arch}.*` metadata (Llama, Gemma 3 with its
//! unstored local/global pattern) or a Hugging Face `config.json` of the Llama family, and the
//! Hugging Face tensor names mapped onto the GGUF's.

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::gguf::Gguf;
use crate::json::JsonFile;

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
pub(super) fn gguf_name(hf: &str) -> Option<String> {
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
