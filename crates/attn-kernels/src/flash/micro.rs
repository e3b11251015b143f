//! The micro-kernels of the flash kernel, generic over the vector ISA ([`Simd`]) and the storage
//! type of keys and values ([`KvElem`]):
//! - [`qk_panel`]: scores of `R` query rows against one packed key panel of `2·W` keys
//!   (`S[r][c] = Σ_d q[r][d] · panel[d][c]`), the prefill path;
//! - [`qk_rows`]: scores of `R` query rows against keys in their natural `[Lk, D]` layout, the
//!   decode path, where packing would cost more memory traffic than it saves;
//! - [`pv`]: `O[r][·] += Σ_j P[r][j] · V[j][·]` for `R` rows over a `NV·W`-wide slice of `Dv`.
//!
//! `qk_panel` and `pv` multiply through a [`Product`]: f32 fused multiply-adds ([`Fma`]), or
//! bfloat16 pairs ([`Bf16Pairs`], for [`crate::Precision::Bf16`]), where each f32 slot of both
//! operands holds two bfloat16 values and the reduction index runs over pairs.
//!
//! All take raw pointers with leading dimensions; callers guarantee every pointer is valid for
//! the rows and columns named.

// Micro-kernels take each operand as a pointer and a leading dimension, as BLAS kernels do.
#![allow(clippy::too_many_arguments)]

use crate::simd::{KvElem, Simd};

/// How a micro-kernel multiplies a broadcast operand into a vector and accumulates.
pub trait Product {
    /// `acc + x·b`, the operands as the product reads them.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    unsafe fn madd<S: Simd>(x: S::V, b: S::V, acc: S::V) -> S::V;
    /// The same on one slot of each operand (the column tails; the product is rounded before it
    /// is added, which for bfloat16 pairs is exact).
    fn scalar(x: f32, b: f32, acc: f32) -> f32;
}

/// f32 operands, one fused multiply-add per slot.
pub struct Fma;

impl Product for Fma {
    #[inline(always)]
    unsafe fn madd<S: Simd>(x: S::V, b: S::V, acc: S::V) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::fma(x, b, acc) }
    }
    #[inline(always)]
    fn scalar(x: f32, b: f32, acc: f32) -> f32 {
        acc + x * b
    }
}

/// Slots holding bfloat16 pairs (`Simd::pack_bf16`), multiplied pairwise with f32 accumulation.
pub struct Bf16Pairs;

impl Product for Bf16Pairs {
    #[inline(always)]
    unsafe fn madd<S: Simd>(x: S::V, b: S::V, acc: S::V) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::dot_bf16(acc, x, b) }
    }
    #[inline(always)]
    fn scalar(x: f32, b: f32, acc: f32) -> f32 {
        let halves = |v: f32| (f32::from_bits(v.to_bits() << 16), f32::from_bits(v.to_bits() & 0xFFFF_0000));
        let ((x0, x1), (b0, b1)) = (halves(x), halves(b));
        acc + x1 * b1 + x0 * b0
    }
}

/// Scores `scale · q·k` of `R` query rows, stored transposed (`q[k·R + r]`, `[d][R]`, so each
/// broadcast is at a fixed offset), against the packed panel `kp` (`[d][2·W]`), written to `s`
/// (row stride `lds`, `2·W` columns); `d` counts slots (pairs of the head dimension for
/// [`Bf16Pairs`]).
///
/// # Safety
/// `q` valid for `d·R` floats, `kp` for `d·2·W` floats, `s` for `R` rows of `2·W`.
#[inline(always)]
pub unsafe fn qk_panel<S: Simd, P: Product, const R: usize>(
    q: *const f32,
    kp: *const f32,
    d: usize,
    scale: f32,
    s: *mut f32,
    lds: usize,
) {
    // SAFETY: the caller guarantees the extents above; all offsets stay inside them.
    unsafe {
        let mut acc = [[S::splat(0.0); 2]; R];
        for k in 0..d {
            let b0 = S::load(kp.add(k * 2 * S::W));
            let b1 = S::load(kp.add(k * 2 * S::W + S::W));
            for (r, a) in acc.iter_mut().enumerate() {
                let x = S::splat(*q.add(k * R + r));
                a[0] = P::madd::<S>(x, b0, a[0]);
                a[1] = P::madd::<S>(x, b1, a[1]);
            }
        }
        let sc = S::splat(scale);
        for (r, a) in acc.iter().enumerate() {
            S::store(s.add(r * lds), S::mul(a[0], sc));
            S::store(s.add(r * lds + S::W), S::mul(a[1], sc));
        }
    }
}

/// Scores `scale · q·k` of `R` rows of `q` (row stride `ldq`) against `n` keys at `k` (row
/// stride `ldk` elements), all of length `d`, written to `s[r·lds + j]`.
///
/// # Safety
/// `q` valid for `R` rows of `d` floats, `k` for `n` rows of `d` elements, `s` for `R` rows of `n`.
#[inline(always)]
pub unsafe fn qk_rows<S: Simd, E: KvElem, const R: usize>(
    q: *const f32,
    ldq: usize,
    k: *const E,
    ldk: usize,
    n: usize,
    d: usize,
    scale: f32,
    s: *mut f32,
    lds: usize,
) {
    const J: usize = 4;
    let dv = d / S::W * S::W;
    // SAFETY: the caller guarantees the extents above; vector loads stop at `dv <= d`.
    unsafe {
        let mut j = 0;
        while j < n {
            let nj = J.min(n - j);
            let mut acc = [[S::splat(0.0); J]; R];
            let mut c = 0;
            while c < dv {
                let mut kv = [S::splat(0.0); J];
                for (jj, x) in kv.iter_mut().enumerate().take(nj) {
                    *x = E::load::<S>(k.add((j + jj) * ldk + c));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let qv = S::load(q.add(r * ldq + c));
                    for jj in 0..J {
                        a[jj] = S::fma(qv, kv[jj], a[jj]);
                    }
                }
                c += S::W;
            }
            for (r, a) in acc.iter().enumerate() {
                let sums = S::reduce_sum4(*a);
                for (jj, &v) in sums.iter().enumerate().take(nj) {
                    let tail: f32 = (dv..d).map(|c| *q.add(r * ldq + c) * (*k.add((j + jj) * ldk + c)).to_f32()).sum();
                    *s.add(r * lds + j + jj) = (v + tail) * scale;
                }
            }
            j += J;
        }
    }
}

/// `o[r][c0 + ·] += Σ_{j<n} p[r·ldp + j·ldj] · v[j·ldv + c0 + ·]` for `R` rows over `NV·W`
/// columns starting at `c0`. `ldj = 1` reads `P` row-major; `ldp = 1` reads it transposed (the
/// backward's `Pᵀ·dO` and `dSᵀ·Q` without a transposed copy).
///
/// # Safety
/// `p` valid for `R` rows of `n` at those strides, `v` for `n` rows reaching column `c0 + NV·W`, `o` likewise
/// for `R` rows.
#[inline(always)]
pub unsafe fn pv<S: Simd, P: Product, E: KvElem, const R: usize, const NV: usize>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    o: *mut f32,
    ldo: usize,
    c0: usize,
) {
    // SAFETY: the caller guarantees the extents above.
    unsafe {
        let mut acc = [[S::splat(0.0); NV]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            for (c, x) in a.iter_mut().enumerate() {
                *x = S::load(o.add(r * ldo + c0 + c * S::W));
            }
        }
        for j in 0..n {
            let mut vv = [S::splat(0.0); NV];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = E::load::<S>(v.add(j * ldv + c0 + c * S::W));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let pr = S::splat(*p.add(r * ldp + j * ldj));
                for c in 0..NV {
                    a[c] = P::madd::<S>(pr, vv[c], a[c]);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, &x) in a.iter().enumerate() {
                S::store(o.add(r * ldo + c0 + c * S::W), x);
            }
        }
    }
}

/// Scalar `o[r][c] += Σ_{j<n} p[r·ldp + j·ldj] · v[j][c]` for `rows` rows over columns `c0..c1`: the tail
/// of `Dv` that is not a multiple of the vector width.
///
/// # Safety
/// As for [`pv`], with `rows` rows and columns up to `c1`.
#[inline(always)]
pub unsafe fn pv_scalar<P: Product, E: KvElem>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    o: *mut f32,
    ldo: usize,
    rows: usize,
    cols: std::ops::Range<usize>,
) {
    // SAFETY: the caller guarantees the extents above.
    unsafe {
        for r in 0..rows {
            for c in cols.clone() {
                let mut acc = *o.add(r * ldo + c);
                for j in 0..n {
                    acc = P::scalar(*p.add(r * ldp + j * ldj), (*v.add(j * ldv + c)).to_f32(), acc);
                }
                *o.add(r * ldo + c) = acc;
            }
        }
    }
}
