//! Attention modules on candle-nn, with PyTorch's semantics and weight names:
//!
//! - [`SelfAttention`]: one head with learned `W_Q`, `W_K`, `W_V`;
//! - [`MultiHeadAttention`]: `nn.MultiheadAttention` (with `add_bias_kv`, `add_zero_attn`,
//!   batch-first, sequence-first and unbatched inputs) plus grouped-query heads, rotary
//!   embeddings and a [`KvCache`] for incremental decoding;
//! - [`LinearAttention`]: multi-head linear attention (`elu+1`, ReLU, identity, FAVOR+) with
//!   `MultiHeadAttention`'s weights and a recurrent [`LinearCache`] for decoding;
//! - [`GatedDeltaNet`]: the gated delta rule layer of Qwen3-Next and Qwen3.5 (transformers'
//!   weight names), with a recurrent [`GatedDeltaCache`] for decoding;
//! - [`AdditiveAttention`]: Bahdanau's `vᵀ·tanh(W_q·q + W_k·k)`;
//! - [`EncoderLayer`], [`DecoderLayer`], [`TransformerEncoder`], [`TransformerDecoder`],
//!   [`Transformer`]: `nn.TransformerEncoderLayer` and friends (with `bias=False` and
//!   `batch_first`), returning attention weights when asked, their self-attention softmax or
//!   linear as [`LayerConfig::attention`] says ([`AttentionKind`]); [`Seq2Seq`]: a token-level
//!   translator built on them;
//! - [`Packed`]: packed batches (sequences one after another, no padding), which
//!   `MultiHeadAttention`, the layers, stacks, `Transformer` and `Seq2Seq` take through their
//!   `forward_packed` methods;
//! - [`LayerNorm`]: `nn.LayerNorm`, with or without affine parameters or bias; [`RmsNorm`]:
//!   `nn.RMSNorm` (Llama's); [`GatedRmsNorm`]: Gated DeltaNet's normalise-then-gate;
//! - [`position`]: sinusoidal encodings, RoPE and ALiBi;
//! - [`load`]: PyTorch state dicts loaded strictly, frozen or into trainable variables listed by
//!   name.
//!
//! Each module is a config struct, a constructor from a [`candle_nn::VarBuilder`] (which loads a
//! PyTorch state dict by its PyTorch names, or creates fresh variables with PyTorch's
//! initialisation from a `VarMap`), and a `forward` with shapes in its documentation.
//! Sequence modules are batch first by default (`batch_first: true`, unlike PyTorch); set
//! `batch_first: false` for PyTorch's `[L, B, E]`, and any of them takes unbatched `[L, E]`.
//! Every dot-product attention runs through [`attn::sdpa_full`], the fused differentiable kernel.
//! No module uses a candle-nn path without a backward (`softmax_last_dim`, LayerNorm's fused
//! path), so every parameter trains.
//!
//! Masks are typed ([`AttnMasks`], [`attn::Mask`] with its polarity). Unlike PyTorch, a query whose
//! keys are all masked gets zero output rather than NaN.
//!
//! Loading a PyTorch model: save its `state_dict()` with `safetensors.torch.save_file` and build
//! the module through [`load::strict`] (frozen) or [`load::trainable`] (to fine-tune); a missing,
//! mis-shaped or unused weight is an error naming it. (A module built straight from a
//! `VarBuilder` over the file cannot notice unused weights.)
//!
//! ```no_run
//! use attn_nn::{load, EncoderLayer, LayerConfig};
//! use candle_core::{DType, Device};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // torch: layer = nn.TransformerEncoderLayer(512, 8, batch_first=True); save_file(layer.state_dict(), "layer.safetensors")
//! let cfg = LayerConfig::new(512, 8);
//! let layer = load::strict("layer.safetensors", DType::F32, &Device::Cpu, |vb| EncoderLayer::new(&cfg, vb))?;
//! # Ok(()) }
//! ```
//!
//! The candle crates this one is built on are re-exported ([`candle_core`], [`candle_nn`]), so a
//! crate using attn-nn can use the same versions without naming them in its own `Cargo.toml`.

pub use {candle_core, candle_nn};

pub mod additive;
pub mod attention_kind;
pub mod decoder;
pub mod dropout;
pub mod encoder;
pub mod error;
pub mod feedforward;
pub mod fused;
pub mod gated_delta;
pub mod init;
pub mod kv_cache;
pub mod layer;
mod layout;
pub mod linear;
pub mod linear_attn;
pub mod load;
pub mod masks;
pub mod memory;
pub mod mha;
pub mod norm;
pub mod packed;
pub mod position;
pub mod process;
pub mod run;
pub mod self_attention;
pub mod seq2seq;
pub mod threads;
pub mod transformer;

pub use additive::{AdditiveAttention, AdditiveAttentionConfig, AdditiveOutput};
pub use attention_kind::AttentionKind;
pub use decoder::{DecoderCache, DecoderLayer, LayerCache, TransformerDecoder};
pub use dropout::Mode;
pub use encoder::{EncoderLayer, StackOutput, TransformerEncoder};
pub use error::{NnError, Result};
pub use feedforward::{Activation, FeedForward, FeedForwardConfig};
pub use gated_delta::{GatedDeltaCache, GatedDeltaNet, GatedDeltaNetConfig};
pub use kv_cache::{Cache, KvCache};
pub use layer::{LayerConfig, LayerOutput};
pub use linear::Linear;
pub use linear_attn::{LinearAttention, LinearAttentionConfig, LinearCache, LinearInput, LinearMap};
pub use load::{named_parameters, StateDict, Trainable};
pub use masks::{AttnMask, AttnMasks};
pub use mha::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig, NeedWeights, PackedMhaInput};
pub use norm::{GatedRmsNorm, LayerNorm, LayerNormConfig, RmsNorm};
pub use packed::Packed;
pub use position::rope::RopeConfig;
pub use run::Run;
pub use self_attention::{SelfAttention, SelfAttentionConfig, SelfAttentionOutput};
pub use seq2seq::{Encoded, Greedy, Seq2Seq, Seq2SeqConfig};
pub use transformer::{Seq2SeqMasks, Transformer, TransformerConfig, TransformerOutput};
