//! The fast backward of linear attention, parallel over (batch, key/value head), each task
//! running the query heads of its group in turn and summing their `dφ(K)`, `dV`.
//!
//! With `den_i = φ(q_i)·z_i + ε`, `dn_i = dO_i / den_i` and `r_i = −dO_i·out_i / den_i`, the weights'
//! gradient is `ds_ij = dn_i·v_j + r_i` on the allowed pairs, and
//! `dφ(q_i) = Σ_j ds_ij φ(k_j)`, `dφ(k_j) = Σ_i ds_ij φ(q_i)`, `dv_j = Σ_i (φ(q_i)·φ(k_j)) dn_i`.
//! Non-causal, through the states `Sᵀ = Vᵀφ(K)`, `z` and `U = φ(Q)ᵀ·dN`, `w = Σ_i r_i φ(q_i)`.
//! Causal, each chunk's pairs through its masked products `P = tril(φ(Q_c)φ(K_c)ᵀ)` and
//! `M = tril(dN_c V_cᵀ + r)`, the earlier keys through their state `Sᵀ`, `z` and the later
//! queries through theirs, `U`, `w`: the key states before every chunk are kept first (one
//! ascending pass over the keys and values, once per key/value head), then one descending pass
//! over the chunks makes each chunk's features, denominators, `dN`, `r`, `P` and `M` once and
//! writes its `dq`, `dk` and `dv` whole (`causal`); a head whose kept key states would pass
//! [`KEPT_STATES_BUDGET`] runs the segmented path's two passes as one segment. Each chunk's
//! `dφ(Q_c)`, `dφ(K_c)` go through `φ`'s Jacobian at once. Memory: `O(C·(F + C + D) + F·Dv)` per
//! rayon job besides the gradients, and causal the kept key states, `⌈L/C⌉·(F·Dv + F)` (at most
//! [`KEPT_STATES_BUDGET`] bytes; else the two passes' row statistics, `O(L)`).
//! Causal with fewer (batch, key/value head) jobs than threads, the chunks are cut into segments
//! run in parallel (`segmented`), each in two passes (ascending for `dq` and the chunks' own part
//! of `dk`, `dv`; descending from the later segments' `U`, `w` for the rest).

use std::ops::Range;
use std::sync::Mutex;

use rayon::prelude::*;

use super::chunk::{prefetch, prefetch_rows, spread_on_isa, Keys};
use super::feature::Stab;
use super::gemm::{gemm, Lhs, Part};
use super::rows::{axpy, dot};
use super::segment::Plan;
use super::{check_len, check_out, head, validate, FeatureMap, LinearDims, LinearParams};
use crate::alloc;
use crate::error::Result;
use crate::grad::AttnGrads;
use crate::lines::Lines;
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

mod causal;
mod non_causal;
mod segmented;
#[cfg(test)]
mod tests;
mod work;

use causal::{ascend, causal, descend, key_states};
use non_causal::{all_keys, global};
use work::{KeyState, Work};

/// The inputs of a backward call: `q`, `k`, `v`, the forward's `out` and its gradient `dout`.
type Inputs<'a, T> = [View4<'a, T>; 5];

/// One query head's rows as the backward reads them.
struct Rows<'a, T> {
    q: View4<'a, T>,
    out: View4<'a, T>,
    dout: View4<'a, T>,
    b: usize,
    h: usize,
}

impl<T: Real> Rows<'_, T> {
    /// `φ(Q)` of the `n` rows from `t0` into `out: [n, F]`.
    #[inline(always)]
    fn features(&self, isa: Isa, map: &FeatureMap, t0: usize, n: usize, out: &mut [T]) {
        map.apply_rows(isa, &self.q, (self.b, self.h), t0, n, out, Stab::Row);
    }

    /// Prefetches input `i` of `[q, out, dout]` for the `n` rows from `t0` (see [`prefetch`]).
    #[inline(always)]
    fn prefetch(&self, (t0, n): (usize, usize), i: usize) {
        prefetch([&self.q, &self.out, &self.dout][i], (self.b, self.h), t0, n);
    }

    /// `dn_i = dO_i / den_i` into `dn` and `r_i = −dO_i·out_i / den_i` into `r`, for the rows
    /// `t0 .. t0 + n` with their statistics `stats: [n, 2]` (`den_i`, then `r_i` written there).
    #[inline(always)]
    fn grads(&self, t0: usize, stats: &mut [T], dn: &mut [T], r: &mut [T]) {
        let dv = self.out.dims()[3];
        for (i, ((s, dni), ri)) in stats.chunks_exact_mut(2).zip(dn.chunks_exact_mut(dv)).zip(r).enumerate() {
            let (g, inv) = (self.dout.row(self.b, self.h, t0 + i), T::one() / s[0]);
            dni.iter_mut().zip(g).for_each(|(a, &x)| *a = x * inv);
            s[1] = -dot(g, self.out.row(self.b, self.h, t0 + i)) * inv;
            *ri = s[1];
        }
    }

    /// [`grads`](Self::grads) again from the statistics it kept (`stats: [n, 2]`): `dn` from
    /// `dO`, `r` copied, so that a second pass need not read `out`.
    #[inline(always)]
    fn grads_kept(&self, t0: usize, stats: &[T], dn: &mut [T], r: &mut [T]) {
        let dv = self.out.dims()[3];
        for (i, ((s, dni), ri)) in stats.chunks_exact(2).zip(dn.chunks_exact_mut(dv)).zip(r).enumerate() {
            let (g, inv) = (self.dout.row(self.b, self.h, t0 + i), T::one() / s[0]);
            dni.iter_mut().zip(g).for_each(|(a, &x)| *a = x * inv);
            *ri = s[1];
        }
    }

    /// `dq: [n, D]` of the `n` rows from `t0` from `g = ∂L/∂φ(Q_c)`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn vjp(&self, isa: Isa, map: &FeatureMap, t0: usize, n: usize, fq: &[T], g: &mut [T], dq: &mut [T]) {
        let ((qs, ld), dd) = (head(&self.q, self.b, self.h), self.q.dims()[3]);
        map.vjp(isa, n, dd, &qs[t0 * ld..], ld, fq, g, &mut dq[..n * dd]);
    }
}

/// The gradients one query head writes (`dq`, its own) and adds to (`dk`, `dv`, its key/value
/// head's), for the rows from `base` (`[·, D]`, `[·, D]`, `[·, Dv]`).
struct Acc<'a, T> {
    dq: &'a mut [T],
    dk: &'a mut [T],
    dv: &'a mut [T],
    base: usize,
    /// The first query head of its group to reach these `dk`, `dv` rows: it writes them (each
    /// chunk's first product writes rather than adds, the padded keys' rows cleared) rather than
    /// adding to what they hold.
    fresh: bool,
}

impl<T: Real> Acc<'_, T> {
    /// Prefetches this head's `dq` rows (or with `keys`, its `dk` and `dv` rows) of the `n` rows
    /// from `t0`, which a chunk loop is about to write or add to (see [`prefetch`](super::chunk::prefetch)).
    #[inline(always)]
    fn prefetch(&self, d: &LinearDims, (t0, n): (usize, usize), keys: bool) {
        let t = t0.saturating_sub(self.base);
        if keys {
            prefetch_rows(self.dk, d.d, d.d, t, n);
            prefetch_rows(self.dv, d.dv, d.dv, t, n);
        } else {
            prefetch_rows(self.dq, d.d, d.d, t, n);
        }
    }

    /// With [`fresh`](Self::fresh), clears the `dk`, `dv` rows of `rows` at or beyond the
    /// `valid` keys, which no chunk writes.
    fn clear_padded(&mut self, rows: Range<usize>, valid: usize, d: &LinearDims) {
        if self.fresh && rows.end > valid {
            let rows = valid.max(rows.start) - self.base..rows.end - self.base;
            self.dk[rows.start * d.d..rows.end * d.d].fill(T::zero());
            self.dv[rows.start * d.dv..rows.end * d.dv].fill(T::zero());
        }
    }
}

/// Gradients of [`linear_attention`](super::linear_attention) for the output gradient
/// `dout: [B, Hq, Lq, Dv]`, given the forward's `out: [B, Hq, Lq, Dv]`: `dq: [B, Hq, Lq, D]`, and
/// `dk: [B, Hkv, Lk, D]`, `dv: [B, Hkv, Lk, Dv]` summed over each key/value head's query heads
/// (0 on padded keys), in new buffers ([`linear_attention_backward_into`] writes a caller's).
pub fn linear_attention_backward<T: Real>(
    q: View4<T>,
    k: View4<T>,
    v: View4<T>,
    out: View4<T>,
    dout: View4<T>,
    p: &LinearParams,
) -> Result<AttnGrads<T>> {
    let d = checked(&[q, k, v, out, dout], p)?;
    let [sq, sk, sv] = grad_shapes(&d);
    let mut g = AttnGrads {
        dq: alloc::zeroed("gradient dq", &sq)?,
        dk: alloc::zeroed("gradient dk", &sk)?,
        dv: alloc::zeroed("gradient dv", &sv)?,
        dbias: None,
        dtable: None,
        dsinks: None,
    };
    backward(&d, p, [q, k, v, out, dout], GradsMut { dq: &mut g.dq, dk: &mut g.dk, dv: &mut g.dv })?;
    Ok(g)
}

/// The caller's buffers [`linear_attention_backward_into`] writes the gradients into
/// (contiguous): `dq: [B, Hq, Lq, D]`, `dk: [B, Hkv, Lk, D]`, `dv: [B, Hkv, Lk, Dv]`.
#[derive(Debug)]
pub struct GradsMut<'a, T> {
    pub dq: &'a mut [T],
    pub dk: &'a mut [T],
    pub dv: &'a mut [T],
}

/// [`linear_attention_backward`] into the caller's buffers `g`, e.g. gradients a training loop
/// keeps from one step to the next, so that no call maps and clears fresh pages. Every element is
/// written: `dq` row by row, `dk` and `dv` chunk by chunk, each chunk written by its first query
/// head's first product (the rows of padded keys cleared), the others added to it, so what the
/// buffers held before (garbage, NaN) does not matter and they need no zero fill. A wrong
/// length is [`AttnError::Output`](crate::AttnError::Output) naming `dq`, `dk` or `dv`.
pub fn linear_attention_backward_into<T: Real>(
    q: View4<T>,
    k: View4<T>,
    v: View4<T>,
    out: View4<T>,
    dout: View4<T>,
    p: &LinearParams,
    g: GradsMut<T>,
) -> Result<()> {
    let d = checked(&[q, k, v, out, dout], p)?;
    let [sq, sk, sv] = grad_shapes(&d);
    check_len("dq", g.dq, &sq)?;
    check_len("dk", g.dk, &sk)?;
    check_len("dv", g.dv, &sv)?;
    backward(&d, p, [q, k, v, out, dout], g)
}

/// The sizes of a backward call, its inputs and options checked.
fn checked<T>([q, k, v, out, dout]: &Inputs<T>, p: &LinearParams) -> Result<LinearDims> {
    let d = validate(q, k, v, p)?;
    check_out("out", out, &d)?;
    check_out("grad_out", dout, &d)?;
    Ok(d)
}

/// The shapes of `dq`, `dk`, `dv`.
fn grad_shapes(d: &LinearDims) -> [[usize; 4]; 3] {
    [[d.b, d.hq, d.lq, d.d], [d.b, d.hkv, d.lk, d.d], [d.b, d.hkv, d.lk, d.dv]]
}

/// Most bytes of one job's kept key states in the causal backward's one pass: a longer head (or
/// more features: 256 FAVOR+ features need 5.4× a head's queries) runs the segmented path's two
/// passes as one segment instead, `O(L)` per job. Reached at `L ≈ 185 000` with
/// `D = F = Dv = 64`.
const KEPT_STATES_BUDGET: usize = 64 << 20;

/// What a refused buffer of kept key states is called.
const STATES: &str = "linear attention key states";

/// Writes every element of `g` (the call validated as `d`).
fn backward<T: Real>(d: &LinearDims, p: &LinearParams, inputs: Inputs<T>, g: GradsMut<T>) -> Result<()> {
    if d.is_empty() {
        [g.dq, g.dk, g.dv].into_iter().for_each(|x| x.fill(T::zero()));
        return Ok(());
    }
    let isa = Isa::best();
    if let Some(plan) = Plan::choose(d.b * d.hkv, d.lq, p) {
        return segmented::backward(isa, d, p, inputs, &plan, g);
    }
    if let Some(plans) = Plan::global(d.b * d.hkv, d.lq, d.lk, p) {
        segmented::global(isa, d, p, inputs, plans, g);
        return Ok(());
    }
    // Causal, each job's key states `[⌈L/C⌉, Dv·F + F]`, refused before any gradient is written,
    // and handed from job to job: rayon makes a `Work` per split of the tasks, not per thread, and
    // a buffer this large made afresh for each faults in and clears new pages every time. Past
    // [`KEPT_STATES_BUDGET`], the segmented path's two passes over each head as one segment.
    let states = [d.lq.div_ceil(p.chunk.min(d.lq.max(d.lk))), d.f * d.dv + d.f];
    if p.causal && alloc::count::<T>(STATES, &states)? * size_of::<T>() > KEPT_STATES_BUDGET {
        return segmented::backward(isa, d, p, inputs, &Plan::whole(d.lq, p.chunk), g);
    }
    let [q, k, v, out, dout] = inputs;
    let group = d.group();
    let kept = Mutex::new(Vec::<Lines<T>>::new());
    let tasks = g.dq.par_chunks_mut(group * d.lq * d.d).zip(g.dk.par_chunks_mut(d.lk * d.d));
    tasks.zip(g.dv.par_chunks_mut(d.lk * d.dv)).enumerate().try_for_each_init(
        || Work::new(d, p.chunk),
        |w, (bh, ((dq, dk), dvo))| {
            let (b, hk) = (bh / d.hkv, bh % d.hkv);
            let keys = Keys::new(isa, k, &v, p, d, (b, hk));
            let head = |gi: usize| Head { isa, d, p, rows: Rows { q, out, dout, b, h: hk * group + gi }, keys };
            if p.causal {
                w.states = kept.lock().ok().and_then(|mut k| k.pop()).unwrap_or_default();
                w.states.try_resize_for_overwrite(STATES, &states, T::zero())?;
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || key_states(&head(0), w),
                );
            } else {
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || all_keys(&head(0), w),
                );
            }
            for (gi, dq) in dq.chunks_exact_mut(d.lq * d.d).enumerate() {
                let hd = head(gi);
                let acc = Acc { dq, dk: &mut *dk, dv: &mut *dvo, base: 0, fresh: gi == 0 };
                spread_on_isa(
                    isa,
                    #[inline(always)]
                    || if p.causal { causal(&hd, w, acc) } else { global(&hd, w, acc) },
                );
            }
            if let (true, Ok(mut k)) = (p.causal, kept.lock()) {
                k.push(std::mem::take(&mut w.states));
            }
            Ok(())
        },
    )
}

/// One query head of a backward call and its key/value head.
struct Head<'a, T> {
    isa: Isa,
    d: &'a LinearDims,
    p: &'a LinearParams<'a>,
    rows: Rows<'a, T>,
    keys: Keys<'a, T>,
}

impl<T: Real> Head<'_, T> {
    /// Prefetches input `i` of `[q, out, dout, k, v]` for the `n` rows from `t0`.
    #[inline(always)]
    fn prefetch(&self, (t0, n): (usize, usize), i: usize) {
        match i {
            0..3 => self.rows.prefetch((t0, n), i),
            _ => self.keys.prefetch(t0, n, i == 4),
        }
    }
}

/// The terms [`key_grads`] sums into a chunk's key gradients: from the chunk's own queries
/// (its masked products `P`, `M`) and from the query states `U`, `w` of the queries after it.
#[derive(Debug, Clone, Copy)]
struct KeyTerms {
    own: bool,
    later: bool,
}

/// The `nk` keys from `t0`: with `terms.own`, from the chunk's own `n` queries,
/// `dφ(K_c) = Mᵀ·φ(Q_c)` and `dV_c += Pᵀ·dN_c` (`w.fq`, `w.dn`, `w.pm`, `w.mm` set); with
/// `terms.later`, from the query states, `dφ(K_c) += V_c·Uᵀ + w` and `dV_c += φ(K_c)·U`
/// (`w.u`, `w.ut`, `w.wsum` set); then `dk` through `φ`'s Jacobian (`w.fk` set). `dk`, `dv` are
/// written rather than added with [`Acc::fresh`].
#[inline(always)]
fn key_grads<T: Real>(
    hd: &Head<T>,
    (t0, n, nk): (usize, usize, usize),
    terms: KeyTerms,
    w: &mut Work<T>,
    acc: &mut Acc<T>,
) {
    let (isa, f, wd, c, keys) = (hd.isa, hd.d.f, hd.d.dv, w.chunk(), &hd.keys);
    let (vc, fk, dfk) = (keys.values(t0), &w.fk[..nk * f], &mut w.dfk[..nk * f]);
    let dvc = &mut acc.dv[(t0 - acc.base) * wd..][..nk * wd];
    if terms.own {
        let (mt, pt) = (Lhs::transposed(&w.mm, c).part(Part::UpperA), Lhs::transposed(&w.pm, c).part(Part::UpperA));
        gemm(isa, nk, f, n, mt.write(true), &w.fq[..n * f], f, dfk, f);
        gemm(isa, nk, wd, n, pt.write(acc.fresh), &w.dn[..n * wd], wd, dvc, wd);
    }
    if terms.later {
        gemm(isa, nk, f, wd, Lhs::rows(vc, keys.ldv).write(!terms.own), &w.ut, f, dfk, f);
        dfk.chunks_exact_mut(f).for_each(|row| axpy(row, T::one(), &w.wsum));
        gemm(isa, nk, wd, f, Lhs::rows(fk, f).write(acc.fresh && !terms.own), &w.u, wd, dvc, wd);
    }
    let dk = &mut acc.dk[(t0 - acc.base) * hd.d.d..];
    keys.vjp(isa, hd.p.map, (t0, nk), fk, dfk, (!acc.fresh).then_some(&mut w.dx[..]), dk);
}
