//! What the modules compute, beyond parity: the seed texts' worked self-attention example, masks
//! of either polarity meaning the same, fully masked queries giving zeros (never NaN), dropout only
//! in training (reproducible from the seed, deterministic in evaluation), returned weights
//! (per head, averaged, rows summing to one), RoPE depending only on relative positions, ALiBi's
//! slopes, the sinusoidal table, and seeded initialisation.

use crate::common;

use attn::{padding_mask, Align, Mask};
use attn_nn::position::alibi::{alibi_bias, alibi_slopes};
use attn_nn::position::sinusoidal::sinusoidal_table;
use attn_nn::{
    AdditiveAttention, AdditiveAttentionConfig, AttnMasks, MhaInput, Mode, MultiHeadAttention,
    MultiHeadAttentionConfig, NeedWeights, RopeConfig, SelfAttention, SelfAttentionConfig,
};
use candle_core::{Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::{flat, fresh, padding, uniform};
use proptest::prelude::*;

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn the_seed_example_through_self_attention() {
    // Three 4-dimensional inputs and the tutorial's W_K, W_Q, W_V ([4, 3], applied as x·W).
    let x = [[1f32, 0., 1., 0.], [0., 2., 0., 2.], [1., 1., 1., 1.]];
    let w_k = [[0f32, 0., 1.], [1., 1., 0.], [0., 1., 0.], [1., 1., 0.]];
    let w_q = [[1f32, 0., 1.], [1., 0., 0.], [0., 0., 1.], [0., 1., 1.]];
    let w_v = [[0f32, 2., 0.], [0., 3., 0.], [1., 0., 3.], [1., 1., 0.]];
    let dev = Device::Cpu;
    let weight = |w: &[[f32; 3]; 4]| Tensor::new(w, &dev).unwrap().t().unwrap().contiguous().unwrap(); // [3, 4]
    let ts = [("w_q.weight", weight(&w_q)), ("w_k.weight", weight(&w_k)), ("w_v.weight", weight(&w_v))];
    let vb = VarBuilder::from_tensors(
        ts.into_iter().map(|(n, t)| (n.to_string(), t)).collect(),
        candle_core::DType::F32,
        &dev,
    );
    let m = SelfAttention::new(SelfAttentionConfig::new(4, 3, 3), vb).unwrap();
    let o = m.forward(&Tensor::new(&x, &dev).unwrap().unsqueeze(0).unwrap(), &AttnMasks::default(), true).unwrap();

    // The same by hand in f64: softmax(Q·Kᵀ/√3)·V.
    let mul = |a: &[[f32; 4]; 3], w: &[[f32; 3]; 4]| -> Vec<[f64; 3]> {
        a.iter().map(|r| std::array::from_fn(|c| (0..4).map(|i| r[i] as f64 * w[i][c] as f64).sum())).collect()
    };
    let (q, k, v) = (mul(&x, &w_q), mul(&x, &w_k), mul(&x, &w_v));
    let mut want_w = Vec::new();
    let mut want_o = Vec::new();
    for qi in &q {
        let s: Vec<f64> = k.iter().map(|kj| (0..3).map(|c| qi[c] * kj[c]).sum::<f64>() / 3f64.sqrt()).collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        want_w.extend(e.iter().map(|x| (x / z) as f32));
        want_o.extend((0..3).map(|c| (0..3).map(|j| e[j] / z * v[j][c]).sum::<f64>() as f32));
    }
    assert!(close(&flat(&o.out), &want_o, 1e-5), "{:?} vs {want_o:?}", flat(&o.out));
    assert!(close(&flat(o.weights.as_ref().unwrap()), &want_w, 1e-6));
}

#[test]
fn padding_masks_of_either_polarity_agree_and_padding_never_leaks() {
    let (_map, vb) = fresh();
    let m = MultiHeadAttention::new(MultiHeadAttentionConfig::new(8, 2), vb).unwrap();
    let tokens = Tensor::new(&[[5u32, 6, 7, 0], [8, 9, 0, 0]], &Device::Cpu).unwrap();
    let x = uniform(&[2, 4, 8], 1);
    let run = |masks: AttnMasks, x: &Tensor| {
        m.forward(MhaInput::self_attention(x).masks(masks).need_weights(NeedWeights::PerHead)).unwrap()
    };
    let keep = run(AttnMasks::default().key_padding(padding_mask(&tokens, 0).unwrap()), &x);
    let block = run(AttnMasks::default().key_padding(padding(&[3, 2], 4)), &x);
    assert_eq!(flat(&keep.out), flat(&block.out));
    let w = keep.weights.unwrap(); // [B, H, Lq, Lk]
    assert!(flat(&w.narrow(0, 1, 1).unwrap().narrow(3, 2, 2).unwrap()).iter().all(|&p| p == 0.0));
    // Changing a padded token's input changes nothing for the real tokens of its sequence.
    let poked = x.slice_assign(&[1..2, 3..4, 0..8], &Tensor::full(100f32, (1, 1, 8), &Device::Cpu).unwrap()).unwrap();
    let again = run(AttnMasks::default().key_padding(padding(&[3, 2], 4)), &poked);
    let real = |t: &Tensor| flat(&t.narrow(0, 1, 1).unwrap().narrow(1, 0, 2).unwrap());
    assert!(close(&real(&block.out), &real(&again.out), 1e-6));
}

#[test]
fn fully_masked_queries_give_zeros_not_nan() {
    let (_map, vb) = fresh();
    let m =
        MultiHeadAttention::new(MultiHeadAttentionConfig { bias: false, ..MultiHeadAttentionConfig::new(8, 2) }, vb)
            .unwrap();
    let x = uniform(&[1, 3, 8], 2);
    let out =
        m.forward(MhaInput::self_attention(&x).masks(AttnMasks::default().key_padding(padding(&[0], 3)))).unwrap().out;
    assert!(flat(&out).iter().all(|&v| v == 0.0));
    let (_map, vb) = fresh();
    let a = AdditiveAttention::new(AdditiveAttentionConfig::new(8, 8, 4), vb).unwrap();
    let mut v = flat(&x);
    v[..8].fill(f32::NAN); // the first key is masked: its NaN value must not reach the output
    let v = Tensor::from_vec(v, (1, 3, 8), &Device::Cpu).unwrap();
    let o = a.forward(&x, &x, &v, &AttnMasks::default().key_padding(padding(&[0], 3)), Mode::Eval).unwrap();
    assert!(flat(&o.out).iter().chain(&flat(&o.weights)).all(|&v| v == 0.0));
    let o = a
        .forward(
            &x,
            &x,
            &v,
            &AttnMasks::default().key_padding(Mask::block(Tensor::new(&[[1u8, 0, 0]], &Device::Cpu).unwrap())),
            Mode::Eval,
        )
        .unwrap();
    assert!(flat(&o.out).iter().all(|v| v.is_finite()));
}

#[test]
fn dropout_only_in_training_and_reproducible_from_the_seed() {
    let build = || {
        let map = VarMap::new();
        let cfg = MultiHeadAttentionConfig { dropout: 0.5, seed: 3, ..MultiHeadAttentionConfig::new(8, 2) };
        MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 1)).unwrap()
    };
    let (a, b) = (build(), build());
    let x = uniform(&[2, 5, 8], 3);
    let call = |m: &MultiHeadAttention, train| {
        flat(&m.forward(MhaInput::self_attention(&x).mode(if train { Mode::Train } else { Mode::Eval })).unwrap().out)
    };
    assert_eq!(call(&a, false), call(&a, false));
    let (t1, t2) = (call(&a, true), call(&a, true));
    assert_ne!(t1, call(&a, false));
    assert_ne!(t1, t2, "each training call draws a new dropout seed");
    assert_eq!(t1, call(&b, true), "same seeds, same model: same first mask");
}

#[test]
fn step_keyed_dropout_replays_any_step() {
    let build = || {
        let map = VarMap::new();
        let cfg = attn_nn::LayerConfig { dim_feedforward: 16, dropout: 0.3, ..attn_nn::LayerConfig::new(8, 2) };
        attn_nn::EncoderLayer::new(&cfg, attn_nn::init::seeded(&map, 1)).unwrap()
    };
    let (a, b) = (build(), build());
    let x = uniform(&[2, 5, 8], 3);
    let call = |m: &attn_nn::EncoderLayer, run| flat(&m.forward(&x, &AttnMasks::default(), run).unwrap().out);
    // `a` runs steps 0..3, `b` (a resumed run) only step 2: the same masks.
    let a_steps: Vec<_> = (0..3).map(|s| call(&a, attn_nn::Run::train_step(s))).collect();
    assert_eq!(a_steps[2], call(&b, attn_nn::Run::train_step(2)));
    assert_ne!(a_steps[1], a_steps[2]);
    assert_ne!(a_steps[2], call(&a, attn_nn::Run::eval()));
}

#[test]
fn averaged_weights_are_the_mean_of_the_heads_and_rows_sum_to_one() {
    let (_map, vb) = fresh();
    let m = MultiHeadAttention::new(
        MultiHeadAttentionConfig { num_kv_heads: Some(1), ..MultiHeadAttentionConfig::new(12, 3) },
        vb,
    )
    .unwrap();
    let (q, kv) = (uniform(&[2, 4, 12], 4), uniform(&[2, 6, 12], 5));
    let per_head = m.forward(MhaInput::new(&q, &kv, &kv).need_weights(NeedWeights::PerHead)).unwrap();
    let avg = m.forward(MhaInput::new(&q, &kv, &kv).need_weights(NeedWeights::Averaged)).unwrap();
    let none = m.forward(MhaInput::new(&q, &kv, &kv)).unwrap();
    assert!(none.weights.is_none());
    assert_eq!(flat(&per_head.out), flat(&none.out));
    let (w, a) = (per_head.weights.unwrap(), avg.weights.unwrap());
    assert_eq!((w.dims(), a.dims()), (&[2, 3, 4, 6][..], &[2, 4, 6][..]));
    assert!(close(&flat(&w.mean(1).unwrap()), &flat(&a), 1e-7));
    assert!(flat(&w.sum(3).unwrap()).iter().all(|s| (s - 1.0).abs() < 1e-5));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// q·k after RoPE depends on the positions only through their difference.
    #[test]
    fn rope_scores_depend_on_relative_position(shift in 0usize..50, seed in 0u64..1000) {
        let rope = RopeConfig::default();
        let (q, k) = (uniform(&[1, 1, 3, 8], seed), uniform(&[1, 1, 3, 8], seed + 1));
        let scores = |offset: usize| {
            let (q, k) = (rope.apply(&q, offset).unwrap(), rope.apply(&k, offset).unwrap());
            flat(&q.matmul(&k.t().unwrap()).unwrap())
        };
        prop_assert!(close(&scores(0), &scores(shift), 1e-4));
        // Norms are kept: a rotation.
        let norm = |t: &Tensor| flat(&t.sqr().unwrap().sum(3).unwrap());
        prop_assert!(close(&norm(&rope.apply(&q, shift).unwrap()), &norm(&q), 1e-4));
    }
}

#[test]
fn alibi_slopes_and_bias_follow_the_paper() {
    let s8 = alibi_slopes(8);
    assert_eq!(s8, (1..=8).map(|h| 0.5f64.powi(h)).collect::<Vec<_>>());
    // 6 heads: the 4-head slopes, then every other slope of 8 heads.
    let s4 = alibi_slopes(4);
    assert_eq!(alibi_slopes(6), [&s4[..], &[s8[0], s8[2]][..]].concat());
    let b = alibi_bias(2, 2, 3, Align::BottomRight).unwrap();
    // Head 0 (slope 1/16), bottom-right: queries sit at key positions 1 and 2.
    assert_eq!(flat(&b.narrow(1, 0, 1).unwrap()), [-0.0625f32, 0.0, -0.0625, -0.125, -0.0625, 0.0]);
}

#[test]
fn sinusoidal_table_matches_the_formula() {
    let t = flat(&sinusoidal_table(50, 6).unwrap());
    for (p, i) in [(0, 0), (7, 1), (49, 2)] {
        let a = p as f64 / 10000f64.powf(2.0 * i as f64 / 6.0);
        assert!((t[p * 6 + 2 * i] as f64 - a.sin()).abs() < 1e-6);
        assert!((t[p * 6 + 2 * i + 1] as f64 - a.cos()).abs() < 1e-6);
    }
}

#[test]
fn seeded_initialisation_is_reproducible_and_keyed_by_name() {
    let build = |seed| {
        let map = VarMap::new();
        MultiHeadAttention::new(MultiHeadAttentionConfig::new(8, 2), attn_nn::init::seeded(&map, seed)).unwrap();
        let data = map.data().lock().unwrap();
        (flat(data["in_proj_weight"].as_tensor()), flat(data["out_proj.weight"].as_tensor()))
    };
    let (a, b, c) = (build(1), build(1), build(2));
    assert_eq!(a, b);
    assert_ne!(a.0, c.0);
    // xavier_uniform bound for [24, 8]: sqrt(6 / 32).
    let bound = (6f32 / 32.0).sqrt();
    assert!(a.0.iter().all(|x| x.abs() <= bound) && a.0.iter().any(|x| x.abs() > bound * 0.9));
}
