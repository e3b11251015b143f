//! What a model's heads do, read off its own attention weights (softmax, after masks), one
//! score per layer and head:
//!
//! - **sink**: the mean over queries `i ≥ 1` of the weight on position 0;
//! - **previous-token**: the mean over `i ≥ 1` of `A[i, i−1]`;
//! - **induction** (Olsson et al. 2022): on `R` random tokens repeated twice, the mean over the
//!   second half's queries `i` of `A[i, i − R + 1]` — the token that followed the current one's
//!   first occurrence.

use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};

/// A model whose attention weights can be read.
pub trait AttentionWeights: Sync {
    /// The weights `[H, L, L]` of every layer for the sequence `ids`.
    fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>>;
}

impl AttentionWeights for crate::Bert {
    fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>> {
        crate::Bert::attention_weights(self, ids)
    }
}

impl AttentionWeights for crate::CausalLm {
    fn attention_weights(&self, ids: &[u32]) -> Result<Vec<Tensor>> {
        crate::CausalLm::attention_weights(self, ids)
    }
}

/// `[layer][head]` scores.
pub type HeadMap = Vec<Vec<f64>>;

/// The mean over `queries` of `A[i, key(i)]`, per head, for each layer's weights `[H, L, L]`.
fn score(weights: &[Tensor], queries: std::ops::Range<usize>, key: impl Fn(usize) -> usize) -> Result<HeadMap> {
    weights
        .iter()
        .map(|w| {
            let (h, l, lk) = w.dims3()?;
            if queries.is_empty() || queries.end > l || l != lk {
                return Err(ModelError::Input(format!(
                    "head scores need queries {queries:?} within square weights, found [{h}, {l}, {lk}]"
                )));
            }
            let a: Vec<Vec<Vec<f32>>> = w.to_dtype(DType::F32)?.to_vec3()?;
            Ok(a.iter()
                .map(|rows| queries.clone().map(|i| f64::from(rows[i][key(i)])).sum::<f64>() / queries.len() as f64)
                .collect())
        })
        .collect()
}

/// Sink scores from the weights of a sequence of `L ≥ 2` tokens.
pub fn sink(weights: &[Tensor]) -> Result<HeadMap> {
    let l = weights.first().map_or(0, |w| w.dims().get(1).copied().unwrap_or(0));
    score(weights, 1..l, |_| 0)
}

/// Previous-token scores from the weights of a sequence of `L ≥ 2` tokens.
pub fn previous(weights: &[Tensor]) -> Result<HeadMap> {
    let l = weights.first().map_or(0, |w| w.dims().get(1).copied().unwrap_or(0));
    score(weights, 1..l, |i| i - 1)
}

/// Induction scores from the weights of `R` tokens repeated twice (`L = 2R`, `R ≥ 2`).
pub fn induction(weights: &[Tensor], r: usize) -> Result<HeadMap> {
    score(weights, r..2 * r, |i| i - r + 1)
}

/// `R` token ids uniform in `[1000, 10000)` from `seed` (SplitMix64), then the same `R` again.
pub fn induction_ids(r: usize, seed: u64) -> Vec<u32> {
    let mut rng = attn::random::SplitMix64::new(seed);
    let first: Vec<u32> = (0..r).map(|_| 1000 + (rng.next_u64() % 9000) as u32).collect();
    first.iter().chain(&first).copied().collect()
}

/// The three head maps of a model: from the weights of `text_ids`, and of `induction_ids`
/// (`R` tokens twice).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadScores {
    /// Sink scores on the text.
    pub sink: HeadMap,
    /// Previous-token scores on the text.
    pub previous: HeadMap,
    /// Induction scores on the repeated random tokens.
    pub induction: HeadMap,
}

impl HeadScores {
    /// Runs `model` on both sequences and scores every head; also returns the text's weights
    /// `[H, L, L]` per layer (to draw them without another pass).
    pub fn measure(
        model: &dyn AttentionWeights,
        text_ids: &[u32],
        induction_ids: &[u32],
    ) -> Result<(Self, Vec<Tensor>)> {
        if text_ids.len() < 2 {
            return Err(ModelError::Input(format!(
                "head scores need a text of at least 2 tokens, found {}",
                text_ids.len()
            )));
        }
        let r = induction_ids.len() / 2;
        if r < 2 || induction_ids[..r] != induction_ids[r..] {
            return Err(ModelError::Input("induction ids must be R ≥ 2 tokens repeated twice".into()));
        }
        let text = model.attention_weights(text_ids)?;
        let repeated = model.attention_weights(induction_ids)?;
        let scores = Self { sink: sink(&text)?, previous: previous(&text)?, induction: induction(&repeated, r)? };
        Ok((scores, text))
    }
}
