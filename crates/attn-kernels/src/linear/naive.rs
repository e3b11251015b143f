//! The oracle of linear attention: the naive `O(L²)` form, each row's weights
//! `s_ij = φ(q_i)·φ(k_j)` over its allowed keys, `out_i = Σ_j s_ij v_j / (Σ_j s_ij + ε)`, and its
//! backward written from the same sums: with `d_i = Σ_j s_ij + ε`, `dn_i = dO_i / d_i` and
//! `r_i = −dO_i·out_i / d_i`, the weights' gradient is `ds_ij = dn_i·v_j + r_i`, so
//! `dφ(q_i) = Σ_j ds_ij φ(k_j)`, `dφ(k_j) = Σ_i ds_ij φ(q_i)`, `dv_j = Σ_i s_ij dn_i`, then through
//! `φ`'s Jacobian. Generic over `f32`/`f64` (`f64` is the oracle, `f32` the "naive32" baseline).

use super::feature::Stab;
use super::{check_out, validate, LinearDims, LinearParams};
use crate::alloc;
use crate::error::Result;
use crate::grad::AttnGrads;
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

/// The features of one head's queries and valid keys, and its sizes.
struct Head<T> {
    fq: Vec<T>,
    fk: Vec<T>,
    valid: usize,
}

fn head_features<T: Real>(q: &View4<T>, k: &View4<T>, p: &LinearParams, d: &LinearDims, b: usize, h: usize) -> Head<T> {
    let valid = d.valid(p, b);
    let mut fq = vec![T::zero(); d.lq * d.f];
    let mut fk = vec![T::zero(); valid * d.f];
    p.map.apply_rows(Isa::Portable, q, (b, h), 0, d.lq, &mut fq, Stab::Row);
    p.map.apply_rows(Isa::Portable, k, (b, h / d.group()), 0, valid, &mut fk, Stab::Shared);
    Head { fq, fk, valid }
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |s, (&x, &y)| s + x * y)
}

/// The keys row `i` may see.
fn keys(p: &LinearParams, valid: usize, i: usize) -> std::ops::Range<usize> {
    0..if p.causal { valid.min(i + 1) } else { valid }
}

/// Row `i`'s output and denominator `Σ_j s_ij + ε`.
fn row<T: Real>(
    hd: &Head<T>,
    v: &View4<T>,
    p: &LinearParams,
    d: &LinearDims,
    b: usize,
    h: usize,
    i: usize,
) -> (Vec<T>, T) {
    let eps = T::from_f64(p.eps).expect("finite");
    let mut n = vec![T::zero(); d.dv];
    let mut den = eps;
    for j in keys(p, hd.valid, i) {
        let s = dot(&hd.fq[i * d.f..][..d.f], &hd.fk[j * d.f..][..d.f]);
        den = den + s;
        n.iter_mut().zip(v.row(b, h / d.group(), j)).for_each(|(o, &x)| *o = *o + s * x);
    }
    n.iter_mut().for_each(|o| *o = *o / den);
    (n, den)
}

/// The naive forward: `out: [B, Hq, Lq, Dv]`.
pub fn linear_reference<T: Real>(q: View4<T>, k: View4<T>, v: View4<T>, p: &LinearParams) -> Result<Vec<T>> {
    let d = validate(&q, &k, &v, p)?;
    let mut out = alloc::filled("linear attention output", &d.out_shape(), T::zero())?;
    if d.is_empty() {
        return Ok(out);
    }
    for (bh, o) in out.chunks_exact_mut(d.lq * d.dv).enumerate() {
        let (b, h) = (bh / d.hq, bh % d.hq);
        let hd = head_features(&q, &k, p, &d, b, h);
        for (i, oi) in o.chunks_exact_mut(d.dv).enumerate() {
            oi.copy_from_slice(&row(&hd, &v, p, &d, b, h, i).0);
        }
    }
    Ok(out)
}

/// The naive backward of [`linear_reference`] for the output gradient `dout: [B, Hq, Lq, Dv]`:
/// `dq`, and `dk`, `dv` summed over each key/value head's query heads.
pub fn linear_reference_backward<T: Real>(
    q: View4<T>,
    k: View4<T>,
    v: View4<T>,
    dout: View4<T>,
    p: &LinearParams,
) -> Result<AttnGrads<T>> {
    let d = validate(&q, &k, &v, p)?;
    check_out("grad_out", &dout, &d)?;
    let mut g = AttnGrads::zeros(&d.attn(), None, false, None)?;
    if d.is_empty() {
        return Ok(g);
    }
    for b in 0..d.b {
        for h in 0..d.hq {
            let hk = h / d.group();
            let hd = head_features(&q, &k, p, &d, b, h);
            let (mut dfq, mut dfk) = (vec![T::zero(); d.lq * d.f], vec![T::zero(); hd.valid * d.f]);
            for i in 0..d.lq {
                let (o, den) = row(&hd, &v, p, &d, b, h, i);
                let gi = dout.row(b, h, i);
                let dn: Vec<T> = gi.iter().map(|&x| x / den).collect();
                let r = -dot(gi, &o) / den;
                for j in keys(p, hd.valid, i) {
                    let (fqi, fkj) = (&hd.fq[i * d.f..][..d.f], &hd.fk[j * d.f..][..d.f]);
                    let ds = dot(&dn, v.row(b, hk, j)) + r;
                    let s = dot(fqi, fkj);
                    dfq[i * d.f..][..d.f].iter_mut().zip(fkj).for_each(|(a, &x)| *a = *a + ds * x);
                    dfk[j * d.f..][..d.f].iter_mut().zip(fqi).for_each(|(a, &x)| *a = *a + ds * x);
                    let dvj = &mut g.dv[((b * d.hkv + hk) * d.lk + j) * d.dv..][..d.dv];
                    dvj.iter_mut().zip(&dn).for_each(|(a, &x)| *a = *a + s * x);
                }
            }
            let (qs, ldq) = super::head(&q, b, h);
            let dq = &mut g.dq[(b * d.hq + h) * d.lq * d.d..][..d.lq * d.d];
            p.map.vjp(Isa::Portable, d.lq, d.d, qs, ldq, &hd.fq, &mut dfq, dq);
            let mut dk = vec![T::zero(); hd.valid * d.d];
            if hd.valid > 0 {
                let (ks, ldk) = super::head(&k, b, hk);
                p.map.vjp(Isa::Portable, hd.valid, d.d, ks, ldk, &hd.fk, &mut dfk, &mut dk);
            }
            let acc = &mut g.dk[(b * d.hkv + hk) * d.lk * d.d..][..hd.valid * d.d];
            acc.iter_mut().zip(dk).for_each(|(a, x)| *a = *a + x);
        }
    }
    Ok(g)
}
