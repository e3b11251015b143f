//! `sdpa` / `sdpa_full` against the `f64` reference kernel: 4-D, 3-D and grouped-query inputs,
//! every dtype, strided and broadcast tensors, every option, and refused inputs.

use attn::{random::uniform, sdpa, sdpa_full, Align, AttnLibError, Mask, SdpaOptions};
use attn_kernels::{reference, AttnOutput, AttnParams, Broadcast, Dropout, MaskSpec, Real, View4, Window};
use attn_testkit::oracle::{check, OUTPUT_FACTOR};
use candle_core::{DType, Tensor};

/// Flat values of `t` as `T`, row-major.
fn values<T: candle_core::WithDType>(t: &Tensor) -> Vec<T> {
    t.flatten_all().unwrap().to_dtype(T::DTYPE).unwrap().to_vec1::<T>().unwrap()
}

fn dims4(t: &Tensor) -> [usize; 4] {
    t.dims().try_into().unwrap()
}

/// The reference kernel in `T` on the values of 4-D `q`, `k`, `v`.
fn run_reference<T: Real + candle_core::WithDType>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    params: &AttnParams<T>,
) -> AttnOutput<T> {
    let (qd, kd, vd) = (values::<T>(q), values::<T>(k), values::<T>(v));
    let qv = View4::contiguous("q", &qd, dims4(q)).unwrap();
    let kv = View4::contiguous("k", &kd, dims4(k)).unwrap();
    let vv = View4::contiguous("v", &vd, dims4(v)).unwrap();
    reference(&qv, &kv, &vv, params, true).unwrap()
}

/// Checks `sdpa_full` on 4-D `q`, `k`, `v` (any float dtype) with default options against the
/// oracle rule: `ref64` on the inputs' exact values, `naive32` on their `f32` roundings.
fn assert_default_matches(q: &Tensor, k: &Tensor, v: &Tensor) {
    let got = sdpa_full(q, k, v, &SdpaOptions::default().return_weights(true)).unwrap();
    let r64 = run_reference::<f64>(q, k, v, &AttnParams::default());
    let r32 = run_reference::<f32>(q, k, v, &AttnParams::default());
    check("out", &values::<f32>(&got.out), &r64.out, &r32.out, OUTPUT_FACTOR).unwrap();
    check("lse", &values::<f32>(&got.lse), &r64.lse, &r32.lse, OUTPUT_FACTOR).unwrap();
    let w = got.weights.unwrap();
    check("weights", &values::<f32>(&w), &r64.weights.unwrap(), &r32.weights.unwrap(), OUTPUT_FACTOR).unwrap();
}

#[test]
fn f32_4d_matches_reference() {
    let q = uniform(&[2, 3, 5, 8], -2.0, 2.0, 1).unwrap();
    let k = uniform(&[2, 3, 7, 8], -2.0, 2.0, 2).unwrap();
    let v = uniform(&[2, 3, 7, 6], -2.0, 2.0, 3).unwrap();
    let full = sdpa_full(&q, &k, &v, &SdpaOptions::default().return_weights(true)).unwrap();
    assert_eq!(full.out.dims(), &[2, 3, 5, 6]);
    assert_eq!(full.lse.dims(), &[2, 3, 5]);
    assert_eq!(full.weights.as_ref().unwrap().dims(), &[2, 3, 5, 7]);
    assert_eq!((full.out.dtype(), full.lse.dtype()), (DType::F32, DType::F32));
    assert_default_matches(&q, &k, &v);
    let plain = sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap();
    assert_eq!(values::<f32>(&plain), values::<f32>(&full.out));
    let no_weights = sdpa_full(&q, &k, &v, &SdpaOptions::default()).unwrap();
    assert!(no_weights.weights.is_none());
}

#[test]
fn three_d_input_is_single_head() {
    let q = uniform(&[2, 5, 8], -1.0, 1.0, 4).unwrap();
    let k = uniform(&[2, 7, 8], -1.0, 1.0, 5).unwrap();
    let v = uniform(&[2, 7, 6], -1.0, 1.0, 6).unwrap();
    let got = sdpa_full(&q, &k, &v, &SdpaOptions::default().return_weights(true)).unwrap();
    assert_eq!(got.out.dims(), &[2, 5, 6]);
    assert_eq!(got.lse.dims(), &[2, 5]);
    assert_eq!(got.weights.as_ref().unwrap().dims(), &[2, 5, 7]);
    let lift = |t: &Tensor| t.unsqueeze(1).unwrap();
    let r64 = run_reference::<f64>(&lift(&q), &lift(&k), &lift(&v), &AttnParams::default());
    let r32 = run_reference::<f32>(&lift(&q), &lift(&k), &lift(&v), &AttnParams::default());
    check("out", &values::<f32>(&got.out), &r64.out, &r32.out, OUTPUT_FACTOR).unwrap();
    check("lse", &values::<f32>(&got.lse), &r64.lse, &r32.lse, OUTPUT_FACTOR).unwrap();
}

#[test]
fn grouped_query_heads_share_key_value_heads() {
    let q = uniform(&[2, 4, 3, 8], -1.0, 1.0, 7).unwrap();
    let k = uniform(&[2, 2, 6, 8], -1.0, 1.0, 8).unwrap();
    let v = uniform(&[2, 2, 6, 5], -1.0, 1.0, 9).unwrap();
    assert_default_matches(&q, &k, &v);
    // Query heads 0 and 1 read key/value head 0: with identical queries their outputs agree.
    let q_same = q.narrow(1, 0, 1).unwrap().broadcast_as((2, 4, 3, 8)).unwrap();
    let out = sdpa(&q_same, &k, &v, &SdpaOptions::default()).unwrap();
    assert_eq!(values::<f32>(&out.narrow(1, 0, 1).unwrap()), values::<f32>(&out.narrow(1, 1, 1).unwrap()));
    assert_ne!(values::<f32>(&out.narrow(1, 0, 1).unwrap()), values::<f32>(&out.narrow(1, 2, 1).unwrap()));
}

#[test]
fn half_and_double_inputs_compute_in_f32_and_keep_their_dtype() {
    let q = uniform(&[1, 2, 4, 16], -2.0, 2.0, 10).unwrap();
    let k = uniform(&[1, 2, 9, 16], -2.0, 2.0, 11).unwrap();
    let v = uniform(&[1, 2, 9, 8], -2.0, 2.0, 12).unwrap();
    for (dtype, eps) in [(DType::F16, 2f64.powi(-10)), (DType::BF16, 2f64.powi(-7))] {
        let (qh, kh, vh) = (q.to_dtype(dtype).unwrap(), k.to_dtype(dtype).unwrap(), v.to_dtype(dtype).unwrap());
        let got = sdpa_full(&qh, &kh, &vh, &SdpaOptions::default().return_weights(true)).unwrap();
        assert_eq!(got.out.dtype(), dtype);
        assert_eq!(got.weights.as_ref().unwrap().dtype(), dtype);
        assert_eq!(got.lse.dtype(), DType::F32);
        let r64 = run_reference::<f64>(&qh, &kh, &vh, &AttnParams::default());
        let magnitude = r64.out.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (i, (&g, &r)) in values::<f64>(&got.out).iter().zip(&r64.out).enumerate() {
            assert!((g - r).abs() <= magnitude * eps, "{dtype:?} out[{i}]: {g} vs {r}");
        }
        // f32 queries with half-precision keys and values: read in place, output in f32.
        let mixed = sdpa(&q, &kh, &vh, &SdpaOptions::default()).unwrap();
        assert_eq!(mixed.dtype(), DType::F32);
        let q32 = q.clone();
        let r64 = run_reference::<f64>(&q32, &kh, &vh, &AttnParams::default());
        let r32 = run_reference::<f32>(&q32, &kh, &vh, &AttnParams::default());
        check("mixed out", &values::<f32>(&mixed), &r64.out, &r32.out, OUTPUT_FACTOR).unwrap();
    }
    let (qd, kd, vd) =
        (q.to_dtype(DType::F64).unwrap(), k.to_dtype(DType::F64).unwrap(), v.to_dtype(DType::F64).unwrap());
    assert_eq!(sdpa(&qd, &kd, &vd, &SdpaOptions::default()).unwrap().dtype(), DType::F64);
    assert_default_matches(&qd, &kd, &vd);
}

#[test]
fn strided_and_broadcast_inputs_match_contiguous_copies() {
    // q stored [B, L, H, D] and transposed: strided heads, contiguous last dimension.
    let q = uniform(&[2, 5, 3, 8], -1.0, 1.0, 13).unwrap().transpose(1, 2).unwrap();
    // k stored [B, H, D, L] and transposed: strided last dimension, made contiguous.
    let k = uniform(&[2, 3, 8, 7], -1.0, 1.0, 14).unwrap().transpose(2, 3).unwrap();
    // v shared by every head through a stride-0 broadcast.
    let v = uniform(&[2, 1, 7, 4], -1.0, 1.0, 15).unwrap().broadcast_as((2, 3, 7, 4)).unwrap();
    assert!(!q.is_contiguous() && !k.is_contiguous() && !v.is_contiguous());
    assert_default_matches(&q, &k, &v);
    let strided = sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap();
    let copies = [&q, &k, &v].map(|t| t.contiguous().unwrap());
    let contiguous = sdpa(&copies[0], &copies[1], &copies[2], &SdpaOptions::default()).unwrap();
    assert_eq!(values::<f32>(&strided), values::<f32>(&contiguous));
    // A narrowed tensor starts inside its storage.
    let wide = uniform(&[2, 3, 7, 12], -1.0, 1.0, 16).unwrap();
    let v_narrow = wide.narrow(3, 4, 4).unwrap();
    assert_default_matches(&q, &k, &v_narrow);
}

/// The kernel parameters `every_option_reaches_the_kernel` sets through `SdpaOptions`, written
/// out by hand: the test's own statement of what each option means, independent of the library's
/// conversion (`SdpaOptions::kernel_params`) that it checks.
fn all_options<'a, T: Real>(
    keep: &'a [bool],
    keep_shape: [usize; 4],
    bias: &'a [T],
    bias_shape: [usize; 2],
    sinks: &'a [T],
) -> AttnParams<'a, T> {
    AttnParams {
        scale: Some(0.7),
        mask: MaskSpec {
            causal: true,
            window: Some(Window { left: Some(3), right: None }),
            align: Align::BottomRight,
            key_lengths: Some(&[5, 6]),
            keep: Some(Broadcast::new("mask", keep, &keep_shape).unwrap()),
            bias: Some(Broadcast::new("bias", bias, &bias_shape).unwrap()),
            block: None,
        },
        softcap: Some(2.5),
        dropout: Some(Dropout { p: 0.25, seed: 99 }),
        score_mod: None,
        sinks: Some(sinks),
        compute: attn_kernels::Precision::F32,
    }
}

#[test]
fn every_option_reaches_the_kernel() {
    let (b, h, lq, lk, d) = (2, 2, 4, 6, 8);
    let q = uniform(&[b, h, lq, d], -2.0, 2.0, 17).unwrap();
    let k = uniform(&[b, h, lk, d], -2.0, 2.0, 18).unwrap();
    let v = uniform(&[b, h, lk, d], -2.0, 2.0, 19).unwrap();
    let bias = uniform(&[lq, lk], -1.0, 1.0, 20).unwrap();
    let keep = uniform(&[b, 1, lq, lk], 0.0, 1.0, 21).unwrap().ge(0.3).unwrap();
    let sinks = Tensor::new(&[0.5f64, 1.5], q.device()).unwrap();
    let opts = SdpaOptions::default()
        .scale(0.7)
        .causal(true)
        .align(Align::BottomRight)
        .window(Some(3), None)
        .mask(Mask::keep(keep.clone()))
        .bias(bias.clone())
        .key_lengths(vec![5, 6])
        .softcap(2.5)
        .dropout(0.25, 99)
        .sinks(sinks.clone())
        .return_weights(true);
    let got = sdpa_full(&q, &k, &v, &opts).unwrap();

    let keep_flags: Vec<bool> = values::<u8>(&keep).into_iter().map(|x| x != 0).collect();
    let (bias64, bias32) = (values::<f64>(&bias), values::<f32>(&bias));
    let (sinks64, sinks32) = (values::<f64>(&sinks), values::<f32>(&sinks));
    let params64 = all_options(&keep_flags, [b, 1, lq, lk], &bias64, [lq, lk], &sinks64);
    let params32 = all_options(&keep_flags, [b, 1, lq, lk], &bias32, [lq, lk], &sinks32);
    let r64 = run_reference::<f64>(&q, &k, &v, &params64);
    let r32 = run_reference::<f32>(&q, &k, &v, &params32);
    check("out", &values::<f32>(&got.out), &r64.out, &r32.out, OUTPUT_FACTOR).unwrap();
    check("lse", &values::<f32>(&got.lse), &r64.lse, &r32.lse, OUTPUT_FACTOR).unwrap();
    let w = values::<f32>(got.weights.as_ref().unwrap());
    check("weights", &w, r64.weights.as_ref().unwrap(), r32.weights.as_ref().unwrap(), OUTPUT_FACTOR).unwrap();
    // The options change the result: without them the output differs.
    let plain = sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap();
    assert_ne!(values::<f32>(&plain), values::<f32>(&got.out));
    // The library's conversion gives the same parameters: the reference on them is bit-identical.
    let host = opts.kernel_params::<f64>().unwrap();
    let converted = run_reference::<f64>(&q, &k, &v, &host.attn_params().unwrap());
    assert_eq!((converted.out, converted.lse, converted.weights), (r64.out, r64.lse, r64.weights));
}

#[test]
fn empty_sizes_give_empty_outputs() {
    let q = uniform(&[1, 2, 0, 8], -1.0, 1.0, 22).unwrap();
    let k = uniform(&[1, 2, 3, 8], -1.0, 1.0, 23).unwrap();
    let v = uniform(&[1, 2, 3, 4], -1.0, 1.0, 24).unwrap();
    assert_eq!(sdpa(&q, &k, &v, &SdpaOptions::default()).unwrap().dims(), &[1, 2, 0, 4]);
    let q = uniform(&[1, 2, 2, 8], -1.0, 1.0, 25).unwrap();
    let k = uniform(&[1, 2, 0, 8], -1.0, 1.0, 26).unwrap();
    let v = uniform(&[1, 2, 0, 4], -1.0, 1.0, 27).unwrap();
    let got = sdpa_full(&q, &k, &v, &SdpaOptions::default()).unwrap();
    assert_eq!(values::<f32>(&got.out), vec![0.0; 16]);
    assert!(values::<f32>(&got.lse).iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn bad_inputs_are_refused_with_named_errors() {
    let q = uniform(&[1, 2, 3, 4], -1.0, 1.0, 28).unwrap();
    let opts = SdpaOptions::default();
    let err = |r: attn::Result<Tensor>| r.unwrap_err();

    let q_u8 = q.to_dtype(DType::U8).unwrap();
    assert!(matches!(err(sdpa(&q_u8, &q, &q, &opts)), AttnLibError::DType { tensor: "q", .. }));
    let v_i64 = q.to_dtype(DType::I64).unwrap();
    assert!(matches!(err(sdpa(&q, &q, &v_i64, &opts)), AttnLibError::DType { tensor: "v", .. }));

    let q2 = q.flatten_all().unwrap();
    assert!(matches!(err(sdpa(&q2, &q2, &q2, &opts)), AttnLibError::Shape { tensor: "q", .. }));
    let k3 = q.squeeze(0).unwrap();
    assert!(matches!(err(sdpa(&q, &k3, &q, &opts)), AttnLibError::Shape { tensor: "k", .. }));

    let k_wrong_batch = uniform(&[2, 2, 3, 4], -1.0, 1.0, 29).unwrap();
    let e = err(sdpa(&q, &k_wrong_batch, &k_wrong_batch, &opts));
    assert!(matches!(e, AttnLibError::Kernel(attn_kernels::AttnError::DimMismatch { tensor: "k", .. })), "{e}");
    let k_wrong_dim = uniform(&[1, 2, 3, 5], -1.0, 1.0, 30).unwrap();
    assert!(matches!(err(sdpa(&q, &k_wrong_dim, &q, &opts)), AttnLibError::Kernel(_)));
    let k_three_heads = uniform(&[1, 3, 3, 4], -1.0, 1.0, 31).unwrap();
    assert!(matches!(err(sdpa(&q, &k_three_heads, &k_three_heads, &opts)), AttnLibError::Kernel(_)));

    let bias_u8 = Tensor::zeros((3, 3), DType::U8, &candle_core::Device::Cpu).unwrap();
    let e = err(sdpa(&q, &q, &q, &opts.clone().bias(bias_u8)));
    assert!(matches!(e, AttnLibError::DType { tensor: "bias", .. }), "{e}");
    let bias_bad = Tensor::zeros((4, 3), DType::F32, &candle_core::Device::Cpu).unwrap();
    let e = err(sdpa(&q, &q, &q, &opts.clone().bias(bias_bad)));
    assert!(e.to_string().contains("bias"), "{e}");
    assert!(matches!(err(sdpa(&q, &q, &q, &opts.clone().key_lengths(vec![3, 3]))), AttnLibError::Kernel(_)));
    assert!(matches!(err(sdpa(&q, &q, &q, &opts.clone().dropout(1.0, 0))), AttnLibError::Kernel(_)));
    assert!(matches!(err(sdpa(&q, &q, &q, &opts.clone().scale(f64::NAN))), AttnLibError::Kernel(_)));
    assert!(matches!(err(sdpa(&q, &q, &q, &opts.clone().softcap(-1.0))), AttnLibError::Kernel(_)));

    // Sinks: rank 1 `[Hq]` of a float dtype, finite or -inf.
    let cpu = &candle_core::Device::Cpu;
    let e = err(sdpa(&q, &q, &q, &opts.clone().sinks(Tensor::zeros((1, 2), DType::F32, cpu).unwrap())));
    assert!(matches!(e, AttnLibError::Shape { tensor: "sinks", .. }), "{e}");
    let e = err(sdpa(&q, &q, &q, &opts.clone().sinks(Tensor::zeros(3, DType::F32, cpu).unwrap())));
    let want = attn_kernels::AttnError::DimMismatch { tensor: "sinks", dim: "heads", expected: 2, found: 3 };
    assert!(matches!(&e, AttnLibError::Kernel(k) if *k == want), "{e}");
    let e = err(sdpa(&q, &q, &q, &opts.clone().sinks(Tensor::zeros(2, DType::U8, cpu).unwrap())));
    assert!(matches!(e, AttnLibError::DType { tensor: "sinks", .. }), "{e}");
    let nan = Tensor::new(&[0.0f32, f32::NAN], cpu).unwrap();
    let e = err(sdpa(&q, &q, &q, &opts.clone().sinks(nan)));
    assert!(matches!(e, AttnLibError::Kernel(attn_kernels::AttnError::Param { field: "sinks", .. })), "{e}");
}

/// A wrapped candle error displays on one line: the backtrace candle attaches under
/// `RUST_BACKTRACE` is dropped (captured here regardless of the environment) and its context's
/// line break becomes `: `.
#[test]
fn wrapped_candle_errors_display_on_one_line() {
    let cause = candle_core::Error::Msg("lhs [2, 3] and rhs [2, 3] do not multiply".into());
    let with_bt = candle_core::Error::WithBacktrace {
        inner: Box::new(cause),
        backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
    }
    .context("projecting the queries");
    assert!(with_bt.to_string().lines().count() > 2, "candle's own display is several lines: {with_bt}");
    let e = AttnLibError::from(with_bt);
    assert_eq!(e.to_string(), "candle: projecting the queries: lhs [2, 3] and rhs [2, 3] do not multiply");
}
