//! Merging attention computed on disjoint shards of the keys: given each shard's normalised
//! output `O_s` and log-sum-exp `lse_s` for the same query rows, the exact result over all keys is
//! `lse = log Σ_s exp(lse_s)` and `O = Σ_s exp(lse_s − lse) · O_s`. A shard whose row was fully
//! masked (`lse_s = −∞`) contributes nothing; a row masked in every shard gives `O = 0`,
//! `lse = −∞`. This is the building block of split-KV decoding and of attention spread over
//! several workers or machines.

use crate::error::{AttnError, Result};
use crate::lse::lse_parts;

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
