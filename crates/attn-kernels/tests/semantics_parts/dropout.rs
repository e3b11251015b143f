//! Dropout: determinism per seed, the keep pattern read back from the kernel's output against the
//! library's counter-based draw, the kept fraction, and the preserved mean of the output.

use attn_kernels::{Align, Dropout, Kernel};
use attn_testkit::oracle::{check, OUTPUT_FACTOR};

use crate::common::{assert_bit_identical, dims, Case};

/// Asserts `count` successes out of `n` trials lie within 5 standard deviations of `n·p`.
fn assert_binomial(what: &str, count: usize, n: usize, p: f64) {
    let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
    assert!(
        (count as f64 - mean).abs() <= 5.0 * sd,
        "{what}: {count} of {n} kept, expected {mean:.0} ± {:.0} (5 standard deviations)",
        5.0 * sd
    );
}

/// Same seed: bit-identical runs; p > 0: the oracle (the reference applies the same pattern);
/// another seed: another output; p = 0: bit-identical to no dropout; weights and lse unchanged.
pub fn check_dropout_determinism(kernel: Kernel) {
    let base = Case { causal: true, ..Case::new(dims(2, 4, 2, 33, 65, 32, 32), 100) };
    let with = |p, seed| Case { dropout: Some(Dropout { p, seed }), ..base.clone() };
    let name = kernel.name();
    let dropped = with(0.3, 1234);
    let first = dropped.check(kernel, "dropout");
    let again = dropped.run(kernel, true).unwrap();
    assert_bit_identical(&format!("{name} dropout, same seed twice"), &first, &again);
    let other = with(0.3, 1235).run(kernel, true).unwrap();
    let diff = first.out.iter().zip(&other.out).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff > 0.01, "{name}: seeds 1234 and 1235 give outputs within {diff}");
    let none = base.run(kernel, true).unwrap();
    assert_bit_identical(&format!("{name} dropout p = 0"), &with(0.0, 99).run(kernel, true).unwrap(), &none);
    let clean = base.oracle();
    let weights = first.weights.as_ref().unwrap();
    let clean_weights = (clean.r64.weights.as_ref().unwrap(), clean.r32.weights.as_ref().unwrap());
    for (what, fast, r64, r32) in [
        ("weights", &weights[..], &clean_weights.0[..], &clean_weights.1[..]),
        ("lse", &first.lse, &clean.r64.lse, &clean.r32.lse),
    ] {
        check(what, fast, r64, r32, OUTPUT_FACTOR).unwrap_or_else(|e| panic!("{name} {what} with dropout: {e}"));
    }
}

/// With one-hot values (`v_j = e_j`) and uniform weights (scale 0), `out[i, j]` is
/// `keep(i, j) / (n_i (1 − p))` with `n_i` the allowed keys of row `i`: the kernel's keep pattern
/// is read back and compared with `draw`, and the kept fraction tested against `1 − p`.
pub fn check_dropout_pattern(kernel: Kernel) {
    let (lq, lk) = (33, 65);
    for (n, p) in [0.1f32, 0.5, 0.9].into_iter().enumerate() {
        let mut case = Case {
            scale: Some(0.0),
            causal: true,
            align: Align::BottomRight,
            dropout: Some(Dropout { p, seed: 500 + n as u64 }),
            ..Case::new(dims(2, 2, 1, lq, lk, 8, lk), n as u64)
        };
        case.v = (0..2 * lk * lk).map(|e| if (e / lk) % lk == e % lk { 1.0 } else { 0.0 }).collect();
        let res = case.check(kernel, "one-hot values");
        let (mut kept, mut total) = (0, 0);
        for (b, h, i) in case.rows() {
            let r = case.row(b, h, i);
            let allowed = (0..lk).filter(|&j| case.allowed(b, h, i, j)).count();
            let unit = 1.0 / (allowed as f64 * (1.0 - p as f64));
            for j in 0..lk {
                let keep = case.allowed(b, h, i, j) && case.kept(b, h, i, j);
                let expected = if keep { unit } else { 0.0 };
                let found = res.out[r * lk + j] as f64;
                assert!(
                    (found - expected).abs() <= 1e-5 * unit,
                    "{} p={p}: out[{b},{h},{i},{j}] = {found}, expected {expected}",
                    kernel.name()
                );
                total += case.allowed(b, h, i, j) as usize;
                kept += keep as usize;
            }
        }
        assert_binomial(&format!("{} p={p}, kernel's pattern", kernel.name()), kept, total, 1.0 - p as f64);
        // The draw itself over a larger sample of rows `[B=4, Hq=8, Lq=64]` and 256 keys.
        let dr = Dropout { p, seed: 900 + n as u64 };
        let draws = (0..4)
            .flat_map(|b| (0..8).flat_map(move |h| (0..64).flat_map(move |i| (0..256).map(move |j| (b, h, i, j)))));
        let kept = draws.clone().filter(|&(b, h, i, j)| dr.keeps(dr.row_key(b, h, i, [8, 64]), j)).count();
        assert_binomial(&format!("p={p}, draw over 4·8·64·256"), kept, draws.count(), 1.0 - p as f64);
    }
}

/// Dropout preserves the output in expectation: the mean difference to the clean run over all
/// elements lies within 5 standard deviations, the variance computed exactly from the weights.
pub fn check_dropout_mean(kernel: Kernel) {
    let p = 0.5f32;
    let clean = Case::new(dims(2, 4, 2, 64, 128, 32, 32), 110);
    let dropped = Case { dropout: Some(Dropout { p, seed: 7 }), ..clean.clone() };
    let with = dropped.run(kernel, false).unwrap().out;
    let without = clean.run(kernel, false).unwrap().out;
    let n = with.len() as f64;
    let mean = with.iter().zip(&without).map(|(&a, &b)| a as f64 - b as f64).sum::<f64>() / n;
    // Var Σ_{i,d} (out' − out) = Σ_i Σ_j w_ij² (Σ_d v_jd)² · p/(1 − p): keeps are independent.
    let d = clean.dims;
    let w = clean.reference64(true).unwrap().weights.unwrap();
    let mut var = 0.0;
    for (b, h, i) in clean.rows() {
        let r = clean.row(b, h, i);
        for j in 0..d.lk {
            let g = h / d.group();
            let at = ((b * d.hkv + g) * d.lk + j) * d.dv;
            let vsum: f64 = clean.v[at..at + d.dv].iter().map(|&x| x as f64).sum();
            var += (w[r * d.lk + j] * vsum).powi(2) * p as f64 / (1.0 - p as f64);
        }
    }
    let sd = var.sqrt() / n;
    assert!(sd > 0.0);
    assert!(mean.abs() <= 5.0 * sd, "{}: mean change {mean:e} exceeds 5 standard deviations ({sd:e})", kernel.name());
}
