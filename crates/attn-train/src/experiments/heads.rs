//! What the heads of a trained translator attend to. The model reads held-out pairs of its own
//! task teacher-forced (one forward pass, evaluation mode, per-head weights), and for every layer
//! and head this measures, over the real (non-padding) query rows:
//!
//! - the mean attention distance `Σ_j w_ij·|i − j|`, for the encoder's and the decoder's
//!   self-attention (a head that looks at its neighbours scores near 1, one that reads the whole
//!   sequence near a third of its length);
//! - the mean entropy `−Σ_j w_ij·ln w_ij` in nats (0: one key; `ln m`: uniform over `m` keys), for
//!   those and for the decoder's cross-attention.
//!
//! For each kind of attention the report also gives what uniform attention over the same allowed
//! keys would score (padding excluded, causal for the decoder), the reference a learned head is
//! read against. One pair's weights per kind and layer come back for drawing, `[H, Lq, Lk]` with
//! the tokens as labels and which cells the masks allow.

use attn::SdpaOptions;
use attn_nn::{NeedWeights, Run};
use candle_core::{Device, Tensor};

use super::entropy;
use crate::data::{vocab, Batch, Pair};
use crate::error::{Result, TrainError};
use crate::task::Task;
use crate::translate::{token_text, Translator};

/// Pairs run through the model at once.
const CHUNK: usize = 250;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsSettings {
    /// Held-out pairs measured (all of them when fewer are held out).
    pub samples: usize,
    /// Which of those pairs' weights come back for drawing (0-based).
    pub example: usize,
}

/// One of the model's three kinds of attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    /// Encoder self-attention over the source (padding masked).
    EncoderSelf,
    /// Decoder self-attention over the target so far (causal).
    DecoderSelf,
    /// Decoder cross-attention over the source.
    Cross,
}

impl AttentionKind {
    /// Every kind, in the report's order.
    pub const ALL: [AttentionKind; 3] = [AttentionKind::EncoderSelf, AttentionKind::DecoderSelf, AttentionKind::Cross];

    /// A short name: `encoder`, `decoder`, `cross`.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKind::EncoderSelf => "encoder",
            AttentionKind::DecoderSelf => "decoder",
            AttentionKind::Cross => "cross",
        }
    }

    /// Whether query and key positions index the same sequence (so a distance means something).
    pub fn is_self(self) -> bool {
        self != AttentionKind::Cross
    }
}

/// Means over the real query rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PatternStats {
    /// Mean attention distance in positions; `None` for cross-attention.
    pub distance: Option<f64>,
    /// Mean entropy in nats.
    pub entropy: f64,
}

/// One head's statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadRow {
    /// Which attention.
    pub kind: AttentionKind,
    /// Layer, 0-based.
    pub layer: usize,
    /// Head, 0-based.
    pub head: usize,
    /// Its means.
    pub stats: PatternStats,
}

/// One example's weights of one kind and layer, every head.
#[derive(Debug, Clone)]
pub struct ExampleGrid {
    /// Which attention.
    pub kind: AttentionKind,
    /// Layer, 0-based.
    pub layer: usize,
    /// `[H, Lq, Lk]`, row-major.
    pub weights: Vec<f32>,
    /// `[H, Lq, Lk]` like `weights`: whether the query may attend to the key (false above the
    /// diagonal of the decoder's causal self-attention and at padding keys), for drawing the
    /// masked cells as masked rather than as weight 0.
    pub keep: Vec<bool>,
    /// `Lq` labels.
    pub query_tokens: Vec<String>,
    /// `Lk` labels.
    pub key_tokens: Vec<String>,
}

/// The experiment's result.
#[derive(Debug, Clone)]
pub struct HeadsReport {
    /// Pairs measured.
    pub samples: usize,
    /// Heads per layer.
    pub heads: usize,
    /// Per kind, layer and head, in that order.
    pub rows: Vec<HeadRow>,
    /// Per kind, uniform attention over the same keys and rows.
    pub uniform: Vec<(AttentionKind, PatternStats)>,
    /// The example pair.
    pub example: Pair,
    /// Its weights per kind and layer.
    pub grids: Vec<ExampleGrid>,
}

/// Sums over query rows.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    distance: f64,
    entropy: f64,
    rows: usize,
}

impl Sums {
    fn mean(&self, kind: AttentionKind) -> PatternStats {
        let n = self.rows.max(1) as f64;
        PatternStats { distance: kind.is_self().then_some(self.distance / n), entropy: self.entropy / n }
    }
}

/// The pairs to measure, checked against the settings before any work.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The first `samples` held-out pairs of the checkpoint's task.
    pub pairs: Vec<Pair>,
    /// The index of the pair to draw.
    pub example: usize,
}

/// The first `settings.samples` held-out pairs of the task `translator` was trained on (the
/// dates task's held-out dates, or the held-out part of a pairs file, which is read again from the
/// path it was trained from, refused if its contents changed since); refuses zero samples and an example outside them, naming the field.
pub fn sample(translator: &Translator, settings: &HeadsSettings) -> Result<Sample> {
    if settings.samples == 0 {
        return Err(TrainError::Setting { field: "samples", reason: "must be positive".into() });
    }
    let manifest = translator.manifest();
    let task = Task::open(&manifest.train, manifest.model.max_len)?;
    task.check_unchanged(manifest)?;
    let mut pairs = task.held_out();
    pairs.truncate(settings.samples);
    if settings.example >= pairs.len() {
        return Err(TrainError::Setting {
            field: "example",
            reason: format!("{} is not below the {} pairs measured", settings.example, pairs.len()),
        });
    }
    Ok(Sample { pairs, example: settings.example })
}

/// Measures the heads of `translator` on `sample`.
pub fn run(translator: &Translator, sample: &Sample) -> Result<HeadsReport> {
    let (pairs, manifest) = (&sample.pairs, translator.manifest());
    let (layers, heads) = (manifest.model.layers, manifest.model.heads);
    let mut sums = vec![Sums::default(); AttentionKind::ALL.len() * layers * heads];
    let mut uniform = [Sums::default(); 3];
    for chunk in pairs.chunks(CHUNK) {
        for w in weights(translator, chunk)? {
            let at = (w.kind as usize * layers + w.layer) * heads;
            accumulate(&w, &mut sums[at..at + heads]);
            if w.layer == 0 {
                accumulate_uniform(&w, &mut uniform[w.kind as usize]);
            }
        }
    }
    let rows = AttentionKind::ALL
        .iter()
        .flat_map(|&kind| (0..layers).flat_map(move |layer| (0..heads).map(move |head| (kind, layer, head))))
        .zip(&sums)
        .map(|((kind, layer, head), s)| HeadRow { kind, layer, head, stats: s.mean(kind) })
        .collect();
    let uniform = AttentionKind::ALL.iter().map(|&k| (k, uniform[k as usize].mean(k))).collect();
    let example = pairs[sample.example].clone();
    let grids = example_grids(translator, &example)?;
    Ok(HeadsReport { samples: pairs.len(), heads, rows, uniform, example, grids })
}

/// One kind's and layer's weights on a batch of pairs.
struct Weights {
    kind: AttentionKind,
    layer: usize,
    /// `[B, H, Lq, Lk]`, row-major.
    values: Vec<f32>,
    /// `[B][Lq]` query ids.
    queries: Vec<Vec<u32>>,
    /// `[B][Lk]` key ids.
    keys: Vec<Vec<u32>>,
    /// `[B, Lq, Lk]`: whether the query may attend the key (the same for every head).
    keep: Vec<u8>,
}

impl Weights {
    /// Row `i` of head `h` of sequence `b`.
    fn row(&self, heads: usize, b: usize, h: usize, i: usize) -> &[f32] {
        let (lq, lk) = (self.queries[b].len(), self.keys[b].len());
        let at = ((b * heads + h) * lq + i) * lk;
        &self.values[at..at + lk]
    }

    /// Whether query `i` of sequence `b` may attend key `j`.
    fn allowed(&self, b: usize, i: usize, j: usize) -> bool {
        let (lq, lk) = (self.queries[b].len(), self.keys[b].len());
        self.keep[(b * lq + i) * lk + j] != 0
    }
}

/// Every kind's and layer's weights on `pairs`.
fn weights(translator: &Translator, pairs: &[Pair]) -> Result<Vec<Weights>> {
    let batch = Batch::new(pairs, translator.vocab(), &Device::Cpu)?;
    let out = translator.model().forward(&batch.src, &batch.tgt_in, Run::eval().with_weights(NeedWeights::PerHead))?;
    let (src, tgt) = (batch.src.to_vec2::<u32>()?, batch.tgt_in.to_vec2::<u32>()?);
    let mut all = Vec::new();
    for (kind, tensors, queries, (keys, key_ids)) in [
        (AttentionKind::EncoderSelf, &out.encoder_weights, &src, (&src, &batch.src)),
        (AttentionKind::DecoderSelf, &out.decoder.self_weights, &tgt, (&tgt, &batch.tgt_in)),
        (AttentionKind::Cross, &out.decoder.cross_weights, &tgt, (&src, &batch.src)),
    ] {
        let keep = keep_mask(kind, key_ids, queries.len(), queries[0].len())?;
        for (layer, w) in tensors.iter().enumerate() {
            let values = w.flatten_all()?.to_vec1::<f32>()?;
            let (queries, keys, keep) = (queries.clone(), keys.clone(), keep.clone());
            all.push(Weights { kind, layer, values, queries, keys, keep });
        }
    }
    Ok(all)
}

/// The keep-mask `[B, Lq, Lk]` of `kind` over `key_ids: [B, Lk]`, by the library's own rule
/// ([`SdpaOptions::keep_mask`]) for the masks the model applies: padding keys masked, and causal
/// (top-left) for the decoder's self-attention.
fn keep_mask(kind: AttentionKind, key_ids: &Tensor, b: usize, lq: usize) -> Result<Vec<u8>> {
    let opts = SdpaOptions::default()
        .causal(kind == AttentionKind::DecoderSelf)
        .mask(attn::padding_mask(key_ids, vocab::PAD)?);
    Ok(opts.keep_mask(b, 1, lq, key_ids.dims()[1])?.flatten_all()?.to_vec1::<u8>()?)
}

/// The real (non-padding) query positions of sequence `b`.
fn real_rows(w: &Weights, b: usize) -> impl Iterator<Item = usize> + '_ {
    w.queries[b].iter().enumerate().filter(|(_, &id)| id != vocab::PAD).map(|(i, _)| i)
}

/// Adds the real query rows of every head of `w` to the per-head `sums`.
fn accumulate(w: &Weights, sums: &mut [Sums]) {
    let heads = sums.len();
    for b in 0..w.queries.len() {
        for (h, s) in sums.iter_mut().enumerate() {
            for i in real_rows(w, b) {
                let row = w.row(heads, b, h, i);
                s.distance += row.iter().enumerate().map(|(j, &x)| f64::from(x) * i.abs_diff(j) as f64).sum::<f64>();
                s.entropy += entropy(row.iter().map(|&x| f64::from(x)));
                s.rows += 1;
            }
        }
    }
}

/// Adds what uniform attention over the allowed keys would score on the real query rows of `w`.
fn accumulate_uniform(w: &Weights, s: &mut Sums) {
    for b in 0..w.queries.len() {
        for i in real_rows(w, b) {
            let allowed: Vec<usize> = (0..w.keys[b].len()).filter(|&j| w.allowed(b, i, j)).collect();
            let m = allowed.len().max(1) as f64;
            s.distance += allowed.iter().map(|&j| i.abs_diff(j) as f64).sum::<f64>() / m;
            s.entropy += m.ln();
            s.rows += 1;
        }
    }
}

/// The weights of `pair` alone (no padding) per kind and layer, labelled by its tokens.
fn example_grids(translator: &Translator, pair: &Pair) -> Result<Vec<ExampleGrid>> {
    let labels = |ids: &[u32]| ids.iter().map(|&id| token_text(translator.vocab(), id)).collect::<Vec<_>>();
    weights(translator, std::slice::from_ref(pair))?
        .into_iter()
        .map(|w| {
            let (lq, keys) = (w.queries[0].len(), &w.keys[0]);
            let heads = w.values.len() / (lq * keys.len()).max(1);
            let keep = (0..heads * lq * keys.len()).map(|x| w.keep[x % (lq * keys.len())] != 0).collect();
            Ok(ExampleGrid {
                kind: w.kind,
                layer: w.layer,
                query_tokens: labels(&w.queries[0]),
                key_tokens: labels(keys),
                weights: w.values,
                keep,
            })
        })
        .collect()
}
