//! The fast forward of linear attention, parallel over (batch, key/value head), each job running
//! the query heads of its group together so that each chunk's key features and state update (or,
//! non-causal, the state of all the keys) are made once for all of them; with fewer key/value
//! heads than threads, over segments of each head's chunks (`segment`: causal per (key/value
//! head, segment), its query heads together from the segment's prefix state; non-causal per
//! (query head, segment) from the state of all the keys, summed once per key/value head). Chunk
//! by chunk of `C` rows, the features `φ(Q_c)`, `φ(K_c)` made for each chunk as it is reached:
//! - non-causal: the state `S = φ(K)ᵀV: [F, Dv]`, `z = Σ_j φ(k_j)` over the key chunks, then
//!   `out_c = φ(Q_c)·S / (φ(Q_c)·z + ε)`;
//! - causal: `out_c = φ(Q_c)·S + tril(φ(Q_c)φ(K_c)ᵀ)·V_c` (the state holds the earlier chunks),
//!   the denominators likewise with `z`, then `S += φ(K_c)ᵀV_c`, `z += Σ φ(K_c)`.
//!
//! The products run through `gemm`'s register-blocked micro-kernel, the masked ones over their
//! lower triangle only. Each rayon job keeps one [`Work`] (a chunk's features and products, the
//! state) for all the heads it runs, so a call allocates `O(C·(F + C) + F·Dv)` per job besides the
//! output, and the segmented path `O(threads·F·Dv)` of segment states.

use std::ops::Range;

use rayon::prelude::*;

use super::chunk::{ahead, prefetch, spread_on_isa, tril_products, Keys};
use super::feature::Stab;
use super::gemm::{gemm, Lhs, Part};
use super::rows::{add_rows, dot, sum};
use super::segment::{key_prefixes, key_state, key_totals, Plan};
use super::{check_len, validate, LinearDims, LinearParams};
use crate::alloc;
use crate::error::Result;
use crate::lines::Lines;
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

/// Linear attention of `q: [B, Hq, Lq, D]` over `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`:
/// `out: [B, Hq, Lq, Dv]` (see [the module](super) for the formula), in a new buffer
/// ([`linear_attention_into`] writes a caller's).
pub fn linear_attention<T: Real>(q: View4<T>, k: View4<T>, v: View4<T>, p: &LinearParams) -> Result<Vec<T>> {
    let d = validate(&q, &k, &v, p)?;
    let mut out = alloc::zeroed("linear attention output", &d.out_shape())?;
    forward(&d, p, (q, k, v), &mut out);
    Ok(out)
}

/// [`linear_attention`] into the caller's `out: [B, Hq, Lq, Dv]` (contiguous), e.g. a buffer a
/// training loop keeps from one step to the next, so that no call maps and clears fresh pages.
/// Every element of `out` is written, each chunk of rows by its first product (which writes
/// rather than adds): what `out` held before (garbage, NaN) does not matter and it needs no zero
/// fill. A wrong length is [`AttnError::Output`](crate::AttnError::Output) naming `out`.
pub fn linear_attention_into<T: Real>(
    q: View4<T>,
    k: View4<T>,
    v: View4<T>,
    p: &LinearParams,
    out: &mut [T],
) -> Result<()> {
    let d = validate(&q, &k, &v, p)?;
    check_len("out", out, &d.out_shape())?;
    forward(&d, p, (q, k, v), out);
    Ok(())
}

/// Writes every element of `out` (`[B, Hq, Lq, Dv]`, the call validated as `d`).
fn forward<T: Real>(d: &LinearDims, p: &LinearParams, (q, k, v): (View4<T>, View4<T>, View4<T>), out: &mut [T]) {
    if d.is_empty() {
        out.fill(T::zero());
        return;
    }
    let isa = Isa::best();
    if let Some(plan) = Plan::choose(d.b * d.hkv, d.lq, p) {
        return segmented(isa, d, p, (&q, k, v), &plan, None, out);
    }
    if let Some((qp, kp)) = Plan::global(d.b * d.hkv, d.lq, d.lk, p) {
        return segmented(isa, d, p, (&q, k, v), &qp, Some(&kp), out);
    }
    // A job per key/value head, its query heads sharing its key features and state chunk by chunk.
    let (group, keys) = (d.group(), Keys::every(isa, k, &v, p, d));
    out.par_chunks_mut(group * d.lq * d.dv).zip(keys).for_each_init(
        || Work::new(d, p.chunk),
        |w, (o, keys)| {
            let mut outs: Vec<_> = o.chunks_exact_mut(d.lq * d.dv).collect();
            let heads = heads_of(&q, keys, group);
            w.clear_state();
            spread_on_isa(
                isa,
                #[inline(always)]
                || {
                    if p.causal {
                        causal(isa, d, p, &heads, w, 0..d.lq, &mut outs)
                    } else {
                        global(isa, d, p, &heads, w, &mut outs)
                    }
                },
            );
        },
    );
}

/// The `group` query heads of the key/value head `keys` reads.
fn heads_of<'a, T: Copy>(q: &'a View4<'a, T>, keys: Keys<'a, T>, group: usize) -> Vec<Head<'a, T>> {
    let (b, hk) = keys.bh;
    (hk * group..(hk + 1) * group).map(|h| Head { q, b, h, keys }).collect()
}

/// The forward in segments of each head's rows ([`Plan`]), causal: the key states before each
/// segment (phases 1 and 2), then the segments in parallel from them; non-causal (with the plan
/// of the keys, `key_plan`): the state of all the keys, then the query segments in parallel.
fn segmented<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    (q, k, v): (&View4<T>, View4<T>, View4<T>),
    plan: &Plan,
    key_plan: Option<&Plan>,
    out: &mut [T],
) {
    let (keys, width, group) = (Keys::every(isa, k, &v, p, d), d.f * d.dv + d.f, d.group());
    let Some(kp) = key_plan else {
        // Causal: per (key/value head, segment), its query heads together from the segment's
        // prefix state, at `(kh·P + s)·width`.
        let init = key_prefixes(isa, plan, p, d, &keys);
        plan.by_job(out, d.dv, group).into_par_iter().enumerate().for_each_init(
            || Work::new(d, p.chunk),
            |w, (i, mut outs)| {
                w.st.copy_from_slice(&init[i * width..][..width]);
                let heads = heads_of(q, keys[i / plan.segs], group);
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || causal(isa, d, p, &heads, w, plan.rows(i % plan.segs), &mut outs),
                );
            },
        );
        return;
    };
    // Non-causal: per (query head, segment), from the state of all the keys of its key/value head.
    let init = key_totals(isa, kp, p, d, &keys);
    plan.split(out, d.dv).into_par_iter().for_each_init(
        || Work::new(d, p.chunk),
        |w, (bh, s, o)| {
            let (b, h) = (bh / d.hq, bh % d.hq);
            let kh = b * d.hkv + h / group;
            w.st.copy_from_slice(&init[kh * width..][..width]);
            spread_on_isa(
                isa,
                #[inline(always)]
                || queries(isa, d, p, Head { q, b, h, keys: keys[kh] }, w, plan.rows(s), o),
            );
        },
    );
}

/// One query head and its key/value head.
#[derive(Clone, Copy)]
struct Head<'a, T> {
    q: &'a View4<'a, T>,
    b: usize,
    h: usize,
    keys: Keys<'a, T>,
}

/// One job's scratch.
struct Work<T> {
    /// `φ(Q_c)`, `φ(K_c)`: `[C, F]`.
    fq: Lines<T>,
    fk: Lines<T>,
    /// `tril(φ(Q_c)φ(K_c)ᵀ)`: `[C, C]`, and the transposed keys `tril_products` makes.
    pm: Lines<T>,
    kt: Lines<T>,
    /// The chunk's denominators.
    den: Lines<T>,
    /// The state `(S, z)`: `S: [F, Dv]`, then `z: [F]`.
    st: Lines<T>,
}

impl<T: Real> Work<T> {
    fn new(d: &LinearDims, c: usize) -> Self {
        let c = c.min(d.lq.max(d.lk));
        let zeros = |n| Lines::filled(n, T::zero());
        Work {
            fq: zeros(c * d.f),
            fk: zeros(c * d.f),
            pm: zeros(c * c),
            kt: Lines::default(),
            den: zeros(c),
            st: zeros(d.f * d.dv + d.f),
        }
    }

    /// The state cleared for a head's first chunk.
    fn clear_state(&mut self) {
        self.st.iter_mut().for_each(|x| *x = T::zero());
    }
}

/// `o[i] /= den[i]` for the rows of `o: [n, Dv]` (as a product with `1 / den[i]`).
#[inline(always)]
fn divide<T: Real>(o: &mut [T], dv: usize, den: &[T]) {
    o.chunks_exact_mut(dv).zip(den).for_each(|(oi, &di)| {
        let inv = T::one() / di;
        oi.iter_mut().for_each(|x| *x = *x * inv)
    });
}

/// Query heads `heads` of one key/value head, non-causal, from the state of all its keys (made
/// once): `outs` one `[Lq, Dv]` per head.
#[inline(always)]
fn global<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    heads: &[Head<T>],
    w: &mut Work<T>,
    outs: &mut [&mut [T]],
) {
    let (c, keys) = (w.den.len(), heads[0].keys);
    key_state(isa, p.map, d, &keys, 0..keys.valid, c, &mut w.fk, &mut w.st);
    for (&hd, o) in heads.iter().zip(outs) {
        queries(isa, d, p, hd, w, 0..d.lq, o);
    }
}

/// The query rows `rows` of one head, non-causal, from the state of all its keys in `w.st`:
/// `o: [rows.len(), Dv]`.
#[inline(always)]
fn queries<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    hd: Head<T>,
    w: &mut Work<T>,
    rows: Range<usize>,
    o: &mut [T],
) {
    let (f, dv, c) = (d.f, d.dv, w.den.len());
    let eps = T::from_f64(p.eps).expect("finite");
    let (s, z) = w.st.split_at(f * dv);
    for t0 in rows.clone().step_by(c) {
        let n = c.min(rows.end - t0);
        let (fq, oc, den) = (&mut w.fq[..n * f], &mut o[(t0 - rows.start) * dv..][..n * dv], &mut w.den[..n]);
        p.map.apply_rows(isa, hd.q, (hd.b, hd.h), t0, n, fq, Stab::Row);
        prefetch(hd.q, (hd.b, hd.h), t0 + c, ahead(&rows, t0 + c, c));
        gemm(isa, n, dv, f, Lhs::rows(fq, f).write(true), s, dv, oc, dv);
        for (di, x) in den.iter_mut().zip(fq.chunks_exact(f)) {
            *di = dot(x, z) + eps;
        }
        divide(oc, dv, den);
    }
}

/// The rows `rows` (whole chunks from a chunk's start) of query heads `heads` of one key/value
/// head, causal, chunk by chunk from the state in `w.st` (of the rows before them), each chunk's
/// key features and state update made once for all of them: `outs` one `[rows.len(), Dv]` per
/// head.
#[inline(always)]
fn causal<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    heads: &[Head<T>],
    w: &mut Work<T>,
    rows: Range<usize>,
    outs: &mut [&mut [T]],
) {
    let (f, dv, c, keys) = (d.f, d.dv, w.den.len(), heads[0].keys);
    let eps = T::from_f64(p.eps).expect("finite");
    let (s, z) = w.st.split_at_mut(f * dv);
    for t0 in rows.clone().step_by(c) {
        let (n, nk) = (c.min(rows.end - t0), keys.count(t0, c.min(rows.end - t0)));
        let next = (t0 + c, ahead(&rows, t0 + c, c));
        let (fk, vc) = (&mut w.fk[..nk * f], keys.values(t0));
        if nk > 0 {
            keys.features(isa, p.map, t0, nk, fk);
        }
        keys.prefetch(next.0, next.1, false);
        for (hd, o) in heads.iter().zip(outs.iter_mut()) {
            let (fq, oc, den) = (&mut w.fq[..n * f], &mut o[(t0 - rows.start) * dv..][..n * dv], &mut w.den[..n]);
            p.map.apply_rows(isa, hd.q, (hd.b, hd.h), t0, n, fq, Stab::Row);
            prefetch(hd.q, (hd.b, hd.h), next.0, next.1);
            gemm(isa, n, dv, f, Lhs::rows(fq, f).write(true), s, dv, oc, dv);
            for (di, x) in den.iter_mut().zip(fq.chunks_exact(f)) {
                *di = dot(x, z) + eps;
            }
            if nk > 0 {
                tril_products(isa, n, nk, f, fq, f, fk, f, &mut w.kt, &mut w.pm, c);
                for (di, row) in den.iter_mut().zip(w.pm.chunks(c)) {
                    *di = *di + sum(&row[..nk]);
                }
                gemm(isa, n, dv, nk, Lhs::rows(&w.pm, c).part(Part::LowerA), vc, keys.ldv, oc, dv);
            }
            divide(oc, dv, den);
        }
        keys.prefetch(next.0, next.1, true);
        if nk > 0 {
            gemm(isa, f, dv, nk, Lhs::transposed(fk, f), vc, keys.ldv, s, dv);
            add_rows(z, fk, nk);
        }
    }
}
