//! A linear layer's weights stored as bfloat16 and their product with rows of f32 inputs:
//! [`Bf16Weights`]. The weights are packed once into the flash kernel's key panels of bfloat16
//! pairs (`pack::pack_dim_pairs`, each output row a "key"); each call rounds its input rows to
//! bfloat16 pairs (`pairs::transpose_pairs`) and multiplies them with the `qk_panel` micro-kernel
//! on `Bf16Pairs`: AVX512-BF16's `VDPBF16PS` where the CPU has it (twice the f32 FMA rate), two
//! FMAs per pair elsewhere. Products of two bfloat16 values are exact and accumulate in f32, so
//! the result is the f32 product of the rounded operands. The same kernel serves a prefill's
//! hundreds of rows and a decode step's few (then it streams half the bytes of f32 weights).

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use crate::disjoint::Disjoint;
use crate::error::{AttnError, Result};
use crate::flash::{pack_dim_pairs, panel_len, qk_panel, transpose_pairs, with_rows, Bf16Pairs};
use crate::simd::{KvElem, Simd, SimdJob, Target};
use crate::view::View4;

/// Bytes of packed input rows one task keeps hot while the weight panels stream past them: about
/// half of a core's L2.
const ROWS_BYTES: usize = 512 * 1024;

/// Weights `[out, in]` rounded to bfloat16 (to nearest, ties to even) and packed for
/// [`Bf16Weights::matmul`].
#[derive(Debug, Clone)]
pub struct Bf16Weights {
    out: usize,
    inn: usize,
    /// The instruction set the panels are laid out for (their width is two of its vectors).
    target: Target,
    /// `⌈out / 2W⌉` panels of `[⌈in/2⌉][2W]` pairs.
    panels: Arc<Vec<f32>>,
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
        Ok(Self { out, inn, target, panels: Arc::new(panels) })
    }

    /// Output features (rows of the weight).
    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// Input features (columns of the weight).
    pub fn in_dim(&self) -> usize {
        self.inn
    }

    /// The rounded weights widened back to f32, `[out, in]` row-major (exact).
    pub fn widened(&self) -> Vec<f32> {
        let (pw, words) = (2 * self.target.lanes(), self.inn.div_ceil(2));
        let mut w = vec![0.0; self.out * self.inn];
        for (o, row) in w.chunks_exact_mut(self.inn.max(1)).enumerate().take(self.out) {
            let panel = &self.panels[o / pw * pw * words..];
            for (i, x) in row.iter_mut().enumerate() {
                let bits = panel[i / 2 * pw + o % pw].to_bits();
                *x = f32::from_bits(if i % 2 == 0 { bits << 16 } else { bits & 0xFFFF_0000 });
            }
        }
        w
    }

    /// `y[r, o] = bias[o] + Σ_i bf16(x[r, i]) · w[o, i]` for `x: [rows, in]`, `y: [rows, out]`
    /// (overwritten), `bias: [out]`, the sums in f32; the work split over the current rayon
    /// pool's threads.
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
        let call = Call { w: self, bias, rows };
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
        for p in panels {
            let panel = call.w.panels[p * pw * words..].as_ptr();
            let cols = pw.min(out - p * pw);
            for c in chunks.clone() {
                let n = r.min(call.rows - c * r);
                let xs = packed[c * r * words..].as_ptr();
                // SAFETY: the CPU has `S`; the chunk holds `words` slots of `n` rows at `xs`, the
                // panel `words` rows of `2W` slots, `tile` `n ≤ QK_ROWS` rows of `2W`; `with_rows!`
                // instantiates `n` in `1..=QK_ROWS`.
                unsafe {
                    with_rows!(S::QK_ROWS, n, qk_panel::<S, Bf16Pairs; >(xs, panel, words, 1.0, tile.as_mut_ptr(), pw))
                };
                for (i, t) in tile.chunks_exact(pw).take(n).enumerate() {
                    // SAFETY: each task writes the columns of its own panels, in rows no other task
                    // of its panels writes.
                    let dst = unsafe { y.part((c * r + i) * out + p * pw, cols) };
                    match call.bias {
                        Some(b) => {
                            dst.iter_mut().zip(&t[..cols]).zip(&b[p * pw..]).for_each(|((d, &v), &b)| *d = v + b)
                        }
                        None => dst.copy_from_slice(&t[..cols]),
                    }
                }
            }
        }
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

    /// Every row count around the chunk sizes, odd and even input widths, outputs around the panel
    /// widths, with and without a bias: each result the f64 sum of the rounded operands' products
    /// within f32 accumulation's error, and the widened weights the rounded ones.
    #[test]
    fn products_are_the_rounded_operands_products() {
        for (out, inn) in [(1, 1), (5, 7), (33, 64), (70, 129), (16, 576)] {
            let w = values(out * inn, 3);
            let packed = Bf16Weights::pack(&w, out, inn).unwrap();
            let rounded: Vec<f32> = w.iter().map(|&v| round_to_bf16(v)).collect();
            assert_eq!(packed.widened(), rounded);
            for rows in [1, 2, 7, 12, 13, 25, 40] {
                let x = values(rows * inn, 11);
                let bias = values(out, 5);
                for b in [None, Some(&bias[..])] {
                    let mut y = vec![f32::NAN; rows * out];
                    packed.matmul(&x, b, &mut y).unwrap();
                    for r in 0..rows {
                        for o in 0..out {
                            let terms =
                                (0..inn).map(|i| round_to_bf16(x[r * inn + i]) as f64 * rounded[o * inn + i] as f64);
                            let (sum, size): (f64, f64) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                            let want = sum + b.map_or(0.0, |b| b[o] as f64);
                            let got = y[r * out + o] as f64;
                            let tol = 4.0 * inn as f64 * f32::EPSILON as f64 * (size + 1.0);
                            assert!(
                                (got - want).abs() <= tol,
                                "out {out} in {inn} rows {rows} [{r}, {o}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
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
    }
}
