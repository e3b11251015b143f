//! Dot products of weight rows with a few input rows — a linear layer's decode step for a small
//! batch, where a general matrix product reads the weights at well under the memory's speed:
//! each weight row is loaded once, a vector at a time, and multiplied into every input row's
//! accumulator while it is in registers.

use crate::simd::{Simd, SimdJob, Target};

/// Input rows at most per call: one accumulator each, beside the weight vector, in 16 registers.
pub const MAX_ROWS: usize = 8;

/// `out[o, r] = w[o, :] · x[r, :]` for `w: [n, inn]`, `x: [rows, inn]` (`rows ≤ MAX_ROWS`),
/// `out: [n, rows]`, all row-major, on this CPU's widest vectors; one thread.
///
/// # Panics
/// If the slices' lengths do not match `inn`, or `rows` is 0 or above [`MAX_ROWS`].
pub fn weight_row_dots(w: &[f32], x: &[f32], inn: usize, out: &mut [f32]) {
    let rows = x.len().checked_div(inn).unwrap_or(0);
    assert!(
        (1..=MAX_ROWS).contains(&rows) && x.len() == rows * inn && w.len() * rows == out.len() * inn,
        "weight_row_dots: w {}, x {}, out {} for rows of {inn}",
        w.len(),
        x.len(),
        out.len()
    );
    Target::best().run(Dots { w, x, inn, rows, out })
}

struct Dots<'a> {
    w: &'a [f32],
    x: &'a [f32],
    inn: usize,
    rows: usize,
    out: &'a mut [f32],
}

impl SimdJob for Dots<'_> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let Dots { w, x, inn, rows, out } = self;
        let whole = inn / S::W * S::W;
        for (row, dots) in w.chunks_exact(inn).zip(out.chunks_exact_mut(rows)) {
            // SAFETY: the CPU has `S` (the caller's contract); loads stop at `whole ≤ inn` within
            // each row of `w` and of `x`.
            unsafe {
                let mut acc = [S::splat(0.0); MAX_ROWS];
                for c in (0..whole).step_by(S::W) {
                    let wv = S::load(row.as_ptr().add(c));
                    for (r, a) in acc.iter_mut().enumerate().take(rows) {
                        *a = S::fma(wv, S::load(x.as_ptr().add(r * inn + c)), *a);
                    }
                }
                for (r, d) in dots.iter_mut().enumerate() {
                    let tail: f32 = (whole..inn).map(|i| row[i] * x[r * inn + i]).sum();
                    *d = S::reduce_sum(acc[r]) + tail;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_equal_the_plain_sums_for_every_row_count_and_tail() {
        let value = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        for inn in [1, 7, 16, 37, 576] {
            for rows in 1..=MAX_ROWS {
                let n = 5;
                let w: Vec<f32> = (0..n * inn).map(value).collect();
                let x: Vec<f32> = (0..rows * inn).map(|i| value(i + 31)).collect();
                let mut out = vec![f32::NAN; n * rows];
                weight_row_dots(&w, &x, inn, &mut out);
                for o in 0..n {
                    for r in 0..rows {
                        let want: f64 = (0..inn).map(|i| w[o * inn + i] as f64 * x[r * inn + i] as f64).sum();
                        let got = out[o * rows + r] as f64;
                        assert!((got - want).abs() <= 1e-5 * (inn as f64), "inn {inn}, rows {rows}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
