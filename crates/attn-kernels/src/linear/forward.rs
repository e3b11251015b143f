//! The fast forward of linear attention, parallel over (batch, query head):
//! - non-causal: the state `S = φ(K)ᵀV: [F, Dv]`, `z = Σ_j φ(k_j)`, then `out = φ(Q)·S / (φ(Q)·z + ε)`;
//! - causal, chunk by chunk of `C` rows: `out_c = φ(Q_c)·S + tril(φ(Q_c)φ(K_c)ᵀ)·V_c` (the state
//!   holds the earlier chunks), the denominators likewise with `z`, then `S += φ(K_c)ᵀV_c`,
//!   `z += Σ φ(K_c)`.
//!
//! The products run through `gemm`'s register-blocked loops; the keys' features are computed once
//! per key/value head and shared by its query heads.

use rayon::prelude::*;

use super::chunk::{add_rows, dot, tril_products, Keys};
use super::gemm::{gemm, Lhs};
use super::{head, key_features, validate, LinearDims, LinearParams};
use crate::alloc;
use crate::error::Result;
use crate::isa::Isa;
use crate::reference::Real;
use crate::view::View4;

/// Linear attention of `q: [B, Hq, Lq, D]` over `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`:
/// `out: [B, Hq, Lq, Dv]` (see [the module](super) for the formula).
pub fn linear_attention<T: Real>(q: View4<T>, k: View4<T>, v: View4<T>, p: &LinearParams) -> Result<Vec<T>> {
    let d = validate(&q, &k, &v, p)?;
    let mut out = alloc::filled("linear attention output", &d.out_shape(), T::zero())?;
    if d.is_empty() {
        return Ok(out);
    }
    let isa = Isa::best();
    let fk = key_features(isa, &k, p, &d)?;
    out.par_chunks_mut(d.lq * d.dv).enumerate().for_each(|(bh, o)| {
        let (b, h) = (bh / d.hq, bh % d.hq);
        let hk = h / d.group();
        let mut fq = vec![T::zero(); d.lq * d.f];
        p.map.apply_head(isa, &q, b, h, d.lq, &mut fq, false);
        let (vs, ldv) = head(&v, b, hk);
        let keys = Keys { fk: &fk[(b * d.hkv + hk) * d.lk * d.f..][..d.lk * d.f], v: vs, ldv, valid: d.valid(p, b) };
        if p.causal {
            causal(isa, &d, p, &fq, keys, o);
        } else {
            global(isa, &d, p, &fq, keys, o);
        }
    });
    Ok(out)
}

/// One head, non-causal: `o: [Lq, Dv]`.
fn global<T: Real>(isa: Isa, d: &LinearDims, p: &LinearParams, fq: &[T], keys: Keys<T>, o: &mut [T]) {
    let (f, dv) = (d.f, d.dv);
    let mut s = vec![T::zero(); f * dv];
    let mut z = vec![T::zero(); f];
    gemm(isa, f, dv, keys.valid, Lhs::transposed(keys.fk, f), keys.v, keys.ldv, &mut s, dv);
    add_rows(&mut z, keys.fk, keys.valid);
    gemm(isa, d.lq, dv, f, Lhs::rows(fq, f), &s, dv, o, dv);
    let eps = T::from_f64(p.eps).expect("finite");
    for (oi, fqi) in o.chunks_exact_mut(dv).zip(fq.chunks_exact(f)) {
        let den = dot(fqi, &z) + eps;
        oi.iter_mut().for_each(|x| *x = *x / den);
    }
}

/// One head, causal, chunk by chunk: `o: [L, Dv]`.
fn causal<T: Real>(isa: Isa, d: &LinearDims, p: &LinearParams, fq: &[T], keys: Keys<T>, o: &mut [T]) {
    let (f, dv, c) = (d.f, d.dv, p.chunk);
    let eps = T::from_f64(p.eps).expect("finite");
    let mut s = vec![T::zero(); f * dv];
    let mut z = vec![T::zero(); f];
    let (mut pm, mut kt, mut den) = (vec![T::zero(); c * c], Vec::new(), vec![T::zero(); c]);
    for t0 in (0..d.lq).step_by(c) {
        let n = c.min(d.lq - t0);
        let nk = n.min(keys.valid.saturating_sub(t0));
        let (fqc, oc) = (&fq[t0 * f..][..n * f], &mut o[t0 * dv..][..n * dv]);
        gemm(isa, n, dv, f, Lhs::rows(fqc, f), &s, dv, oc, dv);
        for (di, fqi) in den.iter_mut().zip(fqc.chunks_exact(f)) {
            *di = dot(fqi, &z) + eps;
        }
        if nk > 0 {
            let (fkc, vc) = (&keys.fk[t0 * f..], &keys.v[t0 * keys.ldv..]);
            tril_products(isa, n, nk, f, fqc, f, fkc, f, &mut kt, &mut pm, c);
            for (di, row) in den.iter_mut().zip(pm.chunks(c)) {
                *di = row[..nk].iter().fold(*di, |a, &b| a + b);
            }
            gemm(isa, n, dv, nk, Lhs::rows(&pm, c), vc, keys.ldv, oc, dv);
            gemm(isa, f, dv, nk, Lhs::transposed(fkc, f), vc, keys.ldv, &mut s, dv);
            add_rows(&mut z, fkc, nk);
        }
        for (oi, &di) in oc.chunks_exact_mut(dv).zip(&den) {
            oi.iter_mut().for_each(|x| *x = *x / di);
        }
    }
}
