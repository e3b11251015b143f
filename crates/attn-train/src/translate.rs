//! Using a trained translator: greedy decoding of texts through the KV caches, and the
//! cross-attention of each decoder layer for one text (the alignment the seed exercise reads).

use std::path::Path;

use attn_nn::Seq2Seq;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::checkpoint::{self, Manifest};
use crate::data::{vocab, Batch, Vocab};
use crate::error::{Result, TrainError};

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
        let vb = VarBuilder::from_tensors(ck.weights, DType::F32, &Device::Cpu);
        let model = ck.manifest.model.build(vb).map_err(|e| {
            TrainError::Checkpoint(format!("{}: model.safetensors does not fit config.json: {e}", dir.display()))
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

    /// Refuses a text the model cannot take (too long), naming it.
    fn check(&self, text: &str) -> Result<()> {
        let n = text.chars().count() + vocab::SPECIALS_PER_SEQUENCE;
        if n > self.manifest.model.max_len {
            return Err(TrainError::Setting {
                field: "TEXT",
                reason: format!("{text:?} takes {n} positions, the model allows {}", self.manifest.model.max_len),
            });
        }
        Ok(())
    }

    /// `[B, Ls]` source ids of `texts`.
    fn sources(&self, texts: &[String]) -> Result<Tensor> {
        for t in texts {
            self.check(t)?;
        }
        let pairs: Vec<_> = texts.iter().map(|t| (t.clone(), String::new())).collect();
        Ok(Batch::new(&pairs, &self.vocab, &Device::Cpu)?.src)
    }

    /// Greedy translations of `texts`, in order.
    pub fn translate(&self, texts: &[String]) -> Result<Vec<String>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let greedy =
            self.model.greedy(&self.sources(texts)?, vocab::BOS, vocab::EOS, self.manifest.model.max_len, false)?;
        Ok(greedy.tokens.iter().map(|ids| self.vocab.decode(ids)).collect())
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
