//! Training-readiness: for every module, in training mode with dropout on and with masks, the
//! backward of a loss reaches every parameter and every input with a finite, non-zero gradient.
//! The check itself is shown to fail on candle-nn's fused LayerNorm and `softmax_last_dim`, the
//! paths without a backward that this crate avoids.

use crate::common;

use attn_nn::{
    Activation, AdditiveAttention, AdditiveAttentionConfig, AttentionKind, AttnMask, AttnMasks, DecoderLayer,
    EncoderLayer, LayerConfig, LinearAttention, LinearAttentionConfig, LinearInput, LinearMap, MhaInput, Mode,
    MultiHeadAttention, MultiHeadAttentionConfig, NeedWeights, Packed, PackedMhaInput, RopeConfig, Run, SelfAttention,
    SelfAttentionConfig, Seq2Seq, Seq2SeqConfig, Seq2SeqMasks, Transformer, TransformerConfig,
};
use candle_core::{Device, Module, Tensor};
use common::{every_param_trains, fresh, input, loss, padding};

fn layer_cfg(norm_first: bool, activation: Activation) -> LayerConfig {
    LayerConfig { dim_feedforward: 24, dropout: 0.1, activation, norm_first, ..LayerConfig::new(16, 4) }
}

fn assert_trains(map: &candle_nn::VarMap, inputs: &[(&str, &candle_core::Var)], out: &Tensor, expect_vars: usize) {
    let checked = every_param_trains(map, inputs, &loss(out)).unwrap();
    assert_eq!(checked, expect_vars + inputs.len(), "not every parameter was checked");
}

#[test]
fn self_attention_trains() {
    let (map, vb) = fresh();
    let m = SelfAttention::new(SelfAttentionConfig { bias: true, ..SelfAttentionConfig::new(8, 6, 5) }, vb).unwrap();
    let x = input(&[2, 5, 8], 1);
    let masks = AttnMasks::default().key_padding(padding(&[5, 3], 5));
    let out = m.forward(&x, &masks, false).unwrap().out;
    assert_trains(&map, &[("x", &x)], &out, 6);
}

/// `MultiHeadAttention` of `cfg` (16 wide) in training on causal, padded self-attention of input
/// seed `seed`: every one of its `params` parameters and the input get a gradient.
fn mha_self_attention_trains(cfg: MultiHeadAttentionConfig, params: usize, seed: u64) {
    let (map, vb) = fresh();
    let m = MultiHeadAttention::new(cfg, vb).unwrap();
    let x = input(&[2, 6, 16], seed);
    let masks = AttnMasks::causal().key_padding(padding(&[6, 4], 6));
    let out = m.forward(MhaInput::self_attention(&x).masks(masks).mode(Mode::Train)).unwrap().out;
    assert_trains(&map, &[("x", &x)], &out, params);
}

#[test]
fn multi_head_attention_trains_with_gqa_rope_and_dropout() {
    let cfg = MultiHeadAttentionConfig {
        num_kv_heads: Some(2),
        rope: Some(RopeConfig::default()),
        dropout: 0.2,
        ..MultiHeadAttentionConfig::new(16, 4)
    };
    // q/k/v_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias.
    mha_self_attention_trains(cfg, 6, 2);
}

#[test]
fn multi_head_attention_trains_with_bf16_products() {
    let (map, vb) = fresh();
    let cfg = |compute| MultiHeadAttentionConfig { compute, ..MultiHeadAttentionConfig::new(16, 4) };
    let m = MultiHeadAttention::new(cfg(attn::Precision::Bf16), vb.clone()).unwrap();
    // The same weights with f32 products.
    let m32 = MultiHeadAttention::new(cfg(attn::Precision::F32), vb).unwrap();
    // 40 queries a head: the prefill path, where bf16 products run.
    let x = input(&[2, 40, 16], 3);
    let masks = AttnMasks::causal().key_padding(padding(&[40, 29], 40));
    let run = |m: &MultiHeadAttention| {
        m.forward(MhaInput::self_attention(&x).masks(masks.clone()).mode(Mode::Train)).unwrap().out
    };
    let (out, out32) = (run(&m), run(&m32));
    let diff = (&out - &out32).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff > 0.0 && diff < 1e-2, "bf16 products moved the output by {diff}");
    // in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias.
    assert_trains(&map, &[("x", &x)], &out, 4);
}

#[test]
fn multi_head_attention_trains_with_sinks() {
    let cfg = MultiHeadAttentionConfig {
        num_kv_heads: Some(2),
        sinks: true,
        dropout: 0.2,
        ..MultiHeadAttentionConfig::new(16, 4)
    };
    // q/k/v_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, sinks.
    mha_self_attention_trains(cfg, 7, 16);
}

/// A loss on the averaged weights alone (attention supervision) trains the query and key rows of
/// `in_proj_weight`, not the value rows, and never reaches `out_proj`.
#[test]
fn a_loss_on_the_weights_alone_trains_the_query_and_key_projections() {
    let (map, vb) = fresh();
    let m =
        MultiHeadAttention::new(MultiHeadAttentionConfig { dropout: 0.2, ..MultiHeadAttentionConfig::new(16, 4) }, vb)
            .unwrap();
    let x = input(&[2, 6, 16], 4);
    let masks = AttnMasks::causal().key_padding(padding(&[6, 4], 6));
    let call = MhaInput::self_attention(&x).masks(masks).mode(Mode::Train).need_weights(NeedWeights::Averaged);
    let w = m.forward(call).unwrap().weights.unwrap();
    let target = common::uniform(w.dims(), 9);
    let grads = (w * target).unwrap().sum_all().unwrap().backward().unwrap();
    let vars = map.data().lock().unwrap();
    let g = grads.get(vars["in_proj_weight"].as_tensor()).expect("in_proj_weight gets a gradient");
    let rows = |r: usize| common::flat(&g.narrow(0, r * 16, 16).unwrap());
    for (name, r) in [("query", 0), ("key", 1)] {
        let rs = rows(r);
        assert!(rs.iter().all(|x| x.is_finite()) && rs.iter().any(|&x| x != 0.0), "{name} rows: {rs:?}");
    }
    assert!(rows(2).iter().all(|&x| x == 0.0), "the weights do not read the values");
    let out_proj = grads.get(vars["out_proj.weight"].as_tensor());
    assert!(out_proj.is_none_or(|t| common::flat(t).iter().all(|&x| x == 0.0)), "out_proj got a gradient");
}

#[test]
fn multi_head_attention_trains_with_bias_kv_zero_attn_sequence_first() {
    let (map, vb) = fresh();
    let cfg = MultiHeadAttentionConfig {
        add_bias_kv: true,
        add_zero_attn: true,
        batch_first: false,
        dropout: 0.2,
        ..MultiHeadAttentionConfig::new(16, 4)
    };
    let m = MultiHeadAttention::new(cfg, vb).unwrap();
    let x = input(&[6, 2, 16], 15); // [L, B, E]
    let pad =
        Tensor::new(&[[0f32, 0., 0., -1., f32::NEG_INFINITY, 0.], [0., 0.5, 0., 0., 0., 0.]], &Device::Cpu).unwrap();
    let masks = AttnMasks::causal().key_padding(AttnMask::Additive(pad));
    let out = m.forward(MhaInput::self_attention(&x).masks(masks).mode(Mode::Train)).unwrap().out;
    assert_eq!(out.dims(), [6, 2, 16]);
    // in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, bias_k, bias_v.
    assert_trains(&map, &[("x", &x)], &out, 6);
}

#[test]
fn cross_attention_with_other_key_and_value_widths_trains() {
    let (map, vb) = fresh();
    let cfg = MultiHeadAttentionConfig { kdim: Some(10), vdim: Some(7), ..MultiHeadAttentionConfig::new(16, 2) };
    let m = MultiHeadAttention::new(cfg, vb).unwrap();
    let (q, k, v) = (input(&[2, 3, 16], 3), input(&[2, 5, 10], 4), input(&[2, 5, 7], 5));
    let bias = Tensor::zeros((3, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
    let masks = AttnMasks::default().attn_mask(AttnMask::Additive(bias));
    let out = m.forward(MhaInput::new(&q, &k, &v).masks(masks)).unwrap().out;
    assert_trains(&map, &[("query", &q), ("key", &k), ("value", &v)], &out, 6);
}

#[test]
fn additive_attention_trains() {
    let (map, vb) = fresh();
    let m =
        AdditiveAttention::new(AdditiveAttentionConfig { dropout: 0.1, ..AdditiveAttentionConfig::new(6, 5, 8) }, vb)
            .unwrap();
    let (q, k, v) = (input(&[2, 3, 6], 6), input(&[2, 4, 5], 7), input(&[2, 4, 3], 8));
    let masks = AttnMasks::default().key_padding(padding(&[4, 2], 4));
    let out = m.forward(&q, &k, &v, &masks, Mode::Train).unwrap().out;
    assert_trains(&map, &[("query", &q), ("key", &k), ("value", &v)], &out, 3);
}

#[test]
fn encoder_layers_train_post_and_pre_norm() {
    for (norm_first, act) in [(false, Activation::Relu), (true, Activation::Gelu)] {
        let (map, vb) = fresh();
        let m = EncoderLayer::new(&layer_cfg(norm_first, act), vb).unwrap();
        let x = input(&[2, 5, 16], 9);
        let masks = AttnMasks::default().key_padding(padding(&[5, 2], 5));
        let out = m.forward(&x, &masks, Run::train()).unwrap().out;
        // self_attn (4), linear1 (2), linear2 (2), norm1 (2), norm2 (2).
        assert_trains(&map, &[("src", &x)], &out, 12);
    }
}

#[test]
fn layers_without_biases_train_on_unbatched_inputs() {
    let cfg = LayerConfig { bias: false, ..layer_cfg(true, Activation::Relu) };
    let (map, vb) = fresh();
    let m = EncoderLayer::new(&cfg, vb).unwrap();
    let x = input(&[5, 16], 16); // [L, d_model]
    let out = m.forward(&x, &AttnMasks::causal(), Run::train()).unwrap().out;
    assert_eq!(out.dims(), [5, 16]);
    // self_attn (in_proj_weight, out_proj.weight), linear1/2 (2), norm1/2 (2): weights only.
    assert_trains(&map, &[("src", &x)], &out, 6);

    let (map, vb) = fresh();
    let m = DecoderLayer::new(&cfg, vb).unwrap();
    let (t, mem) = (input(&[4, 16], 17), input(&[6, 16], 18));
    let out = m.forward(&t, &mem, &AttnMasks::causal(), &AttnMasks::default(), Run::train(), None).unwrap().out;
    // self_attn (2), multihead_attn (2), linear1/2 (2), norm1..3 (3).
    assert_trains(&map, &[("tgt", &t), ("memory", &mem)], &out, 9);
}

#[test]
fn decoder_layer_trains() {
    let (map, vb) = fresh();
    let m = DecoderLayer::new(&layer_cfg(false, Activation::Relu), vb).unwrap();
    let (t, mem) = (input(&[2, 4, 16], 10), input(&[2, 6, 16], 11));
    let tgt_masks = AttnMasks::causal().key_padding(padding(&[4, 3], 4));
    let mem_masks = AttnMasks::default().key_padding(padding(&[6, 4], 6));
    let out = m.forward(&t, &mem, &tgt_masks, &mem_masks, Run::train(), None).unwrap().out;
    // self_attn (4), multihead_attn (4), linear1/2 (4), norm1..3 (6).
    assert_trains(&map, &[("tgt", &t), ("memory", &mem)], &out, 18);
}

#[test]
fn transformer_trains() {
    let (map, vb) = fresh();
    let cfg =
        TransformerConfig { layer: layer_cfg(true, Activation::Relu), num_encoder_layers: 2, num_decoder_layers: 1 };
    let m = Transformer::new(&cfg, vb).unwrap();
    let (s, t) = (input(&[2, 5, 16], 12), input(&[2, 4, 16], 13));
    let src = AttnMasks::default().key_padding(padding(&[5, 3], 5));
    let masks = Seq2SeqMasks { src: src.clone(), tgt: AttnMasks::causal(), memory: src };
    let out = m.forward(&s, &t, &masks, Run::train()).unwrap().out;
    // 2 encoder layers (12 each) + encoder.norm (2) + 1 decoder layer (18) + decoder.norm (2).
    assert_trains(&map, &[("src", &s), ("tgt", &t)], &out, 24 + 2 + 18 + 2);
}

#[test]
fn seq2seq_trains() {
    let (map, vb) = fresh();
    let transformer =
        TransformerConfig { layer: layer_cfg(false, Activation::Gelu), num_encoder_layers: 1, num_decoder_layers: 1 };
    let cfg = Seq2SeqConfig { src_vocab: 11, tgt_vocab: 9, pad_id: 0, max_len: 16, transformer };
    let m = Seq2Seq::new(cfg, vb).unwrap();
    let src = Tensor::new(&[[3u32, 4, 5, 6, 0], [7, 8, 2, 0, 0]], &Device::Cpu).unwrap();
    let tgt = Tensor::new(&[[1u32, 3, 4, 5], [1, 6, 7, 0]], &Device::Cpu).unwrap();
    let logits = m.forward(&src, &tgt, Run::train()).unwrap().out;
    assert_eq!(logits.dims(), [2, 4, 9]);
    // embeddings (2), encoder (12 + 2), decoder (18 + 2), generator (2).
    assert_trains(&map, &[], &logits, 2 + 14 + 20 + 2);
}

/// Packed self-attention in training (GQA, RoPE, causal, attention dropout): every parameter and
/// the padded input the packed batch was gathered from get a gradient.
#[test]
fn packed_multi_head_attention_trains_with_gqa_rope_and_dropout() {
    let (map, vb) = fresh();
    let cfg = MultiHeadAttentionConfig {
        num_kv_heads: Some(2),
        rope: Some(RopeConfig::default()),
        dropout: 0.2,
        ..MultiHeadAttentionConfig::new(16, 4)
    };
    let m = MultiHeadAttention::new(cfg, vb).unwrap();
    let x = input(&[3, 6, 16], 21);
    let packed = Packed::from_padded(&x, &[6, 2, 4]).unwrap();
    let out = m.forward_packed(PackedMhaInput::self_attention(&packed).causal(true).mode(Mode::Train)).unwrap();
    assert_trains(&map, &[("x", &x)], out.data(), 6);
}

/// The translator on packed batches in training (dropout on): every parameter gets a gradient.
#[test]
fn packed_seq2seq_trains() {
    let (map, vb) = fresh();
    let transformer =
        TransformerConfig { layer: layer_cfg(true, Activation::Relu), num_encoder_layers: 1, num_decoder_layers: 1 };
    let cfg = Seq2SeqConfig { src_vocab: 11, tgt_vocab: 9, pad_id: 0, max_len: 16, transformer };
    let m = Seq2Seq::new(cfg, vb).unwrap();
    let ids = |v: &[u32]| Tensor::new(v, &Device::Cpu).unwrap();
    let src = Packed::from_sequences(&[ids(&[3, 4, 5, 6]), ids(&[7, 8, 2])]).unwrap();
    let tgt = Packed::from_sequences(&[ids(&[1, 3, 4, 5]), ids(&[1, 6, 7])]).unwrap();
    let logits = m.forward_packed(&src, &tgt, Mode::Train).unwrap();
    assert_eq!(logits.data().dims(), [7, 9]);
    // embeddings (2), encoder (12 + 2), decoder (18 + 2), generator (2).
    assert_trains(&map, &[], logits.data(), 2 + 14 + 20 + 2);
}

#[test]
fn the_check_catches_candle_nn_paths_that_cut_gradients() {
    let (map, vb) = fresh();
    let x = input(&[2, 3, 8], 14);
    let fused = candle_nn::layer_norm(8, 1e-5, vb.pp("fused_norm")).unwrap();
    let err = every_param_trains(&map, &[], &loss(&fused.forward(&x).unwrap())).unwrap_err();
    assert!(err.contains("fused_norm"), "{err}");

    let (map, vb) = fresh();
    let w = vb.get((8, 8), "w").unwrap();
    let scores = x.broadcast_matmul(&w).unwrap();
    let cut = candle_nn::ops::softmax_last_dim(&scores).unwrap();
    let err = every_param_trains(&map, &[], &loss(&cut)).unwrap_err();
    assert!(err.contains('w'), "{err}");
}

#[test]
fn linear_attention_trains_for_every_map_with_gqa_padding_and_causality() {
    for map in [LinearMap::Elu, LinearMap::Relu, LinearMap::Favor { features: 16 }] {
        let (vars, vb) = fresh();
        let cfg = LinearAttentionConfig { num_kv_heads: Some(2), ..LinearAttentionConfig::new(16, 4, map) };
        let m = LinearAttention::new(cfg, vb).unwrap();
        let x = input(&[2, 6, 16], 19);
        let masks = AttnMasks::causal().key_padding(padding(&[6, 4], 6));
        let out = m.forward(LinearInput::self_attention(&x).masks(masks)).unwrap().out;
        // q/k/v_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias.
        let checked = every_param_trains(&vars, &[("x", &x)], &loss(&out)).unwrap_or_else(|e| panic!("{map:?}: {e}"));
        assert_eq!(checked, 7, "{map:?}");
    }
}

#[test]
fn layers_with_linear_self_attention_train() {
    let cfg = LayerConfig { attention: AttentionKind::Linear(LinearMap::Elu), ..layer_cfg(false, Activation::Relu) };
    let (map, vb) = fresh();
    let m = EncoderLayer::new(&cfg, vb).unwrap();
    let x = input(&[2, 5, 16], 20);
    let out = m.forward(&x, &AttnMasks::default().key_padding(padding(&[5, 2], 5)), Run::train()).unwrap().out;
    assert_trains(&map, &[("src", &x)], &out, 12);

    let (map, vb) = fresh();
    let m = DecoderLayer::new(&cfg, vb).unwrap();
    let (t, mem) = (input(&[2, 4, 16], 21), input(&[2, 6, 16], 22));
    let tgt_masks = AttnMasks::causal().key_padding(padding(&[4, 3], 4));
    let mem_masks = AttnMasks::default().key_padding(padding(&[6, 4], 6));
    let out = m.forward(&t, &mem, &tgt_masks, &mem_masks, Run::train(), None).unwrap().out;
    assert_trains(&map, &[("tgt", &t), ("memory", &mem)], &out, 18);
}

#[test]
fn rms_norm_trains() {
    let (map, vb) = fresh();
    let m = attn_nn::RmsNorm::new(8, 1e-5, vb.pp("norm")).unwrap();
    let x = input(&[2, 3, 8], 7);
    let out = m.forward(&x).unwrap();
    assert_trains(&map, &[("x", &x)], &out, 1);
}
