//! `attn run --delta-rule gated|kda`: `out`, `final_state` and, with `grad_out`, every gradient
//! against the `f64` recurrence and its derivative (the oracle rule, the `f32` recurrence as
//! baseline), both gates, grouped value heads, an initial state, L2 normalisation and packed
//! sequences; refusals name the file and the tensor or flag.

use crate::common;

use attn_kernels::delta::{
    delta_rule_reference, delta_rule_reference_backward, DeltaDims, DeltaInputs, DeltaParams, Gate,
};
use common::*;

/// Log decays in `[-0.6, -0.01)` and step sizes in `[0.05, 0.95)` of `shape`.
fn ranged(shape: &[usize], seed: u64, lo: f32, hi: f32) -> HostTensor {
    let data = values(shape.iter().product(), seed).iter().map(|x| lo + (hi - lo) * (x + 1.0) / 2.0).collect();
    tensor(shape, HostData::F32(data))
}

/// The recurrence in `T` on the files' values: `[out, final_state, dq, dk, dv, dg, dbeta, dinitial_state]`.
fn oracle<T: Real>(d: &DeltaDims, t: &[&HostTensor; 7], cu: Option<&[usize]>, p: &DeltaParams) -> Vec<Vec<T>> {
    let data: Vec<Vec<T>> = t.iter().map(|x| f32_of(x).iter().map(|&v| T::from_f32(v).unwrap()).collect()).collect();
    let x = DeltaInputs {
        q: &data[0],
        k: &data[1],
        v: &data[2],
        g: &data[3],
        beta: &data[4],
        initial_state: Some(&data[5]),
        cu_seqlens: cu,
    };
    let fwd = delta_rule_reference(d, &x, p).unwrap();
    let g = delta_rule_reference_backward(d, &x, p, &data[6], None).unwrap();
    vec![fwd.out, fwd.final_state, g.dq, g.dk, g.dv, g.dg, g.dbeta, g.dinitial_state]
}

const RESULTS: [&str; 8] = ["out", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state"];

#[test]
fn outputs_final_states_and_gradients_match_the_recurrence() {
    for (rule, gate, l2, cu) in [
        ("gated", Gate::Scalar, true, None),
        ("kda", Gate::Channel, false, None),
        ("gated", Gate::Scalar, false, Some(vec![0usize, 20, 20, 75])),
    ] {
        let b = if cu.is_some() { 1 } else { 2 };
        let d = DeltaDims { b, t: 75, hk: 2, hv: 4, dk: 8, dv: 5 };
        let sequences = cu.as_ref().map_or(b, |c| c.len() - 1);
        let g_shape: Vec<usize> = if gate == Gate::Channel { vec![b, d.t, d.hv, d.dk] } else { vec![b, d.t, d.hv] };
        let q = f32_tensor(&[b, d.t, d.hk, d.dk], 1);
        let k = f32_tensor(&[b, d.t, d.hk, d.dk], 2);
        let v = f32_tensor(&[b, d.t, d.hv, d.dv], 3);
        let g = ranged(&g_shape, 4, -0.6, -0.01);
        let beta = ranged(&[b, d.t, d.hv], 5, 0.05, 0.95);
        let s0 = f32_tensor(&[sequences, d.hv, d.dk, d.dv], 6);
        let dout = f32_tensor(&[b, d.t, d.hv, d.dv], 7);
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.safetensors");
        let mut tensors = vec![
            ("q", &q),
            ("k", &k),
            ("v", &v),
            ("g", &g),
            ("beta", &beta),
            ("initial_state", &s0),
            ("grad_out", &dout),
        ];
        let offsets = cu.as_ref().map(|c| tensor(&[c.len()], HostData::I64(c.iter().map(|&x| x as i64).collect())));
        tensors.extend(offsets.iter().map(|t| ("cu_seqlens", t)));
        write(&input, &tensors);
        let out = out_path(dir.path());
        let mut args = vec!["--delta-rule", rule, "-o", out.to_str().unwrap()];
        if l2 {
            args.push("--qk-l2norm");
        }
        let (result, stdout) = run_ok(&args, &[&input], &out);
        assert!(stdout.contains("delta rule (chunked, f32"), "{stdout}");
        let mut names: Vec<&str> = result.keys().map(String::as_str).collect();
        names.sort();
        let mut want = RESULTS.to_vec();
        want.sort();
        assert_eq!(names, want);
        assert_eq!(result["final_state"].shape, [sequences, d.hv, d.dk, d.dv]);
        let p = DeltaParams { l2norm_qk: l2, gate, ..DeltaParams::default() };
        let files = [&q, &k, &v, &g, &beta, &s0, &dout];
        let (ref64, naive) =
            (oracle::<f64>(&d, &files, cu.as_deref(), &p), oracle::<f32>(&d, &files, cu.as_deref(), &p));
        for (i, name) in RESULTS.into_iter().enumerate() {
            let factor = if i < 2 { OUTPUT_FACTOR } else { GRADIENT_FACTOR };
            check(name, &f32_of(&result[name]), &ref64[i], &naive[i], factor)
                .unwrap_or_else(|e| panic!("{rule} l2 {l2} packed {}: {e}", cu.is_some()));
        }
    }
}

#[test]
fn bad_inputs_and_flags_are_refused_by_name() {
    let (q, v) = (f32_tensor(&[1, 6, 1, 4], 1), f32_tensor(&[1, 6, 2, 3], 2));
    let (g, beta) = (ranged(&[1, 6, 2], 3, -0.5, -0.1), ranged(&[1, 6, 2], 4, 0.1, 0.9));
    let rising = ranged(&[1, 6, 2], 3, 0.1, 0.5);
    let e = fails_on(&[("q", &q), ("k", &q), ("v", &v), ("g", &rising), ("beta", &beta)], &["--delta-rule", "gated"]);
    assert!(e.contains("in.safetensors") && e.contains("g: entry 0"), "{e}");
    let e = fails_on(&[("q", &q), ("k", &q), ("v", &v), ("g", &g)], &["--delta-rule", "gated"]);
    assert!(e.contains("beta") && e.contains("missing"), "{e}");
    let e = fails_on(&[("q", &q), ("k", &q), ("v", &v), ("g", &g), ("beta", &beta)], &["--delta-rule", "kda"]);
    assert!(e.contains("tensor 'g'") && e.contains("rank 4 [B, T, Hv, Dk] (KDA)"), "{e}");
    let e = fails_on(
        &[("q", &q), ("k", &q), ("v", &v), ("g", &g), ("beta", &beta), ("mask", &g)],
        &["--delta-rule", "gated"],
    );
    assert!(e.contains("mask") && e.contains("cu_seqlens"), "{e}");
    let bad_grad = f32_tensor(&[1, 6, 2, 4], 5);
    let e = fails_on(
        &[("q", &q), ("k", &q), ("v", &v), ("g", &g), ("beta", &beta), ("grad_out", &bad_grad)],
        &["--delta-rule", "gated"],
    );
    assert!(e.contains("grad_out") && e.contains("(v's)"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    for flags in
        [&["--delta-rule", "gated", "--causal"][..], &["--qk-l2norm"], &["--delta-rule", "gated", "--window", "2,0"]]
    {
        let o = Command::new(env!("CARGO_BIN_EXE_attn"))
            .current_dir(dir.path())
            .args(["run", "in.safetensors", "-o", "x.safetensors"])
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && (stderr.contains("cannot be used with") || stderr.contains("required")),
            "{flags:?}: {stderr}"
        );
    }
}
