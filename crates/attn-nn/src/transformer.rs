//! PyTorch's `nn.Transformer` (batch first by default, sequence first or unbatched as configured):
//! an encoder stack and a decoder stack, each with a final LayerNorm. Weights:
//! `encoder.layers.{i}.*`, `encoder.norm.*`, `decoder.layers.{i}.*`, `decoder.norm.*` (no biases
//! without `layer.bias`, the final norms' included, as in PyTorch).

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::decoder::{DecoderCache, TransformerDecoder};
use crate::dropout::Mode;
use crate::encoder::{StackOutput, TransformerEncoder};
use crate::error::Result;
use crate::layer::LayerConfig;
use crate::masks::AttnMasks;
use crate::packed::Packed;
use crate::run::Run;

/// Configuration of [`Transformer`].
#[derive(Debug, Clone)]
pub struct TransformerConfig {
    /// Every layer's configuration.
    pub layer: LayerConfig,
    /// Encoder layers (PyTorch: 6).
    pub num_encoder_layers: usize,
    /// Decoder layers (PyTorch: 6).
    pub num_decoder_layers: usize,
}

impl TransformerConfig {
    /// PyTorch's defaults for `d_model` and `nhead`: 6 + 6 layers, feed-forward 2048, dropout 0.1.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        Self { layer: LayerConfig::new(d_model, nhead), num_encoder_layers: 6, num_decoder_layers: 6 }
    }
}

/// The masks of a sequence-to-sequence call.
#[derive(Debug, Clone, Default)]
pub struct Seq2SeqMasks {
    /// Encoder self-attention (usually the source padding).
    pub src: AttnMasks,
    /// Decoder self-attention (usually causal + the target padding).
    pub tgt: AttnMasks,
    /// Decoder cross-attention over the memory (usually the source padding).
    pub memory: AttnMasks,
}

/// What [`Transformer::forward`] returns.
#[derive(Debug, Clone)]
pub struct TransformerOutput {
    /// The decoder's output `[B, Lt, d_model]`, laid out like the inputs.
    pub out: Tensor,
    /// The encoder's output `[B, Ls, d_model]`, laid out like the inputs.
    pub memory: Tensor,
    /// Per encoder layer, its self-attention weights (when asked).
    pub encoder_weights: Vec<Tensor>,
    /// The decoder's weights per layer (when asked).
    pub decoder: StackOutput,
}

/// Encoder and decoder stacks.
///
/// ```
/// use attn_nn::{AttnMasks, Run, Seq2SeqMasks, Transformer, TransformerConfig};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let mut cfg = TransformerConfig::new(16, 2);
/// (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.layer.dim_feedforward) = (2, 2, 32);
/// let t = Transformer::new(&cfg, attn_nn::init::seeded(&map, 0))?;
/// let src = attn::random::uniform(&[2, 9, 16], -1.0, 1.0, 1)?; // [B, Ls, d_model]
/// let tgt = attn::random::uniform(&[2, 4, 16], -1.0, 1.0, 2)?; // [B, Lt, d_model]
/// let masks = Seq2SeqMasks { tgt: AttnMasks::causal(), ..Seq2SeqMasks::default() };
/// assert_eq!(t.forward(&src, &tgt, &masks, Run::eval())?.out.dims(), [2, 4, 16]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Transformer {
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
}

impl Transformer {
    /// Loads (or creates) the weights under `vb`.
    pub fn new(cfg: &TransformerConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            encoder: TransformerEncoder::new(&cfg.layer, cfg.num_encoder_layers, true, vb.pp("encoder"))?,
            decoder: TransformerDecoder::new(&cfg.layer, cfg.num_decoder_layers, true, vb.pp("decoder"))?,
        })
    }

    /// The encoder stack.
    pub fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    /// The decoder stack.
    pub fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    /// `src: [B, Ls, d_model]`, `tgt: [B, Lt, d_model]` (both `[L, B, d_model]` with
    /// `batch_first` off, or unbatched `[L, d_model]`) → `tgt`'s shape.
    pub fn forward(&self, src: &Tensor, tgt: &Tensor, masks: &Seq2SeqMasks, run: Run) -> Result<TransformerOutput> {
        let enc = self.encoder.forward(src, &masks.src, run)?;
        let decoder = self.decoder.forward(tgt, &enc.out, &masks.tgt, &masks.memory, run, None)?;
        Ok(TransformerOutput { out: decoder.out.clone(), memory: enc.out, encoder_weights: enc.self_weights, decoder })
    }

    /// Packed `src: [total_s, d_model]` and `tgt: [total_t, d_model]` (the same number of
    /// sequences) → the decoder's output `[total_t, d_model]` cut like `tgt`: the encoder within
    /// each source sequence, the decoder's self-attention within each target sequence (`tgt_causal`
    /// within each) and its cross-attention from target sequence `s` to memory sequence `s`.
    /// Equal to [`Self::forward`] on the padded batches with key padding, at the real rows.
    pub fn forward_packed(&self, src: &Packed, tgt: &Packed, tgt_causal: bool, mode: Mode) -> Result<Packed> {
        let memory = self.encoder.forward_packed(src, false, mode)?;
        self.decoder.forward_packed(tgt, &memory, tgt_causal, mode)
    }

    /// One decoding step: `tgt: [B, Lnew, d_model]` (the new positions, laid out as configured)
    /// over `memory`, through `cache` (causal, bottom-right aligned).
    pub fn decode_step(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        memory_masks: &AttnMasks,
        run: Run,
        cache: &mut DecoderCache,
    ) -> Result<StackOutput> {
        self.decoder.forward(tgt, memory, &AttnMasks::causal(), memory_masks, run, Some(cache))
    }
}
