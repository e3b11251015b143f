//! A randomised differential test of every kernel, forward and backward, against the `f64`
//! reference: seeded configurations drawn over sizes 1…300, grouped-query ratios up to 7, every
//! mask kind combined (causal in both alignments, window, key lengths, broadcast keep-masks and
//! biases with −∞), soft-capping, dropout, attention sinks (some −∞), scales −0.7…3 and input
//! magnitudes 0.01…4, so that scores reach the hundreds; one in eight with an empty or degenerate
//! size (`B`, `Lq`, `Lk`, `Dk`, `Dv` or the heads 0). Each fast kernel's `out`, `lse`, `dq`,
//! `dk`, `dv`, `dbias` and `dsinks` must meet the oracle rule with naive32 taken as the larger
//! error of two plain `f32` runs — the reference kernel, and the algorithm written as PyTorch's
//! math path computes it, with fused multiply-adds (`common::math_path`), as FlashAttention's tests
//! take the plain algorithm twice with its operations reordered: with scores in the hundreds a
//! result's largest error often hangs on the rounding of one score, which either ordering may
//! happen to round worse. The reference kernel's gradients must meet the rule against the math path
//! alone: the reference is the yardstick of every fast kernel, so it may be no looser than the
//! plain algorithm a PyTorch user runs.
//!
//! `ATTN_DIFFERENTIAL_CASES` sets the number of configurations (default 300; each at most
//! `WORK_BUDGET` multiply-adds per pass); failures are collected and reported together.

use crate::common;
use crate::gradients_parts;

use attn_kernels::{Align, AttnGrads, BackwardTuning, Dims, Dropout, Kernel, Tuning, Window};
use attn_testkit::oracle::worse_of;
use common::{broadcast_shape, kernel_tests, math_path, oracle_verdict, random_bias, random_keep};
use common::{Case, Rng, SHAPE_CODES};
use gradients_parts::harness::{grads, grads64, grads_tuned, grads_verdict, random_dout, terms};

kernel_tests! {
    differential => check_differential,
}

/// Default number of configurations per kernel.
const CASES: usize = 300;
/// Most multiply-adds `B·Hq·Lq·Lk·(Dk + Dv)` of one configuration.
const WORK_BUDGET: usize = 3_000_000;

/// A size in `1..=max`, log-uniform (small sizes as likely as large ones).
fn log_size(rng: &mut Rng, max: usize) -> usize {
    ((max as f64).powf(rng.unit()).floor() as usize).clamp(1, max)
}

/// Sizes with at most [`WORK_BUDGET`] multiply-adds.
fn random_dims(rng: &mut Rng) -> Dims {
    loop {
        let (hkv, group) = (1 + rng.below(2), 1 + rng.below(7));
        let d = common::dims(
            1 + rng.below(3),
            hkv * group,
            hkv,
            log_size(rng, 300),
            log_size(rng, 300),
            log_size(rng, 128),
            log_size(rng, 128),
        );
        if d.b * d.hq * d.lq * d.lk * (d.dk + d.dv) <= WORK_BUDGET {
            return d;
        }
    }
}

/// `d` with, one time in eight, one of `B`, `Lq`, `Lk`, `Dk` or `Dv` (or both head counts) set to
/// 0: the empty and degenerate calls PyTorch answers (an empty result; every key scored 0 for
/// `Dk = 0`; an empty output beside the log-sum-exps for `Dv = 0`). Drawn from a generator of its
/// own, so the other configurations are those drawn before it existed.
fn degenerate(d: Dims, n: usize) -> Dims {
    let mut rng = Rng::new(0xE0E0 ^ n as u64);
    if !rng.chance(0.125) {
        return d;
    }
    let mut d = d;
    match rng.below(6) {
        0 => d.b = 0,
        1 => d.lq = 0,
        2 => d.lk = 0,
        3 => d.dk = 0,
        4 => d.dv = 0,
        _ => (d.hq, d.hkv) = (0, 0),
    }
    d
}

/// Configuration `n`: random sizes (some empty or degenerate, [`degenerate`]), options and inputs
/// scaled by a magnitude in `0.01…4`.
fn configuration(n: usize) -> Case {
    let mut rng = Rng::new(0xD1FF ^ n as u64);
    let d = degenerate(random_dims(&mut rng), n);
    let target = [d.b, d.hq, d.lq, d.lk];
    let magnitude = 0.01f32 * 400f32.powf(rng.unit() as f32);
    let mut case = Case::new(d, n as u64);
    for x in case.q.iter_mut().chain(&mut case.k).chain(&mut case.v) {
        *x *= magnitude;
    }
    let side = |rng: &mut Rng| rng.chance(0.7).then(|| rng.below(d.lk.max(d.lq) + 2));
    Case {
        causal: rng.chance(0.4),
        align: if rng.chance(0.5) { Align::BottomRight } else { Align::TopLeft },
        window: rng.chance(0.3).then(|| Window { left: side(&mut rng), right: side(&mut rng) }),
        key_lengths: rng.chance(0.3).then(|| (0..d.b).map(|_| rng.below(d.lk + 1)).collect()),
        keep: rng.chance(0.3).then(|| {
            let p = 0.5 + 0.45 * rng.unit();
            random_keep(&broadcast_shape(target, rng.below(SHAPE_CODES)), p, &mut rng)
        }),
        bias: rng.chance(0.4).then(|| {
            let amp = 0.5 + 2.5 * rng.unit() as f32;
            random_bias(&broadcast_shape(target, rng.below(SHAPE_CODES)), amp, 0.1, &mut rng)
        }),
        softcap: rng.chance(0.25).then(|| 0.5 + 29.5 * rng.unit()),
        scale: rng.chance(0.6).then(|| -0.7 + 3.7 * rng.unit()),
        dropout: rng.chance(0.2).then(|| Dropout { p: 0.05 + 0.45 * rng.unit() as f32, seed: n as u64 }),
        // Drawn last, so the other draws of a configuration are those before sinks existed.
        sinks: rng.chance(0.25).then(|| random_sinks(d.hq, magnitude, &mut rng)),
        ..case
    }
}

/// Sink logits `[hq]` near the row log-sum-exps of inputs of `magnitude` (scores up to about
/// `magnitude²·Dk`, sums over up to 300 keys), one in four −∞ (no sink for that head).
fn random_sinks(hq: usize, magnitude: f32, rng: &mut Rng) -> Vec<f32> {
    let spread = 3.0 + magnitude * magnitude;
    (0..hq).map(|_| if rng.chance(0.25) { f32::NEG_INFINITY } else { rng.uniform(-spread, 2.0 * spread) }).collect()
}

/// `a` and `b` merged by [`worse_of`] against `r`, gradient by gradient.
fn worse_grads(a: AttnGrads<f32>, b: &AttnGrads<f32>, r: &AttnGrads<f64>) -> AttnGrads<f32> {
    AttnGrads {
        dq: worse_of(&a.dq, &b.dq, &r.dq),
        dk: worse_of(&a.dk, &b.dk, &r.dk),
        dv: worse_of(&a.dv, &b.dv, &r.dv),
        dbias: a.dbias.zip(b.dbias.as_ref()).zip(r.dbias.as_ref()).map(|((a, b), r)| worse_of(&a, b, r)),
        dtable: None,
        dsinks: a.dsinks.zip(b.dsinks.as_ref()).zip(r.dsinks.as_ref()).map(|((a, b), r)| worse_of(&a, b, r)),
    }
}

/// The first rule a configuration breaks with `kernel`, forward or backward. A fast kernel's
/// baseline is the larger error of the two plain `f32` runs, naive32 and the math path; the
/// reference kernel's is the math path alone.
fn verdict(kernel: Kernel, case: &Case) -> Result<(), String> {
    let refused = |what: &'static str| move |e: attn_kernels::AttnError| format!("{what} refused: {e}");
    let dout = random_dout(case, 11);
    let math = math_path::<f32>(case, &dout);
    let fwd = case.run(kernel, false).map_err(refused("forward"))?;
    let mut oracle = case.oracle();
    if kernel != Kernel::Reference {
        oracle.r32.out = worse_of(&oracle.r32.out, &math.out, &oracle.r64.out);
        oracle.r32.lse = worse_of(&oracle.r32.lse, &math.lse, &oracle.r64.lse);
    }
    oracle_verdict(&fwd, &oracle).map_err(|e| format!("forward: {e}"))?;
    let g64 = grads64(case, &dout);
    let terms = terms(case, &dout);
    let fast = grads(case, kernel, &dout).map_err(refused("backward"))?;
    let baseline = match kernel {
        Kernel::Reference => math.grads,
        _ => worse_grads(grads(case, Kernel::Reference, &dout).map_err(refused("naive32"))?, &math.grads, &g64),
    };
    grads_verdict(&fast, &g64, &baseline, &terms).map_err(|e| format!("backward: {e}"))?;
    if kernel == Kernel::Reference {
        return Ok(());
    }
    // After a split-KV forward: the shards' log-sum-exps and residues merged.
    let split = (Tuning { path: None, shards: Some(3), ..Tuning::DEFAULT }, BackwardTuning::default());
    let fast = grads_tuned(case, kernel, split, &dout).map_err(refused("backward after split-KV"))?;
    grads_verdict(&fast, &g64, &baseline, &terms).map_err(|e| format!("backward after split-KV: {e}"))
}

fn check_differential(kernel: Kernel) {
    let cases = std::env::var("ATTN_DIFFERENTIAL_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(CASES);
    let failures: Vec<String> = (0..cases)
        .filter_map(|n| {
            let case = configuration(n);
            verdict(kernel, &case).err().map(|e| format!("#{n} [{}]: {e}", case.describe()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{}: {} of {cases} configurations break the oracle rule:\n{}",
        kernel.name(),
        failures.len(),
        failures.join("\n")
    );
}
