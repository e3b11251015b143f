//! Learned attention sinks (gpt-oss): every kernel, forward and backward, against the `f64`
//! reference under the oracle rule (`dsinks` included) with every mask kind, bias, soft-capping,
//! grouped-query heads, dropout, decode shapes and split-KV plans; the mask structure with sinks
//! (weights summing to `1 − exp(sink − lse)`, a fully masked row's `lse` equal to its sink);
//! fully masked rows giving zero gradients and a zero contribution to `dsinks`; a −∞ sink equal to
//! no sink bit for bit; sinks that dominate or vanish; malformed sinks refused; and the `f64`
//! reference's `dsinks` against finite differences.

use crate::common;
use crate::gradients_parts;

use attn_kernels::{attention, attention_backward, AttnError, AttnGrads, Dropout, Kernel, KvView, Saved, View4};
use attn_kernels::{Align, BackwardTuning, Path, Tuning, Window};
use common::{assert_bit_identical, dims, kernel_tests, random_bias, Case, Rng};
use gradients_parts::finite_diff::assert_finite_differences;
use gradients_parts::harness::{check_grads, grads, grads_tuned, out_dims, random_dout};

kernel_tests! {
    forward => check_forward,
    gradients => check_gradients,
    dropout => check_dropout,
    fully_masked => check_fully_masked,
    neg_inf_is_no_sink => check_neg_inf_is_no_sink,
    extreme => check_extreme,
    errors => check_errors,
}

/// Sink logits `[hq]` uniform in `[lo, hi)`, with `f32::NEG_INFINITY` at the heads in `none`.
fn sinks(hq: usize, (lo, hi): (f32, f32), none: &[usize], seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..hq).map(|h| if none.contains(&h) { f32::NEG_INFINITY } else { rng.uniform(lo, hi) }).collect()
}

/// Sinks near the row log-sum-exps of `Case::new`'s inputs over tens of keys, so that they take a
/// real share of every row.
const NEAR: (f32, f32) = (0.0, 6.0);

/// The cases of the forward and gradient checks: shapes at tile edges and decode sizes, every mask
/// kind (fully masked rows among them), bias, soft-capping and grouped-query heads, each with
/// sinks (one head's −∞ in some).
fn cases() -> Vec<(&'static str, Case)> {
    let mut rng = Rng::new(5);
    let with =
        |hq: usize, none: &[usize], seed: u64, case: Case| Case { sinks: Some(sinks(hq, NEAR, none, seed)), ..case };
    vec![
        ("plain", with(2, &[], 1, Case::new(dims(2, 2, 2, 33, 70, 16, 16), 1))),
        ("gqa, one head without sink", with(6, &[4], 2, Case::new(dims(1, 6, 2, 40, 65, 16, 24), 2))),
        (
            "decode",
            with(
                8,
                &[],
                3,
                Case { causal: true, align: Align::BottomRight, ..Case::new(dims(2, 8, 2, 1, 300, 32, 32), 3) },
            ),
        ),
        (
            "causal bottom-right, dead rows",
            with(
                2,
                &[1],
                4,
                Case { causal: true, align: Align::BottomRight, ..Case::new(dims(1, 2, 1, 45, 30, 8, 8), 4) },
            ),
        ),
        (
            "window and key lengths with a zero",
            with(
                2,
                &[],
                5,
                Case {
                    window: Some(Window { left: Some(9), right: Some(2) }),
                    key_lengths: Some(vec![50, 0]),
                    ..Case::new(dims(2, 2, 2, 50, 50, 16, 8), 5)
                },
            ),
        ),
        (
            "bias with -inf, softcap",
            with(
                4,
                &[],
                6,
                Case {
                    bias: Some(random_bias(&[4, 37, 70], 2.0, 0.1, &mut rng)),
                    softcap: Some(5.0),
                    scale: Some(1.5),
                    ..Case::new(dims(2, 4, 2, 37, 70, 16, 16), 6)
                },
            ),
        ),
        (
            "bias broadcast along the keys",
            with(
                2,
                &[],
                7,
                Case {
                    bias: Some(random_bias(&[2, 1, 37, 1], 2.0, 0.0, &mut rng)),
                    ..Case::new(dims(2, 2, 1, 37, 70, 8, 16), 7)
                },
            ),
        ),
        ("long keys (split-KV by default)", with(2, &[], 8, Case::new(dims(1, 2, 1, 3, 1500, 16, 16), 8))),
    ]
}

fn check_forward(kernel: Kernel) {
    for (what, case) in cases() {
        // Every flash plan (split-KV included), with and without weights, under the oracle rule.
        let res = case.check(kernel, what);
        let label = format!("{} {what} [{}]", kernel.name(), case.describe());
        case.assert_structure(&label, &res);
    }
}

fn check_gradients(kernel: Kernel) {
    for (what, case) in cases() {
        let g = check_grads(kernel, &case, what);
        let ds = g.dsinks.as_ref().expect("dsinks with sinks");
        assert_eq!(ds.len(), case.dims.hq, "{} {what}: dsinks has one entry per query head", kernel.name());
        for (h, (&s, &x)) in case.sinks.as_ref().unwrap().iter().zip(ds).enumerate() {
            let label = format!("{} {what}: dsinks[{h}] = {x}", kernel.name());
            assert!(if s == f32::NEG_INFINITY { x == 0.0 } else { x.is_finite() && x != 0.0 }, "{label}");
        }
    }
}

/// Dropout drops key weights, never the sink: `O = Σ_j z_j·A_ij·v_j`, so `Δ_i = dO_i·O_i` is still
/// `Σ_j A_ij·dA_ij` with `dA_ij = z_j·dO_i·v_j`, the row term of `dsink` — the fast kernels' form
/// must match the reference's definition.
fn check_dropout(kernel: Kernel) {
    for (n, p) in [0.2f32, 0.6].into_iter().enumerate() {
        let d = dims(2, 4, 2, 40, 90, 16, 16);
        let case = Case {
            dropout: Some(Dropout { p, seed: 90 + n as u64 }),
            causal: n == 1,
            sinks: Some(sinks(4, NEAR, &[], 20 + n as u64)),
            ..Case::new(d, 900 + n as u64)
        };
        case.check(kernel, "dropout");
        check_grads(kernel, &case, "dropout");
    }
}

/// Every row masked (no keys in any batch) and one batch's rows masked among live ones: `out = 0`,
/// `lse = sink`, zero `dq`/`dk`/`dv` where nothing is attended, `dsinks` exactly 0 from the dead
/// rows (`p_sink = 1`, `Δ = 0`), nothing NaN.
fn check_fully_masked(kernel: Kernel) {
    let d = dims(2, 3, 1, 9, 20, 8, 8);
    let dead = Case { key_lengths: Some(vec![0, 0]), sinks: Some(vec![0.5, -3.0, 40.0]), ..Case::new(d, 30) };
    let fwd = dead.run(kernel, true).unwrap();
    for (b, h, i) in dead.rows() {
        assert_eq!(fwd.lse[dead.row(b, h, i)], dead.sinks.as_ref().unwrap()[h], "{}: lse of a dead row", kernel.name());
    }
    assert!(fwd.out.iter().chain(fwd.weights.as_ref().unwrap()).all(|&x| x == 0.0), "{}: dead rows", kernel.name());
    let g = grads(&dead, kernel, &random_dout(&dead, 1)).unwrap();
    let all = [&g.dq, &g.dk, &g.dv, g.dsinks.as_ref().unwrap()];
    assert!(all.iter().all(|x| x.iter().all(|&x| x == 0.0)), "{}: gradients of dead rows: {g:?}", kernel.name());

    // Batch 1 is dead, batch 0 alive: `dsinks` is that of batch 0 alone.
    let mixed = Case { key_lengths: Some(vec![20, 0]), ..dead.clone() };
    let g = check_grads(kernel, &mixed, "one dead batch");
    let alive = Case { dims: dims(1, 3, 1, 9, 20, 8, 8), key_lengths: Some(vec![20]), ..mixed.clone() };
    let half = |x: &[f32]| x[..x.len() / 2].to_vec();
    let alive = Case { q: half(&mixed.q), k: half(&mixed.k), v: half(&mixed.v), ..alive };
    let dout = random_dout(&mixed, 7);
    let g_alive = attn_grads(&alive, kernel, &dout[..dout.len() / 2]);
    let (ds, ds_alive) = (g.dsinks.unwrap(), g_alive.dsinks.unwrap());
    assert_eq!(ds, ds_alive, "{}: the dead batch adds to dsinks", kernel.name());
}

/// `kernel`'s forward then backward of `case` with output gradient `dout`.
fn attn_grads(case: &Case, kernel: Kernel, dout: &[f32]) -> AttnGrads<f32> {
    let tunings = (Tuning::default(), BackwardTuning::default());
    grads_tuned(case, kernel, tunings, dout).unwrap_or_else(|e| panic!("{} [{}]: {e}", kernel.name(), case.describe()))
}

/// Sinks all −∞ give the results of no sinks bit for bit, forward (every plan, weights) and
/// backward (`dq`, `dk`, `dv`), with `dsinks` exactly 0; a −∞ head among finite ones keeps that
/// head's results.
fn check_neg_inf_is_no_sink(kernel: Kernel) {
    let mut rng = Rng::new(41);
    let base = Case {
        causal: true,
        bias: Some(random_bias(&[30, 70], 1.0, 0.1, &mut rng)),
        ..Case::new(dims(2, 4, 2, 30, 70, 16, 16), 40)
    };
    let none = Case { sinks: Some(vec![f32::NEG_INFINITY; 4]), ..base.clone() };
    let label = |what: &str| format!("{} -inf sinks {what}", kernel.name());
    assert_bit_identical(&label("with weights"), &none.run(kernel, true).unwrap(), &base.run(kernel, true).unwrap());
    for path in [Path::Prefill, Path::Decode] {
        for shards in [None, Some(3)] {
            let t = Tuning { path: Some(path), shards, ..Tuning::DEFAULT };
            let (a, b) = (none.run_tuned(kernel, t).unwrap(), base.run_tuned(kernel, t).unwrap());
            assert_bit_identical(&label(&format!("{t:?}")), &a, &b);
            assert_eq!(a.lse_residue, b.lse_residue, "{}", label("residues"));
        }
    }
    let dout = random_dout(&base, 3);
    let (gn, gb) = (grads(&none, kernel, &dout).unwrap(), grads(&base, kernel, &dout).unwrap());
    assert_eq!(gn.dsinks, Some(vec![0.0; 4]), "{}", label("dsinks"));
    assert_eq!((&gn.dq, &gn.dk, &gn.dv), (&gb.dq, &gb.dk, &gb.dv), "{}", label("gradients"));
    // `dbias` is summed under a lock in the order the jobs happen to run (so not bit for bit from
    // one run to the next, sinks or not): equal to rounding.
    let (x, y) = (gn.dbias.unwrap(), gb.dbias.unwrap());
    let err = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(err <= 1e-6 * y.iter().fold(1.0f32, |m, b| m.max(b.abs())), "{}: {err}", label("dbias"));

    // Head 2 without a sink among heads with one: its rows and `dq` are those of no sinks.
    let some = Case { sinks: Some(vec![1.0, 2.0, f32::NEG_INFINITY, 3.0]), ..base.clone() };
    let (a, b) = (some.run(kernel, true).unwrap(), base.run(kernel, true).unwrap());
    let (gs, d) = (grads(&some, kernel, &dout).unwrap(), base.dims);
    for bi in 0..d.b {
        let rows = base.row(bi, 2, 0)..base.row(bi, 3, 0);
        assert_eq!(a.lse[rows.clone()], b.lse[rows.clone()], "{}", label("head 2's lse"));
        let (o, q) = (rows.start * d.dv..rows.end * d.dv, rows.start * d.dk..rows.end * d.dk);
        assert_eq!(a.out[o.clone()], b.out[o], "{}", label("head 2's out"));
        assert_eq!(gs.dq[q.clone()], gb.dq[q], "{}", label("head 2's dq"));
    }
}

/// A sink far above every score takes all the weight (`out ≈ 0`, `lse = sink`, `dsinks ≈ 0`), one
/// far below takes none (the results of no sink, to rounding); both under the oracle rule. Far
/// enough that the keys' weights underflow `f32` entirely rather than to subnormals.
fn check_extreme(kernel: Kernel) {
    let base = Case::new(dims(1, 2, 1, 20, 50, 16, 16), 50);
    for (what, s) in [("dominant", 200.0f32), ("negligible", -200.0)] {
        let case = Case { sinks: Some(vec![s, 0.75 * s]), ..base.clone() };
        case.check(kernel, what);
        let g = check_grads(kernel, &case, what);
        assert!(g.dsinks.unwrap().iter().all(|x| x.abs() < 1e-6), "{} {what}: dsinks", kernel.name());
    }
}

fn check_errors(kernel: Kernel) {
    let case = Case::new(dims(1, 3, 1, 4, 5, 8, 8), 60);
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::F32(View4::contiguous("k", &case.k, case.k_dims()).unwrap());
    let v = KvView::F32(View4::contiguous("v", &case.v, case.v_dims()).unwrap());
    let fwd = attention(kernel, &q, &k, &v, &case.params(None, None), false).unwrap();
    let dout = View4::contiguous("grad_out", &fwd.out, out_dims(&case)).unwrap();
    let saved = Saved::of(&fwd, out_dims(&case), dout).unwrap();
    let bad: [(&[f32], AttnError); 4] = [
        (&[0.0, 1.0], AttnError::DimMismatch { tensor: "sinks", dim: "heads", expected: 3, found: 2 }),
        (&[0.0; 4], AttnError::DimMismatch { tensor: "sinks", dim: "heads", expected: 3, found: 4 }),
        (&[0.0, f32::NAN, 1.0], param_error(1, "NaN")),
        (&[0.0, 1.0, f32::INFINITY], param_error(2, "+inf")),
    ];
    for (sinks, want) in bad {
        let params = attn_kernels::AttnParams { sinks: Some(sinks), ..case.params(None, None) };
        let got = attention(kernel, &q, &k, &v, &params, false).unwrap_err();
        assert_eq!(got, want, "{} forward with sinks {sinks:?}", kernel.name());
        let got = attention_backward(kernel, &q, &k, &v, &saved, &params, false).unwrap_err();
        assert_eq!(got, want, "{} backward with sinks {sinks:?}", kernel.name());
    }
}

fn param_error(h: usize, x: &str) -> AttnError {
    AttnError::Param {
        field: "sinks",
        reason: format!("entry {h} is {x}; expected a finite logit, or -inf for no sink"),
    }
}

#[test]
fn reference_dsinks_match_finite_differences() {
    let d = dims(2, 2, 1, 5, 7, 3, 4);
    let mut rng = Rng::new(70);
    let with =
        |case: Case, none: &[usize]| Case { sinks: Some(sinks(2, (-1.0, 3.0), none, case.dims.lk as u64)), ..case };
    let cases = [
        ("plain", with(Case::new(d, 1), &[])),
        ("one head without sink", with(Case::new(d, 2), &[0])),
        (
            "causal bottom-right, dead rows",
            with(Case { causal: true, align: Align::BottomRight, ..Case::new(dims(2, 2, 1, 7, 4, 3, 4), 3) }, &[]),
        ),
        ("key lengths with a zero", with(Case { key_lengths: Some(vec![4, 0]), ..Case::new(d, 4) }, &[])),
        ("dropout", with(Case { dropout: Some(Dropout { p: 0.3, seed: 5 }), ..Case::new(d, 5) }, &[])),
        (
            "bias, softcap, window",
            with(
                Case {
                    bias: Some(random_bias(&[5, 7], 1.0, 0.1, &mut rng)),
                    softcap: Some(2.0),
                    window: Some(Window { left: Some(2), right: Some(1) }),
                    ..Case::new(d, 6)
                },
                &[],
            ),
        ),
    ];
    for (what, case) in &cases {
        assert_finite_differences(case, what);
    }
}
