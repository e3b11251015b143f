//! What the `attn run` suites share: seeded host tensors, running the built binary on files in a
//! temporary directory, a test case checked against the `f64` reference, and the kernels'
//! gradients for comparison.

// Each test binary uses its own subset of these helpers and re-exports.
#![allow(dead_code, unused_imports)]

pub use std::collections::BTreeMap;
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Output};

pub use attn::{Align, Mask, SdpaOptions};
pub use attn_cli::io::{read_safetensors, write_npy, write_safetensors, HostData, HostTensor};
pub use attn_kernels::{
    attention, attention_backward, reference, reference_backward, AttnGrads, Kernel, KvView, Real, Saved, View4,
};
pub use attn_testkit::oracle::{check, GRADIENT_FACTOR, OUTPUT_FACTOR};
pub use candle_core::WithDType;
pub use half::{bf16, f16};

/// `n` values uniform in `[-1, 1)` from the library's SplitMix64 stream of `seed`.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    attn::random::SplitMix64::new(seed).uniform(n, -1.0, 1.0)
}

pub fn tensor(shape: &[usize], data: HostData) -> HostTensor {
    HostTensor::new(shape.to_vec(), data).unwrap()
}

pub fn f32_tensor(shape: &[usize], seed: u64) -> HostTensor {
    tensor(shape, HostData::F32(values(shape.iter().product(), seed)))
}

pub fn write(path: &Path, tensors: &[(&str, &HostTensor)]) {
    write_safetensors(path, tensors).unwrap();
}

pub fn attn(args: &[&str], files: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn"));
    cmd.arg("run").args(args).args(files);
    cmd.output().unwrap()
}

pub fn f32_of(t: &HostTensor) -> Vec<f32> {
    t.to_f32_vec().unwrap()
}

/// Runs `attn ARGS` (any subcommand) through `sh -c 'SETUP && exec attn ARGS'`, for shell-only
/// settings such as the umask or `ulimit`.
pub fn attn_in_shell(setup: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("{setup} && exec \"$@\""))
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap()
}

/// Inputs and the options the CLI should have derived from its flags and files.
pub struct Case<'a> {
    q: &'a HostTensor,
    k: &'a HostTensor,
    v: &'a HostTensor,
    opts: SdpaOptions,
}

impl<'a> Case<'a> {
    pub fn new(q: &'a HostTensor, k: &'a HostTensor, v: &'a HostTensor, opts: SdpaOptions) -> Self {
        Self { q, k, v, opts }
    }

    /// The reference in precision `T` on the stored values, with the kernel parameters of `opts`.
    pub fn reference<T: Real + WithDType>(&self, weights: bool) -> attn_kernels::AttnOutput<T> {
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
    pub fn reference_grads<T: Real + WithDType>(&self, dout: &HostTensor) -> AttnGrads<T> {
        let conv = |t: &HostTensor| -> Vec<T> { f32_of(t).iter().map(|&x| T::from_f32(x).unwrap()).collect() };
        let dims = |t: &HostTensor| -> [usize; 4] { t.shape.clone().try_into().unwrap() };
        let (qd, kd, vd, gd) = (conv(self.q), conv(self.k), conv(self.v), conv(dout));
        let host = self.opts.kernel_params::<T>().unwrap();
        let params = host.attn_params().unwrap();
        let q = View4::contiguous("q", &qd, dims(self.q)).unwrap();
        let k = View4::contiguous("k", &kd, dims(self.k)).unwrap();
        let v = View4::contiguous("v", &vd, dims(self.v)).unwrap();
        let fwd = reference(&q, &k, &v, &params, false).unwrap();
        let saved = Saved::of(&fwd, dims(dout), View4::contiguous("grad_out", &gd, dims(dout)).unwrap()).unwrap();
        reference_backward(&q, &k, &v, &saved, &params, true).unwrap()
    }

    /// Checks the CLI's gradients against the `f64` reference backward under the gradient rule
    /// (baseline error: the `f32` reference backward); `dbias` and `dsinks` must be written exactly
    /// when the options hold a bias and sinks, in their shapes.
    pub fn check_grads(&self, result: &BTreeMap<String, HostTensor>, dout: &HostTensor) {
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
        match &self.opts.sinks {
            Some(s) => expected.push(("dsinks", s.dims().to_vec(), g64.dsinks.unwrap(), g32.dsinks.unwrap())),
            None => assert!(!result.contains_key("dsinks"), "dsinks written without sinks"),
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
    pub fn check(&self, result: &BTreeMap<String, HostTensor>, weights: bool) {
        let r64 = self.reference::<f64>(weights);
        let r32 = self.reference::<f32>(weights);
        let [b, hq, lq, _] = self.q.shape[..] else { panic!("q rank") };
        let (lk, dv) = (self.k.shape[2], self.v.shape[3]);
        let mut expected =
            vec![("out", vec![b, hq, lq, dv], r64.out, r32.out), ("lse", vec![b, hq, lq], r64.lse, r32.lse)];
        if weights {
            // The masked cells are those the reference gives weight 0 (the seeded inputs are too
            // small for an unmasked weight to underflow).
            let keep: Vec<bool> = r64.weights.as_ref().unwrap().iter().map(|&w| w != 0.0).collect();
            let want = HostTensor::new(vec![b, hq, lq, lk], HostData::Bool(keep)).unwrap();
            assert_eq!(result.get("mask"), Some(&want), "mask: the cells the reference masks");
            expected.push(("weights", vec![b, hq, lq, lk], r64.weights.unwrap(), r32.weights.unwrap()));
        }
        let written: Vec<_> = result.keys().filter(|n| !GRADIENTS.contains(&n.as_str()) && *n != "mask").collect();
        assert_eq!(written.len(), expected.len(), "tensors written: {:?}", result.keys().collect::<Vec<_>>());
        assert_eq!(result.contains_key("mask"), weights, "mask is written exactly with --weights");
        for (name, shape, want64, want32) in expected {
            let got = &result[name];
            assert_eq!(got.shape, shape, "{name} shape");
            let HostData::F32(got) = &got.data else { panic!("{name} is {}, expected F32", got.dtype_name()) };
            check(name, got, &want64, &want32, OUTPUT_FACTOR).unwrap();
        }
    }
}

/// The names of the gradients `attn run` writes.
pub const GRADIENTS: [&str; 5] = ["dq", "dk", "dv", "dbias", "dsinks"];

pub fn run_ok(args: &[&str], files: &[&Path], out: &Path) -> (BTreeMap<String, HostTensor>, String) {
    let o = attn(args, files);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "attn run failed: {stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    (read_safetensors(out).unwrap(), stdout)
}

pub fn out_path(dir: &Path) -> PathBuf {
    dir.join("out.safetensors")
}

/// Writes each `(name, tensor)` to `name.npy` in `dir` and returns the `--name path` arguments.
pub fn npy_args(dir: &Path, tensors: &[(&str, &HostTensor)]) -> Vec<String> {
    let mut args = Vec::new();
    for (name, t) in tensors {
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, t).unwrap();
        args.push(format!("--{}", name.replace('_', "-")));
        args.push(path.to_str().unwrap().to_string());
    }
    args
}

/// `kernel`'s forward then backward on contiguous `f32` inputs under `opts`: `(dq, dk, dv)`.
pub fn kernel_grads(
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
    let saved = Saved::of(&fwd, dims(dout), View4::contiguous("grad_out", &gd, dims(dout)).unwrap()).unwrap();
    attention_backward(kernel, &qv, &kv, &vv, &saved, &params, false).unwrap()
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Runs a failing command and returns its single stderr line.
pub fn run_err(args: &[&str], files: &[&Path]) -> String {
    let o = attn(args, files);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "exit status for stderr {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// Writes `tensors` to `in.safetensors` and runs on it, expecting a failure.
pub fn fails_on(tensors: &[(&str, &HostTensor)], extra: &[&str]) -> String {
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

/// Checks that `out`, the result of `attn ARGS`, is a refusal: exit code 1 and one `error:` line
/// (no panic) containing every string of `wanted`; returns that line.
pub fn assert_refused(args: &[&str], out: Output, wanted: &[&str]) -> String {
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}: stderr {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: stderr {stderr}");
    assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{args:?}: stderr {stderr}");
    for w in wanted {
        assert!(stderr.contains(w), "{args:?}: {w:?} not in {stderr}");
    }
    stderr
}
