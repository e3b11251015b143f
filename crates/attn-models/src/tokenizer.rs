//! Text ↔ token ids for the real models, through the `tokenizers` crate: a Hugging Face
//! `tokenizer.json` as it is (MiniLM's WordPiece), or a pipeline built from a GGUF file's metadata
//! as transformers builds it (`convert_gguf_tokenizer`): for `gpt2` (SmolLM2), byte-level BPE
//! from the vocabulary and merges, GPT-2's split, no prefix space; for `llama` in a Gemma 3 file,
//! SentencePiece-style BPE with byte fallback (spaces as `▁`), its merges rebuilt from the
//! vocabulary's order; in both, the tokens marked control as special tokens and those marked
//! user-defined as added tokens.

use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::SplitDelimiterBehavior;
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
        let arch = gguf.architecture()?;
        let inner = match (model, arch) {
            ("gpt2", _) => byte_level_bpe(gguf)?,
            ("llama", "gemma3") => gemma_bpe(gguf)?,
            (other, arch) => {
                return Err(ModelError::field(
                    gguf.path(),
                    "tokenizer.ggml.model",
                    format!(
                        "tokenizer `{other}` of a `{arch}` model is not supported (supported: gpt2; llama for gemma3)"
                    ),
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

/// `tokenizer.ggml.tokens` and, when the file has them, `token_type` (one per token).
fn tokens_and_types(gguf: &Gguf) -> Result<(Vec<&str>, Vec<i64>)> {
    let tokens = gguf.strings("tokenizer.ggml.tokens")?;
    let types =
        if gguf.has("tokenizer.ggml.token_type") { gguf.integers("tokenizer.ggml.token_type")? } else { vec![] };
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(ModelError::field(
            gguf.path(),
            "tokenizer.ggml.token_type",
            format!("{} entries, expected one per token ({})", types.len(), tokens.len()),
        ));
    }
    Ok((tokens, types))
}

/// Adds the tokens of type `CONTROL` that `keep` accepts as special tokens, and those of type
/// `USER_DEFINED` spelled as in the tokenizer's vocabulary as added tokens, so the text's copies
/// of them stay whole (transformers' `add_gguf_special_tokens`).
fn add_marked_tokens(
    tok: &mut Tokenizer,
    gguf: &Gguf,
    tokens: &[&str],
    types: &[i64],
    keep: impl Fn(&str) -> bool,
) -> Result<()> {
    let of_type = |kind: i64| tokens.iter().zip(types).filter(move |(_, &t)| t == kind).map(|(s, _)| *s);
    let control: Vec<AddedToken> =
        of_type(CONTROL).filter(|s| keep(s)).map(|s| AddedToken::from(s.to_string(), true)).collect();
    let user: Vec<AddedToken> = of_type(USER_DEFINED)
        .filter(|s| tok.token_to_id(s).is_some())
        .map(|s| AddedToken::from(s.to_string(), false).normalized(false))
        .collect();
    let bad = |e| ModelError::field(gguf.path(), "tokenizer.ggml.token_type", e);
    tok.add_special_tokens(control).map_err(bad)?;
    tok.add_tokens(user).map_err(bad)?;
    Ok(())
}

/// Byte-level BPE from `tokenizer.ggml.tokens` / `merges` / `token_type`.
fn byte_level_bpe(gguf: &Gguf) -> Result<Tokenizer> {
    let path = gguf.path();
    let (tokens, types) = tokens_and_types(gguf)?;
    let alphabet = byte_alphabet();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let spelled = |t: &str| -> String {
        if in_alphabet(t) {
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
    // A control token spelled outside the byte alphabet is a mislabel (transformers skips it too).
    add_marked_tokens(&mut tok, gguf, &tokens, &types, in_alphabet)?;
    Ok(tok)
}

/// Gemma's SentencePiece vocabulary as BPE with byte fallback (transformers' `gemma_tokenizer`):
/// tokens of spaces only respelled with `▁`, and the merges the file lacks rebuilt from the
/// vocabulary — every split of a token into two tokens, tokens in file order (Gemma's scores do
/// not follow its merge order; the order does), a token's splits longest left part first.
fn gemma_bpe(gguf: &Gguf) -> Result<Tokenizer> {
    const SPACE: char = '\u{2581}';
    let path = gguf.path();
    let (tokens, types) = tokens_and_types(gguf)?;
    let respelled: Vec<String> = tokens
        .iter()
        .map(|t| {
            if !t.is_empty() && t.chars().all(|c| c == ' ') {
                SPACE.to_string().repeat(t.chars().count())
            } else {
                t.to_string()
            }
        })
        .collect();
    let vocab: Vocab = respelled.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut merges = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for token in &respelled {
        // A token spelled twice counts once, at its first place (as a Python dict iterates).
        if !seen.insert(token.as_str()) {
            continue;
        }
        let cuts: Vec<usize> = token.char_indices().map(|(i, _)| i).skip(1).collect();
        for &cut in cuts.iter().rev() {
            let (l, r) = token.split_at(cut);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                merges.push((l.to_string(), r.to_string()));
            }
        }
    }
    let unk = gguf.usize("tokenizer.ggml.unknown_token_id")?;
    let unk = respelled.get(unk).ok_or_else(|| {
        ModelError::field(path, "tokenizer.ggml.unknown_token_id", format!("{unk} is past the vocabulary"))
    })?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token(unk.clone())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(|e| ModelError::field(path, "tokenizer.ggml.tokens", e))?;
    let mut tok = Tokenizer::new(bpe);
    let space = SPACE.to_string();
    let bad = |e| ModelError::field(path, "tokenizer.ggml.model", e);
    tok.with_normalizer(Some(Replace::new(" ", space.as_str()).map_err(bad)?)).map_err(bad)?;
    tok.with_pre_tokenizer(Some(Split::new(" ", SplitDelimiterBehavior::MergedWithPrevious, false).map_err(bad)?));
    tok.with_decoder(Some(DecoderSequence::new(vec![
        Replace::new(space.as_str(), " ").map_err(bad)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    add_marked_tokens(&mut tok, gguf, &tokens, &types, |_| true)?;
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
