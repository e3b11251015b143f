//! Input values and layouts: NaN in unmasked inputs, grouped-query heads, strided views and
//! half-precision K/V, each compared with the oracle of the equivalent plain call.

use attn_kernels::{Align, Dropout, Kernel, KvView, View4};
use half::{bf16, f16};

use crate::common::{assert_oracle, dims, random_bias, random_keep, Case, Rng};

/// NaN in one unmasked element of q, k or v reaches exactly the output elements that read it.
pub fn check_nan_propagation(kernel: Kernel) {
    let clean = Case { causal: true, ..Case::new(dims(2, 4, 2, 40, 40, 24, 24), 50) };
    let mut case = clean.clone();
    let r = case.row(1, 2, 7);
    case.q[r * 24 + 3] = f32::NAN;
    expect_nan(kernel, &case, "NaN in q", |b, h, i, _| (b, h, i) == (1, 2, 7), true);

    let mut case = clean.clone();
    case.kv_rows_mut(0, 1, 20).0[5] = f32::NAN;
    expect_nan(kernel, &case, "NaN in k", |b, h, i, _| b == 0 && h / 2 == 1 && i >= 20, true);

    let mut case = clean.clone();
    case.kv_rows_mut(1, 0, 11).1[2] = f32::NAN;
    expect_nan(kernel, &case, "NaN in v", |b, h, i, d| b == 1 && h / 2 == 0 && i >= 11 && d == 2, false);

    // A NaN query in a fully masked row still gives out 0 and lse −∞.
    let mut case = Case { key_lengths: Some(vec![40, 0]), ..clean };
    let r = case.row(1, 0, 5);
    case.q[r * 24..(r + 1) * 24].fill(f32::NAN);
    let res = case.check(kernel, "NaN in q of a fully masked row");
    assert!(res.out[r * 24..(r + 1) * 24].iter().all(|&x| x == 0.0), "{}: masked NaN row out", kernel.name());
    assert_eq!(res.lse[r], f32::NEG_INFINITY, "{}: masked NaN row lse", kernel.name());
}

/// Checks `case` against the oracle and that `out[b, h, i, d]` is NaN exactly where `nan_at` says
/// (and lse NaN on those rows when `lse_nan`).
fn expect_nan(
    kernel: Kernel,
    case: &Case,
    what: &str,
    nan_at: impl Fn(usize, usize, usize, usize) -> bool,
    lse_nan: bool,
) {
    let res = case.check(kernel, what);
    let dv = case.dims.dv;
    for (b, h, i) in case.rows() {
        let r = case.row(b, h, i);
        for d in 0..dv {
            let x = res.out[r * dv + d];
            assert_eq!(x.is_nan(), nan_at(b, h, i, d), "{} {what}: out[{b},{h},{i},{d}] = {x}", kernel.name());
        }
        let row_nan = lse_nan && (0..dv).any(|d| nan_at(b, h, i, d));
        assert_eq!(res.lse[r].is_nan(), row_nan, "{} {what}: lse[{b},{h},{i}] = {}", kernel.name(), res.lse[r]);
    }
}

/// Grouped-query attention equals the call with K/V heads repeated to `Hq`, also when the repeat is
/// a stride-0 head dimension.
pub fn check_gqa(kernel: Kernel) {
    let mut rng = Rng::new(60);
    for hkv in [2, 1] {
        let base = Case::new(dims(2, 8, hkv, 33, 65, 64, 48), 61 + hkv as u64);
        let masked = Case {
            causal: true,
            align: Align::BottomRight,
            bias: Some(random_bias(&[2, 8, 33, 65], 2.0, 0.05, &mut rng)),
            keep: Some(random_keep(&[1, 8, 1, 65], 0.8, &mut rng)),
            ..base.clone()
        };
        let dropped =
            Case { dropout: Some(Dropout { p: 0.25, seed: 5 }), key_lengths: Some(vec![65, 30]), ..base.clone() };
        for (what, case) in [("plain", base), ("masked", masked), ("dropout", dropped)] {
            let label = format!("{} GQA {what} [{}]", kernel.name(), case.describe());
            let repeated = case.repeat_kv();
            let oracle = repeated.oracle();
            assert_eq!(case.reference64(true).unwrap(), oracle.r64, "{label}: reference differs from repeated heads");
            for want_weights in [false, true] {
                let fast = case.run(kernel, want_weights).unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_oracle(&label, &fast, &oracle);
            }
        }
    }
    let case = Case::new(dims(2, 8, 1, 33, 65, 64, 48), 70);
    let repeated = case.repeat_kv();
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = View4::strided("k", &case.k, [2, 8, 65, 64], [65 * 64, 0, 64]).unwrap();
    let v = View4::strided("v", &case.v, [2, 8, 65, 48], [65 * 48, 0, 48]).unwrap();
    let fast = repeated.run_views(kernel, &q, &KvView::F32(k), &KvView::F32(v), true).unwrap();
    assert_oracle(&format!("{} stride-0 K/V heads", kernel.name()), &fast, &repeated.oracle());
}

/// `x: [B, H, L, D]` rewritten in `[B, L, H, D]` order.
fn to_blhd<T: Copy>(x: &[T], [b, h, l, d]: [usize; 4]) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for bi in 0..b {
        for li in 0..l {
            for hi in 0..h {
                let at = ((bi * h + hi) * l + li) * d;
                out.extend_from_slice(&x[at..at + d]);
            }
        }
    }
    out
}

/// Every row of `d` elements of `x` followed by `pad` copies of `fill`.
fn padded<T: Copy>(x: &[T], d: usize, pad: usize, fill: T) -> Vec<T> {
    x.chunks(d.max(1)).flat_map(|row| row.iter().copied().chain((0..pad).map(|_| fill))).collect()
}

/// Strides of a `[B, H, L, D]` view over a `[B, L, H, D]` buffer.
fn blhd_strides([_, h, l, d]: [usize; 4]) -> [usize; 3] {
    [l * h * d, d, h * d]
}

/// Strides of a `[B, H, L, D]` view whose rows are padded to `D + pad`.
fn padded_strides([_, h, l, d]: [usize; 4], pad: usize) -> [usize; 3] {
    [h * l * (d + pad), l * (d + pad), d + pad]
}

/// Strided views (`[B, L, H, D]` storage, rows padded with NaN) equal the contiguous call.
pub fn check_strided(kernel: Kernel) {
    let shapes = [(2, 4, 2, 33, 65, 64, 80), (1, 2, 1, 17, 17, 8, 8), (2, 8, 1, 1, 129, 128, 64)];
    for (n, &(b, hq, hkv, lq, lk, dk, dv)) in shapes.iter().enumerate() {
        let case = Case { causal: n == 0, ..Case::new(dims(b, hq, hkv, lq, lk, dk, dv), 80 + n as u64) };
        let label = format!("{} strided [{}]", kernel.name(), case.describe());
        let oracle = case.oracle();
        let (qd, kd, vd) = (case.q_dims(), case.k_dims(), case.v_dims());
        let q_blhd = to_blhd(&case.q, qd);
        let k_blhd = to_blhd(&case.k, kd);
        let v_pad = padded(&case.v, dv, 7, f32::NAN);
        let q_pad = padded(&case.q, dk, 3, f32::NAN);
        let k_pad = padded(&case.k, dk, 16, f32::NAN);
        let v_blhd = to_blhd(&case.v, vd);
        let layouts = [
            (
                View4::strided("q", &q_blhd, qd, blhd_strides(qd)).unwrap(),
                View4::strided("k", &k_blhd, kd, blhd_strides(kd)).unwrap(),
                View4::strided("v", &v_pad, vd, padded_strides(vd, 7)).unwrap(),
            ),
            (
                View4::strided("q", &q_pad, qd, padded_strides(qd, 3)).unwrap(),
                View4::strided("k", &k_pad, kd, padded_strides(kd, 16)).unwrap(),
                View4::strided("v", &v_blhd, vd, blhd_strides(vd)).unwrap(),
            ),
        ];
        for (q, k, v) in layouts {
            for want_weights in [false, true] {
                let fast = case.run_views(kernel, &q, &KvView::F32(k), &KvView::F32(v), want_weights).unwrap();
                assert_oracle(&label, &fast, &oracle);
            }
        }
    }
}

/// K/V stored as `f16` or `bf16` equal the `f32` call on the rounded values, with NaN in the
/// half-precision padding beyond each key length and in strided row padding.
pub fn check_half_kv(kernel: Kernel) {
    let plain = Case::new(dims(2, 4, 2, 33, 65, 64, 80), 90);
    let masked = Case { key_lengths: Some(vec![65, 17]), causal: true, align: Align::BottomRight, ..plain.clone() };
    for case in [plain, masked] {
        check_half(kernel, &case, "f16", f16::from_f32, f16::to_f32, f16::NAN);
        check_half(kernel, &case, "bf16", bf16::from_f32, bf16::to_f32, bf16::NAN);
    }
}

fn check_half<T: Copy>(kernel: Kernel, case: &Case, what: &str, from: fn(f32) -> T, to: fn(T) -> f32, nan: T)
where
    for<'a> KvView<'a>: From<View4<'a, T>>,
{
    let label = format!("{} {what} K/V [{}]", kernel.name(), case.describe());
    let (mut k, mut v): (Vec<T>, Vec<T>) =
        (case.k.iter().map(|&x| from(x)).collect(), case.v.iter().map(|&x| from(x)).collect());
    let rounded = Case { k: k.iter().map(|&x| to(x)).collect(), v: v.iter().map(|&x| to(x)).collect(), ..case.clone() };
    let d = case.dims;
    if let Some(kl) = &case.key_lengths {
        for (b, &len) in kl.iter().enumerate() {
            for g in 0..d.hkv {
                let r0 = (b * d.hkv + g) * d.lk;
                k[(r0 + len) * d.dk..(r0 + d.lk) * d.dk].fill(nan);
                v[(r0 + len) * d.dv..(r0 + d.lk) * d.dv].fill(nan);
            }
        }
    }
    let oracle = rounded.oracle();
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let (kd, vd) = (case.k_dims(), case.v_dims());
    let (k_pad, v_pad) = (padded(&k, d.dk, 8, nan), padded(&v, d.dv, 3, nan));
    let layouts = [
        (View4::contiguous("k", &k, kd).unwrap(), View4::contiguous("v", &v, vd).unwrap()),
        (
            View4::strided("k", &k_pad, kd, padded_strides(kd, 8)).unwrap(),
            View4::strided("v", &v_pad, vd, padded_strides(vd, 3)).unwrap(),
        ),
    ];
    for (kv, vv) in layouts {
        for want_weights in [false, true] {
            let fast = rounded.run_views(kernel, &q, &KvView::from(kv), &KvView::from(vv), want_weights).unwrap();
            assert_oracle(&label, &fast, &oracle);
        }
    }
}
