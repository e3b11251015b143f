//! The Transformer decoder: [`DecoderLayer`] (PyTorch `nn.TransformerDecoderLayer`: masked
//! self-attention, cross-attention over the encoder memory, feed-forward, each in a residual block
//! with LayerNorm; batch first by default, sequence first or unbatched as configured), the stack
//! [`TransformerDecoder`] and the per-layer caches of incremental decoding ([`DecoderCache`]).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::attention_kind::{LayerAttention, SelfCache};
use crate::dropout::{Dropout, Mode};
use crate::encoder::StackOutput;
use crate::error::Result;
use crate::feedforward::FeedForward;
use crate::kv_cache::{Cache, KvCache};
use crate::layer::{norm_packed, residual, stack, LayerConfig, LayerOutput};
use crate::layout::SeqInputs;
use crate::linear_attn::LinearCache;
use crate::masks::AttnMasks;
use crate::mha::{MhaInput, MultiHeadAttention, PackedMhaInput};
use crate::norm::LayerNorm;
use crate::packed::Packed;
use crate::run::Run;

/// The caches of one decoder layer.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    /// Keys/values of the target tokens decoded so far (softmax self-attention).
    pub self_kv: KvCache,
    /// The recurrent state of the target tokens decoded so far (linear self-attention).
    pub self_linear: LinearCache,
    /// Keys/values projected from the memory.
    pub cross_kv: KvCache,
}

impl LayerCache {
    /// How many target positions are cached, by whichever self-attention cache the layer uses.
    pub fn len(&self) -> usize {
        self.self_kv.len().max(self.self_linear.len())
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The caches of every layer of a decoder, for one batch of sequences.
#[derive(Debug, Clone, Default)]
pub struct DecoderCache {
    /// One per layer.
    pub layers: Vec<LayerCache>,
}

impl DecoderCache {
    /// Empty caches for `num_layers` layers.
    pub fn new(num_layers: usize) -> Self {
        Self { layers: vec![LayerCache::default(); num_layers] }
    }

    /// How many target positions are cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One decoder layer. Weights: `self_attn.*`, `multihead_attn.*`, `linear1.*`, `linear2.*`,
/// `norm1.*`, `norm2.*`, `norm3.*` (no biases without `cfg.bias`).
///
/// ```
/// use attn_nn::{AttnMasks, DecoderLayer, LayerConfig, NeedWeights, Run};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let layer = DecoderLayer::new(&LayerConfig { dim_feedforward: 64, ..LayerConfig::new(16, 4) }, attn_nn::init::seeded(&map, 0))?;
/// let tgt = attn::random::uniform(&[2, 3, 16], -1.0, 1.0, 1)?; // [B, Lt, d_model]
/// let memory = attn::random::uniform(&[2, 7, 16], -1.0, 1.0, 2)?; // [B, Ls, d_model]
/// let run = Run::eval().with_weights(NeedWeights::Averaged);
/// let o = layer.forward(&tgt, &memory, &AttnMasks::causal(), &AttnMasks::default(), run, None)?;
/// assert_eq!(o.out.dims(), [2, 3, 16]);
/// assert_eq!(o.cross_weights.unwrap().dims(), [2, 3, 7]); // [B, Lt, Ls]: the alignment
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DecoderLayer {
    self_attn: LayerAttention,
    multihead_attn: MultiHeadAttention,
    ff: FeedForward,
    norms: [LayerNorm; 3],
    dropouts: [Dropout; 3],
    norm_first: bool,
    inputs: SeqInputs,
}

impl DecoderLayer {
    /// Loads (or creates) the layer's weights under `vb`.
    pub fn new(cfg: &LayerConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            self_attn: cfg.self_attention(vb.pp("self_attn"))?,
            multihead_attn: cfg.cross_attention(vb.pp("multihead_attn"))?,
            ff: FeedForward::new(&cfg.feedforward(), vb.clone())?,
            norms: [cfg.norm(&vb, "norm1")?, cfg.norm(&vb, "norm2")?, cfg.norm(&vb, "norm3")?],
            dropouts: [cfg.dropout(&vb, "dropout1"), cfg.dropout(&vb, "dropout2"), cfg.dropout(&vb, "dropout3")],
            norm_first: cfg.norm_first,
            inputs: cfg.inputs("DecoderLayer", &vb),
        })
    }

    /// `tgt: [B, Lt, d_model]` (with `cache`: the new positions only), `memory: [B, Ls, d_model]`
    /// (both `[L, B, d_model]` with `batch_first` off, or unbatched `[L, d_model]`) → `tgt`'s shape
    /// and, when asked, the self- and cross-attention weights. `tgt_masks` apply to
    /// self-attention (usually causal + target padding), `memory_masks` to cross-attention
    /// (usually the source padding).
    pub fn forward(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: &AttnMasks,
        memory_masks: &AttnMasks,
        run: Run,
        cache: Option<&mut LayerCache>,
    ) -> Result<LayerOutput> {
        let layout = self.inputs.layout("tgt", tgt)?;
        let memory = self.inputs.expect(layout, "memory", memory)?;
        self.forward_bld(&layout.to_bld(tgt)?, &memory, tgt_masks, memory_masks, run, cache)?.in_layout(layout)
    }

    /// [`Self::forward`] on `tgt: [B, Lt, d_model]`, `memory: [B, Ls, d_model]`.
    fn forward_bld(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: &AttnMasks,
        memory_masks: &AttnMasks,
        run: Run,
        cache: Option<&mut LayerCache>,
    ) -> Result<LayerOutput> {
        let (self_cache, cross_cache) = match cache {
            Some(c) => (
                Some(SelfCache { kv: &mut c.self_kv, linear: &mut c.self_linear }),
                Some(Cache::Cross(&mut c.cross_kv)),
            ),
            None => (None, None),
        };
        let [n1, n2, _] = &self.norms;
        let [d1, d2, _] = &self.dropouts;
        let (x, self_weights) = residual(tgt, n1, d1, self.norm_first, run.mode, |x| {
            self.self_attn.forward(x, tgt_masks, run, self_cache)
        })?;
        let (x, cross_weights) = residual(&x, n2, d2, self.norm_first, run.mode, |x| {
            let input = MhaInput {
                masks: memory_masks.clone(),
                need_weights: run.need_weights,
                mode: run.mode,
                cache: cross_cache,
                ..MhaInput::new(x, memory, memory)
            };
            let o = self.multihead_attn.forward(input)?;
            Ok((o.out, o.weights))
        })?;
        Ok(LayerOutput { out: self.feed_forward(&x, run.mode)?, self_weights, cross_weights })
    }

    /// Packed `tgt: [total_t, d_model]` and `memory: [total_s, d_model]` (the same number of
    /// sequences) → `[total_t, d_model]` cut like `tgt`: self-attention within each target sequence
    /// (`causal` within each), cross-attention from target sequence `s` to memory sequence `s`.
    /// Equal to [`Self::forward`] on the padded batches with key padding, at the real rows.
    pub fn forward_packed(&self, tgt: &Packed, memory: &Packed, causal: bool, mode: Mode) -> Result<Packed> {
        let i = &self.inputs;
        tgt.expect_rows(i.module, "tgt", i.width, i.dtype)?;
        memory.expect_rows(i.module, "memory", i.width, i.dtype)?;
        let [n1, n2, _] = &self.norms;
        let [d1, d2, _] = &self.dropouts;
        let (x, _) = residual(tgt.data(), n1, d1, self.norm_first, mode, |x| {
            Ok((self.self_attn.forward_packed(&tgt.with_data(x.clone())?, causal, mode)?.data().clone(), None))
        })?;
        let (x, _) = residual(&x, n2, d2, self.norm_first, mode, |x| {
            let q = tgt.with_data(x.clone())?;
            let o = self
                .multihead_attn
                .forward_packed(PackedMhaInput { mode, ..PackedMhaInput::new(&q, memory, memory) })?;
            Ok((o.data().clone(), None))
        })?;
        tgt.with_data(self.feed_forward(&x, mode)?)
    }

    /// The third residual block, around the feed-forward block.
    fn feed_forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (n3, d3) = (&self.norms[2], &self.dropouts[2]);
        let (out, _) = residual(x, n3, d3, self.norm_first, mode, |x| Ok((self.ff.forward(x, mode)?, None)))?;
        Ok(out)
    }
}

/// `num_layers` decoder layers and, when `final_norm`, a last LayerNorm (`norm.*`).
#[derive(Debug)]
pub struct TransformerDecoder {
    layers: Vec<DecoderLayer>,
    norm: Option<LayerNorm>,
    inputs: SeqInputs,
}

impl TransformerDecoder {
    /// Loads `layers.{0..num_layers}.*` and, when `final_norm`, `norm.*` under `vb`.
    pub fn new(cfg: &LayerConfig, num_layers: usize, final_norm: bool, vb: VarBuilder) -> Result<Self> {
        let (layers, norm) = stack(cfg, num_layers, final_norm, &vb, DecoderLayer::new)?;
        Ok(Self { layers, norm, inputs: cfg.inputs("TransformerDecoder", &vb) })
    }

    /// How many layers (the size of a [`DecoderCache`]).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// `tgt: [B, Lt, d_model]`, `memory: [B, Ls, d_model]` (both `[L, B, d_model]` with
    /// `batch_first` off, or unbatched `[L, d_model]`) → `tgt`'s shape and the layers' weights
    /// when asked. With `cache` (from [`DecoderCache::new`]), `tgt` holds only the new positions
    /// and the caches grow.
    pub fn forward(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: &AttnMasks,
        memory_masks: &AttnMasks,
        run: Run,
        mut cache: Option<&mut DecoderCache>,
    ) -> Result<StackOutput> {
        let layout = self.inputs.layout("tgt", tgt)?;
        let memory = self.inputs.expect(layout, "memory", memory)?;
        let mut acc = StackOutput::new(layout.to_bld(tgt)?);
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().and_then(|c| c.layers.get_mut(i));
            let o = layer.forward_bld(&acc.out, &memory, tgt_masks, memory_masks, run, layer_cache)?;
            acc.push(o);
        }
        if let Some(norm) = &self.norm {
            acc.out = norm.forward(&acc.out)?;
        }
        acc.in_layout(layout)
    }

    /// Packed `tgt: [total_t, d_model]` over packed `memory: [total_s, d_model]` through every
    /// layer ([`DecoderLayer::forward_packed`]) and the final norm.
    pub fn forward_packed(&self, tgt: &Packed, memory: &Packed, causal: bool, mode: Mode) -> Result<Packed> {
        let mut x = tgt.clone();
        for layer in &self.layers {
            x = layer.forward_packed(&x, memory, causal, mode)?;
        }
        norm_packed(self.norm.as_ref(), x)
    }
}
