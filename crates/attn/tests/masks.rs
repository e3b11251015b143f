//! Typed masks: keep and block polarity, padding masks from token ids versus key lengths,
//! broadcast ranks, the causal/window helpers versus the options, composition, and refusals.

use attn::{
    key_lengths_from_tokens, padding_mask, random::uniform, sdpa, sdpa_full, Align, AttnLibError, Mask, SdpaOptions,
};
use candle_core::{DType, Device, Tensor};

const B: usize = 2;
const H: usize = 3;
const LQ: usize = 4;
const LK: usize = 6;

fn inputs(seed: u64) -> (Tensor, Tensor, Tensor) {
    let q = uniform(&[B, H, LQ, 8], -2.0, 2.0, seed).unwrap();
    let k = uniform(&[B, H, LK, 8], -2.0, 2.0, seed + 1).unwrap();
    let v = uniform(&[B, H, LK, 5], -2.0, 2.0, seed + 2).unwrap();
    (q, k, v)
}

fn run(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Vec<f32> {
    sdpa(q, k, v, opts).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn weights(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Vec<f32> {
    let full = sdpa_full(q, k, v, &opts.clone().return_weights(true)).unwrap();
    full.weights.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

/// A random 0/1 `U8` tensor of `shape` (about 60% ones).
fn random_keep(shape: &[usize], seed: u64) -> Tensor {
    uniform(shape, 0.0, 1.0, seed).unwrap().ge(0.4).unwrap()
}

#[test]
fn keep_and_block_of_complementary_tensors_agree() {
    let (q, k, v) = inputs(1);
    let keep = random_keep(&[B, H, LQ, LK], 4);
    let block = keep.ones_like().unwrap().sub(&keep).unwrap();
    let with_keep = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(keep.clone())));
    let with_block = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::block(block)));
    assert_eq!(with_keep, with_block);
    // The same tensor read with the other polarity is a different mask.
    let flipped = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::block(keep.clone())));
    assert_ne!(with_keep, flipped);
    // Masked keys get weight exactly 0, kept keys a positive weight.
    let w = weights(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(keep.clone())));
    let flags = keep.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    for (i, (&wi, &f)) in w.iter().zip(&flags).enumerate() {
        assert_eq!(wi > 0.0, f != 0, "weight {i} = {wi} with keep flag {f}");
    }
}

#[test]
fn any_dtype_mask_counts_non_zero_as_true() {
    let (q, k, v) = inputs(5);
    let keep = random_keep(&[B, H, LQ, LK], 8);
    let expected = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(keep.clone())));
    // Non-zero values other than 1, in float and integer dtypes.
    let scaled = keep.to_dtype(DType::F32).unwrap().affine(-0.25, 0.0).unwrap();
    for t in [scaled.clone(), scaled.to_dtype(DType::F16).unwrap(), keep.to_dtype(DType::I64).unwrap()] {
        assert_eq!(run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(t))), expected);
    }
    let as_u8 = Mask::keep(scaled).to_keep_tensor().unwrap();
    assert_eq!(as_u8.dtype(), DType::U8);
    assert_eq!(as_u8.dims(), &[B, H, LQ, LK]);
    assert_eq!(
        as_u8.flatten_all().unwrap().to_vec1::<u8>().unwrap(),
        keep.flatten_all().unwrap().to_vec1::<u8>().unwrap()
    );
}

#[test]
fn padding_mask_from_tokens_equals_key_lengths() {
    let pad = 0u32;
    let tokens = Tensor::new(&[[5u32, 9, 2, 7, 0, 0], [3, 8, 1, 4, 6, 0]], &Device::Cpu).unwrap();
    let mask = padding_mask(&tokens, pad).unwrap();
    assert_eq!(mask.shape(), &[B, 1, 1, LK]);
    assert_eq!(mask.polarity(), attn::Polarity::Keep);
    let flags = mask.to_keep_tensor().unwrap().flatten_all().unwrap().to_vec1::<u8>().unwrap();
    assert_eq!(flags, vec![1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0]);
    let lengths = key_lengths_from_tokens(&tokens, pad).unwrap();
    assert_eq!(lengths, vec![4, 5]);

    let (q, k, v) = inputs(9);
    let by_mask = run(&q, &k, &v, &SdpaOptions::default().mask(mask));
    let by_lengths = run(&q, &k, &v, &SdpaOptions::default().key_lengths(lengths));
    assert_close(&by_mask, &by_lengths);
    assert_ne!(by_mask, run(&q, &k, &v, &SdpaOptions::default()));
    // Integer dtypes other than u32 read the same.
    let as_i64 = tokens.to_dtype(DType::I64).unwrap();
    assert_eq!(key_lengths_from_tokens(&as_i64, pad).unwrap(), vec![4, 5]);
}

#[test]
fn token_id_helpers_refuse_bad_input() {
    let left_padded = Tensor::new(&[[0u32, 0, 4, 5]], &Device::Cpu).unwrap();
    let e = key_lengths_from_tokens(&left_padded, 0).unwrap_err();
    assert!(matches!(e, AttnLibError::Value { field: "token_ids", .. }), "{e}");
    // The padding mask handles any padding layout.
    let flags = padding_mask(&left_padded, 0).unwrap().to_keep_tensor().unwrap();
    assert_eq!(flags.flatten_all().unwrap().to_vec1::<u8>().unwrap(), vec![0, 0, 1, 1]);

    let floats = Tensor::new(&[[1f32, 0.0]], &Device::Cpu).unwrap();
    assert!(matches!(padding_mask(&floats, 0).unwrap_err(), AttnLibError::DType { tensor: "token_ids", .. }));
    let rank1 = Tensor::new(&[1u32, 0], &Device::Cpu).unwrap();
    assert!(matches!(key_lengths_from_tokens(&rank1, 0).unwrap_err(), AttnLibError::Shape { tensor: "token_ids", .. }));
}

#[test]
fn masks_of_every_rank_broadcast_right_aligned() {
    let (q, k, v) = inputs(13);
    let shapes: [&[usize]; 6] = [&[LK], &[LQ, LK], &[H, LQ, LK], &[B, 1, LQ, LK], &[1, H, 1, LK], &[B, H, LQ, LK]];
    for (n, shape) in shapes.into_iter().enumerate() {
        let small = random_keep(shape, 20 + n as u64);
        let full = small.broadcast_as((B, H, LQ, LK)).unwrap().contiguous().unwrap();
        let got = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(small.clone())));
        let expected = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(full)));
        assert_eq!(got, expected, "mask shape {shape:?}");
        // The additive bias broadcasts the same way.
        let bias_small = uniform(shape, -1.0, 1.0, 40 + n as u64).unwrap();
        let bias_full = bias_small.broadcast_as((B, H, LQ, LK)).unwrap().contiguous().unwrap();
        let got = run(&q, &k, &v, &SdpaOptions::default().bias(bias_small));
        assert_eq!(got, run(&q, &k, &v, &SdpaOptions::default().bias(bias_full)), "bias shape {shape:?}");
    }
}

#[test]
fn rank_three_mask_on_single_head_input_is_per_batch() {
    let q = uniform(&[B, LQ, 8], -2.0, 2.0, 50).unwrap();
    let k = uniform(&[B, LK, 8], -2.0, 2.0, 51).unwrap();
    let v = uniform(&[B, LK, 5], -2.0, 2.0, 52).unwrap();
    let keep = random_keep(&[B, LQ, LK], 53);
    let got = run(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(keep.clone())));
    let lift = |t: &Tensor| t.unsqueeze(1).unwrap();
    let expected = run(&lift(&q), &lift(&k), &lift(&v), &SdpaOptions::default().mask(Mask::keep(lift(&keep))));
    assert_eq!(got, expected);
}

#[test]
fn causal_and_window_helpers_equal_the_options() {
    let (q, k, v) = inputs(60);
    let opt = |o: SdpaOptions| weights(&q, &k, &v, &o);
    let causal = Mask::causal(LQ, LK).unwrap();
    assert_eq!(causal.shape(), &[LQ, LK]);
    assert_eq!(opt(SdpaOptions::default().mask(causal)), opt(SdpaOptions::default().causal(true)));
    let window = Mask::window(LQ, LK, Some(1), Some(2), Align::BottomRight).unwrap();
    let by_option = opt(SdpaOptions::default().window(Some(1), Some(2)).align(Align::BottomRight));
    assert_eq!(opt(SdpaOptions::default().mask(window)), by_option);
    // Causal top-left, spelled out: row i keeps keys 0..=i.
    let flags = Mask::causal(3, 4).unwrap().to_keep_tensor().unwrap().to_vec2::<u8>().unwrap();
    assert_eq!(flags, vec![vec![1, 0, 0, 0], vec![1, 1, 0, 0], vec![1, 1, 1, 0]]);
}

#[test]
fn and_composes_masks() {
    let (q, k, v) = inputs(70);
    let tokens = Tensor::new(&[[5u32, 9, 2, 7, 0, 0], [3, 8, 1, 4, 6, 0]], &Device::Cpu).unwrap();
    let both = padding_mask(&tokens, 0).unwrap().and(&Mask::causal(LQ, LK).unwrap()).unwrap();
    assert_eq!(both.shape(), &[B, 1, LQ, LK]);
    let separate = SdpaOptions::default().causal(true).key_lengths(vec![4, 5]);
    assert_close(&run(&q, &k, &v, &SdpaOptions::default().mask(both)), &run(&q, &k, &v, &separate));
    let block = Mask::block(Tensor::new(&[1u8, 0, 0, 0, 0, 0], &Device::Cpu).unwrap());
    let keep = block.and(&Mask::keep(Tensor::new(&[1u8, 1, 1, 1, 1, 0], &Device::Cpu).unwrap())).unwrap();
    assert_eq!(keep.to_keep_tensor().unwrap().to_vec1::<u8>().unwrap(), vec![0, 1, 1, 1, 1, 0]);
}

#[test]
fn bad_masks_are_refused() {
    let (q, k, v) = inputs(80);
    let rank5 = Tensor::ones((1, 1, 1, 1, LK), DType::U8, &Device::Cpu).unwrap();
    let e = sdpa(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(rank5))).unwrap_err();
    assert!(matches!(e, AttnLibError::Shape { tensor: "mask", .. }), "{e}");
    let scalar = Tensor::new(1u8, &Device::Cpu).unwrap();
    let e = sdpa(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(scalar))).unwrap_err();
    assert!(matches!(e, AttnLibError::Shape { tensor: "mask", .. }), "{e}");
    let wrong = Tensor::ones((LQ, LK + 1), DType::U8, &Device::Cpu).unwrap();
    let e = sdpa(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(wrong))).unwrap_err();
    assert!(matches!(e, AttnLibError::Kernel(attn_kernels::AttnError::Broadcast { tensor: "mask", .. })), "{e}");
    let a = Mask::keep(Tensor::ones((2, 3), DType::U8, &Device::Cpu).unwrap());
    let b = Mask::keep(Tensor::ones((4, 3), DType::U8, &Device::Cpu).unwrap());
    assert!(matches!(a.and(&b).unwrap_err(), AttnLibError::Candle(_)));
}

#[test]
fn keep_mask_is_the_rule_of_every_mask_together() {
    let cpu = &Device::Cpu;
    // Key 1 blocked for batch 1, key 3 of query 2 given a -inf bias, window (1, 1) bottom-right
    // aligned, and key lengths 5 and 3.
    let block: Vec<u8> = (0..B * LK).map(|i| u8::from(i == LK + 1)).collect();
    let mut bias = vec![0f32; LQ * LK];
    bias[2 * LK + 3] = f32::NEG_INFINITY;
    bias[LK + 2] = -1e30; // query 1, key 2: very negative but finite, so not masked
    let opts = SdpaOptions::default()
        .mask(Mask::block(Tensor::from_vec(block, (B, 1, 1, LK), cpu).unwrap()))
        .bias(Tensor::from_vec(bias, (LQ, LK), cpu).unwrap())
        .window(Some(1), Some(1))
        .align(Align::BottomRight)
        .key_lengths(vec![5, 3]);
    let keep = opts.keep_mask(B, H, LQ, LK).unwrap();
    assert_eq!((keep.dims(), keep.dtype()), (&[B, H, LQ, LK][..], DType::U8));
    let keep = keep.flatten_all().unwrap().to_vec1::<u8>().unwrap();
    for (b, key_length) in [5, 3].into_iter().enumerate() {
        for h in 0..H {
            for i in 0..LQ {
                for j in 0..LK {
                    let centre = (i + LK - LQ) as isize;
                    let rule = (j as isize - centre).abs() <= 1
                        && j < key_length
                        && !(b == 1 && j == 1)
                        && !(i == 2 && j == 3);
                    let at = ((b * H + h) * LQ + i) * LK + j;
                    assert_eq!(keep[at], u8::from(rule), "b {b} h {h} query {i} key {j}");
                }
            }
        }
    }
    // Its zeros are weights of exactly 0; the one other weight of 0, query 1's key 2 in batch 0,
    // underflowed under its finite bias (in batch 1 it is the row's only key, so its weight is 1).
    let (q, k, v) = inputs(40);
    let w = weights(&q, &k, &v, &opts);
    for (at, (&kept, &w)) in keep.iter().zip(&w).enumerate() {
        let underflow = at / (LQ * LK) < H && at % (LQ * LK) == LK + 2;
        assert_eq!(kept == 1, w != 0.0 || underflow, "cell {at}: keep {kept}, weight {w}");
        assert!(!underflow || (kept == 1 && w == 0.0), "cell {at}: keep {kept}, weight {w}");
    }
    let wrong = SdpaOptions::default().key_lengths(vec![1, 2, 3]);
    assert!(wrong.keep_mask(B, H, LQ, LK).is_err(), "key lengths of the wrong batch are refused");
}

/// `keep_mask` against the kernels' own semantics: under each rule alone (causal in both
/// alignments with `Lq < Lk` and `Lq > Lk`, windows, key lengths, a boolean mask of either
/// polarity, an additive mask with `−∞` entries) its zeros are exactly the reference kernel's
/// weights of 0 (the inputs are too small for a kept weight to underflow), including rows with no
/// key left.
#[test]
fn keep_mask_zeros_are_the_reference_kernels_zero_weights() {
    let cpu = &Device::Cpu;
    let every: Vec<u8> = (0..B * LK).map(|i| u8::from(i % 4 == 1)).collect();
    let every = Tensor::from_vec(every, (B, 1, 1, LK), cpu).unwrap();
    let additive: Vec<f32> = (0..LQ * LK).map(|i| if i % 5 == 2 { f32::NEG_INFINITY } else { 0.3 }).collect();
    let additive = Tensor::from_vec(additive, (LQ, LK), cpu).unwrap();
    let base = SdpaOptions::default().kernel(attn::Kernel::Reference);
    let cases = [
        ("causal top-left", base.clone().causal(true)),
        ("causal bottom-right", base.clone().causal(true).align(Align::BottomRight)),
        ("window (2, 0)", base.clone().window(Some(2), Some(0))),
        ("window (0, 1) bottom-right", base.clone().window(Some(0), Some(1)).align(Align::BottomRight)),
        ("key lengths", base.clone().key_lengths(vec![2, 5])),
        ("keep mask", base.clone().mask(Mask::keep(every.clone()))),
        ("block mask", base.clone().mask(Mask::block(every))),
        ("additive mask", base.clone().bias(additive)),
    ];
    for (lq, lk) in [(LQ, LK), (LK, LQ)] {
        let q = uniform(&[B, H, lq, 8], -1.0, 1.0, 50).unwrap();
        let k = uniform(&[B, H, lk, 8], -1.0, 1.0, 51).unwrap();
        let v = uniform(&[B, H, lk, 5], -1.0, 1.0, 52).unwrap();
        for (name, opts) in &cases {
            if (opts.mask.is_some() || opts.bias.is_some() || opts.key_lengths.is_some()) && lk != LK {
                continue; // these masks are sized for Lk = LK
            }
            let keep = opts.keep_mask(B, H, lq, lk).unwrap().flatten_all().unwrap().to_vec1::<u8>().unwrap();
            let w = weights(&q, &k, &v, opts);
            assert!(keep.contains(&0) && keep.contains(&1), "{name} Lq {lq} Lk {lk}: masks something, not everything");
            for (at, (&kept, &w)) in keep.iter().zip(&w).enumerate() {
                assert_eq!(kept == 1, w != 0.0, "{name} Lq {lq} Lk {lk}: cell {at}: keep {kept}, weight {w}");
            }
        }
    }
}
