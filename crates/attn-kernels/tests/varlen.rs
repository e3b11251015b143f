//! Packed variable-length sequences (`attention_varlen` and its backward): every kernel against
//! each sequence run alone through `reference::<f64>` under the oracle rule, forward and
//! gradients — causal in both alignments with `Lq ≠ Lk` per sequence, windows, grouped-query
//! heads, half-precision K/V, soft-cap and scale, empty sequences, dropout — and a property test
//! over random lengths and options; the packed result equals the dense kernel on each sequence
//! alone bit for bit, forward and gradients, with f32 and bfloat16 products; dropout is keyed per
//! sequence; sinks join every sequence's rows (`dsinks` summed over them); bad offsets, masks with
//! no packed form, score modifications and bad sinks are typed errors naming the field.

use crate::common;
use crate::varlen_parts;

use attn_kernels::score_mod::Softcap;
use attn_kernels::sparse::patterns::GlobalKeys;
use attn_kernels::{
    attention, attention_backward, attention_varlen, attention_varlen_backward, Align, AttnError, AttnParams,
    Broadcast, CuSeqlens, Dropout, Kernel, KvView, MaskSpec, Packed, Precision, Saved, VarlenSaved, View4, Window,
};
use attn_kernels::{BlockMask, BlockShape, ScoreFn};
use common::kernel_tests;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::sync::Arc;
use varlen_parts::case::{head_major, KvType, PackedCase};

kernel_tests! {
    causal_both_alignments => check_causal,
    window_gqa_and_options => check_window_gqa_options,
    half_precision_kv => check_half_kv,
    empty_sequences => check_empty,
    dropout_per_sequence => check_dropout,
    random_lengths => check_random,
    dense_bit_for_bit => check_dense_bits,
    sinks => check_sinks,
}

/// Lengths with `Lq ≠ Lk` in both directions, a single query, and tile edges (24, 64, 65 rows).
const LENS: [(usize, usize); 6] = [(7, 7), (5, 12), (12, 5), (1, 30), (65, 64), (24, 33)];

fn check_causal(kernel: Kernel) {
    for (align, seed) in [(Align::TopLeft, 1), (Align::BottomRight, 2)] {
        let case = PackedCase { causal: true, align, ..PackedCase::new(&LENS, (4, 2), (16, 8), seed) };
        case.check(kernel, "causal");
    }
}

fn check_window_gqa_options(kernel: Kernel) {
    let base = PackedCase::new(&LENS, (6, 2), (12, 20), 3);
    let window = |l, r| Some(Window { left: l, right: r });
    PackedCase { window: window(Some(3), Some(1)), ..base.clone() }.check(kernel, "window");
    PackedCase { window: window(Some(4), Some(0)), align: Align::BottomRight, ..base.clone() }
        .check(kernel, "window bottom-right");
    PackedCase { causal: true, window: window(Some(2), None), ..base.clone() }.check(kernel, "causal window");
    PackedCase { softcap: Some(2.0), scale: Some(-0.7), ..base.clone() }.check(kernel, "softcap, negative scale");
    PackedCase::new(&LENS, (3, 3), (8, 8), 4).check(kernel, "no grouping");
}

fn check_half_kv(kernel: Kernel) {
    for (kv, seed) in [(KvType::F16, 5), (KvType::Bf16, 6)] {
        let case = PackedCase { causal: true, ..PackedCase::new(&LENS, (4, 1), (16, 16), seed) }.stored_as(kv);
        case.check(kernel, "half-precision K/V");
    }
}

/// Sequences without queries, without keys or without either, first, inside and last; and no
/// sequence at all. Rows with no key get output 0 and lse −∞, keys no query sees gradient 0.
fn check_empty(kernel: Kernel) {
    let lens = [(0, 4), (3, 0), (0, 0), (6, 9), (0, 0), (4, 4), (2, 0)];
    let case = PackedCase { causal: true, align: Align::BottomRight, ..PackedCase::new(&lens, (2, 1), (8, 8), 7) };
    case.check(kernel, "empty sequences");
    let out = case.run(kernel).unwrap();
    let tq = case.totals().0;
    // Sequence 1 (rows 0..3) has no keys.
    assert!(out.out[..3 * 2 * 8].iter().all(|&x| x == 0.0), "{}: keyless rows not 0", kernel.name());
    assert!((0..2).all(|h| out.lse[h * tq..h * tq + 3].iter().all(|&l| l == f32::NEG_INFINITY)));
    let g = case.grads(kernel, &case.random_dout(1)).unwrap();
    // Keys 0..4 belong to sequence 0, which has no queries.
    assert!(g.dk[..4 * 8].iter().chain(&g.dv[..4 * 8]).all(|&x| x == 0.0), "{}: unseen keys' gradient", kernel.name());
    assert!(g.dq[..3 * 2 * 8].iter().all(|&x| x == 0.0), "{}: keyless rows' dq not 0", kernel.name());
    let none = PackedCase::new(&[], (2, 1), (8, 8), 8);
    let r = none.run(kernel).unwrap();
    assert!(r.out.is_empty() && r.lse.is_empty());
}

/// Dropout against the reference with each sequence's own seed; a sequence's decisions do not
/// depend on the other sequences; two equal sequences get different decisions.
fn check_dropout(kernel: Kernel) {
    let base = PackedCase::new(&[(9, 9), (9, 9), (20, 31)], (2, 2), (8, 8), 9);
    let mut case = PackedCase { causal: true, dropout: Some(Dropout { p: 0.3, seed: 77 }), ..base };
    // Sequence 1 equal to sequence 0.
    let (qn, kn) = (9 * 2 * 8, 9 * 2 * 8);
    case.q.copy_within(..qn, qn);
    case.k.copy_within(..kn, kn);
    case.v.copy_within(..kn, kn);
    case.check(kernel, "dropout");
    let out = case.run(kernel).unwrap();
    let diff = out.out[..qn].iter().zip(&out.out[qn..2 * qn]).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff > 0.01, "{}: two equal sequences got the same dropout", kernel.name());
    let mut other = case.clone();
    other.q[2 * qn..].iter_mut().for_each(|x| *x = -*x);
    let again = other.run(kernel).unwrap();
    assert_eq!(
        out.out[..2 * qn],
        again.out[..2 * qn],
        "{}: another sequence changed sequence 0's dropout",
        kernel.name()
    );
}

/// Sinks (one logit per query head, a −∞ one among them) join the rows of every sequence, forward
/// and gradients with `dsinks` summed over the sequences, with and without dropout; a sequence
/// with no keys gets output 0 and its head's sink as log-sum-exp.
fn check_sinks(kernel: Kernel) {
    let lens = [(7, 7), (3, 0), (12, 5), (65, 64), (0, 4)];
    let sinks = vec![0.5, -1.0, 2.0, f32::NEG_INFINITY];
    let case = PackedCase { causal: true, sinks: Some(sinks.clone()), ..PackedCase::new(&lens, (4, 2), (16, 8), 11) };
    case.check(kernel, "sinks");
    let out = case.run(kernel).unwrap();
    let tq = case.totals().0;
    // Sequence 1 (rows 7..10) has no keys.
    assert!(out.out[7 * 4 * 8..10 * 4 * 8].iter().all(|&x| x == 0.0), "{}: keyless rows not 0", kernel.name());
    for (h, &sink) in sinks.iter().enumerate() {
        let lse = &out.lse[h * tq + 7..h * tq + 10];
        assert!(lse.iter().all(|&l| l == sink), "{} head {h}: keyless rows' lse {lse:?}, sink {sink}", kernel.name());
    }
    PackedCase { dropout: Some(Dropout { p: 0.25, seed: 5 }), ..case }.check(kernel, "sinks, dropout");
}

/// Each sequence's rows of the packed result and gradients equal the dense kernel on that sequence
/// alone (its rows copied into a contiguous `[1, H, L, D]`), bit for bit, with f32 and with
/// bfloat16 products: packing changes nothing else.
fn check_dense_bits(kernel: Kernel) {
    for compute in [Precision::F32, Precision::Bf16] {
        let case = PackedCase { causal: true, compute, ..PackedCase::new(&LENS, (4, 2), (16, 8), 10) };
        let dout = case.random_dout(3);
        let (packed, grads) = (case.run(kernel).unwrap(), case.grads(kernel, &dout).unwrap());
        let (cq, ck) = (case.cu_q(), case.cu_k());
        let (hq, hkv, dk, dv) = (case.hq, case.hkv, case.dk, case.dv);
        for s in 0..case.lens.len() {
            let (qr, kr) = (cq[s]..cq[s + 1], ck[s]..ck[s + 1]);
            let (q, k, v, g) = (
                head_major::<f32>(&case.q, &qr, hq, dk),
                head_major(&case.k, &kr, hkv, dk),
                head_major(&case.v, &kr, hkv, dv),
                head_major(&dout, &qr, hq, dv),
            );
            let q = View4::contiguous("q", &q, [1, hq, qr.len(), dk]).unwrap();
            let k = KvView::F32(View4::contiguous("k", &k, [1, hkv, kr.len(), dk]).unwrap());
            let v = KvView::F32(View4::contiguous("v", &v, [1, hkv, kr.len(), dv]).unwrap());
            let params = case.params();
            let dense = attention(kernel, &q, &k, &v, &params, false).unwrap();
            let g = View4::contiguous("grad_out", &g, [1, hq, qr.len(), dv]).unwrap();
            let saved = Saved::of(&dense, [1, hq, qr.len(), dv], g).unwrap();
            let dg = attention_backward(kernel, &q, &k, &v, &saved, &params, false).unwrap();
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            let parts = [
                ("out", head_major(&packed.out, &qr, hq, dv), &dense.out),
                ("dq", head_major(&grads.dq, &qr, hq, dk), &dg.dq),
                ("dk", head_major(&grads.dk, &kr, hkv, dk), &dg.dk),
                ("dv", head_major(&grads.dv, &kr, hkv, dv), &dg.dv),
            ];
            for (what, got, want) in parts {
                assert!(
                    same(&got, want),
                    "{} {compute:?}: sequence {s}'s {what} differs from the dense call",
                    kernel.name()
                );
            }
        }
    }
}

prop_compose! {
    fn random_case()(
        lens in prop::collection::vec((0usize..=40, 0usize..=50), 0..=5),
        same_lengths in any::<bool>(),
        hkv in 1usize..=2, group in 1usize..=3, dk in 1usize..=24, dv in 1usize..=24,
        causal in any::<bool>(), bottom_right in any::<bool>(),
        window in prop::option::weighted(0.4, (prop::option::weighted(0.7, 0usize..24), prop::option::weighted(0.7, 0usize..24))),
        softcap in prop::option::weighted(0.3, 0.5f64..30.0),
        scale in prop::option::weighted(0.3, -2.0f64..2.0),
        dropout in prop::option::weighted(0.3, 0.05f32..0.9),
        seed in any::<u64>(),
    ) -> PackedCase {
        let lens: Vec<_> = lens.into_iter().map(|(lq, lk)| (lq, if same_lengths { lq } else { lk })).collect();
        PackedCase {
            causal,
            align: if bottom_right { Align::BottomRight } else { Align::TopLeft },
            window: window.map(|(left, right)| Window { left, right }),
            softcap,
            scale,
            dropout: dropout.map(|p| Dropout { p, seed: seed.rotate_left(17) }),
            ..PackedCase::new(&lens, (hkv * group, hkv), (dk, dv), seed)
        }
    }
}

/// Random lengths (empty ones included) and options, forward and gradients against the oracle.
fn check_random(kernel: Kernel) {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    if let Err(e) = runner.run(&random_case(), |case| {
        case.check(kernel, "random");
        Ok(())
    }) {
        panic!("{} random lengths: {e}", kernel.name());
    }
}

/// The error of a packed forward on `case` with offsets `cq`, `ck` and parameters `params`.
fn refusal(case: &PackedCase, cq: &[usize], ck: &[usize], params: &AttnParams<f32>) -> AttnError {
    let (tq, tk) = case.totals();
    let q = Packed::contiguous("q", &case.q, [tq, case.hq, case.dk]).unwrap();
    let k = Packed::contiguous("k", &case.k, [tk, case.hkv, case.dk]).unwrap();
    let v = Packed::contiguous("v", &case.v, [tk, case.hkv, case.dv]).unwrap();
    attention_varlen(Kernel::Auto, &q, &k.into(), &v.into(), &CuSeqlens { q: cq, k: ck }, params).unwrap_err()
}

fn assert_field(e: AttnError, field: &str, says: &str) {
    match &e {
        AttnError::Param { field: f, reason } if *f == field && reason.contains(says) => {}
        _ => panic!("expected a {field} error saying '{says}', got {e:?}"),
    }
}

#[test]
fn bad_offsets_are_errors_naming_the_field() {
    let case = PackedCase::new(&[(3, 4), (5, 2)], (2, 1), (4, 4), 11);
    let p = case.params();
    let (cq, ck) = (case.cu_q(), case.cu_k());
    assert_field(refusal(&case, &[], &ck, &p), "cu_seqlens_q", "empty");
    assert_field(refusal(&case, &[1, 3, 8], &ck, &p), "cu_seqlens_q", "starts at 1, expected 0");
    assert_field(refusal(&case, &cq, &[0, 5, 4, 6], &p), "cu_seqlens_k", "entry 2 is 4, less than entry 1 (5)");
    assert_field(refusal(&case, &[0, 3, 7], &ck, &p), "cu_seqlens_q", "ends at 7, expected the 8 rows of q");
    assert_field(refusal(&case, &cq, &[0, 4, 5], &p), "cu_seqlens_k", "ends at 5, expected the 6 rows of k");
    assert_field(refusal(&case, &cq, &[0, 2, 4, 6], &p), "cu_seqlens_k", "4 entries, but cu_seqlens_q has 3");
}

#[test]
fn element_masks_and_key_lengths_are_refused() {
    let case = PackedCase::new(&[(3, 4), (5, 2)], (2, 1), (4, 4), 12);
    let (cq, ck) = (case.cu_q(), case.cu_k());
    let keep = [true; 4];
    let bias = [0.0f32; 4];
    let with = |mask: MaskSpec<'static, f32>| AttnParams { mask, ..case.params() };
    let lengths: &'static [usize] = &[1, 2];
    assert_field(
        refusal(&case, &cq, &ck, &with(MaskSpec { key_lengths: Some(lengths), ..MaskSpec::default() })),
        "key_lengths",
        "cu_seqlens_k",
    );
    let keep = Broadcast::new("mask", &keep, &[4]).unwrap();
    let e = refusal(
        &case,
        &cq,
        &ck,
        &AttnParams { mask: MaskSpec { keep: Some(keep), ..MaskSpec::default() }, ..case.params() },
    );
    assert_field(e, "mask", "element-wise");
    let bias = Broadcast::new("bias", &bias, &[4]).unwrap();
    let e = refusal(
        &case,
        &cq,
        &ck,
        &AttnParams { mask: MaskSpec { bias: Some(bias), ..MaskSpec::default() }, ..case.params() },
    );
    assert_field(e, "bias", "element-wise");
}

#[test]
fn block_masks_score_modifications_and_bad_sinks_are_refused() {
    let case = PackedCase::new(&[(3, 4), (5, 2)], (2, 1), (4, 4), 15);
    let (cq, ck) = (case.cu_q(), case.cu_k());
    let shape = BlockShape { batch: 1, heads: 1, lq: 8, lk: 6 };
    let block = BlockMask::build(shape, Arc::new(GlobalKeys(2))).unwrap();
    let e = refusal(
        &case,
        &cq,
        &ck,
        &AttnParams { mask: MaskSpec { block: Some(&block), ..MaskSpec::default() }, ..case.params() },
    );
    assert_field(e, "block_mask", "block masks");
    let softcap = Softcap(2.0);
    let score_mod = ScoreFn { m: &softcap, table: &[] };
    let e = refusal(&case, &cq, &ck, &AttnParams { score_mod: Some(score_mod), ..case.params() });
    assert_field(e, "score_mod", "no score modification yet");
    let sinks = [0.5f32, f32::NAN];
    assert_field(refusal(&case, &cq, &ck, &AttnParams { sinks: Some(&sinks), ..case.params() }), "sinks", "NaN");
}

#[test]
fn mismatched_shapes_and_saved_results_are_errors() {
    let case = PackedCase::new(&[(3, 4), (5, 2)], (2, 1), (4, 4), 13);
    let (cq, ck) = (case.cu_q(), case.cu_k());
    let cu = CuSeqlens { q: &cq, k: &ck };
    let q = Packed::contiguous("q", &case.q, [8, 2, 4]).unwrap();
    let k = Packed::contiguous("k", &case.k, [6, 1, 4]).unwrap();
    let v = Packed::contiguous("v", &case.v, [6, 1, 4]).unwrap();
    let short_v = Packed::contiguous("v", &case.v[..20], [5, 1, 4]).unwrap();
    let e = attention_varlen(Kernel::Auto, &q, &k.into(), &short_v.into(), &cu, &case.params()).unwrap_err();
    assert_eq!(e, AttnError::DimMismatch { tensor: "v", dim: "total", expected: 6, found: 5 });
    let three_heads = Packed::contiguous("q", &case.q[..8 * 3], [8, 3, 1]).unwrap();
    let e = attention_varlen(Kernel::Auto, &three_heads, &k.into(), &v.into(), &cu, &case.params()).unwrap_err();
    assert!(matches!(e, AttnError::DimMismatch { tensor: "k", dim: "head_dim", .. }), "{e:?}");
    assert!(Packed::contiguous("q", &case.q, [8, 2, 5]).is_err());
    let fwd = attention_varlen(Kernel::Auto, &q, &k.into(), &v.into(), &cu, &case.params()).unwrap();
    let dout = vec![1.0; 8 * 2 * 4];
    let dout = Packed::contiguous("grad_out", &dout, [8, 2, 4]).unwrap();
    let saved = VarlenSaved { lse: &fwd.lse[1..], ..VarlenSaved::of(&fwd, dout).unwrap() };
    let e = attention_varlen_backward(Kernel::Auto, &q, &k.into(), &v.into(), &cu, &saved, &case.params()).unwrap_err();
    assert!(matches!(e, AttnError::Layout { tensor: "lse", .. }), "{e:?}");
}

#[test]
fn a_strided_pack_equals_the_contiguous_one() {
    // q stored as the first half of each row of a fused `[total, 2·Hq·Dk]` buffer.
    let case = PackedCase { causal: true, ..PackedCase::new(&[(5, 5), (9, 9)], (2, 1), (4, 4), 14) };
    let (tq, _) = case.totals();
    let fused: Vec<f32> = case.q.chunks(8).flat_map(|row| row.iter().chain(&[9.0; 8]).copied()).collect();
    let q = Packed::strided("q", &fused, [tq, 2, 4], [16, 4]).unwrap();
    let (cq, ck) = (case.cu_q(), case.cu_k());
    let k = Packed::contiguous("k", &case.k, [tq, 1, 4]).unwrap();
    let v = Packed::contiguous("v", &case.v, [tq, 1, 4]).unwrap();
    let got = attention_varlen(Kernel::Auto, &q, &k.into(), &v.into(), &CuSeqlens { q: &cq, k: &ck }, &case.params())
        .unwrap();
    assert_eq!(got, case.run(Kernel::Auto).unwrap());
    assert!(Packed::strided("q", &fused, [tq, 2, 4], [17, 4]).is_err(), "a stride reaching past the slice");
}
