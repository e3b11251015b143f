//! `attn run` end to end: the built binary runs on files written to a temporary directory, its
//! `out`, `lse` and `weights` are checked against the `f64` reference with the project's
//! tolerance rule, its gradients (`dq`, `dk`, `dv`, `dbias` when given `grad_out`) against the
//! `f64` reference backward with the gradient rule, and malformed inputs give exit code 1 with
//! one `error:` line and no panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use attn::{Align, Mask, SdpaOptions};
use attn_cli::io::{read_safetensors, write_npy, write_safetensors, HostData, HostTensor};
use attn_kernels::rng::SplitMix64;
use attn_kernels::{
    attention, attention_backward, reference, reference_backward, AttnGrads, Kernel, KvView, Real, Saved, View4,
};
use attn_testkit::oracle::{check, GRADIENT_FACTOR, OUTPUT_FACTOR};
use candle_core::WithDType;
use half::{bf16, f16};

/// Seeded values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    SplitMix64::new(seed).uniform(n, -1.0, 1.0)
}

fn tensor(shape: &[usize], data: HostData) -> HostTensor {
    HostTensor::new(shape.to_vec(), data).unwrap()
}

fn f32_tensor(shape: &[usize], seed: u64) -> HostTensor {
    tensor(shape, HostData::F32(values(shape.iter().product(), seed)))
}

fn write(path: &Path, tensors: &[(&str, &HostTensor)]) {
    write_safetensors(path, tensors).unwrap();
}

fn attn(args: &[&str], files: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn"));
    cmd.arg("run").args(args).args(files);
    cmd.output().unwrap()
}

fn f32_of(t: &HostTensor) -> Vec<f32> {
    t.to_f32_vec().unwrap()
}

/// Inputs and the options the CLI should have derived from its flags and files.
struct Case<'a> {
    q: &'a HostTensor,
    k: &'a HostTensor,
    v: &'a HostTensor,
    opts: SdpaOptions,
}

impl<'a> Case<'a> {
    fn new(q: &'a HostTensor, k: &'a HostTensor, v: &'a HostTensor, opts: SdpaOptions) -> Self {
        Self { q, k, v, opts }
    }

    /// The reference in precision `T` on the stored values, with the kernel parameters of `opts`.
    fn reference<T: Real + WithDType>(&self, weights: bool) -> attn_kernels::AttnOutput<T> {
        let conv = |t: &HostTensor| -> Vec<T> { f32_of(t).iter().map(|&x| T::from_f32(x).unwrap()).collect() };
        let dims = |t: &HostTensor| -> [usize; 4] { t.shape.clone().try_into().unwrap() };
        let (qd, kd, vd) = (conv(self.q), conv(self.k), conv(self.v));
        let host = self.opts.kernel_params::<T>().unwrap();
        reference(
            &View4::contiguous("q", &qd, dims(self.q)).unwrap(),
            &View4::contiguous("k", &kd, dims(self.k)).unwrap(),
            &View4::contiguous("v", &vd, dims(self.v)).unwrap(),
            &host.attn_params().unwrap(),
            weights,
        )
        .unwrap()
    }

    /// The reference backward in precision `T` after its own forward, for the output gradient
    /// `dout` (`dbias` too when the options hold a bias).
    fn reference_grads<T: Real + WithDType>(&self, dout: &HostTensor) -> AttnGrads<T> {
        let conv = |t: &HostTensor| -> Vec<T> { f32_of(t).iter().map(|&x| T::from_f32(x).unwrap()).collect() };
        let dims = |t: &HostTensor| -> [usize; 4] { t.shape.clone().try_into().unwrap() };
        let (qd, kd, vd, gd) = (conv(self.q), conv(self.k), conv(self.v), conv(dout));
        let host = self.opts.kernel_params::<T>().unwrap();
        let params = host.attn_params().unwrap();
        let q = View4::contiguous("q", &qd, dims(self.q)).unwrap();
        let k = View4::contiguous("k", &kd, dims(self.k)).unwrap();
        let v = View4::contiguous("v", &vd, dims(self.v)).unwrap();
        let fwd = reference(&q, &k, &v, &params, false).unwrap();
        let out = View4::contiguous("out", &fwd.out, dims(dout)).unwrap();
        let dout = View4::contiguous("grad_out", &gd, dims(dout)).unwrap();
        reference_backward(&q, &k, &v, &Saved { out, lse: &fwd.lse, dout }, &params, true).unwrap()
    }

    /// Checks the CLI's gradients against the `f64` reference backward under the gradient rule
    /// (baseline error: the `f32` reference backward); `dbias` must be written exactly when the
    /// options hold a bias, in the bias's shape.
    fn check_grads(&self, result: &BTreeMap<String, HostTensor>, dout: &HostTensor) {
        let (g64, g32) = (self.reference_grads::<f64>(dout), self.reference_grads::<f32>(dout));
        let mut expected = vec![
            ("dq", self.q.shape.clone(), g64.dq, g32.dq),
            ("dk", self.k.shape.clone(), g64.dk, g32.dk),
            ("dv", self.v.shape.clone(), g64.dv, g32.dv),
        ];
        match &self.opts.bias {
            Some(bias) => expected.push(("dbias", bias.dims().to_vec(), g64.dbias.unwrap(), g32.dbias.unwrap())),
            None => assert!(!result.contains_key("dbias"), "dbias written without a bias"),
        }
        for (name, shape, want64, want32) in expected {
            let got = result.get(name).unwrap_or_else(|| panic!("{name} not written"));
            assert_eq!(got.shape, shape, "{name} shape");
            let HostData::F32(got) = &got.data else { panic!("{name} is {}, expected F32", got.dtype_name()) };
            assert!(got.iter().any(|&x| x != 0.0), "{name} is all zero");
            check(name, got, &want64, &want32, GRADIENT_FACTOR).unwrap();
        }
    }

    /// Checks the CLI's outputs against the `f64` reference (baseline error: the `f32` one); the
    /// gradients, if any, are left to [`Case::check_grads`].
    fn check(&self, result: &BTreeMap<String, HostTensor>, weights: bool) {
        let r64 = self.reference::<f64>(weights);
        let r32 = self.reference::<f32>(weights);
        let [b, hq, lq, _] = self.q.shape[..] else { panic!("q rank") };
        let (lk, dv) = (self.k.shape[2], self.v.shape[3]);
        let mut expected =
            vec![("out", vec![b, hq, lq, dv], r64.out, r32.out), ("lse", vec![b, hq, lq], r64.lse, r32.lse)];
        if weights {
            expected.push(("weights", vec![b, hq, lq, lk], r64.weights.unwrap(), r32.weights.unwrap()));
        }
        let written: Vec<_> = result.keys().filter(|n| !GRADIENTS.contains(&n.as_str())).collect();
        assert_eq!(written.len(), expected.len(), "tensors written: {:?}", result.keys().collect::<Vec<_>>());
        for (name, shape, want64, want32) in expected {
            let got = &result[name];
            assert_eq!(got.shape, shape, "{name} shape");
            let HostData::F32(got) = &got.data else { panic!("{name} is {}, expected F32", got.dtype_name()) };
            check(name, got, &want64, &want32, OUTPUT_FACTOR).unwrap();
        }
    }
}

/// The names of the gradients `attn run` writes.
const GRADIENTS: [&str; 4] = ["dq", "dk", "dv", "dbias"];

fn run_ok(args: &[&str], files: &[&Path], out: &Path) -> (BTreeMap<String, HostTensor>, String) {
    let o = attn(args, files);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "attn run failed: {stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    (read_safetensors(out).unwrap(), stdout)
}

fn out_path(dir: &Path) -> PathBuf {
    dir.join("out.safetensors")
}

#[test]
fn output_matches_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[2, 4, 5, 8], 1), f32_tensor(&[2, 2, 7, 8], 2), f32_tensor(&[2, 2, 7, 6], 3));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
    let out = out_path(dir.path());
    let (result, stdout) =
        run_ok(&["--causal", "--align", "bottom-right", "-o", out.to_str().unwrap()], &[&input], &out);
    let case = Case::new(&q, &k, &v, SdpaOptions::default().causal(true).align(Align::BottomRight));
    case.check(&result, false);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("out.safetensors") && stdout.contains("q [2, 4, 5, 8]"), "{stdout}");
}

#[test]
fn weights_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[1, 2, 6, 4], 4), f32_tensor(&[1, 2, 6, 4], 5), f32_tensor(&[1, 2, 6, 4], 6));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
    let out = out_path(dir.path());
    let args = [
        "--weights",
        "--window",
        "2,-1",
        "--scale",
        "-0.7",
        "--softcap",
        "1.5",
        "--kernel",
        "reference",
        "-o",
        out.to_str().unwrap(),
    ];
    let (result, _) = run_ok(&args, &[&input], &out);
    let case = Case::new(&q, &k, &v, SdpaOptions::default().window(Some(2), None).scale(-0.7).softcap(1.5));
    case.check(&result, true);
}

#[test]
fn mask_bias_key_lengths_and_half_precision() {
    let dir = tempfile::tempdir().unwrap();
    let (b, hq, lq, lk, d) = (2, 2, 3, 5, 4);
    let q = f32_tensor(&[b, hq, lq, d], 7);
    let k = tensor(&[b, 1, lk, d], HostData::F16(values(b * lk * d, 8).into_iter().map(f16::from_f32).collect()));
    let v = tensor(&[b, 1, lk, d], HostData::Bf16(values(b * lk * d, 9).into_iter().map(bf16::from_f32).collect()));
    let mask_bytes = values(b * lq * lk, 10).iter().map(|&x| u8::from(x > -0.5) * 3).collect();
    let mask = tensor(&[b, 1, lq, lk], HostData::U8(mask_bytes));
    let bias = tensor(&[lk], HostData::F64(values(lk, 11).into_iter().map(f64::from).collect()));
    let key_lengths = tensor(&[b], HostData::I64(vec![4, 2]));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v), ("mask", &mask), ("bias", &bias), ("key_lengths", &key_lengths)]);
    let out = out_path(dir.path());
    let (result, stdout) = run_ok(&["--weights", "-o", out.to_str().unwrap()], &[&input], &out);
    let opts = SdpaOptions::default()
        .mask(Mask::keep(mask.clone().into_mask_tensor().unwrap()))
        .bias(bias.clone().into_float_tensor().unwrap())
        .key_lengths(vec![4, 2]);
    Case::new(&q, &k, &v, opts).check(&result, true);
    assert!(stdout.contains("k [2, 1, 5, 4] F16") && stdout.contains("key_lengths [2] I64"), "{stdout}");
    let HostData::F32(w) = &result["weights"].data else { panic!() };
    // Batch 1 has two valid keys: weights of keys 2.. are zero.
    assert!(w[(hq * lq) * lk..].chunks(lk).all(|row| row[2..].iter().all(|&x| x == 0.0)));
}

#[test]
fn npy_inputs_with_dropout() {
    let dir = tempfile::tempdir().unwrap();
    let q = tensor(&[1, 2, 4, 3], HostData::F64(values(24, 12).into_iter().map(f64::from).collect()));
    let (k, v) = (f32_tensor(&[1, 1, 4, 3], 13), f32_tensor(&[1, 1, 4, 2], 14));
    let mask = tensor(&[4, 4], HostData::Bool((0..16).map(|i| i % 5 != 1).collect()));
    let paths: Vec<PathBuf> = ["q", "k", "v", "mask"].iter().map(|n| dir.path().join(format!("{n}.npy"))).collect();
    for (p, t) in paths.iter().zip([&q, &k, &v, &mask]) {
        write_npy(p, t).unwrap();
    }
    let out = out_path(dir.path());
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let args = [
        "--q".into(),
        s(&paths[0]),
        "--k".into(),
        s(&paths[1]),
        "--v".into(),
        s(&paths[2]),
        "--mask".into(),
        s(&paths[3]),
        "--dropout".into(),
        "0.3".into(),
        "--seed".into(),
        "99".into(),
        "-o".into(),
        s(&out),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (result, _) = run_ok(&args, &[], &out);
    let opts = SdpaOptions::default().mask(Mask::keep(mask.clone().into_mask_tensor().unwrap())).dropout(0.3, 99);
    Case::new(&q, &k, &v, opts).check(&result, false);
}

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

/// Writes each `(name, tensor)` to `name.npy` in `dir` and returns the `--name path` arguments.
fn npy_args(dir: &Path, tensors: &[(&str, &HostTensor)]) -> Vec<String> {
    let mut args = Vec::new();
    for (name, t) in tensors {
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, t).unwrap();
        args.push(format!("--{}", name.replace('_', "-")));
        args.push(path.to_str().unwrap().to_string());
    }
    args
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

/// `kernel`'s forward then backward on contiguous `f32` inputs under `opts`: `(dq, dk, dv)`.
fn kernel_grads(
    kernel: Kernel,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    dout: &HostTensor,
    opts: &SdpaOptions,
) -> AttnGrads<f32> {
    let dims = |t: &HostTensor| -> [usize; 4] { t.shape.clone().try_into().unwrap() };
    let (qd, kd, vd, gd) = (f32_of(q), f32_of(k), f32_of(v), f32_of(dout));
    let host = opts.kernel_params::<f32>().unwrap();
    let params = host.attn_params().unwrap();
    let qv = View4::contiguous("q", &qd, dims(q)).unwrap();
    let kv = KvView::F32(View4::contiguous("k", &kd, dims(k)).unwrap());
    let vv = KvView::F32(View4::contiguous("v", &vd, dims(v)).unwrap());
    let fwd = attention(kernel, &qv, &kv, &vv, &params, false).unwrap();
    let out = View4::contiguous("out", &fwd.out, dims(dout)).unwrap();
    let dout = View4::contiguous("grad_out", &gd, dims(dout)).unwrap();
    attention_backward(kernel, &qv, &kv, &vv, &Saved { out, lse: &fwd.lse, dout }, &params, false).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
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

/// Runs a failing command and returns its single stderr line.
fn run_err(args: &[&str], files: &[&Path]) -> String {
    let o = attn(args, files);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "exit status for stderr {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// Writes `tensors` to `in.safetensors` and runs on it, expecting a failure.
fn fails_on(tensors: &[(&str, &HostTensor)], extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write(&input, tensors);
    let out = out_path(dir.path());
    let mut args = vec!["-o", out.to_str().unwrap()];
    args.extend(extra);
    let e = run_err(&args, &[&input]);
    assert!(!out.exists(), "output written despite the error");
    e
}

#[test]
fn missing_tensor() {
    let (q, k) = (f32_tensor(&[1, 1, 2, 2], 1), f32_tensor(&[1, 1, 2, 2], 2));
    let e = fails_on(&[("q", &q), ("k", &k)], &[]);
    assert!(e.contains("in.safetensors: tensor 'v': missing; found k, q"), "{e}");
}

#[test]
fn unknown_tensor_name() {
    let q = f32_tensor(&[1, 1, 2, 2], 1);
    let e = fails_on(&[("q", &q), ("k", &q), ("v", &q), ("keys", &q)], &[]);
    assert!(e.contains("tensor 'keys': unknown tensor name") && e.contains("key_lengths, grad_out"), "{e}");
}

#[test]
fn wrong_rank() {
    let (q, kv) = (f32_tensor(&[1, 2, 2], 1), f32_tensor(&[1, 1, 2, 2], 2));
    let e = fails_on(&[("q", &q), ("k", &kv), ("v", &kv)], &[]);
    assert!(e.contains("tensor 'q': shape [1, 2, 2], expected rank 4"), "{e}");
}

#[test]
fn grad_out_of_the_wrong_shape_or_type_is_refused_before_computing() {
    let (q, k, v) = (f32_tensor(&[1, 2, 3, 4], 1), f32_tensor(&[1, 1, 5, 4], 2), f32_tensor(&[1, 1, 5, 2], 3));
    // `[B, Hq, Lq, Dk]` instead of `[B, Hq, Lq, Dv]`.
    let wrong = f32_tensor(&[1, 2, 3, 4], 4);
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("grad_out", &wrong)], &[]);
    let want = "in.safetensors: tensor 'grad_out': shape [1, 2, 3, 4], expected [B, Hq, Lq, Dv] = [1, 2, 3, 2]";
    assert!(e.contains(want), "{e}");
    // Refused before the library runs: an option it would refuse is not reached.
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("grad_out", &wrong)], &["--dropout", "1.5"]);
    assert!(e.contains("tensor 'grad_out'"), "{e}");
    let ints = tensor(&[1, 2, 3, 2], HostData::I64(vec![0; 12]));
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("grad_out", &ints)], &[]);
    assert!(e.contains("in.safetensors: tensor 'grad_out': dtype I64, expected F16, BF16, F32 or F64"), "{e}");
    // The .npy form names the file of `grad_out`.
    let dir = tempfile::tempdir().unwrap();
    let out = out_path(dir.path());
    let mut args = npy_args(dir.path(), &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &wrong)]);
    args.extend(["-o".into(), out.to_str().unwrap().into()]);
    let e = run_err(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(e.contains("grad_out.npy: tensor 'grad_out': shape [1, 2, 3, 4]"), "{e}");
    assert!(!out.exists(), "output written despite the error");
}

#[test]
fn mismatched_dims() {
    let (q, k, v) = (f32_tensor(&[2, 1, 2, 4], 1), f32_tensor(&[3, 1, 2, 4], 2), f32_tensor(&[2, 1, 2, 4], 3));
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v)], &[]);
    assert!(e.contains("in.safetensors: k: dimension batch is 3, expected 2"), "{e}");
    // The same with gradients of a bias, where the library joins k and v before its own checks.
    let (bias, grad_out) = (f32_tensor(&[2, 2], 4), f32_tensor(&[2, 1, 2, 4], 5));
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("bias", &bias), ("grad_out", &grad_out)], &[]);
    assert!(e.contains("in.safetensors: k: dimension batch is 3, expected 2"), "{e}");
}

#[test]
fn mask_that_does_not_broadcast() {
    let kv = f32_tensor(&[1, 1, 3, 2], 1);
    let mask = tensor(&[2, 3], HostData::Bool(vec![true; 6]));
    let e = fails_on(&[("q", &kv), ("k", &kv), ("v", &kv), ("mask", &mask)], &[]);
    assert!(e.contains("mask: shape [2, 3] does not broadcast to [1, 1, 3, 3]"), "{e}");
}

#[test]
fn wrong_dtype_and_negative_key_length() {
    let kv = f32_tensor(&[1, 1, 3, 2], 1);
    let q = tensor(&[1, 1, 3, 2], HostData::I32(vec![0; 6]));
    let e = fails_on(&[("q", &q), ("k", &kv), ("v", &kv)], &[]);
    assert!(e.contains("tensor 'q': dtype I32, expected F16, BF16, F32 or F64"), "{e}");
    let kl = tensor(&[1], HostData::I32(vec![-2]));
    let e = fails_on(&[("q", &kv), ("k", &kv), ("v", &kv), ("key_lengths", &kl)], &[]);
    assert!(e.contains("tensor 'key_lengths': element 0 is -2, expected >= 0"), "{e}");
}

#[test]
fn bad_option_value() {
    let kv = f32_tensor(&[1, 1, 3, 2], 1);
    let e = fails_on(&[("q", &kv), ("k", &kv), ("v", &kv)], &["--dropout", "1.5"]);
    assert!(e.contains("option --dropout: p = 1.5"), "{e}");
}

#[test]
fn corrupt_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.safetensors");
    let kv = f32_tensor(&[1, 1, 3, 2], 1);
    write(&input, &[("q", &kv), ("k", &kv), ("v", &kv)]);
    let bytes = std::fs::read(&input).unwrap();
    std::fs::write(&input, &bytes[..bytes.len() - 3]).unwrap();
    let out = out_path(dir.path());
    let e = run_err(&["-o", out.to_str().unwrap()], &[&input]);
    assert!(e.contains("bad.safetensors") && e.contains("data offsets"), "{e}");
}

#[test]
fn corrupt_npy_names_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let kv = f32_tensor(&[1, 1, 3, 2], 1);
    let (q, k, v) = (dir.path().join("q.npy"), dir.path().join("k.npy"), dir.path().join("v.npy"));
    for p in [&q, &k, &v] {
        write_npy(p, &kv).unwrap();
    }
    std::fs::write(&k, b"\x93NUMPY\x01\x00\xff\xff{}").unwrap();
    let out = out_path(dir.path());
    let args = ["--q", q.to_str().unwrap(), "--k", k.to_str().unwrap(), "--v", v.to_str().unwrap()];
    let e = run_err(&[&args[..], &["-o", out.to_str().unwrap()]].concat(), &[]);
    assert!(e.contains("k.npy: header length 65535 exceeds file size 12"), "{e}");
}
