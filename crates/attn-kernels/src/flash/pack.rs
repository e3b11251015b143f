//! Packing of one key head (or a range of its keys) into panels for the `qk_panel` micro-kernel: keys in groups of `2·W`,
//! each panel stored `[Dk][2·W]` (so a panel row is one vector pair), widened to f32, zero
//! beyond `Lk`. Done once per key/value head and shared by every query head of its group.
//!
//! With bfloat16 products ([`Precision::Bf16`], [`pack_head`]) the forward packs both operands as
//! bfloat16 pairs, one pair per f32 slot: key panels `[⌈Dk/2⌉][2·W]` (each slot a key's dimensions
//! `2t, 2t+1`, [`pack_dim_pairs`]), then the values `[Lk/2][Dv]` where slot `(g·W + l, c)` pairs
//! column `c` of keys `2W·g + l` and `2W·g + l + W` ([`pack_key_pairs`]: the pairing
//! `Simd::pack_bf16` gives two vectors of probabilities without a shuffle). The backward packs
//! each key block the same ways: keys and values along the row for `Q·Kᵀ` and `dO·Vᵀ`, keys in
//! pairs of keys for `dS·K`.

use std::ops::Range;

use crate::prefetch;
use crate::problem::{Dims, Precision};
use crate::simd::KvElem;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Isa, Simd, SimdJob, Target};
use crate::view::View4;

/// Floats needed for the panels of `lk` keys of dimension `dk` with vector width `w`
/// (`usize::MAX` when that overflows, which no buffer can hold).
pub fn panel_len(lk: usize, dk: usize, w: usize) -> usize {
    (lk.div_ceil(2 * w) * 2 * w).saturating_mul(dk)
}

/// Packs rows `keys` of head `(b, h)` of `k` (keys, or values in the backward) into `out`
/// (length [`panel_len`] of `keys.len()`), zero beyond `keys.end`. `f32` keys for AVX-512 panels
/// (`w = 16`) move by 16 × 16 register transposes ([`pack_f32_avx512`], faster than a value at a
/// time: see docs/performance-log.md, "attn-kernels/src/flash/pack.rs: pack_keys"); other types
/// and widths a value at a time.
pub fn pack_keys<E: KvElem>(k: &View4<E>, b: usize, h: usize, keys: Range<usize>, w: usize, out: &mut [f32]) {
    pack_panels(k, b, h, keys, w, out, false);
}

/// [`pack_keys`], with `streaming` by streaming stores where the panels allow them (full halves,
/// `Dk` a multiple of 16, `out` on a cache line): for a whole head the forward packs once and reads
/// later, and streaming stores spare the panels' lines being read in from memory only to be
/// overwritten (see docs/performance-log.md, "attn-kernels/src/flash/pack.rs: pack_panels"); the
/// backward's key blocks, read at once, keep ordinary stores.
fn pack_panels<E: KvElem>(
    k: &View4<E>,
    b: usize,
    h: usize,
    keys: Range<usize>,
    w: usize,
    out: &mut [f32],
    streaming: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if w == 16 && k.dims()[3] > 0 && Isa::Avx512.is_available() && E::as_f32(&[]).is_some() {
        return Target::new(Isa::Avx512).run(PackF32 { k, b, h, keys, out, streaming });
    }
    // Only the AVX-512 panels stream; the loop stores as it always did.
    let _ = streaming;
    pack_each(k, b, h, keys, w, out);
}

/// [`pack_keys`] a value at a time, for every type and width.
fn pack_each<E: KvElem>(k: &View4<E>, b: usize, h: usize, keys: Range<usize>, w: usize, out: &mut [f32]) {
    let dk = k.dims()[3];
    let pw = 2 * w;
    for (p, panel) in out.chunks_exact_mut(pw * dk).enumerate() {
        for c in 0..pw {
            let j = keys.start + p * pw + c;
            if j < keys.end {
                for (d, &x) in k.row(b, h, j).iter().enumerate() {
                    panel[d * pw + c] = x.to_f32();
                }
            } else {
                for d in 0..dk {
                    panel[d * pw + c] = 0.0;
                }
            }
        }
    }
}

/// [`pack_keys`] of `f32` keys into panels of 32 (AVX-512's `2·W`), each half of a panel (16 keys)
/// transposed 16 × 16 values at a time (`Simd::transpose_rows` with its slots 32 apart, or with
/// `streaming` its streaming-store form where it applies), the slots of keys beyond `keys.end` (in
/// the last panel only) set to zero; the same values in the same places as the loop. A job for
/// AVX-512 only; `E` is `f32` (`KvElem::as_f32` gives its rows) and `Dk > 0`.
#[cfg(target_arch = "x86_64")]
struct PackF32<'a, E> {
    k: &'a View4<'a, E>,
    b: usize,
    h: usize,
    keys: Range<usize>,
    out: &'a mut [f32],
    streaming: bool,
}

#[cfg(target_arch = "x86_64")]
impl<E: KvElem> SimdJob for PackF32<'_, E> {
    type Out = ();
    const ON_PORTABLE: bool = false;
    const ON_AVX2: bool = false;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        use crate::simd::transpose_rows_streaming;
        const HALF: usize = 16;
        debug_assert_eq!(S::W, HALF);
        let PackF32 { k, b, h, keys, out, streaming } = self;
        let dk = k.dims()[3];
        let streaming = streaming && dk.is_multiple_of(HALF) && (out.as_ptr() as usize).is_multiple_of(64);
        for (p, panel) in out.chunks_exact_mut(2 * HALF * dk).enumerate() {
            for half in 0..2 {
                let j0 = keys.start + (2 * p + half) * HALF;
                let n = keys.end.saturating_sub(j0).min(HALF);
                let mut rows: [&[f32]; HALF] = [&[]; HALF];
                for (c, row) in rows[..n].iter_mut().enumerate() {
                    *row = E::as_f32(k.row(b, h, j0 + c)).expect("f32 keys (the caller's contract)");
                }
                // The next half's keys asked for now arrive while this one is transposed (read once,
                // from memory, and in a packed call's keys `Hkv·Dk` apart).
                for j in (j0 + HALF..keys.end).take(HALF) {
                    prefetch::lines::<{ prefetch::L1 }, _>(k.row(b, h, j));
                }
                let slots = &mut panel[half * HALF..];
                if streaming && n == HALF {
                    // SAFETY: AVX-512F is present (the job runs on AVX-512 only); 16 rows of `Dk`
                    // values (a multiple of 16), slots 32 apart inside the panel of `32·Dk`, whose halves start on cache lines (`out` does
                    // and a panel is `128·Dk` bytes).
                    unsafe { transpose_rows_streaming(&rows, dk, slots.as_mut_ptr(), 2 * HALF) };
                    continue;
                }
                // SAFETY: the CPU has `S` (the caller's contract); `n ≤ 16` rows of `Dk` values
                // each, slots 32 apart from the half's first column inside the panel of `32·Dk`.
                unsafe { S::transpose_rows(&rows[..n], dk, slots, 2 * HALF) };
                if n < HALF {
                    (0..dk).for_each(|t| slots[t * 2 * HALF + n..][..HALF - n].fill(0.0));
                }
            }
        }
        if streaming {
            // The streaming stores are weakly ordered: fenced here, they are visible before the
            // pool's join publishes the panels to the other threads.
            // SAFETY: SSE is part of x86-64's baseline.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
    }
}

/// Slots of one key/value head's packed operands for the forward: [`panel_len`] with f32
/// products; with bfloat16 products the key pair panels and then the value pairs.
pub fn head_len(d: &Dims, w: usize, compute: Precision) -> usize {
    match compute {
        Precision::F32 => panel_len(d.lk, d.dk, w),
        Precision::Bf16 => values_at(d, w).saturating_add(key_pairs_len(d.lk, d.dv, w)),
    }
}

/// Where the value pairs start in a head packed with bfloat16 products: after its key panels.
pub fn values_at(d: &Dims, w: usize) -> usize {
    panel_len(d.lk, d.dk.div_ceil(2), w)
}

/// Packs head `(b, h)` of `k` (and, with bfloat16 products, of `v`) into `out`, of length
/// [`head_len`].
pub fn pack_head<E: KvElem>(
    k: &View4<E>,
    v: &View4<E>,
    b: usize,
    h: usize,
    w: usize,
    compute: Precision,
    out: &mut [f32],
) {
    let lk = k.dims()[2];
    if compute == Precision::F32 {
        return pack_panels(k, b, h, 0..lk, w, out, true);
    }
    let (kp, vp) = out.split_at_mut(panel_len(lk, k.dims()[3].div_ceil(2), w));
    pack_dim_pairs(k, b, h, 0..lk, w, kp);
    pack_key_pairs(v, b, h, 0..lk, w, vp);
}

/// Packs rows `keys` of head `(b, h)` of `k` as bfloat16 pairs along the row: panels
/// `[⌈D/2⌉][2·W]` whose slot `(t, c)` pairs dimensions `2t, 2t + 1` of key `keys.start + c` (the
/// second 0 for an odd `D`), [`panel_len`] of `keys.len()` and `⌈D/2⌉` slots, zero beyond `keys.end`.
pub fn pack_dim_pairs<E: KvElem>(k: &View4<E>, b: usize, h: usize, keys: Range<usize>, w: usize, out: &mut [f32]) {
    let (words, pw) = (k.dims()[3].div_ceil(2), 2 * w);
    let at = |row: &[E], c: usize| row.get(c).map_or(0, |x| x.bf16_bits());
    for (p, panel) in out.chunks_exact_mut(pw * words).enumerate() {
        for c in 0..pw {
            let j = keys.start + p * pw + c;
            let row = (j < keys.end).then(|| k.row(b, h, j));
            for t in 0..words {
                panel[t * pw + c] = row.map_or(0.0, |row| pair(at(row, 2 * t), at(row, 2 * t + 1)));
            }
        }
    }
}

/// Slots of [`pack_key_pairs`] for `n` keys of dimension `d` and vector width `w`.
pub fn key_pairs_len(n: usize, d: usize, w: usize) -> usize {
    (n.div_ceil(2 * w) * w).saturating_mul(d)
}

/// Packs rows `keys` of head `(b, h)` of `v` as bfloat16 pairs of keys: `[⌈n/2W⌉·W][D]` (`n` the
/// key count), slot `(g·W + l, c)` pairing column `c` of keys `2W·g + l` and `2W·g + l + W`
/// (counted from `keys.start`; 0 beyond `keys.end`), [`key_pairs_len`] slots.
pub fn pack_key_pairs<E: KvElem>(v: &View4<E>, b: usize, h: usize, keys: Range<usize>, w: usize, out: &mut [f32]) {
    let (d, pw, n) = (v.dims()[3], 2 * w, keys.len());
    let value = |j: usize, c: usize| if j < n { v.row(b, h, keys.start + j)[c].bf16_bits() } else { 0 };
    for (u, slots) in out.chunks_exact_mut(d.max(1)).enumerate().take(n.div_ceil(pw) * w) {
        let j = u / w * pw + u % w;
        for (c, x) in slots.iter_mut().enumerate().take(d) {
            *x = pair(value(j, c), value(j + w, c));
        }
    }
}

/// Two bfloat16 values (their bits) paired in one f32 slot, `lo` in the low half (as
/// `Simd::pack_bf16` pairs them).
pub(super) fn pair(lo: u16, hi: u16) -> f32 {
    f32::from_bits(u32::from(lo) | u32::from(hi) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The register transposes pack what the loop packs: every key range of a head (whole panels,
    /// a ragged last panel, a start inside the head, none), head sizes around 16 lanes, keys read
    /// through a strided view; every slot written, zeros beyond the range.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_panels_match_the_loop() {
        if !crate::simd::Isa::Avx512.is_available() {
            return;
        }
        for dk in [1, 15, 16, 17, 64, 100] {
            let (h, lk) = (2, 77);
            // `[1, h, lk, dk]` with a head stride of `lk·dk + 3` (a gap between the heads).
            let data: Vec<f32> = (0..h * (lk * dk + 3)).map(|x| x as f32 * 0.25 - 7.0).collect();
            let k = View4::strided("k", &data, [1, h, lk, dk], [0, lk * dk + 3, dk]).unwrap();
            for keys in [0..lk, 0..32, 5..70, 40..41, 9..9] {
                let len = panel_len(keys.len(), dk, 16);
                let (mut fast, mut each) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                pack_keys(&k, 0, 1, keys.clone(), 16, &mut fast);
                pack_each(&k, 0, 1, keys.clone(), 16, &mut each);
                assert_eq!(fast, each, "Dk {dk}, keys {keys:?}");
                let mut streamed = crate::lines::Lines::filled(len, f32::NAN);
                pack_panels(&k, 0, 1, keys.clone(), 16, &mut streamed, true);
                assert_eq!(&streamed[..], &each[..], "streaming, Dk {dk}, keys {keys:?}");
                for (p, panel) in each.chunks(32 * dk).enumerate() {
                    for (x, &v) in panel.iter().enumerate() {
                        let j = keys.start + p * 32 + x % 32;
                        let want = if j < keys.end { k.row(0, 1, j)[x / 32] } else { 0.0 };
                        assert_eq!(v, want, "Dk {dk}, keys {keys:?}, panel {p}, slot {x}");
                    }
                }
            }
        }
    }
}
