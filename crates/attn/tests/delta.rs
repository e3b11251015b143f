//! `attn::delta_rule` on candle tensors: its output and final state equal the kernels', and the
//! gradients candle's autograd delivers to `q`, `k`, `v`, `g`, `beta` and the initial state equal
//! the kernels' backward (the chunked one in `f32`, the recurrence in `f64`), every one finite and
//! non-zero, both gates, grouped value heads, packed sequences; bad inputs are typed errors naming
//! the tensor.

use attn::{delta_rule, AttnError, AttnLibError, DeltaOptions};
use attn_kernels::delta::{
    delta_rule as chunked, delta_rule_backward, delta_rule_reference_backward, DeltaDims, DeltaInputs, DeltaParams,
    Gate,
};
use attn_kernels::rng::SplitMix64;
use candle_core::{DType, Device, Tensor, Var};

fn values<T: candle_core::WithDType>(t: &Tensor) -> Vec<T> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn outputs_and_autograd_gradients_equal_the_kernels() {
    let dev = Device::Cpu;
    for (gate, cu) in [(Gate::Scalar, None), (Gate::Channel, None), (Gate::Scalar, Some(vec![0, 30, 30, 70]))] {
        let b = if cu.is_some() { 1 } else { 2 };
        let d = DeltaDims { b, t: 70, hk: 1, hv: 2, dk: 8, dv: 4 };
        let sequences = cu.as_ref().map_or(b, |c: &Vec<usize>| c.len() - 1);
        let opts =
            DeltaOptions { params: DeltaParams { l2norm_qk: true, gate, ..DeltaParams::default() }, cu_seqlens: cu };
        let mut rng = SplitMix64::new(4);
        let qk = [d.b, d.t, d.hk, d.dk];
        let g_shape: Vec<usize> = if gate == Gate::Channel { vec![d.b, d.t, d.hv, d.dk] } else { vec![d.b, d.t, d.hv] };
        let mut var = |n: usize, lo: f32, hi: f32, shape: &[usize]| {
            Var::from_tensor(&Tensor::from_vec(rng.uniform(n, lo, hi), shape, &dev).unwrap()).unwrap()
        };
        let q = var(d.qk_len(), -1.0, 1.0, &qk);
        let k = var(d.qk_len(), -1.0, 1.0, &qk);
        let v = var(d.v_len(), -1.0, 1.0, &[d.b, d.t, d.hv, d.dv]);
        let g = var(d.g_len(gate), -0.5, -0.01, &g_shape);
        let beta = var(d.beta_len(), 0.1, 0.9, &[d.b, d.t, d.hv]);
        let s0 = var(d.state_len(sequences), -0.5, 0.5, &[sequences, d.hv, d.dk, d.dv]);
        let r = delta_rule(&q, &k, &v, &g, &beta, Some(&s0), &opts).unwrap();
        assert_eq!(r.out.dims(), &[d.b, d.t, d.hv, d.dv]);
        assert_eq!(r.final_state.dims(), &[sequences, d.hv, d.dk, d.dv]);
        let (wo, wf) = (rng.uniform(d.v_len(), -1.0, 1.0), rng.uniform(d.state_len(sequences), -1.0, 1.0));
        let loss =
            (r.out.flatten_all().unwrap() * Tensor::new(wo.as_slice(), &dev).unwrap()).unwrap().sum_all().unwrap();
        let loss2 = (r.final_state.flatten_all().unwrap() * Tensor::new(wf.as_slice(), &dev).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = (loss + loss2).unwrap().backward().unwrap();
        let host = |x: &Var| values::<f32>(x.as_tensor());
        let (hq, hk, hv, hg, hb, hs) = (host(&q), host(&k), host(&v), host(&g), host(&beta), host(&s0));
        let x = DeltaInputs {
            q: &hq,
            k: &hk,
            v: &hv,
            g: &hg,
            beta: &hb,
            initial_state: Some(&hs),
            cu_seqlens: opts.cu_seqlens.as_deref(),
        };
        let want = chunked(&d, &x, &opts.params).unwrap();
        assert_eq!(values::<f32>(&r.out), want.out);
        assert_eq!(values::<f32>(&r.final_state), want.final_state);
        let wg = delta_rule_backward(&d, &x, &opts.params, &wo, Some(&wf)).unwrap();
        for (name, var, kernel) in [
            ("q", &q, &wg.dq),
            ("k", &k, &wg.dk),
            ("v", &v, &wg.dv),
            ("g", &g, &wg.dg),
            ("beta", &beta, &wg.dbeta),
            ("initial_state", &s0, &wg.dinitial_state),
        ] {
            let got =
                values::<f32>(grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{gate:?}: no gradient for {name}")));
            assert_eq!(&got, kernel, "{gate:?}: d{name}");
            assert!(got.iter().all(|x| x.is_finite()) && got.iter().any(|&x| x != 0.0), "{gate:?}: d{name}");
        }
    }
}

#[test]
fn f64_inputs_run_the_recurrence_and_its_derivative() {
    let dev = Device::Cpu;
    let d = DeltaDims { b: 1, t: 9, hk: 1, hv: 1, dk: 3, dv: 2 };
    let mut rng = SplitMix64::new(5);
    let mut var = |n: usize, lo: f64, hi: f64, shape: &[usize]| {
        let x: Vec<f64> = (0..n).map(|_| lo + (hi - lo) * rng.unit_f64()).collect();
        Var::from_tensor(&Tensor::from_vec(x, shape, &dev).unwrap()).unwrap()
    };
    let q = var(d.qk_len(), -1.0, 1.0, &[1, 9, 1, 3]);
    let k = var(d.qk_len(), -1.0, 1.0, &[1, 9, 1, 3]);
    let v = var(d.v_len(), -1.0, 1.0, &[1, 9, 1, 2]);
    let g = var(d.beta_len(), -0.5, 0.0, &[1, 9, 1]);
    let beta = var(d.beta_len(), 0.0, 1.0, &[1, 9, 1]);
    let opts = DeltaOptions::default();
    let r = delta_rule(&q, &k, &v, &g, &beta, None, &opts).unwrap();
    assert_eq!(r.out.dtype(), DType::F64);
    let grads = r.out.sum_all().unwrap().backward().unwrap();
    let host = |x: &Var| values::<f64>(x.as_tensor());
    let (hq, hk, hv, hg, hb) = (host(&q), host(&k), host(&v), host(&g), host(&beta));
    let x = DeltaInputs { q: &hq, k: &hk, v: &hv, g: &hg, beta: &hb, initial_state: None, cu_seqlens: None };
    let want = delta_rule_reference_backward(&d, &x, &opts.params, &vec![1.0; d.v_len()], None).unwrap();
    assert_eq!(values::<f64>(grads.get(q.as_tensor()).unwrap()), want.dq);
    assert_eq!(values::<f64>(grads.get(g.as_tensor()).unwrap()), want.dg);
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_tensor() {
    let dev = Device::Cpu;
    let t = |shape: &[usize], x: f32| Tensor::full(x, shape, &dev).unwrap();
    let (q, v, beta) = (t(&[1, 4, 1, 2], 0.5), t(&[1, 4, 1, 2], 0.5), t(&[1, 4, 1], 0.5));
    let opts = DeltaOptions::default();
    let e = delta_rule(&q, &q, &v, &t(&[1, 3, 1], -0.1), &beta, None, &opts).unwrap_err();
    assert!(
        matches!(e, AttnLibError::Kernel(AttnError::DimMismatch { tensor: "g", expected: 4, found: 3, .. })),
        "{e}"
    );
    let e = delta_rule(&q, &q, &v, &t(&[1, 4, 1], 0.25), &beta, None, &opts).unwrap_err();
    assert!(e.to_string().contains("g: entry 0 is 0.25"), "{e}");
    let e = delta_rule(&q, &q, &v, &t(&[1, 4, 1], -0.1), &beta, Some(&t(&[2, 1, 2, 2], 0.0)), &opts).unwrap_err();
    assert!(e.to_string().contains("initial_state"), "{e}");
}
