//! What the Transformer layers share: their configuration (PyTorch's `TransformerEncoderLayer` /
//! `TransformerDecoderLayer` arguments) and what a layer returns ([`LayerOutput`]: the output and,
//! when asked, its attention weights); how a call runs is [`Run`](crate::Run).

use attn::{Kernel, Precision};
use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::attention_kind::{self, AttentionKind, LayerAttention};
use crate::dropout::{Dropout, Mode};
use crate::error::Result;
use crate::feedforward::{Activation, FeedForwardConfig};
use crate::layout::{Layout, SeqInputs};
use crate::mha::{MultiHeadAttention, MultiHeadAttentionConfig};
use crate::norm::{LayerNorm, LayerNormConfig};
use crate::packed::Packed;

/// Configuration of one encoder or decoder layer (PyTorch's defaults).
#[derive(Debug, Clone)]
pub struct LayerConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub nhead: usize,
    /// Hidden width of the feed-forward block (2048).
    pub dim_feedforward: usize,
    /// Dropout after attention, inside and after the feed-forward block, and on attention
    /// weights (0.1).
    pub dropout: f32,
    /// Feed-forward activation (ReLU).
    pub activation: Activation,
    /// LayerNorm epsilon (1e-5).
    pub layer_norm_eps: f64,
    /// Pre-norm (`x + f(norm(x))`) instead of post-norm (`norm(x + f(x))`, the default).
    pub norm_first: bool,
    /// Biases in the attention projections, the feed-forward block and the LayerNorms (PyTorch's
    /// `bias`, default true).
    pub bias: bool,
    /// Inputs `[B, L, d_model]` (`true`, this crate's default) or `[L, B, d_model]` (PyTorch's
    /// default, `batch_first=False`); unbatched `[L, d_model]` inputs are taken either way.
    pub batch_first: bool,
    /// The attention kernel.
    pub kernel: Kernel,
    /// How the flash kernel computes its products (see `MultiHeadAttentionConfig::compute`).
    pub compute: Precision,
    /// Seed of the dropout streams (and of FAVOR+'s projections).
    pub seed: u64,
    /// The self-attention's kind (softmax by default; cross-attention is always softmax).
    pub attention: AttentionKind,
}

impl LayerConfig {
    /// The configuration of its feed-forward block.
    pub fn feedforward(&self) -> FeedForwardConfig {
        FeedForwardConfig {
            d_model: self.d_model,
            dim_feedforward: self.dim_feedforward,
            activation: self.activation,
            dropout: self.dropout,
            bias: self.bias,
            seed: self.seed,
        }
    }

    /// PyTorch's defaults for `d_model` and `nhead`, except batch first.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        Self {
            d_model,
            nhead,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            bias: true,
            batch_first: true,
            kernel: Kernel::Auto,
            compute: Precision::F32,
            seed: 0,
            attention: AttentionKind::Softmax,
        }
    }

    /// Softmax attention's configuration in a layer.
    fn mha_config(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig {
            bias: self.bias,
            dropout: self.dropout,
            kernel: self.kernel,
            compute: self.compute,
            seed: self.seed,
            ..MultiHeadAttentionConfig::new(self.d_model, self.nhead)
        }
    }

    /// The self-attention of a layer, of the configured kind; `vb` is where its weights live.
    pub(crate) fn self_attention(&self, vb: VarBuilder) -> Result<LayerAttention> {
        attention_kind::build(self.attention, self.mha_config(), vb)
    }

    /// The (softmax) cross-attention of a decoder layer.
    pub(crate) fn cross_attention(&self, vb: VarBuilder) -> Result<MultiHeadAttention> {
        MultiHeadAttention::new(self.mha_config(), vb)
    }

    /// LayerNorm `name` under `vb`.
    pub(crate) fn norm(&self, vb: &VarBuilder, name: &str) -> Result<LayerNorm> {
        let cfg = LayerNormConfig { bias: self.bias, ..LayerNormConfig::new(self.layer_norm_eps) };
        LayerNorm::with_config(self.d_model, cfg, vb.pp(name))
    }

    /// What the inputs of `module` built from this config over `vb` must be.
    pub(crate) fn inputs(&self, module: &'static str, vb: &VarBuilder) -> SeqInputs {
        SeqInputs { module, width: self.d_model, dtype: vb.dtype(), batch_first: self.batch_first }
    }

    /// Dropout `name` of the layer at `vb`.
    pub(crate) fn dropout(&self, vb: &VarBuilder, name: &str) -> Dropout {
        Dropout::new(self.dropout, self.seed, &format!("{}.{name}", vb.prefix()))
    }
}

/// The layers `layers.{0..num_layers}` under `vb`, built by `layer`, and, when `final_norm`, the
/// LayerNorm `norm` after them: the weights of PyTorch's `nn.TransformerEncoder` / `Decoder`.
pub(crate) fn stack<L>(
    cfg: &LayerConfig,
    num_layers: usize,
    final_norm: bool,
    vb: &VarBuilder,
    layer: impl Fn(&LayerConfig, VarBuilder) -> Result<L>,
) -> Result<(Vec<L>, Option<LayerNorm>)> {
    let layers = (0..num_layers).map(|i| layer(cfg, vb.pp(format!("layers.{i}")))).collect::<Result<_>>()?;
    let norm = if final_norm { Some(cfg.norm(vb, "norm")?) } else { None };
    Ok((layers, norm))
}

/// A stack's packed output `x` through its final LayerNorm, when it has one.
pub(crate) fn norm_packed(norm: Option<&LayerNorm>, x: Packed) -> Result<Packed> {
    match norm {
        Some(norm) => x.with_data(norm.forward(x.data())?),
        None => Ok(x),
    }
}

/// What a layer returns.
#[derive(Debug, Clone)]
pub struct LayerOutput {
    /// `[B, L, d_model]`, laid out like the input.
    pub out: Tensor,
    /// Self-attention weights `[B, H, L, Lk]` (or head-averaged `[B, L, Lk]`) when asked, batch
    /// first (without `B` for an unbatched input).
    pub self_weights: Option<Tensor>,
    /// Cross-attention weights `[B, H, L, Ls]` (or `[B, L, Ls]`) of a decoder layer when asked.
    pub cross_weights: Option<Tensor>,
}

impl LayerOutput {
    /// A batch-first output put back in `layout`.
    pub(crate) fn in_layout(self, layout: Layout) -> Result<Self> {
        Ok(Self {
            out: layout.restore(self.out)?,
            self_weights: layout.weights(self.self_weights)?,
            cross_weights: layout.weights(self.cross_weights)?,
        })
    }
}

/// One residual sub-block: `norm(x + drop(f(x)))` post-norm, `x + drop(f(norm(x)))` pre-norm.
/// `f` returns its output and, for attention, its weights.
pub(crate) fn residual(
    x: &Tensor,
    norm: &LayerNorm,
    drop: &Dropout,
    norm_first: bool,
    mode: Mode,
    f: impl FnOnce(&Tensor) -> Result<(Tensor, Option<Tensor>)>,
) -> Result<(Tensor, Option<Tensor>)> {
    if norm_first {
        let (y, w) = f(&norm.forward(x)?)?;
        Ok(((x + drop.forward(&y, mode)?)?, w))
    } else {
        let (y, w) = f(x)?;
        Ok((norm.forward(&(x + drop.forward(&y, mode)?)?)?, w))
    }
}
