//! `attn run` with `grad_out`: the gradients it writes (`dq`, `dk`, `dv`, `dbias`, `dsinks`) against
//! the `f64` reference backward with the gradient rule, in both input forms, and dropout replayed
//! from the seed as the kernels' backward replays it.

use crate::common;

use common::*;

#[test]
fn gradients_with_causal_mask_bias_and_gqa_match_the_reference_backward() {
    let dir = tempfile::tempdir().unwrap();
    let (b, hq, hkv, lq, lk, dk, dv) = (2, 4, 2, 7, 9, 8, 6);
    let (q, k, v) =
        (f32_tensor(&[b, hq, lq, dk], 21), f32_tensor(&[b, hkv, lk, dk], 22), f32_tensor(&[b, hkv, lk, dv], 23));
    // Broadcast over the batch (so `dbias` sums over it), not over the keys.
    let bias = f32_tensor(&[hq, lq, lk], 24);
    let grad_out =
        tensor(&[b, hq, lq, dv], HostData::F64(values(b * hq * lq * dv, 25).into_iter().map(f64::from).collect()));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v), ("bias", &bias), ("grad_out", &grad_out)]);
    let out = out_path(dir.path());
    let (result, stdout) =
        run_ok(&["--causal", "--align", "bottom-right", "-o", out.to_str().unwrap()], &[&input], &out);
    let opts =
        SdpaOptions::default().causal(true).align(Align::BottomRight).bias(bias.clone().into_float_tensor().unwrap());
    let case = Case::new(&q, &k, &v, opts);
    case.check(&result, false);
    case.check_grads(&result, &grad_out);
    assert_eq!(result.len(), 6, "{:?}", result.keys().collect::<Vec<_>>());
    assert!(stdout.contains("grad_out [2, 4, 7, 6] F64") && stdout.contains("dbias [4, 7, 9]"), "{stdout}");
}

#[test]
fn npy_inputs_with_grad_out_and_the_reference_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let q = f32_tensor(&[1, 2, 5, 4], 31);
    let k = tensor(&[1, 1, 6, 4], HostData::F64(values(24, 32).into_iter().map(f64::from).collect()));
    let v = f32_tensor(&[1, 1, 6, 3], 33);
    let grad_out = f32_tensor(&[1, 2, 5, 3], 34);
    let out = out_path(dir.path());
    let mut args = npy_args(dir.path(), &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &grad_out)]);
    args.extend(["--window".into(), "2,1".into(), "--kernel".into(), "reference".into()]);
    args.extend(["-o".into(), out.to_str().unwrap().into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (result, stdout) = run_ok(&args, &[], &out);
    let case = Case::new(&q, &k, &v, SdpaOptions::default().window(Some(2), Some(1)));
    case.check(&result, false);
    case.check_grads(&result, &grad_out);
    assert_eq!(result.len(), 5, "{:?}", result.keys().collect::<Vec<_>>());
    assert!(stdout.contains("grad_out [1, 2, 5, 3] F32") && stdout.contains("dk [1, 1, 6, 4]"), "{stdout}");
}

#[test]
fn dropout_gradients_equal_the_kernel_backward_with_the_same_seed() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[2, 2, 8, 4], 41), f32_tensor(&[2, 2, 8, 4], 42), f32_tensor(&[2, 2, 8, 4], 43));
    let grad_out = f32_tensor(&[2, 2, 8, 4], 44);
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &grad_out)]);
    let out = out_path(dir.path());
    let (result, _) = run_ok(&["--dropout", "0.3", "--seed", "17", "-o", out.to_str().unwrap()], &[&input], &out);
    let got = |name: &str| f32_of(&result[name]);
    let same_seed = kernel_grads(Kernel::Auto, &q, &k, &v, &grad_out, &SdpaOptions::default().dropout(0.3, 17));
    for (name, want) in [("dq", &same_seed.dq), ("dk", &same_seed.dk), ("dv", &same_seed.dv)] {
        assert!(
            max_diff(&got(name), want) <= 1e-6,
            "{name} differs from the kernel's by {}",
            max_diff(&got(name), want)
        );
    }
    let other_seed = kernel_grads(Kernel::Auto, &q, &k, &v, &grad_out, &SdpaOptions::default().dropout(0.3, 18));
    assert!(max_diff(&got("dq"), &other_seed.dq) > 1e-3, "the seed does not matter");
}

#[test]
fn sinks_give_dsinks_in_both_input_forms() {
    let dir = tempfile::tempdir().unwrap();
    let (b, hq, hkv, lq, lk, d) = (2, 4, 2, 6, 9, 8);
    let (q, k, v) =
        (f32_tensor(&[b, hq, lq, d], 51), f32_tensor(&[b, hkv, lk, d], 52), f32_tensor(&[b, hkv, lk, d], 53));
    // F64 sinks, one head without a sink; dsinks comes back as F32 like every gradient.
    let sinks = tensor(&[hq], HostData::F64(vec![0.5, -1.0, f64::NEG_INFINITY, 2.0]));
    let (bias, grad_out) = (f32_tensor(&[lq, lk], 54), f32_tensor(&[b, hq, lq, d], 55));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v), ("bias", &bias), ("sinks", &sinks), ("grad_out", &grad_out)]);
    let out = out_path(dir.path());
    let (result, stdout) = run_ok(&["--causal", "--weights", "-o", out.to_str().unwrap()], &[&input], &out);
    let float = |t: &HostTensor| t.clone().into_float_tensor().unwrap();
    let opts = SdpaOptions::default().causal(true).bias(float(&bias)).sinks(float(&sinks));
    let case = Case::new(&q, &k, &v, opts);
    case.check(&result, true);
    case.check_grads(&result, &grad_out);
    assert!(stdout.contains("sinks [4] F64") && stdout.contains("dsinks [4]"), "{stdout}");
    let dsinks = f32_of(&result["dsinks"]);
    assert!(dsinks[2] == 0.0 && dsinks.iter().all(|x| x.is_finite()), "dsinks {dsinks:?}");

    // The .npy form, without a bias.
    let out = dir.path().join("npy.safetensors");
    let mut args = npy_args(dir.path(), &[("q", &q), ("k", &k), ("v", &v), ("sinks", &sinks), ("grad_out", &grad_out)]);
    args.extend(["-o".into(), out.to_str().unwrap().into()]);
    let (result, _) = run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[], &out);
    let case = Case::new(&q, &k, &v, SdpaOptions::default().sinks(float(&sinks)));
    case.check(&result, false);
    case.check_grads(&result, &grad_out);
}
