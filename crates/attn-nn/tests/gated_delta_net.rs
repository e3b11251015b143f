//! `GatedDeltaNet` against Hugging Face's own `Qwen3NextGatedDeltaNet` with the same weights
//! (`tests/fixtures/delta/*.safetensors`, written by `scripts/gen_delta_fixtures.py` in float64):
//! the output, the input's gradient and every parameter's, in `f64` and in `f32`, loaded strictly
//! by transformers' names; every parameter trains; decoding through the cache (after a prefix,
//! and after a left-padded one) equals the full forward; bad configurations and inputs are typed
//! errors.

use std::collections::HashMap;

use attn_nn::{GatedDeltaCache, GatedDeltaNet, GatedDeltaNetConfig, NnError, StateDict};
use candle_core::{DType, Device, Tensor, Var};

use crate::common::{every_param_trains, fresh, input, loss};
use crate::pytorch_parity_parts::fixture::{Data, Fixture};

/// `f64` tolerance relative to the largest expected magnitude: transformers computes the decay
/// and the gated RMSNorm in `f32` even in a float64 module (the worst gradient is off by 5e-7).
const F64_TOL: f64 = 2e-6;
/// `f32` tolerance relative to the largest expected magnitude: the layer's products, the
/// convolution and the chunked delta rule in `f32` (the worst gradient is off by 5e-6).
const F32_TOL: f64 = 2e-5;

fn config(fx: &Fixture) -> GatedDeltaNetConfig {
    let n = |k: &str| fx.config.usize(k).unwrap();
    GatedDeltaNetConfig {
        conv_kernel_size: n("conv_kernel_size"),
        rms_norm_eps: fx.config.f64("rms_norm_eps").unwrap(),
        ..GatedDeltaNetConfig::new(
            n("hidden_size"),
            n("num_key_heads"),
            n("num_value_heads"),
            n("key_head_dim"),
            n("value_head_dim"),
        )
    }
}

fn tensor(fx: &Fixture, name: &str, dtype: DType) -> Tensor {
    let stored = fx.get(name).unwrap();
    let t = match &stored.data {
        Data::F64(x) => Tensor::from_vec(x.clone(), stored.shape.as_slice(), &Device::Cpu),
        Data::I64(x) => Tensor::from_vec(x.clone(), stored.shape.as_slice(), &Device::Cpu),
        Data::Bool(_) => panic!("{}: `{name}` is boolean", fx.name),
    };
    t.and_then(|t| t.to_dtype(dtype)).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Builds the fixture's layer strictly from its state dict in `dtype`, runs forward and backward
/// of `Σ out·grad_out`, and returns every result under the fixture's names.
fn run(fx: &Fixture, dtype: DType) -> HashMap<String, Vec<f64>> {
    let params: HashMap<String, Tensor> =
        fx.with_prefix("param.").map(|(n, _)| (n.to_string(), tensor(fx, &format!("param.{n}"), dtype))).collect();
    let cfg = config(fx);
    let loaded = StateDict::from_tensors(params, fx.name.clone())
        .build_trainable(dtype, &Device::Cpu, |vb| GatedDeltaNet::new(cfg.clone(), vb))
        .unwrap();
    let x = Var::from_tensor(&tensor(fx, "input.x", dtype)).unwrap();
    let mask = fx.tensors.contains_key("input.attention_mask").then(|| tensor(fx, "input.attention_mask", DType::I64));
    let out = loaded.module.forward(&x, mask.as_ref(), None).unwrap();
    let grads = (&out * tensor(fx, "grad_out", dtype)).unwrap().sum_all().unwrap().backward().unwrap();
    let mut results = HashMap::from([("out".to_string(), values(&out))]);
    results.insert("grad.input.x".into(), values(grads.get(x.as_tensor()).unwrap()));
    for (name, var) in loaded.named_parameters() {
        let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{}: no gradient reaches {name}", fx.name));
        results.insert(format!("grad.param.{name}"), values(g));
    }
    results
}

/// Every expected tensor (`out`, `grad.*`) against `got`, within `tol` of its largest magnitude.
fn compare(fx: &Fixture, got: &HashMap<String, Vec<f64>>, tol: f64) -> Vec<String> {
    let expected: Vec<&String> = fx.tensors.keys().filter(|n| n.as_str() == "out" || n.starts_with("grad.")).collect();
    assert_eq!(expected.len(), got.len(), "{}: results {:?}", fx.name, got.keys().collect::<Vec<_>>());
    let mut failures = Vec::new();
    for name in expected {
        let want = fx.f64s(name).unwrap();
        let have = &got[name.as_str()];
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let err = want.iter().zip(have).fold(0f64, |m, (w, h)| m.max((w - h).abs()));
        if have.iter().any(|h| !h.is_finite()) || err > tol * scale {
            failures.push(format!("{}: {name}: max error {err:.3e}, allowed {:.3e}", fx.name, tol * scale));
        }
    }
    failures
}

fn check_fixture(name: &str) {
    let fx = Fixture::load(&format!("delta/{name}")).unwrap();
    let mut failures = compare(&fx, &run(&fx, DType::F64), F64_TOL);
    failures.extend(compare(&fx, &run(&fx, DType::F32), F32_TOL));
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn grouped_heads_with_left_padding_equal_transformers() {
    check_fixture("gdn_grouped_left_padding");
}

#[test]
fn one_key_head_over_two_chunks_equals_transformers() {
    check_fixture("gdn_one_key_head_two_chunks");
}

/// The check can fail: one decay parameter off by 1e-3 is caught.
#[test]
fn a_perturbed_parameter_fails() {
    let mut fx = Fixture::load("delta/gdn_one_key_head_two_chunks").unwrap();
    let Data::F64(a_log) = &mut fx.tensors.get_mut("param.A_log").unwrap().data else { panic!("A_log is not F64") };
    a_log[0] += 1e-3;
    let failures = compare(&fx, &run(&fx, DType::F64), F64_TOL);
    assert!(failures.iter().any(|f| f.contains(": out:")), "not caught: {failures:?}");
}

#[test]
fn every_parameter_trains() {
    let (map, vb) = fresh();
    let layer = GatedDeltaNet::new(GatedDeltaNetConfig::new(16, 2, 4, 4, 3), vb).unwrap();
    let x = input(&[2, 9, 16], 3);
    let out = layer.forward(&x, None, None).unwrap();
    assert_eq!(out.dims(), [2, 9, 16]);
    assert_eq!(every_param_trains(&map, &[("x", &x)], &loss(&out)), Ok(8));
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

#[test]
fn decoding_through_the_cache_equals_the_full_forward() {
    let (_map, vb) = fresh();
    let cfg = GatedDeltaNetConfig { conv_kernel_size: 3, ..GatedDeltaNetConfig::new(16, 1, 2, 8, 4) };
    let layer = GatedDeltaNet::new(cfg, vb).unwrap();
    let (b, t) = (2, 80);
    let x = input(&[b, t, 16], 5).as_tensor().clone();
    let left = 3;
    let keep: Vec<i64> = (0..b).flat_map(|r| (0..t).map(move |j| i64::from(r == 0 || j >= left))).collect();
    let mask = Tensor::from_vec(keep, (b, t), &Device::Cpu).unwrap();
    let full = layer.forward(&x, Some(&mask), None).unwrap();
    for prefix in [1, 5, 70] {
        let mut cache = GatedDeltaCache::new();
        let mut step = |at: usize, len: usize| {
            let m = mask.narrow(1, at, len).unwrap();
            layer.forward(&x.narrow(1, at, len).unwrap(), Some(&m), Some(&mut cache)).unwrap()
        };
        let mut parts = vec![step(0, prefix)];
        parts.extend((prefix..t).map(|i| step(i, 1)));
        assert_eq!(cache.len(), t);
        assert_eq!(cache.state().unwrap().dims(), [b, 2, 8, 4]);
        let decoded = Tensor::cat(&parts, 1).unwrap();
        let scale = full.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(max_diff(&decoded, &full) <= 1e-5 * scale, "prefix {prefix}: {}", max_diff(&decoded, &full));
        cache.clear();
        assert!(cache.is_empty() && cache.state().is_none());
    }
}

#[test]
fn bad_configs_and_inputs_are_typed_errors() {
    let build = |cfg: GatedDeltaNetConfig| GatedDeltaNet::new(cfg, fresh().1);
    let bad_field = |cfg, field: &str| match build(cfg) {
        Err(NnError::Config { module: "GatedDeltaNet", field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field}: {other:?}"),
    };
    bad_field(GatedDeltaNetConfig::new(16, 2, 3, 4, 4), "num_value_heads");
    bad_field(GatedDeltaNetConfig::new(16, 0, 2, 4, 4), "num_key_heads");
    bad_field(
        GatedDeltaNetConfig { conv_kernel_size: 0, ..GatedDeltaNetConfig::new(16, 1, 2, 4, 4) },
        "conv_kernel_size",
    );
    bad_field(GatedDeltaNetConfig { rms_norm_eps: -1.0, ..GatedDeltaNetConfig::new(16, 1, 2, 4, 4) }, "rms_norm_eps");
    let layer = build(GatedDeltaNetConfig::new(16, 1, 2, 4, 4)).unwrap();
    let x = input(&[2, 5, 16], 1).as_tensor().clone();
    let e = layer.forward(&input(&[2, 5, 15], 1), None, None).unwrap_err();
    assert!(matches!(&e, NnError::Input { input: "x", .. }), "{e}");
    let e = layer.forward(&x.to_dtype(DType::F64).unwrap(), None, None).unwrap_err();
    assert!(matches!(&e, NnError::DType { input: "x", .. }), "{e}");
    let e = layer.forward(&x, Some(&Tensor::ones((2, 4), DType::U8, &Device::Cpu).unwrap()), None).unwrap_err();
    assert!(matches!(&e, NnError::Input { input: "attention_mask", .. }), "{e}");
    let mut cache = GatedDeltaCache::new();
    layer.forward(&x, None, Some(&mut cache)).unwrap();
    let e = layer.forward(&x.narrow(0, 0, 1).unwrap(), None, Some(&mut cache)).unwrap_err();
    assert!(e.to_string().contains("batch 2 (the cache's)"), "{e}");
}

#[test]
fn a_state_dict_missing_a_weight_is_refused_by_name() {
    let fx = Fixture::load("delta/gdn_one_key_head_two_chunks").unwrap();
    let params: HashMap<String, Tensor> = fx
        .with_prefix("param.")
        .filter(|(n, _)| *n != "dt_bias")
        .map(|(n, _)| (n.to_string(), tensor(&fx, &format!("param.{n}"), DType::F32)))
        .collect();
    let e = StateDict::from_tensors(params, "gdn")
        .build(DType::F32, &Device::Cpu, |vb| GatedDeltaNet::new(config(&fx), vb))
        .unwrap_err();
    assert!(e.to_string().contains("dt_bias"), "{e}");
}
