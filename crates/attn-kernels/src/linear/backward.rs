//! The fast backward of linear attention, parallel over (batch, key/value head), each task
//! running the query heads of its group in turn and summing their `dφ(K)`, `dV`.
//!
//! With `den_i = φ(q_i)·z_i + ε`, `dn_i = dO_i / den_i` and `r_i = −dO_i·out_i / den_i`, the weights'
//! gradient is `ds_ij = dn_i·v_j + r_i` on the allowed pairs, and
//! `dφ(q_i) = Σ_j ds_ij φ(k_j)`, `dφ(k_j) = Σ_i ds_ij φ(q_i)`, `dv_j = Σ_i (φ(q_i)·φ(k_j)) dn_i`.
//! Non-causal, through the states `Sᵀ = Vᵀφ(K)`, `z` and `U = φ(Q)ᵀ·dN`, `w = Σ_i r_i φ(q_i)`.
//! Causal, in two passes over the chunks: ascending (state `Sᵀ`, `z`) for the denominators, `dN`,
//! `r` and `dφ(Q)`, with the chunk's masked products `P = tril(φ(Q_c)φ(K_c)ᵀ)` and
//! `M = tril(dN_c V_cᵀ + r)`; descending (state `U`, `w` of the later chunks) for `dφ(K)` and `dV`,
//! the features, `dN`, `r`, `P` and `M` of each chunk made again from the saved denominators
//! (cheaper than keeping `O(L·C)` of them). Each chunk's `dφ(Q_c)`, `dφ(K_c)` go through `φ`'s
//! Jacobian at once. Memory: `O(L + C·(F + C + D) + F·Dv)` per rayon job besides the gradients.

use rayon::prelude::*;

use super::chunk::{add_rows, axpy, dot, on_isa, sum, tril_products, Keys};
use super::feature::Stab;
use super::gemm::{gemm, Lhs, Part};
use super::transpose::transpose;
use super::{check_out, head, validate, FeatureMap, LinearDims, LinearParams};
use crate::alloc;
use crate::error::Result;
use crate::grad::AttnGrads;
use crate::isa::Isa;
use crate::reference::Real;
use crate::view::View4;

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
    fn features(&self, isa: Isa, map: &FeatureMap, t0: usize, n: usize, out: &mut [T]) {
        map.apply_rows(isa, &self.q, (self.b, self.h), t0, n, out, Stab::Row);
    }

    /// `dn_i = dO_i / den_i` into `dn` and `r_i = −dO_i·out_i / den_i` into `r`, for the rows
    /// `t0 .. t0 + den.len()`.
    #[inline(always)]
    fn grads(&self, t0: usize, den: &[T], dn: &mut [T], r: &mut [T]) {
        let dv = self.out.dims()[3];
        for (i, ((&di, dni), ri)) in den.iter().zip(dn.chunks_exact_mut(dv)).zip(r.iter_mut()).enumerate() {
            let (g, inv) = (self.dout.row(self.b, self.h, t0 + i), T::one() / di);
            dni.iter_mut().zip(g).for_each(|(a, &x)| *a = x * inv);
            *ri = -dot(g, self.out.row(self.b, self.h, t0 + i)) * inv;
        }
    }

    /// `dq` of the `n` rows from `t0` (of the head's `dq: [Lq, D]`) from `g = ∂L/∂φ(Q_c)`.
    #[allow(clippy::too_many_arguments)]
    fn vjp(&self, isa: Isa, map: &FeatureMap, t0: usize, n: usize, fq: &[T], g: &mut [T], dq: &mut [T]) {
        let ((qs, ld), dd) = (head(&self.q, self.b, self.h), self.q.dims()[3]);
        map.vjp(isa, n, dd, &qs[t0 * ld..], ld, fq, g, &mut dq[t0 * dd..][..n * dd]);
    }
}

/// The gradients one query head writes (`dq: [Lq, D]`, its own) and adds to (`dk: [Lk, D]`,
/// `dv: [Lk, Dv]`, its key/value head's).
struct Acc<'a, T> {
    dq: &'a mut [T],
    dk: &'a mut [T],
    dv: &'a mut [T],
}

/// One job's scratch: a chunk's features, gradients and masked products, the states, and the
/// denominators of a head.
struct Work<T> {
    /// `[C, F]` each.
    fq: Vec<T>,
    fk: Vec<T>,
    dfq: Vec<T>,
    dfk: Vec<T>,
    /// `dN_c: [C, Dv]`, `r_c: [C]`.
    dn: Vec<T>,
    r: Vec<T>,
    /// `P`, `M`: `[C, C]`, and the transposed operand `tril_products` makes.
    pm: Vec<T>,
    mm: Vec<T>,
    bt: Vec<T>,
    /// The states `Sᵀ: [Dv, F]`, `z: [F]`, `U: [F, Dv]` (and `Uᵀ`), `w: [F]`.
    st: Vec<T>,
    z: Vec<T>,
    u: Vec<T>,
    ut: Vec<T>,
    wsum: Vec<T>,
    /// The head's denominators, `[Lq]`.
    den: Vec<T>,
    /// A chunk's key gradient before it is added, `[C, D]`.
    dx: Vec<T>,
}

impl<T: Real> Work<T> {
    fn new(d: &LinearDims, c: usize) -> Self {
        let c = c.min(d.lq.max(d.lk));
        let zeros = |n| vec![T::zero(); n];
        let (f, w) = (d.f, d.dv);
        Work {
            fq: zeros(c * f),
            fk: zeros(c * f),
            dfq: zeros(c * f),
            dfk: zeros(c * f),
            dn: zeros(c * w),
            r: zeros(c),
            pm: zeros(c * c),
            mm: zeros(c * c),
            bt: Vec::new(),
            st: zeros(w * f),
            z: zeros(f),
            u: zeros(f * w),
            ut: zeros(w * f),
            wsum: zeros(f),
            den: zeros(d.lq),
            dx: zeros(c * d.d),
        }
    }

    /// The chunk length.
    fn chunk(&self) -> usize {
        self.r.len()
    }
}

/// Gradients of [`linear_attention`](super::linear_attention) for the output gradient
/// `dout: [B, Hq, Lq, Dv]`, given the forward's `out: [B, Hq, Lq, Dv]`: `dq: [B, Hq, Lq, D]`, and
/// `dk: [B, Hkv, Lk, D]`, `dv: [B, Hkv, Lk, Dv]` summed over each key/value head's query heads
/// (0 on padded keys).
pub fn linear_attention_backward<T: Real>(
    q: View4<T>,
    k: View4<T>,
    v: View4<T>,
    out: View4<T>,
    dout: View4<T>,
    p: &LinearParams,
) -> Result<AttnGrads<T>> {
    let d = validate(&q, &k, &v, p)?;
    check_out("out", &out, &d)?;
    check_out("grad_out", &dout, &d)?;
    let zeros = |what, shape: &[usize]| alloc::filled_par(what, shape, T::zero());
    let mut g = AttnGrads {
        dq: zeros("gradient dq", &[d.b, d.hq, d.lq, d.d])?,
        dk: zeros("gradient dk", &[d.b, d.hkv, d.lk, d.d])?,
        dv: zeros("gradient dv", &[d.b, d.hkv, d.lk, d.dv])?,
        dbias: None,
        dtable: None,
        dsinks: None,
    };
    if d.is_empty() {
        return Ok(g);
    }
    let isa = Isa::best();
    let group = d.group();
    let (dq, dk, dv) = (&mut g.dq, &mut g.dk, &mut g.dv);
    let tasks =
        dq.par_chunks_mut(group * d.lq * d.d).zip(dk.par_chunks_mut(d.lk * d.d)).zip(dv.par_chunks_mut(d.lk * d.dv));
    tasks.enumerate().for_each_init(
        || Work::new(&d, p.chunk),
        |w, (bh, ((dq, dk), dvo))| {
            let (b, hk) = (bh / d.hkv, bh % d.hkv);
            let keys = Keys::new(isa, k, &v, p, &d, (b, hk));
            for (gi, dq) in dq.chunks_exact_mut(d.lq * d.d).enumerate() {
                let rows = Rows { q, out, dout, b, h: hk * group + gi };
                let acc = Acc { dq, dk: &mut *dk, dv: &mut *dvo };
                on_isa(
                    isa,
                    #[inline(always)]
                    || {
                        if p.causal {
                            causal(isa, &d, p, &rows, keys, w, acc)
                        } else {
                            global(isa, &d, p, &rows, keys, w, acc)
                        }
                    },
                );
            }
        },
    );
    Ok(g)
}

/// The zeroed `[n, F]` start of a gradient buffer.
fn cleared<T: Real>(x: &mut [T], len: usize) -> &mut [T] {
    let x = &mut x[..len];
    x.iter_mut().for_each(|v| *v = T::zero());
    x
}

/// `dφ(K_c) = V_c·Uᵀ + w + Mᵀ·φ(Q_c)` (the last with `M` of the chunk itself, absent
/// non-causal) and `dV_c += φ(K_c)·U + Pᵀ·dN_c`, for the `nk` keys from `t0`, then `dk` through
/// `φ`'s Jacobian. `w.fk`, `w.u`, `w.ut`, `w.wsum` are set; with `masked` so are `w.fq`, `w.dn`
/// (`n` rows) and `w.pm`, `w.mm`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn key_grads<T: Real>(
    isa: Isa,
    d: &LinearDims,
    map: &FeatureMap,
    keys: &Keys<T>,
    (t0, n, nk): (usize, usize, usize),
    masked: bool,
    w: &mut Work<T>,
    acc: &mut Acc<T>,
) {
    let (f, wd, c) = (d.f, d.dv, w.chunk());
    let (vc, fk, dfk) = (keys.values(t0), &w.fk[..nk * f], cleared(&mut w.dfk, nk * f));
    let dvc = &mut acc.dv[t0 * wd..][..nk * wd];
    gemm(isa, nk, f, wd, Lhs::rows(vc, keys.ldv), &w.ut, f, dfk, f);
    dfk.chunks_exact_mut(f).for_each(|row| axpy(row, T::one(), &w.wsum));
    gemm(isa, nk, wd, f, Lhs::rows(fk, f), &w.u, wd, dvc, wd);
    if masked {
        gemm(isa, nk, f, n, Lhs::transposed(&w.mm, c).part(Part::UpperA), &w.fq[..n * f], f, dfk, f);
        gemm(isa, nk, wd, n, Lhs::transposed(&w.pm, c).part(Part::UpperA), &w.dn[..n * wd], wd, dvc, wd);
    }
    keys.vjp_add(isa, map, t0, nk, fk, dfk, &mut w.dx, acc.dk);
}

/// One query head, non-causal: writes `acc.dq`, adds to `acc.dk`, `acc.dv`.
#[inline(always)]
fn global<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    rows: &Rows<T>,
    keys: Keys<T>,
    w: &mut Work<T>,
    mut acc: Acc<T>,
) {
    let (f, wd, c) = (d.f, d.dv, w.chunk());
    let eps = T::from_f64(p.eps).expect("finite");
    w.st.iter_mut().chain(w.z.iter_mut()).chain(w.u.iter_mut()).chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
    for t0 in (0..keys.valid).step_by(c) {
        let nk = keys.count(t0, c);
        let fk = &mut w.fk[..nk * f];
        keys.features(isa, p.map, t0, nk, fk);
        gemm(isa, wd, f, nk, Lhs::transposed(keys.values(t0), keys.ldv), fk, f, &mut w.st, f);
        add_rows(&mut w.z, fk, nk);
    }
    for t0 in (0..d.lq).step_by(c) {
        let n = c.min(d.lq - t0);
        let (fq, den, dn, r) = (&mut w.fq[..n * f], &mut w.den[..n], &mut w.dn[..n * wd], &mut w.r[..n]);
        rows.features(isa, p.map, t0, n, fq);
        den.iter_mut().zip(fq.chunks_exact(f)).for_each(|(di, x)| *di = dot(x, &w.z) + eps);
        rows.grads(t0, den, dn, r);
        let dfq = cleared(&mut w.dfq, n * f);
        gemm(isa, n, f, wd, Lhs::rows(dn, wd), &w.st, f, dfq, f);
        for ((row, &ri), x) in dfq.chunks_exact_mut(f).zip(r.iter()).zip(fq.chunks_exact(f)) {
            axpy(row, ri, &w.z);
            axpy(&mut w.wsum, ri, x);
        }
        gemm(isa, f, wd, n, Lhs::transposed(fq, f), dn, wd, &mut w.u, wd);
        rows.vjp(isa, p.map, t0, n, fq, dfq, acc.dq);
    }
    transpose(isa, &w.u, wd, f, wd, &mut w.ut, f);
    for t0 in (0..keys.valid).step_by(c) {
        let nk = keys.count(t0, c);
        keys.features(isa, p.map, t0, nk, &mut w.fk[..nk * f]);
        key_grads(isa, d, p.map, &keys, (t0, 0, nk), false, w, &mut acc);
    }
}

/// The chunk from `t0` (`n` rows, `nk` keys) of a causal head: `φ(Q_c)`, `φ(K_c)`, `P` into
/// `w`, and the denominators `φ(Q_c)·z + rowsum(P) + ε` into `den` when given.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_products<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    rows: &Rows<T>,
    keys: &Keys<T>,
    (t0, n, nk): (usize, usize, usize),
    w: &mut Work<T>,
    den: Option<&mut [T]>,
) {
    let (f, c) = (d.f, w.chunk());
    let (fq, fk) = (&mut w.fq[..n * f], &mut w.fk[..nk * f]);
    rows.features(isa, p.map, t0, n, fq);
    if nk > 0 {
        keys.features(isa, p.map, t0, nk, fk);
        tril_products(isa, n, nk, f, fq, f, fk, f, &mut w.bt, &mut w.pm, c);
    }
    if let Some(den) = den {
        let eps = T::from_f64(p.eps).expect("finite");
        for (i, (di, x)) in den.iter_mut().zip(fq.chunks_exact(f)).enumerate() {
            let masked = if nk > 0 { sum(&w.pm[i * c..][..nk]) } else { T::zero() };
            *di = dot(x, &w.z) + masked + eps;
        }
    }
}

/// `dN_c`, `r_c` of the chunk from `t0` from its saved denominators, and (with keys) the masked
/// `M = tril(dN_c V_cᵀ + r)` into `w.mm`.
#[inline(always)]
fn chunk_grads<T: Real>(
    d: &LinearDims,
    isa: Isa,
    rows: &Rows<T>,
    keys: &Keys<T>,
    (t0, n, nk): (usize, usize, usize),
    w: &mut Work<T>,
) {
    let (wd, c) = (d.dv, w.chunk());
    let (dn, r) = (&mut w.dn[..n * wd], &mut w.r[..n]);
    rows.grads(t0, &w.den[t0..t0 + n], dn, r);
    if nk > 0 {
        tril_products(isa, n, nk, wd, dn, wd, keys.values(t0), keys.ldv, &mut w.bt, &mut w.mm, c);
        for (i, (row, &ri)) in w.mm.chunks_mut(c).zip(r.iter()).enumerate() {
            row[..nk.min(i + 1)].iter_mut().for_each(|x| *x = *x + ri);
        }
    }
}

/// One query head, causal, in two passes over the chunks: writes `acc.dq`, adds to `acc.dk`,
/// `acc.dv`.
#[inline(always)]
fn causal<T: Real>(
    isa: Isa,
    d: &LinearDims,
    p: &LinearParams,
    rows: &Rows<T>,
    keys: Keys<T>,
    w: &mut Work<T>,
    mut acc: Acc<T>,
) {
    let (f, wd, c, l) = (d.f, d.dv, w.chunk(), d.lq);
    let sizes = |t0: usize| (t0, c.min(l - t0), keys.count(t0, c.min(l - t0)));
    w.st.iter_mut().chain(w.z.iter_mut()).for_each(|x| *x = T::zero());
    for t0 in (0..l).step_by(c) {
        let (_, n, nk) = sizes(t0);
        let mut den = std::mem::take(&mut w.den);
        chunk_products(isa, d, p, rows, &keys, sizes(t0), w, Some(&mut den[t0..t0 + n]));
        w.den = den;
        chunk_grads(d, isa, rows, &keys, sizes(t0), w);
        let (fq, fk, dn) = (&w.fq[..n * f], &w.fk[..nk * f], &w.dn[..n * wd]);
        let dfq = cleared(&mut w.dfq, n * f);
        gemm(isa, n, f, wd, Lhs::rows(dn, wd), &w.st, f, dfq, f);
        dfq.chunks_exact_mut(f).zip(&w.r[..n]).for_each(|(row, &ri)| axpy(row, ri, &w.z));
        if nk > 0 {
            gemm(isa, n, f, nk, Lhs::rows(&w.mm, c).part(Part::LowerA), fk, f, dfq, f);
            gemm(isa, wd, f, nk, Lhs::transposed(keys.values(t0), keys.ldv), fk, f, &mut w.st, f);
            add_rows(&mut w.z, fk, nk);
        }
        rows.vjp(isa, p.map, t0, n, fq, dfq, acc.dq);
    }
    w.u.iter_mut().chain(w.wsum.iter_mut()).for_each(|x| *x = T::zero());
    for t0 in (0..l).step_by(c).rev() {
        let (_, n, nk) = sizes(t0);
        chunk_products(isa, d, p, rows, &keys, sizes(t0), w, None);
        chunk_grads(d, isa, rows, &keys, sizes(t0), w);
        if nk > 0 {
            transpose(isa, &w.u, wd, f, wd, &mut w.ut, f);
            key_grads(isa, d, p.map, &keys, sizes(t0), true, w, &mut acc);
        }
        let (fq, dn) = (&w.fq[..n * f], &w.dn[..n * wd]);
        gemm(isa, f, wd, n, Lhs::transposed(fq, f), dn, wd, &mut w.u, wd);
        fq.chunks_exact(f).zip(&w.r[..n]).for_each(|(x, &ri)| axpy(&mut w.wsum, ri, x));
    }
}
