//! Packed variable-length sequences, shaped like FlashAttention's `flash_attn_varlen_func`:
//! `q: [total_q, Hq, Dk]`, `k: [total_k, Hkv, Dk]`, `v: [total_k, Hkv, Dv]` hold `B` sequences one
//! after another with no padding, cut by [`CuSeqlens`] (`cu_seqlens_q`, `cu_seqlens_k`, `[B + 1]`).
//! Sequence `s` attends only within itself: its queries `cu_seqlens_q[s]..cu_seqlens_q[s + 1]` see
//! its keys `cu_seqlens_k[s]..cu_seqlens_k[s + 1]`, and its lengths `Lq_s`, `Lk_s` may differ.
//!
//! Semantics per sequence are those of [`attention`] on the sequence alone (`B = 1`, `Lq = Lq_s`,
//! `Lk = Lk_s`): causal masking, the window and their alignment apply within each sequence (so
//! bottom-right aligns each sequence's last query with its own last key), as do scale, soft-cap,
//! grouped-query heads, `f16`/`bf16` keys and values and bf16 products (`compute`, forward and
//! backward: each sequence bit for bit the dense call on it alone, whose plan — prefill or decode —
//! follows from the sequence's own lengths), and attention sinks (`sinks: [Hq]`, the same logits
//! joining every sequence's rows; their gradient `dsinks` is the sum of the sequences'). Element
//! masks (`keep`, `bias`), block masks and `key_lengths` have no packed form, and score
//! modifications are not supported yet: all are refused ([`AttnError::Param`] naming the field:
//! `mask`, `bias`, `block_mask`, `key_lengths`, `score_mod`).
//!
//! Results: `out: [total_q, Hq, Dv]` and, FlashAttention's convention, `lse: [Hq, total_q]`
//! (head-major, the rows of every sequence side by side). A sequence with no keys gets output 0
//! and log-sum-exp −∞, like a fully masked row (with sinks, its head's sink logit, as a dense call
//! with no keys gives).
//!
//! Dropout: sequence `s` is keyed as a call of its own whose seed is
//! [`Dropout::for_sequence`]`(s)`, its rows `(h, i)` then keyed as in that call (batch 0, query `i`
//! counted from the sequence's start). So the decisions of a sequence depend on the seed, its
//! index and its lengths only — not on where it sits in the packed buffer or on the other
//! sequences — and the backward replays them.
//!
//! How it runs: each sequence is one call of the dense kernels. The sequences are rayon tasks and
//! each call spreads over rayon's threads itself, so threads left idle by a short sequence's few
//! jobs (or by a thread the system took away) take other sequences' work, and no sequence waits
//! for the one before. The tensors the kernels read tile after tile are
//! gathered head-major into buffers reused from sequence to sequence (`[1, H, len, D]`, the layout
//! the kernels read fastest; see `Packed::gather`), the others read through strided views, and the
//! call's results `[1, Hq, len, Dv]` are copied into the packed layout. No padding exists, so no work goes to it, and the extra memory is one
//! sequence's inputs and results.

mod backward;
mod packed;
mod pool;

use std::ops::Range;

pub use backward::{attention_varlen_backward, VarlenSaved};
use packed::{scatter_rows, KvBuf};
pub use packed::{CuSeqlens, Packed, PackedKv};
use pool::Pool;
use rayon::prelude::*;

use crate::alloc;
use crate::dispatch::{attention, Kernel};
use crate::dropout::Dropout;
use crate::error::{AttnError, Result};
use crate::problem::{AttnParams, Problem};
use crate::rng::splitmix64;

/// The forward's gathered values, kept for the next sequence and call.
static VALUES: Pool<KvBuf> = Pool::new();

/// A sequence's `(query rows, key rows)`.
type Rows = (Range<usize>, Range<usize>);

/// `buf` cut into consecutive parts of `len(seq)` elements, one per sequence (the sequences' rows
/// are consecutive from 0, so each part holds its sequence's rows of a packed tensor).
fn split_rows<'b>(mut buf: &'b mut [f32], seqs: &[Rows], len: impl Fn(&Rows) -> usize) -> Vec<&'b mut [f32]> {
    seqs.iter()
        .map(|s| {
            let (part, rest) = std::mem::take(&mut buf).split_at_mut(len(s));
            buf = rest;
            part
        })
        .collect()
}

/// Results of a packed call.
#[derive(Debug, Clone, PartialEq)]
pub struct VarlenOutput {
    /// `[total_q, Hq, Dv]`.
    pub out: Vec<f32>,
    /// Natural log-sum-exp per row, `[Hq, total_q]`; −∞ for a row with no allowed key.
    pub lse: Vec<f32>,
    /// The rounding residue of each `lse` ([`AttnOutput::lse_residue`](crate::AttnOutput)),
    /// `[Hq, total_q]`; hand it to the backward.
    pub lse_residue: Vec<f32>,
}

impl Dropout {
    /// The dropout of sequence `s` of a packed call: the same `p`, the seed
    /// `splitmix64(seed ^ splitmix64(s))`.
    pub fn for_sequence(&self, s: usize) -> Dropout {
        Dropout { p: self.p, seed: splitmix64(self.seed ^ splitmix64(s as u64)) }
    }
}

/// A validated packed call: sizes and every sequence's query and key rows.
struct Call {
    /// `total_q, Hq, Hkv, Dk, Dv`.
    total_q: usize,
    hq: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    total_k: usize,
    /// `(query rows, key rows)` per sequence.
    seqs: Vec<Rows>,
}

impl Call {
    /// Checks the packed shapes, the offsets and the options against each other.
    fn new(q: [usize; 3], k: [usize; 3], v: [usize; 3], cu: &CuSeqlens, p: &AttnParams<f32>) -> Result<Call> {
        let [total_q, hq, dk] = q;
        let [total_k, hkv, kd] = k;
        let [vt, vh, dv] = v;
        for (tensor, dim, expected, found) in
            [("k", "head_dim", dk, kd), ("v", "heads", hkv, vh), ("v", "total", total_k, vt)]
        {
            if expected != found {
                return Err(AttnError::DimMismatch { tensor, dim, expected, found });
            }
        }
        let no_packed_form = "packed sequences take no element-wise or block masks or key lengths; cu_seqlens_k \
                              sets each sequence's keys";
        let not_yet = "packed sequences take no score modification yet";
        for (field, given, reason) in [
            ("key_lengths", p.mask.key_lengths.is_some(), no_packed_form),
            ("mask", p.mask.keep.is_some(), no_packed_form),
            ("bias", p.mask.bias.is_some(), no_packed_form),
            ("block_mask", p.mask.block.is_some(), no_packed_form),
            ("score_mod", p.score_mod.is_some(), not_yet),
        ] {
            if given {
                return Err(AttnError::Param { field, reason: reason.into() });
            }
        }
        // Heads, scale, soft-cap and dropout, checked as a dense call checks them.
        Problem::new([1, hq, 0, dk], [1, hkv, 0, dk], [1, hkv, 0, dv], p)?;
        let seqs = cu.sequences(total_q, total_k)?;
        Ok(Call { total_q, hq, hkv, dk, dv, total_k, seqs })
    }

    /// The parameters of sequence `s`: `p` with its dropout keyed for the sequence.
    fn params<'a>(&self, p: &AttnParams<'a, f32>, s: usize) -> AttnParams<'a, f32> {
        AttnParams { dropout: p.dropout.map(|d| d.for_sequence(s)), ..*p }
    }

    /// Whether sequence `s` has nothing to compute under `p`: no rows, or rows that see no key and
    /// no sink (their output 0 and log-sum-exp −∞, gradients 0, as allocated).
    fn idle(&self, s: usize, p: &AttnParams<f32>) -> bool {
        let (qr, kr) = &self.seqs[s];
        qr.is_empty() || (kr.is_empty() && p.sinks.is_none())
    }
}

/// Attention over packed sequences in `f32` (see the [module](self) header):
/// `q: [total_q, Hq, Dk]`, `k: [total_k, Hkv, Dk]`, `v: [total_k, Hkv, Dv]`, sequences cut by `cu`;
/// returns `out: [total_q, Hq, Dv]` and `lse`, `lse_residue: [Hq, total_q]`.
pub fn attention_varlen(
    kernel: Kernel,
    q: &Packed<f32>,
    k: &PackedKv,
    v: &PackedKv,
    cu: &CuSeqlens,
    params: &AttnParams<f32>,
) -> Result<VarlenOutput> {
    let c = Call::new(q.dims(), k.dims(), v.dims(), cu, params)?;
    let (tq, hq, dv) = (c.total_q, c.hq, c.dv);
    let mut out = alloc::zeroed("attention output", &[tq, hq, dv])?;
    let mut lse = alloc::filled("log-sum-exp", &[hq, tq], f32::NEG_INFINITY)?;
    let mut lse_residue = alloc::zeroed("log-sum-exp residue", &[hq, tq])?;
    let parts = split_rows(&mut out, &c.seqs, |(qr, _)| qr.len() * hq * dv);
    let stats =
        c.seqs.par_iter().zip(parts).enumerate().map(|(s, ((qr, kr), out))| -> Result<Option<(Vec<f32>, Vec<f32>)>> {
            if c.idle(s, params) {
                return Ok(None);
            }
            // Each query row is read once, into the kernel's own scratch, and the keys once, into
            // its packed panels: no gather.
            let qv = q.view("q", qr.clone())?;
            let mut vbuf = VALUES.take();
            let (kv, vv) = (k.view("k", kr.clone())?, v.gather("v", kr.clone(), &mut vbuf)?);
            let r = attention(kernel, &qv, &kv, &vv, &c.params(params, s), false)?;
            VALUES.give(vbuf);
            scatter_rows(&r.out, out, hq, dv);
            Ok(Some((r.lse, r.lse_residue)))
        });
    for ((qr, _), st) in c.seqs.iter().zip(stats.collect::<Result<Vec<_>>>()?) {
        let Some((l, res)) = st else { continue };
        for h in 0..hq {
            let rows = h * tq + qr.start..h * tq + qr.end;
            lse[rows.clone()].copy_from_slice(&l[h * qr.len()..(h + 1) * qr.len()]);
            lse_residue[rows].copy_from_slice(&res[h * qr.len()..(h + 1) * qr.len()]);
        }
    }
    Ok(VarlenOutput { out, lse, lse_residue })
}
