//! BERT encoders (Hugging Face's `BertModel`, e.g. all-MiniLM-L6-v2) from a model directory
//! (`config.json` + `model.safetensors`), and sentence embeddings on top: mean pooling over the
//! real tokens, L2-normalised (sentence-transformers' MiniLM pipeline). Attention runs through
//! [`attn::sdpa()`] with the padding as per-sequence key lengths, never a dense mask.

use std::collections::HashMap;
use std::path::Path;

use attn::SdpaOptions;
use attn_nn::{Activation, LayerNorm, Linear, StateDict};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::error::{ModelError, Result};
use crate::json::JsonFile;
use crate::tokenizer::TextTokenizer;
use crate::weights::Weights;

/// `config.json` of a BERT model (Hugging Face's names).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size` `E`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads` `H` (head width `E / H`).
    pub num_heads: usize,
    /// `intermediate_size` of the feed-forward block.
    pub intermediate_size: usize,
    /// `max_position_embeddings`: the longest input.
    pub max_positions: usize,
    /// `type_vocab_size` (segment embeddings; inputs here are one segment, type 0).
    pub type_vocab_size: usize,
    /// `layer_norm_eps`.
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Reads `config.json`; refuses another architecture, a non-GELU activation or relative
    /// position embeddings, naming the field.
    pub fn read(path: &Path) -> Result<Self> {
        let j = JsonFile::read(path)?;
        let model_type = j.str_or("model_type", Some("bert"))?;
        if model_type != "bert" {
            return Err(j.unsupported("model_type", format!("`{model_type}` is not a BERT model (expected `bert`)")));
        }
        let act = j.str_or("hidden_act", Some("gelu"))?;
        if act != "gelu" {
            return Err(j.unsupported("hidden_act", format!("`{act}` is not supported (expected `gelu`)")));
        }
        let pos = j.str_or("position_embedding_type", Some("absolute"))?;
        if pos != "absolute" {
            return Err(
                j.unsupported("position_embedding_type", format!("`{pos}` is not supported (expected `absolute`)"))
            );
        }
        let cfg = Self {
            vocab_size: j.usize("vocab_size")?,
            hidden_size: j.usize("hidden_size")?,
            num_layers: j.usize("num_hidden_layers")?,
            num_heads: j.usize("num_attention_heads")?,
            intermediate_size: j.usize("intermediate_size")?,
            max_positions: j.usize_or("max_position_embeddings", Some(512))?,
            type_vocab_size: j.usize_or("type_vocab_size", Some(2))?,
            layer_norm_eps: j.f64_or("layer_norm_eps", Some(1e-12))?,
        };
        if cfg.num_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_heads) {
            return Err(j.unsupported(
                "num_attention_heads",
                format!("{} does not divide hidden_size {}", cfg.num_heads, cfg.hidden_size),
            ));
        }
        Ok(cfg)
    }
}

/// One encoder layer: self-attention, then the feed-forward block, each post-norm residual.
#[derive(Debug)]
struct BertLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    down: Linear,
    output_norm: LayerNorm,
}

impl BertLayer {
    fn new(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        let (e, f) = (cfg.hidden_size, cfg.intermediate_size);
        let att = vb.pp("attention");
        Ok(Self {
            query: Linear::load(e, e, att.pp("self").pp("query"))?,
            key: Linear::load(e, e, att.pp("self").pp("key"))?,
            value: Linear::load(e, e, att.pp("self").pp("value"))?,
            output: Linear::load(e, e, att.pp("output").pp("dense"))?,
            attention_norm: LayerNorm::new(e, cfg.layer_norm_eps, att.pp("output").pp("LayerNorm"))?,
            intermediate: Linear::load(e, f, vb.pp("intermediate").pp("dense"))?,
            down: Linear::load(f, e, vb.pp("output").pp("dense"))?,
            output_norm: LayerNorm::new(e, cfg.layer_norm_eps, vb.pp("output").pp("LayerNorm"))?,
        })
    }

    /// The linear layers: projections and feed-forward.
    fn linears_mut(&mut self) -> [&mut Linear; 6] {
        [&mut self.query, &mut self.key, &mut self.value, &mut self.output, &mut self.intermediate, &mut self.down]
    }

    /// `x: [B, L, E]`, `lengths[b]` real tokens → `[B, L, E]`; the attention weights
    /// `[B, H, L, L]` pushed to `weights` when given.
    fn forward(
        &self,
        x: &Tensor,
        heads: usize,
        lengths: &[usize],
        weights: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let (b, l, e) = x.dims3()?;
        let split = |t: Tensor| -> Result<Tensor> { Ok(t.reshape((b, l, heads, e / heads))?.transpose(1, 2)?) };
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        let opts = SdpaOptions::default().key_lengths(lengths.to_vec()).return_weights(weights.is_some());
        let out = attn::sdpa_full(&q, &k, &v, &opts)?;
        if let (Some(sink), Some(w)) = (weights, out.weights) {
            sink.push(w);
        }
        let a = out.out.transpose(1, 2)?.reshape((b, l, e))?;
        let x = self.attention_norm.forward(&(self.output.forward(&a)? + x)?)?;
        let h = Activation::Gelu.forward(&self.intermediate.forward(&x)?)?;
        Ok(self.output_norm.forward(&(self.down.forward(&h)? + x)?)?)
    }
}

/// A BERT encoder (no pooler: sentence embeddings pool the last hidden states).
#[derive(Debug)]
pub struct Bert {
    cfg: BertConfig,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<BertLayer>,
}

impl Bert {
    /// Builds the encoder from `embeddings.*` and `encoder.layer.N.*` under `vb` (Hugging Face's
    /// names).
    pub fn new(cfg: &BertConfig, vb: VarBuilder) -> Result<Self> {
        let (e, emb) = (cfg.hidden_size, vb.pp("embeddings"));
        Ok(Self {
            word: emb.get((cfg.vocab_size, e), "word_embeddings.weight").map_err(attn_nn::NnError::from)?,
            position: emb.get((cfg.max_positions, e), "position_embeddings.weight").map_err(attn_nn::NnError::from)?,
            token_type: emb
                .get((cfg.type_vocab_size, e), "token_type_embeddings.weight")
                .map_err(attn_nn::NnError::from)?,
            embedding_norm: LayerNorm::new(e, cfg.layer_norm_eps, emb.pp("LayerNorm"))?,
            layers: (0..cfg.num_layers)
                .map(|i| BertLayer::new(cfg, vb.pp("encoder").pp("layer").pp(i)))
                .collect::<Result<_>>()?,
            cfg: cfg.clone(),
        })
    }

    /// Makes every linear layer multiply as `weights` says; embeddings, norms and attention stay
    /// f32.
    pub fn set_weights(&mut self, weights: Weights) -> Result<()> {
        weights.apply(self.layers.iter_mut().flat_map(BertLayer::linears_mut))
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The last hidden states `[B, L, E]` of `ids: [B, L]` (`u32`), sequence `b` being its first
    /// `lengths[b]` ids (the rest padding, masked as keys; their rows are computed and
    /// meaningless).
    pub fn forward(&self, ids: &Tensor, lengths: &[usize]) -> Result<Tensor> {
        self.run(ids, lengths, None)
    }

    /// The attention weights `[H, L, L]` of every layer for one sequence `ids` (no padding).
    pub fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>> {
        let mut weights = Vec::with_capacity(self.layers.len());
        let batch = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
        self.run(&batch, &[ids.len()], Some(&mut weights))?;
        weights.into_iter().map(|w| Ok(w.squeeze(0)?)).collect()
    }

    fn run(&self, ids: &Tensor, lengths: &[usize], mut weights: Option<&mut Vec<Tensor>>) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        if l > self.cfg.max_positions {
            return Err(ModelError::Input(format!(
                "{l} tokens, longer than the model's {} positions",
                self.cfg.max_positions
            )));
        }
        let e = self.cfg.hidden_size;
        let words = self.word.index_select(&ids.flatten_all()?, 0)?.reshape((b, l, e))?;
        let positions = self.position.narrow(0, 0, l)?.unsqueeze(0)?;
        let types = self.token_type.narrow(0, 0, 1)?.unsqueeze(0)?;
        let mut x = self.embedding_norm.forward(&words.broadcast_add(&positions)?.broadcast_add(&types)?)?;
        for layer in &self.layers {
            x = layer.forward(&x, self.cfg.num_heads, lengths, weights.as_deref_mut())?;
        }
        Ok(x)
    }
}

/// A sentence encoder: tokenizer, BERT and mean pooling (sentence-transformers' layout: the
/// model directory with `config.json`, `model.safetensors`, `tokenizer.json`, optionally
/// `sentence_bert_config.json` and `1_Pooling/config.json`).
#[derive(Debug)]
pub struct SentenceEncoder {
    /// The encoder.
    pub bert: Bert,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
    /// Inputs are cut to this many tokens (sentence-transformers' `max_seq_length`).
    pub max_tokens: usize,
}

impl SentenceEncoder {
    /// Loads the model directory `dir`, its weights f32 ([`SentenceEncoder::load_with`] chooses).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, Weights::F32)
    }

    /// [`SentenceEncoder::load`] with the linear layers' products as `weights` says.
    pub fn load_with(dir: &Path, weights: Weights) -> Result<Self> {
        if !dir.is_dir() {
            return Err(ModelError::file(
                dir,
                "not a model directory (a BERT sentence encoder's: config.json, model.safetensors, tokenizer.json)",
            ));
        }
        let cfg = BertConfig::read(&dir.join("config.json"))?;
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let pooling = dir.join("1_Pooling").join("config.json");
        if pooling.exists() {
            let p = JsonFile::read(&pooling)?;
            if !p.bool_or("pooling_mode_mean_tokens", true)? {
                return Err(p.unsupported("pooling_mode_mean_tokens", "only mean pooling is supported"));
            }
        }
        let st = dir.join("sentence_bert_config.json");
        let max_tokens = if st.exists() {
            JsonFile::read(&st)?.usize_or("max_seq_length", Some(cfg.max_positions))?
        } else {
            cfg.max_positions
        }
        .min(cfg.max_positions);
        let path = dir.join("model.safetensors");
        let mut bert = encoder_weights(&path)?.build(DType::F32, &Device::Cpu, |vb| Bert::new(&cfg, vb))?;
        bert.set_weights(weights)?;
        Ok(Self { bert, tokenizer, max_tokens })
    }

    /// The token ids of each text, cut to [`SentenceEncoder::max_tokens`] (the last kept id
    /// being the tokenizer's closing `[SEP]`, as transformers truncates).
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        texts
            .iter()
            .map(|t| {
                let mut ids = self.tokenizer.encode(t)?;
                if ids.len() > self.max_tokens {
                    let last = *ids.last().expect("longer than max_tokens, so not empty");
                    ids.truncate(self.max_tokens);
                    *ids.last_mut().expect("max_tokens > 0") = last;
                }
                Ok(ids)
            })
            .collect()
    }

    /// L2-normalised mean-pooled embeddings `[N, E]` of `texts`, one padded batch.
    pub fn embed(&self, texts: &[&str]) -> Result<Tensor> {
        if texts.is_empty() {
            return Err(ModelError::Input("no text to embed".into()));
        }
        let ids = self.tokenize(texts)?;
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        let l = lengths.iter().copied().max().unwrap_or(0);
        let padded: Vec<u32> =
            ids.iter().flat_map(|row| row.iter().copied().chain(std::iter::repeat(0)).take(l)).collect();
        let batch = Tensor::from_vec(padded, (texts.len(), l), &Device::Cpu)?;
        let hidden = self.bert.forward(&batch, &lengths)?;
        let mask: Vec<f32> = lengths.iter().flat_map(|&n| (0..l).map(move |i| f32::from(u8::from(i < n)))).collect();
        let mask = Tensor::from_vec(mask, (texts.len(), l, 1), &Device::Cpu)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts =
            Tensor::from_vec(lengths.iter().map(|&n| n.max(1) as f32).collect(), (texts.len(), 1), &Device::Cpu)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::INFINITY)?;
        Ok(mean.broadcast_div(&norm)?)
    }
}

/// The encoder's tensors of a BERT safetensors file, without what the encoder does not use:
/// the `position_ids` buffer and the pooler (sentence embeddings pool the hidden states), and
/// with a `bert.` prefix (BertForX checkpoints) dropped.
fn encoder_weights(path: &Path) -> Result<StateDict> {
    let tensors = crate::weights_file::read(path, "missing")?;
    let kept: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(name, t)| (name.strip_prefix("bert.").map(str::to_string).unwrap_or(name), t))
        .filter(|(name, _)| name.starts_with("embeddings.") || name.starts_with("encoder."))
        .filter(|(name, _)| name != "embeddings.position_ids")
        .collect();
    Ok(StateDict::from_tensors(kept, path.display().to_string()))
}
