//! The Transformer encoder: [`EncoderLayer`] (PyTorch `nn.TransformerEncoderLayer`:
//! self-attention and feed-forward, each in a residual block with LayerNorm; batch first by
//! default, sequence first or unbatched as configured) and the stack [`TransformerEncoder`]
//! (`nn.TransformerEncoder`: `layers.{i}` and an optional final `norm`).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::attention_kind::LayerAttention;
use crate::dropout::{Dropout, Mode};
use crate::error::Result;
use crate::feedforward::FeedForward;
use crate::layer::{norm_packed, residual, stack, LayerConfig, LayerOutput};
use crate::layout::{Layout, SeqInputs};
use crate::masks::AttnMasks;
use crate::norm::LayerNorm;
use crate::packed::Packed;
use crate::run::Run;

/// One encoder layer. Weights: `self_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*`
/// (no `*.bias`, `self_attn.in_proj_bias` or `self_attn.out_proj.bias` without `cfg.bias`).
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
    self_attn: LayerAttention,
    ff: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    dropout1: Dropout,
    dropout2: Dropout,
    norm_first: bool,
    inputs: SeqInputs,
}

impl EncoderLayer {
    /// Loads (or creates) the layer's weights under `vb`.
    pub fn new(cfg: &LayerConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            self_attn: cfg.self_attention(vb.pp("self_attn"))?,
            ff: FeedForward::new(&cfg.feedforward(), vb.clone())?,
            norm1: cfg.norm(&vb, "norm1")?,
            norm2: cfg.norm(&vb, "norm2")?,
            dropout1: cfg.dropout(&vb, "dropout1"),
            dropout2: cfg.dropout(&vb, "dropout2"),
            norm_first: cfg.norm_first,
            inputs: cfg.inputs("EncoderLayer", &vb),
        })
    }

    /// `src: [B, L, d_model]` (`[L, B, d_model]` with `batch_first` off, `[L, d_model]`
    /// unbatched) with `masks` over its keys (padding, attention mask, causal) → the same shape
    /// and, when asked, the self-attention weights.
    pub fn forward(&self, src: &Tensor, masks: &AttnMasks, run: Run) -> Result<LayerOutput> {
        let layout = self.inputs.layout("src", src)?;
        self.forward_bld(&layout.to_bld(src)?, masks, run)?.in_layout(layout)
    }

    /// [`Self::forward`] on `src: [B, L, d_model]`.
    fn forward_bld(&self, src: &Tensor, masks: &AttnMasks, run: Run) -> Result<LayerOutput> {
        let (x, self_weights) = residual(src, &self.norm1, &self.dropout1, self.norm_first, run.mode, |x| {
            self.self_attn.forward(x, masks, run, None)
        })?;
        Ok(LayerOutput { out: self.feed_forward(&x, run.mode)?, self_weights, cross_weights: None })
    }

    /// Packed `src: [total, d_model]` → `[total, d_model]` cut alike: self-attention within each
    /// sequence (`causal` within each), nothing to mask. Equal to [`Self::forward`] on the padded
    /// batch with key padding, at the real rows.
    pub fn forward_packed(&self, src: &Packed, causal: bool, mode: Mode) -> Result<Packed> {
        let i = &self.inputs;
        src.expect_rows(i.module, "src", i.width, i.dtype)?;
        let (x, _) = residual(src.data(), &self.norm1, &self.dropout1, self.norm_first, mode, |x| {
            let o = self.self_attn.forward_packed(&src.with_data(x.clone())?, causal, mode)?;
            Ok((o.data().clone(), None))
        })?;
        src.with_data(self.feed_forward(&x, mode)?)
    }

    /// The second residual block, around the feed-forward block.
    fn feed_forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (out, _) =
            residual(x, &self.norm2, &self.dropout2, self.norm_first, mode, |x| Ok((self.ff.forward(x, mode)?, None)))?;
        Ok(out)
    }
}

/// What a stack returns: the output and each layer's weights when asked.
#[derive(Debug, Clone)]
pub struct StackOutput {
    /// `[B, L, d_model]`, laid out like the input.
    pub out: Tensor,
    /// Per layer, the self-attention weights (empty unless asked; batch first, without `B` for an
    /// unbatched input).
    pub self_weights: Vec<Tensor>,
    /// Per layer, the cross-attention weights (decoders; empty unless asked).
    pub cross_weights: Vec<Tensor>,
}

impl StackOutput {
    pub(crate) fn new(out: Tensor) -> Self {
        Self { out, self_weights: Vec::new(), cross_weights: Vec::new() }
    }

    /// A batch-first output put back in `layout`.
    pub(crate) fn in_layout(self, layout: Layout) -> Result<Self> {
        let each = |ws: Vec<Tensor>| -> Result<Vec<Tensor>> { ws.into_iter().map(|w| layout.weight(w)).collect() };
        Ok(Self {
            out: layout.restore(self.out)?,
            self_weights: each(self.self_weights)?,
            cross_weights: each(self.cross_weights)?,
        })
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
    inputs: SeqInputs,
}

impl TransformerEncoder {
    /// Loads `layers.{0..num_layers}.*` and, when `final_norm`, `norm.*` under `vb`.
    pub fn new(cfg: &LayerConfig, num_layers: usize, final_norm: bool, vb: VarBuilder) -> Result<Self> {
        let (layers, norm) = stack(cfg, num_layers, final_norm, &vb, EncoderLayer::new)?;
        Ok(Self { layers, norm, inputs: cfg.inputs("TransformerEncoder", &vb) })
    }

    /// `src: [B, L, d_model]` (`[L, B, d_model]` with `batch_first` off, `[L, d_model]`
    /// unbatched) → the same shape and the layers' weights when asked.
    pub fn forward(&self, src: &Tensor, masks: &AttnMasks, run: Run) -> Result<StackOutput> {
        let layout = self.inputs.layout("src", src)?;
        let mut acc = StackOutput::new(layout.to_bld(src)?);
        for layer in &self.layers {
            let o = layer.forward_bld(&acc.out, masks, run)?;
            acc.push(o);
        }
        if let Some(norm) = &self.norm {
            acc.out = norm.forward(&acc.out)?;
        }
        acc.in_layout(layout)
    }

    /// Packed `src: [total, d_model]` → `[total, d_model]` through every layer
    /// ([`EncoderLayer::forward_packed`]) and the final norm.
    pub fn forward_packed(&self, src: &Packed, causal: bool, mode: Mode) -> Result<Packed> {
        let mut x = src.clone();
        for layer in &self.layers {
            x = layer.forward_packed(&x, causal, mode)?;
        }
        norm_packed(self.norm.as_ref(), x)
    }
}
