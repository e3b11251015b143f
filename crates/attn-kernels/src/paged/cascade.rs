//! Cascade attention (FlashInfer's): sequences sharing a prefix (a system prompt, few-shot
//! examples) attend to it in one pass — every query row of every sharing sequence against the
//! prefix at once, the rows of the query heads that share a key/value head stacked into one
//! matrix, run by the flash forward kernel (prefill-shaped: each prefix key read once for the
//! whole batch) on the pages in place when they are consecutive and unquantized, else on the
//! prefix gathered and dequantized — and to their own suffix pages in a second, paged call; the
//! two halves are merged by their log-sum-exps ([`merge_partials`]), which is exact.

use crate::error::{AttnError, Result};
use crate::merge::{fold_sinks, merge_partials, Partial};
use crate::paged::{paged_attention, PagedKv, PagedParams, Pages};
use crate::view::View4;
use crate::{attention, AttnParams, Isa, Kernel, KvView};

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
    // Query heads sharing a key/value head are consecutive in `qp`: as `[1, Hkv, G·B·Lq, Dk]` they
    // are one matrix of rows per key/value head, the flash forward's prefill shape.
    let (hkv, n) = (prefix.heads, prefix.check(1)?[0]);
    let qf = View4::contiguous("q", &qp, [1, hkv, hq / hkv * rows, dk])?;
    let shared = AttnParams { scale: p.scale, softcap: p.softcap, ..Default::default() };
    let gathered;
    let (kview, vview) = match dense_prefix(prefix, n)? {
        Some(views) => views,
        None => {
            gathered = prefix.gather(0);
            (
                KvView::F32(View4::contiguous("prefix k", &gathered.0, [1, hkv, n, dk])?),
                KvView::F32(View4::contiguous("prefix v", &gathered.1, [1, hkv, n, dv])?),
            )
        }
    };
    let r = attention(Kernel::Flash(Isa::best()), &qf, &kview, &vview, &shared, false)?;
    let (po, pl) = (r.out, r.lse);
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

/// The prefix's keys and values as `[1, Hkv, n, D]` views of the pages themselves, when its pages
/// are consecutive in the storage and unquantized (`None` otherwise: the caller gathers them).
fn dense_prefix<'a>(prefix: &PagedKv<'a>, n: usize) -> Result<Option<(KvView<'a>, KvView<'a>)>> {
    let pages = n.div_ceil(prefix.page_size);
    let table = &prefix.block_table[..pages.min(prefix.block_table.len())];
    if n == 0 || table.windows(2).any(|w| w[1] != w[0] + 1) {
        return Ok(None);
    }
    let first = table[0] as usize * prefix.page_size;
    let view = |pages: &Pages<'a>, d: usize, name| -> Result<Option<KvView<'a>>> {
        let (start, dims, strides) = (first * prefix.heads * d, [1, prefix.heads, n, d], [0, d, prefix.heads * d]);
        Ok(Some(match *pages {
            Pages::F32(x) => KvView::F32(View4::strided(name, &x[start..], dims, strides)?),
            Pages::F16(x) => KvView::F16(View4::strided(name, &x[start..], dims, strides)?),
            Pages::Bf16(x) => KvView::Bf16(View4::strided(name, &x[start..], dims, strides)?),
            _ => return Ok(None),
        }))
    };
    Ok(view(&prefix.k, prefix.dk, "prefix k")?.zip(view(&prefix.v, prefix.dv, "prefix v")?))
}
