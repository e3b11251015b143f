//! The translator's architecture as a saved configuration: the sizes of the sequence-to-sequence
//! Transformer ([`attn_nn::Seq2Seq`]) and the kind of its self-attention ([`Attention`]) in a
//! serialisable form, checked before a model is built.

use attn_nn::{Activation, AttentionKind, LayerConfig, LinearMap, Seq2Seq, Seq2SeqConfig, TransformerConfig};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use crate::data::vocab;
use crate::error::{Result, TrainError};

/// The self-attention of the translator's layers (saved in `config.json` as `attention`, absent
/// for softmax so that softmax checkpoints read as before).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Attention {
    /// Softmax attention.
    #[default]
    Softmax,
    /// Linear attention with `elu(x) + 1`.
    LinearElu,
    /// Linear attention with ReLU.
    LinearRelu,
    /// Linear attention with FAVOR+, [`FAVOR_FEATURES`] random features per head.
    LinearFavor,
}

/// FAVOR+'s random features per head in `linear-favor`.
pub const FAVOR_FEATURES: usize = 64;

impl Attention {
    /// Whether this is softmax attention (the default, not written to `config.json`).
    pub fn is_softmax(&self) -> bool {
        *self == Attention::Softmax
    }

    /// The name `--attention` and `config.json` give it.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Softmax => "softmax",
            Attention::LinearElu => "linear-elu",
            Attention::LinearRelu => "linear-relu",
            Attention::LinearFavor => "linear-favor",
        }
    }

    /// The layers' [`AttentionKind`].
    pub fn kind(self) -> AttentionKind {
        match self {
            Attention::Softmax => AttentionKind::Softmax,
            Attention::LinearElu => AttentionKind::Linear(LinearMap::Elu),
            Attention::LinearRelu => AttentionKind::Linear(LinearMap::Relu),
            Attention::LinearFavor => AttentionKind::Linear(LinearMap::Favor { features: FAVOR_FEATURES }),
        }
    }
}

/// The model's sizes. With the `clap` feature, each field but `vocab` is a flag (`--d-model`) whose
/// help is the field's doc and whose default is [`ModelConfig::default`]'s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct ModelConfig {
    /// Model width.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().d_model))]
    pub d_model: usize,
    /// Attention heads (they divide the model width).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().heads))]
    pub heads: usize,
    /// Encoder layers and decoder layers (each).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().layers))]
    pub layers: usize,
    /// Feed-forward width.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().ff))]
    pub ff: usize,
    /// Dropout in training.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().dropout))]
    pub dropout: f32,
    /// Longest sequence in positions (characters + 1).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = ModelConfig::default().max_len))]
    pub max_len: usize,
    /// Self-attention of every layer: softmax, or linear with a feature map (`linear-favor`:
    /// FAVOR+ with 64 random features per head); cross-attention stays softmax.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = Attention::Softmax))]
    #[serde(default, skip_serializing_if = "Attention::is_softmax")]
    pub attention: Attention,
    /// Vocabulary size (one vocabulary for both sides); set from the data, so not a flag.
    #[cfg_attr(feature = "clap", arg(skip))]
    pub vocab: usize,
}

impl Default for ModelConfig {
    /// `attn train`'s defaults; `vocab` is 0 until the task sets it.
    fn default() -> Self {
        Self {
            d_model: 64,
            heads: 4,
            layers: 2,
            ff: 256,
            dropout: 0.1,
            max_len: 48,
            attention: Attention::Softmax,
            vocab: 0,
        }
    }
}

impl ModelConfig {
    /// Refuses sizes the model cannot be built with, naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::Setting { field, reason });
        for (field, value) in
            [("d_model", self.d_model), ("heads", self.heads), ("layers", self.layers), ("ff", self.ff)]
        {
            if value == 0 {
                return bad(field, "must be positive".into());
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return bad("heads", format!("{} heads must divide d_model {}", self.heads, self.d_model));
        }
        if !(self.d_model / self.heads).is_multiple_of(2) {
            return bad(
                "heads",
                format!("the head width d_model / heads = {} must be even", self.d_model / self.heads),
            );
        }
        if self.max_len < 2 {
            return bad("max_len", format!("{} positions: at least 2 are needed", self.max_len));
        }
        if self.vocab <= vocab::NUM_SPECIALS as usize {
            return bad("vocab", format!("{} ids: the data must give at least one character", self.vocab));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", format!("{} is outside [0, 1)", self.dropout));
        }
        Ok(())
    }

    /// Builds the model from `vb` (fresh variables or a checkpoint's tensors).
    pub fn build(&self, vb: VarBuilder) -> Result<Seq2Seq> {
        self.check()?;
        let layer = LayerConfig {
            dim_feedforward: self.ff,
            dropout: self.dropout,
            activation: Activation::Relu,
            attention: self.attention.kind(),
            ..LayerConfig::new(self.d_model, self.heads)
        };
        let transformer = TransformerConfig { layer, num_encoder_layers: self.layers, num_decoder_layers: self.layers };
        let cfg = Seq2SeqConfig {
            src_vocab: self.vocab,
            tgt_vocab: self.vocab,
            pad_id: vocab::PAD,
            max_len: self.max_len,
            transformer,
        };
        Ok(Seq2Seq::new(cfg, vb)?)
    }
}
