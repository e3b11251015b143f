//! `attn run` refusals: malformed or inconsistent inputs give exit code 1 with one `error:` line
//! naming the file, tensor or option, and no panic.

use crate::common;

use common::*;

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
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("grad_out", &wrong)], &["--scale", "inf"]);
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
    let e = fails_on(&[("q", &kv), ("k", &kv), ("v", &kv)], &["--scale", "inf"]);
    assert!(e.contains("option --scale: inf is not finite"), "{e}");
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

#[test]
fn bad_sinks_are_named() {
    let (q, kv) = (f32_tensor(&[1, 2, 3, 4], 1), f32_tensor(&[1, 1, 3, 4], 2));
    let base = [("q", &q), ("k", &kv), ("v", &kv)];
    let with = |sinks: &HostTensor| fails_on(&[base.as_slice(), &[("sinks", sinks)]].concat(), &[]);
    let e = with(&f32_tensor(&[3], 3));
    assert!(e.contains("in.safetensors: sinks: dimension heads is 3, expected 2"), "{e}");
    let e = with(&f32_tensor(&[1, 2], 4));
    assert!(e.contains("in.safetensors: tensor 'sinks': shape [1, 2], expected rank 1 [Hq]"), "{e}");
    let e = with(&tensor(&[2], HostData::I64(vec![0, 1])));
    assert!(e.contains("in.safetensors: tensor 'sinks': dtype I64, expected F16, BF16, F32 or F64"), "{e}");
    let e = with(&tensor(&[2], HostData::F32(vec![0.0, f32::NAN])));
    assert!(e.contains("in.safetensors: sinks: entry 1 is NaN; expected a finite logit, or -inf for no sink"), "{e}");
}
