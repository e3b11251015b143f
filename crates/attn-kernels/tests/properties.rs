//! Randomised invariants of every kernel (proptest, deterministic seed; `PROPTEST_CASES` overrides
//! the case counts): random small shapes with random masks, then
//! - the kernel agrees with `reference::<f64>` under the oracle rule;
//! - weights rows sum to 1 and vanish at masked keys, and each output element lies within the
//!   range of the unmasked values of its column;
//! - the band masks equal their materialised boolean mask, and permuting keys together with
//!   values, mask and bias columns changes nothing;
//! - adding a per-row constant to the bias changes nothing but lse (which moves by the constant);
//! - a power-of-two scale equals pre-scaling q.
//!
//! With thousands of cases (`PROPTEST_CASES=3000`) a few tiny cases fail the oracle rule for every
//! kernel alike: with a handful of outputs and scores near 100, the ratio of the fast kernel's
//! largest error to naive f32's is a noisy statistic (their error distributions match: median
//! ratio 0.98), not a sign of a kernel defect.

use crate::common;

use attn_kernels::{Align, Dims, Dropout, Kernel, Window};
use common::{assert_oracle, broadcast_shape, dims, kernel_tests, random_bias, random_keep, Case, Dense, Oracle};
use common::{Rng, SHAPE_CODES};
use proptest::option::weighted;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

kernel_tests! {
    agrees_with_reference => check_agrees,
    weights_and_range => check_weights_and_range,
    key_permutation => check_key_permutation,
    bias_shift => check_bias_shift,
    prescaled_q => check_prescaled_q,
}

/// The random choices of one case; small and printable, so a shrunk failure reads well.
#[derive(Debug, Clone)]
struct Spec {
    dims: Dims,
    causal: bool,
    bottom_right: bool,
    window: Option<(Option<usize>, Option<usize>)>,
    key_lengths: bool,
    keep: Option<usize>,
    bias: Option<usize>,
    softcap: Option<f64>,
    scale: Option<f64>,
    dropout: Option<f32>,
    seed: u64,
}

prop_compose! {
    fn sizes()(b in 1usize..=2, hkv in 1usize..=2, group in 1usize..=3, lq in 1usize..=40, lk in 1usize..=70,
               dk in 1usize..=24, dv in 1usize..=24) -> Dims {
        dims(b, hkv * group, hkv, lq, lk, dk, dv)
    }
}

prop_compose! {
    fn spec(with_dropout: bool)(
        dims in sizes(),
        causal in any::<bool>(),
        bottom_right in any::<bool>(),
        window in weighted(0.4, (weighted(0.7, 0usize..24), weighted(0.7, 0usize..24))),
        key_lengths in any::<bool>(),
        keep in weighted(0.4, 0..SHAPE_CODES),
        bias in weighted(0.4, 0..SHAPE_CODES),
        softcap in weighted(0.3, 0.5f64..30.0),
        scale in weighted(0.3, -2.0f64..2.0),
        dropout in weighted(0.3, 0.05f32..0.9),
        seed in any::<u64>(),
    ) -> Spec {
        let dropout = dropout.filter(|_| with_dropout);
        Spec { dims, causal, bottom_right, window, key_lengths, keep, bias, softcap, scale, dropout, seed }
    }
}

/// The case a spec describes: random inputs, key lengths in `0..=Lk`, keep-masks 75% true,
/// biases in `[-3, 3]` with 10% −∞.
fn build(s: &Spec) -> Case {
    let mut rng = Rng::new(s.seed ^ 0xA5A5);
    let base = Case::new(s.dims, s.seed);
    let target = base.target();
    Case {
        causal: s.causal,
        align: if s.bottom_right { Align::BottomRight } else { Align::TopLeft },
        window: s.window.map(|(left, right)| Window { left, right }),
        key_lengths: s.key_lengths.then(|| (0..s.dims.b).map(|_| rng.below(s.dims.lk + 1)).collect()),
        keep: s.keep.map(|code| random_keep(&broadcast_shape(target, code), 0.75, &mut rng)),
        bias: s.bias.map(|code| random_bias(&broadcast_shape(target, code), 3.0, 0.1, &mut rng)),
        softcap: s.softcap,
        scale: s.scale,
        dropout: s.dropout.map(|p| Dropout { p, seed: s.seed.rotate_left(17) }),
        ..base
    }
}

/// Runs `test` on `cases` random cases (30% of them with dropout when `with_dropout`).
fn run_property(kernel: Kernel, name: &str, with_dropout: bool, cases: u32, test: impl Fn(Kernel, &Case)) {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(cases);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    if let Err(e) = runner.run(&spec(with_dropout), |s| {
        test(kernel, &build(&s));
        Ok(())
    }) {
        panic!("{} {name}: {e}", kernel.name());
    }
}

fn check_agrees(kernel: Kernel) {
    run_property(kernel, "agrees with reference", true, 256, |kernel, case| {
        case.check(kernel, "random");
    });
}

fn check_weights_and_range(kernel: Kernel) {
    run_property(kernel, "weights and output range", false, 128, |kernel, case| {
        let label = format!("{} [{}]", kernel.name(), case.describe());
        let res = case.run(kernel, true).unwrap_or_else(|e| panic!("{label}: {e}"));
        case.assert_structure(&label, &res);
        let d = case.dims;
        for (b, h, i) in case.rows() {
            let r = case.row(b, h, i);
            let keys: Vec<usize> = (0..d.lk).filter(|&j| case.allowed(b, h, i, j)).collect();
            for c in 0..d.dv {
                let col = keys.iter().map(|&j| case.v[((b * d.hkv + h / d.group()) * d.lk + j) * d.dv + c]);
                let (lo, hi) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
                let x = res.out[r * d.dv + c];
                let tol = 1e-5;
                assert!(
                    keys.is_empty() || (lo - tol <= x && x <= hi + tol),
                    "{label}: out[{b},{h},{i},{c}] = {x} outside [{lo}, {hi}]"
                );
            }
        }
    });
}

/// The same call with causal, window, key lengths, keep-mask and −∞ bias folded into one full
/// keep-mask `[B, Hq, Lq, Lk]`, and the bias expanded to `[B, Hq, Lq, Lk]`.
fn materialised(case: &Case) -> Case {
    let target = case.target();
    let cells = || {
        let [b, h, lq, lk] = target;
        (0..b)
            .flat_map(move |b| (0..h).flat_map(move |h| (0..lq).flat_map(move |i| (0..lk).map(move |j| [b, h, i, j]))))
    };
    let keep = Dense { shape: target.to_vec(), data: cells().map(|[b, h, i, j]| case.allowed(b, h, i, j)).collect() };
    let bias = case.bias.as_ref().map(|m| Dense { shape: target.to_vec(), data: cells().map(|x| m.at(x)).collect() });
    Case { causal: false, window: None, key_lengths: None, keep: Some(keep), bias, ..case.clone() }
}

/// `case` (already materialised) with keys reordered: new key `j` is old key `perm[j]`.
fn permuted(case: &Case, perm: &[usize]) -> Case {
    let d = case.dims;
    let rows = |x: &[f32], width: usize| -> Vec<f32> {
        x.chunks(d.lk * width)
            .flat_map(|head| perm.iter().flat_map(move |&p| &head[p * width..(p + 1) * width]))
            .copied()
            .collect()
    };
    let keep = case.keep.as_ref().map(|m| Dense { shape: m.shape.clone(), data: permute_cols(&m.data, perm) });
    let bias = case.bias.as_ref().map(|m| Dense { shape: m.shape.clone(), data: permute_cols(&m.data, perm) });
    Case { k: rows(&case.k, d.dk), v: rows(&case.v, d.dv), keep, bias, ..case.clone() }
}

/// Rows `[.., Lk]` of `x` with column `j` taken from column `perm[j]`.
fn permute_cols<T: Copy>(x: &[T], perm: &[usize]) -> Vec<T> {
    x.chunks(perm.len()).flat_map(|row| perm.iter().map(move |&p| row[p])).collect()
}

/// Weights `[.., Lk]` of a permuted run put back in the original key order.
fn unpermute<T: Copy + Default>(w: &[T], perm: &[usize]) -> Vec<T> {
    let mut out = vec![T::default(); w.len()];
    for (row_in, row_out) in w.chunks(perm.len()).zip(out.chunks_mut(perm.len())) {
        perm.iter().zip(row_in).for_each(|(&p, &x)| row_out[p] = x);
    }
    out
}

fn check_key_permutation(kernel: Kernel) {
    run_property(kernel, "key permutation", false, 128, |kernel, case| {
        let label = format!("{} [{}]", kernel.name(), case.describe());
        let oracle = case.oracle();
        let flat = materialised(case);
        assert_oracle(&format!("{label} materialised masks"), &flat.run(kernel, true).unwrap(), &oracle);
        let mut rng = Rng::new(case.dims.lk as u64);
        let mut perm: Vec<usize> = (0..case.dims.lk).collect();
        (1..perm.len()).rev().for_each(|n| perm.swap(n, rng.below(n + 1)));
        let moved = permuted(&flat, &perm);
        let mut r32 = moved.reference32(true).unwrap();
        r32.weights = r32.weights.map(|w| unpermute(&w, &perm));
        let mut fast = moved.run(kernel, true).unwrap();
        fast.weights = fast.weights.map(|w| unpermute(&w, &perm));
        assert_oracle(&format!("{label} permuted keys {perm:?}"), &fast, &Oracle { r64: oracle.r64, r32 });
    });
}

fn check_bias_shift(kernel: Kernel) {
    run_property(kernel, "bias shift", false, 128, |kernel, case| {
        let label = format!("{} [{}]", kernel.name(), case.describe());
        let target = case.target();
        let mut rng = Rng::new(case.dims.lq as u64);
        let shift: Vec<f32> = (0..case.dims.lse_len()).map(|_| rng.below(17) as f32 - 8.0).collect();
        let full = materialised(case)
            .bias
            .unwrap_or(Dense { shape: target.to_vec(), data: vec![0.0; case.dims.weights_len()] });
        let lk = case.dims.lk;
        let data = full.data.iter().enumerate().map(|(e, &x)| x + shift[e / lk.max(1)]).collect();
        let shifted = Case { bias: Some(Dense { shape: target.to_vec(), data }), ..case.clone() };
        let mut r64 = case.reference64(true).unwrap();
        r64.lse.iter_mut().zip(&shift).for_each(|(l, &c)| *l += c as f64);
        let oracle = Oracle { r64, r32: shifted.reference32(true).unwrap() };
        for want_weights in [false, true] {
            assert_oracle(
                &format!("{label} bias + per-row constant"),
                &shifted.run(kernel, want_weights).unwrap(),
                &oracle,
            );
        }
    });
}

fn check_prescaled_q(kernel: Kernel) {
    run_property(kernel, "pre-scaled q", true, 128, |kernel, case| {
        let s = [0.25, 0.5, 2.0, 4.0][case.dims.dk % 4] * if case.dims.lq % 2 == 0 { -1.0 } else { 1.0 };
        let scaled = Case { scale: Some(s), ..case.clone() };
        let prescaled = Case { scale: Some(1.0), q: case.q.iter().map(|&x| x * s as f32).collect(), ..case.clone() };
        let label = format!("{} scale {s} [{}]", kernel.name(), case.describe());
        let oracle = scaled.oracle();
        assert_eq!(
            prescaled.reference64(true).unwrap(),
            oracle.r64,
            "{label}: reference64 differs when q is pre-scaled"
        );
        assert_oracle(&label, &scaled.run(kernel, true).unwrap(), &oracle);
        let pre_oracle = Oracle { r64: oracle.r64, r32: prescaled.reference32(true).unwrap() };
        assert_oracle(&format!("{label}, q pre-scaled"), &prescaled.run(kernel, true).unwrap(), &pre_oracle);
    });
}
