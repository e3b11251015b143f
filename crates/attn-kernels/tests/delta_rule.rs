//! The gated delta rule's reference (`attn_kernels::delta`): its gradients against central finite
//! differences in f64 for every input, both gates, with and without the L2 normalisation, grouped
//! value heads and an initial state; the algebra the rule promises (a unit key written with β = 1
//! reads back its value; β = 0 and g = 0 leave the state alone; equal channel gates are the scalar
//! gate); grouped heads equal repeated ones; a sequence cut in two and resumed from its state
//! equals the whole; f32 within the oracle rule of f64; refusals naming the argument; the chunked
//! forward and backward (`delta_rule`, `delta_rule_backward`) within the oracle rule at and around
//! the chunk's edges; packed sequences (`cu_seqlens`) equal to separate calls, and refused when
//! malformed.

use attn_kernels::delta::{
    delta_rule_reference, delta_rule_reference_backward, DeltaDims, DeltaInputs, DeltaParams, Gate,
};
use attn_kernels::rng::SplitMix64;
use attn_kernels::AttnError;

/// Owned inputs of a call.
#[derive(Clone)]
struct Case {
    d: DeltaDims,
    p: DeltaParams,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    beta: Vec<f64>,
    init: Option<Vec<f64>>,
    cu: Option<Vec<usize>>,
}

impl Case {
    fn random(d: DeltaDims, p: DeltaParams, init: bool, seed: u64) -> Case {
        let mut rng = SplitMix64::new(seed);
        let mut uniform =
            |n: usize, lo: f64, hi: f64| -> Vec<f64> { (0..n).map(|_| lo + (hi - lo) * rng.unit_f64()).collect() };
        Case {
            q: uniform(d.qk_len(), -1.0, 1.0),
            k: uniform(d.qk_len(), -1.0, 1.0),
            v: uniform(d.v_len(), -1.0, 1.0),
            g: uniform(d.g_len(p.gate), -0.7, -0.05),
            beta: uniform(d.beta_len(), 0.1, 0.9),
            init: init.then(|| uniform(d.state_len(d.b), -0.5, 0.5)),
            cu: None,
            d,
            p,
        }
    }

    fn inputs(&self) -> DeltaInputs<'_, f64> {
        DeltaInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.init.as_deref(),
            cu_seqlens: self.cu.as_deref(),
        }
    }

    /// `Σ wo·o + Σ wf·final`: a scalar whose gradient is `(wo, wf)` through the outputs.
    fn loss(&self, wo: &[f64], wf: &[f64]) -> f64 {
        let o = delta_rule_reference(&self.d, &self.inputs(), &self.p).unwrap();
        o.out.iter().zip(wo).map(|(a, b)| a * b).sum::<f64>()
            + o.final_state.iter().zip(wf).map(|(a, b)| a * b).sum::<f64>()
    }
}

/// One input of a case, to perturb.
type Field = fn(&mut Case) -> &mut Vec<f64>;

fn dims(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> DeltaDims {
    DeltaDims { b, t, hk, hv, dk, dv }
}

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

/// `x` rounded to f32.
fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// `x` widened to f64.
fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// The largest difference of `a` from `b`.
fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}

/// Cases at and around the chunk's edges for both gates, with and without the L2 normalisation:
/// strong decay at some tokens and none at others, β at 0, 1 and 1.8, initial states on every other
/// length, inputs rounded to f32 (the oracle runs on the rounded values).
fn edge_cases() -> Vec<Case> {
    use attn_kernels::delta::CHUNK;
    let lengths = [0, 1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3];
    let mut cases = Vec::new();
    for (n, t) in lengths.into_iter().enumerate() {
        for gate in [Gate::Scalar, Gate::Channel] {
            for l2 in [true, false] {
                let d = dims(2, t, 1, 2, 16, 12);
                let p = DeltaParams { scale: None, l2norm_qk: l2, gate };
                let mut c = Case::random(d, p, n % 2 == 0, 40 + n as u64);
                if !l2 {
                    // Unnormalised keys: a bounded state needs β·|k|² ≤ 2.
                    c.k.iter_mut().for_each(|x| *x *= 0.3);
                }
                for (i, g) in c.g.iter_mut().enumerate() {
                    *g = match i % 7 {
                        0 => -6.0,
                        1 => 0.0,
                        _ => *g,
                    };
                }
                // β above 1 (a negative eigenvalue, OLMo-hybrid's) where the keys are unit vectors.
                for (i, b) in c.beta.iter_mut().enumerate() {
                    *b = match i % 5 {
                        0 => 0.0,
                        1 => 1.0,
                        2 if l2 => 1.8,
                        _ => *b,
                    };
                }
                let round = |x: &mut Vec<f64>| *x = f64s(&f32s(x));
                for x in [&mut c.q, &mut c.k, &mut c.v, &mut c.g, &mut c.beta] {
                    round(x);
                }
                if let Some(init) = &mut c.init {
                    round(init);
                }
                cases.push(c);
            }
        }
    }
    cases
}

/// A case's inputs in f32 (exact: its values are f32-rounded).
struct Inputs32 {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    init: Option<Vec<f32>>,
    cu: Option<Vec<usize>>,
}

impl Inputs32 {
    fn of(c: &Case) -> Inputs32 {
        Inputs32 {
            q: f32s(&c.q),
            k: f32s(&c.k),
            v: f32s(&c.v),
            g: f32s(&c.g),
            beta: f32s(&c.beta),
            init: c.init.as_deref().map(f32s),
            cu: c.cu.clone(),
        }
    }

    fn inputs(&self) -> DeltaInputs<'_, f32> {
        DeltaInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.init.as_deref(),
            cu_seqlens: self.cu.as_deref(),
        }
    }
}

/// The chunked forward's output and final state on `c` (its values `f32`-exact) within the oracle
/// rule of the `f64` recurrence, the `f32` recurrence as baseline; `tag` names the case.
fn assert_chunks_pass_the_oracle_rule(c: &Case, tag: &str) {
    use attn_kernels::delta::delta_rule;
    let (d, p) = (c.d, c.p);
    let x32 = Inputs32::of(c);
    let oracle = delta_rule_reference(&d, &c.inputs(), &p).unwrap();
    let naive = delta_rule_reference(&d, &x32.inputs(), &p).unwrap();
    let fast = delta_rule(&d, &x32.inputs(), &p).unwrap();
    for (what, f, n32, o) in [
        ("out", &fast.out, &naive.out, &oracle.out),
        ("final state", &fast.final_state, &naive.final_state, &oracle.final_state),
    ] {
        let (err, base) = (max_diff(f, o), max_diff(n32, o));
        assert!(err <= 2.0 * base + 1e-6, "{tag} {what}: {err:e} vs naive32 {base:e}");
    }
}

#[test]
fn chunks_pass_the_oracle_rule_at_every_edge() {
    let cases = edge_cases();
    for c in &cases {
        assert_chunks_pass_the_oracle_rule(c, &format!("T {} {:?}", c.d.t, c.p));
    }
    assert_eq!(cases.len(), 28);
}

/// The channel gate's chunks through the factorised products (mild decays: a channel's decay over a
/// chunk stays within `exp(−60)`) and token by token (some channels decaying faster), in one call
/// (one value head mild, the other strong) and in calls of each kind, grouped heads, initial states.
#[test]
fn channel_gate_chunks_pass_the_oracle_rule_mild_and_strong() {
    use attn_kernels::delta::CHUNK;
    let d = dims(2, 3 * CHUNK + 5, 1, 2, 16, 12);
    for (name, lo_hi) in
        [("mild", [(-0.2, -0.01); 2]), ("strong", [(-3.0, -0.5); 2]), ("mixed", [(-0.2, -0.01), (-3.0, -0.5)])]
    {
        for l2 in [true, false] {
            let p = DeltaParams { l2norm_qk: l2, gate: Gate::Channel, ..DeltaParams::default() };
            let mut c = Case::random(d, p, true, 90);
            let mut rng = SplitMix64::new(91);
            // `g: [B, T, Hv, Dk]`: value head `h` draws from its own range.
            for (i, g) in c.g.iter_mut().enumerate() {
                let (lo, hi) = lo_hi[(i / d.dk) % d.hv];
                *g = f64::from((lo + (hi - lo) * rng.unit_f64()) as f32);
            }
            if !l2 {
                c.k.iter_mut().for_each(|x| *x *= 0.3);
            }
            for x in [&mut c.q, &mut c.k, &mut c.v, &mut c.beta] {
                *x = f64s(&f32s(x));
            }
            c.init = c.init.as_deref().map(|x| f64s(&f32s(x)));
            assert_chunks_pass_the_oracle_rule(&c, &format!("{name} l2 {l2}"));
        }
    }
}

#[test]
fn chunked_gradients_pass_the_oracle_rule_at_every_edge() {
    use attn_kernels::delta::delta_rule_backward;
    let mut checked = 0;
    for (n, c) in edge_cases().iter().enumerate() {
        let (d, p) = (c.d, c.p);
        let x32 = Inputs32::of(c);
        let mut rng = SplitMix64::new(70 + n as u64);
        let dout = rng.uniform(d.v_len(), -1.0, 1.0);
        // The final state's gradient on every other case, none on the others.
        let dfinal = (n % 2 == 1).then(|| rng.uniform(d.state_len(d.b), -1.0, 1.0));
        let (dout6, dfinal6) = (f64s(&dout), dfinal.as_deref().map(f64s));
        let oracle = delta_rule_reference_backward(&d, &c.inputs(), &p, &dout6, dfinal6.as_deref()).unwrap();
        let naive = delta_rule_reference_backward(&d, &x32.inputs(), &p, &dout, dfinal.as_deref()).unwrap();
        let fast = delta_rule_backward(&d, &x32.inputs(), &p, &dout, dfinal.as_deref()).unwrap();
        for (what, f, n32, o) in [
            ("dq", &fast.dq, &naive.dq, &oracle.dq),
            ("dk", &fast.dk, &naive.dk, &oracle.dk),
            ("dv", &fast.dv, &naive.dv, &oracle.dv),
            ("dg", &fast.dg, &naive.dg, &oracle.dg),
            ("dbeta", &fast.dbeta, &naive.dbeta, &oracle.dbeta),
            ("dinitial_state", &fast.dinitial_state, &naive.dinitial_state, &oracle.dinitial_state),
        ] {
            let (err, base) = (max_diff(f, o), max_diff(n32, o));
            assert!(f.iter().all(|x| x.is_finite()), "T {} {p:?} {what}: not finite", d.t);
            assert!(err <= 3.0 * base + 1e-5, "T {} {p:?} {what}: {err:e} vs naive32 {base:e}", d.t);
            checked += 1;
        }
    }
    assert_eq!(checked, 28 * 6);
}

#[test]
fn packed_sequences_equal_separate_calls() {
    use attn_kernels::delta::{delta_rule, delta_rule_backward, CHUNK};
    let lengths = [3, 0, CHUNK + 6, CHUNK, 1];
    let cu: Vec<usize> = std::iter::once(0)
        .chain(lengths.iter().scan(0, |end, &l| {
            *end += l;
            Some(*end)
        }))
        .collect();
    let total = *cu.last().unwrap();
    for gate in [Gate::Scalar, Gate::Channel] {
        let p = DeltaParams { l2norm_qk: true, gate, ..DeltaParams::default() };
        let d = dims(1, total, 1, 2, 16, 8);
        let mut packed = Case::random(d, p, false, 21);
        let mut rng = SplitMix64::new(22);
        let states = d.state_len(lengths.len());
        packed.init = Some((0..states).map(|_| rng.unit_f64() - 0.5).collect());
        packed.cu = Some(cu.clone());
        let x32 = Inputs32::of(&packed);
        let dout = rng.uniform(d.v_len(), -1.0, 1.0);
        let dfinal = rng.uniform(states, -1.0, 1.0);
        let all = delta_rule(&d, &x32.inputs(), &p).unwrap();
        let all_grads = delta_rule_backward(&d, &x32.inputs(), &p, &dout, Some(&dfinal)).unwrap();
        let all64 = delta_rule_reference(&d, &packed.inputs(), &p).unwrap();
        let (per_qk, per_v, per_b, per_g, per_s) = (16, 2 * 8, 2, d.g_len(gate) / total, 2 * 16 * 8);
        for (n, w) in cu.windows(2).enumerate() {
            let (from, to) = (w[0], w[1]);
            let cut = |x: &[f32], per: usize| x[from * per..to * per].to_vec();
            let one = dims(1, to - from, 1, 2, 16, 8);
            let state = |x: &[f32]| x[n * per_s..][..per_s].to_vec();
            let own = Inputs32 {
                q: cut(&x32.q, per_qk),
                k: cut(&x32.k, per_qk),
                v: cut(&x32.v, per_v),
                g: cut(&x32.g, per_g),
                beta: cut(&x32.beta, per_b),
                init: Some(state(x32.init.as_ref().unwrap())),
                cu: None,
            };
            let o = delta_rule(&one, &own.inputs(), &p).unwrap();
            assert_eq!(o.out, cut(&all.out, per_v), "{gate:?} sequence {n}: outputs");
            assert_eq!(o.final_state, state(&all.final_state), "{gate:?} sequence {n}: final state");
            let gr = delta_rule_backward(&one, &own.inputs(), &p, &cut(&dout, per_v), Some(&state(&dfinal))).unwrap();
            assert_eq!(gr.dq, cut(&all_grads.dq, per_qk), "{gate:?} sequence {n}: dq");
            assert_eq!(gr.dk, cut(&all_grads.dk, per_qk));
            assert_eq!(gr.dv, cut(&all_grads.dv, per_v));
            assert_eq!(gr.dg, cut(&all_grads.dg, per_g));
            assert_eq!(gr.dbeta, cut(&all_grads.dbeta, per_b));
            assert_eq!(gr.dinitial_state, state(&all_grads.dinitial_state));
            // The f64 reference keeps the sequences apart too (within f32 rounding of the above).
            let ref_out = &all64.out[from * per_v..to * per_v];
            assert!(max_diff(&o.out, ref_out) < 1e-5, "{gate:?} sequence {n}: reference");
        }
    }
}

#[test]
fn bad_packed_sequences_are_refused() {
    let p = DeltaParams::default();
    let mut c = Case::random(dims(1, 5, 1, 1, 2, 2), p, false, 2);
    let refusal = |c: &Case| delta_rule_reference(&c.d, &c.inputs(), &p).unwrap_err().to_string();
    c.cu = Some(vec![0, 2, 4]);
    assert!(refusal(&c).contains("must start at 0 and end at the 5 tokens"), "{}", refusal(&c));
    c.cu = Some(vec![1, 5]);
    assert!(refusal(&c).starts_with("cu_seqlens"));
    c.cu = Some(vec![0, 3, 2, 5]);
    assert!(refusal(&c).contains("entry 2 (2) is below entry 1 (3)"), "{}", refusal(&c));
    c.cu = Some(vec![0, 5]);
    c.init = Some(vec![0.0; 8]);
    assert!(refusal(&c).starts_with("initial_state: dimension length is 8, expected 4"), "{}", refusal(&c));
    let mut batch = Case::random(dims(2, 5, 1, 1, 2, 2), p, false, 3);
    batch.cu = Some(vec![0, 5]);
    assert!(refusal(&batch).contains("packed sequences need a batch of 1, found 2"));
}
