//! Gradients arriving at the log-sum-exp and the weights ([`SideGrads`]): the `f64` reference
//! against finite differences of `L = Σ O∘dO + Σ lse∘dlse + Σ W∘dW`; every kernel (forced plans
//! included) against the `f64` reference under the gradient oracle rule; a fully masked row and
//! NaN weight gradients at masked keys giving finite, unchanged gradients; and malformed side
//! gradients refused naming the tensor.

use crate::common;
use crate::gradients_parts;

use attn_kernels::{
    attention_backward_tuned, attention_tuned, reference, reference_backward, AttnError, AttnGrads, BackwardTuning,
    Dropout, Kernel, KvView, Real, Saved, SideGrads, Tuning, View4, WeightsGrad, Window,
};
use common::{dims, kernel_tests, random_bias, random_keep, Case, Rng};
use gradients_parts::finite_diff::assert_differences;
use gradients_parts::harness::{assert_grads, out_dims, random_dout, Terms, FORCED_PLANS};

/// What arrives at the three outputs: `dO`, `dlse` and `dW` (`[B, Hq, Lq, Lk]`).
struct Arriving {
    dout: Vec<f32>,
    dlse: Vec<f32>,
    dw: Vec<f32>,
}

impl Arriving {
    fn random(case: &Case, seed: u64) -> Self {
        let d = case.dims;
        let mut rng = Rng::new(seed ^ 0x51DE);
        Self {
            dout: random_dout(case, seed),
            dlse: rng.values(d.lse_len(), 1.0),
            dw: rng.values(d.lse_len() * d.lk, 1.0),
        }
    }
}

fn weights_dims(case: &Case) -> [usize; 4] {
    case.target()
}

/// Forward (weights returned) then backward with every arriving gradient, in `T`, on the reference.
fn reference_grads<T: Real>(case: &Case, a: &Arriving) -> AttnGrads<T> {
    let t = |x: &[f32]| x.iter().map(|&x| T::from_f32(x).unwrap()).collect::<Vec<T>>();
    let (q, k, v) = (t(&case.q), t(&case.k), t(&case.v));
    let (bias, sinks) = (case.bias.as_ref().map(|m| t(&m.data)), case.sinks.as_deref().map(t));
    let (dout, dlse, dw) = (t(&a.dout), t(&a.dlse), t(&a.dw));
    let params = case.params(bias.as_deref(), sinks.as_deref());
    let q = View4::contiguous("q", &q, case.q_dims()).unwrap();
    let k = View4::contiguous("k", &k, case.k_dims()).unwrap();
    let v = View4::contiguous("v", &v, case.v_dims()).unwrap();
    let fwd = reference(&q, &k, &v, &params, true).unwrap();
    let saved = saved(&fwd, case, &dout, &dlse, &dw);
    reference_backward(&q, &k, &v, &saved, &params, true).unwrap()
}

/// [`Saved::of`] `fwd` with `dO`, `dlse` and `dW` arriving.
fn saved<'a, T: Copy>(
    fwd: &'a attn_kernels::AttnOutput<T>,
    case: &Case,
    dout: &'a [T],
    dlse: &'a [T],
    dw: &'a [T],
) -> Saved<'a, T> {
    let weights = fwd.weights.as_deref().expect("the forward returned its weights");
    let view = |name, x| View4::contiguous(name, x, weights_dims(case)).unwrap();
    let dout = View4::contiguous("grad_out", dout, out_dims(case)).unwrap();
    Saved {
        side: SideGrads {
            dlse: Some(dlse),
            dweights: Some(WeightsGrad { weights: view("weights", weights), grad: view("grad_weights", dw) }),
        },
        ..Saved::of(fwd, out_dims(case), dout).unwrap()
    }
}

/// `kernel`'s forward (weights returned) and backward with every arriving gradient, plans forced.
fn kernel_grads(case: &Case, kernel: Kernel, (fp, bp): (Tuning, BackwardTuning), a: &Arriving) -> AttnGrads<f32> {
    let params = case.params32();
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::F32(View4::contiguous("k", &case.k, case.k_dims()).unwrap());
    let v = KvView::F32(View4::contiguous("v", &case.v, case.v_dims()).unwrap());
    let fwd = attention_tuned(kernel, fp, &q, &k, &v, &params, true).unwrap();
    let saved = saved(&fwd, case, &a.dout, &a.dlse, &a.dw);
    attention_backward_tuned(kernel, bp, &q, &k, &v, &saved, &params, true)
        .unwrap_or_else(|e| panic!("{} [{}]: {e}", kernel.name(), case.describe()))
}

/// `L = Σ O∘dO + Σ lse∘dlse + Σ W∘dW` of the `f64` reference with q, k, v, bias, sinks `x`; a
/// fully masked row's `lse = −∞` is a constant and left out.
fn loss(case: &Case, x: &[Vec<f64>; 5], a: &[Vec<f64>; 3]) -> f64 {
    let params = case.params(Some(&x[3]), Some(&x[4]));
    let q = View4::contiguous("q", &x[0], case.q_dims()).unwrap();
    let k = View4::contiguous("k", &x[1], case.k_dims()).unwrap();
    let v = View4::contiguous("v", &x[2], case.v_dims()).unwrap();
    let r = reference(&q, &k, &v, &params, true).unwrap();
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).filter(|(x, _)| x.is_finite()).map(|(x, y)| x * y).sum::<f64>();
    dot(&r.out, &a[0]) + dot(&r.lse, &a[1]) + dot(r.weights.as_ref().unwrap(), &a[2])
}

#[test]
fn reference_matches_finite_differences() {
    let d = dims(1, 2, 1, 4, 6, 3, 2);
    let mut rng = Rng::new(21);
    let cases = [
        ("plain", Case::new(d, 1)),
        ("causal bottom-right", Case { causal: true, align: attn_kernels::Align::BottomRight, ..Case::new(d, 2) }),
        ("keep mask", Case { keep: Some(random_keep(&[4, 6], 0.6, &mut rng)), ..Case::new(d, 3) }),
        ("bias", Case { bias: Some(random_bias(&[1, 2, 4, 6], 1.0, 0.1, &mut rng)), ..Case::new(d, 4) }),
        ("softcap", Case { softcap: Some(1.5), scale: Some(2.0), ..Case::new(d, 5) }),
        ("dropout", Case { dropout: Some(Dropout { p: 0.3, seed: 5 }), ..Case::new(d, 6) }),
        ("sinks", Case { sinks: Some(vec![0.5, -1.0]), ..Case::new(d, 7) }),
        ("key lengths (a fully masked batch)", Case { key_lengths: Some(vec![0]), ..Case::new(d, 8) }),
    ];
    for (what, case) in &cases {
        let a = Arriving::random(case, 3);
        let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let arriving = [wide(&a.dout), wide(&a.dlse), wide(&a.dw)];
        assert_differences(case, what, &reference_grads::<f64>(case, &a), |x| loss(case, x, &arriving));
    }
}

kernel_tests! {
    against_reference => check_against_reference,
    masked_rows_and_keys => check_masked_rows_and_keys,
}

fn check_against_reference(kernel: Kernel) {
    let mut rng = Rng::new(8);
    let d = dims(2, 4, 2, 70, 130, 16, 24);
    let cases = [
        Case::new(d, 1),
        Case { causal: true, ..Case::new(d, 2) },
        Case { window: Some(Window { left: Some(20), right: Some(5) }), ..Case::new(d, 3) },
        Case { bias: Some(random_bias(&[70, 130], 1.0, 0.05, &mut rng)), ..Case::new(d, 4) },
        Case { dropout: Some(Dropout { p: 0.25, seed: 3 }), causal: true, ..Case::new(d, 5) },
        Case { sinks: Some(vec![0.3, -0.5, 1.0, f32::NEG_INFINITY]), ..Case::new(d, 6) },
        Case { softcap: Some(2.0), key_lengths: Some(vec![100, 7]), ..Case::new(d, 7) },
        Case::new(dims(1, 2, 2, 1, 300, 64, 64), 8),
    ];
    for case in &cases {
        let a = Arriving::random(case, 11);
        let g64 = reference_grads::<f64>(case, &a);
        let g32 = reference_grads::<f32>(case, &a);
        let label = format!("{} [{}]", kernel.name(), case.describe());
        let plans = if kernel == Kernel::Reference { &[][..] } else { &FORCED_PLANS[..] };
        for &plan in plans.iter().chain([&(Tuning::default(), BackwardTuning::default())]) {
            let fast = kernel_grads(case, kernel, plan, &a);
            assert_grads(&format!("{label} {plan:?}"), &fast, &g64, &g32, &Terms::default());
        }
    }
}

/// A fully masked row gets no gradient whatever arrives at its `lse` (−∞) and weights (0); NaN
/// weight gradients at masked keys change nothing.
fn check_masked_rows_and_keys(kernel: Kernel) {
    let d = dims(1, 2, 2, 40, 90, 8, 8);
    let mut rng = Rng::new(4);
    let mut keep = random_keep(&[1, 2, 40, 90], 0.5, &mut rng);
    keep.data[..90].fill(false);
    let case = Case { keep: Some(keep.clone()), ..Case::new(d, 9) };
    let a = Arriving::random(&case, 5);
    let nan = Arriving {
        dw: a.dw.iter().zip(&keep.data).map(|(&g, &k)| if k { g } else { f32::NAN }).collect(),
        ..Arriving::random(&case, 5)
    };
    let plain = kernel_grads(&case, kernel, (Tuning::default(), BackwardTuning::default()), &a);
    let with_nan = kernel_grads(&case, kernel, (Tuning::default(), BackwardTuning::default()), &nan);
    assert_eq!(plain, with_nan, "{}: NaN gradients of masked weights reached a gradient", kernel.name());
    assert!(plain.dq[..d.dk].iter().all(|&x| x == 0.0), "{}: the fully masked row got a gradient", kernel.name());
    assert!(plain.dq.iter().chain(&plain.dk).chain(&plain.dv).all(|x| x.is_finite()));
}

#[test]
fn malformed_side_gradients_are_refused() {
    let case = Case::new(dims(1, 2, 1, 5, 7, 4, 4), 1);
    let a = Arriving::random(&case, 1);
    let params = case.params32();
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::F32(View4::contiguous("k", &case.k, case.k_dims()).unwrap());
    let v = KvView::F32(View4::contiguous("v", &case.v, case.v_dims()).unwrap());
    for kernel in [Kernel::Reference, Kernel::Auto] {
        let fwd = attention_tuned(kernel, Tuning::default(), &q, &k, &v, &params, true).unwrap();
        let good = saved(&fwd, &case, &a.dout, &a.dlse, &a.dw);
        let short_dw = View4::contiguous("grad_weights", &a.dw[..60], [1, 2, 5, 6]).unwrap();
        let bad = [
            ("grad_lse", Saved { side: SideGrads { dlse: Some(&a.dlse[1..]), ..good.side }, ..good }),
            (
                "grad_weights",
                Saved {
                    side: SideGrads {
                        dweights: Some(WeightsGrad { grad: short_dw, ..good.side.dweights.unwrap() }),
                        ..good.side
                    },
                    ..good
                },
            ),
        ];
        for (name, saved) in bad {
            let bp = BackwardTuning::default();
            match attention_backward_tuned(kernel, bp, &q, &k, &v, &saved, &params, false) {
                Err(AttnError::Layout { tensor, .. }) => assert_eq!(tensor, name, "{}", kernel.name()),
                other => panic!("{}: malformed {name} gave {other:?}", kernel.name()),
            }
        }
    }
}
