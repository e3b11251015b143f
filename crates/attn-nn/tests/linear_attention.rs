//! `LinearAttention` and the layers' linear self-attention: the module computes the formula
//! written out in candle ops (projections, heads, `elu+1`, padding); a `MultiHeadAttention` state
//! dict loads into it strictly; decoding through the recurrent cache equals the causal forward
//! under the oracle rule (f32 decode against the f64 forward, the f32 forward as the baseline) for
//! every map and with grouped-query heads; a decoder stack and `Seq2Seq` of the linear kind decode
//! through their caches as their full forward computes; bad masks and configs are typed errors.

use crate::common;

use std::collections::HashMap;

use attn_nn::{
    AttentionKind, AttnMask, AttnMasks, DecoderCache, LayerConfig, LinearAttention, LinearAttentionConfig, LinearCache,
    LinearInput, LinearMap, MultiHeadAttention, MultiHeadAttentionConfig, NnError, Run, Seq2Seq, Seq2SeqConfig,
    StateDict, TransformerConfig, TransformerDecoder,
};
use attn_testkit::oracle;
use candle_core::{DType, Device, Tensor};
use common::{flat, fresh, padding, uniform};

/// The variables of `map` as plain tensors, by name.
fn tensors(map: &candle_nn::VarMap) -> HashMap<String, Tensor> {
    map.data().lock().unwrap().iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect()
}

/// `cfg` built over `weights` strictly (every weight used, none missing) in `dtype`.
fn strict(cfg: &LinearAttentionConfig, weights: &HashMap<String, Tensor>, dtype: DType) -> LinearAttention {
    let sd = StateDict::from_tensors(weights.clone(), "test weights");
    sd.build(dtype, &Device::Cpu, |vb| LinearAttention::new(cfg.clone(), vb)).unwrap()
}

fn flat64(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

#[test]
fn forward_is_the_formula_on_multi_head_attentions_weights() {
    // The weights of a MultiHeadAttention, loaded strictly, in f64.
    let (map, vb) = fresh();
    MultiHeadAttention::new(MultiHeadAttentionConfig::new(16, 4), vb).unwrap();
    let cfg = LinearAttentionConfig::new(16, 4, LinearMap::Elu);
    let w = tensors(&map);
    let m = strict(&cfg, &w, DType::F64);
    let x = uniform(&[2, 6, 16], 1).to_dtype(DType::F64).unwrap();
    let lens = [6usize, 3];
    let masks = AttnMasks::default().key_padding(padding(&lens, 6));
    let got = m.forward(LinearInput::self_attention(&x).masks(masks)).unwrap().out;

    // By hand: x·Wᵀ + b, 4 heads of 4, φ = elu + 1, padded keys left out of S and z.
    let w64 = |n: &str| w[n].to_dtype(DType::F64).unwrap();
    let (win, bin) = (w64("in_proj_weight"), w64("in_proj_bias"));
    let proj = |i: usize| -> Tensor {
        let y = x.broadcast_matmul(&win.narrow(0, 16 * i, 16).unwrap().t().unwrap()).unwrap();
        let y = y.broadcast_add(&bin.narrow(0, 16 * i, 16).unwrap()).unwrap();
        y.reshape((2, 6, 4, 4)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap()
        // [B, H, L, hd]
    };
    let phi = |t: Tensor| (t.elu(1.0).unwrap() + 1.0).unwrap();
    let keep: Vec<f64> = lens.iter().flat_map(|&n| (0..6).map(move |j| if j < n { 1.0 } else { 0.0 })).collect();
    let keep = Tensor::from_vec(keep, (2, 1, 6, 1), &Device::Cpu).unwrap();
    let (fq, fk, v) = (phi(proj(0)), phi(proj(1)).broadcast_mul(&keep).unwrap(), proj(2));
    let s = fk.t().unwrap().matmul(&v).unwrap(); // [B, H, hd, hd]
    let z = fk.sum_keepdim(2).unwrap(); // [B, H, 1, hd]
    let num = fq.matmul(&s).unwrap();
    let den = (fq.broadcast_mul(&z).unwrap().sum_keepdim(3).unwrap() + attn::linear::EPS).unwrap();
    let heads = num.broadcast_div(&den).unwrap().transpose(1, 2).unwrap().reshape((2, 6, 16)).unwrap();
    let want = heads.broadcast_matmul(&w64("out_proj.weight").t().unwrap()).unwrap();
    let want = want.broadcast_add(&w64("out_proj.bias")).unwrap();
    let diff = flat64(&got).iter().zip(flat64(&want)).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-12, "differs from the formula by {diff}");
}

#[test]
fn decoding_through_the_cache_equals_the_causal_forward_under_the_oracle_rule() {
    for map in [LinearMap::Elu, LinearMap::Relu, LinearMap::Favor { features: 24 }] {
        for hkv in [4, 2] {
            let (vars, vb) = fresh();
            // FAVOR+'s keys are stabilised by their maximum over the whole head in the forward and
            // by the running maximum when decoding: the two differ by a common factor that only ε
            // sees, so ε is made negligible here to compare the rounding alone.
            let cfg =
                LinearAttentionConfig { num_kv_heads: Some(hkv), eps: 1e-12, ..LinearAttentionConfig::new(16, 4, map) };
            LinearAttention::new(cfg.clone(), vb).unwrap();
            let w = tensors(&vars);
            let (m32, m64) = (strict(&cfg, &w, DType::F32), strict(&cfg, &w, DType::F64));
            let x = uniform(&[2, 9, 16], 3);
            let causal = |m: &LinearAttention, x: &Tensor| {
                m.forward(LinearInput::self_attention(x).masks(AttnMasks::causal())).unwrap().out
            };
            let ref64 = flat64(&causal(&m64, &x.to_dtype(DType::F64).unwrap()));
            let naive32 = flat(&causal(&m32, &x));
            // A 3-token prompt, then one token at a time.
            let mut cache = LinearCache::new();
            let parts: Vec<Tensor> = [(0, 3), (3, 1), (4, 1), (5, 2), (7, 1), (8, 1)]
                .into_iter()
                .map(|(from, n)| {
                    let xs = x.narrow(1, from, n).unwrap();
                    let input = LinearInput::self_attention(&xs).masks(AttnMasks::causal()).cache(&mut cache);
                    m32.forward(input).unwrap().out
                })
                .collect();
            assert_eq!(cache.len(), 9);
            let fast = flat(&Tensor::cat(&parts, 1).unwrap());
            let name = format!("{map:?}, hkv {hkv}");
            oracle::check(&name, &fast, &ref64, &naive32, oracle::OUTPUT_FACTOR).unwrap();
        }
    }
}

#[test]
fn a_decoder_stack_of_linear_kind_decodes_through_its_caches_as_its_forward_computes() {
    // (FAVOR+ decodes as its forward computes up to ε only: see the oracle test above.)
    for map in [LinearMap::Elu, LinearMap::Relu] {
        let (_vars, vb) = fresh();
        let cfg = LayerConfig {
            dim_feedforward: 32,
            dropout: 0.0,
            attention: AttentionKind::Linear(map),
            ..LayerConfig::new(16, 4)
        };
        let dec = TransformerDecoder::new(&cfg, 2, true, vb).unwrap();
        let (t, mem) = (uniform(&[2, 5, 16], 5), uniform(&[2, 6, 16], 6));
        let mem_masks = AttnMasks::default().key_padding(padding(&[6, 4], 6));
        let full = dec.forward(&t, &mem, &AttnMasks::causal(), &mem_masks, Run::eval(), None).unwrap().out;
        let mut cache = DecoderCache::new(2);
        let parts: Vec<Tensor> = (0..5)
            .map(|i| {
                let step = t.narrow(1, i, 1).unwrap();
                dec.forward(&step, &mem, &AttnMasks::causal(), &mem_masks, Run::eval(), Some(&mut cache)).unwrap().out
            })
            .collect();
        assert_eq!(cache.len(), 5);
        assert!(cache.layers.iter().all(|c| c.self_kv.is_empty()), "{map:?}: the softmax KV cache was used");
        let stepped = Tensor::cat(&parts, 1).unwrap();
        let d = flat(&full).iter().zip(flat(&stepped)).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d < 1e-5, "{map:?}: step-by-step differs by {d}");
    }
}

#[test]
fn seq2seq_of_linear_kind_has_softmax_weight_names_and_decodes_greedily() {
    let model = |attention| {
        let (vars, vb) = fresh();
        let layer = LayerConfig { dim_feedforward: 32, attention, ..LayerConfig::new(16, 2) };
        let transformer = TransformerConfig { layer, num_encoder_layers: 1, num_decoder_layers: 2 };
        let cfg = Seq2SeqConfig { src_vocab: 13, tgt_vocab: 13, pad_id: 0, max_len: 12, transformer };
        let m = Seq2Seq::new(cfg, vb).unwrap();
        let mut names: Vec<String> = vars.data().lock().unwrap().keys().cloned().collect();
        names.sort();
        (m, names)
    };
    let (_, softmax) = model(AttentionKind::Softmax);
    let (linear, names) = model(AttentionKind::Linear(LinearMap::Elu));
    assert_eq!(names, softmax);
    let src = Tensor::new(&[[3u32, 9, 4, 7, 0, 0], [5, 6, 7, 8, 9, 10]], &Device::Cpu).unwrap();
    let got = linear.greedy(&src, 1, 2, 6, false).unwrap();
    // The first token greedy picks is the teacher-forced argmax after bos.
    let bos = Tensor::new(&[[1u32], [1]], &Device::Cpu).unwrap();
    let logits = linear.forward(&src, &bos, Run::eval()).unwrap().out.narrow(2, 1, 12).unwrap();
    let first = logits.argmax(2).unwrap().flatten_all().unwrap().to_vec1::<u32>().unwrap();
    for (b, tokens) in got.tokens.iter().enumerate() {
        if let Some(&t) = tokens.first() {
            assert_eq!(t, first[b] + 1, "sequence {b}");
        }
    }
}

#[test]
fn masks_linear_attention_cannot_apply_and_bad_configs_are_typed_errors() {
    let (_vars, vb) = fresh();
    let m = LinearAttention::new(LinearAttentionConfig::new(16, 4, LinearMap::Elu), vb).unwrap();
    let x = uniform(&[2, 4, 16], 7);
    let input_error = |masks: AttnMasks| match m.forward(LinearInput::self_attention(&x).masks(masks)) {
        Err(NnError::Input { input, .. }) => input,
        other => panic!("expected an input error, got {other:?}"),
    };
    let bias = AttnMask::Additive(Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap());
    assert_eq!(input_error(AttnMasks::default().attn_mask(bias.clone())), "attn_mask");
    assert_eq!(input_error(AttnMasks::default().key_padding(bias.clone())), "key_padding_mask");
    // Padding in the middle of a row.
    let holes = Tensor::new(&[[0u8, 1, 0, 0], [0, 0, 0, 1]], &Device::Cpu).unwrap();
    assert_eq!(input_error(AttnMasks::default().key_padding(attn::Mask::block(holes))), "key_padding_mask");
    // Decoding needs causal masks.
    let mut cache = LinearCache::new();
    match m.forward(LinearInput::self_attention(&x).cache(&mut cache)) {
        Err(NnError::Input { input: "masks", .. }) => {}
        other => panic!("expected a masks error, got {other:?}"),
    }
    let (_vars, vb) = fresh();
    match LinearAttention::new(LinearAttentionConfig::new(16, 4, LinearMap::Favor { features: 0 }), vb) {
        Err(NnError::Config { field: "map", .. }) => {}
        other => panic!("expected a config error, got {other:?}"),
    }
}
