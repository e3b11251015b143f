//! `SdpaOptions::compute`: bfloat16 products through the library on bf16 tensors — the output
//! stays bf16, is as accurate as the bf16 path allows, differs from the f32 products' (so the
//! option reaches the kernel), and gradients flow through autograd (the backward computes in f32
//! from the forward's log-sum-exp).

use crate::common;

use attn::{sdpa, Precision, SdpaOptions};
use candle_core::{DType, Var};
use common::{flat, max_diff, uniform};

/// q, k, v `[1, 4, 96, 64]` (two key/value heads) in bf16.
fn inputs() -> [candle_core::Tensor; 3] {
    [[1, 4, 96, 64], [1, 2, 96, 64], [1, 2, 96, 64]]
        .iter()
        .enumerate()
        .map(|(i, s)| uniform(s, 40 + i as u64).to_dtype(DType::BF16).unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap()
}

#[test]
fn bf16_products_stay_close_to_f32_and_are_used() {
    let [q, k, v] = inputs();
    let opts = SdpaOptions::default().causal(true);
    let f32_out = sdpa(&q, &k, &v, &opts.clone().compute(Precision::F32)).unwrap();
    let bf_out = sdpa(&q, &k, &v, &opts.compute(Precision::Bf16)).unwrap();
    assert_eq!(bf_out.dtype(), DType::BF16);
    let (a, b) = (flat(&f32_out), flat(&bf_out));
    // Both outputs are rounded to bf16; the probabilities' rounding moves some of them by an ulp.
    assert!(a != b, "bf16 products gave the f32 products' output bit for bit");
    assert!(max_diff(&a, &b) <= 2.0 * 2f32.powi(-8), "bf16 products off by {}", max_diff(&a, &b));
}

#[test]
fn gradients_flow_through_bf16_products() {
    let [q, k, v] = inputs().map(|t| Var::from_tensor(&t.to_dtype(DType::F32).unwrap()).unwrap());
    let grads = |p: Precision| {
        let opts = SdpaOptions::default().compute(p);
        let loss = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts).unwrap().sqr().unwrap().sum_all().unwrap();
        let g = loss.backward().unwrap();
        [&q, &k, &v].map(|x| flat(g.get(x.as_tensor()).expect("a gradient")))
    };
    let (f, b) = (grads(Precision::F32), grads(Precision::Bf16));
    for (name, (f, b)) in ["dq", "dk", "dv"].iter().zip(f.iter().zip(&b)) {
        assert!(b.iter().all(|x| x.is_finite()) && b.iter().any(|&x| x != 0.0), "{name}: not finite or all zero");
        let scale = f.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(
            max_diff(f, b) <= 0.02 * scale,
            "{name}: bf16 products' gradient off by {} (scale {scale})",
            max_diff(f, b)
        );
    }
}
