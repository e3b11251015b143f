//! The 8-bit storage of [`Bf16Weights::pack_int8`] and its products. Each block of
//! [`INT8_BLOCK`] inputs of an output row is `w = q·s + m` (`q` a signed code, `s` the block's
//! step, `m` its least value plus 128 steps), so a product splits per block into
//! `s·Σ bf16(x)·q + m·Σ bf16(x)`: the codes, small integers, are exact in bfloat16, and the
//! weights are never rounded.
//!
//! - A prefill's rows (more than [`DIRECT_ROWS`]) multiply the codes with the `qk_panel`
//!   micro-kernel as bfloat16 pairs, a panel's codes widened once per task ([`codes`]) and each
//!   block's sums scaled into the result ([`products`]).
//! - A decode step's few rows multiply the codes straight from their bytes with f32 FMAs
//!   ([`direct`]): nothing is widened into memory, so the step reads a byte per weight.

use std::ops::Range;

use rayon::prelude::*;

use super::{round_to_bf16, with_bias, Bf16Weights, Storage, INT8_BLOCK};
use crate::disjoint::Disjoint;
use crate::error::Result;
use crate::flash::{qk_panel, with_rows, Bf16Pairs};
use crate::simd::{Simd, SimdJob};

/// Up to this many rows multiply the codes directly ([`direct`]).
pub(super) const DIRECT_ROWS: usize = 4;

/// Slots (pairs of inputs) per block.
const BLOCK_WORDS: usize = INT8_BLOCK / 2;

/// `w: [out, inn]` quantized and laid out in panels `pw` wide (see [`Storage::Int8`]).
pub(super) fn pack(w: &[f32], out: usize, inn: usize, pw: usize) -> Storage {
    let (words, blocks, panels) = (inn.div_ceil(2), inn.div_ceil(INT8_BLOCK), out.div_ceil(pw));
    // A quarter of `w`'s bytes (and `w` is in memory): no allocation to check.
    let mut q = vec![0i8; panels * words * pw * 2];
    let (mut scales, mut mins) = (vec![0.0f32; panels * blocks * pw], vec![0.0f32; panels * blocks * pw]);
    for (o, row) in w.chunks_exact(inn.max(1)).enumerate().take(out) {
        let (p, c) = (o / pw, o % pw);
        for (b, block) in row.chunks(INT8_BLOCK).enumerate() {
            let (min, max) = block.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, z), &x| (a.min(x), z.max(x)));
            let s = (max - min) / 255.0;
            (scales[(p * blocks + b) * pw + c], mins[(p * blocks + b) * pw + c]) = (s, min + 128.0 * s);
            for (j, &x) in block.iter().enumerate() {
                let i = b * INT8_BLOCK + j;
                // A constant block (s = 0) is its minimum.
                let level = if s > 0.0 { ((x - min) / s).round().min(255.0) } else { 128.0 };
                q[((p * words + i / 2) * 2 + i % 2) * pw + c] = (level - 128.0) as i8;
            }
        }
    }
    Storage::Int8 { q, scales, mins }
}

/// Weight `[o, i]`'s code, step and offset.
fn code(storage: (&[i8], &[f32], &[f32]), inn: usize, pw: usize, o: usize, i: usize) -> (f32, f32, f32) {
    let (q, scales, mins) = storage;
    let (words, blocks, (p, c)) = (inn.div_ceil(2), inn.div_ceil(INT8_BLOCK), (o / pw, o % pw));
    let at = (p * blocks + i / INT8_BLOCK) * pw + c;
    (f32::from(q[((p * words + i / 2) * 2 + i % 2) * pw + c]), scales[at], mins[at])
}

/// The weights `q·s + m` (one rounding, an FMA), `[out, in]` row-major.
pub(super) fn widened(storage: (&[i8], &[f32], &[f32]), out: usize, inn: usize, pw: usize) -> Vec<f32> {
    let mut w = vec![0.0; out * inn];
    for (o, row) in w.chunks_exact_mut(inn.max(1)).enumerate().take(out) {
        for (i, x) in row.iter_mut().enumerate() {
            let (q, s, m) = code(storage, inn, pw, o, i);
            *x = q.mul_add(s, m);
        }
    }
    w
}

/// `Σ bf16(x)` over each block of each row of `x: [rows, inn]`, `[rows][⌈inn/INT8_BLOCK⌉]`.
pub(super) fn block_sums(x: &[f32], inn: usize) -> Vec<f32> {
    x.chunks_exact(inn.max(1))
        .flat_map(|row| row.chunks(INT8_BLOCK).map(|b| b.iter().map(|&v| round_to_bf16(v)).sum()))
        .collect()
}

/// Panel `p`'s codes as bfloat16 pairs (exact) in `out`, `⌈in/2⌉` rows of `2W` slots.
///
/// # Safety
/// The CPU has `S`, the instruction set the weights were packed for (`2W` is their panel width),
/// and `out` holds `⌈in/2⌉·2W` floats.
#[inline(always)]
pub(super) unsafe fn codes<S: Simd>(q: &[i8], p: usize, words: usize, out: &mut [f32]) {
    let pw = 2 * S::W;
    let q = &q[p * words * pw * 2..][..words * pw * 2];
    for (row, slots) in q.chunks_exact(2 * pw).zip(out.chunks_exact_mut(pw)) {
        for c in (0..pw).step_by(S::W) {
            // SAFETY: the CPU has `S`; `row` holds `pw` low then `pw` high codes, `slots` `pw`
            // floats, and `c + W ≤ pw`.
            unsafe {
                let (lo, hi) = (S::load_i8(row.as_ptr().add(c)), S::load_i8(row.as_ptr().add(pw + c)));
                S::store(slots.as_mut_ptr().add(c), S::pack_bf16(lo, hi));
            }
        }
    }
}

/// One chunk's products with one panel: `total[i][c] = Σ_b s_b[c]·(xs·codes)_b[i][c] +
/// m_b[c]·sums[i][b]` for the chunk's `n` rows (`xs`: `[⌈in/2⌉][n]` input pairs), the panel's
/// `codes` (from [`codes`]), its `scales` and `mins` (`[blocks][2W]`) and the rows' block sums
/// (`[n][blocks]`); `part` is room for one block's `n × 2W` sums.
///
/// # Safety
/// The CPU has `S`, the weights' instruction set; `1 ≤ n ≤ S::QK_ROWS`; `xs` holds `words·n`
/// floats, `codes` `words·2W`, `part` and `total` `n·2W` each.
#[inline(always)]
pub(super) unsafe fn products<S: Simd>(
    (xs, n, words): (*const f32, usize, usize),
    codes: *const f32,
    (scales, mins, sums): (&[f32], &[f32], &[f32]),
    part: &mut [f32],
    total: &mut [f32],
) {
    let (pw, blocks) = (2 * S::W, words.div_ceil(BLOCK_WORDS));
    total[..n * pw].fill(0.0);
    for b in 0..blocks {
        let (w0, wn) = (b * BLOCK_WORDS, BLOCK_WORDS.min(words - b * BLOCK_WORDS));
        // SAFETY: the CPU has `S`; the block's `wn` slots of `n` rows start `w0·n` into `xs` and
        // its codes `w0·2W` into `codes`; `part` holds `n ≤ QK_ROWS` rows of `2W`, and
        // `with_rows!` instantiates `n` in `1..=QK_ROWS`.
        unsafe {
            with_rows!(S::QK_ROWS, n, qk_panel::<S, Bf16Pairs; >(xs.add(w0 * n), codes.add(w0 * pw), wn, 1.0, part.as_mut_ptr(), pw))
        };
        for (i, (sum, acc)) in part.chunks_exact(pw).zip(total.chunks_exact_mut(pw)).take(n).enumerate() {
            for c in (0..pw).step_by(S::W) {
                // SAFETY: the CPU has `S`; rows of `2W` floats, `c + W ≤ 2W`, and block `b`'s
                // `2W` scales and minimums.
                unsafe {
                    let (s, m) = (S::load(scales[b * pw + c..].as_ptr()), S::load(mins[b * pw + c..].as_ptr()));
                    let t = S::fma(S::load(sum[c..].as_ptr()), s, S::load(acc[c..].as_ptr()));
                    S::store(acc[c..].as_mut_ptr(), S::fma(S::splat(sums[i * blocks + b]), m, t));
                }
            }
        }
    }
}

/// `y = x·wᵀ + bias` for at most [`DIRECT_ROWS`] rows of `x: [rows, in]`, the codes multiplied
/// as they are read, the panels split over the current rayon pool's threads.
pub(super) fn direct(w: &Bf16Weights, x: &[f32], bias: Option<&[f32]>, rows: usize, y: &mut [f32]) -> Result<()> {
    let Storage::Int8 { q, scales, mins } = &*w.storage else { unreachable!("direct products of 8-bit weights") };
    let (pw, words) = (2 * w.target.lanes(), w.inn.div_ceil(2));
    // The rows rounded to bfloat16, zero past `in`, as slots of two inputs.
    let mut xr = vec![0.0f32; rows * 2 * words];
    for (dst, src) in xr.chunks_exact_mut(2 * words).zip(x.chunks_exact(w.inn.max(1))) {
        dst.iter_mut().zip(src).for_each(|(d, &v)| *d = round_to_bf16(v));
    }
    let sums = block_sums(x, w.inn);
    let panels = w.out.div_ceil(pw);
    let per_task = panels.div_ceil(4 * rayon::current_num_threads()).max(1);
    let y = Disjoint::new(y);
    let job = Direct { w, storage: (q, scales, mins), xr: &xr, sums: &sums, rows, bias, panels: 0..0, y: &y };
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
        w.target.run(Direct { panels: t * per_task..((t + 1) * per_task).min(panels), ..job.clone() });
    });
    Ok(())
}

/// [`direct`]'s work on a range of panels.
#[derive(Clone)]
struct Direct<'a> {
    w: &'a Bf16Weights,
    storage: (&'a [i8], &'a [f32], &'a [f32]),
    xr: &'a [f32],
    sums: &'a [f32],
    rows: usize,
    bias: Option<&'a [f32]>,
    panels: Range<usize>,
    y: &'a Disjoint<'a>,
}

impl SimdJob for Direct<'_> {
    type Out = ();
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the CPU has `S`, the weights' instruction set (the target this job runs on).
        unsafe {
            match self.rows {
                1 => self.rows::<S, 1>(),
                2 => self.rows::<S, 2>(),
                3 => self.rows::<S, 3>(),
                _ => self.rows::<S, DIRECT_ROWS>(),
            }
        }
    }
}

impl Direct<'_> {
    /// # Safety
    /// The CPU has `S`, the weights' instruction set, and `R` is `self.rows`.
    #[inline(always)]
    unsafe fn rows<S: Simd, const R: usize>(&self) {
        let (q, scales, mins) = self.storage;
        let (inn, out) = (self.w.inn, self.w.out);
        let (pw, words, blocks) = (2 * S::W, inn.div_ceil(2), inn.div_ceil(INT8_BLOCK));
        let mut lanes = [0.0f32; 32];
        for p in self.panels.clone() {
            // SAFETY: the CPU has `S`; panel `p` holds `words` rows of `pw` low then `pw` high
            // codes and `blocks` rows of `pw` steps and minimums; each input row `2·words`
            // floats and `blocks` sums; `lanes` two vectors; each task writes the columns of its
            // own panels.
            unsafe {
                let zero = S::splat(0.0);
                let mut total = [[zero; 2]; R];
                let codes = q[p * words * pw * 2..].as_ptr();
                for b in 0..blocks {
                    let mut acc = [[zero; 2]; R];
                    for i in b * BLOCK_WORDS..((b + 1) * BLOCK_WORDS).min(words) {
                        let row = codes.add(i * 2 * pw);
                        let lo = [S::load_i8(row), S::load_i8(row.add(S::W))];
                        let hi = [S::load_i8(row.add(pw)), S::load_i8(row.add(pw + S::W))];
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let x = &self.xr[r * 2 * words + 2 * i..];
                            let (xl, xh) = (S::splat(x[0]), S::splat(x[1]));
                            for c in 0..2 {
                                acc[c] = S::fma(xh, hi[c], S::fma(xl, lo[c], acc[c]));
                            }
                        }
                    }
                    let at = (p * blocks + b) * pw;
                    let s = [S::load(scales[at..].as_ptr()), S::load(scales[at + S::W..].as_ptr())];
                    let m = [S::load(mins[at..].as_ptr()), S::load(mins[at + S::W..].as_ptr())];
                    for (r, (t, acc)) in total.iter_mut().zip(&acc).enumerate() {
                        let sum = S::splat(self.sums[r * blocks + b]);
                        for c in 0..2 {
                            t[c] = S::fma(sum, m[c], S::fma(acc[c], s[c], t[c]));
                        }
                    }
                }
                let cols = pw.min(out - p * pw);
                for (r, t) in total.iter().enumerate() {
                    S::store(lanes.as_mut_ptr(), t[0]);
                    S::store(lanes.as_mut_ptr().add(S::W), t[1]);
                    let dst = self.y.part(r * out + p * pw, cols);
                    with_bias(dst, &lanes[..cols], self.bias.map(|b| &b[p * pw..]));
                }
            }
        }
    }
}
