//! What the chunked forward and backward share: one key/value head ([`Keys`]), the masked product
//! of a chunk with itself ([`tril_products`]), and the small vector helpers around the states.

use super::feature::Stab;
use super::gemm::{gemm, Lhs, Part};
use super::transpose::transpose;
use super::{head, FeatureMap, LinearDims, LinearParams};
use crate::lines::Lines;
use crate::reference::Real;
use crate::simd::Isa;
use crate::view::View4;

/// One key/value head as a query head reads it: its keys mapped chunk by chunk
/// ([`Keys::features`]), its values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys<'a, T> {
    k: View4<'a, T>,
    /// `(batch, key/value head)`.
    pub bh: (usize, usize),
    /// FAVOR+'s stabiliser over the head's valid keys.
    stab: Stab<T>,
    /// `V` from its first row, row stride `ldv`, `dv` values per row.
    pub v: &'a [T],
    pub ldv: usize,
    dv: usize,
    /// Keys of this batch entry that count.
    pub valid: usize,
}

impl<'a, T: Real> Keys<'a, T> {
    /// Key/value head `hk` of batch entry `b`.
    pub fn new(
        isa: Isa,
        k: View4<'a, T>,
        v: &View4<'a, T>,
        p: &LinearParams,
        d: &LinearDims,
        (b, hk): (usize, usize),
    ) -> Self {
        let valid = d.valid(p, b);
        let (v, ldv) = head(v, b, hk);
        Keys { k, bh: (b, hk), stab: p.map.key_stab(isa, &k, (b, hk), valid), v, ldv, dv: d.dv, valid }
    }

    /// Every key/value head's keys, in `[B, Hkv]` order.
    pub fn every(isa: Isa, k: View4<'a, T>, v: &View4<'a, T>, p: &LinearParams, d: &LinearDims) -> Vec<Self> {
        (0..d.b * d.hkv).map(|i| Self::new(isa, k, v, p, d, (i / d.hkv, i % d.hkv))).collect()
    }

    /// The keys of the chunk from `t0` that count (at most `n`).
    pub fn count(&self, t0: usize, n: usize) -> usize {
        n.min(self.valid.saturating_sub(t0))
    }

    /// `φ(K)` of the `nk` keys from `t0` (all valid) into `out: [nk, F]`.
    #[inline(always)]
    pub fn features(&self, isa: Isa, map: &FeatureMap, t0: usize, nk: usize, out: &mut [T]) {
        map.apply_rows(isa, &self.k, self.bh, t0, nk, out, self.stab);
    }

    /// `dk[i] = (∂φ/∂k)(k_{t0 + i})ᵀ·g_i` for the `nk` keys from `t0`, or with scratch `add`
    /// (`[nk, D]`) `dk[i] +=` it, given their features `fk` and `g = ∂L/∂φ(K_c)` (`[nk, F]`,
    /// overwritten for FAVOR+); `dk: [nk, D]` the keys' gradient rows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn vjp(
        &self,
        isa: Isa,
        map: &FeatureMap,
        (t0, nk): (usize, usize),
        fk: &[T],
        g: &mut [T],
        add: Option<&mut [T]>,
        dk: &mut [T],
    ) {
        let ((ks, ld), dd) = (head(&self.k, self.bh.0, self.bh.1), self.k.dims()[3]);
        let dk = &mut dk[..nk * dd];
        match add {
            None => map.vjp(isa, nk, dd, &ks[t0 * ld..], ld, fk, g, dk),
            Some(dx) => {
                let dx = &mut dx[..nk * dd];
                map.vjp(isa, nk, dd, &ks[t0 * ld..], ld, fk, g, dx);
                dk.iter_mut().zip(dx.iter()).for_each(|(a, &x)| *a = *a + x);
            }
        }
    }

    /// Prefetches the keys (or with `values`, the values) of the `n` rows from `t0` that count
    /// (see [`prefetch`]).
    #[inline(always)]
    pub fn prefetch(&self, t0: usize, n: usize, values: bool) {
        let n = self.count(t0, n);
        if values {
            prefetch_rows(self.v, self.ldv, self.dv, t0, n);
        } else {
            prefetch(&self.k, self.bh, t0, n);
        }
    }

    /// The values from row `t0`.
    pub fn values(&self, t0: usize) -> &'a [T] {
        &self.v[(t0 * self.ldv).min(self.v.len())..]
    }
}

/// `out[i·ldo + j] = a_i·b_j` for `j ≤ i` and `j < nk`, 0 for the other `j < n`: the causal product
/// of `n` rows of `a` (stride `lda`) with the chunk's first `nk` rows of `b` (stride `ldb`), all of
/// width `w`. `bt` is scratch (resized to `w·nk`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn tril_products<T: Real>(
    isa: Isa,
    n: usize,
    nk: usize,
    w: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    bt: &mut Lines<T>,
    out: &mut [T],
    ldo: usize,
) {
    bt.resize(w * nk, T::zero());
    transpose(isa, b, ldb, nk, w, bt, nk);
    gemm(isa, n, nk, w, Lhs::rows(a, lda).part(Part::LowerOut).write(true), bt, nk, out, ldo);
    for (i, row) in out.chunks_mut(ldo).take(n).enumerate() {
        row[i + 1..n].iter_mut().for_each(|x| *x = T::zero());
    }
}

/// Asks the CPU to bring the `n` rows from `t0` of head `(b, h)` of `x` into its L2 cache ahead
/// of their use: the chunk loops call it for their next chunk's inputs, one input at a time
/// between their products (a burst of them all waits for the CPU's miss buffers), so that reading
/// them from memory overlaps the current chunk's work rather than stalling the next chunk's first
/// loads (see docs/performance-log.md, "attn-kernels/src/linear/chunk.rs: prefetch"). Inside
/// [`spread_on_isa`] the lines are queued and asked for one per step of the products
/// ([`Spread`](crate::prefetch::Spread)). A hint that changes no result; nothing off x86-64 nor on
/// Intel CPUs ([`prefetches`]).
#[inline(always)]
pub(crate) fn prefetch<T>(x: &View4<T>, (b, h): (usize, usize), t0: usize, n: usize) {
    let (rows, ld) = head(x, b, h);
    prefetch_rows(rows, ld, x.dims()[3], t0, n);
}

/// The rows of a chunk from `t` that lie within `rows` (chunks of `c`): 0 beyond its end.
#[inline(always)]
pub(crate) fn ahead(rows: &std::ops::Range<usize>, t: usize, c: usize) -> usize {
    c.min(rows.end.saturating_sub(t))
}

/// [`prefetch`] of the `n` rows from `t0` of `x` (row stride `ld`, `w` elements each), within `x`;
/// nothing where [`prefetches`] says not to.
#[inline(always)]
pub(crate) fn prefetch_rows<T>(x: &[T], ld: usize, w: usize, t0: usize, n: usize) {
    if prefetches() {
        crate::prefetch::later_rows(x, ld, w, t0..t0 + n);
    }
}

/// Whether the chunk loops prefetch their next chunk's rows: everywhere but on Intel CPUs, by
/// what was measured: faster on AMD's, slower on Intel's, whose prefetch instructions stalled on
/// the miss buffers (see docs/performance-log.md, "attn-kernels/src/linear/chunk.rs: prefetches").
fn prefetches() -> bool {
    static AHEAD: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
            vendor != b"GenuineIntel"
        }
        #[cfg(not(target_arch = "x86_64"))]
        true
    });
    *AHEAD
}

/// Runs `f` inside a function compiled for `isa` (which must be available), so that the
/// element-wise work `f` inlines around the products (features, denominators, states, gradient
/// rows) is vectorised as widely as they are, with the rows its chunk loops prefetch queued and
/// asked for one line per step of the products ([`Spread`](crate::prefetch::Spread)). Give `f`
/// as an `#[inline(always)]` closure: one the compiler keeps as a function of its own is compiled
/// for the baseline instruction set, with all it inlines (the backward's key-state pass and
/// feature-map Jacobians ran on 4-lane SSE so).
#[inline(always)]
pub(crate) fn spread_on_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    let _spread = crate::prefetch::Spread::start();
    crate::simd::on_isa(isa, f)
}
