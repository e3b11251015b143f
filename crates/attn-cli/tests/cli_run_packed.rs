//! `attn run` on packed variable-length sequences (`cu_seqlens_q`, `cu_seqlens_k` in INPUT): `out`,
//! `lse` and the gradients against each sequence run alone through the `f64` reference (under the
//! oracle rule, the `f32` reference as baseline) with the flags applied within each sequence; and
//! the refusals, each one line naming the file and the tensor or option.

use crate::common;

use std::ops::Range;

use common::*;

/// The rows `rows` of a packed `[total, H, D]` F32 tensor as a `[1, H, len, D]` tensor.
fn alone(t: &HostTensor, rows: &Range<usize>) -> HostTensor {
    let (h, d) = (t.shape[1], t.shape[2]);
    let x = f32_of(t);
    let data = (0..h).flat_map(|hi| rows.clone().flat_map(move |r| (0..d).map(move |c| (r * h + hi) * d + c)));
    tensor(&[1, h, rows.len(), d], HostData::F32(data.map(|i| x[i]).collect()))
}

/// Puts a head-major `[1, H, len, D]` result of sequence rows `rows` into the packed `[total, H, D]`.
fn put<T: Copy>(seq: &[T], packed: &mut [T], rows: &Range<usize>, h: usize, d: usize) {
    for (i, r) in rows.clone().enumerate() {
        for hi in 0..h {
            let from = (hi * rows.len() + i) * d;
            packed[(r * h + hi) * d..(r * h + hi + 1) * d].copy_from_slice(&seq[from..from + d]);
        }
    }
}

/// `(out, lse, dq, dk, dv)` in the packed layouts, each sequence alone through the reference in `T`.
type Packed<T> = [Vec<T>; 5];

fn each_alone<T: Real + WithDType>(
    [q, k, v, dout]: [&HostTensor; 4],
    [cq, ck]: [&[usize]; 2],
    opts: &SdpaOptions,
) -> Packed<T> {
    let (tq, hq, dk, tk, hkv, dv) = (q.shape[0], q.shape[1], q.shape[2], k.shape[0], k.shape[1], v.shape[2]);
    let mut r: Packed<T> = [
        vec![T::zero(); tq * hq * dv],
        vec![T::neg_infinity(); hq * tq],
        vec![T::zero(); tq * hq * dk],
        vec![T::zero(); tk * hkv * dk],
        vec![T::zero(); tk * hkv * dv],
    ];
    for s in 0..cq.len() - 1 {
        let (qr, kr) = (cq[s]..cq[s + 1], ck[s]..ck[s + 1]);
        let (qs, ks, vs, ds) = (alone(q, &qr), alone(k, &kr), alone(v, &kr), alone(dout, &qr));
        let case = Case::new(&qs, &ks, &vs, opts.clone());
        let (fwd, g) = (case.reference::<T>(false), case.reference_grads::<T>(&ds));
        put(&fwd.out, &mut r[0], &qr, hq, dv);
        for h in 0..hq {
            r[1][h * tq + qr.start..h * tq + qr.end].copy_from_slice(&fwd.lse[h * qr.len()..(h + 1) * qr.len()]);
        }
        put(&g.dq, &mut r[2], &qr, hq, dk);
        put(&g.dk, &mut r[3], &kr, hkv, dk);
        put(&g.dv, &mut r[4], &kr, hkv, dv);
    }
    r
}

/// Packed inputs of sequences `lens` (`(Lq, Lk)` each) with `heads` `(Hq, Hkv)` written to an INPUT
/// file in `dir`: its path, then `q`, `k`, `v`, `grad_out` and the offsets `cu_seqlens_q`,
/// `cu_seqlens_k`.
struct PackedInput {
    path: std::path::PathBuf,
    tensors: [HostTensor; 4],
    cu: [Vec<usize>; 2],
}

fn packed_input(dir: &std::path::Path, lens: &[(usize, usize)], heads: (usize, usize)) -> PackedInput {
    let (cq, ck) = (
        attn::cu_seqlens(&lens.iter().map(|l| l.0).collect::<Vec<_>>()),
        attn::cu_seqlens(&lens.iter().map(|l| l.1).collect::<Vec<_>>()),
    );
    let (tq, tk, (hq, hkv), dk, dv) = (*cq.last().unwrap(), *ck.last().unwrap(), heads, 8, 6);
    let (q, k, v) = (f32_tensor(&[tq, hq, dk], 1), f32_tensor(&[tk, hkv, dk], 2), f32_tensor(&[tk, hkv, dv], 3));
    let grad_out = tensor(&[tq, hq, dv], HostData::F64(values(tq * hq * dv, 4).into_iter().map(f64::from).collect()));
    let cu_q = tensor(&[cq.len()], HostData::I32(cq.iter().map(|&x| x as i32).collect()));
    let cu_k = tensor(&[ck.len()], HostData::I64(ck.iter().map(|&x| x as i64).collect()));
    let path = dir.join("in.safetensors");
    write(
        &path,
        &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &grad_out), ("cu_seqlens_q", &cu_q), ("cu_seqlens_k", &cu_k)],
    );
    PackedInput { path, tensors: [q, k, v, grad_out], cu: [cq, ck] }
}

/// Runs `attn run FLAGS` on packed inputs and checks every output against each sequence alone.
fn check_packed(lens: &[(usize, usize)], heads: (usize, usize), flags: &[&str], opts: SdpaOptions) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = packed_input(dir.path(), lens, heads);
    let [q, k, v, grad_out] = &input.tensors;
    let [cq, ck] = &input.cu;
    let (tq, tk, (hq, hkv), dk, dv) = (*cq.last().unwrap(), *ck.last().unwrap(), heads, 8, 6);
    let out = out_path(dir.path());
    let mut args = flags.to_vec();
    args.extend(["-o", out.to_str().unwrap()]);
    let (result, stdout) = run_ok(&args, &[&input.path], &out);
    let inputs = [q, k, v, grad_out];
    let (r64, r32) = (each_alone::<f64>(inputs, [cq, ck], &opts), each_alone::<f32>(inputs, [cq, ck], &opts));
    let shapes = [vec![tq, hq, dv], vec![hq, tq], vec![tq, hq, dk], vec![tk, hkv, dk], vec![tk, hkv, dv]];
    for (i, name) in ["out", "lse", "dq", "dk", "dv"].into_iter().enumerate() {
        let got = result.get(name).unwrap_or_else(|| panic!("{name} not written"));
        assert_eq!(got.shape, shapes[i], "{name} shape");
        let factor = if i < 2 { OUTPUT_FACTOR } else { GRADIENT_FACTOR };
        check(name, &f32_of(got), &r64[i], &r32[i], factor).unwrap();
    }
    assert_eq!(result.len(), 5, "{:?}", result.keys().collect::<Vec<_>>());
    stdout
}

/// With `--compute bf16` the summary counts the packed sequences that decode (each sequence is a
/// call of its own, and a decode-length one computes in f32).
#[test]
fn the_summary_names_the_products_of_each_sequence() {
    let dir = tempfile::tempdir().unwrap();
    for (lens, text) in [
        (&[(40, 40), (1, 40), (30, 30)][..], Some("+bf16 (f32: 1 of 3 decode-length sequences)")),
        (&[(1, 40), (2, 9)][..], None),
        (&[(40, 40), (30, 30)][..], Some("+bf16 ")),
    ] {
        let input = packed_input(dir.path(), lens, (2, 2));
        let out = out_path(dir.path());
        let (_, stdout) = run_ok(&["--compute", "bf16", "-o", out.to_str().unwrap()], &[&input.path], &out);
        assert_eq!(stdout.contains("+bf16"), text.is_some(), "{lens:?}: {stdout}");
        assert!(stdout.contains(text.unwrap_or("")), "{lens:?}: {stdout}");
    }
}

#[test]
fn causal_bottom_right_with_different_lengths_per_sequence() {
    let lens = [(5, 9), (11, 4), (0, 3), (7, 7), (3, 0)];
    let opts = SdpaOptions::default().causal(true).align(Align::BottomRight);
    let stdout = check_packed(&lens, (4, 2), &["--causal", "--align", "bottom-right"], opts);
    assert!(stdout.contains("cu_seqlens_q [6] I32") && stdout.contains("out [26, 4, 6]"), "{stdout}");
}

#[test]
fn window_within_each_sequence_and_the_reference_kernel() {
    let lens = [(9, 9), (6, 6), (12, 12)];
    let opts = SdpaOptions::default().window(Some(2), Some(1)).kernel(Kernel::Reference);
    check_packed(&lens, (2, 2), &["--window", "2,1", "--kernel", "reference"], opts);
}

/// Runs `attn run` on `tensors` with `flags`; returns stderr, asserting the run failed and wrote
/// nothing.
/// Sinks in INPUT join every sequence's rows: `out`, `lse` and, with `grad_out`, `dq`, `dk`, `dv`
/// and `dsinks` are the library's packed call with the same sinks (its autograd for the gradients).
#[test]
fn sinks_join_every_sequence_and_get_their_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let input = packed_input(dir.path(), &[(5, 9), (11, 4), (7, 7)], (4, 2));
    let sinks = f32_tensor(&[4], 5);
    let with_sinks = dir.path().join("sinks.safetensors");
    let [q, k, v, grad_out] = &input.tensors;
    let (cu_q, cu_k) = (&input.cu[0], &input.cu[1]);
    let offsets = |cu: &[usize]| tensor(&[cu.len()], HostData::I64(cu.iter().map(|&x| x as i64).collect()));
    let (oq, ok) = (offsets(cu_q), offsets(cu_k));
    let all = [("q", q), ("k", k), ("v", v), ("grad_out", grad_out), ("sinks", &sinks), ("cu_seqlens_q", &oq)];
    write(&with_sinks, &[&all[..], &[("cu_seqlens_k", &ok)]].concat());
    let out = out_path(dir.path());
    let (result, _) = run_ok(&["--causal", "-o", out.to_str().unwrap()], &[&with_sinks], &out);

    let candle = |t: &HostTensor| candle_core::Tensor::from_vec(f32_of(t), t.shape.clone(), &candle_core::Device::Cpu);
    let var = |t: &HostTensor| candle_core::Var::from_tensor(&candle(t).unwrap()).unwrap();
    let (qv, kv, vv, sv) = (var(q), var(k), var(v), var(&sinks));
    let opts = SdpaOptions::default().causal(true).sinks(sv.as_tensor().clone());
    let r = attn::sdpa_varlen_full(&qv, &kv, &vv, cu_q, cu_k, &opts).unwrap();
    let dout = candle(grad_out).unwrap();
    let store = (&r.out * &dout).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |x: &candle_core::Var| store.get(x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let flat = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let want = [
        ("out", flat(&r.out)),
        ("lse", flat(&r.lse)),
        ("dq", grad(&qv)),
        ("dk", grad(&kv)),
        ("dv", grad(&vv)),
        ("dsinks", grad(&sv)),
    ];
    for (name, w) in want {
        let got = f32_of(result.get(name).unwrap_or_else(|| panic!("{name} not written")));
        let d = got.iter().zip(&w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(got.len() == w.len() && d <= 1e-6, "{name}: differs from the library by {d}");
    }
    assert!(f32_of(&result["dsinks"]).iter().all(|x| x.is_finite() && *x != 0.0));
}

fn refused(tensors: &[(&str, &HostTensor)], flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write(&input, tensors);
    let out = out_path(dir.path());
    let mut args = flags.to_vec();
    args.extend(["-o", out.to_str().unwrap()]);
    let o = attn(&args, &[&input]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(!out.exists(), "output written despite the error");
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(e.lines().count(), 1, "{e}");
    e
}

/// `base` then `extra`.
fn with<'a>(base: &[(&'a str, &'a HostTensor)], extra: &[(&'a str, &'a HostTensor)]) -> Vec<(&'a str, &'a HostTensor)> {
    [base, extra].concat()
}

#[test]
fn packed_refusals_name_the_file_and_the_tensor_or_option() {
    let (q, kv) = (f32_tensor(&[8, 2, 4], 1), f32_tensor(&[6, 1, 4], 2));
    let i64s = |x: &[i64]| tensor(&[x.len()], HostData::I64(x.to_vec()));
    let (cq, ck) = (i64s(&[0, 3, 8]), i64s(&[0, 4, 6]));
    let base = [("q", &q), ("k", &kv), ("v", &kv)];

    let e = refused(&with(&base, &[("cu_seqlens_q", &cq)]), &[]);
    assert!(e.contains("in.safetensors: tensor 'cu_seqlens_k': missing; found cu_seqlens_q only"), "{e}");
    let mask = tensor(&[6], HostData::Bool(vec![true; 6]));
    let e = refused(&with(&base, &[("cu_seqlens_q", &cq), ("cu_seqlens_k", &ck), ("mask", &mask)]), &[]);
    assert!(
        e.contains("in.safetensors: tensor 'mask': packed sequences (cu_seqlens_q, cu_seqlens_k) take no mask"),
        "{e}"
    );
    let bias = f32_tensor(&[6], 4);
    let e = refused(&with(&base, &[("cu_seqlens_q", &cq), ("cu_seqlens_k", &ck), ("bias", &bias)]), &[]);
    assert!(
        e.contains("in.safetensors: tensor 'bias': packed sequences (cu_seqlens_q, cu_seqlens_k) take no bias"),
        "{e}"
    );
    let short = i64s(&[0, 4, 5]);
    let e = refused(&with(&base, &[("cu_seqlens_q", &cq), ("cu_seqlens_k", &short)]), &["--causal"]);
    assert!(e.contains("in.safetensors: cu_seqlens_k: ends at 5, expected the 6 rows of k"), "{e}");
    let negative = i64s(&[0, -3, 8]);
    let e = refused(&with(&base, &[("cu_seqlens_q", &negative), ("cu_seqlens_k", &ck)]), &[]);
    assert!(e.contains("tensor 'cu_seqlens_q': element 1 is -3, expected >= 0"), "{e}");
    let e = refused(&with(&base, &[("cu_seqlens_q", &cq), ("cu_seqlens_k", &ck)]), &["--weights"]);
    assert!(e.contains("option --weights: packed sequences return no weights"), "{e}");
    let q4 = f32_tensor(&[1, 8, 2, 4], 3);
    let e = refused(&[("q", &q4), ("k", &kv), ("v", &kv), ("cu_seqlens_q", &cq), ("cu_seqlens_k", &ck)], &[]);
    assert!(e.contains("tensor 'q': shape [1, 8, 2, 4], expected rank 3 [total, H, D]"), "{e}");
}
