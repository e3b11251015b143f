//! The gated delta rule's chunked forward and backward (`delta_rule`, `delta_rule_backward`)
//! within the oracle rule of the `f64` recurrence at and around the chunk's edges, KDA's chunks
//! with mild, strong and mixed decays; packed sequences (`cu_seqlens`) equal to separate calls,
//! and refused when malformed.

use crate::delta_common::{dims, f32s, f64s, max_diff, Case};
use attn_kernels::delta::{delta_rule_reference, delta_rule_reference_backward, DeltaInputs, DeltaParams, Gate};
use attn_kernels::rng::SplitMix64;

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

/// The channel gate's cases for its chunks through the factorised products (mild decays: a
/// channel's decay over a chunk stays within `exp(−60)`) and token by token (some channels decaying
/// faster), in one call (one value head mild, the other strong) and in calls of each kind, with and
/// without the L2 normalisation; grouped heads, initial states.
fn channel_cases() -> Vec<(String, Case)> {
    use attn_kernels::delta::CHUNK;
    let d = dims(2, 3 * CHUNK + 5, 1, 2, 16, 12);
    let mut cases = Vec::new();
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
            cases.push((format!("{name} l2 {l2}"), c));
        }
    }
    cases
}

#[test]
fn channel_gate_chunks_pass_the_oracle_rule_mild_and_strong() {
    for (tag, c) in channel_cases() {
        assert_chunks_pass_the_oracle_rule(&c, &tag);
    }
}

/// The chunked backward's six gradients on `c` within the oracle rule (`3·` the `f32`
/// recurrence's error against the `f64` one, plus a floor), finite; `dout` (and, with `dfinal`,
/// the final state's gradient) drawn from `seed`.
fn assert_gradients_pass_the_oracle_rule(c: &Case, seed: u64, dfinal: bool, tag: &str) {
    use attn_kernels::delta::delta_rule_backward;
    let (d, p) = (c.d, c.p);
    let x32 = Inputs32::of(c);
    let mut rng = SplitMix64::new(seed);
    let dout = rng.uniform(d.v_len(), -1.0, 1.0);
    let dfinal = dfinal.then(|| rng.uniform(d.state_len(d.b), -1.0, 1.0));
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
        assert!(f.iter().all(|x| x.is_finite()), "{tag} {what}: not finite");
        assert!(err <= 3.0 * base + 1e-5, "{tag} {what}: {err:e} vs naive32 {base:e}");
    }
}

#[test]
fn chunked_gradients_pass_the_oracle_rule_at_every_edge() {
    let cases = edge_cases();
    for (n, c) in cases.iter().enumerate() {
        // The final state's gradient on every other case, none on the others.
        assert_gradients_pass_the_oracle_rule(c, 70 + n as u64, n % 2 == 1, &format!("T {} {:?}", c.d.t, c.p));
    }
    assert_eq!(cases.len(), 28);
}

/// KDA's chunked backward through the factorised products, token by token, and both in one call.
#[test]
fn channel_gate_gradients_pass_the_oracle_rule_mild_and_strong() {
    for (n, (tag, c)) in channel_cases().iter().enumerate() {
        assert_gradients_pass_the_oracle_rule(c, 95 + n as u64, n % 2 == 0, tag);
    }
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
