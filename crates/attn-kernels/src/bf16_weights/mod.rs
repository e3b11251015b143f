//! A linear layer's weights stored as bfloat16 and their product with rows of f32 inputs:
//! [`Bf16Weights`]. The weights are packed once into the flash kernel's key panels of bfloat16
//! pairs (`pack::pack_dim_pairs`, each output row a "key"); each call rounds its input rows to
//! bfloat16 pairs (`pairs::transpose_pairs`) and multiplies them with the `qk_panel` micro-kernel
//! on `Bf16Pairs`: AVX512-BF16's `VDPBF16PS` where the CPU has it (twice the f32 FMA rate), two
//! FMAs per pair elsewhere. Products of two bfloat16 values are exact and accumulate in f32, so
//! the result is the f32 product of the rounded operands. The same kernel serves a prefill's
//! hundreds of rows and a decode step's few (then it streams half the bytes of f32 weights).
//!
//! [`Bf16Weights::pack_int8`] stores the same panels' slots as 8-bit codes instead, each block of
//! [`INT8_BLOCK`] inputs of an output row with its own step and minimum (`w ≈ min + q·s`,
//! `q ∈ 0..=255`, to nearest; the 16 levels of a GGUF's Q4_1 or Q4_K block are held exactly): a
//! quarter of the f32 bytes, multiplied as `s·Σ bf16(x)·q + min·Σ bf16(x)` per block, the weights
//! never rounded (the `int8` module).

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

mod int8;

use crate::disjoint::Disjoint;
use crate::error::{AttnError, Result};
use crate::flash::{pack_dim_pairs, panel_len, qk_panel, transpose_pairs, with_rows, Bf16Pairs};
use crate::simd::{KvElem, Simd, SimdJob, Target};
use crate::view::View4;

/// Bytes of packed input rows one task keeps hot while the weight panels stream past them: about
/// half of a core's L2.
const ROWS_BYTES: usize = 512 * 1024;

/// A way to pack weights `[out, in]`: [`Bf16Weights::pack`] or [`Bf16Weights::pack_int8`].
pub type Packing = fn(&[f32], usize, usize) -> Result<Bf16Weights>;

/// Inputs per scale and minimum of [`Bf16Weights::pack_int8`]'s 8-bit weights (the GGUF's
/// 4-bit blocks).
pub const INT8_BLOCK: usize = 32;

/// Weights `[out, in]` rounded to bfloat16 (to nearest, ties to even), or quantized to 8 bits,
/// and packed for [`Bf16Weights::matmul`].
#[derive(Debug, Clone)]
pub struct Bf16Weights {
    out: usize,
    inn: usize,
    /// The instruction set the panels are laid out for (their width is two of its vectors).
    target: Target,
    storage: Arc<Storage>,
}

/// How the panels are kept.
#[derive(Debug)]
enum Storage {
    /// `⌈out / 2W⌉` panels of `[⌈in/2⌉][2W]` bfloat16 pairs.
    Pairs(Vec<f32>),
    /// The same panels' slots as pairs of 8-bit codes, `[⌈in/2⌉][2][2W]` per panel (each slot
    /// row's low halves, then its high halves: a vector of each at a time), each
    /// slot's block of `INT8_BLOCK` inputs `q·scale + min` (`q` the level less 128, `min` the
    /// block's least value plus 128 steps), `[⌈in/INT8_BLOCK⌉][2W]` of each per panel.
    Int8 { q: Vec<i8>, scales: Vec<f32>, mins: Vec<f32> },
}

impl Bf16Weights {
    /// `w: [out, inn]` row-major, rounded and packed for this CPU's widest vectors.
    pub fn pack(w: &[f32], out: usize, inn: usize) -> Result<Self> {
        let view = View4::contiguous("weight", w, [1, 1, out, inn])?;
        let target = Target::best().bf16_products(true);
        let lanes = target.lanes();
        let len = panel_len(out, inn.div_ceil(2), lanes);
        let mut panels = crate::alloc::zeroed("bf16 weight panels", &[len])?;
        pack_dim_pairs(&view, 0, 0, 0..out, lanes, &mut panels);
        Ok(Self { out, inn, target, storage: Arc::new(Storage::Pairs(panels)) })
    }

    /// `w: [out, inn]` row-major, each block of [`INT8_BLOCK`] inputs of a row quantized to
    /// 8 bits (`q = round((w − min) / s)`, `s = (max − min) / 255` over the block), packed for
    /// this CPU's widest vectors; the products multiply `min + q·s` exactly.
    pub fn pack_int8(w: &[f32], out: usize, inn: usize) -> Result<Self> {
        View4::contiguous("weight", w, [1, 1, out, inn])?;
        let target = Target::best().bf16_products(true);
        let storage = int8::pack(w, out, inn, 2 * target.lanes());
        Ok(Self { out, inn, target, storage: Arc::new(storage) })
    }

    /// Output features (rows of the weight).
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input features (columns of the weight).
    pub fn in_dim(&self) -> usize {
        self.inn
    }

    /// The weights the products multiply, `[out, in]` row-major: the bfloat16 ones widened
    /// (exact), or the 8-bit ones' `q·s + min` (rounded once to f32).
    pub fn widened(&self) -> Vec<f32> {
        let (pw, words) = (2 * self.target.lanes(), self.inn.div_ceil(2));
        let panels = match &*self.storage {
            Storage::Pairs(panels) => panels,
            Storage::Int8 { q, scales, mins } => return int8::widened((q, scales, mins), self.out, self.inn, pw),
        };
        let mut w = vec![0.0; self.out * self.inn];
        for (o, row) in w.chunks_exact_mut(self.inn.max(1)).enumerate().take(self.out) {
            let slots = &panels[o / pw * pw * words..];
            for (i, x) in row.iter_mut().enumerate() {
                let bits = slots[i / 2 * pw + o % pw].to_bits();
                *x = f32::from_bits(if i % 2 == 0 { bits << 16 } else { bits & 0xFFFF_0000 });
            }
        }
        w
    }

    /// `y[r, o] = bias[o] + Σ_i bf16(x[r, i]) · w[o, i]` for `x: [rows, in]`, `y: [rows, out]`
    /// (overwritten), `bias: [out]`, `w` as [`Bf16Weights::widened`] gives it, the sums in f32;
    /// the work split over the current rayon pool's threads.
    pub fn matmul(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32]) -> Result<()> {
        let rows = x.len().checked_div(self.inn).unwrap_or_else(|| y.len().checked_div(self.out).unwrap_or(0));
        let shape = |what: &'static str, reason: String| Err(AttnError::Layout { tensor: what, reason });
        if x.len() != rows * self.inn {
            return shape("x", format!("{} values are not rows of {}", x.len(), self.inn));
        }
        if y.len() != rows * self.out {
            return shape("y", format!("{} values for {rows} rows of {}", y.len(), self.out));
        }
        if let Some(b) = bias.filter(|b| b.len() != self.out) {
            return shape("bias", format!("{} values for {} outputs", b.len(), self.out));
        }
        if rows == 0 || self.out == 0 {
            return Ok(());
        }
        let int8 = matches!(*self.storage, Storage::Int8 { .. });
        if int8 && rows <= int8::DIRECT_ROWS {
            return int8::direct(self, x, bias, rows, y);
        }
        let sums = if int8 { int8::block_sums(x, self.inn) } else { Vec::new() };
        let call = Call { w: self, bias, rows, sums };
        let target = self.target;
        // Each parallel task enters the instruction set itself: a closure is compiled apart from
        // the job that creates it, for the baseline instruction set.
        let (r, words) = (target.run(ChunkRows), call.words());
        let mut packed = crate::alloc::zeroed("bf16 input pairs", &[rows.div_ceil(r) * r, words])?;
        packed.par_chunks_mut(r * words).enumerate().for_each(|(i, chunk)| {
            let rows: Vec<&[f32]> = x[i * r * self.inn..].chunks_exact(self.inn).take(r).collect();
            target.run(PackRows { rows: &rows, inn: self.inn, chunk });
        });
        let (pw, out) = (2 * target.lanes(), self.out);
        let (chunks, panels) = (rows.div_ceil(r), out.div_ceil(pw));
        let per_block = (ROWS_BYTES / (r * words.max(1) * 4)).clamp(1, chunks);
        let row_blocks = chunks.div_ceil(per_block);
        let panel_blocks = (4 * rayon::current_num_threads()).div_ceil(row_blocks).clamp(1, panels);
        let per_panels = panels.div_ceil(panel_blocks);
        let panel_blocks = panels.div_ceil(per_panels);
        let y = Disjoint::new(y);
        (0..row_blocks * panel_blocks).into_par_iter().for_each(|task| {
            let (rb, pb) = (task / panel_blocks, task % panel_blocks);
            let chunks = rb * per_block..((rb + 1) * per_block).min(chunks);
            let panels = pb * per_panels..((pb + 1) * per_panels).min(panels);
            target.run(Products { call: &call, packed: &packed, chunks, panels, y: &y });
        });
        Ok(())
    }
}

/// One call's operands.
struct Call<'a> {
    w: &'a Bf16Weights,
    bias: Option<&'a [f32]>,
    rows: usize,
    /// With 8-bit weights, each row's block sums (`int8::block_sums`).
    sums: Vec<f32>,
}

impl Call<'_> {
    fn words(&self) -> usize {
        self.w.inn.div_ceil(2)
    }
}

/// Rows per chunk of packed inputs: the micro-kernel's row count, `S::QK_ROWS`.
struct ChunkRows;

impl SimdJob for ChunkRows {
    type Out = usize;
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) -> usize {
        S::QK_ROWS
    }
}

/// One chunk of `n ≤ QK_ROWS` input rows, its pairs transposed `[⌈in/2⌉][n]` (as `qk_panel`
/// reads them).
struct PackRows<'a, 'b> {
    rows: &'b [&'a [f32]],
    inn: usize,
    chunk: &'b mut [f32],
}

impl SimdJob for PackRows<'_, '_> {
    type Out = ();
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the CPU has `S` (the target this job runs on); at most `QK_ROWS ≤ 16` rows of
        // `inn` values, `chunk` holds their `⌈inn/2⌉` slots `rows.len()` apart.
        unsafe { transpose_pairs::<S>(self.rows, self.inn, self.chunk, self.rows.len()) };
    }
}

/// The products of a block of row chunks (whose pairs stay in L2) with a block of weight panels
/// (each read once per task, from memory or L3), written with the bias into their part of `y`.
struct Products<'a, 'b> {
    call: &'b Call<'a>,
    packed: &'b [f32],
    chunks: Range<usize>,
    panels: Range<usize>,
    y: &'b Disjoint<'b>,
}

impl SimdJob for Products<'_, '_> {
    type Out = ();
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let Products { call, packed, chunks, panels, y } = self;
        let (r, pw, words, out) = (S::QK_ROWS, 2 * S::W, call.words(), call.w.out);
        let mut tile = vec![0.0f32; r * pw];
        // With 8-bit weights: the panel's codes as pairs, and one block's sums.
        let (mut codes, mut part) = match *call.w.storage {
            Storage::Pairs(_) => (Vec::new(), Vec::new()),
            Storage::Int8 { .. } => (vec![0.0f32; words * pw], vec![0.0f32; r * pw]),
        };
        let blocks = call.w.inn.div_ceil(INT8_BLOCK);
        for p in panels {
            let panel = match &*call.w.storage {
                Storage::Pairs(panels) => panels[p * pw * words..].as_ptr(),
                Storage::Int8 { q, .. } => {
                    // SAFETY: the CPU has `S`, the target the weights were packed for; `codes`
                    // holds `words` rows of `2W`.
                    unsafe { int8::codes::<S>(q, p, words, &mut codes) };
                    codes.as_ptr()
                }
            };
            let cols = pw.min(out - p * pw);
            for c in chunks.clone() {
                let n = r.min(call.rows - c * r);
                let xs = packed[c * r * words..].as_ptr();
                match &*call.w.storage {
                    // SAFETY: the CPU has `S`; the chunk holds `words` slots of `n` rows at `xs`,
                    // the panel `words` rows of `2W` slots, `tile` `n ≤ QK_ROWS` rows of `2W`;
                    // `with_rows!` instantiates `n` in `1..=QK_ROWS`.
                    Storage::Pairs(_) => unsafe {
                        with_rows!(S::QK_ROWS, n, qk_panel::<S, Bf16Pairs; >(xs, panel, words, 1.0, tile.as_mut_ptr(), pw))
                    },
                    // SAFETY: as above; the panel's `blocks` rows of `2W` steps and minimums, the
                    // chunk's rows' `blocks` sums each.
                    Storage::Int8 { scales, mins, .. } => unsafe {
                        let at = p * blocks * pw;
                        let steps = (&scales[at..], &mins[at..], &call.sums[c * r * blocks..]);
                        int8::products::<S>((xs, n, words), panel, steps, &mut part, &mut tile)
                    },
                }
                for (i, t) in tile.chunks_exact(pw).take(n).enumerate() {
                    // SAFETY: each task writes the columns of its own panels, in rows no other task
                    // of its panels writes.
                    let dst = unsafe { y.part((c * r + i) * out + p * pw, cols) };
                    with_bias(dst, &t[..cols], call.bias.map(|b| &b[p * pw..]));
                }
            }
        }
    }
}

/// `dst = sums + bias` (`bias` from the first of `dst`'s columns, when there is one).
fn with_bias(dst: &mut [f32], sums: &[f32], bias: Option<&[f32]>) {
    match bias {
        Some(b) => dst.iter_mut().zip(sums).zip(b).for_each(|((d, &v), &b)| *d = v + b),
        None => dst.copy_from_slice(sums),
    }
}

/// `bf16(x)` widened back: the value [`Bf16Weights`] multiplies in place of `x`.
pub fn round_to_bf16(x: f32) -> f32 {
    f32::from_bits(u32::from(x.bf16_bits()) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 7919 % 2003) as f32 / 1001.0) - 1.0).collect()
    }

    /// `y = x·wᵀ + bias` of `packed` for every row count around the chunk sizes (and the 8-bit
    /// weights' direct rows), with and without
    /// a bias: each result the f64 sum of the products of the rounded input and the weights the
    /// products multiply (`packed.widened()`) within f32 accumulation's error.
    fn assert_products(packed: &Bf16Weights, what: &str) {
        let (out, inn) = (packed.out_dim(), packed.in_dim());
        let w = packed.widened();
        for rows in [1, 2, 3, 4, 5, 7, 12, 13, 25, 40] {
            let x = values(rows * inn, 11);
            let bias = values(out, 5);
            for b in [None, Some(&bias[..])] {
                let mut y = vec![f32::NAN; rows * out];
                packed.matmul(&x, b, &mut y).unwrap();
                for r in 0..rows {
                    for o in 0..out {
                        let terms = (0..inn).map(|i| round_to_bf16(x[r * inn + i]) as f64 * w[o * inn + i] as f64);
                        let (sum, size): (f64, f64) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                        let want = sum + b.map_or(0.0, |b| b[o] as f64);
                        let got = y[r * out + o] as f64;
                        let tol = 4.0 * inn as f64 * f32::EPSILON as f64 * (size + 1.0);
                        assert!(
                            (got - want).abs() <= tol,
                            "{what} out {out} in {inn} rows {rows} [{r}, {o}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Odd and even input widths, partial 8-bit blocks, outputs around the panel widths: the
    /// bfloat16 panels hold the rounded weights, the 8-bit ones `min + q·s` within half a step
    /// `s` of each weight, and both multiply what they hold.
    #[test]
    fn products_are_the_rounded_operands_products() {
        for (out, inn) in [(1, 1), (5, 7), (33, 64), (70, 129), (16, 576)] {
            let mut w = values(out * inn, 3);
            w[0] = 0.0;
            let packed = Bf16Weights::pack(&w, out, inn).unwrap();
            assert_eq!(packed.widened(), w.iter().map(|&v| round_to_bf16(v)).collect::<Vec<_>>());
            assert_products(&packed, "bf16");
            let packed = Bf16Weights::pack_int8(&w, out, inn).unwrap();
            for (o, (row, got)) in w.chunks(inn).zip(packed.widened().chunks(inn)).enumerate() {
                for (b, (block, got)) in row.chunks(INT8_BLOCK).zip(got.chunks(INT8_BLOCK)).enumerate() {
                    let (min, max) = block.iter().fold((f32::MAX, f32::MIN), |(a, z), &x| (a.min(x), z.max(x)));
                    let s = (max - min) / 255.0;
                    for (&x, &g) in block.iter().zip(got) {
                        let tol = s * 0.5 + 4.0 * f32::EPSILON * (x.abs() + 128.0 * s);
                        assert!((x - g).abs() <= tol, "int8 out {out} in {inn} row {o} block {b}: {g} for {x}");
                    }
                }
            }
            assert_products(&packed, "int8");
        }
    }

    /// A constant block (scale 0) is held exactly, not as NaN; a block of 16 evenly spaced levels
    /// (a GGUF Q4_1 or Q4_K block: `min + k·d`) is held to f32's rounding of its step.
    #[test]
    fn constant_and_4_bit_blocks_are_held_exactly() {
        let levels: Vec<f32> = (0..INT8_BLOCK).map(|i| -0.37 + (i * 7 % 16) as f32 * 0.0521).collect();
        let w = [vec![0.0; INT8_BLOCK], vec![-1.5; INT8_BLOCK], levels.clone()].concat();
        let packed = Bf16Weights::pack_int8(&w, 1, w.len()).unwrap();
        let mut y = [f32::NAN];
        packed.matmul(&vec![1.0; w.len()], None, &mut y).unwrap();
        assert!(y[0].is_finite());
        let got = packed.widened();
        assert_eq!(got[..2 * INT8_BLOCK], [vec![0.0; INT8_BLOCK], vec![-1.5; INT8_BLOCK]].concat());
        for (&g, &x) in got[2 * INT8_BLOCK..].iter().zip(&levels) {
            assert!((g - x).abs() <= 1e-6, "{g} for the level {x}");
        }
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let packed = Bf16Weights::pack(&values(6, 0), 2, 3).unwrap();
        let mut y = vec![0.0; 4];
        assert!(packed.matmul(&values(5, 0), None, &mut y).is_err());
        assert!(packed.matmul(&values(6, 0), None, &mut y[..3]).is_err());
        assert!(packed.matmul(&values(6, 0), Some(&[1.0]), &mut y).is_err());
        assert!(Bf16Weights::pack(&values(5, 0), 2, 3).is_err());
        assert!(Bf16Weights::pack_int8(&values(5, 0), 2, 3).is_err());
    }
}
