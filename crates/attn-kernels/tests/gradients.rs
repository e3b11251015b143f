//! Gradients: the `f64` reference backward against finite differences for every mask kind,
//! soft-capping, bias and dropout; and every kernel's backward against the `f64` reference under
//! the gradient oracle rule (factor 3) — tile edges, `Lq ≠ Lk`, `Dk ≠ Dv`, decode shapes, every
//! mask kind and alignment, bias gradients in every broadcast shape, soft-capping, negative
//! scales, grouped-query heads, half-precision K/V, dropout replay, fully masked rows, non-finite
//! masked keys, NaN propagation, empty sizes and malformed inputs; and the backward after each
//! forward path.

use crate::common;
use crate::gradients_parts;

use attn_kernels::{Align, BackwardTuning, Dropout, Kernel, KvView, Saved, Tuning, View4, Window};
use common::{broadcast_shape, dims, kernel_tests, random_bias, random_keep, Case, Rng, SHAPE_CODES};
use gradients_parts::consistency::check_forward_path_consistency;
use gradients_parts::finite_diff::assert_finite_differences;
use gradients_parts::harness::{assert_grads, check_grads, grads, grads64, grads_kv, out_dims, random_dout, Terms};

#[test]
fn reference_matches_finite_differences() {
    let d = dims(2, 2, 1, 5, 7, 3, 4);
    let mut rng = Rng::new(3);
    let target = [2, 2, 5, 7];
    let cases = [
        ("plain", Case::new(d, 1)),
        ("causal top-left", Case { causal: true, ..Case::new(d, 2) }),
        ("causal bottom-right", Case { causal: true, align: Align::BottomRight, ..Case::new(d, 3) }),
        ("window", Case { window: Some(Window { left: Some(1), right: Some(2) }), ..Case::new(d, 4) }),
        ("key lengths", Case { key_lengths: Some(vec![4, 0]), ..Case::new(d, 5) }),
        ("keep mask", Case { keep: Some(random_keep(&[5, 7], 0.6, &mut rng)), ..Case::new(d, 6) }),
        ("bias [B,Hq,Lq,Lk]", Case { bias: Some(random_bias(&target, 1.0, 0.1, &mut rng)), ..Case::new(d, 7) }),
        ("bias [Lk]", Case { bias: Some(random_bias(&[7], 1.0, 0.0, &mut rng)), ..Case::new(d, 8) }),
        ("bias [Hq,1,Lk]", Case { bias: Some(random_bias(&[2, 1, 7], 1.0, 0.0, &mut rng)), ..Case::new(d, 9) }),
        ("softcap", Case { softcap: Some(1.5), scale: Some(2.0), ..Case::new(d, 10) }),
        ("negative scale", Case { scale: Some(-0.7), ..Case::new(d, 11) }),
        ("dropout", Case { dropout: Some(Dropout { p: 0.3, seed: 5 }), ..Case::new(d, 12) }),
        (
            "everything",
            Case {
                causal: true,
                align: Align::BottomRight,
                softcap: Some(2.0),
                bias: Some(random_bias(&[5, 7], 1.0, 0.1, &mut rng)),
                dropout: Some(Dropout { p: 0.2, seed: 9 }),
                ..Case::new(d, 13)
            },
        ),
    ];
    for (what, case) in &cases {
        assert_finite_differences(case, what);
    }
}

kernel_tests! {
    shapes => check_shapes,
    forward_path_consistency => check_forward_path_consistency,
    masks => check_masks,
    bias_grads => check_bias_grads,
    softcap_scale => check_softcap_scale,
    gqa_and_half_kv => check_gqa_and_half_kv,
    dropout_replay => check_dropout_replay,
    fully_masked => check_fully_masked,
    masked_nonfinite => check_masked_nonfinite,
    nan_propagation => check_nan_propagation,
    empty_and_errors => check_empty_and_errors,
    strided => check_strided,
}

fn check_shapes(kernel: Kernel) {
    for (n, &(b, hq, hkv, lq, lk, dk, dv)) in [
        (1, 1, 1, 1, 1, 1, 1),
        (1, 2, 1, 17, 17, 8, 8),
        (1, 1, 1, 63, 65, 64, 64),
        (2, 2, 2, 64, 64, 16, 80),
        (1, 2, 2, 129, 127, 32, 8),
        (1, 1, 1, 100, 300, 24, 40),
        (2, 4, 4, 33, 70, 8, 8),
        (1, 8, 2, 1, 200, 64, 64),
        (1, 4, 1, 3, 129, 16, 16),
    ]
    .iter()
    .enumerate()
    {
        check_grads(kernel, &Case::new(dims(b, hq, hkv, lq, lk, dk, dv), n as u64), "shape");
    }
}

fn check_masks(kernel: Kernel) {
    let mut rng = Rng::new(21);
    for (n, align) in [Align::TopLeft, Align::BottomRight].into_iter().enumerate() {
        for (lq, lk) in [(70, 70), (40, 130), (130, 40)] {
            let d = dims(1, 2, 1, lq, lk, 16, 16);
            let seed = 100 + n as u64 * 10 + lq as u64;
            check_grads(kernel, &Case { causal: true, align, ..Case::new(d, seed) }, "causal");
            let window = Some(Window { left: Some(17), right: Some(3) });
            check_grads(kernel, &Case { window, align, ..Case::new(d, seed + 1) }, "window");
        }
    }
    let d = dims(3, 2, 2, 50, 90, 16, 8);
    check_grads(kernel, &Case { key_lengths: Some(vec![90, 0, 33]), ..Case::new(d, 5) }, "key lengths");
    for code in 0..SHAPE_CODES {
        let shape = broadcast_shape([3, 2, 50, 90], code);
        let keep = Some(random_keep(&shape, 0.7, &mut rng));
        check_grads(kernel, &Case { keep, ..Case::new(d, 200 + code as u64) }, "keep mask");
    }
}

fn check_bias_grads(kernel: Kernel) {
    let mut rng = Rng::new(31);
    let d = dims(2, 2, 1, 37, 70, 8, 16);
    for code in 0..SHAPE_CODES {
        let shape = broadcast_shape([2, 2, 37, 70], code);
        let bias = Some(random_bias(&shape, 2.0, 0.05, &mut rng));
        let g = check_grads(kernel, &Case { bias, ..Case::new(d, 300 + code as u64) }, "bias");
        assert_eq!(
            g.dbias.as_ref().map(Vec::len),
            Some(shape.iter().product()),
            "dbias has the bias's shape {shape:?}"
        );
    }
    let bias = Some(random_bias(&[37, 70], 1.0, 0.0, &mut rng));
    check_grads(kernel, &Case { bias, causal: true, softcap: Some(5.0), ..Case::new(d, 399) }, "bias causal softcap");
}

fn check_softcap_scale(kernel: Kernel) {
    let d = dims(1, 2, 2, 45, 77, 32, 32);
    for (n, (cap, scale)) in [(Some(1.0), Some(3.0)), (Some(30.0), None), (None, Some(-0.5)), (Some(2.0), Some(-4.0))]
        .into_iter()
        .enumerate()
    {
        check_grads(kernel, &Case { softcap: cap, scale, ..Case::new(d, 400 + n as u64) }, "softcap/scale");
    }
}

fn check_gqa_and_half_kv(kernel: Kernel) {
    let case = Case { causal: true, ..Case::new(dims(2, 6, 2, 40, 70, 16, 24), 501) };
    let g = check_grads(kernel, &case, "gqa");
    // The same call with K/V heads repeated: dk/dv of a shared head are the sums over its group.
    let rep = grads(&case.repeat_kv(), kernel, &random_dout(&case, 7)).unwrap();
    let d = case.dims;
    for (b, kvh) in (0..d.b).flat_map(|b| (0..d.hkv).map(move |g| (b, g))) {
        let head = d.lk * d.dk;
        let got = &g.dk[(b * d.hkv + kvh) * head..][..head];
        let sum: Vec<f32> = (0..d.group())
            .map(|x| &rep.dk[(b * d.hq + kvh * d.group() + x) * head..][..head])
            .fold(vec![0.0; head], |acc, h| acc.iter().zip(h).map(|(a, b)| a + b).collect());
        let err = got.iter().zip(&sum).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-4, "{}: GQA dk differs from the repeated-heads sum by {err}", kernel.name());
    }
    // K/V stored as f16 and bf16 give f32 gradients of the widened values.
    let dout = random_dout(&case, 7);
    for half in ["f16", "bf16"] {
        let round = |x: &[f32]| -> Vec<f32> {
            x.iter()
                .map(
                    |&x| if half == "f16" { half::f16::from_f32(x).to_f32() } else { half::bf16::from_f32(x).to_f32() },
                )
                .collect()
        };
        let widened = Case { k: round(&case.k), v: round(&case.v), ..case.clone() };
        let (k16, v16): (Vec<half::f16>, Vec<half::f16>) = (
            case.k.iter().map(|&x| half::f16::from_f32(x)).collect(),
            case.v.iter().map(|&x| half::f16::from_f32(x)).collect(),
        );
        let (kb, vb): (Vec<half::bf16>, Vec<half::bf16>) = (
            case.k.iter().map(|&x| half::bf16::from_f32(x)).collect(),
            case.v.iter().map(|&x| half::bf16::from_f32(x)).collect(),
        );
        let (k, v) = if half == "f16" {
            (
                KvView::F16(View4::contiguous("k", &k16, case.k_dims()).unwrap()),
                KvView::F16(View4::contiguous("v", &v16, case.v_dims()).unwrap()),
            )
        } else {
            (
                KvView::Bf16(View4::contiguous("k", &kb, case.k_dims()).unwrap()),
                KvView::Bf16(View4::contiguous("v", &vb, case.v_dims()).unwrap()),
            )
        };
        let fast = grads_kv(&case, kernel, (Tuning::default(), BackwardTuning::default()), &k, &v, &dout).unwrap();
        let g64 = grads64(&widened, &dout);
        let g32 = grads(&widened, Kernel::Reference, &dout).unwrap();
        assert_grads(&format!("{} {half} K/V", kernel.name()), &fast, &g64, &g32, &Terms::default());
    }
}

fn check_dropout_replay(kernel: Kernel) {
    for (n, p) in [0.1f32, 0.5, 0.9].into_iter().enumerate() {
        let dropout = Some(Dropout { p, seed: 40 + n as u64 });
        let case = Case { dropout, causal: n == 1, ..Case::new(dims(1, 3, 1, 50, 90, 16, 16), 600 + n as u64) };
        check_grads(kernel, &case, "dropout");
    }
    // A row that sees one key has softmax 1 whatever its score: `dq` and `dk` are exactly 0, with
    // dropout as without (the kept weight `1/(1 − p)` scales `dP` and `Δ = dO·O` alike).
    for p in [0.3f32, 0.6] {
        let case = Case {
            dropout: Some(Dropout { p, seed: 77 }),
            causal: true,
            scale: Some(2.0),
            ..Case::new(dims(1, 4, 2, 9, 1, 40, 70), 650)
        };
        let g = check_grads(kernel, &case, "dropout, one key per row");
        let nonzero = g.dq.iter().chain(&g.dk).filter(|&&x| x != 0.0).count();
        assert_eq!(nonzero, 0, "{} dropout {p}: dq/dk of one-key rows not exactly 0", kernel.name());
    }
}

fn check_fully_masked(kernel: Kernel) {
    // Row 0 of batch 1 sees no key (key length 0), rows of batch 0 beyond the keys' end none either
    // (bottom-right causal with Lq > Lk).
    let case = Case {
        causal: true,
        align: Align::BottomRight,
        key_lengths: Some(vec![30, 0]),
        ..Case::new(dims(2, 2, 1, 45, 30, 8, 8), 700)
    };
    let g = check_grads(kernel, &case, "fully masked rows");
    let d = case.dims;
    for (b, h, i) in case.rows().filter(|&(b, h, i)| !case.any_allowed(b, h, i)) {
        let r = case.row(b, h, i);
        assert!(
            g.dq[r * d.dk..(r + 1) * d.dk].iter().all(|&x| x == 0.0),
            "{}: dq of dead row ({b},{h},{i})",
            kernel.name()
        );
    }
    let batch1 = d.hkv * d.lk;
    assert!(g.dk[batch1 * d.dk..].iter().all(|&x| x == 0.0), "{}: dk of a batch with no keys", kernel.name());
    assert!(g.dv[batch1 * d.dv..].iter().all(|&x| x == 0.0), "{}: dv of a batch with no keys", kernel.name());
}

fn check_masked_nonfinite(kernel: Kernel) {
    let mut rng = Rng::new(71);
    let d = dims(1, 2, 1, 40, 100, 16, 16);
    let bias = Some(random_bias(&[100], 1.0, 0.3, &mut rng));
    let mut case =
        Case { causal: true, window: Some(Window { left: Some(20), right: None }), bias, ..Case::new(d, 800) };
    let dead = case.keys_masked_everywhere();
    assert!(dead.len() > 10, "the case masks keys everywhere");
    for &(b, g, j) in &dead {
        case.poison_key(b, g, j);
    }
    let dout = random_dout(&case, 7);
    let fast = grads(&case, kernel, &dout).unwrap();
    for (name, x) in [("dq", &fast.dq), ("dk", &fast.dk), ("dv", &fast.dv), ("dbias", fast.dbias.as_ref().unwrap())] {
        assert!(x.iter().all(|x| x.is_finite()), "{}: {name} holds a non-finite value", kernel.name());
    }
    for &(b, g, j) in &dead {
        let r = (b * d.hkv + g) * d.lk + j;
        assert!(fast.dk[r * d.dk..(r + 1) * d.dk].iter().all(|&x| x == 0.0), "{}: dk of masked key {j}", kernel.name());
        assert!(fast.dv[r * d.dv..(r + 1) * d.dv].iter().all(|&x| x == 0.0), "{}: dv of masked key {j}", kernel.name());
    }
    check_grads(kernel, &case, "poisoned masked keys");
}

fn check_nan_propagation(kernel: Kernel) {
    let mut case = Case { causal: true, ..Case::new(dims(1, 1, 1, 30, 30, 8, 8), 900) };
    case.kv_rows_mut(0, 0, 12).1[3] = f32::NAN;
    let g = check_grads(kernel, &case, "NaN in an unmasked value");
    let d = case.dims;
    assert!(g.dq[12 * d.dk..].iter().all(|x| x.is_nan()), "{}: rows seeing the NaN value get NaN dq", kernel.name());
    assert!(g.dq[..12 * d.dk].iter().all(|x| x.is_finite()), "{}: rows before it stay finite", kernel.name());
}

fn check_empty_and_errors(kernel: Kernel) {
    for (b, lq, lk) in [(0, 5, 5), (1, 0, 5), (1, 5, 0)] {
        let case = Case::new(dims(b, 2, 1, lq, lk, 4, 4), 1000);
        let g = grads(&case, kernel, &random_dout(&case, 1)).unwrap();
        assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0), "{}: empty sizes give zeros", kernel.name());
        assert_eq!((g.dq.len(), g.dk.len()), (b * 2 * lq * 4, b * lk * 4));
    }
    let case = Case::new(dims(1, 2, 1, 6, 7, 4, 4), 1001);
    let params = case.params(None, None);
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::F32(View4::contiguous("k", &case.k, case.k_dims()).unwrap());
    let v = KvView::F32(View4::contiguous("v", &case.v, case.v_dims()).unwrap());
    let fwd = attn_kernels::attention(kernel, &q, &k, &v, &params, false).unwrap();
    let out = View4::contiguous("out", &fwd.out, out_dims(&case)).unwrap();
    let short = vec![0.0f32; 2 * 6 * 3];
    let bad_dout = View4::contiguous("grad_out", &short, [1, 2, 6, 3]).unwrap();
    let err = attn_kernels::attention_backward(
        kernel,
        &q,
        &k,
        &v,
        &Saved { out, lse: &fwd.lse, lse_residue: None, forward_path: None, dout: bad_dout, side: Default::default() },
        &params,
        false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("grad_out"), "{}: {err}", kernel.name());
    let dout = View4::contiguous("grad_out", &fwd.out, out_dims(&case)).unwrap();
    let err = attn_kernels::attention_backward(
        kernel,
        &q,
        &k,
        &v,
        &Saved { out, lse: &fwd.lse[1..], lse_residue: None, forward_path: None, dout, side: Default::default() },
        &params,
        false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("lse"), "{}: {err}", kernel.name());
}

/// `x: [B, H, L, D]` copied to the layout `[B, L, H, D]`, and the strides that view it as
/// `[B, H, L, D]`.
fn interleaved(x: &[f32], [b, h, l, d]: [usize; 4]) -> (Vec<f32>, [usize; 3]) {
    let mut out = vec![0.0; x.len()];
    for (bi, hi, li) in (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..l).map(move |li| (bi, hi, li)))) {
        let src = ((bi * h + hi) * l + li) * d;
        let dst = ((bi * l + li) * h + hi) * d;
        out[dst..dst + d].copy_from_slice(&x[src..src + d]);
    }
    (out, [l * h * d, d, h * d])
}

fn check_strided(kernel: Kernel) {
    let case = Case { causal: true, ..Case::new(dims(2, 4, 2, 37, 70, 16, 8), 1100) };
    let dout = random_dout(&case, 3);
    let want = grads(&case, kernel, &dout).unwrap();
    let params = case.params(None, None);
    let (q, qs) = interleaved(&case.q, case.q_dims());
    let (k, ks) = interleaved(&case.k, case.k_dims());
    let (v, vs) = interleaved(&case.v, case.v_dims());
    let (o, os) = interleaved(&dout, out_dims(&case));
    let q = View4::strided("q", &q, case.q_dims(), qs).unwrap();
    let k = KvView::F32(View4::strided("k", &k, case.k_dims(), ks).unwrap());
    let v = KvView::F32(View4::strided("v", &v, case.v_dims(), vs).unwrap());
    let dout = View4::strided("grad_out", &o, out_dims(&case), os).unwrap();
    let fwd = attn_kernels::attention(kernel, &q, &k, &v, &params, false).unwrap();
    let saved = Saved::of(&fwd, out_dims(&case), dout).unwrap();
    let got = attn_kernels::attention_backward(kernel, &q, &k, &v, &saved, &params, true).unwrap();
    assert_eq!(got, want, "{}: strided inputs give other gradients than contiguous ones", kernel.name());
}
