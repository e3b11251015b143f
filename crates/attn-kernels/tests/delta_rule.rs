//! The gated delta rule's reference (`attn_kernels::delta`): its gradients against central finite
//! differences in f64 for every input, both gates, with and without the L2 normalisation, grouped
//! value heads and an initial state; the algebra the rule promises (a unit key written with β = 1
//! reads back its value; β = 0 and g = 0 leave the state alone; equal channel gates are the scalar
//! gate); grouped heads equal repeated ones; a sequence cut in two and resumed from its state
//! equals the whole; f32 within the oracle rule of f64; refusals naming the argument.

use crate::delta_common::{dims, Case};
use attn_kernels::delta::{delta_rule_reference, delta_rule_reference_backward, DeltaInputs, DeltaParams, Gate};
use attn_kernels::rng::SplitMix64;
use attn_kernels::AttnError;

/// One input of a case, to perturb.
type Field = fn(&mut Case) -> &mut Vec<f64>;

#[test]
fn gradients_equal_finite_differences_for_every_input() {
    let shapes = [dims(2, 5, 1, 2, 3, 4), dims(1, 7, 2, 2, 4, 3)];
    let mut checked = 0;
    for (n, d) in shapes.into_iter().enumerate() {
        for gate in [Gate::Scalar, Gate::Channel] {
            for l2 in [false, true] {
                let p = DeltaParams { scale: None, l2norm_qk: l2, gate };
                let c = Case::random(d, p, n == 0, 11 + n as u64);
                let mut rng = SplitMix64::new(5);
                let wo: Vec<f64> = (0..d.v_len()).map(|_| rng.unit_f64() - 0.5).collect();
                let wf: Vec<f64> = (0..d.state_len(d.b)).map(|_| rng.unit_f64() - 0.5).collect();
                let gr = delta_rule_reference_backward(&d, &c.inputs(), &p, &wo, Some(&wf)).unwrap();
                let h = 1e-6;
                let fields: [(&str, Field, &Vec<f64>); 5] = [
                    ("q", |c| &mut c.q, &gr.dq),
                    ("k", |c| &mut c.k, &gr.dk),
                    ("v", |c| &mut c.v, &gr.dv),
                    ("g", |c| &mut c.g, &gr.dg),
                    ("beta", |c| &mut c.beta, &gr.dbeta),
                ];
                for (name, field, grad) in fields {
                    for (i, &got) in grad.iter().enumerate() {
                        let (mut up, mut down) = (c.clone(), c.clone());
                        field(&mut up)[i] += h;
                        field(&mut down)[i] -= h;
                        let fd = (up.loss(&wo, &wf) - down.loss(&wo, &wf)) / (2.0 * h);
                        let tol = 1e-6 * (1.0 + fd.abs());
                        assert!((fd - got).abs() <= tol, "{d:?} {gate:?} l2 {l2}: d{name}[{i}] {got} vs fd {fd}");
                        checked += 1;
                    }
                }
                if let Some(init) = &c.init {
                    for i in 0..init.len() {
                        let (mut up, mut down) = (c.clone(), c.clone());
                        up.init.as_mut().unwrap()[i] += h;
                        down.init.as_mut().unwrap()[i] -= h;
                        let fd = (up.loss(&wo, &wf) - down.loss(&wo, &wf)) / (2.0 * h);
                        let got = gr.dinitial_state[i];
                        assert!((fd - got).abs() <= 1e-6 * (1.0 + fd.abs()), "dinitial_state[{i}] {got} vs fd {fd}");
                    }
                }
            }
        }
    }
    assert!(checked > 500, "{checked} entries checked");
}

#[test]
fn a_unit_key_written_with_beta_one_reads_back_its_value() {
    // l2-normalised keys, q = k, scale 1, β = 1, no decay: o_t = S_tᵀ k_t = v_t exactly (up to the
    // normalisation's ε), whatever the state held.
    let d = dims(1, 6, 1, 1, 4, 3);
    let p = DeltaParams { scale: Some(1.0), l2norm_qk: true, gate: Gate::Scalar };
    let mut c = Case::random(d, p, true, 3);
    c.q = c.k.clone();
    c.g = vec![0.0; d.beta_len()];
    c.beta = vec![1.0; d.beta_len()];
    let o = delta_rule_reference(&d, &c.inputs(), &p).unwrap();
    for (a, b) in o.out.iter().zip(&c.v) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn no_step_and_no_decay_leave_the_state_alone() {
    let d = dims(2, 4, 1, 2, 3, 2);
    let p = DeltaParams { scale: Some(0.5), l2norm_qk: false, gate: Gate::Scalar };
    let mut c = Case::random(d, p, true, 4);
    c.beta = vec![0.0; d.beta_len()];
    c.g = vec![0.0; d.beta_len()];
    let o = delta_rule_reference(&d, &c.inputs(), &p).unwrap();
    assert_eq!(&o.final_state, c.init.as_ref().unwrap());
    let init = c.init.as_ref().unwrap();
    for b in 0..2 {
        for t in 0..4 {
            for h in 0..2 {
                for j in 0..2 {
                    let want: f64 =
                        (0..3).map(|i| init[((b * 2 + h) * 3 + i) * 2 + j] * 0.5 * c.q[((b * 4 + t) * 3) + i]).sum();
                    let got = o.out[((b * 4 + t) * 2 + h) * 2 + j];
                    assert!((got - want).abs() < 1e-12, "b {b} t {t} h {h} j {j}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn equal_channel_gates_are_the_scalar_gate() {
    let d = dims(1, 5, 1, 2, 4, 3);
    let scalar = DeltaParams { gate: Gate::Scalar, ..DeltaParams::default() };
    let c = Case::random(d, scalar, true, 6);
    let mut channel = c.clone();
    channel.p.gate = Gate::Channel;
    channel.g = c.g.iter().flat_map(|&g| [g; 4]).collect();
    let a = delta_rule_reference(&d, &c.inputs(), &c.p).unwrap();
    let b = delta_rule_reference(&d, &channel.inputs(), &channel.p).unwrap();
    assert_eq!(a, b);
}

#[test]
fn grouped_value_heads_equal_repeated_key_heads() {
    let grouped = dims(1, 4, 1, 3, 2, 2);
    let p = DeltaParams { l2norm_qk: true, ..DeltaParams::default() };
    let c = Case::random(grouped, p, false, 8);
    let repeat = |x: &[f64]| -> Vec<f64> { x.chunks(2).flat_map(|row| row.iter().copied().cycle().take(6)).collect() };
    let mut r = c.clone();
    r.d = dims(1, 4, 3, 3, 2, 2);
    (r.q, r.k) = (repeat(&c.q), repeat(&c.k));
    assert_eq!(
        delta_rule_reference(&grouped, &c.inputs(), &p).unwrap(),
        delta_rule_reference(&r.d, &r.inputs(), &p).unwrap()
    );
}

#[test]
fn a_sequence_resumed_from_its_state_equals_the_whole() {
    let whole = dims(1, 9, 1, 2, 3, 4);
    let p = DeltaParams { gate: Gate::Channel, ..DeltaParams::default() };
    let c = Case::random(whole, p, true, 9);
    let all = delta_rule_reference(&whole, &c.inputs(), &p).unwrap();
    let cut = 4;
    let part = |x: &[f64], per_t: usize, from: usize, to: usize| x[from * per_t..to * per_t].to_vec();
    let (qk, vv, bt, gg) = (3, 2 * 4, 2, 2 * 3);
    let piece = |from, to, init: Option<Vec<f64>>| Case {
        d: dims(1, to - from, 1, 2, 3, 4),
        p,
        q: part(&c.q, qk, from, to),
        k: part(&c.k, qk, from, to),
        v: part(&c.v, vv, from, to),
        g: part(&c.g, gg, from, to),
        beta: part(&c.beta, bt, from, to),
        init,
        cu: None,
    };
    let first = piece(0, cut, c.init.clone());
    let a = delta_rule_reference(&first.d, &first.inputs(), &p).unwrap();
    let second = piece(cut, 9, Some(a.final_state.clone()));
    let b = delta_rule_reference(&second.d, &second.inputs(), &p).unwrap();
    let joined: Vec<f64> = a.out.iter().chain(&b.out).copied().collect();
    for (x, y) in joined.iter().zip(&all.out) {
        assert!((x - y).abs() < 1e-12, "{x} vs {y}");
    }
    assert_eq!(b.final_state.len(), all.final_state.len());
    for (x, y) in b.final_state.iter().zip(&all.final_state) {
        assert!((x - y).abs() < 1e-12);
    }
    // No tokens: no output, the initial state comes back.
    let empty = piece(3, 3, c.init.clone());
    let e = delta_rule_reference(&empty.d, &empty.inputs(), &p).unwrap();
    assert!(e.out.is_empty());
    assert_eq!(&e.final_state, c.init.as_ref().unwrap());
}

#[test]
fn f32_is_within_the_oracle_rule_of_f64_and_zero_keys_stay_finite() {
    let d = dims(2, 33, 2, 4, 16, 8);
    for l2 in [false, true] {
        let p = DeltaParams { l2norm_qk: l2, gate: Gate::Channel, ..DeltaParams::default() };
        let mut c = Case::random(d, p, true, 12);
        c.k[..16].fill(0.0);
        let f = |x: &[f64]| -> Vec<f32> { x.iter().map(|&v| v as f32).collect() };
        let (q, k, v, g, beta) = (f(&c.q), f(&c.k), f(&c.v), f(&c.g), f(&c.beta));
        let init = c.init.as_deref().map(f);
        let x32 =
            DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, initial_state: init.as_deref(), cu_seqlens: None };
        let o32 = delta_rule_reference(&d, &x32, &p).unwrap();
        // The oracle on the f32-rounded inputs.
        let w = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| v as f64).collect() };
        let (q6, k6, v6, g6, b6) = (w(&q), w(&k), w(&v), w(&g), w(&beta));
        let i6 = init.as_deref().map(w);
        let x64 =
            DeltaInputs { q: &q6, k: &k6, v: &v6, g: &g6, beta: &b6, initial_state: i6.as_deref(), cu_seqlens: None };
        let o64 = delta_rule_reference(&d, &x64, &p).unwrap();
        let err = o32.out.iter().zip(&o64.out).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(o32.out.iter().all(|x| x.is_finite()));
        assert!(err < 1e-5, "l2 {l2}: max error {err}");
    }
}

#[test]
fn bad_inputs_are_refused_naming_the_argument() {
    let d = dims(1, 3, 2, 3, 2, 2);
    let p = DeltaParams::default();
    let c = Case::random(dims(1, 3, 1, 3, 2, 2), p, false, 1);
    let field = |e: AttnError| e.to_string();
    let e = delta_rule_reference(&d, &c.inputs(), &p).unwrap_err();
    assert!(field(e).contains("not a multiple of the 2 key heads"));
    let d = c.d;
    let mut bad = c.clone();
    bad.g[2] = 0.25;
    assert!(field(delta_rule_reference(&d, &bad.inputs(), &p).unwrap_err()).starts_with("g: entry 2 is 0.25"));
    let mut bad = c.clone();
    bad.beta[1] = 2.5;
    assert!(field(delta_rule_reference(&d, &bad.inputs(), &p).unwrap_err()).starts_with("beta: entry 1"));
    let mut bad = c.clone();
    bad.beta[0] = f64::NAN;
    assert!(field(delta_rule_reference(&d, &bad.inputs(), &p).unwrap_err()).starts_with("beta: entry 0"));
    let mut bad = c.clone();
    bad.v.pop();
    assert!(field(delta_rule_reference(&d, &bad.inputs(), &p).unwrap_err()).starts_with("v: dimension length"));
    let mut bad = c.clone();
    bad.init = Some(vec![0.0; 3]);
    assert!(field(delta_rule_reference(&d, &bad.inputs(), &p).unwrap_err()).starts_with("initial_state"));
    let short = vec![0.0; 5];
    let e = delta_rule_reference_backward(&d, &c.inputs(), &p, &short, None).unwrap_err();
    assert!(field(e).starts_with("dout: dimension length"));
    let e = delta_rule_reference(&d, &c.inputs(), &DeltaParams { scale: Some(f64::INFINITY), ..p }).unwrap_err();
    assert!(field(e).starts_with("scale"));
}
