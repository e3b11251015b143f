//! `attn run --linear MAP`: `out` and, with `grad_out`, `dq`, `dk`, `dv` against the linear
//! oracle (`f64`, under the oracle rule with the `f32` oracle as baseline), causal and not, with
//! grouped heads and key padding; no `lse`; and the refusals of what linear attention does not take.

use crate::common;

use attn::linear::{FeatureMap, LinearOptions};
use attn_kernels::linear::{linear_reference, linear_reference_backward};
use common::*;

fn oracle<T: Real>(t: [&HostTensor; 4], opts: &LinearOptions) -> [Vec<T>; 4] {
    let data: Vec<Vec<T>> = t.iter().map(|x| f32_of(x).iter().map(|&v| T::from_f32(v).unwrap()).collect()).collect();
    let dims = |x: &HostTensor| -> [usize; 4] { x.shape.clone().try_into().unwrap() };
    let view = |i: usize| View4::contiguous("x", &data[i], dims(t[i])).unwrap();
    let out = linear_reference(view(0), view(1), view(2), &opts.params()).unwrap();
    let g = linear_reference_backward(view(0), view(1), view(2), view(3), &opts.params()).unwrap();
    [out, g.dq, g.dk, g.dv]
}

#[test]
fn outputs_and_gradients_match_the_oracle() {
    let (q, k, v) = (f32_tensor(&[2, 4, 9, 6], 1), f32_tensor(&[2, 2, 9, 6], 2), f32_tensor(&[2, 2, 9, 5], 3));
    let dout = f32_tensor(&[2, 4, 9, 5], 4);
    let lens = tensor(&[2], HostData::I64(vec![9, 4]));
    // Identity features of signed inputs give denominators near 0, where any two summation
    // orders disagree: positive `q`, `k` keep that map's problem well conditioned.
    let positive = |t: &HostTensor| tensor(&t.shape, HostData::F32(f32_of(t).iter().map(|x| x.abs() + 0.05).collect()));
    for (map, flag) in [(FeatureMap::Elu, "elu"), (FeatureMap::Relu, "relu"), (FeatureMap::Identity, "identity")] {
        let (q, k) = if flag == "identity" { (positive(&q), positive(&k)) } else { (q.clone(), k.clone()) };
        for causal in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let input = dir.path().join("in.safetensors");
            write(&input, &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &dout), ("key_lengths", &lens)]);
            let out = out_path(dir.path());
            let mut args = vec!["--linear", flag, "-o", out.to_str().unwrap()];
            if causal {
                args.push("--causal");
            }
            let (result, stdout) = run_ok(&args, &[&input], &out);
            assert!(stdout.contains(&format!("linear {flag}")), "{stdout}");
            assert_eq!(result.keys().collect::<Vec<_>>(), ["dk", "dq", "dv", "out"]);
            let opts = LinearOptions::new(map.clone()).causal(causal).key_lengths(vec![9, 4]);
            let (ref64, naive) = (oracle::<f64>([&q, &k, &v, &dout], &opts), oracle::<f32>([&q, &k, &v, &dout], &opts));
            for (i, name) in ["out", "dq", "dk", "dv"].into_iter().enumerate() {
                let factor = if i == 0 { OUTPUT_FACTOR } else { GRADIENT_FACTOR };
                check(name, &f32_of(&result[name]), &ref64[i], &naive[i], factor)
                    .unwrap_or_else(|e| panic!("{flag} causal {causal}: {e}"));
            }
        }
    }
}

#[test]
fn what_linear_attention_does_not_take_is_refused() {
    let (q, k, v) = (f32_tensor(&[1, 2, 4, 3], 1), f32_tensor(&[1, 2, 4, 3], 2), f32_tensor(&[1, 2, 4, 3], 3));
    let bias = f32_tensor(&[4, 4], 5);
    let e = fails_on(&[("q", &q), ("k", &k), ("v", &v), ("bias", &bias)], &["--linear", "elu"]);
    assert!(e.contains("bias") && e.contains("linear attention (--linear) takes no bias"), "{e}");
    let e = fails_on(
        &[("q", &q), ("k", &f32_tensor(&[1, 2, 5, 3], 2)), ("v", &f32_tensor(&[1, 2, 5, 3], 2))],
        &["--linear", "elu", "--causal"],
    );
    assert!(e.contains("causal needs Lk = Lq"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let args = ["--linear", "elu", "--weights", "-o", "x.safetensors", "in.safetensors"];
    let o = Command::new(env!("CARGO_BIN_EXE_attn")).current_dir(dir.path()).arg("run").args(args).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--weights"));
}
