//! Register transposes: the 16 × 16 one of the AVX-512 implementation (`Simd::transpose_rows`: a
//! chunk of queries for `qk_panel`, half of a key panel for `pack::pack_keys`) and its streaming
//! form, with their test against the portable one-value-at-a-time default; and AVX's 8 × 8 blocks
//! for the linear kernels' transposes ([`transpose_blocks8`]).

use std::arch::x86_64::*;

/// The 16 × 16 transpose of `v` (`out[c]` lane `r` = `v[r]` lane `c`): pairs of 32-bit lanes,
/// then of 64-bit lanes, then two rounds of 128-bit lanes.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
pub(super) unsafe fn transpose16(v: [__m512; 16]) -> [__m512; 16] {
    // SAFETY: AVX-512F is present (the caller's contract).
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        for p in 0..8 {
            t[2 * p] = _mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]);
        }
        // `u[4g + c]`, 128-bit lane `L`: rows `4g..4g + 4` of column `4L + c`.
        let mut u = [_mm512_setzero_ps(); 16];
        let pd = _mm512_castps_pd;
        for g in 0..4 {
            let (a0, a1, b0, b1) = (pd(t[4 * g]), pd(t[4 * g + 1]), pd(t[4 * g + 2]), pd(t[4 * g + 3]));
            u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, b0));
            u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, b0));
            u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, b1));
            u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, b1));
        }
        let mut out = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            let (lo, hi) = (_mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]), _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]));
            let (lo2, hi2) =
                (_mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]), _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]));
            out[c] = _mm512_shuffle_f32x4::<0x88>(lo, lo2);
            out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(lo, lo2);
            out[4 + c] = _mm512_shuffle_f32x4::<0x88>(hi, hi2);
            out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(hi, hi2);
        }
        out
    }
}

/// Sixteen rows of `d` values (`d` a multiple of 16) transposed into `d` slots of 16 values,
/// `ld` apart from `out`, as `Simd::transpose_rows` writes them, but by streaming stores, which
/// write each slot's line without reading it first and leave it out of the caches: for a buffer
/// written once and read much later (the forward's packed heads, megabytes each, which the CPU
/// would otherwise read in from memory line by line before overwriting). Orders nothing: the
/// caller fences (`_mm_sfence`) before another thread may read `out`.
///
/// # Safety
/// The CPU has AVX-512F; every row holds `d` values; `out` and `ld` are multiples of 16 floats
/// (64 bytes) and `out` is valid for `(d − 1)·ld + 16` floats.
#[inline(always)]
pub(crate) unsafe fn transpose_rows_streaming(rows: &[&[f32]; 16], d: usize, out: *mut f32, ld: usize) {
    debug_assert!(d.is_multiple_of(16) && ld.is_multiple_of(16) && (out as usize).is_multiple_of(64));
    debug_assert!(rows.iter().all(|r| r.len() >= d));
    // SAFETY: AVX-512F is present and the loads and stores stay within the rows and slots
    // (the caller's contract); the slots are 64-byte aligned, as streaming stores need.
    unsafe {
        for k0 in (0..d).step_by(16) {
            let mut v = [_mm512_setzero_ps(); 16];
            for (x, row) in v.iter_mut().zip(rows) {
                *x = _mm512_loadu_ps(row.as_ptr().add(k0));
            }
            for (c, x) in transpose16(v).into_iter().enumerate() {
                _mm512_stream_ps(out.add((k0 + c) * ld), x);
            }
        }
    }
}

/// The 8 × 8 blocks of `[m, n]` (`m` and `n` multiples of 8) at stride `lds` transposed into
/// `dst`, `[n, m]` at stride `ldd`, each by register shuffles ([`block8`]).
///
/// # Safety
/// The CPU has AVX; `src` holds `[m, n]` with stride `lds`, `dst` `[n, m]` with stride `ldd`.
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose_blocks8(src: &[f32], lds: usize, m: usize, n: usize, dst: &mut [f32], ldd: usize) {
    debug_assert!(m.is_multiple_of(8) && n.is_multiple_of(8));
    for i in (0..m).step_by(8) {
        for j in (0..n).step_by(8) {
            // SAFETY: rows `i .. i + 8` and columns `j .. j + 8` are within both (the caller's contract).
            unsafe { block8(src.as_ptr().add(i * lds + j), lds, dst.as_mut_ptr().add(j * ldd + i), ldd) };
        }
    }
}

/// One 8 × 8 block: eight rows loaded, interleaved in pairs, then in fours, then halves swapped.
///
/// # Safety
/// The CPU has AVX; `s` is valid for 8 rows of 8 floats at stride `lds`, `d` likewise at `ldd`.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn block8(s: *const f32, lds: usize, d: *mut f32, ldd: usize) {
    // SAFETY: the loads and stores stay within the 8 × 8 blocks (the caller's contract).
    unsafe {
        let mut r = [_mm256_setzero_ps(); 8];
        for (k, x) in r.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(s.add(k * lds));
        }
        // Pairs: t[0] = a0 b0 a1 b1 | a4 b4 a5 b5, t[1] = a2 b2 a3 b3 | a6 b6 a7 b7, ...
        let mut t = [_mm256_setzero_ps(); 8];
        for p in 0..4 {
            t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        // Fours: q[c] holds column c of rows 0–3 (low half) and column c + 4 (high half); q[4 + c]
        // the same for rows 4–7.
        let mut q = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let (x, y) = (4 * h, 4 * h + 2);
            q[4 * h] = _mm256_shuffle_ps::<0x44>(t[x], t[y]);
            q[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(t[x], t[y]);
            q[4 * h + 2] = _mm256_shuffle_ps::<0x44>(t[x + 1], t[y + 1]);
            q[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(t[x + 1], t[y + 1]);
        }
        for c in 0..4 {
            _mm256_storeu_ps(d.add(c * ldd), _mm256_permute2f128_ps::<0x20>(q[c], q[4 + c]));
            _mm256_storeu_ps(d.add((c + 4) * ldd), _mm256_permute2f128_ps::<0x31>(q[c], q[4 + c]));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::simd::Avx512;
    use crate::simd::Isa;
    use crate::simd::{Portable, Simd};

    /// AVX-512's register transpose writes what the one-value-at-a-time default writes, for every
    /// row count of a chunk, slots packed or further apart (a key panel's half), and head
    /// dimensions around the 16-lane blocks, and nothing between the slots or beyond.
    #[test]
    fn transposed_rows_match_the_default() {
        if !Isa::Avx512.is_available() {
            return;
        }
        for d in [1, 7, 15, 16, 17, 33, 64, 100] {
            let data: Vec<f32> = (0..16 * d).map(|x| x as f32 + 0.5).collect();
            let rows: Vec<&[f32]> = data.chunks(d).collect();
            for (n, ld) in (1..=16).map(|n| (n, n)).chain([(16, 32), (5, 32), (3, 7)]) {
                let len = (d - 1) * ld + n;
                let (mut a, mut b) = (vec![-1.0f32; len + 20], vec![-1.0f32; len + 20]);
                // SAFETY: AVX-512F is present (checked); the default runs on any CPU.
                unsafe {
                    Avx512::<false>::transpose_rows(&rows[..n], d, &mut a, ld);
                    Portable::transpose_rows(&rows[..n], d, &mut b, ld);
                }
                assert_eq!(a, b, "{n} rows of {d}, slots {ld} apart");
                if n == 16 && d % 16 == 0 && ld % 16 == 0 {
                    let mut c = crate::lines::Lines::filled(len + 20, -1.0f32);
                    let full: [&[f32]; 16] = std::array::from_fn(|r| rows[r]);
                    // SAFETY: as above; `Lines` starts on a cache line and `ld` is 16 floats apart.
                    unsafe {
                        super::transpose_rows_streaming(&full, d, c.as_mut_ptr(), ld);
                        std::arch::x86_64::_mm_sfence();
                    }
                    assert_eq!(&c[..], &b[..], "streaming: {n} rows of {d}, slots {ld} apart");
                }
                for (x, &v) in b.iter().enumerate() {
                    let (k, r) = (x / ld, x % ld);
                    let want = if k < d && r < n { rows[r][k] } else { -1.0 };
                    assert_eq!(v, want, "{n} rows of {d}, slots {ld} apart: element {x}");
                }
            }
        }
    }
}
