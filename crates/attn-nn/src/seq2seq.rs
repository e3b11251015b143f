//! A sequence-to-sequence Transformer over token ids: source and target embeddings scaled by
//! `√d_model`, sinusoidal positions, [`Transformer`], and an output projection to target-vocabulary
//! logits; greedy decoding through the KV caches. Padding masks come from the token ids.
//!
//! Weights: `src_embed.weight [Vs, d]`, `tgt_embed.weight [Vt, d]`, `transformer.*` (see
//! [`Transformer`]), `generator.weight [Vt, d]`, `generator.bias [Vt]`. Fresh embeddings are drawn
//! from `N(0, 1/d)` as in "Attention Is All You Need", so after the `√d` scale they have unit size
//! like the positional encoding (PyTorch's `nn.Embedding` default, `N(0, 1)`, would drown the
//! positions eight times over at `d = 64`).

use attn::padding_mask;
use candle_core::{DType, Tensor, D};
use candle_nn::{Embedding, Module, VarBuilder};

use crate::decoder::DecoderCache;
use crate::dropout::Mode;
use crate::error::{NnError, Result};
use crate::linear::Linear;
use crate::masks::AttnMasks;
use crate::packed::Packed;
use crate::position::sinusoidal::PositionalEncoding;
use crate::run::Run;
use crate::transformer::{Seq2SeqMasks, Transformer, TransformerConfig, TransformerOutput};

/// Configuration of [`Seq2Seq`].
#[derive(Debug, Clone)]
pub struct Seq2SeqConfig {
    /// Source vocabulary size.
    pub src_vocab: usize,
    /// Target vocabulary size.
    pub tgt_vocab: usize,
    /// The padding token id (same in both vocabularies).
    pub pad_id: u32,
    /// The longest sequence the positional table covers.
    pub max_len: usize,
    /// The encoder-decoder.
    pub transformer: TransformerConfig,
}

/// The model.
///
/// ```
/// use attn_nn::{Run, Seq2Seq, Seq2SeqConfig, TransformerConfig};
/// use candle_core::{Device, Tensor};
/// # fn main() -> attn_nn::Result<()> {
/// let mut transformer = TransformerConfig::new(16, 2);
/// (transformer.num_encoder_layers, transformer.num_decoder_layers, transformer.layer.dim_feedforward) = (1, 1, 32);
/// let cfg = Seq2SeqConfig { src_vocab: 20, tgt_vocab: 12, pad_id: 0, max_len: 32, transformer };
/// let map = candle_nn::VarMap::new();
/// let model = Seq2Seq::new(cfg, attn_nn::init::seeded(&map, 0))?;
/// let src = Tensor::new(&[[5u32, 6, 7, 0], [8, 9, 10, 11]], &Device::Cpu)?; // [B, Ls], 0 = padding
/// let tgt = Tensor::new(&[[1u32, 3, 4], [1, 5, 0]], &Device::Cpu)?; // [B, Lt], starts with bos = 1
/// assert_eq!(model.forward(&src, &tgt, Run::eval())?.out.dims(), [2, 3, 12]); // logits
/// let greedy = model.greedy(&src, 1, 2, 5, true)?;
/// assert_eq!(greedy.tokens.len(), 2);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Seq2Seq {
    src_embed: Embedding,
    tgt_embed: Embedding,
    src_positions: PositionalEncoding,
    tgt_positions: PositionalEncoding,
    transformer: Transformer,
    generator: Linear,
    cfg: Seq2SeqConfig,
}

/// An encoded source batch: the memory and the mask the decoder applies over it.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// `[B, Ls, d_model]`.
    pub memory: Tensor,
    /// The source padding as cross-attention masks.
    pub memory_masks: AttnMasks,
}

/// Greedy decoding's result.
#[derive(Debug, Clone)]
pub struct Greedy {
    /// Per sequence, the generated ids without `bos` and up to (not including) `eos`.
    pub tokens: Vec<Vec<u32>>,
    /// Per decoder layer, the cross-attention weights of every generated position,
    /// `[B, H, steps, Ls]` (when asked).
    pub cross_weights: Vec<Tensor>,
}

impl Seq2Seq {
    /// Loads (or creates) the weights under `vb`. The token ids are `[B, L]`, so the layers must be
    /// batch first.
    pub fn new(cfg: Seq2SeqConfig, vb: VarBuilder) -> Result<Self> {
        let layer = &cfg.transformer.layer;
        if !layer.batch_first {
            return Err(NnError::Config {
                module: "Seq2Seq",
                field: "transformer.layer.batch_first",
                reason: "false, but the model reads [B, L] token ids and runs its layers batch first".into(),
            });
        }
        let d = layer.d_model;
        let embed = |n, name| -> Result<Embedding> {
            let w =
                vb.get_with_hints((n, d), name, candle_nn::Init::Randn { mean: 0.0, stdev: (d as f64).powf(-0.5) })?;
            Ok(Embedding::new(w, d))
        };
        let positions = |name| {
            PositionalEncoding::new(cfg.max_len, d, layer.dropout, layer.seed, &format!("{}.{name}", vb.prefix()))
        };
        Ok(Self {
            src_embed: embed(cfg.src_vocab, "src_embed.weight")?,
            tgt_embed: embed(cfg.tgt_vocab, "tgt_embed.weight")?,
            src_positions: positions("src_positions")?,
            tgt_positions: positions("tgt_positions")?,
            transformer: Transformer::new(&cfg.transformer, vb.pp("transformer"))?,
            generator: Linear::load(d, cfg.tgt_vocab, vb.pp("generator"))?,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Seq2SeqConfig {
        &self.cfg
    }

    /// `ids: [B, L]` (`U32`) → `[B, L, d]`: embedding · √d + positions from `offset` (with their
    /// dropout).
    fn embed(
        &self,
        (table, positions): (&Embedding, &PositionalEncoding),
        ids: &Tensor,
        offset: usize,
        run: Run,
    ) -> Result<Tensor> {
        let (_, l) = ids.dims2()?;
        if offset + l > self.cfg.max_len {
            return Err(NnError::Input {
                module: "Seq2Seq",
                input: "token_ids",
                found: ids.dims().to_vec(),
                expected: format!("at most max_len = {} positions", self.cfg.max_len),
            });
        }
        let d = self.cfg.transformer.layer.d_model as f64;
        let x = (table.forward(ids)? * d.sqrt())?;
        positions.forward(&x, offset, run.mode)
    }

    /// `src: [B, Ls]` (`U32` ids) → the memory and its padding mask.
    pub fn encode(&self, src: &Tensor, run: Run) -> Result<Encoded> {
        let masks = AttnMasks::default().key_padding(padding_mask(src, self.cfg.pad_id)?);
        let x = self.embed((&self.src_embed, &self.src_positions), src, 0, run)?;
        let enc = self.transformer.encoder().forward(&x, &masks, run)?;
        Ok(Encoded { memory: enc.out, memory_masks: masks })
    }

    /// Teacher-forced logits: `src: [B, Ls]`, `tgt: [B, Lt]` (`U32` ids, target starting with
    /// `bos`) → `logits: [B, Lt, Vt]` (in `TransformerOutput::out`) and the weights when asked.
    pub fn forward(&self, src: &Tensor, tgt: &Tensor, run: Run) -> Result<TransformerOutput> {
        let src_pad = AttnMasks::default().key_padding(padding_mask(src, self.cfg.pad_id)?);
        let masks = Seq2SeqMasks {
            src: src_pad.clone(),
            tgt: AttnMasks::causal().key_padding(padding_mask(tgt, self.cfg.pad_id)?),
            memory: src_pad,
        };
        let s = self.embed((&self.src_embed, &self.src_positions), src, 0, run)?;
        let t = self.embed((&self.tgt_embed, &self.tgt_positions), tgt, 0, run)?;
        let mut o = self.transformer.forward(&s, &t, &masks, run)?;
        o.out = self.generator.forward(&o.out)?;
        Ok(o)
    }

    /// Teacher-forced logits of packed batches: `src: [total_s]`, `tgt: [total_t]` (`U32` ids, no
    /// padding, each target sequence starting with `bos`; the same number of sequences) →
    /// `logits: [total_t, Vt]` cut like `tgt`. Positions restart at 0 in every sequence; equal to
    /// [`Self::forward`] on the padded batches at the real rows.
    pub fn forward_packed(&self, src: &Packed, tgt: &Packed, mode: Mode) -> Result<Packed> {
        let s = self.embed_packed((&self.src_embed, &self.src_positions), src, mode)?;
        let t = self.embed_packed((&self.tgt_embed, &self.tgt_positions), tgt, mode)?;
        let out = self.transformer.forward_packed(&s, &t, true, mode)?;
        out.with_data(self.generator.forward(out.data())?)
    }

    /// Packed `ids: [total]` (`U32`) → `[total, d]`: embedding · √d + each row's position within
    /// its sequence (with their dropout).
    fn embed_packed(
        &self,
        (table, positions): (&Embedding, &PositionalEncoding),
        ids: &Packed,
        mode: Mode,
    ) -> Result<Packed> {
        let longest = ids.lengths().into_iter().max().unwrap_or(0);
        if ids.data().rank() != 1 || longest > self.cfg.max_len {
            return Err(NnError::Input {
                module: "Seq2Seq",
                input: "token_ids",
                found: ids.data().dims().to_vec(),
                expected: format!(
                    "packed ids [total], sequences of at most max_len = {} (longest: {longest})",
                    self.cfg.max_len
                ),
            });
        }
        let d = self.cfg.transformer.layer.d_model as f64;
        let x = (table.forward(ids.data())? * d.sqrt())?;
        ids.with_data(positions.forward_packed(&x, &ids.positions(), mode)?)
    }

    /// Greedy decoding of `src: [B, Ls]` from `bos` until every sequence produced `eos` or
    /// `max_steps` tokens, one token per step through the KV caches. The padding token is never
    /// chosen.
    pub fn greedy(&self, src: &Tensor, bos: u32, eos: u32, max_steps: usize, with_weights: bool) -> Result<Greedy> {
        let mut run = Run::eval();
        let enc = self.encode(src, run)?;
        if with_weights {
            run = run.with_weights(crate::mha::NeedWeights::PerHead);
        }
        let b = src.dim(0)?;
        let mut cache = DecoderCache::new(self.transformer.decoder().num_layers());
        let mut last = vec![bos; b];
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut steps: Vec<Vec<Tensor>> = Vec::new();
        let max_steps = max_steps.min(self.cfg.max_len);
        let mut no_pad = vec![0f32; self.cfg.tgt_vocab];
        if let Some(x) = no_pad.get_mut(self.cfg.pad_id as usize) {
            *x = f32::NEG_INFINITY;
        }
        let never_pad = Tensor::from_vec(no_pad, self.cfg.tgt_vocab, src.device())?; // [Vt]
        for _ in 0..max_steps {
            let ids = Tensor::from_vec(last.clone(), (b, 1), src.device())?;
            let x = self.embed((&self.tgt_embed, &self.tgt_positions), &ids, cache.len(), run)?;
            let o = self.transformer.decode_step(&x, &enc.memory, &enc.memory_masks, run, &mut cache)?;
            steps.push(o.cross_weights);
            let logits = self.generator.forward(&o.out)?.broadcast_add(&never_pad)?; // [B, 1, Vt]
            let next = logits.argmax(D::Minus1)?.flatten_all()?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
            for (i, &t) in next.iter().enumerate() {
                if !done[i] {
                    if t == eos {
                        done[i] = true;
                    } else {
                        tokens[i].push(t);
                    }
                }
            }
            last = next;
            if done.iter().all(|&d| d) {
                break;
            }
        }
        let layers = steps.first().map_or(0, Vec::len);
        let cross_weights = (0..layers)
            .map(|l| Tensor::cat(&steps.iter().map(|s| &s[l]).collect::<Vec<_>>(), 2))
            .collect::<candle_core::Result<_>>()?;
        Ok(Greedy { tokens, cross_weights })
    }
}
