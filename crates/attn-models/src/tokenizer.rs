//! Text ↔ token ids for the real models, through the `tokenizers` crate: a Hugging Face
//! `tokenizer.json` as it is (MiniLM's WordPiece), or a pipeline built from a GGUF file's metadata
//! as transformers builds it (`convert_gguf_tokenizer`): for `gpt2` (SmolLM2), byte-level BPE
//! from the vocabulary and merges, GPT-2's split, no prefix space, the tokens marked control as
//! special tokens and those marked user-defined as added tokens.

use std::path::Path;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::gguf::Gguf;

/// GGUF `token_type` values (llama.cpp's `llama_token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// A model's tokenizer with its special ids and chat template.
#[derive(Debug, Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Beginning-of-sequence id, if the model has one.
    pub bos: Option<u32>,
    /// End-of-sequence id (generation stops there), if the model has one.
    pub eos: Option<u32>,
    /// Whether [`TextTokenizer::encode`] prepends `bos` (GGUF's `add_bos_token`).
    add_bos: bool,
    /// The chat template, for instruct models.
    pub chat: Option<ChatTemplate>,
}

impl TextTokenizer {
    /// A Hugging Face `tokenizer.json` (its own normalizer, pre-tokenizer and post-processor;
    /// its padding and truncation settings are dropped: callers pad and check lengths).
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(ModelError::file(path, "missing (a Hugging Face model directory needs its tokenizer.json)"));
        }
        let mut inner =
            Tokenizer::from_file(path).map_err(|e| ModelError::file(path, format!("not a tokenizer: {e}")))?;
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| ModelError::file(path, e))?;
        Ok(Self { inner, bos: None, eos: None, add_bos: false, chat: None })
    }

    /// The tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self> {
        let model = gguf.string("tokenizer.ggml.model")?;
        let inner = match model {
            "gpt2" => byte_level_bpe(gguf)?,
            other => {
                return Err(ModelError::field(
                    gguf.path(),
                    "tokenizer.ggml.model",
                    format!("tokenizer `{other}` is not supported (supported: gpt2)"),
                ))
            }
        };
        let id = |key: &str| -> Result<Option<u32>> {
            if gguf.has(key) {
                Ok(Some(gguf.usize(key)? as u32))
            } else {
                Ok(None)
            }
        };
        let chat = if gguf.has("tokenizer.chat_template") {
            ChatTemplate::parse(gguf.string("tokenizer.chat_template")?)
        } else {
            None
        };
        Ok(Self {
            inner,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            add_bos: gguf.bool_or("tokenizer.ggml.add_bos_token", false)?,
            chat,
        })
    }

    /// The ids of `text`, with the model's special tokens added (BERT's `[CLS]`/`[SEP]`, a
    /// `bos` where the model asks for one); special tokens written in the text are kept whole.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| ModelError::Input(format!("tokenizing: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if self.add_bos {
            if let Some(bos) = self.bos {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The text of `ids` (special tokens included).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| ModelError::Input(format!("decoding: {e}")))
    }

    /// The vocabulary's size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The token `id` as the vocabulary spells it, for picture labels.
    pub fn token(&self, id: u32) -> String {
        self.inner.id_to_token(id).unwrap_or_else(|| format!("<{id}>"))
    }
}

/// Byte-level BPE from `tokenizer.ggml.tokens` / `merges` / `token_type`.
fn byte_level_bpe(gguf: &Gguf) -> Result<Tokenizer> {
    let path = gguf.path();
    let tokens = gguf.strings("tokenizer.ggml.tokens")?;
    let types =
        if gguf.has("tokenizer.ggml.token_type") { gguf.integers("tokenizer.ggml.token_type")? } else { vec![] };
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(ModelError::field(
            path,
            "tokenizer.ggml.token_type",
            format!("{} entries, expected one per token ({})", types.len(), tokens.len()),
        ));
    }
    let alphabet = byte_alphabet();
    let spelled = |t: &str| -> String {
        if t.chars().all(|c| alphabet.contains(&c)) {
            t.to_string()
        } else {
            t.bytes().map(|b| alphabet[usize::from(b)]).collect()
        }
    };
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (spelled(t), i as u32)).collect();
    let merges = gguf
        .strings("tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                ModelError::field(path, format!("tokenizer.ggml.merges[{i}]"), format!("`{m}` is not two tokens"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| ModelError::field(path, "tokenizer.ggml.merges", e))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let of_type = |kind: i64| tokens.iter().zip(&types).filter(move |(_, &t)| t == kind).map(|(s, _)| *s);
    // A control token spelled outside the byte alphabet is a mislabel (transformers skips it too).
    let control: Vec<AddedToken> = of_type(CONTROL)
        .filter(|s| s.chars().all(|c| alphabet.contains(&c)))
        .map(|s| AddedToken::from(s.to_string(), true))
        .collect();
    tok.add_special_tokens(control).map_err(|e| ModelError::field(path, "tokenizer.ggml.token_type", e))?;
    let user: Vec<AddedToken> =
        of_type(USER_DEFINED).map(|s| AddedToken::from(s.to_string(), false).normalized(false)).collect();
    tok.add_tokens(user).map_err(|e| ModelError::field(path, "tokenizer.ggml.token_type", e))?;
    Ok(tok)
}

/// GPT-2's `bytes_to_unicode`: byte `b` is spelled by the `b`-th character — printable Latin-1
/// bytes as themselves, the others as code points from 256 on, in byte order.
fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            let code = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(code).expect("code points below 512 are characters")
        })
        .collect()
}
