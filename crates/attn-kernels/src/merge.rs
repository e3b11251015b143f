//! Merging attention computed on disjoint shards of the keys: given each shard's normalised
//! output `O_s` and log-sum-exp `lse_s` for the same query rows, the exact result over all keys is
//! `lse = log Σ_s exp(lse_s)` and `O = Σ_s exp(lse_s − lse) · O_s`. A shard whose row was fully
//! masked (`lse_s = −∞`) contributes nothing; a row masked in every shard gives `O = 0`,
//! `lse = −∞`. This is the building block of split-KV decoding and of attention spread over
//! several workers or machines.
//!
//! Attention sinks ([`AttnParams::sinks`](crate::AttnParams)) belong to the whole row, not to a
//! shard: compute every shard **without** sinks, merge, then join the sinks once with
//! [`fold_sinks`]. Shards computed with sinks would each count `exp(sink)` in their denominator,
//! and the merge would count it once per shard.

use crate::error::{AttnError, Result};
use crate::lse::{join_sink, lse_parts};

/// One shard's partial result: `out: [rows, Dv]`, `lse: [rows]` (natural log).
#[derive(Debug, Clone, Copy)]
pub struct Partial<'a> {
    /// Normalised output over the shard's keys.
    pub out: &'a [f32],
    /// Log-sum-exp over the shard's keys.
    pub lse: &'a [f32],
}

/// Merges shard results into `out: [rows, Dv]` and `lse: [rows]`. Every partial must have
/// `rows · dv` outputs and `rows` log-sum-exps.
pub fn merge_partials(parts: &[Partial], dv: usize, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    let rows = lse.len();
    if out.len() != rows * dv {
        return Err(AttnError::Output { tensor: "out", expected: rows * dv, found: out.len() });
    }
    for p in parts {
        if p.lse.len() != rows {
            return Err(AttnError::Output { tensor: "partial lse", expected: rows, found: p.lse.len() });
        }
        if p.out.len() != rows * dv {
            return Err(AttnError::Output { tensor: "partial out", expected: rows * dv, found: p.out.len() });
        }
    }
    for r in 0..rows {
        let shards = parts.iter().map(|p| (p.lse[r], 0.0, &p.out[r * dv..(r + 1) * dv]));
        (lse[r], _) = merge_row(shards, &mut out[r * dv..(r + 1) * dv]);
    }
    Ok(())
}

/// Joins per-query-head sink logits `sinks: [Hq]` to complete results laid out `[B, Hq, Lq]`:
/// `out: [B, Hq, Lq, Dv]` and `lse: [B, Hq, Lq]` over all keys without sinks (from one call, or
/// merged from shards by [`merge_partials`]) become the results with the sinks, as one call with
/// [`AttnParams::sinks`](crate::AttnParams) gives them: `lse' = logaddexp(lse, sink_h)` and
/// `out' = out · exp(lse − lse')`. A row with no key (`lse = −∞`) gets `lse' = sink_h` and keeps
/// `out = 0`; a −∞ sink leaves its head's rows unchanged. Sinks must be finite or −∞ and `lse`
/// must hold a multiple of `Hq · Lq` rows.
pub fn fold_sinks(sinks: &[f32], lq: usize, dv: usize, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    let rows = lse.len();
    if let Some((h, x)) = sinks.iter().enumerate().find(|(_, x)| x.is_nan() || **x == f32::INFINITY) {
        return Err(AttnError::Param {
            field: "sinks",
            reason: format!("entry {h} is {x}; expected a finite logit, or -inf for no sink"),
        });
    }
    let per_batch = sinks.len() * lq;
    if (per_batch == 0 && rows != 0) || (per_batch != 0 && !rows.is_multiple_of(per_batch)) {
        return Err(AttnError::Layout {
            tensor: "lse",
            reason: format!("{rows} rows, not a multiple of Hq·Lq = {} · {lq}", sinks.len()),
        });
    }
    if out.len() != rows * dv {
        return Err(AttnError::Output { tensor: "out", expected: rows * dv, found: out.len() });
    }
    fold_sink_rows(sinks, lq, SinkRows { out, dv, lse, residue: None, weights: None });
    Ok(())
}

/// The rows of results `[B, Hq, Lq]` that [`fold_sink_rows`] rewrites.
pub(crate) struct SinkRows<'a> {
    /// `[rows, Dv]`.
    pub out: &'a mut [f32],
    pub dv: usize,
    /// `[rows]`.
    pub lse: &'a mut [f32],
    /// `[rows]`, the rounding residues of `lse`, when kept.
    pub residue: Option<&'a mut [f32]>,
    /// `[rows, Lk]` and `Lk`, when asked for.
    pub weights: Option<(&'a mut [f32], usize)>,
}

/// [`fold_sinks`] without the checks, also rewriting the log-sum-exps' residues and the weights:
/// row `r` belongs to head `r / lq % Hq`; a −∞ sink leaves its rows untouched (bit for bit).
pub(crate) fn fold_sink_rows(sinks: &[f32], lq: usize, rows: SinkRows) {
    let SinkRows { out, dv, lse, mut residue, mut weights } = rows;
    for (r, l) in lse.iter_mut().enumerate() {
        let sink = sinks[r / lq % sinks.len()];
        if sink == f32::NEG_INFINITY {
            continue;
        }
        let lo = residue.as_deref().map_or(0.0, |x| x[r]);
        let (hi, lo, keep) = join_sink(*l, lo, sink);
        *l = hi;
        if let Some(res) = residue.as_deref_mut() {
            res[r] = lo;
        }
        out[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= keep);
        if let Some((w, lk)) = weights.as_mut() {
            w[r * *lk..(r + 1) * *lk].iter_mut().for_each(|x| *x *= keep);
        }
    }
}

/// Merges one row from `(lse_s, residue_s, O_s)` triples (each shard's log-sum-exp is
/// `lse_s + residue_s`) into `out`; returns the merged log-sum-exp and its residue.
pub(crate) fn merge_row<'a>(parts: impl Iterator<Item = (f32, f32, &'a [f32])> + Clone, out: &mut [f32]) -> (f32, f32) {
    let m = parts.clone().fold(f32::NEG_INFINITY, |m, (l, _, _)| if l > m || l.is_nan() { l } else { m });
    out.fill(0.0);
    if m == f32::NEG_INFINITY {
        return (f32::NEG_INFINITY, 0.0);
    }
    let weight = |l: f32, lo: f32| ((l - m) + lo).exp();
    let total: f32 = parts.clone().map(|(l, lo, _)| weight(l, lo)).sum();
    for (l, lo, o) in parts {
        if l == f32::NEG_INFINITY {
            continue;
        }
        let wgt = weight(l, lo) / total;
        for (x, &y) in out.iter_mut().zip(o) {
            *x += wgt * y;
        }
    }
    lse_parts(m, total)
}
