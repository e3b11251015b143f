//! Loading PyTorch state dicts (`tests/fixtures/state_dicts/*.safetensors`, float32 files written
//! by `safetensors.torch.save_file(module.state_dict(), ..)` in `scripts/gen_module_fixtures.py`)
//! through the library's strict loader: every loading path refuses weights the module does not
//! use, by name; a state dict loads into trainable variables, listed by PyTorch name, that an
//! optimiser fine-tunes; gpt-oss's attention sinks load under their name, `sinks`.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use attn_nn::{
    load, AttnMasks, EncoderLayer, LayerConfig, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, NnError, Run,
    StateDict,
};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, VarMap};
use common::{flat, uniform};

fn state_dict(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state_dicts").join(format!("{name}.safetensors"))
}

fn plain_mha(vb: candle_nn::VarBuilder) -> attn_nn::Result<MultiHeadAttention> {
    MultiHeadAttention::new(MultiHeadAttentionConfig::new(16, 4), vb)
}

/// The refusal names the file and both weights.
fn assert_unused_named<T: std::fmt::Debug>(path: &str, r: Result<T, NnError>) {
    match r {
        Err(e @ NnError::StateDict { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(path) && msg.contains("bias_k") && msg.contains("bias_v"), "{msg}");
        }
        other => panic!("loaded an add_bias_kv state dict into a module without it: {other:?}"),
    }
}

/// `nn.MultiheadAttention(add_bias_kv=True)`'s state dict into a module built without
/// `add_bias_kv`: `bias_k` and `bias_v` would be ignored, so every loading path refuses it.
#[test]
fn every_loading_path_refuses_weights_the_module_does_not_use() {
    let path = state_dict("mha_add_bias_kv");
    let shown = path.display().to_string();
    let cpu = &Device::Cpu;
    assert_unused_named(&shown, load::strict(&path, DType::F32, cpu, plain_mha));
    assert_unused_named(&shown, load::trainable(&path, DType::F32, cpu, plain_mha).map(|t| t.module));
    // SAFETY: the fixture is not modified while it is mapped.
    let mapped = unsafe { StateDict::mmap(&[&path]) }.unwrap();
    assert_unused_named(&shown, mapped.build(DType::F32, cpu, plain_mha));
    let tensors: HashMap<String, Tensor> = candle_core::safetensors::load(&path, cpu).unwrap();
    assert_unused_named("in memory", StateDict::from_tensors(tensors, "in memory").build(DType::F32, cpu, plain_mha));

    let with_bias_kv = MultiHeadAttentionConfig { add_bias_kv: true, ..MultiHeadAttentionConfig::new(16, 4) };
    let m = load::strict(&path, DType::F32, cpu, |vb| MultiHeadAttention::new(with_bias_kv, vb)).unwrap();
    let x = uniform(&[2, 3, 16], 1);
    assert_eq!(m.forward(MhaInput::self_attention(&x)).unwrap().out.dims(), [2, 3, 16]);
}

/// A weight the module needs and the file lacks, or holds with another shape, is named.
#[test]
fn missing_and_mis_shaped_weights_are_named_with_the_origin() {
    let cpu = &Device::Cpu;
    let mut tensors = candle_core::safetensors::load(state_dict("mha_add_bias_kv"), cpu).unwrap();
    tensors.remove("out_proj.bias");
    let with_bias_kv = || MultiHeadAttentionConfig { add_bias_kv: true, ..MultiHeadAttentionConfig::new(16, 4) };
    let e = StateDict::from_tensors(tensors.clone(), "dict")
        .build(DType::F32, cpu, |vb| MultiHeadAttention::new(with_bias_kv(), vb))
        .unwrap_err();
    assert_eq!(e.to_string(), "dict: no weight `out_proj.bias` (the module needs one of shape [16])");
    tensors.insert("out_proj.bias".into(), Tensor::zeros(17, DType::F32, cpu).unwrap());
    let e = StateDict::from_tensors(tensors, "dict")
        .build_trainable(DType::F32, cpu, |vb| MultiHeadAttention::new(with_bias_kv(), vb))
        .unwrap_err();
    assert_eq!(e.to_string(), "dict: `out_proj.bias` has shape [17], the module needs [16]");
    let e = load::strict("no/such/file.safetensors", DType::F32, cpu, plain_mha).unwrap_err();
    assert!(matches!(&e, NnError::StateDict { origin, .. } if origin == "no/such/file.safetensors"), "{e}");
}

/// `nn.TransformerEncoderLayer`'s state dict loads into trainable variables named as in PyTorch;
/// a few AdamW steps change every one of them, and they stay finite.
#[test]
fn a_pytorch_encoder_layer_fine_tunes() {
    let cfg = LayerConfig { dim_feedforward: 32, dropout: 0.0, ..LayerConfig::new(16, 4) };
    let path = state_dict("encoder_layer");
    let t = load::trainable(&path, DType::F32, &Device::Cpu, |vb| EncoderLayer::new(&cfg, vb)).unwrap();
    let names: Vec<String> = t.named_parameters().into_iter().map(|(n, _)| n).collect();
    let in_file: Vec<String> = StateDict::read(&path).unwrap().names().map(String::from).collect();
    assert_eq!(names, in_file, "the parameters are the state dict's, by PyTorch name");
    assert_eq!(names.len(), 12);
    let before: Vec<Vec<f32>> = t.parameters().iter().map(|v| flat(v.as_tensor())).collect();

    let src = uniform(&[2, 5, 16], 3);
    let target = uniform(&[2, 5, 16], 4);
    let loss = |layer: &EncoderLayer| -> Tensor {
        let out = layer.forward(&src, &AttnMasks::default(), Run::train()).unwrap().out;
        (out - &target).unwrap().sqr().unwrap().mean_all().unwrap()
    };
    let first = loss(&t.module).to_scalar::<f32>().unwrap();
    let mut opt = candle_nn::AdamW::new_lr(t.parameters(), 1e-2).unwrap();
    for _ in 0..5 {
        opt.backward_step(&loss(&t.module)).unwrap();
    }
    let last = loss(&t.module).to_scalar::<f32>().unwrap();
    assert!(last < first, "fine-tuning did not lower the loss: {first} -> {last}");
    for ((name, var), old) in t.named_parameters().iter().zip(&before) {
        let new = flat(var.as_tensor());
        assert!(new.iter().all(|x| x.is_finite()), "{name}: not finite after fine-tuning");
        assert!(new.iter().zip(old).any(|(a, b)| a != b), "{name}: unchanged by fine-tuning");
    }
}

/// The accessor lists a fresh module's parameters too, sorted by name.
#[test]
fn named_parameters_of_a_fresh_module() {
    let map = VarMap::new();
    let cfg = MultiHeadAttentionConfig { add_bias_kv: true, bias: false, ..MultiHeadAttentionConfig::new(8, 2) };
    MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0)).unwrap();
    let names: Vec<String> = attn_nn::named_parameters(&map).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["bias_k", "bias_v", "in_proj_weight", "out_proj.weight"]);
}

/// gpt-oss's `sinks [H]` load under that name into a module with sinks and reach its output; a
/// module without sinks refuses them by name; sinks all `-inf` give the output of no sinks.
#[test]
fn attention_sinks_load_by_their_gpt_oss_name() {
    let cpu = &Device::Cpu;
    let mut tensors = candle_core::safetensors::load(state_dict("mha_add_bias_kv"), cpu).unwrap();
    let cfg = |sinks| MultiHeadAttentionConfig { add_bias_kv: true, sinks, ..MultiHeadAttentionConfig::new(16, 4) };
    let run = |tensors: &HashMap<String, Tensor>, sinks: bool| {
        let m = StateDict::from_tensors(tensors.clone(), "dict")
            .build(DType::F32, cpu, |vb| MultiHeadAttention::new(cfg(sinks), vb))?;
        Ok::<_, NnError>(flat(&m.forward(MhaInput::self_attention(&uniform(&[2, 3, 16], 1)))?.out))
    };
    let plain = run(&tensors, false).unwrap();
    tensors.insert("sinks".into(), Tensor::new(&[0.5f32, -1.0, 2.0, 0.0], cpu).unwrap());
    assert_ne!(run(&tensors, true).unwrap(), plain, "the sinks change the output");
    let e = run(&tensors, false).unwrap_err();
    assert!(matches!(&e, NnError::StateDict { .. }) && e.to_string().contains("sinks"), "{e}");
    tensors.insert("sinks".into(), Tensor::new(&[f32::NEG_INFINITY; 4], cpu).unwrap());
    assert_eq!(run(&tensors, true).unwrap(), plain, "-inf sinks are no sinks");
}
