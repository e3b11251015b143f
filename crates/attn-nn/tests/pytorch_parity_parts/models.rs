//! The attn-nn side of each fixture kind: [`build`] makes the module a fixture's `module` metadata
//! names from its `config` (with a given attention kernel), and [`Model::forward`] runs it on the
//! fixture's [`Inputs`] the way the PyTorch script ran its counterpart (eval mode, same masks);
//! [`Model::forward_packed`] runs it on the real rows of the inputs packed (fixtures of
//! `scripts/gen_packed_fixtures.py`, which give each input's `lengths.<name>`).

use std::collections::BTreeMap;
use std::fmt::Display;

use attn::{Kernel, Mask};
use attn_nn::{
    Activation, AdditiveAttention, AdditiveAttentionConfig, AttnMask, AttnMasks, DecoderLayer, EncoderLayer,
    LayerConfig, LayerNorm, LayerNormConfig, MhaInput, Mode, MultiHeadAttention, MultiHeadAttentionConfig, NeedWeights,
    Packed, PackedMhaInput, RopeConfig, Run, SelfAttention, SelfAttentionConfig, Seq2Seq, Seq2SeqConfig, Seq2SeqMasks,
    Transformer, TransformerConfig,
};
use candle_core::{Device, Tensor, Var};
use candle_nn::VarBuilder;

use super::fixture::{Config, Data, Fixture};

/// Formats any error as the harness's `String` error.
pub fn err(e: impl Display) -> String {
    e.to_string()
}

/// A fixture's inputs as the modules take them: float inputs as tracked `f32` [`Var`]s (their
/// gradients are checked), token ids as `U32`, masks with their stored polarity.
#[derive(Debug)]
pub struct Inputs {
    case: String,
    floats: BTreeMap<String, Var>,
    ids: BTreeMap<String, Tensor>,
    masks: BTreeMap<String, AttnMask>,
    /// Real rows per sequence of each input (packed fixtures only).
    lengths: BTreeMap<String, Vec<usize>>,
}

impl Inputs {
    /// Every `input.*` and `mask.*` tensor of `fx`.
    pub fn from_fixture(fx: &Fixture) -> Result<Self, String> {
        let cpu = &Device::Cpu;
        let mut floats = BTreeMap::new();
        let mut ids = BTreeMap::new();
        for (name, t) in fx.with_prefix("input.") {
            match &t.data {
                Data::F64(_) => {
                    let x = fx.f32_tensor(&format!("input.{name}"))?;
                    floats.insert(name.to_string(), Var::from_tensor(&x).map_err(err)?);
                }
                Data::I64(v) => {
                    let v: Vec<u32> = v.iter().map(|&i| i as u32).collect();
                    ids.insert(name.to_string(), Tensor::from_vec(v, t.shape.as_slice(), cpu).map_err(err)?);
                }
                Data::Bool(_) => return Err(format!("{}: input `{name}` is boolean", fx.name)),
            }
        }
        let mut masks = BTreeMap::new();
        for (name, t) in fx.with_prefix("mask.") {
            let mask = match &t.data {
                Data::F64(_) => AttnMask::Additive(fx.f32_tensor(&format!("mask.{name}"))?),
                Data::Bool(v) => {
                    let v: Vec<u8> = v.iter().map(|&b| u8::from(b)).collect();
                    let tensor = Tensor::from_vec(v, t.shape.as_slice(), cpu).map_err(err)?;
                    match fx.polarity.get(name).map(String::as_str) {
                        Some("block") => AttnMask::Bool(Mask::block(tensor)),
                        Some("keep") => AttnMask::Bool(Mask::keep(tensor)),
                        other => return Err(format!("{}: mask `{name}` has polarity {other:?}", fx.name)),
                    }
                }
                Data::I64(_) => return Err(format!("{}: mask `{name}` holds integers", fx.name)),
            };
            masks.insert(name.to_string(), mask);
        }
        let mut lengths = BTreeMap::new();
        for (name, t) in fx.with_prefix("lengths.") {
            let Data::I64(v) = &t.data else { return Err(format!("{}: `lengths.{name}` is not I64", fx.name)) };
            lengths.insert(name.to_string(), v.iter().map(|&n| n as usize).collect());
        }
        Ok(Self { case: fx.name.clone(), floats, ids, masks, lengths })
    }

    /// The tracked float inputs by name.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.floats.iter().map(|(n, v)| (n.as_str(), v))
    }

    fn opt_float(&self, name: &str) -> Option<&Tensor> {
        self.floats.get(name).map(Var::as_tensor)
    }

    fn float(&self, name: &str) -> Result<&Tensor, String> {
        self.opt_float(name).ok_or_else(|| format!("{}: float input `{name}` missing", self.case))
    }

    fn ids(&self, name: &str) -> Result<&Tensor, String> {
        self.ids.get(name).ok_or_else(|| format!("{}: token ids `{name}` missing", self.case))
    }

    /// The input `name` (float or ids) `[B, L, ..]` as a packed batch of its first
    /// `lengths.<name>` rows per sequence (differentiable back to the padded input), and `L`.
    fn packed(&self, name: &str) -> Result<(Packed, usize), String> {
        let t = match self.opt_float(name) {
            Some(t) => t,
            None => self.ids(name)?,
        };
        let lengths = self.lengths.get(name).ok_or_else(|| format!("{}: `lengths.{name}` missing", self.case))?;
        Ok((Packed::from_padded(t, lengths).map_err(err)?, t.dim(1).map_err(err)?))
    }

    /// The masks of one attention call from the fixture's `padding` and `attn` masks (each may be
    /// absent, boolean or additive) and the causal flag.
    fn attn_masks(&self, padding: &str, attn: &str, causal: bool) -> Result<AttnMasks, String> {
        Ok(AttnMasks { key_padding: self.masks.get(padding).cloned(), attn: self.masks.get(attn).cloned(), causal })
    }
}

/// What a module returns: `out` (its gradient is taken) and the attention weights when asked.
#[derive(Debug)]
pub struct Outputs {
    /// The output compared with the fixture's `out`.
    pub out: Tensor,
    /// Compared with the fixture's `weights`.
    pub weights: Option<Tensor>,
}

/// One module of a fixture kind, built and ready to run.
pub trait Model {
    /// Runs the module on the fixture's inputs in eval mode.
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String>;

    /// Runs the module's `forward_packed` on the real rows of the inputs in eval mode; the output
    /// padded back to the padded query's `[B, L, ..]` with zeros.
    fn forward_packed(&self, _inputs: &Inputs) -> Result<Outputs, String> {
        Err("this module kind has no packed form".into())
    }
}

/// A packed output `[total, ..]` as the padded `[B, len, ..]` [`Outputs`].
fn padded(out: Packed, len: usize) -> Result<Outputs, String> {
    Ok(Outputs { out: out.to_padded(len).map_err(err)?, weights: None })
}

/// Builds the module `fx.kind` from `fx.config` with attention `kernel`, its weights under `vb`.
pub fn build(fx: &Fixture, kernel: Kernel, vb: VarBuilder) -> Result<Box<dyn Model>, String> {
    let c = &fx.config;
    Ok(match fx.kind.as_str() {
        "mha" => Box::new(Mha::new(c, kernel, vb)?),
        "encoder_layer" => {
            Box::new(Encoder(EncoderLayer::new(&layer_config(c, kernel)?, vb).map_err(err)?, c.flag("src_is_causal")?))
        }
        "decoder_layer" => {
            Box::new(Decoder(DecoderLayer::new(&layer_config(c, kernel)?, vb).map_err(err)?, c.flag("tgt_is_causal")?))
        }
        "transformer" => Box::new(Stack(
            Transformer::new(&transformer_config(c, kernel)?, vb).map_err(err)?,
            c.flag("tgt_is_causal")?,
        )),
        "seq2seq" => {
            let cfg = Seq2SeqConfig {
                src_vocab: c.usize("src_vocab")?,
                tgt_vocab: c.usize("tgt_vocab")?,
                pad_id: c.usize("pad_id")? as u32,
                max_len: c.usize("max_len")?,
                transformer: transformer_config(c, kernel)?,
            };
            Box::new(Seq2Seq::new(cfg, vb).map_err(err)?)
        }
        "self_attention" => {
            let cfg = SelfAttentionConfig {
                bias: c.flag("bias")?,
                kernel,
                ..SelfAttentionConfig::new(c.usize("d_model")?, c.usize("d_k")?, c.usize("d_v")?)
            };
            Box::new(Single(SelfAttention::new(cfg, vb).map_err(err)?, c.flag("need_weights")?))
        }
        "additive" => {
            let cfg = AdditiveAttentionConfig::new(c.usize("query_dim")?, c.usize("key_dim")?, c.usize("hidden")?);
            Box::new(AdditiveAttention::new(cfg, vb).map_err(err)?)
        }
        "layer_norm" => {
            let cfg = LayerNormConfig {
                elementwise_affine: c.flag("elementwise_affine")?,
                bias: c.flag("bias")?,
                ..LayerNormConfig::new(c.f64("eps")?)
            };
            Box::new(LayerNorm::with_config(c.usize("dim")?, cfg, vb).map_err(err)?)
        }
        other => return Err(format!("{}: unknown module kind `{other}`", fx.name)),
    })
}

/// PyTorch's `TransformerEncoderLayer`/`TransformerDecoderLayer` arguments, dropout 0.
fn layer_config(c: &Config, kernel: Kernel) -> Result<LayerConfig, String> {
    let activation = match c.str("activation")? {
        "relu" => Activation::Relu,
        "gelu" => Activation::Gelu,
        other => return Err(format!("activation `{other}` is not relu or gelu")),
    };
    Ok(LayerConfig {
        dim_feedforward: c.usize("dim_feedforward")?,
        dropout: 0.0,
        activation,
        layer_norm_eps: c.f64("layer_norm_eps")?,
        norm_first: c.flag("norm_first")?,
        bias: c.flag_or("bias", true)?,
        batch_first: c.flag_or("batch_first", true)?,
        kernel,
        ..LayerConfig::new(c.usize("d_model")?, c.usize("nhead")?)
    })
}

fn transformer_config(c: &Config, kernel: Kernel) -> Result<TransformerConfig, String> {
    Ok(TransformerConfig {
        layer: layer_config(c, kernel)?,
        num_encoder_layers: c.usize("num_encoder_layers")?,
        num_decoder_layers: c.usize("num_decoder_layers")?,
    })
}

/// `nn.MultiheadAttention` (or the grouped-query reference): self-attention on input `x`, else
/// `query`/`key`/`value`.
struct Mha {
    m: MultiHeadAttention,
    need_weights: Option<NeedWeights>,
    causal: bool,
}

impl Mha {
    fn new(c: &Config, kernel: Kernel, vb: VarBuilder) -> Result<Self, String> {
        let cfg = MultiHeadAttentionConfig {
            num_kv_heads: c.opt_usize("num_kv_heads")?,
            kdim: c.opt_usize("kdim")?,
            vdim: c.opt_usize("vdim")?,
            bias: c.flag("bias")?,
            add_bias_kv: c.flag("add_bias_kv")?,
            add_zero_attn: c.flag("add_zero_attn")?,
            batch_first: c.flag_or("batch_first", true)?,
            rope: c.opt_f64("rope")?.map(|base| RopeConfig { base }),
            sinks: c.flag("sinks")?,
            kernel,
            ..MultiHeadAttentionConfig::new(c.usize("embed_dim")?, c.usize("num_heads")?)
        };
        let need_weights = match c.opt_str("need_weights")? {
            None => None,
            Some("averaged") => Some(NeedWeights::Averaged),
            Some("per_head") => Some(NeedWeights::PerHead),
            Some(other) => return Err(format!("need_weights `{other}` is not averaged or per_head")),
        };
        Ok(Self { m: MultiHeadAttention::new(cfg, vb).map_err(err)?, need_weights, causal: c.flag("causal")? })
    }
}

impl Model for Mha {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let input = match inputs.opt_float("x") {
            Some(x) => MhaInput::self_attention(x),
            None => MhaInput::new(inputs.float("query")?, inputs.float("key")?, inputs.float("value")?),
        };
        let mut input = input.masks(inputs.attn_masks("key_padding_mask", "attn_mask", self.causal)?);
        input.need_weights = self.need_weights;
        let o = self.m.forward(input).map_err(err)?;
        Ok(Outputs { out: o.out, weights: o.weights })
    }

    fn forward_packed(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let ((q, len), kv) = match inputs.opt_float("x") {
            Some(_) => (inputs.packed("x")?, None),
            None => (inputs.packed("query")?, Some((inputs.packed("key")?.0, inputs.packed("value")?.0))),
        };
        let (k, v) = kv.as_ref().map_or((&q, &q), |(k, v)| (k, v));
        let input = PackedMhaInput { causal: self.causal, ..PackedMhaInput::new(&q, k, v) };
        padded(self.m.forward_packed(input).map_err(err)?, len)
    }
}

/// `nn.TransformerEncoderLayer` and whether its self-attention is causal.
struct Encoder(EncoderLayer, bool);

impl Model for Encoder {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let masks = inputs.attn_masks("src_key_padding_mask", "src_mask", self.1)?;
        let o = self.0.forward(inputs.float("src")?, &masks, Run::eval()).map_err(err)?;
        Ok(Outputs { out: o.out, weights: None })
    }

    fn forward_packed(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let (src, len) = inputs.packed("src")?;
        padded(self.0.forward_packed(&src, self.1, Mode::Eval).map_err(err)?, len)
    }
}

/// `nn.TransformerDecoderLayer` and whether its self-attention is causal.
struct Decoder(DecoderLayer, bool);

impl Model for Decoder {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let tgt_masks = inputs.attn_masks("tgt_key_padding_mask", "tgt_mask", self.1)?;
        let memory_masks = inputs.attn_masks("memory_key_padding_mask", "memory_mask", false)?;
        let (tgt, memory) = (inputs.float("tgt")?, inputs.float("memory")?);
        let o = self.0.forward(tgt, memory, &tgt_masks, &memory_masks, Run::eval(), None).map_err(err)?;
        Ok(Outputs { out: o.out, weights: None })
    }

    fn forward_packed(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let ((tgt, len), (memory, _)) = (inputs.packed("tgt")?, inputs.packed("memory")?);
        padded(self.0.forward_packed(&tgt, &memory, self.1, Mode::Eval).map_err(err)?, len)
    }
}

/// `nn.Transformer` and whether the target self-attention is causal.
struct Stack(Transformer, bool);

impl Model for Stack {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let masks = Seq2SeqMasks {
            src: inputs.attn_masks("src_key_padding_mask", "src_mask", false)?,
            tgt: inputs.attn_masks("tgt_key_padding_mask", "tgt_mask", self.1)?,
            memory: inputs.attn_masks("memory_key_padding_mask", "memory_mask", false)?,
        };
        let o = self.0.forward(inputs.float("src")?, inputs.float("tgt")?, &masks, Run::eval()).map_err(err)?;
        Ok(Outputs { out: o.out, weights: None })
    }

    fn forward_packed(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let ((src, _), (tgt, len)) = (inputs.packed("src")?, inputs.packed("tgt")?);
        padded(self.0.forward_packed(&src, &tgt, self.1, Mode::Eval).map_err(err)?, len)
    }
}

impl Model for Seq2Seq {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let o = Seq2Seq::forward(self, inputs.ids("src")?, inputs.ids("tgt")?, Run::eval()).map_err(err)?;
        Ok(Outputs { out: o.out, weights: None })
    }

    fn forward_packed(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let ((src, _), (tgt, len)) = (inputs.packed("src")?, inputs.packed("tgt")?);
        padded(Seq2Seq::forward_packed(self, &src, &tgt, Mode::Eval).map_err(err)?, len)
    }
}

/// Single-head `SelfAttention` and whether the weights are asked for.
struct Single(SelfAttention, bool);

impl Model for Single {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let masks = inputs.attn_masks("key_padding_mask", "attn_mask", false)?;
        let o = self.0.forward(inputs.float("x")?, &masks, self.1).map_err(err)?;
        Ok(Outputs { out: o.out, weights: o.weights })
    }
}

impl Model for AdditiveAttention {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        let masks = inputs.attn_masks("key_padding_mask", "attn_mask", false)?;
        let (q, k, v) = (inputs.float("query")?, inputs.float("key")?, inputs.float("value")?);
        let o = AdditiveAttention::forward(self, q, k, v, &masks, Mode::Eval).map_err(err)?;
        Ok(Outputs { out: o.out, weights: Some(o.weights) })
    }
}

impl Model for LayerNorm {
    fn forward(&self, inputs: &Inputs) -> Result<Outputs, String> {
        Ok(Outputs { out: LayerNorm::forward(self, inputs.float("x")?).map_err(err)?, weights: None })
    }
}

/// The fixture's parameters as `f32` tensors by PyTorch name (a state dict in memory).
pub fn param_tensors(fx: &Fixture) -> Result<BTreeMap<String, Tensor>, String> {
    fx.with_prefix("param.").map(|(name, _)| Ok((name.to_string(), fx.f32_tensor(&format!("param.{name}"))?))).collect()
}
