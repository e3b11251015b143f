//! What a decoder does with a prompt: greedy decoding with the KV cache (argmax, ties to the
//! lower id), streamed token by token, of one prompt or of several decoded as one batch, and the
//! perplexity of a text in one causal pass.

use std::time::Instant;

use candle_core::{DType, Tensor};

use crate::causal_lm::CausalLm;
use crate::error::{ModelError, Result};

/// A finished greedy generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The new ids (the stop token included when it ended the generation).
    pub ids: Vec<u32>,
    /// Seconds spent on the prompt's prefill (its first new token included).
    pub prefill_secs: f64,
    /// Seconds spent decoding the tokens after the first.
    pub decode_secs: f64,
}

/// When greedy decoding stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stop {
    /// At most this many new tokens.
    pub max_new_tokens: usize,
    /// Stop after this id (the end-of-sequence token), if any.
    pub eos: Option<u32>,
}

/// The index of the largest value, the lowest index among equals.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
}

fn last_row(logits: &Tensor) -> Result<Vec<f32>> {
    let l = logits.dim(0)?;
    Ok(logits.get(l - 1)?.to_dtype(DType::F32)?.to_vec1()?)
}

/// Greedy decoding of `prompt`: one prefill, then one token at a time against the cache;
/// `on_token` sees every new id as it comes (to stream it). [`greedy_batch`] of one prompt.
pub fn greedy(
    model: &CausalLm,
    prompt: &[u32],
    stop: Stop,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    let mut one = greedy_batch(model, &[prompt.to_vec()], stop, |_, id| on_token(id))?;
    Ok(one.pop().expect("one prompt, one generation"))
}

/// Greedy decoding of several prompts: each prompt's own prefill, then one batched step per
/// token for every sequence still going (a sequence leaves the batch after its stop token);
/// `on_token(b, id)` sees sequence `b`'s ids as they come. Each result's times are the batch's:
/// all prefills, and the batched steps.
pub fn greedy_batch(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    stop: Stop,
    mut on_token: impl FnMut(usize, u32) -> Result<()>,
) -> Result<Vec<Generation>> {
    if let Some(b) = prompts.iter().position(Vec::is_empty) {
        return Err(ModelError::Input(format!("prompt {b} has no tokens")));
    }
    let start = Instant::now();
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect::<Result<_>>()?;
    let mut ids: Vec<Vec<u32>> = vec![Vec::with_capacity(stop.max_new_tokens); prompts.len()];
    let mut next = Vec::with_capacity(prompts.len());
    for (prompt, cache) in prompts.iter().zip(&mut caches) {
        next.push(
            argmax(&last_row(&model.forward_last(prompt, cache)?)?)
                .ok_or_else(|| ModelError::Input("the model has no vocabulary".into()))?,
        );
    }
    let prefill_secs = start.elapsed().as_secs_f64();
    let mut active: Vec<usize> = if stop.max_new_tokens == 0 { vec![] } else { (0..prompts.len()).collect() };
    while !active.is_empty() {
        for (slot, &b) in active.iter().enumerate() {
            ids[b].push(next[slot]);
            on_token(b, next[slot])?;
        }
        let going: Vec<usize> = (0..active.len())
            .filter(|&slot| Some(next[slot]) != stop.eos && ids[active[slot]].len() < stop.max_new_tokens)
            .collect();
        if going.is_empty() {
            break;
        }
        let tokens: Vec<u32> = going.iter().map(|&slot| next[slot]).collect();
        active = going.iter().map(|&slot| active[slot]).collect();
        let mut batch: Vec<_> = active.iter().map(|&b| std::mem::take(&mut caches[b])).collect();
        let logits = model.decode_batch(&tokens, &mut batch)?;
        for (&b, cache) in active.iter().zip(batch) {
            caches[b] = cache;
        }
        let rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
        next = rows
            .iter()
            .map(|r| argmax(r).ok_or_else(|| ModelError::Input("the model has no vocabulary".into())))
            .collect::<Result<_>>()?;
    }
    let decode_secs = start.elapsed().as_secs_f64() - prefill_secs;
    Ok(ids.into_iter().map(|ids| Generation { ids, prefill_secs, decode_secs }).collect())
}

/// The mean negative log-likelihood (natural log) of `ids[1..]`, each given those before it,
/// from one causal pass; the perplexity is its `exp`.
pub fn mean_nll(model: &CausalLm, ids: &[u32]) -> Result<f64> {
    if ids.len() < 2 {
        return Err(ModelError::Input(format!("perplexity needs at least 2 tokens, found {}", ids.len())));
    }
    let logits = model.forward(ids, &mut model.new_cache()?)?.to_dtype(DType::F32)?;
    let rows: Vec<Vec<f32>> = logits.to_vec2()?;
    let total: f64 = rows
        .iter()
        .zip(&ids[1..])
        .map(|(row, &next)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            max + sum.ln() - row[next as usize] as f64
        })
        .sum();
    Ok(total / (ids.len() - 1) as f64)
}
