//! Non-temporal ("streaming") stores for results written once and not read again soon: [`copy`]
//! writes whole aligned cache lines of its destination around the caches, so that the CPU does
//! not first read each line from memory to own it (a plain store's read-for-ownership, as much
//! traffic again as the write itself). Linear attention's chunk loops build each chunk's output
//! rows in a small scratch buffer (in L1) and stream them out with it. The stores are weakly
//! ordered: a thread calls [`fence`] after its last one, before another thread may read what it
//! wrote. Off x86-64 (and for the parts of a destination that are not whole aligned lines) a
//! plain copy.

/// Bytes per cache line.
#[cfg(target_arch = "x86_64")]
const LINE: usize = 64;

/// `dst.copy_from_slice(src)`, the whole 64-byte-aligned lines of `dst` written with non-temporal
/// stores on AVX-512F or AVX2 (the same bits: no arithmetic on them), the ragged ends with plain
/// stores.
///
/// # Panics
/// When `dst` and `src` differ in length.
#[inline(always)]
pub(crate) fn copy<T: Copy>(isa: crate::isa::Isa, dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "stream::copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use crate::isa::Isa;
        let bytes = std::mem::size_of_val(dst);
        let (d, s) = (dst.as_mut_ptr().cast::<u8>(), src.as_ptr().cast::<u8>());
        // Whole lines only; a slice of `T` is aligned to `T`, so the split falls between elements
        // when `size_of::<T>()` divides 64 (else the plain copy).
        let head = d.align_offset(LINE).min(bytes);
        let lines = (bytes - head) / LINE;
        if lines > 0 && LINE.is_multiple_of(std::mem::size_of::<T>()) && matches!(isa, Isa::Avx512 | Isa::Avx2) {
            // SAFETY: `dst` and `src` are `bytes` long and do not overlap (one is borrowed
            // mutably); the lines `head .. head + lines·LINE` lie within both and are aligned to
            // 64 in `dst`; the caller's `isa` is available (`Isa::best`).
            unsafe {
                std::ptr::copy_nonoverlapping(s, d, head);
                if isa == Isa::Avx512 {
                    lines_avx512(d.add(head), s.add(head), lines);
                } else {
                    lines_avx2(d.add(head), s.add(head), lines);
                }
                let done = head + lines * LINE;
                std::ptr::copy_nonoverlapping(s.add(done), d.add(done), bytes - done);
            }
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    dst.copy_from_slice(src);
}

/// Orders this thread's non-temporal stores before its later stores (an `sfence`), so that the
/// data [`copy`] streamed is visible to a thread that synchronises with this one afterwards.
#[inline(always)]
pub(crate) fn fence() {
    // SAFETY: SSE is part of x86-64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// `n` lines of 64 bytes from `s` to the 64-aligned `d`, streamed.
///
/// # Safety
/// The CPU has AVX-512F; `d` is aligned to 64; both ranges are `64·n` bytes long and valid.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn lines_avx512(d: *mut u8, s: *const u8, n: usize) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    for i in 0..n {
        // SAFETY: line `i` is within both ranges and aligned in `d` (the caller's contract).
        unsafe {
            let x = _mm512_loadu_si512(s.add(i * LINE).cast::<__m512i>());
            _mm512_stream_si512(d.add(i * LINE).cast::<__m512i>(), x);
        }
    }
}

/// [`lines_avx512`] on AVX2, two 32-byte stores per line.
///
/// # Safety
/// The CPU has AVX2; otherwise as for [`lines_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lines_avx2(d: *mut u8, s: *const u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    for i in 0..2 * n {
        // SAFETY: as above, each half-line aligned to 32 in `d`.
        unsafe {
            let x = _mm256_loadu_si256(s.add(i * 32).cast::<__m256i>());
            _mm256_stream_si256(d.add(i * 32).cast::<__m256i>(), x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    #[test]
    fn copies_every_element_at_any_offset_and_length() {
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.0).collect();
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
            for off in 0..17 {
                for len in [0, 1, 15, 16, 17, 31, 48, 100, 283 - off] {
                    let mut dst = vec![f32::NAN; 300];
                    copy(isa, &mut dst[off..off + len], &src[..len]);
                    fence();
                    assert_eq!(&dst[off..off + len], &src[..len], "{isa:?} at {off}, {len}");
                    assert!(dst[..off].iter().chain(&dst[off + len..]).all(|x| x.is_nan()), "{isa:?} wrote outside");
                }
            }
        }
        let wide: Vec<f64> = (0..40).map(|i| i as f64).collect();
        let mut out = vec![0.0f64; 40];
        copy(Isa::best(), &mut out[3..], &wide[3..]);
        fence();
        assert_eq!(&out[3..], &wide[3..]);
    }
}
