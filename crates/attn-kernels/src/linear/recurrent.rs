//! Recurrent decoding with causal linear attention: per (batch, key/value head) the state
//! `S = Σ_j φ(k_j) v_jᵀ: [F, Dv]` and `z = Σ_j φ(k_j): [F]`; one token updates it in `O(F·Dv)` and
//! reads `out = φ(q)·S / (φ(q)·z + ε)`, the causal forward's last row. For FAVOR+ the keys'
//! stabiliser is the running maximum of their logits: when a new key raises it, `S` and `z` are
//! rescaled by `exp(c_old − c_new)` (as the online softmax does), so the state equals the causal
//! forward's up to the common factor that only `ε` sees.

use super::feature::{favor_logits, Stab};
use super::{validate, FeatureMap, LinearParams};
use crate::error::{AttnError, Result};
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

/// The decoding state of causal linear attention.
#[derive(Debug, Clone)]
pub struct LinearState<T> {
    map: FeatureMap,
    eps: f64,
    /// `[B, Hkv, D, Dv]` as `b, hkv, d, dv`.
    dims: [usize; 4],
    f: usize,
    /// `S: [B, Hkv, F, Dv]`.
    s: Vec<T>,
    /// `z: [B, Hkv, F]`.
    z: Vec<T>,
    /// FAVOR+'s running key stabiliser per `(b, hkv)` (−∞ before the first key).
    c: Vec<T>,
    len: usize,
}

impl<T: Real> LinearState<T> {
    /// An empty state for `b` sequences of `hkv` key/value heads, keys of dimension `d` and
    /// values of `dv`, with `ε = eps` (finite, `> 0`).
    pub fn new(map: FeatureMap, eps: f64, b: usize, hkv: usize, d: usize, dv: usize) -> Result<Self> {
        map.check(d)?;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(AttnError::Param { field: "eps", reason: format!("{eps}, expected finite and > 0") });
        }
        let f = map.features(d);
        Ok(Self {
            map,
            eps,
            dims: [b, hkv, d, dv],
            f,
            s: vec![T::zero(); b * hkv * f * dv],
            z: vec![T::zero(); b * hkv * f],
            c: vec![T::neg_infinity(); b * hkv],
            len: 0,
        })
    }

    /// Tokens folded in so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token was folded in yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Folds in one token's `k: [B, Hkv, 1, D]`, `v: [B, Hkv, 1, Dv]` and returns the attention of
    /// `q: [B, Hq, 1, D]` over every token so far: `[B, Hq, 1, Dv]`.
    pub fn step(&mut self, q: View4<T>, k: View4<T>, v: View4<T>) -> Result<Vec<T>> {
        let p = LinearParams { eps: self.eps, ..LinearParams::new(&self.map) };
        let d = validate(&q, &k, &v, &p)?;
        let [b, hkv, dk, dv] = self.dims;
        let checks = [("q", "L", 1, d.lq), ("k", "L", 1, d.lk), ("k", "B", b, d.b), ("k", "H", hkv, d.hkv)];
        let checks = checks.into_iter().chain([("k", "D", dk, d.d), ("v", "D", dv, d.dv)]);
        if let Some((tensor, dim, expected, found)) = checks.into_iter().find(|c| c.2 != c.3) {
            return Err(AttnError::DimMismatch { tensor, dim, expected, found });
        }
        let (f, isa) = (self.f, Isa::Portable);
        let eps = T::from_f64(self.eps).expect("finite");
        let mut fk = vec![T::zero(); f];
        let mut fq = vec![T::zero(); f];
        let mut out = vec![T::zero(); d.b * d.hq * dv];
        for bh in 0..b * hkv {
            let (bi, h) = (bh / hkv, bh % hkv);
            let (s, z) = (&mut self.s[bh * f * dv..][..f * dv], &mut self.z[bh * f..][..f]);
            match &self.map {
                FeatureMap::Favor(ff) => {
                    favor_logits(isa, ff, 1, k.row(bi, h, 0), dk, &mut fk);
                    let c = fk.iter().fold(self.c[bh], |a, &x| a.max(x));
                    let rescale = (self.c[bh] - c).exp();
                    s.iter_mut().chain(z.iter_mut()).for_each(|x| *x = *x * rescale);
                    let scale = T::from_f64(1.0 / (f as f64).sqrt()).expect("finite");
                    fk.iter_mut().for_each(|u| *u = (*u - c).exp() * scale);
                    self.c[bh] = c;
                }
                map => map.apply(isa, 1, dk, k.row(bi, h, 0), dk, &mut fk, Stab::Row),
            }
            for (r, &x) in fk.iter().enumerate() {
                s[r * dv..][..dv].iter_mut().zip(v.row(bi, h, 0)).for_each(|(a, &y)| *a = *a + x * y);
                z[r] = z[r] + x;
            }
            for hq in h * d.group()..(h + 1) * d.group() {
                self.map.apply(isa, 1, dk, q.row(bi, hq, 0), dk, &mut fq, Stab::Row);
                let o = &mut out[(bi * d.hq + hq) * dv..][..dv];
                for (r, &x) in fq.iter().enumerate() {
                    o.iter_mut().zip(&s[r * dv..][..dv]).for_each(|(a, &y)| *a = *a + x * y);
                }
                let den = fq.iter().zip(z.iter()).fold(eps, |a, (&x, &y)| a + x * y);
                o.iter_mut().for_each(|x| *x = *x / den);
            }
        }
        self.len += 1;
        Ok(out)
    }
}
