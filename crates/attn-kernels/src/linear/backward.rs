//! The fast backward of linear attention, parallel over (batch, key/value head), each task
//! running the query heads of its group in turn and summing their `dφ(K)`, `dV`.
//!
//! With `den_i = φ(q_i)·z_i + ε`, `dn_i = dO_i / den_i` and `r_i = −dO_i·out_i / den_i`, the weights'
//! gradient is `ds_ij = dn_i·v_j + r_i` on the allowed pairs, and
//! `dφ(q_i) = Σ_j ds_ij φ(k_j)`, `dφ(k_j) = Σ_i ds_ij φ(q_i)`, `dv_j = Σ_i (φ(q_i)·φ(k_j)) dn_i`.
//! Non-causal, through the states `Sᵀ = Vᵀφ(K)`, `z` and `U = φ(Q)ᵀ·dN`, `w = Σ_i r_i φ(q_i)`.
//! Causal, in two passes over the chunks: ascending (state `Sᵀ`, `z`) for the denominators, `dN`,
//! `r` and `dφ(Q)`, keeping each chunk's masked products `P = tril(φ(Q_c)φ(K_c)ᵀ)` and
//! `M = tril(dN_c V_cᵀ + r)`; descending (state `U`, `w` of the later chunks) for `dφ(K)` and `dV`.
//! Memory: `O(L·(Dv + C))` per task besides the gradients.

use rayon::prelude::*;

use super::chunk::{add_rows, axpy, dot, tril_products, Keys};
use super::gemm::{gemm, Lhs};
use super::{check_out, head, key_features, validate, LinearDims, LinearParams};
use crate::error::Result;
use crate::grad::AttnGrads;
use crate::isa::Isa;
use crate::reference::Real;
use crate::view::View4;

/// One query head's rows as the backward reads them.
struct Rows<'a, T> {
    /// `φ(Q): [Lq, F]`.
    fq: &'a [T],
    out: View4<'a, T>,
    dout: View4<'a, T>,
    b: usize,
    h: usize,
}

impl<T: Real> Rows<'_, T> {
    /// `dn_i = dO_i / den_i` into `dn` and `r_i = −dO_i·out_i / den_i` into `r`, for the rows
    /// `t0 .. t0 + den.len()`.
    fn grads(&self, t0: usize, den: &[T], dn: &mut [T], r: &mut [T]) {
        let dv = self.out.dims()[3];
        for (i, ((&di, dni), ri)) in den.iter().zip(dn.chunks_exact_mut(dv)).zip(r.iter_mut()).enumerate() {
            let g = self.dout.row(self.b, self.h, t0 + i);
            dni.iter_mut().zip(g).for_each(|(a, &x)| *a = x / di);
            *ri = -dot(g, self.out.row(self.b, self.h, t0 + i)) / di;
        }
    }
}

/// The gradients one query head adds to: `dφ(Q)` (its own), `dφ(K)` and `dV` (its key/value
/// head's).
struct Acc<'a, T> {
    dfq: &'a mut [T],
    dfk: &'a mut [T],
    dv: &'a mut [T],
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
    let mut g = AttnGrads::zeros(&d.attn(), None, false, None)?;
    if d.is_empty() {
        return Ok(g);
    }
    let isa = Isa::best();
    let fk = key_features(isa, &k, p, &d)?;
    let group = d.group();
    let (dq, dk, dv) = (&mut g.dq, &mut g.dk, &mut g.dv);
    let tasks =
        dq.par_chunks_mut(group * d.lq * d.d).zip(dk.par_chunks_mut(d.lk * d.d)).zip(dv.par_chunks_mut(d.lk * d.dv));
    tasks.enumerate().for_each(|(bh, ((dq, dk), dvo))| {
        let (b, hk) = (bh / d.hkv, bh % d.hkv);
        let (vs, ldv) = head(&v, b, hk);
        let keys = Keys { fk: &fk[bh * d.lk * d.f..][..d.lk * d.f], v: vs, ldv, valid: d.valid(p, b) };
        let mut dfk = vec![T::zero(); d.lk * d.f];
        let (mut fq, mut dfq) = (vec![T::zero(); d.lq * d.f], vec![T::zero(); d.lq * d.f]);
        for (gi, dq) in dq.chunks_exact_mut(d.lq * d.d).enumerate() {
            let h = hk * group + gi;
            p.map.apply_head(isa, &q, b, h, d.lq, &mut fq, false);
            dfq.iter_mut().for_each(|x| *x = T::zero());
            let rows = Rows { fq: &fq, out, dout, b, h };
            let acc = Acc { dfq: &mut dfq, dfk: &mut dfk, dv: &mut *dvo };
            if p.causal {
                causal(isa, &d, p, &rows, keys, acc);
            } else {
                global(isa, &d, p, &rows, keys, acc);
            }
            let (qs, ldq) = head(&q, b, h);
            p.map.vjp(isa, d.lq, d.d, qs, ldq, &fq, &mut dfq, dq);
        }
        if keys.valid > 0 {
            let (ks, ldk) = head(&k, b, hk);
            p.map.vjp(isa, keys.valid, d.d, ks, ldk, keys.fk, &mut dfk, &mut dk[..keys.valid * d.d]);
        }
    });
    Ok(g)
}

/// `dst[j·m + i] = src[i·ld + j]` for `i < m`, `j < n`: `[m, n]` to `[n, m]`.
fn transpose<T: Real>(src: &[T], ld: usize, m: usize, n: usize, dst: &mut [T]) {
    for i in 0..m {
        for j in 0..n {
            dst[j * m + i] = src[i * ld + j];
        }
    }
}

/// One query head, non-causal: adds to `acc`'s `dfq: [Lq, F]`, `dfk: [Lk, F]`, `dv: [Lk, Dv]`.
fn global<T: Real>(isa: Isa, d: &LinearDims, p: &LinearParams, rows: &Rows<T>, keys: Keys<T>, acc: Acc<T>) {
    let Acc { dfq, dfk, dv } = acc;
    let (f, w, n) = (d.f, d.dv, keys.valid);
    let (mut st, mut z) = (vec![T::zero(); w * f], vec![T::zero(); f]);
    gemm(isa, w, f, n, Lhs::transposed(keys.v, keys.ldv), keys.fk, f, &mut st, f);
    add_rows(&mut z, keys.fk, n);
    let eps = T::from_f64(p.eps).expect("finite");
    let den: Vec<T> = rows.fq.chunks_exact(f).map(|x| dot(x, &z) + eps).collect();
    let (mut dn, mut r) = (vec![T::zero(); d.lq * w], vec![T::zero(); d.lq]);
    rows.grads(0, &den, &mut dn, &mut r);
    gemm(isa, d.lq, f, w, Lhs::rows(&dn, w), &st, f, dfq, f);
    let (mut u, mut ut, mut wsum) = (vec![T::zero(); f * w], vec![T::zero(); w * f], vec![T::zero(); f]);
    for ((row, &ri), fqi) in dfq.chunks_exact_mut(f).zip(&r).zip(rows.fq.chunks_exact(f)) {
        axpy(row, ri, &z);
        axpy(&mut wsum, ri, fqi);
    }
    gemm(isa, f, w, d.lq, Lhs::transposed(rows.fq, f), &dn, w, &mut u, w);
    transpose(&u, w, f, w, &mut ut);
    gemm(isa, n, f, w, Lhs::rows(keys.v, keys.ldv), &ut, f, dfk, f);
    dfk.chunks_exact_mut(f).take(n).for_each(|row| axpy(row, T::one(), &wsum));
    gemm(isa, n, w, f, Lhs::rows(keys.fk, f), &u, w, dv, w);
}

/// One query head, causal, in two passes over the chunks: adds to `acc`'s `dfq: [L, F]`, `dfk: [L, F]`,
/// `dv: [L, Dv]`.
fn causal<T: Real>(isa: Isa, d: &LinearDims, p: &LinearParams, rows: &Rows<T>, keys: Keys<T>, acc: Acc<T>) {
    let Acc { dfq, dfk, dv } = acc;
    let (f, w, c, l) = (d.f, d.dv, p.chunk, d.lq);
    let eps = T::from_f64(p.eps).expect("finite");
    let (mut pm, mut mm) = (vec![T::zero(); l * c], vec![T::zero(); l * c]);
    let (mut dn, mut r) = (vec![T::zero(); l * w], vec![T::zero(); l]);
    let (mut st, mut z, mut den, mut scratch) =
        (vec![T::zero(); w * f], vec![T::zero(); f], vec![T::zero(); c], Vec::new());
    let chunks = |t0: usize| (c.min(l - t0), c.min(l - t0).min(keys.valid.saturating_sub(t0)));
    for t0 in (0..l).step_by(c) {
        let (n, nk) = chunks(t0);
        let (fqc, fkc, vc) =
            (&rows.fq[t0 * f..][..n * f], &keys.fk[t0 * f..], &keys.v[(t0 * keys.ldv).min(keys.v.len())..]);
        let (pc, mc) = (&mut pm[t0 * c..][..n * c], &mut mm[t0 * c..][..n * c]);
        let den = &mut den[..n];
        den.iter_mut().zip(fqc.chunks_exact(f)).for_each(|(di, x)| *di = dot(x, &z) + eps);
        if nk > 0 {
            tril_products(isa, n, nk, f, fqc, f, fkc, f, &mut scratch, pc, c);
            den.iter_mut().zip(pc.chunks(c)).for_each(|(di, row)| *di = row[..nk].iter().fold(*di, |a, &b| a + b));
        }
        let (dnc, rc) = (&mut dn[t0 * w..][..n * w], &mut r[t0..t0 + n]);
        rows.grads(t0, den, dnc, rc);
        let dfqc = &mut dfq[t0 * f..][..n * f];
        gemm(isa, n, f, w, Lhs::rows(dnc, w), &st, f, dfqc, f);
        dfqc.chunks_exact_mut(f).zip(rc.iter()).for_each(|(row, &ri)| axpy(row, ri, &z));
        if nk > 0 {
            tril_products(isa, n, nk, w, dnc, w, vc, keys.ldv, &mut scratch, mc, c);
            for (i, (row, &ri)) in mc.chunks_mut(c).zip(rc.iter()).enumerate() {
                row[..nk.min(i + 1)].iter_mut().for_each(|x| *x = *x + ri);
            }
            gemm(isa, n, f, nk, Lhs::rows(mc, c), fkc, f, dfqc, f);
            gemm(isa, w, f, nk, Lhs::transposed(vc, keys.ldv), fkc, f, &mut st, f);
            add_rows(&mut z, fkc, nk);
        }
    }
    let (mut u, mut ut, mut wsum) = (st, vec![T::zero(); w * f], z);
    u.iter_mut().chain(wsum.iter_mut()).for_each(|x| *x = T::zero());
    for t0 in (0..l).step_by(c).rev() {
        let (n, nk) = chunks(t0);
        let (fqc, dnc, rc) = (&rows.fq[t0 * f..][..n * f], &dn[t0 * w..][..n * w], &r[t0..t0 + n]);
        if nk > 0 {
            let (fkc, vc) = (&keys.fk[t0 * f..][..nk * f], &keys.v[t0 * keys.ldv..]);
            let (dfkc, dvc) = (&mut dfk[t0 * f..][..nk * f], &mut dv[t0 * w..][..nk * w]);
            transpose(&u, w, f, w, &mut ut);
            gemm(isa, nk, f, w, Lhs::rows(vc, keys.ldv), &ut, f, dfkc, f);
            dfkc.chunks_exact_mut(f).for_each(|row| axpy(row, T::one(), &wsum));
            gemm(isa, nk, f, n, Lhs::transposed(&mm[t0 * c..], c), fqc, f, dfkc, f);
            gemm(isa, nk, w, f, Lhs::rows(fkc, f), &u, w, dvc, w);
            gemm(isa, nk, w, n, Lhs::transposed(&pm[t0 * c..], c), dnc, w, dvc, w);
        }
        gemm(isa, f, w, n, Lhs::transposed(fqc, f), dnc, w, &mut u, w);
        fqc.chunks_exact(f).zip(rc).for_each(|(x, &ri)| axpy(&mut wsum, ri, x));
    }
}
