//! The acceptance rule for fast kernels (FlashAttention's method): a kernel's result passes when
//! `max|fast − ref64| ≤ factor · max|naive32 − ref64| + floor`, with `factor = 2` for outputs and
//! `3` for gradients, `ref64` the `f64` reference, `naive32` the reference run in `f32`, and
//! `floor` a few ulps (of `f32`) at the reference's magnitude.
//!
//! Non-finite values must agree exactly in kind (NaN with NaN, +∞ with +∞) at the same positions.

/// Factor for forward outputs.
pub const OUTPUT_FACTOR: f64 = 2.0;
/// Factor for gradients.
pub const GRADIENT_FACTOR: f64 = 3.0;
/// Ulps of `f32` at the reference's magnitude added to the bound.
pub const FLOOR_ULPS: f64 = 4.0;

/// Checks `fast` against `ref64` with `naive32` as the baseline error. Returns a description of
/// the worst element on failure. All three slices have the same length.
pub fn check(name: &str, fast: &[f32], ref64: &[f64], naive32: &[f32], factor: f64) -> Result<(), String> {
    if fast.len() != ref64.len() || naive32.len() != ref64.len() {
        return Err(format!(
            "{name}: lengths differ: fast {}, ref64 {}, naive32 {}",
            fast.len(),
            ref64.len(),
            naive32.len()
        ));
    }
    for (i, (&f, &r)) in fast.iter().zip(ref64).enumerate() {
        let (f, r) = (f as f64, r);
        if !r.is_finite() || !f.is_finite() {
            let same = (r.is_nan() && f.is_nan()) || r == f;
            if !same {
                return Err(format!("{name}[{i}]: fast {f}, reference {r}"));
            }
        }
    }
    let max_err = |xs: &mut dyn Iterator<Item = f64>| -> (f64, usize) {
        xs.enumerate().fold((0.0, 0), |(m, at), (i, e)| if e > m { (e, i) } else { (m, at) })
    };
    let finite = |a: f64, r: f64| if r.is_finite() { (a - r).abs() } else { 0.0 };
    let (fast_err, at) = max_err(&mut fast.iter().zip(ref64).map(|(&f, &r)| finite(f as f64, r)));
    let (naive_err, _) = max_err(&mut naive32.iter().zip(ref64).map(|(&n, &r)| finite(n as f64, r)));
    let magnitude = ref64.iter().filter(|r| r.is_finite()).fold(0.0f64, |m, r| m.max(r.abs()));
    let floor = FLOOR_ULPS * magnitude.max(f32::MIN_POSITIVE as f64) * f32::EPSILON as f64;
    let bound = factor * naive_err + floor;
    if fast_err <= bound {
        Ok(())
    } else {
        Err(format!(
            "{name}: max error {fast_err:e} at {at} (fast {}, reference {}) exceeds {factor}·{naive_err:e} + {floor:e}",
            fast[at], ref64[at]
        ))
    }
}

/// Element by element, whichever of two baseline runs `a` and `b` is farther from `ref64`: with it
/// as `naive32`, [`check`]'s baseline error is the larger of the two runs' errors. FlashAttention's
/// tests take the same plain algorithm twice with its operations reordered; on small results with
/// large scores one run's largest error is a noisy statistic (a handful of rows carry all of it),
/// and the larger of two is steadier.
pub fn worse_of(a: &[f32], b: &[f32], ref64: &[f64]) -> Vec<f32> {
    a.iter()
        .zip(b)
        .zip(ref64)
        .map(|((&x, &y), &r)| if (x as f64 - r).abs() >= (y as f64 - r).abs() || y.is_nan() { x } else { y })
        .collect()
}
