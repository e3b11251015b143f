//! Tiles of f32 rounded to bfloat16 pairs with the vector instruction set, for the bfloat16
//! products ([`crate::Precision::Bf16`]): [`pair_rows`] pairs two rows column by column (the
//! operands whose reduction index runs over rows: the backward's `P̄ᵀ·dO`, `dXᵀ·Q`),
//! [`pair_keys`] pairs columns `l` and `l + W` of each `2·W` panel of a row (the broadcast operand
//! of `P·V` and `dX·K`, against values or keys packed by `pack::pack_key_pairs`), and
//! [`transpose_pairs`] pairs neighbouring values of a chunk of rows and transposes them (the
//! queries and output gradients `qk_panel` reads). Rounding is `Simd::pack_bf16`'s (to nearest,
//! ties to even, NaN kept), the scalar tails `half`'s, the same.

use super::pack::pair;
use crate::simd::{KvElem, Simd};

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

/// `out[k·ld + r]` = values `2k` and `2k + 1` of `rows[r]` rounded to bfloat16 and paired (`2k`
/// in the low half; a missing last odd value reads as 0), for the `⌈d/2⌉` slots of each row's
/// first `d` values, `n = rows.len() ≤ 16` rows; nothing else written. The bfloat16 form of
/// `Simd::transpose_rows`, through it: each block of 32 values of the rows is transposed into a
/// `[32][16]` scratch, whose rows [`pair_rows`] pairs two at a time.
///
/// # Safety
/// The CPU supports `S`'s instruction set.
///
/// # Panics
/// If `n > 16`, `n > ld`, a row holds fewer than `d` values or `out` fewer than the slots.
#[inline(always)]
pub unsafe fn transpose_pairs<S: Simd>(rows: &[&[f32]], d: usize, out: &mut [f32], ld: usize) {
    const LANES: usize = 16;
    const BLOCK: usize = 32;
    let n = rows.len();
    assert!(n <= LANES && n <= ld, "transpose_pairs: {n} rows, slots {ld} apart");
    let mut t = [0.0f32; BLOCK * LANES];
    let mut p = [0.0f32; BLOCK / 2 * LANES];
    let mut sub: [&[f32]; LANES] = [&[]; LANES];
    for k0 in (0..d).step_by(BLOCK) {
        let m = BLOCK.min(d - k0);
        for (s, r) in sub.iter_mut().zip(rows) {
            *s = &r[k0..k0 + m];
        }
        // SAFETY: the CPU supports `S` (the caller's contract); `t` holds `m ≤ 32` slots of 16
        // lanes and `p` their `⌈m/2⌉` pairs (lanes past `n` hold what earlier blocks left, paired
        // and never copied out).
        unsafe {
            S::transpose_rows(&sub[..n], m, &mut t, LANES);
            pair_rows::<S>(t.as_ptr(), LANES, m, LANES, p.as_mut_ptr(), LANES);
        }
        for (u, slot) in p.chunks_exact(LANES).take(m.div_ceil(2)).enumerate() {
            out[(k0 / 2 + u) * ld..][..n].copy_from_slice(&slot[..n]);
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

#[cfg(test)]
mod tests {
    use super::transpose_pairs;
    use crate::flash::pack::pair;
    use crate::simd::{KvElem, Portable, Simd};

    /// What `transpose_pairs` must write, one value at a time by `half`'s rounding.
    fn each(rows: &[&[f32]], d: usize, out: &mut [f32], ld: usize) {
        for k in 0..d.div_ceil(2) {
            for (r, row) in rows.iter().enumerate() {
                out[k * ld + r] = pair(
                    row[2 * k].bf16_bits(),
                    row.get(2 * k + 1).filter(|_| 2 * k + 1 < d).map_or(0, |x| x.bf16_bits()),
                );
            }
        }
    }

    /// Every vector path pairs and transposes bit for bit as the value-at-a-time rule (ties to
    /// even, NaN, infinities, values past `d` in the rows ignored), for row counts up to 16,
    /// packed or spaced slots, and head sizes around the 32-value blocks; nothing else written.
    ///
    /// # Safety
    /// The CPU supports `S`'s instruction set.
    unsafe fn matches_the_rule<S: Simd>() {
        let special = [
            0.0f32,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1.0 + f32::EPSILON * 64.0,
            1.0 + 1.0 / 256.0,
            f32::MIN_POSITIVE / 3.0,
        ];
        for d in [1, 2, 15, 31, 32, 33, 64, 65, 100] {
            let data: Vec<f32> = (0..16 * (d + 3))
                .map(|x| if x % 11 == 0 { special[x / 11 % special.len()] } else { (x as f32 * 0.37).sin() * 7.1 })
                .collect();
            // Rows `d + 3` long: the values past `d` must not reach a slot.
            let rows: Vec<&[f32]> = data.chunks(d + 3).collect();
            for (n, ld) in (1..=16).map(|n| (n, n)).chain([(12, 16), (3, 7)]) {
                let len = (d.div_ceil(2) - 1) * ld + n;
                let (mut got, mut want) = (vec![-1.0f32; len + 9], vec![-1.0f32; len + 9]);
                // SAFETY: the CPU supports `S` (this function's contract).
                unsafe { transpose_pairs::<S>(&rows[..n], d, &mut got, ld) };
                each(&rows[..n], d, &mut want, ld);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{n} rows of {d}, slots {ld} apart");
            }
        }
    }

    #[test]
    fn transposed_pairs_match_the_rule() {
        // SAFETY: each ISA runs only where the CPU has it (the portable one everywhere).
        unsafe {
            matches_the_rule::<Portable>();
            #[cfg(target_arch = "x86_64")]
            {
                use crate::simd::Isa;
                use crate::simd::{Avx2, Avx512};
                if Isa::Avx2.is_available() {
                    matches_the_rule::<Avx2>();
                }
                if Isa::Avx512.is_available() {
                    matches_the_rule::<Avx512<false>>();
                }
            }
        }
    }
}
