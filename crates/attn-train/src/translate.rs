//! Using a trained translator: greedy decoding of texts through the KV caches, answers text by
//! text that are never invented (a text the model cannot take, or for the dates task an output
//! that is no calendar date, gets a reason instead), and the cross-attention of each decoder layer
//! for one text (the alignment the seed exercise reads).

use std::path::Path;

use attn_nn::load::StateDict;
use attn_nn::Seq2Seq;
use candle_core::{DType, Device, Tensor};
use thiserror::Error;

use crate::checkpoint::{self, Manifest};
use crate::data::{vocab, Batch, Date, DatesTask, Vocab};
use crate::error::{one_line, Result, TrainError};
use crate::settings::TaskSpec;

/// Texts decoded at once.
const CHUNK: usize = 250;
/// Characters of a text quoted in a message ([`excerpt`]).
const EXCERPT_CHARS: usize = 80;

/// Why a text gets no translation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unanswered {
    /// Nothing but white space.
    #[error("empty")]
    Empty,
    /// More positions than the model has.
    #[error("{chars} characters, {positions} positions with </s>, more than the model's {max_len}")]
    TooLong {
        /// Its characters.
        chars: usize,
        /// The positions it takes.
        positions: usize,
        /// The model's positions.
        max_len: usize,
    },
    /// Characters the model never saw (each once, in order of appearance).
    #[error("characters outside the model's vocabulary: {}", describe_chars(.0))]
    Unknown(Vec<char>),
    /// For the dates task: the model's output is not a date `YYYY-MM-DD` of the calendar.
    #[error("the model's output {} is not a calendar date YYYY-MM-DD", excerpt(.0))]
    NotADate(String),
}

/// `'x' (U+0078), …`.
fn describe_chars(chars: &[char]) -> String {
    chars.iter().map(|c| format!("{c:?} (U+{:04X})", *c as u32)).collect::<Vec<_>>().join(", ")
}

/// `text` quoted for a message, cut to its first 80 characters (`…` and the length follow).
///
/// ```
/// use attn_train::translate::excerpt;
/// assert_eq!(excerpt("3 March"), "\"3 March\"");
/// assert!(excerpt(&"a".repeat(1000)).ends_with("\"… (1000 characters)"));
/// ```
pub fn excerpt(text: &str) -> String {
    let n = text.chars().count();
    if n <= EXCERPT_CHARS {
        return format!("{text:?}");
    }
    let cut: String = text.chars().take(EXCERPT_CHARS).collect();
    format!("{cut:?}… ({n} characters)")
}

/// A text's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The text as the model took it ([`Translator::prepare`]).
    pub source: String,
    /// The translation.
    pub output: String,
}

/// One translation with its alignment.
#[derive(Debug, Clone)]
pub struct Aligned {
    /// The output text.
    pub output: String,
    /// The source as the model saw it: its characters then `</s>`.
    pub source_tokens: Vec<String>,
    /// The output tokens: its characters then `</s>` when the model ended the text.
    pub output_tokens: Vec<String>,
    /// Per decoder layer, the cross-attention `[H, output tokens, source tokens]` (row-major).
    pub layers: Vec<Vec<f32>>,
    /// Heads per layer.
    pub heads: usize,
}

/// A model and its vocabulary, ready to translate.
pub struct Translator {
    model: Seq2Seq,
    vocab: Vocab,
    manifest: Manifest,
}

impl Translator {
    /// Loads the checkpoint in `dir`; a missing, truncated or mismatched checkpoint is an error
    /// naming the file.
    pub fn load(dir: &Path) -> Result<Self> {
        let ck = checkpoint::load(dir)?;
        let weights = StateDict::from_tensors(ck.weights, "model.safetensors");
        let model = weights.build(DType::F32, &Device::Cpu, |vb| ck.manifest.model.build(vb)).map_err(|e| {
            TrainError::Checkpoint(format!(
                "{}: model.safetensors does not fit config.json: {}",
                dir.display(),
                one_line(&e.to_string())
            ))
        })?;
        Ok(Self { model, vocab: ck.vocab, manifest: ck.manifest })
    }

    /// Wraps a model being trained.
    pub(crate) fn from_parts(model: Seq2Seq, vocab: Vocab, manifest: Manifest) -> Self {
        Self { model, vocab, manifest }
    }

    /// The checkpoint's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub(crate) fn manifest_mut(&mut self) -> &mut Manifest {
        &mut self.manifest
    }

    /// The model.
    pub fn model(&self) -> &Seq2Seq {
        &self.model
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Whether the model was trained on the built-in dates task.
    fn is_dates(&self) -> bool {
        self.manifest.train.task == TaskSpec::Dates
    }

    /// `text` as the model takes it, or why it cannot: empty, longer than the model's positions,
    /// or holding characters outside the vocabulary. For the dates task the text is first trimmed
    /// and its month and weekday names, `the`, `of` and ordinal suffixes case-folded to the task's
    /// forms ([`DatesTask::fold_case`]), which changes no date.
    pub fn prepare(&self, text: &str) -> std::result::Result<String, Unanswered> {
        let text = if self.is_dates() { DatesTask::fold_case(text.trim()) } else { text.to_string() };
        if text.trim().is_empty() {
            return Err(Unanswered::Empty);
        }
        self.fits(&text)?;
        let mut unknown: Vec<char> = Vec::new();
        for c in text.chars().filter(|&c| self.vocab.id(c) == vocab::UNK) {
            if !unknown.contains(&c) {
                unknown.push(c);
            }
        }
        if !unknown.is_empty() {
            return Err(Unanswered::Unknown(unknown));
        }
        Ok(text)
    }

    /// The answer to each of `texts`, in order: the texts the model can take ([`Self::prepare`])
    /// are translated together; for the dates task an output that is not a calendar date
    /// `YYYY-MM-DD` is refused rather than passed on.
    pub fn answer(&self, texts: &[&str]) -> Result<Vec<std::result::Result<Answer, Unanswered>>> {
        let prepared: Vec<_> = texts.iter().map(|t| self.prepare(t)).collect();
        let sources: Vec<String> = prepared.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
        let mut outputs = self.translate(&sources)?.into_iter();
        Ok(prepared
            .into_iter()
            .map(|p| {
                let source = p?;
                let output = outputs.next().expect("one output per prepared text");
                if self.is_dates() && Date::parse_iso(&output).is_none() {
                    return Err(Unanswered::NotADate(output));
                }
                Ok(Answer { source, output })
            })
            .collect())
    }

    /// Refuses a text longer than the model's positions.
    fn fits(&self, text: &str) -> std::result::Result<(), Unanswered> {
        let chars = text.chars().count();
        let positions = chars + vocab::SPECIALS_PER_SEQUENCE;
        let max_len = self.manifest.model.max_len;
        if positions > max_len {
            return Err(Unanswered::TooLong { chars, positions, max_len });
        }
        Ok(())
    }

    /// `[B, Ls]` source ids of `texts`, each refused if longer than the model's positions.
    fn sources(&self, texts: &[String]) -> Result<Tensor> {
        for t in texts {
            self.fits(t).map_err(|reason| TrainError::Text { text: excerpt(t), reason })?;
        }
        let pairs: Vec<_> = texts.iter().map(|t| (t.clone(), String::new())).collect();
        Ok(Batch::new(&pairs, &self.vocab, &Device::Cpu)?.src)
    }

    /// Greedy translations of `texts`, in order, as the model writes them (no check of the text
    /// but its length, none of the output: see [`Self::answer`]), 250 texts at a time.
    pub fn translate(&self, texts: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(CHUNK) {
            let max_len = self.manifest.model.max_len;
            let greedy = self.model.greedy(&self.sources(chunk)?, vocab::BOS, vocab::EOS, max_len, false)?;
            out.extend(greedy.tokens.iter().map(|ids| self.vocab.decode(ids)));
        }
        Ok(out)
    }

    /// The translation of `text` with every decoder layer's cross-attention.
    pub fn translate_aligned(&self, text: &str) -> Result<Aligned> {
        let src = self.sources(&[text.to_string()])?; // [1, Ls]
        let greedy = self.model.greedy(&src, vocab::BOS, vocab::EOS, self.manifest.model.max_len, true)?;
        let ids = &greedy.tokens[0];
        let output = self.vocab.decode(ids);
        let mut output_tokens: Vec<String> = ids.iter().map(|&i| token_text(&self.vocab, i)).collect();
        let steps = greedy.cross_weights.first().map_or(0, |w| w.dims()[2]);
        if steps > ids.len() {
            output_tokens.push("</s>".into());
        }
        let source_tokens: Vec<String> =
            src.flatten_all()?.to_vec1::<u32>()?.iter().map(|&i| token_text(&self.vocab, i)).collect();
        let heads = self.manifest.model.heads;
        let layers = greedy
            .cross_weights
            .iter()
            .map(|w| Ok(w.narrow(2, 0, output_tokens.len())?.flatten_all()?.to_vec1::<f32>()?)) // [1, H, Lt, Ls]
            .collect::<Result<_>>()?;
        Ok(Aligned { output, source_tokens, output_tokens, layers, heads })
    }
}

/// A token as a label: its character (space shown as `␣`) or a special's name.
pub(crate) fn token_text(vocab: &Vocab, id: u32) -> String {
    match id {
        vocab::EOS => "</s>".into(),
        vocab::BOS => "<s>".into(),
        vocab::PAD => "<pad>".into(),
        _ => match vocab.char(id) {
            Some(' ') => "␣".into(),
            Some(c) => c.to_string(),
            None => "<unk>".into(),
        },
    }
}
