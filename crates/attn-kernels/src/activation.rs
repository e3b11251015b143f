//! The exact GELU, `gelu(x) = x·Φ(x)` with `Φ` the standard normal distribution function
//! (PyTorch's default `gelu`, erf-based), and its derivative `Φ(x) + x·φ(x)`, on the SIMD layer:
//! [`gelu`], [`gelu_backward`]; with [`Approximate::Tanh`], PyTorch's `approximate="tanh"`
//! (Gemma's `gelu_pytorch_tanh`), `Φ(x) ≈ (1 + tanh(√(2/π)·(x + 0.044715·x³)))/2`, through the
//! SIMD layer's `tanh`. A BERT feed-forward runs it on every hidden unit of every token,
//! where a scalar `erf` per element cost a fifth of an embedding's time.
//!
//! `Φ` is taken through the complementary error function, `Φ(x) = erfc(−x/√2)/2`, so neither
//! tail cancels: `erfc(z) = t·exp(−z² + P(t))` for `z ≥ 0`, `t = 1/(1 + z/2)`, with `P` the
//! degree-9 Chebyshev fit of Numerical Recipes' `erfcc` (relative error under 1.2e-7 for every
//! `z`), and `Φ(x) = 1 − erfc(|x|/√2)/2` for `x ≥ 0`. The f32 result is within a few ulp of the
//! exact value, and far below for `x < −5`, where `1 + erf(x/√2)` in f32 rounds to zero.

use crate::error::{AttnError, Result};
use crate::simd::{exp, tanh};
use crate::simd::{Simd, SimdJob, Target};

/// `P(t)`'s coefficients, constant term first.
const ERFC: [f32; 10] = [
    -1.265_512_2,
    1.000_023_7,
    0.374_091_96,
    0.096_784_18,
    -0.186_288_06,
    0.278_868_07,
    -1.135_204,
    1.488_515_9,
    -0.822_152_23,
    0.170_872_77,
];

/// Where `Φ` is computed up to (see `phi_cdf`).
const CLAMP: f32 = 14.0;

/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// Which GELU: PyTorch's `approximate` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Approximate {
    /// The exact, erf-based GELU (`approximate="none"`, PyTorch's default).
    #[default]
    None,
    /// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))` (`approximate="tanh"`).
    Tanh,
}

/// `y[i] = gelu(x[i])`.
pub fn gelu(x: &[f32], y: &mut [f32], approximate: Approximate) -> Result<()> {
    same_len("y", x.len(), y.len())?;
    Target::best().run(Gelu { x, dy: None, out: y, approximate });
    Ok(())
}

/// `dx[i] = dy[i] · gelu'(x[i])`, `gelu'(x) = Φ(x) + x·φ(x)` (with `Tanh`, the derivative of
/// the approximation).
pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32], approximate: Approximate) -> Result<()> {
    same_len("dy", x.len(), dy.len())?;
    same_len("dx", x.len(), dx.len())?;
    Target::best().run(Gelu { x, dy: Some(dy), out: dx, approximate });
    Ok(())
}

fn same_len(tensor: &'static str, want: usize, found: usize) -> Result<()> {
    if want == found {
        return Ok(());
    }
    Err(AttnError::Layout { tensor, reason: format!("{found} values for the {want} of x") })
}

/// The forward (`dy` absent) or the backward over one slice, a vector at a time; the tail runs
/// through a zero-padded vector.
struct Gelu<'a> {
    x: &'a [f32],
    dy: Option<&'a [f32]>,
    out: &'a mut [f32],
    approximate: Approximate,
}

impl SimdJob for Gelu<'_> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let Gelu { x, dy, out, approximate } = self;
        let w = S::W;
        let mut pad = [[0.0f32; 16]; 3];
        for start in (0..x.len()).step_by(w) {
            let n = w.min(x.len() - start);
            let (xs, gs, os) = if n == w {
                (x[start..].as_ptr(), dy.map(|d| d[start..].as_ptr()), out[start..].as_mut_ptr())
            } else {
                pad[0][..n].copy_from_slice(&x[start..start + n]);
                if let Some(d) = dy {
                    pad[1][..n].copy_from_slice(&d[start..start + n]);
                }
                let [p0, p1, p2] = &mut pad;
                (p0.as_ptr(), dy.map(|_| p1.as_ptr()), p2.as_mut_ptr())
            };
            // SAFETY: the CPU has `S`; `xs`, `gs` and `os` each hold `W ≤ 16` values (a full
            // vector of the slices, or the padded copies).
            unsafe {
                let v = S::load(xs);
                let (cdf, pdf) = match approximate {
                    Approximate::None => phi_cdf::<S>(v),
                    Approximate::Tanh => tanh_cdf::<S>(v),
                };
                let r = match gs {
                    None => S::mul(v, cdf),
                    Some(g) => S::mul(S::load(g), S::fma(v, pdf, cdf)),
                };
                S::store(os, r);
            }
            if n < w {
                out[start..start + n].copy_from_slice(&pad[2][..n]);
            }
        }
    }
}

/// `(Φ(x), φ(x))` per lane. `x²/2` is kept exactly as `hi + lo` (an FMA gives the product's
/// rounding error), `exp(−hi)` taken once for both, and `exp(P(t) − lo)` and `1 − lo` carry the
/// rest: rounding `x²/2` itself would cost up to `x²/4` ulp in the tails (10 ulp at `x = −6`).
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
unsafe fn phi_cdf<S: Simd>(x: S::V) -> (S::V, S::V) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let neg = |v: S::V| S::mul(v, S::splat(-1.0));
        let half = |v: S::V| S::mul(v, S::splat(0.5));
        // Beyond ±14, Φ is 0 or 1 and φ 0 in f32; clamped, ±∞ give Φ (and x·Φ) without NaN.
        let x = S::min(S::splat(CLAMP), S::max(S::splat(-CLAMP), x));
        let z = S::mul(S::max(x, neg(x)), S::splat(std::f32::consts::FRAC_1_SQRT_2));
        let t = S::div(S::splat(1.0), S::fma(z, S::splat(0.5), S::splat(1.0)));
        let mut p = S::splat(ERFC[9]);
        for &c in ERFC[..9].iter().rev() {
            p = S::fma(p, t, S::splat(c));
        }
        let square = S::mul(x, x);
        let (hi, lo) = (half(square), half(S::fma(x, x, neg(square))));
        let e = exp::<S>(neg(hi));
        let half_erfc = half(S::mul(S::mul(t, e), exp::<S>(S::add(p, neg(lo)))));
        let cdf = S::select_lt(x, S::splat(0.0), half_erfc, S::add(S::splat(1.0), neg(half_erfc)));
        let pdf = S::mul(S::mul(e, S::add(S::splat(1.0), neg(lo))), S::splat(FRAC_1_SQRT_2PI));
        (cdf, pdf)
    }
}

/// The tanh approximation's `(Φ(x), Φ'(x))` per lane: `Φ = (1 + t)/2` with
/// `t = tanh(u)`, `u = x·(c + d·x²)`, and `Φ' = (1 − t²)/2 · (c + 3d·x²)` (`c = √(2/π)`,
/// `d = 0.044715·c`), `1 − t²` taken as `4e/(1 + e)²` with `e = exp(−2|u|)`, which keeps its
/// relative accuracy where `t` nears ±1 (`1 − t·t` loses it there).
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
unsafe fn tanh_cdf<S: Simd>(x: S::V) -> (S::V, S::V) {
    const C: f32 = 0.797_884_6;
    const D: f32 = 0.044_715 * C;
    // SAFETY: forwarded from the caller.
    unsafe {
        let xx = S::mul(x, x);
        let u = S::mul(x, S::fma(xx, S::splat(D), S::splat(C)));
        let half = S::splat(0.5);
        let cdf = S::fma(tanh::<S>(u), half, half);
        let e = exp::<S>(S::mul(S::max(u, S::mul(u, S::splat(-1.0))), S::splat(-2.0)));
        let one_e = S::add(S::splat(1.0), e);
        let sech2 = S::div(S::mul(e, S::splat(4.0)), S::mul(one_e, one_e));
        let slope = S::fma(xx, S::splat(3.0 * D), S::splat(C));
        (cdf, S::mul(S::mul(sech2, half), slope))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Φ(x)` in f64 through `libm`'s `erfc` (musl's, to about 1 ulp).
    fn cdf64(x: f64) -> f64 {
        0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
    }

    fn points() -> Vec<f32> {
        let mut xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.004).collect();
        xs.extend([-30.0, -14.0, -13.3, -9.0, -6.5, 6.5, 9.0, 30.0, 1e-8, -1e-8, 0.0, -0.0]);
        xs
    }

    /// `|got − want|` in units of the f32 spacing at `scale` (at least 1e-30).
    fn ulps(got: f32, want: f64, scale: f64) -> f64 {
        let s = scale.abs().max(1e-30) as f32;
        (f64::from(got) - want).abs() / f64::from(f32::from_bits(s.to_bits() + 1) - s)
    }

    /// Every point within 6 ulp of the f64 value (the fit's, two exponentials' and the
    /// polynomial's errors) and the oracle rule over them all against PyTorch's f32 formula
    /// `x/2 · (1 + erf(x/√2))` with an f32 `erf`; the derivative within 8 ulp of the size of its
    /// two terms (`Φ(x) + x·φ(x)` cancels where GELU has its minimum); every tail length the same
    /// as in a whole vector.
    #[test]
    fn gelu_and_its_derivative_are_within_a_few_ulp() {
        let xs = points();
        let mut y = vec![f32::NAN; xs.len()];
        gelu(&xs, &mut y, Approximate::None).unwrap();
        let dy: Vec<f32> = (0..xs.len()).map(|i| 1.0 + (i % 3) as f32).collect();
        let mut dx = vec![f32::NAN; xs.len()];
        gelu_backward(&xs, &dy, &mut dx, Approximate::None).unwrap();
        let (mut worst, mut worst_naive) = (0.0f64, 0.0f64);
        for (i, &x) in xs.iter().enumerate() {
            let x64 = f64::from(x);
            let want = x64 * cdf64(x64);
            let naive = x / 2.0 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
            let e = ulps(y[i], want, want);
            assert!(e <= 6.0, "gelu({x}) = {} against {want}: {e} ulp", y[i]);
            worst = worst.max((f64::from(y[i]) - want).abs());
            worst_naive = worst_naive.max((f64::from(naive) - want).abs());
            let pdf = (-x64 * x64 / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let g = f64::from(dy[i]);
            let (dwant, size) = (g * (cdf64(x64) + x64 * pdf), g * (cdf64(x64) + x64.abs() * pdf));
            let e = ulps(dx[i], dwant, size);
            assert!(e <= 8.0, "gelu'({x}) = {} against {dwant}: {e} ulp of {size}", dx[i]);
        }
        assert!(worst <= 2.0 * worst_naive, "largest error {worst} against the f32 formula's {worst_naive}");
        for n in 0..40 {
            let mut part = vec![f32::NAN; n];
            gelu(&xs[..n], &mut part, Approximate::None).unwrap();
            assert_eq!(part, y[..n], "{n} values");
        }
    }

    #[test]
    fn nan_stays_nan_and_lengths_are_checked() {
        let mut y = [0.0; 3];
        gelu(&[f32::NAN, f32::INFINITY, 1.0], &mut y, Approximate::None).unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1], f32::INFINITY);
        assert!(gelu(&[1.0; 4], &mut y, Approximate::Tanh).is_err());
        assert!(gelu_backward(&[1.0; 3], &[1.0; 2], &mut y, Approximate::None).is_err());
        assert!(gelu_backward(&[1.0; 2], &[1.0; 2], &mut y, Approximate::Tanh).is_err());
    }

    /// The tanh form under the oracle rule against its f32 formula with an f32 `tanh` (both
    /// cancel in `1 + tanh` for negative `x`), forward (2×) and derivative (3×), the f64 formula
    /// the reference; NaN stays NaN and `+∞` gives `+∞`.
    #[test]
    fn the_tanh_form_passes_the_oracle_rule() {
        const C: f64 = 0.797_884_560_802_865_4;
        let xs = points();
        let (mut y, mut dx) = (vec![f32::NAN; xs.len()], vec![f32::NAN; xs.len()]);
        let dy = vec![1.0f32; xs.len()];
        gelu(&xs, &mut y, Approximate::Tanh).unwrap();
        gelu_backward(&xs, &dy, &mut dx, Approximate::Tanh).unwrap();
        let (mut worst, mut worst_naive, mut dworst, mut dworst_naive) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (i, &x) in xs.iter().enumerate() {
            let x64 = f64::from(x);
            let t = (C * (x64 + 0.044715 * x64 * x64 * x64)).tanh();
            let want = 0.5 * x64 * (1.0 + t);
            let dwant = 0.5 * (1.0 + t) + 0.5 * x64 * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x64 * x64);
            let tn = libm::tanhf(C as f32 * (x + 0.044715 * x * x * x));
            let naive = 0.5 * x * (1.0 + tn);
            let dnaive = 0.5 * (1.0 + tn) + 0.5 * x * (1.0 - tn * tn) * C as f32 * (1.0 + 3.0 * 0.044715 * x * x);
            worst = worst.max((f64::from(y[i]) - want).abs());
            worst_naive = worst_naive.max((f64::from(naive) - want).abs());
            dworst = dworst.max((f64::from(dx[i]) - dwant).abs());
            dworst_naive = dworst_naive.max((f64::from(dnaive) - dwant).abs());
        }
        assert!(worst <= 2.0 * worst_naive + 1e-7, "forward {worst} against the f32 formula's {worst_naive}");
        assert!(dworst <= 3.0 * dworst_naive + 1e-7, "derivative {dworst} against the f32 formula's {dworst_naive}");
        let mut y = [0.0; 2];
        gelu(&[f32::NAN, f32::INFINITY], &mut y, Approximate::Tanh).unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1], f32::INFINITY);
    }
}
