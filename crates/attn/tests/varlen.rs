//! `attn::sdpa_varlen` on packed candle tensors: the output and log-sum-exp equal the kernels'
//! `attention_varlen`, and each sequence equals `attn::sdpa` on that sequence alone, with f32 and
//! with bf16 products (`SdpaOptions::compute`); gradients
//! through candle's autograd reach `q`, `k` and `v` (finite, non-zero, in their dtypes) and equal
//! the kernels' packed backward; sinks join every sequence and get the sum of their gradients; strided inputs (a fused QKV buffer) give the contiguous result;
//! unsupported options, bad ranks and bad offsets are refused naming the field.

use attn::{
    cu_seqlens, sdpa, sdpa_full, sdpa_varlen, sdpa_varlen_full, AttnError, AttnLibError, Mask, Precision, SdpaOptions,
};
use attn_kernels::{attention_varlen, attention_varlen_backward, CuSeqlens, Packed, VarlenSaved};
use candle_core::{DType, Device, Tensor, Var};

use crate::common;

use common::{flat, max_diff, uniform};

/// Lengths `(Lq, Lk)` of four sequences: more keys than queries, fewer, no queries, as many.
const LENS: [(usize, usize); 4] = [(5, 9), (11, 4), (0, 3), (7, 7)];

fn offsets() -> (Vec<usize>, Vec<usize>) {
    (cu_seqlens(&LENS.map(|l| l.0)), cu_seqlens(&LENS.map(|l| l.1)))
}

#[test]
fn cu_seqlens_are_the_running_sums() {
    assert_eq!(cu_seqlens(&[3, 0, 5]), [0, 3, 3, 8]);
    assert_eq!(cu_seqlens(&[]), [0]);
}

/// With f32 and with bf16 products (`SdpaOptions::compute` reaches the packed kernels forward and
/// backward).
#[test]
fn forward_and_gradients_equal_the_packed_kernels() {
    for compute in [Precision::F32, Precision::Bf16] {
        forward_and_gradients_match(compute);
    }
}

fn forward_and_gradients_match(compute: Precision) {
    let (cq, ck) = offsets();
    let (tq, tk, hq, hkv, dk, dv) = (cq[4], ck[4], 4, 2, 8, 6);
    let q = Var::from_tensor(&uniform(&[tq, hq, dk], 1)).unwrap();
    let k = Var::from_tensor(&uniform(&[tk, hkv, dk], 2)).unwrap();
    let v = Var::from_tensor(&uniform(&[tk, hkv, dv], 3)).unwrap();
    let dout = uniform(&[tq, hq, dv], 4);
    let opts = SdpaOptions::default().causal(true).align(attn::Align::BottomRight).dropout(0.2, 9).compute(compute);
    let r = sdpa_varlen_full(&q, &k, &v, &cq, &ck, &opts).unwrap();
    assert_eq!((r.out.dims(), r.lse.dims()), (&[tq, hq, dv][..], &[hq, tq][..]));

    let (qf, kf, vf, df) = (flat(&q), flat(&k), flat(&v), flat(&dout));
    let host = opts.kernel_params::<f32>().unwrap();
    let params = host.attn_params().unwrap();
    let cu = CuSeqlens { q: &cq, k: &ck };
    let qp = Packed::contiguous("q", &qf, [tq, hq, dk]).unwrap();
    let (kp, vp) =
        (Packed::contiguous("k", &kf, [tk, hkv, dk]).unwrap(), Packed::contiguous("v", &vf, [tk, hkv, dv]).unwrap());
    let want = attention_varlen(opts.kernel, &qp, &kp.into(), &vp.into(), &cu, &params).unwrap();
    assert_eq!(flat(&r.out), want.out);
    assert_eq!(flat(&r.lse), want.lse);

    let grads = (r.out * &dout).unwrap().sum_all().unwrap().backward().unwrap();
    let saved = VarlenSaved::of(&want, Packed::contiguous("grad_out", &df, [tq, hq, dv]).unwrap()).unwrap();
    let g = attention_varlen_backward(opts.kernel, &qp, &kp.into(), &vp.into(), &cu, &saved, &params).unwrap();
    for (name, var, w) in [("q", &q, &g.dq), ("k", &k, &g.dk), ("v", &v, &g.dv)] {
        let got = flat(grads.get(var).unwrap());
        assert!(got.iter().all(|x| x.is_finite()) && got.iter().any(|&x| x != 0.0), "{compute:?} d{name} not useful");
        assert!(max_diff(&got, w) <= 1e-6, "{compute:?} d{name} differs from the kernel's by {}", max_diff(&got, w));
    }
}

#[test]
fn each_sequence_equals_sdpa_on_it_alone() {
    let (cq, ck) = offsets();
    let (hq, hkv, d) = (4, 1, 8);
    let q = uniform(&[cq[4], hq, d], 5);
    let k = uniform(&[ck[4], hkv, d], 6).to_dtype(DType::F16).unwrap();
    let v = uniform(&[ck[4], hkv, d], 7).to_dtype(DType::BF16).unwrap();
    // `[len, H, D]` rows of a packed tensor as the `[1, H, len, D]` that sdpa takes.
    let alone = |t: &Tensor, from: usize, len: usize| {
        t.narrow(0, from, len).unwrap().transpose(0, 1).unwrap().unsqueeze(0).unwrap()
    };
    // Every sequence stacks 4 · Lq > 16 query rows per key/value head: the prefill path, where
    // bf16 products run (the decode path computes in f32).
    let outs = [Precision::F32, Precision::Bf16].map(|compute| {
        let opts = SdpaOptions::default().causal(true).window(Some(3), None).compute(compute);
        let out = sdpa_varlen(&q, &k, &v, &cq, &ck, &opts).unwrap();
        for s in 0..LENS.len() {
            let (lq, lk) = (cq[s + 1] - cq[s], ck[s + 1] - ck[s]);
            if lq == 0 {
                continue;
            }
            let want = sdpa(&alone(&q, cq[s], lq), &alone(&k, ck[s], lk), &alone(&v, ck[s], lk), &opts).unwrap();
            assert_eq!(flat(&alone(&out, cq[s], lq)), flat(&want), "{compute:?}: sequence {s}");
        }
        flat(&out)
    });
    assert_ne!(outs[0], outs[1], "bf16 products gave the f32 products' output bit for bit");
}

/// Sinks (a `Var`) join every sequence's rows: each sequence's output and log-sum-exp equal
/// `attn::sdpa_full` on it alone with the same sinks, `q`, `k`, `v` get its gradients, and the
/// sinks get the sum of the sequences' (finite, non-zero).
#[test]
fn sinks_join_every_sequence_and_get_the_summed_gradient() {
    let (cq, ck) = offsets();
    let (hq, hkv, dk, dv) = (4, 2, 8, 6);
    let var = |shape: &[usize], seed| Var::from_tensor(&uniform(shape, seed)).unwrap();
    let (q, k, v, sinks) =
        (var(&[cq[4], hq, dk], 21), var(&[ck[4], hkv, dk], 22), var(&[ck[4], hkv, dv], 23), var(&[hq], 24));
    let dout = uniform(&[cq[4], hq, dv], 25);
    let opts = SdpaOptions::default().causal(true);
    let r = sdpa_varlen_full(&q, &k, &v, &cq, &ck, &opts.clone().sinks(sinks.as_tensor().clone())).unwrap();
    let grads = (&r.out * &dout).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |x: &Var| grads.get(x).unwrap().clone();
    // `[len, H, D]` rows of a packed tensor as the `[1, H, len, D]` that sdpa takes.
    let alone = |t: &Tensor, from: usize, len: usize| {
        t.narrow(0, from, len).unwrap().transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap()
    };
    let mut dsinks = vec![0.0f32; hq];
    for s in 0..LENS.len() {
        let (lq, lk) = (cq[s + 1] - cq[s], ck[s + 1] - ck[s]);
        if lq == 0 {
            continue;
        }
        let (qs, ks, vs) = (alone(&q, cq[s], lq), alone(&k, ck[s], lk), alone(&v, ck[s], lk));
        let [qs, ks, vs] = [qs, ks, vs].map(|t| Var::from_tensor(&t).unwrap());
        let ss = Var::from_tensor(sinks.as_tensor()).unwrap();
        let want = sdpa_full(&qs, &ks, &vs, &opts.clone().sinks(ss.as_tensor().clone())).unwrap();
        assert_eq!(flat(&alone(&r.out, cq[s], lq)), flat(&want.out), "sequence {s}'s output");
        assert_eq!(flat(&r.lse.narrow(1, cq[s], lq).unwrap()), flat(&want.lse), "sequence {s}'s lse");
        let g = (&want.out * alone(&dout, cq[s], lq)).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, packed, rows, x) in
            [("q", &q, cq[s]..cq[s + 1], &qs), ("k", &k, ck[s]..ck[s + 1], &ks), ("v", &v, ck[s]..ck[s + 1], &vs)]
        {
            let got = flat(&alone(&grad(packed), rows.start, rows.len()));
            let d = max_diff(&got, &flat(g.get(x).unwrap()));
            assert!(d <= 1e-6, "sequence {s}'s d{name} differs by {d}");
        }
        dsinks.iter_mut().zip(flat(g.get(&ss).unwrap())).for_each(|(a, x)| *a += x);
    }
    let got = flat(&grad(&sinks));
    assert!(got.iter().all(|x| x.is_finite() && *x != 0.0), "dsinks {got:?}");
    assert!(max_diff(&got, &dsinks) <= 1e-5, "dsinks {got:?}, the sequences' sum {dsinks:?}");
}

#[test]
fn half_precision_kv_gets_gradients_in_its_dtype() {
    let (cq, ck) = offsets();
    let q = Var::from_tensor(&uniform(&[cq[4], 2, 8], 8).to_dtype(DType::F64).unwrap()).unwrap();
    let k = Var::from_tensor(&uniform(&[ck[4], 2, 8], 9).to_dtype(DType::F16).unwrap()).unwrap();
    let v = Var::from_tensor(&uniform(&[ck[4], 2, 4], 10).to_dtype(DType::BF16).unwrap()).unwrap();
    let out = sdpa_varlen(&q, &k, &v, &cq, &ck, &SdpaOptions::default()).unwrap();
    assert_eq!(out.dtype(), DType::F64);
    let grads = out.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    for (var, dtype) in [(&q, DType::F64), (&k, DType::F16), (&v, DType::BF16)] {
        let g = grads.get(var).unwrap();
        assert_eq!((g.dtype(), g.dims()), (dtype, var.dims()));
        assert!(flat(g).iter().any(|&x| x != 0.0));
    }
}

#[test]
fn strided_inputs_from_a_fused_projection_give_the_contiguous_result() {
    let (cq, _) = offsets();
    let (t, h, d) = (cq[4], 2, 8);
    let qkv = uniform(&[t, 3 * h, d], 11);
    let [q, k, v] = [0, 1, 2].map(|i| qkv.narrow(1, i * h, h).unwrap());
    assert!(!q.is_contiguous());
    let opts = SdpaOptions::default().causal(true);
    let strided = sdpa_varlen(&q, &k, &v, &cq, &cq, &opts).unwrap();
    let [qc, kc, vc] = [&q, &k, &v].map(|x| x.contiguous().unwrap());
    assert_eq!(flat(&strided), flat(&sdpa_varlen(&qc, &kc, &vc, &cq, &cq, &opts).unwrap()));
}

#[test]
fn unsupported_options_ranks_and_offsets_are_refused_by_name() {
    let (cq, ck) = offsets();
    let q = uniform(&[cq[4], 2, 8], 12);
    let kv = uniform(&[ck[4], 2, 8], 13);
    let call = |opts: &SdpaOptions, cq: &[usize], ck: &[usize]| sdpa_varlen(&q, &kv, &kv, cq, ck, opts).unwrap_err();
    let param = |e: AttnLibError| match e {
        AttnLibError::Kernel(AttnError::Param { field, .. }) => field,
        other => panic!("expected a parameter error, got {other:?}"),
    };
    let plain = SdpaOptions::default();
    assert_eq!(param(call(&plain.clone().key_lengths(vec![1, 2, 3, 4]), &cq, &ck)), "key_lengths");
    let keep = Tensor::ones((cq[4], ck[4]), DType::U8, &Device::Cpu).unwrap();
    assert_eq!(param(call(&plain.clone().mask(Mask::keep(keep)), &cq, &ck)), "mask");
    assert_eq!(param(call(&plain.clone().bias(uniform(&[ck[4]], 14)), &cq, &ck)), "bias");
    assert!(matches!(
        call(&plain.clone().return_weights(true), &cq, &ck),
        AttnLibError::Value { field: "return_weights", .. }
    ));
    assert_eq!(param(call(&plain, &cq, &[0, 9, 13, 16, 22])), "cu_seqlens_k");
    assert_eq!(param(call(&plain, &[0, 5, 3, 16, 23], &ck)), "cu_seqlens_q");
    assert_eq!(param(call(&plain, &cq[..4], &ck[..4])), "cu_seqlens_q");
    let q4 = q.unsqueeze(0).unwrap();
    let e = sdpa_varlen(&q4, &kv, &kv, &cq, &ck, &plain).unwrap_err();
    assert!(matches!(e, AttnLibError::Shape { tensor: "q", .. }), "{e:?}");
}
