//! Bad inputs give one clear error naming the file and the field, never a panic: GGUF files that
//! are not GGUF, truncated, or hold a tensor past their end or another architecture; a model
//! directory without its tokenizer; a prompt longer than the model's context.

use std::path::Path;

use attn_models::{CausalLm, CausalLmConfig, Decoder, Family, Gguf, LayerAttention, ModelError, SentenceEncoder};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

/// A small GGUF: `general.architecture = arch` and one 64×32 f32 tensor `blk.0.attn_q.weight`.
fn write_gguf(path: &Path, arch: &str) {
    let t = Tensor::ones((64, 32), DType::F32, &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, GgmlDType::F32).unwrap();
    let arch = Value::String(arch.into());
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &[("general.architecture", &arch)], &[("blk.0.attn_q.weight", &q)]).unwrap();
}

fn message(e: ModelError) -> String {
    let text = e.to_string();
    assert!(!text.contains('\n'), "not one line: {text}");
    text
}

#[test]
fn a_file_that_is_not_gguf_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, b"GGML this is not a gguf file at all, only text").unwrap();
    let e = message(Gguf::open(&path).unwrap_err());
    assert!(e.contains("model.gguf") && e.contains("not a readable GGUF"), "{e}");
    let missing = message(Decoder::open(&dir.path().join("absent.gguf")).unwrap_err());
    assert!(missing.contains("absent.gguf"), "{missing}");
}

#[test]
fn a_truncated_gguf_is_refused_naming_the_tensor_or_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    write_gguf(&path, "llama");
    let bytes = std::fs::read(&path).unwrap();
    // Cut inside the tensor's data: the header reads, the tensor does not.
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let mut g = Gguf::open(&path).unwrap();
    let e = message(g.dequantize_all().unwrap_err());
    assert!(e.contains("cut.gguf") && e.contains("blk.0.attn_q.weight") && e.contains("bytes"), "{e}");
    // Cut inside the header.
    std::fs::write(&path, &bytes[..40]).unwrap();
    let e = message(Gguf::open(&path).unwrap_err());
    assert!(e.contains("cut.gguf") && e.contains("not a readable GGUF"), "{e}");
}

#[test]
fn another_architecture_or_missing_metadata_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.gguf");
    write_gguf(&path, "mamba");
    let e = message(Decoder::open(&path).unwrap_err());
    assert!(e.contains("general.architecture") && e.contains("mamba"), "{e}");
    write_gguf(&path, "llama");
    let e = message(Decoder::open(&path).unwrap_err());
    assert!(e.contains("other.gguf") && e.contains("llama.embedding_length") && e.contains("missing"), "{e}");
}

#[test]
fn a_model_directory_without_its_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{"model_type": "bert", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 16}"#;
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let e = message(SentenceEncoder::load(dir.path()).unwrap_err());
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");
    std::fs::write(dir.path().join("config.json"), config.replace("\"bert\"", "\"t5\"")).unwrap();
    let e = message(SentenceEncoder::load(dir.path()).unwrap_err());
    assert!(e.contains("config.json") && e.contains("model_type"), "{e}");
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let cfg = CausalLmConfig {
        family: Family::Llama,
        vocab_size: 16,
        hidden_size: 8,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
        intermediate_size: 12,
        rms_eps: 1e-5,
        max_positions: 6,
        layers: vec![LayerAttention { rope_base: 10000.0, window: None }],
    };
    let map = candle_nn::VarMap::new();
    let model = CausalLm::new(&cfg, attn_nn::init::seeded(&map, 0)).unwrap();
    let mut cache = model.new_cache().unwrap();
    assert_eq!(model.forward(&[1, 2, 3, 4], &mut cache).unwrap().dims(), &[4, 16]);
    let e = message(model.forward(&[5, 6, 7], &mut cache).unwrap_err());
    assert!(e.contains("7 tokens") && e.contains("context of 6"), "{e}");
    let e = message(model.forward(&[99], &mut model.new_cache().unwrap()).unwrap_err());
    assert!(e.contains("99") && e.contains("vocabulary"), "{e}");
}
