//! The named sparse patterns ([`Pattern`]) and the primitives they are built from: each predicate
//! equals the pattern restated here from its paper; each block mask's classes are sound (a full
//! block allows every pair, an unlisted block none) and, for interval patterns, exact; every
//! kernel meets the oracle rule on every pattern, forward and backward, with the tests' mask rules
//! reading the restated definition; causal and windows through the programmable API equal the
//! built-in masks; bad parameters are typed errors naming the field.

use crate::common;
use crate::gradients_parts;

use std::sync::Arc;

use attn_kernels::sparse::patterns::{Band, StrideColumns, SummaryColumns};
use attn_kernels::sparse::{BlockClass, MaskMod, Pattern, SPARSE_BLOCK};
use attn_kernels::{Align, AttnError, Kernel, Window};
use common::{kernel_tests, Case, Sparse};
use gradients_parts::harness::check_grads;

kernel_tests! {
    every_pattern => check_every_pattern,
}

fn window(l: usize, r: usize) -> Window {
    Window { left: Some(l), right: Some(r) }
}

/// A pattern's definition over `(query, key)`.
type Definition = Box<dyn Fn(usize, usize) -> bool + Send + Sync>;

/// Every pattern with a few parameter sets, and its definition restated from its paper.
fn patterns() -> Vec<(Pattern, Definition)> {
    vec![
        (Pattern::Strided { stride: 16 }, Box::new(|i, j| j <= i && ((i - j) < 16 || (i - j) % 16 == 0))),
        (Pattern::Strided { stride: 70 }, Box::new(|i, j| j <= i && ((i - j) < 70 || (i - j) % 70 == 0))),
        (Pattern::Fixed { stride: 32, summary: 4 }, Box::new(|i, j| j <= i && (j / 32 == i / 32 || j % 32 >= 28))),
        (Pattern::Fixed { stride: 50, summary: 1 }, Box::new(|i, j| j <= i && (j / 50 == i / 50 || j % 50 == 49))),
        (
            Pattern::Longformer { window: window(20, 20), global: 3 },
            Box::new(|i, j| (j + 20 >= i && j <= i + 20) || i < 3 || j < 3),
        ),
        (Pattern::Longformer { window: window(70, 5), global: 0 }, Box::new(|i, j| j + 70 >= i && j <= i + 5)),
        (Pattern::Document { lengths: vec![30, 100, 1, 69] }, Box::new(|i, j| doc(i) == doc(j) && j <= i)),
        (Pattern::PrefixLm { prefix: 77 }, Box::new(|i, j| j < 77 || j <= i)),
        (Pattern::Sinks { sinks: 4, window: 40 }, Box::new(|i, j| j <= i && (j < 4 || i - j < 40))),
    ]
}

/// The document of position `p` for lengths 30, 100, 1, 69.
fn doc(p: usize) -> usize {
    [30, 130, 131, 200].iter().position(|&end| p < end).unwrap()
}

const L: usize = 200;

/// The restated definition as a predicate.
struct Restated(Definition);
impl MaskMod for Restated {
    fn keep(&self, _b: usize, _h: usize, q: usize, kv: usize) -> bool {
        (self.0)(q, kv)
    }
}

#[test]
fn predicates_equal_their_papers() {
    for (p, def) in patterns() {
        let m = p.mask_mod(L, L).unwrap();
        let mut row = vec![false; L];
        for i in 0..L {
            m.keep_row(0, 0, i, 0, &mut row);
            for (j, &x) in row.iter().enumerate() {
                assert_eq!(x, def(i, j), "{p:?}: keep_row({i}, {j})");
                assert_eq!(m.keep(0, 0, i, j), def(i, j), "{p:?}: keep({i}, {j})");
            }
        }
    }
}

/// Sound classes for every pattern; exact ones for the interval patterns (a partial block there
/// holds an allowed and a forbidden pair).
#[test]
fn block_classes_are_sound() {
    let bigbird = Pattern::BigBird { window: window(30, 30), global: 2, random: 2, seed: 5 };
    for p in patterns().into_iter().map(|x| x.0).chain([bigbird]) {
        let m = p.mask_mod(L, L).unwrap();
        let bm = p.block_mask(L, L).unwrap();
        let exact =
            matches!(p, Pattern::Document { .. } | Pattern::PrefixLm { .. } | Pattern::Longformer { global: 0, .. });
        let s = bm.shape();
        for qb in 0..s.q_blocks() {
            for kb in 0..s.kv_blocks() {
                let (qs, ks) = s.block(qb, kb);
                let truth = common::block_truth(&*m, qs, ks);
                let got = bm.class(0, 0, qb, kb);
                let ok = got == truth || (!exact && got == BlockClass::Partial);
                assert!(ok, "{p:?}: block ({qb}, {kb}) classed {got:?}, its elements say {truth:?}");
            }
        }
    }
}

/// The column primitives classify any block soundly (empty and full exactly), over ranges of
/// every small size and offset.
#[test]
fn column_primitives_classify_soundly() {
    let mut prims: Vec<(String, Box<dyn MaskMod>)> = Vec::new();
    for s in [1, 2, 3, 5, 7, 16, 64, 70] {
        prims.push((format!("stride {s}"), Box::new(StrideColumns(s))));
        for c in [1, s.div_ceil(2), s] {
            prims.push((format!("summary {s}/{c}"), Box::new(SummaryColumns { n: s, c })));
        }
    }
    for (name, m) in &prims {
        for (q0, k0) in [(0, 0), (5, 0), (0, 9), (64, 3), (100, 30), (130, 129), (20, 90)] {
            for (nq, nk) in [(1, 1), (3, 7), (9, 2), (16, 16), (64, 64)] {
                let (qs, ks) = (q0..q0 + nq, k0..k0 + nk);
                let truth = common::block_truth(&**m, qs.clone(), ks.clone());
                let got = m.classify(0, 0, qs.clone(), ks.clone());
                assert!(got == truth || got == BlockClass::Partial, "{name} {qs:?}×{ks:?}: {got:?}, truth {truth:?}");
            }
        }
    }
}

/// BigBird: each query block sees its window, its global tokens and exactly `random` random key
/// blocks beyond them when there are enough; the draw depends on the seed.
#[test]
fn bigbird_random_blocks() {
    let (l, r) = (64 * 20, 3);
    let p = |seed| Pattern::BigBird { window: window(0, 0), global: 0, random: r, seed };
    let (a, b) = (p(1).block_mask(l, l).unwrap(), p(2).block_mask(l, l).unwrap());
    let mut differ = false;
    for qb in 0..20 {
        let (la, lb) = (a.kv_blocks(0, 0, qb).0, b.kv_blocks(0, 0, qb).0);
        let diagonal = la.contains(&(qb as u32)) as usize;
        assert!(la.len() - diagonal <= r && la.len() >= r, "query block {qb}: {la:?}");
        differ |= la != lb;
    }
    assert!(differ, "two seeds drew the same random blocks");
}

/// At 4096 queries a Longformer window of 128 each side with 16 global tokens lists, per query
/// block, at most its 5 window blocks plus the global column block (the first, global, rows all).
#[test]
fn work_follows_the_window() {
    let l = 4096;
    let bm = Pattern::Longformer { window: window(128, 128), global: 16 }.block_mask(l, l).unwrap();
    for qb in 1..l / SPARSE_BLOCK {
        let n = bm.kv_blocks(0, 0, qb).0.len();
        assert!(n <= 6, "query block {qb} lists {n} key blocks");
    }
    let bound = (64 + 63 * 6) as f64 / (64.0 * 64.0);
    assert!(bm.density() <= bound, "density {} above {bound}", bm.density());
}

/// Every kernel on every pattern, with GQA, forward and backward, under the oracle rule.
fn check_every_pattern(kernel: Kernel) {
    let bigbird = (Pattern::BigBird { window: window(30, 30), global: 2, random: 2, seed: 5 }, None);
    for (n, (p, def)) in patterns().into_iter().map(|(p, d)| (p, Some(d))).chain([bigbird]).enumerate() {
        let d = common::dims(1, 4, 2, L, L, 16, 24);
        let mask = Arc::new(p.block_mask(L, L).unwrap());
        let keep: Arc<dyn MaskMod> = match def {
            Some(def) => Arc::new(Restated(def)),
            None => p.mask_mod(L, L).unwrap(),
        };
        let case = Case { sparse: Some(Sparse { keep, mask, name: p.name().into() }), ..Case::new(d, 40 + n as u64) };
        let res = case.check(kernel, p.name());
        case.assert_structure(&format!("{} {p:?}", kernel.name()), &res);
        check_grads(kernel, &case, p.name());
    }
}

/// Causal masks in both alignments and windows as a block mask give the reference's results of the
/// built-in masks bit for bit.
#[test]
fn bands_equal_the_builtin_masks() {
    let d = common::dims(1, 2, 1, 150, 230, 8, 8);
    for (causal, w, align) in [
        (true, None, Align::TopLeft),
        (true, None, Align::BottomRight),
        (false, Some(window(40, 7)), Align::TopLeft),
        (true, Some(Window { left: Some(90), right: None }), Align::BottomRight),
    ] {
        let band = Band::new(causal, w, align, d.lq, d.lk);
        let mask = attn_kernels::BlockMask::build(
            attn_kernels::BlockShape { batch: 1, heads: 1, lq: d.lq, lk: d.lk },
            Arc::new(band),
        )
        .unwrap();
        let sparse = Sparse { keep: Arc::new(band), mask: Arc::new(mask), name: "band".into() };
        let builtin = Case { causal, window: w, align, ..Case::new(d, 2) };
        let programmed = Case { sparse: Some(sparse), ..Case::new(d, 2) };
        assert!(
            builtin.reference64(true).unwrap() == programmed.reference64(true).unwrap(),
            "{causal} {w:?} {align:?}"
        );
    }
}

#[test]
fn bad_parameters_are_named() {
    let cases = [
        (Pattern::Strided { stride: 0 }, "stride"),
        (Pattern::Fixed { stride: 8, summary: 9 }, "summary"),
        (Pattern::Fixed { stride: 8, summary: 0 }, "summary"),
        (Pattern::Sinks { sinks: 4, window: 0 }, "window"),
        (Pattern::Document { lengths: vec![100, 99] }, "doc_lengths"),
    ];
    for (p, want) in cases {
        match p.block_mask(L, L) {
            Err(AttnError::Param { field, .. }) => assert_eq!(field, want, "{p:?}"),
            other => panic!("{p:?}: expected an error naming {want}, got {other:?}"),
        }
    }
}
