//! The Transformer encoder: [`EncoderLayer`] (PyTorch `nn.TransformerEncoderLayer`, batch first:
//! self-attention and feed-forward, each in a residual block with LayerNorm) and the stack
//! [`TransformerEncoder`] (`nn.TransformerEncoder`: `layers.{i}` and an optional final `norm`).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::dropout::Dropout;
use crate::error::{expect_bld, Result};
use crate::feedforward::FeedForward;
use crate::layer::{residual, stack, LayerConfig, LayerOutput, Run};
use crate::masks::AttnMasks;
use crate::mha::{MhaInput, MultiHeadAttention};
use crate::norm::LayerNorm;

/// One encoder layer. Weights: `self_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*`.
///
/// ```
/// use attn_nn::{AttnMasks, EncoderLayer, LayerConfig, NeedWeights, Run};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let cfg = LayerConfig { dim_feedforward: 64, norm_first: true, ..LayerConfig::new(16, 4) };
/// let layer = EncoderLayer::new(&cfg, attn_nn::init::seeded(&map, 0))?;
/// let src = attn::random::uniform(&[2, 6, 16], -1.0, 1.0, 1)?; // [B, L, d_model]
/// let o = layer.forward(&src, &AttnMasks::default(), Run::eval().with_weights(NeedWeights::PerHead))?;
/// assert_eq!(o.out.dims(), [2, 6, 16]);
/// assert_eq!(o.self_weights.unwrap().dims(), [2, 4, 6, 6]); // [B, H, L, L]
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EncoderLayer {
    self_attn: MultiHeadAttention,
    ff: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    dropout1: Dropout,
    dropout2: Dropout,
    norm_first: bool,
}

impl EncoderLayer {
    /// Loads (or creates) the layer's weights under `vb`.
    pub fn new(cfg: &LayerConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            self_attn: cfg.attention(vb.pp("self_attn"))?,
            ff: FeedForward::new(cfg.d_model, cfg.dim_feedforward, cfg.activation, cfg.dropout, cfg.seed, vb.clone())?,
            norm1: cfg.norm(&vb, "norm1")?,
            norm2: cfg.norm(&vb, "norm2")?,
            dropout1: cfg.dropout(&vb, "dropout1"),
            dropout2: cfg.dropout(&vb, "dropout2"),
            norm_first: cfg.norm_first,
        })
    }

    /// `src: [B, L, d_model]` with `masks` over its keys (padding, attention mask, causal) →
    /// `[B, L, d_model]` and, when asked, the self-attention weights.
    pub fn forward(&self, src: &Tensor, masks: &AttnMasks, run: Run) -> Result<LayerOutput> {
        expect_bld("EncoderLayer", "src", src, self.self_attn.config().embed_dim)?;
        let (x, self_weights) = residual(src, &self.norm1, &self.dropout1, self.norm_first, run.mode, |x| {
            let mut input = MhaInput::self_attention(x).masks(masks.clone()).mode(run.mode);
            input.need_weights = run.need_weights;
            let o = self.self_attn.forward(input)?;
            Ok((o.out, o.weights))
        })?;
        let (out, _) = residual(&x, &self.norm2, &self.dropout2, self.norm_first, run.mode, |x| {
            Ok((self.ff.forward(x, run.mode)?, None))
        })?;
        Ok(LayerOutput { out, self_weights, cross_weights: None })
    }
}

/// What a stack returns: the output and each layer's weights when asked.
#[derive(Debug, Clone)]
pub struct StackOutput {
    /// `[B, L, d_model]`.
    pub out: Tensor,
    /// Per layer, the self-attention weights (empty unless asked).
    pub self_weights: Vec<Tensor>,
    /// Per layer, the cross-attention weights (decoders; empty unless asked).
    pub cross_weights: Vec<Tensor>,
}

impl StackOutput {
    pub(crate) fn new(out: Tensor) -> Self {
        Self { out, self_weights: Vec::new(), cross_weights: Vec::new() }
    }

    /// Replaces the output by layer `o`'s and keeps its weights.
    pub(crate) fn push(&mut self, o: LayerOutput) {
        self.out = o.out;
        self.self_weights.extend(o.self_weights);
        self.cross_weights.extend(o.cross_weights);
    }
}

/// `num_layers` encoder layers and, when `final_norm`, a last LayerNorm (`norm.*`; PyTorch's
/// `nn.Transformer` always has one).
#[derive(Debug)]
pub struct TransformerEncoder {
    layers: Vec<EncoderLayer>,
    norm: Option<LayerNorm>,
}

impl TransformerEncoder {
    /// Loads `layers.{0..num_layers}.*` and, when `final_norm`, `norm.*` under `vb`.
    pub fn new(cfg: &LayerConfig, num_layers: usize, final_norm: bool, vb: VarBuilder) -> Result<Self> {
        let (layers, norm) = stack(cfg, num_layers, final_norm, &vb, EncoderLayer::new)?;
        Ok(Self { layers, norm })
    }

    /// `src: [B, L, d_model]` → `[B, L, d_model]` and the layers' weights when asked.
    pub fn forward(&self, src: &Tensor, masks: &AttnMasks, run: Run) -> Result<StackOutput> {
        let mut acc = StackOutput::new(src.clone());
        for layer in &self.layers {
            let o = layer.forward(&acc.out, masks, run)?;
            acc.push(o);
        }
        if let Some(norm) = &self.norm {
            acc.out = norm.forward(&acc.out)?;
        }
        Ok(acc)
    }
}
