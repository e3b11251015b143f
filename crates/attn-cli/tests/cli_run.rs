//! `attn run` end to end, forward: the built binary runs on files written to a temporary directory
//! and its `out`, `lse` and `weights` are checked against the `f64` reference with the project's
//! tolerance rule (gradients: `cli_run_grads.rs`; refusals: `cli_run_errors.rs`).

use crate::common;

use common::*;

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

/// The one-line summary names the products a call computes in: `--compute bf16` on a prefill
/// call says `+bf16`; on a decode-shaped call (one query row per key/value head), which computes in
/// f32 whatever is asked, it does not.
#[test]
fn the_summary_names_the_products_computed() {
    let dir = tempfile::tempdir().unwrap();
    for (lq, bf16) in [(40, true), (1, false)] {
        let (q, k, v) = (f32_tensor(&[1, 2, lq, 8], 1), f32_tensor(&[1, 2, 40, 8], 2), f32_tensor(&[1, 2, 40, 8], 3));
        let input = dir.path().join(format!("in{lq}.safetensors"));
        write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
        let out = out_path(dir.path());
        let (_, stdout) = run_ok(&["--compute", "bf16", "-o", out.to_str().unwrap()], &[&input], &out);
        assert_eq!(stdout.contains("+bf16"), bf16, "Lq {lq}: {stdout}");
    }
}
