//! Golden parity with PyTorch: every module against its PyTorch counterpart computed in float64
//! (`tests/fixtures/*.safetensors`, written by `scripts/gen_module_fixtures.py`).
//!
//! For each module fixture the module is built twice through `VarBuilder::from_varmap`, once with
//! the fast kernel (`Kernel::Auto`) and once with `Kernel::Reference` (the plain kernel, the
//! `naive32` baseline); the `VarMap` it fills must hold exactly the fixture's parameter names
//! (nothing missing, nothing unused), and their values are then set from the fixture (rounded to
//! `f32`). Each run computes the output (and the attention weights when the case asks) and the
//! gradients of `(out · grad_out).sum()` with respect to every float input and every parameter.
//! Every one of them must pass both
//! - [`oracle::check`]: `max|fast − ref64| ≤ factor · max|naive32 − ref64| + floor`, with
//!   `OUTPUT_FACTOR` for outputs and weights and `GRADIENT_FACTOR` for gradients; and
//! - the `f32` budget: `max|naive32 − ref64| ≤ F32_BUDGET · max|ref64|`. The oracle alone would
//!   accept a module that disagrees with PyTorch, since both runs share every layer but the
//!   attention kernel; the budget catches such a disagreement (see [`a_perturbed_weight_fails`]).
//!
//! Position helpers (ALiBi slopes and bias, the sinusoidal table) are checked to `1e-6`.
//! Loading a state dict with a missing, mis-shaped or unused weight must fail naming the tensor.

use crate::pytorch_parity_parts;

use std::collections::HashMap;

use attn::{Align, Kernel};
use attn_nn::position::alibi::{alibi_bias, alibi_slopes};
use attn_nn::position::sinusoidal::sinusoidal_table;
use attn_nn::StateDict;
use candle_core::{DType, Device, Tensor};
use pytorch_parity_parts::check::{compare, compute, report, Batch};
use pytorch_parity_parts::fixture::{fixture_dir, fixture_names, Data, Fixture};
use pytorch_parity_parts::models::{build, err, param_tensors};

/// Tolerance of the position helpers, relative to `max(1, |value|)`.
const POSITION_TOL: f64 = 1e-6;

/// Runs one module fixture on both kernels and compares; prints the worst ratios.
fn check_module(fx: &Fixture) -> Result<(), String> {
    report(fx, &compute(fx, Kernel::Auto, Batch::Padded)?, &compute(fx, Kernel::Reference, Batch::Padded)?)
}

/// `|got − want| ≤ POSITION_TOL · max(1, |want|)` element-wise.
fn check_close(tag: &str, got: &[f64], want: &[f64]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{tag}: {} values, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| (g - w).abs() > POSITION_TOL * w.abs().max(1.0)) {
        None => Ok(()),
        Some(i) => Err(format!("{tag}[{i}]: {}, expected {}", got[i], want[i])),
    }
}

fn tensor_f64(t: &Tensor) -> Result<Vec<f64>, String> {
    t.flatten_all().and_then(|t| t.to_dtype(DType::F64)?.to_vec1()).map_err(err)
}

/// ALiBi slopes and bias, or the sinusoidal table, against the fixture.
fn check_position(fx: &Fixture) -> Result<(), String> {
    let c = &fx.config;
    match fx.kind.as_str() {
        "alibi" => {
            let h = c.usize("num_heads")?;
            let align = match c.str("align")? {
                "top_left" => Align::TopLeft,
                "bottom_right" => Align::BottomRight,
                other => return Err(format!("{}: align `{other}`", fx.name)),
            };
            check_close(&format!("{}: slopes", fx.name), &alibi_slopes(h), fx.f64s("slopes")?)?;
            let bias = alibi_bias(h, c.usize("lq")?, c.usize("lk")?, align).map_err(err)?;
            if bias.dims() != fx.get("out")?.shape.as_slice() {
                return Err(format!("{}: bias shape {:?}, expected {:?}", fx.name, bias.dims(), fx.get("out")?.shape));
            }
            check_close(&format!("{}: bias", fx.name), &tensor_f64(&bias)?, fx.f64s("out")?)
        }
        "sinusoidal" => {
            let table = sinusoidal_table(c.usize("max_len")?, c.usize("d")?).map_err(err)?;
            check_close(&format!("{}: table", fx.name), &tensor_f64(&table)?, fx.f64s("out")?)
        }
        other => Err(format!("{}: `{other}` is not a position helper", fx.name)),
    }
}

fn check_case(name: &str) {
    let result = Fixture::load(name).and_then(|fx| match fx.kind.as_str() {
        "alibi" | "sinusoidal" => check_position(&fx),
        _ => check_module(&fx),
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

macro_rules! parity_cases {
    ($($case:ident),* $(,)?) => {
        /// Every case, one test each.
        const CASES: &[&str] = &[$(stringify!($case)),*];
        $(
            #[test]
            fn $case() {
                check_case(stringify!($case));
            }
        )*
    };
}

parity_cases!(
    mha_self_padding,
    mha_cross_kdim_vdim,
    mha_float_mask_nobias,
    mha_bias_kv_causal,
    mha_zero_attn_seq_first,
    mha_unbatched_bias_kv_zero_attn,
    gqa_causal,
    gqa_rope_mqa,
    gqa_rope_sinks,
    encoder_post_relu_padding,
    encoder_pre_gelu_causal,
    decoder_causal_padding,
    encoder_no_bias_seq_first,
    decoder_no_bias_unbatched,
    transformer,
    transformer_no_bias_seq_first,
    seq2seq,
    self_attention,
    additive,
    layer_norm_no_affine,
    alibi_8,
    alibi_6,
    sinusoidal,
);

#[test]
fn every_fixture_has_a_case() {
    let mut cases: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    cases.sort();
    assert_eq!(fixture_names(&fixture_dir()), cases, "the fixtures and the test cases differ");
}

/// The checks can fail: a parameter off by 1e-3 (in PyTorch's `f64` model, so both kernels agree
/// with each other) is caught by the `f32` budget, where the oracle alone would pass.
#[test]
fn a_perturbed_weight_fails() {
    let mut fx = Fixture::load("mha_self_padding").unwrap();
    let stored = fx.tensors.get_mut("param.out_proj.bias").unwrap();
    let Data::F64(values) = &mut stored.data else { panic!("param.out_proj.bias is not F64") };
    values[0] += 1e-3;
    let (fast, naive) =
        (compute(&fx, Kernel::Auto, Batch::Padded).unwrap(), compute(&fx, Kernel::Reference, Batch::Padded).unwrap());
    let (failures, _) = compare(&fx, &fast, &naive);
    assert!(failures.iter().any(|f| f.contains(": out: the module disagrees")), "not caught: {failures:?}");
}

/// The name check can fail: a fixture lacking a weight the module makes, or holding one it never
/// asks for, is refused.
#[test]
fn state_dict_names_must_match() {
    let fx = Fixture::load("mha_self_padding").unwrap();
    let mut missing = fx.clone();
    let bias = missing.tensors.remove("param.out_proj.bias").unwrap();
    let mut unused = fx.clone();
    unused.tensors.insert("param.spare.bias".into(), bias);
    for (fx, want) in [(missing, "no weight `out_proj.bias`"), (unused, "does not use: spare.bias")] {
        let e = compute(&fx, Kernel::Auto, Batch::Padded).unwrap_err();
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
}

/// Ways of breaking a loaded state dict.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Missing,
    Misshaped,
}

/// One weight per case whose absence or wrong shape must be reported by its full name.
const BROKEN: [(&str, &str); 6] = [
    ("mha_cross_kdim_vdim", "k_proj_weight"),
    ("gqa_rope_mqa", "in_proj_bias"),
    ("gqa_rope_sinks", "sinks"),
    ("transformer", "decoder.layers.1.multihead_attn.in_proj_weight"),
    ("seq2seq", "transformer.encoder.norm.weight"),
    ("additive", "w_v.weight"),
];

/// Builds each `BROKEN` case from its state dict with `fault` applied to the weight; the error
/// must name it.
fn broken_state_dict_is_refused(fault: Fault) {
    for (case, weight) in BROKEN {
        let fx = Fixture::load(case).unwrap();
        let mut params: HashMap<String, Tensor> = param_tensors(&fx).unwrap().into_iter().collect();
        let t = params.remove(weight).unwrap_or_else(|| panic!("{case}: no weight `{weight}`"));
        if let Fault::Misshaped = fault {
            let mut dims = t.dims().to_vec();
            dims[0] += 1;
            params.insert(weight.to_string(), Tensor::zeros(dims, DType::F32, &Device::Cpu).unwrap());
        }
        let state_dict = StateDict::from_tensors(params, case);
        match state_dict.build(DType::F32, &Device::Cpu, |vb| build(&fx, Kernel::Auto, vb).map_err(anyhow::Error::msg))
        {
            Ok(_) => panic!("{case}: built with {weight} {fault:?}"),
            Err(e) => {
                assert!(e.to_string().contains(weight), "{case}: {fault:?} {weight}: the error does not name it: {e}")
            }
        }
    }
}

#[test]
fn missing_weight_is_named() {
    broken_state_dict_is_refused(Fault::Missing);
}

#[test]
fn misshaped_weight_is_named() {
    broken_state_dict_is_refused(Fault::Misshaped);
}
