//! A single-head self-attention classifier with padding masks, trained on a generated task that
//! cannot be solved without attention.
//!
//! **Task.** A sequence of filler letters (`c` … `j`) of random length (4 to 24 tokens by
//! default) holds one `A` and one `B` at random positions; the label says which of the two comes
//! first. Sequences in a batch are right-padded with `pad = 0`. Averaging token-plus-position
//! embeddings loses the order of the two markers — `A` at `i` and `B` at `j` sum to what `B` at
//! `i` and `A` at `j` do — so a bag-of-tokens model stays at chance. Attention can tell them
//! apart: how much a query reads a marker depends on both their tokens and positions.
//!
//! **Model.** Token embedding plus the sinusoidal position table → [`attn_nn::SelfAttention`] (one
//! head, the key padding mask built from the token ids by [`attn::padding_mask`]) → mean over the
//! real positions only → linear layer to the two classes. Cross-entropy, [`AdamW`] with the
//! warm-up and cosine [`Schedule`], seeded initialisation and data: a run is a pure function of
//! its settings.

use attn_nn::{AttnMasks, SelfAttention, SelfAttentionConfig};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Embedding, Linear, Module, VarMap};

use crate::data::sample::{below, stream};
use crate::data::BatchOrder;
use crate::error::{Result, TrainError};
use crate::optim::{AdamW, AdamWConfig};
use crate::schedule::Schedule;

/// The padding id.
pub const PAD: u32 = 0;
/// The two markers' ids, in class order.
pub const MARKERS: [u32; 2] = [1, 2];
/// The classes' names.
pub const CLASSES: [&str; 2] = ["A first", "B first"];
/// Filler letters, ids 3 onwards.
const FILLERS: &str = "cdefghij";
const SALT_TRAIN: u64 = 0x434C_4153_5452_4E31;
const SALT_TEST: u64 = 0x434C_4153_5445_5354;
/// Sequences scored at once when measuring accuracy.
const EVAL_CHUNK: usize = 500;

/// How to generate, build and train.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassifySettings {
    /// Training sequences.
    pub train_size: usize,
    /// Test sequences (never trained on).
    pub test_size: usize,
    /// Shortest sequence, markers included (at least 2).
    pub min_len: usize,
    /// Longest sequence.
    pub max_len: usize,
    /// Embedding and attention width.
    pub d_model: usize,
    /// Optimiser steps.
    pub steps: u64,
    /// Sequences per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Steps between evaluations (the last step is always evaluated).
    pub eval_every: u64,
    /// Seed of data, initialisation and batch order.
    pub seed: u64,
}

impl Default for ClassifySettings {
    fn default() -> Self {
        Self {
            train_size: 2000,
            test_size: 1000,
            min_len: 4,
            max_len: 24,
            d_model: 32,
            steps: 800,
            batch: 64,
            lr: 1e-2,
            eval_every: 100,
            seed: 0,
        }
    }
}

/// Longest sequence the position table is built for.
pub const MAX_LEN_LIMIT: usize = 512;

impl ClassifySettings {
    /// Refuses unusable settings, naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::Setting { field, reason });
        for (field, value) in [
            ("train_size", self.train_size as u64),
            ("test_size", self.test_size as u64),
            ("d_model", self.d_model as u64),
            ("batch", self.batch as u64),
            ("steps", self.steps),
            ("eval_every", self.eval_every),
        ] {
            if value == 0 {
                return bad(field, "must be positive".into());
            }
        }
        if self.min_len < 2 {
            return bad("min_len", format!("{}: both markers must fit, so at least 2", self.min_len));
        }
        if self.max_len < self.min_len || self.max_len > MAX_LEN_LIMIT {
            return bad(
                "max_len",
                format!("{}: must be at least min_len {} and at most {MAX_LEN_LIMIT}", self.max_len, self.min_len),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", format!("{} must be a positive number", self.lr));
        }
        Ok(())
    }
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, no padding.
    pub tokens: Vec<u32>,
    /// 0: `A` first, 1: `B` first.
    pub label: u32,
}

/// Sequence `index` of the stream `salt`: a pure function of `(seed, salt, index)`.
fn example(s: &ClassifySettings, salt: u64, index: u64) -> Example {
    let mut rng = stream(s.seed, salt, index);
    let len = s.min_len + below(&mut rng, s.max_len - s.min_len + 1);
    let mut tokens: Vec<u32> = (0..len).map(|_| 3 + below(&mut rng, FILLERS.len()) as u32).collect();
    let a = below(&mut rng, len);
    let b = (a + 1 + below(&mut rng, len - 1)) % len; // any position but `a`
    (tokens[a], tokens[b]) = (MARKERS[0], MARKERS[1]);
    Example { tokens, label: u32::from(b < a) }
}

/// A token as text: `A`, `B`, its filler letter, or `<pad>`.
pub fn token_text(id: u32) -> String {
    match id {
        PAD => "<pad>".into(),
        1 => "A".into(),
        2 => "B".into(),
        _ => FILLERS.chars().nth(id as usize - 3).map_or_else(|| "?".into(), String::from),
    }
}

/// The classifier.
struct Model {
    tokens: Embedding,
    /// `[max_len, d]` sinusoidal positions.
    positions: Tensor,
    attention: SelfAttention,
    out: Linear,
}

impl Model {
    fn new(s: &ClassifySettings, map: &VarMap) -> Result<Self> {
        let vb = attn_nn::init::seeded(map, s.seed);
        let d = s.d_model;
        Ok(Self {
            tokens: candle_nn::embedding(3 + FILLERS.len(), d, vb.pp("tokens"))?,
            positions: attn_nn::position::sinusoidal::sinusoidal_table(s.max_len, d)?,
            attention: SelfAttention::new(SelfAttentionConfig::new(d, d, d), vb.pp("attention"))?,
            out: candle_nn::linear(d, 2, vb.pp("out"))?,
        })
    }

    /// `ids: [B, L]` → logits `[B, 2]` and, when asked, the attention weights `[B, L, L]`.
    fn forward(&self, ids: &Tensor, need_weights: bool) -> Result<(Tensor, Option<Tensor>)> {
        let l = ids.dim(1)?;
        let x = self.tokens.forward(ids)?.broadcast_add(&self.positions.narrow(0, 0, l)?)?; // [B, L, d]
        let masks = AttnMasks::default().key_padding(attn::padding_mask(ids, PAD)?);
        let o = self.attention.forward(&x, &masks, need_weights)?;
        let real = ids.ne(PAD)?.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?; // [B, L, 1]
        let pooled = o.out.broadcast_mul(&real)?.sum(1)?.broadcast_div(&real.sum(1)?)?; // [B, d]
        Ok((self.out.forward(&pooled)?, o.weights))
    }
}

/// `[B, L]` ids of `examples`, right-padded, and their labels `[B]`.
fn batch(examples: &[&Example]) -> Result<(Tensor, Tensor)> {
    let width = examples.iter().map(|e| e.tokens.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(examples.len() * width);
    for e in examples {
        ids.extend_from_slice(&e.tokens);
        ids.resize(ids.len() + width - e.tokens.len(), PAD);
    }
    let labels: Vec<u32> = examples.iter().map(|e| e.label).collect();
    Ok((Tensor::from_vec(ids, (examples.len(), width), &Device::Cpu)?, Tensor::new(labels, &Device::Cpu)?))
}

/// One evaluation during training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Steps done.
    pub step: u64,
    /// Mean training loss since the previous evaluation.
    pub loss: f64,
    /// Accuracy on the training sequences, in `[0, 1]`.
    pub train_accuracy: f64,
    /// Accuracy on the test sequences.
    pub test_accuracy: f64,
}

/// The first test sequence as the trained model sees it.
#[derive(Debug, Clone)]
pub struct Attended {
    /// The sequence.
    pub example: Example,
    /// The predicted class.
    pub predicted: u32,
    /// Its attention weights `[L, L]`, row-major.
    pub weights: Vec<f32>,
}

/// What a run returns.
#[derive(Debug, Clone)]
pub struct ClassifyReport {
    /// Every evaluation, in order.
    pub evaluations: Vec<Evaluation>,
    /// The first test sequence with its attention.
    pub attended: Attended,
}

/// Generates the data, trains, and evaluates every `eval_every` steps (calling `progress` with
/// each evaluation as it is made).
pub fn run(s: &ClassifySettings, mut progress: impl FnMut(&Evaluation)) -> Result<ClassifyReport> {
    s.check()?;
    let train: Vec<Example> = (0..s.train_size as u64).map(|i| example(s, SALT_TRAIN, i)).collect();
    let test: Vec<Example> = (0..s.test_size as u64).map(|i| example(s, SALT_TEST, i)).collect();
    let map = VarMap::new();
    let model = Model::new(s, &map)?;
    let vars = map.data().lock().expect("the VarMap lock is not poisoned").clone();
    let mut opt = AdamW::new(vars, AdamWConfig::default())?;
    let schedule = Schedule { peak: s.lr, warmup: (s.steps / 10).max(1), total: s.steps, floor: 0.1 };
    let order = BatchOrder::new(train.len(), s.batch, s.seed)?;
    let mut evaluations = Vec::new();
    let mut interval = (0.0, 0u32);
    for (step, indices) in (0..s.steps).zip(order.iter_from(0)) {
        let (ids, labels) = batch(&indices.iter().map(|&i| &train[i]).collect::<Vec<_>>())?;
        let loss = candle_nn::loss::cross_entropy(&model.forward(&ids, false)?.0, &labels)?;
        interval = (interval.0 + f64::from(loss.to_scalar::<f32>()?), interval.1 + 1);
        opt.step(&loss.backward()?, schedule.lr(step))?;
        let done = step + 1;
        if done % s.eval_every == 0 || done == s.steps {
            let e = Evaluation {
                step: done,
                loss: interval.0 / f64::from(interval.1),
                train_accuracy: accuracy(&model, &train)?,
                test_accuracy: accuracy(&model, &test)?,
            };
            interval = (0.0, 0);
            progress(&e);
            evaluations.push(e);
        }
    }
    let (ids, _) = batch(&[&test[0]])?;
    let (logits, weights) = model.forward(&ids, true)?;
    let attended = Attended {
        predicted: logits.argmax(D::Minus1)?.to_vec1::<u32>()?[0],
        weights: weights.map_or(Ok(Vec::new()), |w| w.flatten_all()?.to_vec1::<f32>())?,
        example: test[0].clone(),
    };
    Ok(ClassifyReport { evaluations, attended })
}

/// The fraction of `examples` classified correctly.
fn accuracy(model: &Model, examples: &[Example]) -> Result<f64> {
    let mut right = 0usize;
    for chunk in examples.chunks(EVAL_CHUNK) {
        let (ids, labels) = batch(&chunk.iter().collect::<Vec<_>>())?;
        let predicted = model.forward(&ids, false)?.0.argmax(D::Minus1)?;
        right += predicted.eq(&labels)?.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize;
    }
    Ok(right as f64 / examples.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_hold_one_of_each_marker_are_labelled_by_the_first_and_read_as_letters() {
        let s = ClassifySettings { min_len: 2, max_len: 9, ..ClassifySettings::default() };
        let mut labels = [0; 2];
        for i in 0..500 {
            let e = example(&s, SALT_TRAIN, i);
            assert!((2..=9).contains(&e.tokens.len()));
            let at = |m| e.tokens.iter().position(|&t| t == m).unwrap();
            assert_eq!(e.tokens.iter().filter(|&&t| MARKERS.contains(&t)).count(), 2, "{e:?}");
            assert_eq!(e.label, u32::from(at(MARKERS[1]) < at(MARKERS[0])));
            assert!(e.tokens.iter().all(|&t| t != PAD && (t as usize) < 3 + FILLERS.len()));
            labels[e.label as usize] += 1;
        }
        assert!(labels.iter().all(|&n| n > 200), "{labels:?}");
        assert_eq!(example(&s, SALT_TRAIN, 7), example(&s, SALT_TRAIN, 7));
        assert_ne!(example(&s, SALT_TRAIN, 7), example(&s, SALT_TEST, 7));
        let text: Vec<String> = [1, 2, 3, 10, 0].into_iter().map(token_text).collect();
        assert_eq!(text, ["A", "B", "c", "j", "<pad>"]);
    }
}
