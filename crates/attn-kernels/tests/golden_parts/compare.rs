//! The tight comparison of an `f64` result with a fixture's PyTorch float64 values: the same
//! non-finite values at the same positions, and a maximum absolute error within
//! `tolerance · (1 + magnitude)`, magnitude being the largest finite expected value
//! (`F64_TOLERANCE` for forward results).

/// Relative tolerance of the `f64` reference against PyTorch.
pub const F64_TOLERANCE: f64 = 1e-10;

/// Checks `got` against `want` (same length) within [`F64_TOLERANCE`]; `what` names the fixture
/// file and tensor.
// Each test binary uses one of the two entry points.
#[allow(dead_code)]
pub fn check_f64(what: &str, got: &[f64], want: &[f64]) -> Result<(), String> {
    check_f64_within(what, got, want, F64_TOLERANCE)
}

/// [`check_f64`] with the relative `tolerance` given.
pub fn check_f64_within(what: &str, got: &[f64], want: &[f64], tolerance: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()));
    }
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !w.is_finite() || !g.is_finite() {
            if !((w.is_nan() && g.is_nan()) || w == g) {
                return Err(format!("{what}[{i}]: got {g}, expected {w}"));
            }
        } else if (g - w).abs() > worst.0 {
            worst = ((g - w).abs(), i);
        }
    }
    let magnitude = want.iter().filter(|w| w.is_finite()).fold(0.0f64, |m, w| m.max(w.abs()));
    let bound = tolerance * (1.0 + magnitude);
    let (err, at) = worst;
    if err <= bound {
        Ok(())
    } else {
        Err(format!("{what}: max error {err:e} at [{at}] (got {}, expected {}) exceeds {bound:e}", got[at], want[at]))
    }
}
