//! Incremental decoding through the KV caches gives what the full causal forward gives: for
//! multi-head self-attention (with grouped-query heads and RoPE, whose offsets follow the cache,
//! with `add_bias_kv`/`add_zero_attn`, whose keys are appended after the cache at every step, and
//! with attention sinks),
//! for cross-attention (keys/values projected once), for a decoder stack, and for the Seq2Seq
//! model's greedy decoding against re-running the whole prefix at every step.

use crate::common;

use attn_nn::{
    Activation, AttnMasks, Cache, DecoderCache, KvCache, LayerConfig, MhaInput, MultiHeadAttention,
    MultiHeadAttentionConfig, RopeConfig, Run, Seq2Seq, Seq2SeqConfig, TransformerConfig, TransformerDecoder,
};
use candle_core::{DType, Device, Tensor, D};
use common::{flat, fresh, uniform};

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    flat(a).iter().zip(flat(b)).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Positions `from..from+n` of `x: [B, L, E]`.
fn steps(x: &Tensor, from: usize, n: usize) -> Tensor {
    x.narrow(1, from, n).unwrap()
}

#[test]
fn self_attention_step_by_step_equals_the_causal_forward() {
    let cases = [
        (4, None, false, false),
        (2, Some(RopeConfig::default()), false, false),
        (1, Some(RopeConfig { base: 500.0 }), false, false),
        (2, None, true, false),
        (2, Some(RopeConfig::default()), false, true),
        (4, None, true, true),
    ];
    for (hkv, rope, extra_keys, sinks) in cases {
        let (_map, vb) = fresh();
        let cfg = MultiHeadAttentionConfig {
            num_kv_heads: Some(hkv),
            rope,
            add_bias_kv: extra_keys,
            add_zero_attn: extra_keys,
            sinks,
            ..MultiHeadAttentionConfig::new(16, 4)
        };
        let m = MultiHeadAttention::new(cfg, vb).unwrap();
        let x = uniform(&[2, 7, 16], 1);
        let full = m.forward(MhaInput::self_attention(&x).masks(AttnMasks::causal())).unwrap().out;
        let mut cache = KvCache::new();
        // A 3-token prompt, then one token at a time.
        let mut parts = Vec::new();
        for (from, n) in [(0, 3), (3, 1), (4, 1), (5, 1), (6, 1)] {
            let xs = steps(&x, from, n);
            let input = MhaInput::self_attention(&xs).masks(AttnMasks::causal()).cache(Cache::SelfAttn(&mut cache));
            parts.push(m.forward(input).unwrap().out);
        }
        assert_eq!(cache.len(), 7);
        let stepped = Tensor::cat(&parts, 1).unwrap();
        let d = max_diff(&full, &stepped);
        let what = format!("hkv {hkv}, rope {rope:?}, bias_kv/zero_attn {extra_keys}, sinks {sinks}");
        assert!(d < 1e-5, "{what}: step-by-step differs by {d}");
    }
}

#[test]
fn cross_attention_cache_projects_the_memory_once() {
    let (_map, vb) = fresh();
    let m = MultiHeadAttention::new(
        MultiHeadAttentionConfig { kdim: Some(12), vdim: Some(12), ..MultiHeadAttentionConfig::new(16, 4) },
        vb,
    )
    .unwrap();
    let (q, mem) = (uniform(&[2, 3, 16], 2), uniform(&[2, 5, 12], 3));
    let full = m.forward(MhaInput::new(&q, &mem, &mem)).unwrap().out;
    let mut cache = KvCache::new();
    let first = m.forward(MhaInput::new(&steps(&q, 0, 1), &mem, &mem).cache(Cache::Cross(&mut cache))).unwrap().out;
    // Later steps ignore the memory they are given: the cached projection is used.
    let other = uniform(&[2, 5, 12], 4);
    let rest = m.forward(MhaInput::new(&steps(&q, 1, 2), &other, &other).cache(Cache::Cross(&mut cache))).unwrap().out;
    assert_eq!(cache.len(), 5);
    let d = max_diff(&full, &Tensor::cat(&[first, rest], 1).unwrap());
    assert!(d < 1e-5, "cached cross-attention differs by {d}");
}

#[test]
fn decoder_stack_step_by_step_equals_the_full_forward() {
    for norm_first in [false, true] {
        let (_map, vb) = fresh();
        let cfg = LayerConfig {
            dim_feedforward: 32,
            dropout: 0.0,
            norm_first,
            activation: Activation::Gelu,
            ..LayerConfig::new(16, 4)
        };
        let dec = TransformerDecoder::new(&cfg, 2, true, vb).unwrap();
        let (t, mem) = (uniform(&[2, 5, 16], 5), uniform(&[2, 6, 16], 6));
        let mem_masks = AttnMasks::default().key_padding(common::padding(&[6, 4], 6));
        let full = dec.forward(&t, &mem, &AttnMasks::causal(), &mem_masks, Run::eval(), None).unwrap().out;
        let mut cache = DecoderCache::new(2);
        let parts: Vec<Tensor> = (0..5)
            .map(|i| {
                dec.forward(&steps(&t, i, 1), &mem, &AttnMasks::causal(), &mem_masks, Run::eval(), Some(&mut cache))
                    .unwrap()
                    .out
            })
            .collect();
        assert_eq!(cache.len(), 5);
        let d = max_diff(&full, &Tensor::cat(&parts, 1).unwrap());
        assert!(d < 1e-5, "norm_first {norm_first}: step-by-step differs by {d}");
    }
}

#[test]
fn greedy_decoding_through_the_cache_equals_recomputing_the_prefix() {
    let (_map, vb) = fresh();
    let layer = LayerConfig { dim_feedforward: 32, ..LayerConfig::new(16, 2) };
    let cfg = Seq2SeqConfig {
        src_vocab: 13,
        tgt_vocab: 13,
        pad_id: 0,
        max_len: 12,
        transformer: TransformerConfig { layer, num_encoder_layers: 1, num_decoder_layers: 2 },
    };
    let m = Seq2Seq::new(cfg, vb).unwrap();
    let src = Tensor::new(&[[3u32, 9, 4, 7, 0, 0], [5, 6, 7, 8, 9, 10]], &Device::Cpu).unwrap();
    let (bos, eos, steps) = (1, 2, 8);
    let got = m.greedy(&src, bos, eos, steps, true).unwrap();

    // Reference: re-run the teacher-forced forward on the whole prefix and take the last argmax.
    let mut prefix = vec![vec![bos]; 2];
    for _ in 0..steps {
        let tgt = Tensor::new(prefix.clone(), &Device::Cpu).unwrap();
        let logits = m.forward(&src, &tgt, Run::eval()).unwrap().out;
        // Greedy never picks the padding id 0: the argmax over ids 1.. .
        let last =
            logits.narrow(1, prefix[0].len() - 1, 1).unwrap().narrow(2, 1, 12).unwrap().argmax(D::Minus1).unwrap();
        let next = last.flatten_all().unwrap().to_dtype(DType::U32).unwrap().to_vec1::<u32>().unwrap();
        for (p, t) in prefix.iter_mut().zip(next) {
            p.push(t + 1);
        }
    }
    for (b, (tokens, reference)) in got.tokens.iter().zip(&prefix).enumerate() {
        let until_eos: Vec<u32> = reference[1..].iter().copied().take_while(|&t| t != eos).collect();
        assert_eq!(tokens, &until_eos, "sequence {b}");
    }
    assert_eq!(got.cross_weights.len(), 2);
    let w = &got.cross_weights[0];
    assert_eq!((w.dim(0).unwrap(), w.dim(1).unwrap(), w.dim(3).unwrap()), (2, 2, 6));
    // Sequence 0's two padding keys get no cross-attention.
    let pad_cols = flat(&w.narrow(0, 0, 1).unwrap().narrow(3, 4, 2).unwrap());
    assert!(pad_cols.iter().all(|&x| x == 0.0));
}
