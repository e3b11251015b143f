//! Bad configurations and inputs are typed errors naming the module and the field or input,
//! never panics: heads that do not divide the width, query heads not a multiple of key/value
//! heads, dropout out of range, odd head widths with RoPE, mismatched widths and batches, masks of
//! the wrong shape, and weights missing or mis-shaped in a state dict.

use crate::common;

use std::collections::HashMap;

use attn::Mask;
use attn_nn::{
    AdditiveAttention, AdditiveAttentionConfig, AttnMask, AttnMasks, EncoderLayer, LayerConfig, MhaInput,
    MultiHeadAttention, MultiHeadAttentionConfig, NnError, RopeConfig, Run, Seq2Seq, Seq2SeqConfig, TransformerConfig,
};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use common::{fresh, uniform};

fn mha(cfg: MultiHeadAttentionConfig) -> Result<MultiHeadAttention, NnError> {
    MultiHeadAttention::new(cfg, fresh().1)
}

fn config_error(r: Result<MultiHeadAttention, NnError>, field: &str) -> String {
    match r {
        Err(e @ NnError::Config { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(field) && msg.contains("MultiHeadAttention"), "{msg}");
            msg
        }
        other => panic!("expected a config error on {field}, got {other:?}"),
    }
}

#[test]
fn bad_configs_are_refused_with_the_field() {
    config_error(mha(MultiHeadAttentionConfig::new(10, 4)), "num_heads");
    config_error(mha(MultiHeadAttentionConfig::new(8, 0)), "num_heads");
    config_error(
        mha(MultiHeadAttentionConfig { num_kv_heads: Some(3), ..MultiHeadAttentionConfig::new(12, 4) }),
        "num_kv_heads",
    );
    config_error(mha(MultiHeadAttentionConfig { dropout: 1.0, ..MultiHeadAttentionConfig::new(8, 2) }), "dropout");
    config_error(
        mha(MultiHeadAttentionConfig { rope: Some(RopeConfig::default()), ..MultiHeadAttentionConfig::new(6, 2) }),
        "rope",
    );
    let additive = AdditiveAttention::new(
        AdditiveAttentionConfig { dropout: -0.5, ..AdditiveAttentionConfig::new(2, 2, 2) },
        fresh().1,
    );
    assert!(matches!(additive, Err(NnError::Config { field: "dropout", .. })));
    let mut transformer = TransformerConfig::new(8, 2);
    transformer.layer.batch_first = false;
    let cfg = Seq2SeqConfig { src_vocab: 5, tgt_vocab: 5, pad_id: 0, max_len: 8, transformer };
    let seq2seq = Seq2Seq::new(cfg, fresh().1);
    assert!(matches!(seq2seq, Err(NnError::Config { module: "Seq2Seq", .. })), "{seq2seq:?}");
}

fn input_error(r: Result<attn_nn::MhaOutput, NnError>, input: &str) {
    match r {
        Err(e @ NnError::Input { .. }) => assert!(e.to_string().contains(input), "{e}"),
        other => panic!("expected an input error on {input}, got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_refused_with_the_input() {
    let m = mha(MultiHeadAttentionConfig::new(8, 2)).unwrap();
    let x = uniform(&[2, 3, 8], 1);
    input_error(m.forward(MhaInput::self_attention(&uniform(&[2, 3, 6], 2))), "query");
    input_error(m.forward(MhaInput::self_attention(&uniform(&[1, 2, 3, 8], 2))), "query");
    // Unbatched `[L, E]` queries are taken, but then the keys must be unbatched too.
    let unbatched = uniform(&[3, 8], 2);
    input_error(m.forward(MhaInput::new(&unbatched, &x, &x)), "key");
    input_error(m.forward(MhaInput::new(&x, &uniform(&[2, 4, 7], 3), &uniform(&[2, 4, 8], 4))), "key");
    input_error(m.forward(MhaInput::new(&x, &uniform(&[1, 4, 8], 3), &uniform(&[1, 4, 8], 4))), "key/value");
    input_error(m.forward(MhaInput::new(&x, &uniform(&[2, 4, 8], 3), &uniform(&[2, 5, 8], 4))), "key/value");
    let pad = Mask::block(Tensor::zeros((2, 4), DType::U8, &Device::Cpu).unwrap());
    input_error(
        m.forward(MhaInput::self_attention(&x).masks(AttnMasks::default().key_padding(pad))),
        "key_padding_mask",
    );
    let attn = AttnMask::Bool(Mask::keep(Tensor::ones((3, 4), DType::U8, &Device::Cpu).unwrap()));
    input_error(m.forward(MhaInput::self_attention(&x).masks(AttnMasks::default().attn_mask(attn))), "attn_mask");
    let per_head = AttnMask::Additive(Tensor::zeros((3, 3, 3), DType::F32, &Device::Cpu).unwrap());
    input_error(m.forward(MhaInput::self_attention(&x).masks(AttnMasks::default().attn_mask(per_head))), "attn_mask");
}

#[test]
fn missing_and_mis_shaped_weights_are_named() {
    let cfg = LayerConfig { dim_feedforward: 16, ..LayerConfig::new(8, 2) };
    let (map, vb) = fresh();
    EncoderLayer::new(&cfg, vb).unwrap();
    let full: HashMap<String, Tensor> =
        map.data().lock().unwrap().iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect();
    let load = |ts: HashMap<String, Tensor>| {
        EncoderLayer::new(&cfg, VarBuilder::from_tensors(ts, DType::F32, &Device::Cpu)).map(|_| ())
    };
    load(full.clone()).unwrap();

    let mut missing = full.clone();
    missing.remove("linear2.bias");
    let msg = load(missing).unwrap_err().to_string();
    assert!(msg.contains("linear2.bias"), "{msg}");

    let mut wrong = full;
    wrong.insert("self_attn.in_proj_weight".into(), Tensor::zeros((24, 7), DType::F32, &Device::Cpu).unwrap());
    let msg = load(wrong).unwrap_err().to_string();
    assert!(msg.contains("self_attn.in_proj_weight") && msg.contains("[24, 7]"), "{msg}");
}

#[test]
fn layers_refuse_inputs_of_the_wrong_width() {
    let cfg = LayerConfig { dim_feedforward: 16, ..LayerConfig::new(8, 2) };
    let layer = EncoderLayer::new(&cfg, fresh().1).unwrap();
    let err = layer.forward(&uniform(&[2, 3, 5], 1), &AttnMasks::default(), Run::eval()).unwrap_err();
    assert!(matches!(err, NnError::Input { module: "EncoderLayer", input: "src", .. }), "{err}");
}

/// An `f64` input to `f32` weights is a typed error naming the module, the input and both dtypes,
/// not candle's matrix-product failure.
#[test]
fn an_input_of_another_dtype_than_the_weights_is_named() {
    let m = mha(MultiHeadAttentionConfig::new(8, 2)).unwrap();
    let x = uniform(&[2, 3, 8], 1).to_dtype(DType::F64).unwrap();
    let msg = m.forward(MhaInput::self_attention(&x)).unwrap_err().to_string();
    for part in ["MultiHeadAttention", "query", "F64", "F32"] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
    assert!(!msg.contains("candle"), "a raw candle error: {msg}");
    let layer = EncoderLayer::new(&LayerConfig { dim_feedforward: 16, ..LayerConfig::new(8, 2) }, fresh().1).unwrap();
    let msg = layer.forward(&x, &AttnMasks::default(), Run::eval()).unwrap_err().to_string();
    for part in ["EncoderLayer", "src", "F64", "F32"] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
}
