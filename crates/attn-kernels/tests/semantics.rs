//! Deterministic semantics of every kernel, each compared with `reference::<f64>` under the oracle
//! rule: sizes at tile edges, every mask form alone and combined, fully masked rows, non-finite
//! values in masked and unmasked inputs, GQA, strided views, half-precision K/V, dropout, empty
//! sizes and parameter errors. The mask structure (which weights are zero, which rows are empty) is
//! also checked against the rules as documented, independently of the reference's mask code.

use crate::common;
use crate::semantics_parts;

use attn_kernels::{Align, Kernel, Window};
use common::{broadcast_shape, dims, kernel_tests, random_bias, random_keep, Case, Rng, SHAPE_CODES};
use semantics_parts::{dropout::*, inputs::*, limits::*};

kernel_tests! {
    tile_edges => check_tile_edges,
    rectangular => check_rectangular,
    causal => check_causal,
    windows => check_windows,
    key_lengths => check_key_lengths,
    keep_masks => check_keep_masks,
    bias => check_bias,
    softcap => check_softcap,
    scale => check_scale,
    combined => check_combined,
    fully_masked => check_fully_masked,
    masked_nonfinite => check_masked_nonfinite,
    nan_propagation => check_nan_propagation,
    gqa => check_gqa,
    strided => check_strided,
    half_kv => check_half_kv,
    dropout_determinism => check_dropout_determinism,
    dropout_pattern => check_dropout_pattern,
    dropout_mean => check_dropout_mean,
    empty => check_empty,
    degenerate_strided => check_degenerate_strided,
    errors => check_errors,
    too_large => check_too_large,
    weights => check_weights,
}

/// Lengths around the usual tile sizes.
const EDGES: [usize; 13] = [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129];
/// Head dimensions: tiny, vector-width, common, odd multiple of 16, large.
const HEAD_DIMS: [usize; 5] = [1, 8, 64, 80, 128];
/// Both alignments.
const ALIGNS: [Align; 2] = [Align::TopLeft, Align::BottomRight];

/// Checks `case` with `kernel` and the mask structure of the result; returns the number of fully
/// masked rows.
fn check_case(kernel: Kernel, case: &Case, what: &str) -> usize {
    let res = case.check(kernel, what);
    case.assert_structure(&format!("{} {what} [{}]", kernel.name(), case.describe()), &res)
}

fn check_tile_edges(kernel: Kernel) {
    for (n, &l) in EDGES.iter().enumerate() {
        let d = HEAD_DIMS[n % HEAD_DIMS.len()];
        check_case(kernel, &Case::new(dims(1, 2, 1, l, l, d, d), n as u64), "square");
    }
    for (n, &d) in HEAD_DIMS.iter().enumerate() {
        for l in [17, 64, 65] {
            check_case(kernel, &Case::new(dims(2, 2, 2, l, l, d, d), 100 + n as u64), "head dims");
        }
    }
}

fn check_rectangular(kernel: Kernel) {
    let shapes = [
        (15, 33, 8, 80),
        (33, 15, 80, 8),
        (17, 129, 64, 128),
        (129, 17, 128, 64),
        (64, 65, 1, 8),
        (65, 64, 8, 1),
        (31, 127, 80, 64),
        (127, 31, 64, 80),
        (1, 129, 128, 1),
    ];
    for (n, &(lq, lk, dk, dv)) in shapes.iter().enumerate() {
        check_case(kernel, &Case::new(dims(2, 2, 1, lq, lk, dk, dv), n as u64), "Lq != Lk, Dk != Dv");
    }
    for (n, &lk) in [1, 16, 17, 64, 65, 129, 500, 999, 1000].iter().enumerate() {
        let d = [64, 128, 80][n % 3];
        check_case(kernel, &Case::new(dims(2, 8, 2, 1, lk, d, d), 50 + n as u64), "decode");
    }
}

fn check_causal(kernel: Kernel) {
    let shapes = [
        (1, 1),
        (16, 16),
        (17, 17),
        (33, 33),
        (64, 64),
        (65, 65),
        (15, 33),
        (33, 15),
        (1, 65),
        (65, 1),
        (63, 129),
        (129, 63),
        (128, 129),
        (1, 1000),
    ];
    for align in ALIGNS {
        for (n, &(lq, lk)) in shapes.iter().enumerate() {
            let d = HEAD_DIMS[n % HEAD_DIMS.len()];
            let case = Case { causal: true, align, ..Case::new(dims(1, 2, 1, lq, lk, d, d + 8), n as u64) };
            let empty = check_case(kernel, &case, "causal");
            let expect_empty = align == Align::BottomRight && lq > lk;
            assert_eq!(empty > 0, expect_empty, "{}: fully masked rows {empty}", case.describe());
        }
    }
}

fn check_windows(kernel: Kernel) {
    let windows = [
        (Some(0), Some(0)),
        (Some(1), Some(0)),
        (Some(16), None),
        (None, Some(15)),
        (Some(17), Some(3)),
        (Some(32), Some(32)),
        (None, None),
        (Some(0), None),
        (None, Some(0)),
    ];
    let shapes = [(33, 33), (17, 65), (65, 17), (1, 300)];
    let mut seed = 0;
    for (left, right) in windows {
        for align in ALIGNS {
            for &(lq, lk) in &shapes {
                for causal in [false, true] {
                    seed += 1;
                    let d = [8, 64, 80][seed as usize % 3];
                    let window = Some(Window { left, right });
                    let case = Case { causal, window, align, ..Case::new(dims(1, 2, 2, lq, lk, d, d), seed) };
                    check_case(kernel, &case, "window");
                }
            }
        }
    }
}

fn check_key_lengths(kernel: Kernel) {
    let lengths = vec![0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 130];
    let base = Case::new(dims(lengths.len(), 2, 1, 17, 130, 64, 32), 1);
    let case = Case { key_lengths: Some(lengths.clone()), ..base.clone() };
    assert_eq!(check_case(kernel, &case, "key_lengths"), 2 * 17);
    for align in ALIGNS {
        let case = Case { causal: true, align, key_lengths: Some(lengths.clone()), ..base.clone() };
        check_case(kernel, &case, "key_lengths + causal");
        let window = Some(Window { left: Some(20), right: Some(5) });
        let case = Case { window, align, key_lengths: Some(lengths.clone()), ..base.clone() };
        check_case(kernel, &case, "key_lengths + window");
    }
    let decode = Case { key_lengths: Some(vec![1000, 999, 513, 0]), ..Case::new(dims(4, 4, 2, 1, 1000, 80, 80), 2) };
    check_case(kernel, &decode, "decode key_lengths");
}

fn check_keep_masks(kernel: Kernel) {
    let base = Case::new(dims(2, 4, 2, 17, 33, 16, 24), 3);
    let mut rng = Rng::new(4);
    for code in 0..SHAPE_CODES {
        let shape = broadcast_shape(base.target(), code);
        let case = Case { keep: Some(random_keep(&shape, 0.7, &mut rng)), ..base.clone() };
        check_case(kernel, &case, "keep-mask");
    }
    // Whole rows false (rows 3 and 16 of every head) and whole columns false.
    let mut keep = random_keep(&[17, 33], 0.8, &mut rng);
    keep.data[3 * 33..4 * 33].fill(false);
    keep.data[16 * 33..].fill(false);
    (0..17).for_each(|i| keep.data[i * 33 + 32] = false);
    let case = Case { keep: Some(keep), ..base.clone() };
    assert_eq!(check_case(kernel, &case, "keep-mask empty rows"), 2 * 4 * 2);
    let sparse = Case::new(dims(1, 2, 1, 65, 129, 64, 64), 5);
    let keep = Some(random_keep(&sparse.target(), 0.05, &mut rng));
    check_case(kernel, &Case { keep, ..sparse }, "sparse keep-mask");
}

fn check_bias(kernel: Kernel) {
    let base = Case::new(dims(2, 4, 2, 17, 33, 16, 24), 6);
    let mut rng = Rng::new(7);
    for code in 0..SHAPE_CODES {
        let shape = broadcast_shape(base.target(), code);
        check_case(kernel, &Case { bias: Some(random_bias(&shape, 3.0, 0.0, &mut rng)), ..base.clone() }, "bias");
        let bias = Some(random_bias(&shape, 3.0, 0.15, &mut rng));
        check_case(kernel, &Case { bias, ..base.clone() }, "bias with -inf");
    }
    let mut bias = random_bias(&[17, 33], 2.0, 0.1, &mut rng);
    bias.data[5 * 33..6 * 33].fill(f32::NEG_INFINITY);
    assert_eq!(check_case(kernel, &Case { bias: Some(bias), ..base.clone() }, "-inf bias rows"), 2 * 4);
    // A wide range of biases: the running maximum changes by large steps across key tiles.
    let wide = Case::new(dims(1, 2, 1, 33, 129, 64, 64), 8);
    let bias = Some(random_bias(&wide.target(), 60.0, 0.05, &mut rng));
    check_case(kernel, &Case { bias, ..wide }, "wide bias");
}

fn check_softcap(kernel: Kernel) {
    let mut rng = Rng::new(9);
    for (n, cap) in [0.5, 5.0, 50.0].into_iter().enumerate() {
        let mut base = Case { softcap: Some(cap), ..Case::new(dims(2, 2, 1, 33, 65, 64, 32), n as u64) };
        base.q.iter_mut().for_each(|x| *x *= 4.0);
        check_case(kernel, &base, "softcap");
        let bias = Some(random_bias(&[33, 65], 2.0, 0.1, &mut rng));
        let case = Case { causal: true, align: Align::BottomRight, bias, ..base };
        check_case(kernel, &case, "softcap + causal + bias");
    }
}

fn check_scale(kernel: Kernel) {
    for (n, scale) in
        [Some(-0.3), Some(-1.0), Some(0.0), Some(1e-3), Some(2.5), Some(10.0), None].into_iter().enumerate()
    {
        let base = Case { scale, ..Case::new(dims(1, 2, 1, 65, 65, 64, 64), n as u64) };
        check_case(kernel, &base, "scale");
        check_case(kernel, &Case { causal: true, ..base }, "scale + causal");
    }
}

fn check_combined(kernel: Kernel) {
    let mut rng = Rng::new(10);
    let base = Case::new(dims(3, 8, 2, 47, 129, 80, 64), 11);
    for (n, align) in ALIGNS.into_iter().enumerate() {
        let case = Case {
            causal: true,
            align,
            window: Some(Window { left: Some(40), right: Some(0) }),
            key_lengths: Some(vec![129, 64, 17]),
            keep: Some(random_keep(&[8, 1, 129], 0.8, &mut rng)),
            bias: Some(random_bias(&[3, 1, 47, 129], 2.0, 0.1, &mut rng)),
            softcap: Some(20.0),
            scale: Some(if n == 0 { -0.2 } else { 0.15 }),
            ..base.clone()
        };
        check_case(kernel, &case, "combined");
        let window = Some(Window { left: Some(16), right: Some(33) });
        check_case(kernel, &Case { causal: false, window, ..case.clone() }, "combined, two-sided window");
        let dropout = Some(attn_kernels::Dropout { p: 0.2, seed: 77 });
        check_case(kernel, &Case { dropout, ..case }, "combined + dropout");
    }
}

fn check_fully_masked(kernel: Kernel) {
    let mut rng = Rng::new(12);
    let base = Case::new(dims(3, 2, 1, 40, 17, 32, 16), 13);
    let mut keep = random_keep(&[3, 2, 40, 17], 0.6, &mut rng);
    keep.data[..17].fill(false);
    keep.data[5 * 40 * 17..5 * 40 * 17 + 17 * 3].fill(false);
    let mut bias = random_bias(&[40, 17], 1.0, 0.0, &mut rng);
    bias.data[7 * 17..9 * 17].fill(f32::NEG_INFINITY);
    let cases = [
        ("zero key lengths", Case { key_lengths: Some(vec![0, 5, 0]), ..base.clone() }),
        ("bottom-right causal, Lq > Lk", Case { causal: true, align: Align::BottomRight, ..base.clone() }),
        ("diagonal window past Lk", Case { window: Some(Window { left: Some(0), right: Some(0) }), ..base.clone() }),
        (
            "window beyond key length",
            Case {
                window: Some(Window { left: Some(2), right: Some(2) }),
                key_lengths: Some(vec![10, 17, 3]),
                ..base.clone()
            },
        ),
        ("keep-mask rows", Case { keep: Some(keep), ..base.clone() }),
        ("-inf bias rows", Case { bias: Some(bias), ..base.clone() }),
    ];
    for (what, case) in cases {
        assert!(check_case(kernel, &case, what) > 0, "{what}: the case has no fully masked row");
    }
}

fn check_masked_nonfinite(kernel: Kernel) {
    let mut rng = Rng::new(14);
    let tile_lengths = vec![0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65];
    let by_length = Case { key_lengths: Some(tile_lengths), ..Case::new(dims(11, 2, 1, 20, 80, 64, 64), 15) };
    let long = Case { key_lengths: Some(vec![127, 128, 129]), ..Case::new(dims(3, 2, 2, 5, 140, 80, 8), 16) };
    let mut cases = vec![
        ("key_lengths at tile edges", by_length.clone()),
        ("long key_lengths", long),
        ("top-left causal, Lq < Lk", Case { causal: true, ..Case::new(dims(1, 2, 1, 17, 65, 64, 64), 17) }),
        ("top-left causal, Lq < Lk", Case { causal: true, ..Case::new(dims(1, 1, 1, 33, 129, 8, 8), 18) }),
        ("key_lengths + causal", Case { causal: true, align: Align::BottomRight, ..by_length }),
    ];
    let windows = [
        (Some(31), Some(0), Align::BottomRight, 1, 300),
        (Some(16), None, Align::BottomRight, 16, 200),
        (None, Some(20), Align::TopLeft, 1, 100),
        (Some(0), Some(30), Align::TopLeft, 10, 100),
        (Some(8), Some(0), Align::BottomRight, 3, 64),
    ];
    for (n, (left, right, align, lq, lk)) in windows.into_iter().enumerate() {
        let window = Some(Window { left, right });
        cases.push(("window", Case { window, align, ..Case::new(dims(2, 2, 1, lq, lk, 64, 64), 20 + n as u64) }));
    }
    let base = Case::new(dims(2, 4, 2, 17, 70, 32, 32), 30);
    cases.push(("keep-mask columns", Case { keep: Some(random_keep(&[70], 0.6, &mut rng)), ..base.clone() }));
    let keep = Some(random_keep(&[2, 1, 1, 70], 0.6, &mut rng));
    cases.push(("keep-mask per batch", Case { keep, ..base.clone() }));
    let keep = Some(random_keep(&[1, 4, 1, 70], 0.5, &mut rng));
    cases.push(("keep-mask per head", Case { keep, ..base.clone() }));
    let bias = Some(random_bias(&[2, 1, 1, 70], 2.0, 0.3, &mut rng));
    cases.push(("-inf bias columns", Case { bias, ..base.clone() }));
    let combined = Case {
        causal: true,
        key_lengths: Some(vec![33, 64]),
        keep: Some(random_keep(&[70], 0.8, &mut rng)),
        bias: Some(random_bias(&[2, 1, 1, 70], 2.0, 0.2, &mut rng)),
        ..base
    };
    cases.push(("combined", combined));
    for (what, clean) in cases {
        check_poisoned(kernel, &clean, what);
    }
}

/// Fills every key that no query may attend with NaN/±∞ and checks the kernel still matches the
/// clean oracle, while the reference itself is unchanged bit for bit.
fn check_poisoned(kernel: Kernel, clean: &Case, what: &str) {
    let label = format!("{} {what} [{}]", kernel.name(), clean.describe());
    let masked = clean.keys_masked_everywhere();
    assert!(!masked.is_empty(), "{label}: no key is masked for every query");
    let mut dirty = clean.clone();
    masked.iter().for_each(|&(b, g, j)| dirty.poison_key(b, g, j));
    let oracle = clean.oracle();
    assert_eq!(dirty.reference64(true).unwrap(), oracle.r64, "{label}: reference64 read a masked key");
    for want_weights in [false, true] {
        let fast = dirty.run(kernel, want_weights).unwrap_or_else(|e| panic!("{label}: {e}"));
        common::assert_oracle(&format!("{label} (poisoned masked keys)"), &fast, &oracle);
    }
}

fn check_weights(kernel: Kernel) {
    let mut rng = Rng::new(40);
    let base = Case::new(dims(2, 4, 2, 33, 65, 16, 16), 41);
    let cases = [
        Case { causal: true, key_lengths: Some(vec![65, 20]), ..base.clone() },
        Case { keep: Some(random_keep(&[2, 4, 33, 65], 0.3, &mut rng)), ..base.clone() },
        Case { bias: Some(random_bias(&[4, 33, 65], 5.0, 0.3, &mut rng)), softcap: Some(3.0), ..base.clone() },
        Case { window: Some(Window { left: Some(4), right: Some(4) }), align: Align::BottomRight, ..base },
        Case::new(dims(1, 2, 1, 1, 1000, 64, 64), 42),
    ];
    for case in cases {
        check_case(kernel, &case, "weights");
    }
}
