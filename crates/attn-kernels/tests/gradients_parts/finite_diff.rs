//! Finite-difference checks of the `f64` reference backward: for the loss `L = Σ O ∘ dO` with a
//! fixed `dO`, central differences of `L` in single elements of q, k, v, the bias and the sinks
//! must match the analytic gradients. Masks and dropout are constants of `L`, so every option is
//! covered.

use attn_kernels::{reference, AttnGrads, View4};

use super::harness::{grads64, out_dims, random_dout};
use crate::common::Case;

/// `L = Σ O ∘ dO` of the `f64` reference with `q`, `k`, `v`, `bias`, `sinks` replaced by `x`.
fn loss(case: &Case, x: &[Vec<f64>; 5], dout: &[f64]) -> f64 {
    let params = case.params(Some(&x[3]), Some(&x[4]));
    let q = View4::contiguous("q", &x[0], case.q_dims()).unwrap();
    let k = View4::contiguous("k", &x[1], case.k_dims()).unwrap();
    let v = View4::contiguous("v", &x[2], case.v_dims()).unwrap();
    let out = reference(&q, &k, &v, &params, false).unwrap().out;
    out.iter().zip(dout).map(|(o, g)| o * g).sum()
}

/// Compares the analytic gradients of `case` with central differences at every element of each
/// input (cases are small) and panics naming the first disagreement.
pub fn assert_finite_differences(case: &Case, what: &str) {
    let dout32 = random_dout(case, 11);
    let analytic = grads64(case, &dout32);
    let dout: Vec<f64> = dout32.iter().map(|&x| x as f64).collect();
    assert_differences(case, what, &analytic, |x| loss(case, x, &dout));
    assert_eq!(analytic.dq.len(), out_dims(case)[..3].iter().product::<usize>() * case.dims.dk);
}

/// Checks `analytic`, the gradients of `loss` of `case`'s q, k, v, bias and sinks (widened to `f64`,
/// in that order), against central differences of `loss` at every finite element; panics naming
/// `what` and the first disagreement.
pub fn assert_differences(case: &Case, what: &str, analytic: &AttnGrads<f64>, loss: impl Fn(&[Vec<f64>; 5]) -> f64) {
    let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let base = [
        wide(&case.q),
        wide(&case.k),
        wide(&case.v),
        case.bias.as_ref().map_or(Vec::new(), |b| wide(&b.data)),
        case.sinks.as_deref().map_or(Vec::new(), wide),
    ];
    let none = Vec::new();
    let grads = [
        &analytic.dq,
        &analytic.dk,
        &analytic.dv,
        analytic.dbias.as_ref().unwrap_or(&none),
        analytic.dsinks.as_ref().unwrap_or(&none),
    ];
    for (t, name) in ["q", "k", "v", "bias", "sinks"].iter().enumerate() {
        for e in (0..base[t].len()).filter(|&e| base[t][e].is_finite()) {
            let eps = 1e-6 * base[t][e].abs().max(1.0);
            let shifted = |delta: f64| {
                let mut x = base.clone();
                x[t][e] += delta;
                loss(&x)
            };
            let numeric = (shifted(eps) - shifted(-eps)) / (2.0 * eps);
            let got = grads[t][e];
            let tol = 1e-6 * (1.0 + numeric.abs());
            assert!(
                (got - numeric).abs() <= tol,
                "{what} [{}]: d{name}[{e}] analytic {got} vs finite difference {numeric}",
                case.describe()
            );
        }
    }
}
