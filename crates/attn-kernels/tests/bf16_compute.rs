//! bfloat16 products (`Precision::Bf16`): the flash kernel's `Q·Kᵀ` and `P·V` with bfloat16
//! operands and f32 accumulation, checked by the oracle rule with PyTorch's bf16 math path as the
//! baseline error (every materialised tensor rounded to bf16: scores, probabilities, output), on
//! inputs already in bf16 (K and V given as bf16 views, q holding bf16 values). Every flash
//! instruction set runs: AVX-512 with AVX512-BF16's `VDPBF16PS` where the CPU has it (the test of
//! the native path is ignored, with the reason, where it lacks it), the emulation elsewhere.

mod common;

use attn_kernels::{attention_tuned, AttnOutput, Kernel, KvView, Path, Precision, Tuning, View4, Window};
use attn_testkit::oracle::{self, OUTPUT_FACTOR};
use common::{dims, random_bias, random_keep, Case, Rng};
use half::bf16;

/// `x` rounded to bfloat16 and back.
fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// The case with q, k and v rounded to bfloat16 (as a bf16 model holds them).
fn in_bf16(mut case: Case) -> Case {
    for x in case.q.iter_mut().chain(case.k.iter_mut()).chain(case.v.iter_mut()) {
        *x = round(*x);
    }
    case
}

/// PyTorch's math path in bf16: scores `bf16(bf16(q·k)·scale)` (soft-capped and biased in bf16),
/// softmax in f32 rounded to bf16, `out = bf16(Σ p·v)`; `lse` from the bf16 scores. `(out, lse)`.
fn math_bf16(case: &Case) -> (Vec<f32>, Vec<f32>) {
    let d = case.dims;
    let scale = case.scale.unwrap_or(1.0 / (d.dk as f64).sqrt()) as f32;
    let (mut out, mut lse) = (vec![0.0f32; d.out_len()], vec![f32::NEG_INFINITY; d.lse_len()]);
    for (b, h, i) in case.rows() {
        let kvh = h / d.group();
        let q = &case.q[case.row(b, h, i) * d.dk..][..d.dk];
        let s: Vec<f32> = (0..d.lk)
            .map(|j| {
                if !case.allowed(b, h, i, j) {
                    return f32::NEG_INFINITY;
                }
                let k = &case.k[((b * d.hkv + kvh) * d.lk + j) * d.dk..][..d.dk];
                let mut x = round(round(q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>()) * scale);
                if let Some(c) = case.softcap {
                    x = round(c as f32 * (x / c as f32).tanh());
                }
                if let Some(bias) = &case.bias {
                    x = round(x + bias.at([b, h, i, j]));
                }
                x
            })
            .collect();
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            continue;
        }
        let e: Vec<f32> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f32 = e.iter().sum();
        let row = case.row(b, h, i);
        lse[row] = m + sum.ln();
        for c in 0..d.dv {
            let acc: f32 = (0..d.lk)
                .filter(|&j| s[j] != f32::NEG_INFINITY)
                .map(|j| round(e[j] / sum) * case.v[((b * d.hkv + kvh) * d.lk + j) * d.dv + c])
                .sum();
            out[row * d.dv + c] = round(acc);
        }
    }
    (out, lse)
}

/// `kernel` with bfloat16 products on the case, K and V as bf16 views, under `tuning`.
fn run_bf16(case: &Case, kernel: Kernel, tuning: Tuning) -> AttnOutput<f32> {
    let to16 = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (k16, v16) = (to16(&case.k), to16(&case.v));
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::Bf16(View4::contiguous("k", &k16, case.k_dims()).unwrap());
    let v = KvView::Bf16(View4::contiguous("v", &v16, case.v_dims()).unwrap());
    let params = attn_kernels::AttnParams { compute: Precision::Bf16, ..case.params32() };
    attention_tuned(kernel, tuning, &q, &k, &v, &params, false).unwrap_or_else(|e| panic!("{}: {e}", case.describe()))
}

/// The plans a case runs under: automatic, prefill whole, prefill split into shards, decode.
const PLANS: [Tuning; 4] = [
    Tuning { path: None, shards: None },
    Tuning { path: Some(Path::Prefill), shards: None },
    Tuning { path: Some(Path::Prefill), shards: Some(3) },
    Tuning { path: Some(Path::Decode), shards: None },
];

/// Checks `kernel`'s bfloat16 products on `case` (rounded to bf16) under every plan.
fn check(kernel: Kernel, case: Case) {
    let case = in_bf16(case);
    let r64 = case.reference64(false).unwrap();
    let (out16, lse16) = math_bf16(&case);
    for tuning in PLANS {
        let res = run_bf16(&case, kernel, tuning);
        let label = format!("{} {tuning:?} [{}]", kernel.name(), case.describe());
        oracle::check("out", &res.out, &r64.out, &out16, OUTPUT_FACTOR).unwrap_or_else(|e| panic!("{label}: {e}"));
        oracle::check("lse", &res.lse, &r64.lse, &lse16, OUTPUT_FACTOR).unwrap_or_else(|e| panic!("{label}: {e}"));
    }
}

/// Shapes around the tile edges: odd head dimensions (a half-empty last pair), `Dv` not a
/// multiple of the vector width, key counts off the panel width, GQA, rectangular.
fn shapes() -> Vec<attn_kernels::Dims> {
    vec![
        dims(1, 2, 2, 40, 40, 64, 64),
        dims(2, 4, 2, 33, 70, 17, 19),
        dims(1, 3, 1, 100, 300, 64, 48),
        dims(1, 2, 1, 24, 257, 7, 33),
        dims(1, 1, 1, 1, 50, 64, 64),
        dims(1, 2, 2, 0, 10, 8, 8),
    ]
}

fn check_shapes(kernel: Kernel) {
    for (n, d) in shapes().into_iter().enumerate() {
        check(kernel, Case::new(d, 100 + n as u64));
    }
}

fn check_masks(kernel: Kernel) {
    let d = dims(2, 4, 2, 70, 90, 32, 32);
    let mut rng = Rng::new(7);
    let base = || Case::new(d, 21);
    check(kernel, Case { causal: true, ..base() });
    check(kernel, Case { causal: true, align: attn_kernels::Align::BottomRight, ..base() });
    check(kernel, Case { window: Some(Window { left: Some(9), right: Some(3) }), ..base() });
    check(kernel, Case { key_lengths: Some(vec![0, 61]), ..base() });
    check(kernel, Case { keep: Some(random_keep(&[d.b, 1, d.lq, d.lk], 0.7, &mut rng)), ..base() });
    check(kernel, Case { bias: Some(random_bias(&[d.lq, d.lk], 2.0, 0.1, &mut rng)), ..base() });
    check(kernel, Case { softcap: Some(5.0), scale: Some(0.9), ..base() });
}

/// A masked key whose value row is NaN must not reach the output (that tile falls back to f32
/// products), and the unmasked rows keep the bf16 accuracy.
fn check_masked_nan_values(kernel: Kernel) {
    let d = dims(1, 2, 1, 48, 64, 16, 16);
    let mut case = Case { causal: true, ..Case::new(d, 5) };
    case.poison_key(0, 0, 40);
    let case = in_bf16(case);
    let res = run_bf16(&case, kernel, Tuning { path: Some(Path::Prefill), shards: None });
    for (r, row) in res.out.chunks(d.dv).enumerate() {
        let i = r % d.lq;
        assert_eq!(row.iter().all(|x| x.is_finite()), i < 40, "row {i}: {row:?}");
    }
}

/// bfloat16 products really run: the result differs from the f32 products' (P is rounded), by no
/// more than the oracle rule allows.
fn check_differs_from_f32(kernel: Kernel) {
    let case = in_bf16(Case::new(dims(1, 2, 2, 64, 128, 64, 64), 3));
    let bf = run_bf16(&case, kernel, Tuning::default());
    let f = case.run(kernel, false).unwrap();
    assert!(bf.out.iter().zip(&f.out).any(|(a, b)| a != b), "bf16 products gave the f32 result bit for bit");
}

macro_rules! flash_tests {
    ($($group:ident => $check:ident),* $(,)?) => {$(
        mod $group {
            use attn_kernels::{Isa, Kernel};
            crate::common::isa_test!([avx512bf16] #[test]
            fn native_avx512_bf16() {
                assert!(Isa::has_avx512_bf16(), "this CPU lacks AVX512-BF16");
                super::$check(Kernel::Flash(Isa::Avx512))
            });
            crate::common::isa_test!([avx2] #[test]
            fn emulated_avx2() {
                crate::common::assert_available(Kernel::Flash(Isa::Avx2));
                super::$check(Kernel::Flash(Isa::Avx2))
            });
            #[test]
            fn emulated_portable() {
                super::$check(Kernel::Flash(Isa::Portable))
            }
        }
    )*};
}

flash_tests! {
    shapes => check_shapes,
    masks => check_masks,
    masked_nan_values => check_masked_nan_values,
    differs_from_f32 => check_differs_from_f32,
}
