//! Which attention the Transformer layers' self-attention runs ([`AttentionKind`]: softmax, the
//! default, or linear with a feature map) and the built module of either kind with its cache.
//! Both kinds have the same weights (`self_attn.in_proj_weight`, ...), so a state dict loads into
//! either. Cross-attention (the decoder's `multihead_attn`) stays softmax whatever the kind: it
//! reads a source of bounded length once per target position, and its weights are the alignment
//! that `attn translate` and the explain plots show.

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::dropout::Mode;
use crate::error::{NnError, Result};
use crate::kv_cache::{Cache, KvCache};
use crate::linear_attn::{LinearAttention, LinearCache, LinearInput, LinearMap};
use crate::masks::AttnMasks;
use crate::mha::{MhaInput, MultiHeadAttention, PackedMhaInput};
use crate::packed::Packed;
use crate::run::Run;

/// The kind of a layer's self-attention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttentionKind {
    /// Softmax attention ([`MultiHeadAttention`]), PyTorch's.
    #[default]
    Softmax,
    /// Linear attention ([`LinearAttention`]) with this feature map: no attention weights are
    /// returned, packed batches are refused, decoding goes through the recurrent state.
    Linear(LinearMap),
}

/// The self-attention caches of one decoder layer: the KV cache of softmax attention and the
/// recurrent state of linear attention (only the layer's kind is used).
#[derive(Debug)]
pub(crate) struct SelfCache<'a> {
    pub kv: &'a mut KvCache,
    pub linear: &'a mut LinearCache,
}

/// A layer's self-attention, of either kind.
#[derive(Debug)]
pub(crate) enum LayerAttention {
    Softmax(MultiHeadAttention),
    Linear(LinearAttention),
}

impl LayerAttention {
    /// Self-attention of `x: [B, L, E]` under `masks` → `[B, L, E]` and, for softmax when asked,
    /// the weights; through `cache` when decoding.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        masks: &AttnMasks,
        run: Run,
        cache: Option<SelfCache>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let o = match self {
            LayerAttention::Softmax(mha) => {
                let mut input = MhaInput::self_attention(x).masks(masks.clone()).mode(run.mode);
                input.need_weights = run.need_weights;
                input.cache = cache.map(|c| Cache::SelfAttn(c.kv));
                mha.forward(input)?
            }
            LayerAttention::Linear(lin) => {
                let mut input = LinearInput::self_attention(x).masks(masks.clone());
                input.cache = cache.map(|c| c.linear);
                lin.forward(input)?
            }
        };
        Ok((o.out, o.weights))
    }

    /// Packed self-attention (softmax only) of `x` within each sequence.
    pub(crate) fn forward_packed(&self, x: &Packed, causal: bool, mode: Mode) -> Result<Packed> {
        match self {
            LayerAttention::Softmax(mha) => {
                mha.forward_packed(PackedMhaInput::self_attention(x).causal(causal).mode(mode))
            }
            LayerAttention::Linear(lin) => Err(NnError::Config {
                module: "LinearAttention",
                field: "attention",
                reason: format!(
                    "linear ({}) self-attention takes padded batches only, not packed ones",
                    lin.config().map.name()
                ),
            }),
        }
    }
}

/// Builds the self-attention of `kind` under `vb` from softmax's configuration `mha` (heads,
/// bias, layout, seed carry over).
pub(crate) fn build(
    kind: AttentionKind,
    mha: crate::mha::MultiHeadAttentionConfig,
    vb: VarBuilder,
) -> Result<LayerAttention> {
    Ok(match kind {
        AttentionKind::Softmax => LayerAttention::Softmax(MultiHeadAttention::new(mha, vb)?),
        AttentionKind::Linear(map) => {
            let cfg = crate::linear_attn::LinearAttentionConfig {
                num_kv_heads: mha.num_kv_heads,
                bias: mha.bias,
                batch_first: mha.batch_first,
                seed: mha.seed,
                ..crate::linear_attn::LinearAttentionConfig::new(mha.embed_dim, mha.num_heads, map)
            };
            LayerAttention::Linear(LinearAttention::new(cfg, vb)?)
        }
    })
}
