//! Gradients through candle's autograd: `loss.backward()` on `attn::sdpa` delivers to q, k, v, a
//! tracked bias and tracked sinks exactly what the kernels' backward computes (for 4-D and 3-D
//! inputs, grouped-query heads, half-precision K/V, masks and dropout), every one finite and
//! non-zero; and a small optimisation through `sdpa` converges.

use attn::{sdpa, Kernel, Mask, SdpaOptions};
use attn_kernels::{attention, attention_backward, AttnGrads, Dropout, KvView, Saved, View4};
use candle_core::{DType, Device, Tensor, Var};

use crate::common;

use common::{flat, max_diff, uniform};

/// `(dq, dk, dv, dbias)` from the kernels directly on 4-D contiguous f32 inputs with `opts`'
/// parameters.
fn kernel_grads(q: &[f32], k: &[f32], v: &[f32], dims: [usize; 7], opts: &SdpaOptions, dout: &[f32]) -> AttnGrads<f32> {
    let [b, hq, hkv, lq, lk, dk, dv] = dims;
    let qv = View4::contiguous("q", q, [b, hq, lq, dk]).unwrap();
    let kv = KvView::F32(View4::contiguous("k", k, [b, hkv, lk, dk]).unwrap());
    let vv = KvView::F32(View4::contiguous("v", v, [b, hkv, lk, dv]).unwrap());
    let host = opts.kernel_params::<f32>().unwrap();
    let params = host.attn_params().unwrap();
    let fwd = attention(opts.kernel, &qv, &kv, &vv, &params, false).unwrap();
    let dout = View4::contiguous("grad_out", dout, [b, hq, lq, dv]).unwrap();
    let saved = Saved::of(&fwd, [b, hq, lq, dv], dout).unwrap();
    attention_backward(opts.kernel, &qv, &kv, &vv, &saved, &params, true).unwrap()
}

fn assert_useful(name: &str, g: &[f32]) {
    assert!(g.iter().all(|x| x.is_finite()), "{name}: a gradient is not finite");
    assert!(g.iter().any(|&x| x != 0.0), "{name}: every gradient is zero");
}

/// Tracked `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]` for
/// `dims = [B, Hq, Hkv, Lq, Lk, Dk, Dv]`, drawn from the seeds `seed`, `seed + 1`, `seed + 2`.
fn qkv(dims: [usize; 7], seed: u64) -> [Var; 3] {
    let [b, hq, hkv, lq, lk, dk, dv] = dims;
    let mut n = seed;
    [[b, hq, lq, dk], [b, hkv, lk, dk], [b, hkv, lk, dv]].map(|shape| {
        n += 1;
        Var::from_tensor(&uniform(&shape, n - 1)).unwrap()
    })
}

/// Checks that `grads` holds, for `q`, `k`, `v` and the bias when given, finite non-zero gradients
/// equal to the kernels' `want`.
fn assert_kernel_grads(
    grads: &candle_core::backprop::GradStore,
    [q, k, v]: [&Var; 3],
    bias: Option<&Var>,
    want: &AttnGrads<f32>,
) {
    let got = |t: &Var| flat(grads.get(t).expect("a gradient"));
    for (name, t, w) in [("q", q, &want.dq), ("k", k, &want.dk), ("v", v, &want.dv)] {
        assert_useful(name, &got(t));
        assert!(max_diff(&got(t), w) <= 1e-6, "d{name} differs from the kernel's by {}", max_diff(&got(t), w));
    }
    if let Some(bias) = bias {
        let db = got(bias);
        assert_useful("bias", &db);
        assert!(max_diff(&db, want.dbias.as_ref().unwrap()) <= 1e-5, "dbias differs from the kernel's");
    }
}

#[test]
fn gradients_reach_q_k_v_and_bias_and_equal_the_kernels() {
    let dims = [2, 4, 2, 9, 13, 8, 6];
    let [b, hq, _, lq, lk, _, dv] = dims;
    let [q, k, v] = qkv(dims, 1);
    let bias = Var::from_tensor(&uniform(&[lq, lk], 4)).unwrap();
    let dout = uniform(&[b, hq, lq, dv], 5);
    let dropout = Dropout { p: 0.2, seed: 11 };
    let opts = SdpaOptions::default().causal(true).bias(bias.as_tensor().clone()).dropout(dropout.p, dropout.seed);
    let out = sdpa(&q, &k, &v, &opts).unwrap();
    let loss = (out * &dout).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let want = kernel_grads(&flat(&q), &flat(&k), &flat(&v), dims, &opts, &flat(&dout));
    assert_kernel_grads(&grads, [&q, &k, &v], Some(&bias), &want);
}

#[test]
fn single_head_half_kv_and_untracked_bias() {
    let (b, l, d) = (2, 7, 8);
    let q = Var::from_tensor(&uniform(&[b, l, d], 6)).unwrap();
    let k = Var::from_tensor(&uniform(&[b, l, d], 7).to_dtype(DType::F16).unwrap()).unwrap();
    let v = Var::from_tensor(&uniform(&[b, l, d], 8).to_dtype(DType::BF16).unwrap()).unwrap();
    let bias = uniform(&[b, l, l], 9);
    let tokens = Tensor::new(&[[1u32, 2, 3, 4, 5, 0, 0], [1, 2, 3, 4, 5, 6, 7]], &Device::Cpu).unwrap();
    let opts = SdpaOptions::default().bias(bias).mask(attn::padding_mask(&tokens, 0).unwrap());
    let out = sdpa(&q, &k, &v, &opts).unwrap();
    assert_eq!(out.dims(), &[b, l, d]);
    let grads = out.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    for (name, t, dtype) in [("q", &q, DType::F32), ("k", &k, DType::F16), ("v", &v, DType::BF16)] {
        let g = grads.get(t).unwrap_or_else(|| panic!("no gradient for {name}"));
        assert_eq!(g.dtype(), dtype, "d{name} has the input's dtype");
        assert_eq!(g.dims(), t.dims());
        assert_useful(name, &flat(g));
    }
    // Padded keys (batch 0, keys 5 and 6) get no gradient.
    let dk = grads.get(&k).unwrap().to_dtype(DType::F32).unwrap().to_vec3::<f32>().unwrap();
    assert!(dk[0][5..].iter().flatten().all(|&x| x == 0.0), "padded keys got a gradient");
}

#[test]
fn a_small_optimisation_through_sdpa_converges() {
    // Learn queries so that attention over fixed keys/values reproduces a target output.
    let (b, h, l, d) = (1, 2, 6, 4);
    let k = uniform(&[b, h, l, d], 20).affine(3.0, 0.0).unwrap();
    let v = uniform(&[b, h, l, d], 21);
    let target = sdpa(&uniform(&[b, h, l, d], 22), &k, &v, &SdpaOptions::default()).unwrap();
    let q = Var::from_tensor(&uniform(&[b, h, l, d], 23)).unwrap();
    let loss_of = |q: &Tensor| -> Tensor {
        let out = sdpa(q, &k, &v, &SdpaOptions::default().kernel(Kernel::Auto)).unwrap();
        (out - &target).unwrap().sqr().unwrap().mean_all().unwrap()
    };
    let first = loss_of(&q).to_scalar::<f32>().unwrap();
    for _ in 0..300 {
        let loss = loss_of(&q);
        let g = loss.backward().unwrap();
        let step = (g.get(&q).unwrap() * 2.0).unwrap();
        q.set(&(q.as_tensor() - step).unwrap()).unwrap();
    }
    let last = loss_of(&q).to_scalar::<f32>().unwrap();
    assert!(last < first / 20.0, "loss went from {first} to {last}");
}

#[test]
fn masks_keep_their_meaning_under_autograd() {
    let (b, h, l, d) = (1, 1, 5, 4);
    let q = Var::from_tensor(&uniform(&[b, h, l, d], 30)).unwrap();
    let k = Var::from_tensor(&uniform(&[b, h, l, d], 31)).unwrap();
    let v = Var::from_tensor(&uniform(&[b, h, l, d], 32)).unwrap();
    let keep = Tensor::new(&[1u8, 1, 0, 1, 1], &Device::Cpu).unwrap();
    let out = sdpa(&q, &k, &v, &SdpaOptions::default().mask(Mask::keep(keep))).unwrap();
    let grads = out.sum_all().unwrap().backward().unwrap();
    let dv = grads.get(&v).unwrap().squeeze(0).unwrap().to_vec3::<f32>().unwrap();
    assert!(dv[0][2].iter().all(|&x| x == 0.0), "a masked key's value got a gradient");
    assert!(dv[0][0].iter().all(|&x| x != 0.0));
}

/// The op converts its options to kernel parameters once, in the forward, and its backward
/// borrows that conversion: with a full-size `[B, Hq, Lq, Lk]` keep-mask and tracked bias, the
/// gradients equal the kernels' on every backward through the same graph (the op keeps the
/// conversion for as long as the graph lives, not only for one backward).
#[test]
fn a_full_size_mask_and_bias_serve_the_forward_and_every_backward() {
    let dims = [2, 4, 2, 48, 80, 8, 8];
    let [b, hq, _, lq, lk, _, dv] = dims;
    let [q, k, v] = qkv(dims, 21);
    let bias = Var::from_tensor(&uniform(&[b, hq, lq, lk], 24)).unwrap();
    let keep = uniform(&[b, hq, lq, lk], 25).ge(-0.6).unwrap();
    let dout = uniform(&[b, hq, lq, dv], 26);
    let opts = SdpaOptions::default().mask(Mask::keep(keep)).bias(bias.as_tensor().clone()).key_lengths(vec![lk, 61]);
    let out = sdpa(&q, &k, &v, &opts).unwrap();
    let loss = (out * &dout).unwrap().sum_all().unwrap();
    let want = kernel_grads(&flat(&q), &flat(&k), &flat(&v), dims, &opts, &flat(&dout));
    for _ in 0..2 {
        assert_kernel_grads(&loss.backward().unwrap(), [&q, &k, &v], Some(&bias), &want);
    }
}

/// Sinks tracked alone, and together with a tracked bias (the op then carries both gradients in
/// one argument): `dsinks` equals the kernels' and comes back in the sinks' dtype and shape.
#[test]
fn gradients_reach_sinks_alone_and_beside_a_bias() {
    let dims = [2, 4, 2, 9, 13, 8, 6];
    let [b, hq, _, lq, lk, _, dv] = dims;
    let [q, k, v] = qkv(dims, 40);
    let dout = uniform(&[b, hq, lq, dv], 43);
    let sinks = Var::from_tensor(&Tensor::new(&[0.5f64, 2.0, -1.0, 3.0], &Device::Cpu).unwrap()).unwrap();
    let bias = Var::from_tensor(&uniform(&[lq, lk], 44)).unwrap();
    let base = SdpaOptions::default().causal(true).sinks(sinks.as_tensor().clone()).dropout(0.1, 5);
    for with_bias in [false, true] {
        let opts = if with_bias { base.clone().bias(bias.as_tensor().clone()) } else { base.clone() };
        let out = sdpa(&q, &k, &v, &opts).unwrap();
        let grads = (out * &dout).unwrap().sum_all().unwrap().backward().unwrap();
        let want = kernel_grads(&flat(&q), &flat(&k), &flat(&v), dims, &opts, &flat(&dout));
        assert_kernel_grads(&grads, [&q, &k, &v], with_bias.then_some(&bias), &want);
        assert_eq!(grads.get(&bias).is_some(), with_bias, "a bias gradient exactly when the bias is used");
        let ds = grads.get(&sinks).expect("a gradient for the sinks");
        assert_eq!((ds.dtype(), ds.dims()), (DType::F64, &[hq][..]));
        assert_useful("sinks", &flat(ds));
        let err = max_diff(&flat(ds), want.dsinks.as_ref().unwrap());
        assert!(err <= 1e-6, "dsinks (bias {with_bias}) differs from the kernel's by {err}");
    }
}

/// 3-D single-head inputs take sinks `[1]`; untracked sinks still shape the output (and get no
/// gradient), and `-inf` sinks change nothing.
#[test]
fn single_head_sinks_and_untracked_sinks() {
    let (b, l, d) = (2, 5, 4);
    let q = Var::from_tensor(&uniform(&[b, l, d], 50)).unwrap();
    let sink = Var::from_tensor(&Tensor::new(&[1.0f32], &Device::Cpu).unwrap()).unwrap();
    let out = sdpa(&q, &q, &q, &SdpaOptions::default().sinks(sink.as_tensor().clone())).unwrap();
    let grads = out.sum_all().unwrap().backward().unwrap();
    assert_useful("sink", &flat(grads.get(&sink).unwrap()));
    let plain = sdpa(&q, &q, &q, &SdpaOptions::default()).unwrap();
    let fixed = sdpa(&q, &q, &q, &SdpaOptions::default().sinks(Tensor::new(&[1.0f32], &Device::Cpu).unwrap())).unwrap();
    assert_eq!(flat(&fixed), flat(&out));
    assert_ne!(flat(&plain), flat(&out));
    let none = Tensor::new(&[f32::NEG_INFINITY], &Device::Cpu).unwrap();
    assert_eq!(flat(&sdpa(&q, &q, &q, &SdpaOptions::default().sinks(none)).unwrap()), flat(&plain));
}

/// Keys and values whose heads are strided (`[B, L, H, D]` transposed, as a module's projections
/// make them) give the same output, tracked bias or sinks or not: the op's joined `[k | v]`
/// argument is read as laid out, not as if its last dimension were contiguous.
#[test]
fn tracked_bias_and_sinks_with_strided_keys_and_values() {
    let (b, h, lq, lk, d) = (2, 2, 5, 7, 4);
    let q = uniform(&[b, h, lq, d], 60);
    let k = uniform(&[b, lk, h, d], 61).transpose(1, 2).unwrap();
    let v = uniform(&[b, lk, h, d], 62).transpose(1, 2).unwrap();
    let (bias, sinks) = (uniform(&[lq, lk], 63), Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap());
    let plain = SdpaOptions::default().causal(true).bias(bias.clone()).sinks(sinks.clone());
    let want = flat(&sdpa(&q, &k, &v, &plain).unwrap());
    let (bias, sinks) = (Var::from_tensor(&bias).unwrap(), Var::from_tensor(&sinks).unwrap());
    for (tb, ts) in [(true, false), (false, true), (true, true)] {
        let mut opts = plain.clone();
        if tb {
            opts.bias = Some(bias.as_tensor().clone());
        }
        if ts {
            opts.sinks = Some(sinks.as_tensor().clone());
        }
        assert_eq!(flat(&sdpa(&q, &k, &v, &opts).unwrap()), want, "tracked bias {tb}, tracked sinks {ts}");
    }
}
