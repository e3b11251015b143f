//! Empty sizes (which must work) and invalid calls (which must return the right [`AttnError`]).

use attn_kernels::{
    attention, attention_backward, AttnError, AttnOutput, AttnParams, Dropout, Kernel, KvView, Saved, View4,
};

use crate::common::{dims, Case, Dense};

/// B, Lq, Lk, Dk or Dv of zero: outputs of the right (possibly empty) length; Lk = 0 leaves every
/// row fully masked (out 0, lse −∞).
pub fn check_empty(kernel: Kernel) {
    let masked_lk0 = Case {
        causal: true,
        align: attn_kernels::Align::BottomRight,
        key_lengths: Some(vec![0, 0]),
        keep: Some(Dense { shape: vec![1, 0], data: vec![] }),
        bias: Some(Dense { shape: vec![5, 0], data: vec![] }),
        ..Case::new(dims(2, 2, 1, 5, 0, 8, 8), 4)
    };
    let cases = [
        ("B = 0", Case::new(dims(0, 2, 1, 5, 7, 8, 8), 1)),
        ("Lq = 0", Case::new(dims(2, 2, 1, 0, 7, 8, 8), 2)),
        ("Lk = 0", Case::new(dims(2, 4, 2, 5, 0, 8, 8), 3)),
        ("Lk = 0 with masks", masked_lk0),
        ("Dv = 0", Case::new(dims(2, 2, 1, 5, 7, 8, 0), 5)),
        ("Dk = 0", Case::new(dims(2, 2, 1, 5, 7, 0, 8), 6)),
        ("all zero", Case::new(dims(0, 1, 1, 0, 0, 0, 0), 7)),
    ];
    for (what, case) in cases {
        let label = format!("{} {what} [{}]", kernel.name(), case.describe());
        let res = case.check(kernel, what);
        let d = case.dims;
        assert_eq!(res.out.len(), d.out_len(), "{label}: out length");
        assert_eq!(res.lse.len(), d.lse_len(), "{label}: lse length");
        assert_eq!(res.weights.as_ref().map(Vec::len), Some(d.weights_len()), "{label}: weights length");
        let fully_masked = case.assert_structure(&label, &res);
        if d.lk == 0 {
            assert_eq!(fully_masked, d.lse_len(), "{label}: every row is fully masked");
        }
    }
}

/// Runs `kernel` on zero-filled tensors of the given shapes with `case`'s options.
fn run_shapes(
    kernel: Kernel,
    case: &Case,
    shapes: [[usize; 4]; 3],
    want_weights: bool,
) -> attn_kernels::Result<AttnOutput<f32>> {
    let [q, k, v] = shapes.map(|s| vec![0.5f32; s.iter().product()]);
    let q = View4::contiguous("q", &q, shapes[0])?;
    let k = View4::contiguous("k", &k, shapes[1])?;
    let v = View4::contiguous("v", &v, shapes[2])?;
    case.run_views(kernel, &q, &KvView::F32(k), &KvView::F32(v), want_weights)
}

/// Asserts `kernel` refuses `case` on `shapes` (with and without weights) with an error `ok` accepts.
fn expect_error(kernel: Kernel, what: &str, case: &Case, shapes: [[usize; 4]; 3], ok: impl Fn(&AttnError) -> bool) {
    for want_weights in [false, true] {
        match run_shapes(kernel, case, shapes, want_weights) {
            Err(e) if ok(&e) => {}
            other => panic!("{} {what}: unexpected result {:?}", kernel.name(), other.map(|o| o.out.len())),
        }
    }
}

fn dim_mismatch(t: &'static str, d: &'static str, e: usize, f: usize) -> impl Fn(&AttnError) -> bool {
    move |err| *err == AttnError::DimMismatch { tensor: t, dim: d, expected: e, found: f }
}

fn param(field: &'static str) -> impl Fn(&AttnError) -> bool {
    move |err| matches!(err, AttnError::Param { field: f, .. } if *f == field)
}

fn broadcast(tensor: &'static str) -> impl Fn(&AttnError) -> bool {
    move |err| matches!(err, AttnError::Broadcast { tensor: t, .. } if *t == tensor)
}

/// Every invalid call gives its `AttnError` variant, naming the tensor or field.
pub fn check_errors(kernel: Kernel) {
    let plain = Case::new(dims(2, 2, 1, 5, 7, 8, 8), 0);
    let good = [[2, 2, 5, 8], [2, 1, 7, 8], [2, 1, 7, 8]];
    let heads = |err: &AttnError| matches!(err, AttnError::Heads(_));
    expect_error(kernel, "zero q heads", &plain, [[1, 0, 4, 8], [1, 1, 4, 8], [1, 1, 4, 8]], heads);
    expect_error(kernel, "zero k/v heads", &plain, [[1, 2, 4, 8], [1, 0, 4, 8], [1, 0, 4, 8]], heads);
    expect_error(kernel, "Hq % Hkv != 0", &plain, [[1, 6, 4, 8], [1, 4, 4, 8], [1, 4, 4, 8]], heads);
    let shapes = [[2, 2, 4, 8], [1, 2, 4, 8], [2, 2, 4, 8]];
    expect_error(kernel, "k batch", &plain, shapes, dim_mismatch("k", "batch", 2, 1));
    let shapes = [[2, 2, 4, 8], [2, 2, 4, 8], [1, 2, 4, 8]];
    expect_error(kernel, "v batch", &plain, shapes, dim_mismatch("v", "batch", 2, 1));
    let shapes = [[1, 2, 4, 8], [1, 2, 4, 7], [1, 2, 4, 8]];
    expect_error(kernel, "k head dim", &plain, shapes, dim_mismatch("k", "head_dim", 8, 7));
    let shapes = [[1, 2, 4, 8], [1, 2, 4, 8], [1, 1, 4, 8]];
    expect_error(kernel, "v heads", &plain, shapes, dim_mismatch("v", "heads", 2, 1));
    let shapes = [[1, 2, 4, 8], [1, 2, 5, 8], [1, 2, 4, 8]];
    expect_error(kernel, "v length", &plain, shapes, dim_mismatch("v", "length", 5, 4));
    for scale in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        expect_error(kernel, "scale", &Case { scale: Some(scale), ..plain.clone() }, good, param("scale"));
    }
    expect_error(kernel, "scale beyond f32", &Case { scale: Some(1e39), ..plain.clone() }, good, param("scale"));
    expect_error(kernel, "softcap beyond f32", &Case { softcap: Some(1e39), ..plain.clone() }, good, param("softcap"));
    let case = Case { key_lengths: Some(vec![9, 2]), ..plain.clone() };
    expect_error(kernel, "key length beyond Lk", &case, good, param("key_lengths"));
    for cap in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        expect_error(kernel, "softcap", &Case { softcap: Some(cap), ..plain.clone() }, good, param("softcap"));
    }
    for p in [1.0, 1.5, -0.1, f32::NAN] {
        let case = Case { dropout: Some(Dropout { p, seed: 1 }), ..plain.clone() };
        expect_error(kernel, "dropout", &case, good, param("dropout"));
    }
    for shape in [vec![3, 7], vec![5, 8], vec![3, 2, 5, 7], vec![2, 3, 1, 1]] {
        let n = shape.iter().product();
        let keep = Some(Dense { shape: shape.clone(), data: vec![true; n] });
        expect_error(kernel, "keep-mask broadcast", &Case { keep, ..plain.clone() }, good, broadcast("mask"));
        let bias = Some(Dense { shape, data: vec![0.0; n] });
        expect_error(kernel, "bias broadcast", &Case { bias, ..plain.clone() }, good, broadcast("bias"));
    }
    for lengths in [vec![7], vec![7, 7, 7]] {
        let found = lengths.len();
        let case = Case { key_lengths: Some(lengths), ..plain.clone() };
        expect_error(kernel, "key_lengths", &case, good, dim_mismatch("key_lengths", "batch", 2, found));
    }
}

/// Results no address space can hold are refused with [`AttnError::Alloc`] naming the buffer,
/// forward and backward: the inputs are stride-0 views of one element, so only the shapes are huge.
pub fn check_too_large(kernel: Kernel) {
    let one = [0.5f32];
    let column = |name, len| View4::strided(name, &one, [1, 1, len, 1], [0, 0, 0]).unwrap();
    let too_large = |what: &str, r: Result<(), AttnError>| match r {
        Err(AttnError::Alloc(e)) if e.too_large && e.what == what => {}
        other => panic!("{} {what}: expected an allocation error, got {other:?}", kernel.name()),
    };
    // Weights [1, 1, 2^20, 2^41] f32: 2^63 bytes.
    let (q, kv) = (column("q", 1 << 20), KvView::F32(column("k", 1 << 41)));
    let params = AttnParams::default();
    too_large("attention weights", attention(kernel, &q, &kv, &kv, &params, true).map(drop));
    // Output [1, 1, 2^61, 1] f32.
    let (q, kv) = (column("q", 1 << 61), KvView::F32(column("k", 1)));
    too_large("attention output", attention(kernel, &q, &kv, &kv, &params, false).map(drop));
    // Key gradient [1, 1, 2^61, 1] f32, for a forward of one query row.
    let (q, kv) = (column("q", 1), KvView::F32(column("k", 1 << 61)));
    let saved = Saved {
        out: column("out", 1),
        lse: &one,
        lse_residue: None,
        forward_path: None,
        dout: column("grad_out", 1),
        side: Default::default(),
    };
    too_large("gradient dk", attention_backward(kernel, &q, &kv, &kv, &saved, &params, false).map(drop));
}

/// `Dk = 0` and `Dv = 0` as PyTorch lays them out — strides of the full shape over an empty
/// buffer (`[H·L·D, L·D, D]` with the `D` of the other side) — forward and backward: `Dk = 0`
/// scores every key 0, so each row's output is the mean of its allowed values and `lse = ln Lk`;
/// `Dv = 0` gives an empty output beside the same log-sum-exps, and zero gradients.
pub fn check_degenerate_strided(kernel: Kernel) {
    let (b, h, lq, lk, d) = (2, 3, 5, 7, 4);
    let values: Vec<f32> = (0..b * h * lk * d).map(|x| (x % 11) as f32 * 0.25 - 1.0).collect();
    let keys: Vec<f32> = values.iter().map(|x| x * 0.5).collect();
    let strides = |l: usize, d: usize| [h * l * d, l * d, d];
    let empty: [f32; 0] = [];
    // Dk = 0: q and k are empty with strides of D = 4, v is whole.
    let q = View4::strided("q", &empty, [b, h, lq, 0], strides(lq, d)).unwrap();
    let k = View4::strided("k", &empty, [b, h, lk, 0], strides(lk, d)).unwrap();
    let v = View4::contiguous("v", &values, [b, h, lk, d]).unwrap();
    let (kv, vv) = (KvView::F32(k), KvView::F32(v));
    let params = AttnParams::default();
    let r = attention(kernel, &q, &kv, &vv, &params, true).unwrap();
    for bh in 0..b * h {
        let rows = &values[bh * lk * d..][..lk * d];
        let mean: Vec<f32> = (0..d).map(|c| (0..lk).map(|j| rows[j * d + c]).sum::<f32>() / lk as f32).collect();
        for i in 0..lq {
            let o = &r.out[(bh * lq + i) * d..][..d];
            for (x, m) in o.iter().zip(&mean) {
                assert!((x - m).abs() <= 1e-6, "{}: Dk = 0 output {x}, expected the mean {m}", kernel.name());
            }
            assert!((r.lse[bh * lq + i] - (lk as f32).ln()).abs() <= 1e-6, "{}: Dk = 0 lse", kernel.name());
        }
    }
    let dout = View4::contiguous("dout", &values[..b * h * lq * d], [b, h, lq, d]).unwrap();
    let out = View4::contiguous("out", &r.out, [b, h, lq, d]).unwrap();
    let g = backward_after(kernel, &q, [&kv, &vv], &r, [out, dout]);
    assert!(g.dq.is_empty() && g.dk.is_empty(), "{}: Dk = 0 gradients of q and k are empty", kernel.name());
    let total: f32 = g.dv.iter().sum();
    let want: f32 = values[..b * h * lq * d].iter().sum();
    assert!(
        (total - want).abs() <= 1e-4 * want.abs().max(1.0),
        "{}: Dk = 0 dv sums to {total}, not {want}",
        kernel.name()
    );
    // Dv = 0: v is empty with strides of D = 4; the output is empty and the lse is that of the scores.
    let q = View4::contiguous("q", &keys[..b * h * lq * d], [b, h, lq, d]).unwrap();
    let k = View4::contiguous("k", &keys, [b, h, lk, d]).unwrap();
    let v = View4::strided("v", &empty, [b, h, lk, 0], strides(lk, d)).unwrap();
    let (kv, vv) = (KvView::F32(k), KvView::F32(v));
    let r = attention(kernel, &q, &kv, &vv, &params, false).unwrap();
    let r64 = attn_kernels::reference::<f64>(
        &View4::contiguous("q", &widen(&keys[..b * h * lq * d]), [b, h, lq, d]).unwrap(),
        &View4::contiguous("k", &widen(&keys), [b, h, lk, d]).unwrap(),
        &View4::contiguous("v", &[], [b, h, lk, 0]).unwrap(),
        &AttnParams::default(),
        false,
    )
    .unwrap();
    assert!(r.out.is_empty(), "{}: Dv = 0 output is empty", kernel.name());
    for (x, y) in r.lse.iter().zip(&r64.lse) {
        assert!((*x as f64 - y).abs() <= 1e-5, "{}: Dv = 0 lse {x}, reference {y}", kernel.name());
    }
    let dout = View4::strided("dout", &empty, [b, h, lq, 0], strides(lq, d)).unwrap();
    let out = View4::strided("out", &empty, [b, h, lq, 0], strides(lq, d)).unwrap();
    let g = backward_after(kernel, &q, [&kv, &vv], &r, [out, dout]);
    assert!(g.dq.iter().chain(&g.dk).all(|&x| x == 0.0), "{}: Dv = 0 gives zero gradients", kernel.name());
    assert_eq!((g.dq.len(), g.dk.len(), g.dv.len()), (b * h * lq * d, b * h * lk * d, 0));
}

/// The backward of the plain call on `q`, `[k, v]` after its forward `r`, with its output `out` and the
/// output's gradient `dout` as views.
fn backward_after(
    kernel: Kernel,
    q: &View4<f32>,
    [k, v]: [&KvView; 2],
    r: &AttnOutput<f32>,
    [out, dout]: [View4<f32>; 2],
) -> attn_kernels::AttnGrads<f32> {
    let saved = Saved {
        out,
        lse: &r.lse,
        lse_residue: Some(&r.lse_residue),
        forward_path: r.path,
        dout,
        side: Default::default(),
    };
    attention_backward(kernel, q, k, v, &saved, &AttnParams::default(), false).unwrap()
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}
