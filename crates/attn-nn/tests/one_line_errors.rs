//! Errors shown to a user are one line whatever the environment: with `RUST_BACKTRACE=1` candle
//! attaches a backtrace to its errors (`Error::WithBacktrace`, displayed after the message), and
//! the library's error types drop it. Its own test binary, so the variable is set before anything
//! in the process asks for a backtrace (the standard library reads it once).

use std::collections::HashMap;

use attn_nn::{EncoderLayer, LayerConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

#[test]
fn candle_errors_display_on_one_line_with_rust_backtrace_set() {
    std::env::set_var("RUST_BACKTRACE", "1");
    let raw = candle_core::Error::Msg("probe".into()).bt();
    assert!(raw.to_string().contains('\n'), "candle did not attach a backtrace, the test checks nothing");

    let cfg = LayerConfig { dim_feedforward: 16, ..LayerConfig::new(8, 2) };
    let mut weights = HashMap::new();
    weights.insert("self_attn.in_proj_weight".to_string(), Tensor::zeros((24, 7), DType::F32, &Device::Cpu).unwrap());
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let msg = EncoderLayer::new(&cfg, vb).unwrap_err().to_string();
    assert!(msg.contains("self_attn.in_proj_weight") && msg.contains("[24, 7]"), "{msg}");
    assert!(!msg.contains('\n'), "not one line: {msg}");

    let a = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    let lib: attn::AttnLibError = a.matmul(&a).unwrap_err().into();
    assert!(!lib.to_string().contains('\n'), "not one line: {lib}");
}
