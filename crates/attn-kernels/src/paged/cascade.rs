//! Cascade attention (FlashInfer's): sequences sharing a prefix (a system prompt, few-shot
//! examples) attend to it in one pass — every query row of every sharing sequence against the
//! prefix's pages at once, so each prefix key is read once for the whole batch and meets a
//! matrix of query rows instead of one row per sequence — and to their own suffix pages in a
//! second, paged call; the two halves are merged by their log-sum-exps
//! ([`merge_partials`]), which is exact.

use crate::error::{AttnError, Result};
use crate::merge::{fold_sinks, merge_partials, Partial};
use crate::paged::{paged_attention, PagedKv, PagedParams};
use crate::view::View4;

/// `out: [B, Hq, Lq, Dv]` and `lse: [B, Hq, Lq]` of `q: [B, Hq, Lq, Dk]` against, for each
/// sequence `b`, the shared `prefix` (one sequence: its block table one row, `seqlens` its
/// length) followed by its own suffix (`suffix`, `B` sequences; `seqlens` the suffix lengths,
/// the new queries' included) — equal to [`paged_attention`] over the concatenated cache. Every
/// prefix key precedes every query, so causality bites in the suffix only (aligned bottom-right
/// there); windows, which would reach back into the prefix by position, are refused.
pub fn cascade_attention(
    q: &View4<f32>,
    prefix: &PagedKv,
    suffix: &PagedKv,
    p: &PagedParams,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    if p.window.is_some() {
        return Err(AttnError::Param {
            field: "window",
            reason: "not supported by cascade attention (attend the flat cache instead)".into(),
        });
    }
    if prefix.seqlens.len() != 1 {
        return Err(AttnError::DimMismatch {
            tensor: "prefix seqlens",
            dim: "B",
            expected: 1,
            found: prefix.seqlens.len(),
        });
    }
    if (prefix.heads, prefix.dk, prefix.dv) != (suffix.heads, suffix.dk, suffix.dv) {
        return Err(AttnError::Param {
            field: "prefix",
            reason: format!(
                "Hkv {}, Dk {}, Dv {}; the suffix cache has Hkv {}, Dk {}, Dv {}",
                prefix.heads, prefix.dk, prefix.dv, suffix.heads, suffix.dk, suffix.dv
            ),
        });
    }
    let [b, hq, lq, dk] = q.dims();
    if let Some(short) = suffix.seqlens.iter().position(|&n| p.causal && (n as i64) < lq as i64) {
        return Err(AttnError::Param {
            field: "cache_seqlens",
            reason: format!(
                "suffix {short} holds {} positions, fewer than its {lq} queries (queries must lie in the suffix)",
                suffix.seqlens[short]
            ),
        });
    }
    let dv = suffix.dv;
    // The suffix pass: each sequence's own keys, causal as asked; sinks wait for the merge.
    let own = PagedParams { sinks: None, ..*p };
    let mut so = vec![0.0f32; b * hq * lq * dv];
    let mut sl = vec![0.0f32; b * hq * lq];
    paged_attention(q, suffix, &own, &mut so, &mut sl)?;
    // The prefix pass: the batch's rows as one sequence's `B·Lq` queries per head, `[1, Hq, B·Lq,
    // Dk]`, none masked (the prefix precedes them all).
    let rows = b * lq;
    let mut qp = vec![0.0f32; hq * rows * dk];
    for h in 0..hq {
        for s in 0..b {
            for i in 0..lq {
                qp[(h * rows + s * lq + i) * dk..][..dk].copy_from_slice(q.row(s, h, i));
            }
        }
    }
    let shared = PagedParams { causal: false, sinks: None, ..*p };
    let mut po = vec![0.0f32; hq * rows * dv];
    let mut pl = vec![0.0f32; hq * rows];
    paged_attention(&View4::contiguous("q", &qp, [1, hq, rows, dk])?, prefix, &shared, &mut po, &mut pl)?;
    // Back to `[B, Hq, Lq]` order, then merged with the suffix halves.
    let mut ro = vec![0.0f32; so.len()];
    let mut rl = vec![0.0f32; sl.len()];
    for h in 0..hq {
        for s in 0..b {
            for i in 0..lq {
                let (from, to) = (h * rows + s * lq + i, (s * hq + h) * lq + i);
                ro[to * dv..][..dv].copy_from_slice(&po[from * dv..][..dv]);
                rl[to] = pl[from];
            }
        }
    }
    let parts = [Partial { out: &so, lse: &sl }, Partial { out: &ro, lse: &rl }];
    merge_partials(&parts, dv, out, lse)?;
    if let Some(sinks) = p.sinks {
        fold_sinks(sinks, lq, dv, out, lse)?;
    }
    Ok(())
}
