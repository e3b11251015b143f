//! Packed batches against PyTorch: each module's `forward_packed` on the real rows of a padded batch
//! must give what PyTorch's module computes in float64 on the padded batch with key padding
//! (`tests/fixtures/packed/*.safetensors`, written by `scripts/gen_packed_fixtures.py`), at the
//! real rows, for the output and for the gradient of every parameter and input.
//!
//! The rule is the parity suite's ([`pytorch_parity_parts::check::compare`]): the packed call with
//! the fast kernel is `fast`, the padded call with the reference kernel and the key padding masks
//! is `naive32`, and PyTorch's float64 values are `ref64`; `max|fast − ref64| ≤ factor ·
//! max|naive32 − ref64| + floor` for every tensor, and the padded call within the `f32` budget.
//! The fixtures' `grad_out` is zero beyond each length, so the gradients are those of a loss on the
//! real rows; the output rows beyond each length (which the packed call does not compute) are set
//! to zero in the fixture and in the padded run before comparing.
//!
//! Also: bf16 products (`compute`) reach the packed kernels; the packed type's conversions and its
//! refusals, and the modules' refusals of what has no packed form.

use crate::pytorch_parity_parts;

use attn::Kernel;
use attn_nn::{AttnMasks, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, NnError, Packed, PackedMhaInput};
use candle_core::{Device, Tensor};
use pytorch_parity_parts::check::{compute, report, Batch};
use pytorch_parity_parts::fixture::{fixture_dir, fixture_names, Data, Fixture};

/// Zeroes the rows `l ≥ lengths[b]` of a row-major `[B, L, ..]` buffer of `shape`.
fn zero_padding<T: Default + Copy>(values: &mut [T], shape: &[usize], lengths: &[usize]) {
    let (l, row) = (shape[1], shape[2..].iter().product::<usize>());
    for (b, &n) in lengths.iter().enumerate() {
        values[(b * l + n) * row..(b + 1) * l * row].fill(T::default());
    }
}

/// Runs the packed fixture `name`: packed on the fast kernel, padded on the reference kernel.
fn check_packed(name: &str) -> Result<(), String> {
    let mut fx = Fixture::load(&format!("packed/{name}"))?;
    let lengths: Vec<usize> = match &fx.get("lengths.out")?.data {
        Data::I64(v) => v.iter().map(|&n| n as usize).collect(),
        _ => return Err(format!("{name}: `lengths.out` is not I64")),
    };
    let out = fx.tensors.get_mut("out").ok_or_else(|| format!("{name}: `out` missing"))?;
    let shape = out.shape.clone();
    let Data::F64(values) = &mut out.data else { return Err(format!("{name}: `out` is not F64")) };
    zero_padding(values, &shape, &lengths);
    let fast = compute(&fx, Kernel::Auto, Batch::Packed)?;
    let mut naive = compute(&fx, Kernel::Reference, Batch::Padded)?;
    let (naive_shape, naive_out) = naive.get_mut("out").ok_or_else(|| format!("{name}: no padded `out`"))?;
    zero_padding(naive_out, &naive_shape.clone(), &lengths);
    report(&fx, &fast, &naive)
}

macro_rules! packed_cases {
    ($($case:ident),* $(,)?) => {
        /// Every case, one test each.
        const CASES: &[&str] = &[$(stringify!($case)),*];
        $(
            #[test]
            fn $case() {
                if let Err(e) = check_packed(stringify!($case)) {
                    panic!("{e}");
                }
            }
        )*
    };
}

packed_cases!(
    gqa_rope_padding,
    gqa_rope_causal_mqa,
    mha_cross_kdim_vdim,
    encoder_post_relu,
    encoder_pre_gelu_causal,
    decoder_layer,
    transformer,
    seq2seq,
);

#[test]
fn every_packed_fixture_has_a_case() {
    let files = fixture_names(&fixture_dir().join("packed"));
    let mut cases: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
    cases.sort();
    assert_eq!(files, cases, "the packed fixtures and the test cases differ");
}

fn rows(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).unwrap()
}

#[test]
fn packing_a_padded_batch_and_back() {
    let x = attn::random::uniform(&[3, 4, 2], -1.0, 1.0, 1).unwrap(); // [B, L, E]
    let packed = Packed::from_padded(&x, &[2, 4, 0]).unwrap();
    assert_eq!(
        (packed.cu_seqlens(), packed.lengths(), packed.total(), packed.batch()),
        (&[0, 2, 6, 6][..], vec![2, 4, 0], 6, 3)
    );
    assert_eq!(packed.positions(), [0, 1, 0, 1, 2, 3]);
    let want: Vec<f32> = x.narrow(1, 0, 2).unwrap().get(0).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let got: Vec<f32> = packed.data().narrow(0, 0, 2).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(got, want);
    let back = packed.to_padded(5).unwrap(); // [3, 5, 2]
    assert_eq!(back.dims(), [3, 5, 2]);
    let back: Vec<Vec<Vec<f32>>> = back.to_vec3().unwrap();
    let x: Vec<Vec<Vec<f32>>> = x.to_vec3().unwrap();
    assert_eq!(back[1][..4], x[1][..]);
    assert_eq!(back[0][..2], x[0][..2]);
    assert!(back[0][2..].iter().chain(&back[1][4..]).chain(&back[2]).flatten().all(|&v| v == 0.0));
}

#[test]
fn packing_a_list_of_sequences() {
    let (a, b) = (rows(&[1.0, 2.0, 3.0], &[3, 1]), rows(&[4.0, 5.0], &[2, 1]));
    let packed = Packed::from_sequences(&[a, b]).unwrap();
    assert_eq!(packed.cu_seqlens(), [0, 3, 5]);
    assert_eq!(packed.data().flatten_all().unwrap().to_vec1::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn bad_offsets_and_lengths_are_refused_by_name() {
    let data = rows(&[0.0; 6], &[3, 2]);
    for cu in [vec![0, 2], vec![1, 3], vec![0, 2, 1, 3], vec![0], vec![0, 4]] {
        let e = Packed::new(data.clone(), cu.clone()).unwrap_err();
        assert!(matches!(&e, NnError::Input { input: "cu_seqlens", found, .. } if *found == cu), "{cu:?}: {e}");
    }
    let x = rows(&[0.0; 8], &[2, 2, 2]);
    let e = Packed::from_padded(&x, &[1, 3]).unwrap_err();
    assert!(matches!(e, NnError::Input { input: "x", .. }), "{e}");
    let e = Packed::from_padded(&x, &[1]).unwrap_err();
    assert!(matches!(e, NnError::Input { input: "x", .. }), "{e}");
    let e = Packed::from_padded(&x, &[2, 1]).unwrap().to_padded(1).unwrap_err();
    assert!(matches!(e, NnError::Input { input: "len", .. }), "{e}");
    assert!(matches!(Packed::from_sequences(&[]).unwrap_err(), NnError::Input { input: "sequences", .. }));
}

#[test]
fn what_has_no_packed_form_is_refused_naming_the_field() {
    let x = Packed::from_sequences(&[attn::random::uniform(&[3, 8], -1.0, 1.0, 1).unwrap()]).unwrap();
    let base = MultiHeadAttentionConfig::new(8, 2);
    let cases = [
        ("add_bias_kv", MultiHeadAttentionConfig { add_bias_kv: true, ..base.clone() }),
        ("add_zero_attn", MultiHeadAttentionConfig { add_zero_attn: true, ..base.clone() }),
    ];
    for (name, cfg) in cases {
        let map = candle_nn::VarMap::new();
        let mha = MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0)).unwrap();
        let e = mha.forward_packed(PackedMhaInput::self_attention(&x)).unwrap_err();
        assert!(matches!(e, NnError::Config { field, .. } if field == name), "{name}: {e}");
    }
}

/// The largest `|a − b|` over two tensors of one shape.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
}

/// `m`'s padded causal self-attention on each of `seqs` (`[len, E]`) alone, the outputs one after
/// another (`[Σ len, E]`, the packed layout).
fn each_alone(m: &MultiHeadAttention, seqs: &[Tensor]) -> Tensor {
    let outs: Vec<Tensor> = seqs
        .iter()
        .map(|s| {
            let s = s.unsqueeze(0).unwrap();
            m.forward(MhaInput::self_attention(&s).masks(AttnMasks::causal())).unwrap().out.squeeze(0).unwrap()
        })
        .collect();
    Tensor::cat(&outs, 0).unwrap()
}

/// bf16 products reach the packed call: with the same weights, `forward_packed` and the gradient
/// of every parameter equal the padded forward run on each sequence alone with bf16 products (to
/// f32 summation order), and differ from the packed call with f32 products by far more.
#[test]
fn bf16_products_reach_the_packed_kernels() {
    let map = candle_nn::VarMap::new();
    let base = MultiHeadAttentionConfig { num_kv_heads: Some(2), ..MultiHeadAttentionConfig::new(64, 4) };
    let mha = |compute| {
        let cfg = MultiHeadAttentionConfig { compute, ..base.clone() };
        MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0)).unwrap()
    };
    let (bf, f32_products) = (mha(attn::Precision::Bf16), mha(attn::Precision::F32));
    // 2 · length stacked query rows per key/value head, above the decode path's 16: the prefill
    // path, where bf16 products run.
    let seqs: Vec<Tensor> =
        [12, 21].iter().zip(10..).map(|(&l, seed)| attn::random::uniform(&[l, 64], -1.0, 1.0, seed).unwrap()).collect();
    let target = attn::random::uniform(&[33, 64], -1.0, 1.0, 20).unwrap();
    let x = Packed::from_sequences(&seqs).unwrap();
    let packed = |m: &MultiHeadAttention| {
        m.forward_packed(PackedMhaInput::self_attention(&x).causal(true)).unwrap().data().clone()
    };
    let grads = |out: &Tensor| {
        let g = (out * &target).unwrap().sum_all().unwrap().backward().unwrap();
        map.all_vars().iter().map(|v| g.get(v).unwrap().clone()).collect::<Vec<_>>()
    };
    let (got, alone, f32_out) = (packed(&bf), each_alone(&bf, &seqs), packed(&f32_products));
    let (same, apart) = (max_diff(&got, &alone), max_diff(&got, &f32_out));
    assert!(same <= 1e-6 && apart >= 1e-4, "out: packed vs alone {same}, bf16 vs f32 products {apart}");
    let (g_got, g_alone, g_f32) = (grads(&got), grads(&alone), grads(&f32_out));
    let (mut same, mut apart) = (0.0f32, 0.0f32);
    for (i, ((a, b), c)) in g_got.iter().zip(&g_alone).zip(&g_f32).enumerate() {
        let d = max_diff(a, b);
        assert!(d <= 1e-5, "parameter {i}: packed vs alone {d}");
        (same, apart) = (same.max(d), apart.max(max_diff(a, c)));
    }
    // Over all parameters: the output projection's bias gets the same gradient either way.
    assert!(apart >= 10.0 * same.max(1e-6), "gradients: packed vs alone {same}, bf16 vs f32 products {apart}");
}

/// gpt-oss's sinks in packed batches: with the same weights, `forward_packed` and the gradient of
/// every parameter (the sinks' among them, finite and non-zero) equal the padded forward run on
/// each sequence alone (to f32 summation order).
#[test]
fn sinks_in_packed_batches_equal_each_sequence_alone() {
    let map = candle_nn::VarMap::new();
    let cfg = MultiHeadAttentionConfig { num_kv_heads: Some(2), sinks: true, ..MultiHeadAttentionConfig::new(32, 4) };
    let mha = MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0)).unwrap();
    let seqs: Vec<Tensor> = [5, 9, 1]
        .iter()
        .zip(30..)
        .map(|(&l, seed)| attn::random::uniform(&[l, 32], -1.0, 1.0, seed).unwrap())
        .collect();
    let target = attn::random::uniform(&[15, 32], -1.0, 1.0, 40).unwrap();
    let x = Packed::from_sequences(&seqs).unwrap();
    let packed = mha.forward_packed(PackedMhaInput::self_attention(&x).causal(true)).unwrap().data().clone();
    let alone = each_alone(&mha, &seqs);
    assert!(max_diff(&packed, &alone) <= 1e-6, "out: packed vs alone {}", max_diff(&packed, &alone));
    let grads = |out: &Tensor| (out * &target).unwrap().sum_all().unwrap().backward().unwrap();
    let (g_packed, g_alone) = (grads(&packed), grads(&alone));
    let vars = map.data().lock().unwrap().clone();
    for (name, var) in &vars {
        let (a, b) = (g_packed.get(var).unwrap(), g_alone.get(var).unwrap());
        assert!(max_diff(a, b) <= 1e-5, "{name}: packed vs alone {}", max_diff(a, b));
    }
    let ds: Vec<f32> = g_packed.get(&vars["sinks"]).unwrap().to_vec1().unwrap();
    assert!(ds.iter().all(|x| x.is_finite() && *x != 0.0), "dsinks {ds:?}");
}

#[test]
fn mismatched_packed_inputs_are_refused() {
    let map = candle_nn::VarMap::new();
    let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(8, 2), attn_nn::init::seeded(&map, 0)).unwrap();
    let seq = |l: usize, w: usize, seed| attn::random::uniform(&[l, w], -1.0, 1.0, seed).unwrap();
    let q = Packed::from_sequences(&[seq(3, 8, 1), seq(2, 8, 2)]).unwrap();
    let one = Packed::from_sequences(&[seq(4, 8, 3)]).unwrap();
    let e = mha.forward_packed(PackedMhaInput::new(&q, &one, &one)).unwrap_err();
    assert!(matches!(e, NnError::Input { input: "key/value cu_seqlens", .. }), "{e}");
    let narrow = Packed::from_sequences(&[seq(3, 6, 4)]).unwrap();
    let e = mha.forward_packed(PackedMhaInput::self_attention(&narrow)).unwrap_err();
    assert!(matches!(e, NnError::Input { input: "query", .. }), "{e}");
}
