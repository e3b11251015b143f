//! Tiles of f32 rounded to bfloat16 pairs with the vector instruction set, for the bfloat16
//! products ([`crate::Precision::Bf16`]): [`pair_rows`] pairs two rows column by column (the
//! operands whose reduction index runs over rows: the backward's `P̄ᵀ·dO`, `dXᵀ·Q`), and
//! [`pair_keys`] pairs columns `l` and `l + W` of each `2·W` panel of a row (the broadcast operand
//! of `P·V` and `dX·K`, against values or keys packed by `pack::pack_key_pairs`). Rounding is
//! `Simd::pack_bf16`'s (to nearest, ties to even, NaN kept), the scalar tails `half`'s, the same.

use super::pack::pair;
use super::simd::{KvElem, Simd};

/// `dst` row `u` (stride `ldd`, `⌈rows/2⌉` rows) = rows `2u` and `2u + 1` of `src` (stride `lds`,
/// `rows` rows; the row after an odd last one reads as 0) rounded to bfloat16 and paired per
/// column, `2u` in the low half, over `cols` columns.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `src` is valid for `rows` rows of `cols` floats, `dst`
/// for `⌈rows/2⌉` rows of `cols`.
#[inline(always)]
pub unsafe fn pair_rows<S: Simd>(src: *const f32, lds: usize, rows: usize, cols: usize, dst: *mut f32, ldd: usize) {
    let vc = cols / S::W * S::W;
    // SAFETY: every access stays within the extents the caller guarantees.
    unsafe {
        for u in 0..rows.div_ceil(2) {
            let (lo, hi) = (src.add(2 * u * lds), (2 * u + 1 < rows).then(|| src.add((2 * u + 1) * lds)));
            let out = dst.add(u * ldd);
            let mut c = 0;
            while c < vc {
                let h = hi.map_or(S::splat(0.0), |hi| S::load(hi.add(c)));
                S::store(out.add(c), S::pack_bf16(S::load(lo.add(c)), h));
                c += S::W;
            }
            for c in vc..cols {
                let h = hi.map_or(0, |hi| (*hi.add(c)).bf16_bits());
                *out.add(c) = pair((*lo.add(c)).bf16_bits(), h);
            }
        }
    }
}

/// `dst` row `r` (stride `ldd`, `width/2` slots) = row `r` of `src` (stride `lds`) with columns
/// `n..width` set to 0 first, rounded to bfloat16 and paired per `2·W` panel: slot `g·W + l` holds
/// columns `2W·g + l` (low half) and `2W·g + l + W`, `width` a multiple of `2·W`.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `src` is valid for `rows` rows of `width` floats, `dst`
/// for `rows` rows of `width / 2`.
#[inline(always)]
pub unsafe fn pair_keys<S: Simd>(
    src: *mut f32,
    lds: usize,
    rows: usize,
    n: usize,
    width: usize,
    dst: *mut f32,
    ldd: usize,
) {
    let pw = 2 * S::W;
    // SAFETY: every access stays within the extents the caller guarantees.
    unsafe {
        for r in 0..rows {
            let row = src.add(r * lds);
            std::slice::from_raw_parts_mut(row.add(n), width - n).fill(0.0);
            for g in 0..width / pw {
                let (lo, hi) = (S::load(row.add(g * pw)), S::load(row.add(g * pw + S::W)));
                S::store(dst.add(r * ldd + g * S::W), S::pack_bf16(lo, hi));
            }
        }
    }
}
