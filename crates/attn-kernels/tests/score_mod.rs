//! Programmable score modifications ([`ScoreMod`]): every kernel with each built-in (soft-cap,
//! ALiBi, T5's relative-position bias with a trainable table) and with a modification written
//! only as scalars (a per-head temperature read from its table), combined with masks, GQA,
//! dropout and block masks, forward and backward (`dtable` included) under the oracle rule; the
//! soft-cap and ALiBi as modifications equal the built-in paths; the table's gradient against
//! finite differences; a table of the wrong length is refused.

use crate::common;
use crate::gradients_parts;

use std::sync::Arc;

use attn_kernels::score_mod::{Alibi, RelativeBias, Softcap};
use attn_kernels::sparse::Pattern;
use attn_kernels::{Align, AttnError, Dropout, Kernel, ScoreMod, Window};
use common::{kernel_tests, random_keep, Case, Rng, Scored, Sparse};
use gradients_parts::harness::{check_grads, grads64, random_dout};

kernel_tests! {
    every_modification => check_every_modification,
}

/// `s · t[h]`: a learned temperature per head, written only through the scalar methods.
struct Temperature(usize);

impl ScoreMod for Temperature {
    fn table_len(&self) -> usize {
        self.0
    }
    fn score(&self, s: f64, t: &[f32], _b: usize, h: usize, _q: usize, _kv: usize) -> f64 {
        s * t[h] as f64
    }
    fn dscore(&self, _s: f64, t: &[f32], _b: usize, h: usize, _q: usize, _kv: usize) -> f64 {
        t[h] as f64
    }
    fn dtable(&self, s: f64, _t: &[f32], _b: usize, h: usize, _q: usize, _kv: usize) -> Option<(usize, f64)> {
        Some((h, s))
    }
}

fn t5(heads: usize, bidirectional: bool) -> RelativeBias {
    RelativeBias { heads, buckets: 16, max_distance: 64, bidirectional }
}

/// Each modification with its table (random where it reads one).
fn modifications(heads: usize, lq: usize, lk: usize, seed: u64) -> Vec<Scored> {
    let mut rng = Rng::new(seed);
    let scored = |m: Arc<dyn ScoreMod>, table: Vec<f32>, name: &str| Scored { m, table, name: name.into() };
    let t5_table = |rng: &mut Rng| rng.values(heads * 16, 2.0);
    vec![
        scored(Arc::new(Softcap(3.0)), vec![], "softcap"),
        scored(Arc::new(Alibi::new(heads, lq, lk, Align::BottomRight)), vec![], "alibi"),
        scored(Arc::new(t5(heads, true)), t5_table(&mut rng), "t5 bidirectional"),
        scored(Arc::new(t5(heads, false)), t5_table(&mut rng), "t5 causal"),
        scored(Arc::new(Temperature(heads)), (0..heads).map(|_| rng.uniform(0.3, 2.0)).collect(), "temperature"),
    ]
}

/// Every modification on plain attention, with masks, GQA and dropout, and with a block mask.
fn check_every_modification(kernel: Kernel) {
    let d = common::dims(2, 4, 2, 90, 130, 16, 12);
    for (n, score) in modifications(d.hq, d.lq, d.lk, 1).into_iter().enumerate() {
        let plain = Case { score: Some(score.clone()), ..Case::new(d, 10 + n as u64) };
        let mut rng = Rng::new(n as u64);
        let masked = Case {
            causal: true,
            align: Align::BottomRight,
            window: Some(Window { left: Some(50), right: None }),
            keep: Some(random_keep(&[d.lq, d.lk], 0.8, &mut rng)),
            softcap: Some(5.0),
            dropout: Some(Dropout { p: 0.2, seed: 3 }),
            ..plain.clone()
        };
        let bm = Pattern::Longformer { window: Window { left: Some(20), right: Some(20) }, global: 2 };
        let sparse = Sparse {
            keep: bm.mask_mod(d.lq, d.lk).unwrap(),
            mask: Arc::new(bm.block_mask(d.lq, d.lk).unwrap()),
            name: "longformer".into(),
        };
        let blocked = Case { sparse: Some(sparse), ..plain.clone() };
        for (what, case) in [("plain", plain), ("masked", masked), ("block mask", blocked)] {
            let label = format!("{} {what}", score.name);
            case.check(kernel, &label);
            let g = check_grads(kernel, &case, &label);
            assert_eq!(g.dtable.is_some(), !score.table.is_empty(), "{label}: dtable present iff a table");
        }
    }
}

#[test]
fn softcap_and_alibi_equal_the_builtin_paths() {
    let d = common::dims(1, 3, 1, 40, 70, 8, 8);
    let base = Case { causal: true, align: Align::BottomRight, ..Case::new(d, 5) };
    let dout = random_dout(&base, 2);
    // Soft-cap: bit for bit, forward and gradients, in the f64 reference.
    let builtin = Case { softcap: Some(2.5), ..base.clone() };
    let modded =
        Case { score: Some(Scored { m: Arc::new(Softcap(2.5)), table: vec![], name: "cap".into() }), ..base.clone() };
    assert!(builtin.reference64(true).unwrap() == modded.reference64(true).unwrap());
    let (a, b) = (grads64(&builtin, &dout), grads64(&modded, &dout));
    assert!(a.dq == b.dq && a.dk == b.dk && a.dv == b.dv, "soft-cap gradients differ");
    // ALiBi: against the bias `−m·|i' − j|` rounded to f32, as a caller would pass it.
    let alibi = Alibi::new(d.hq, d.lq, d.lk, Align::BottomRight);
    let mut bias = Vec::new();
    for m in &alibi.slopes {
        for i in 0..d.lq {
            bias.extend((0..d.lk).map(|j| (-m * (i as f64 + 30.0 - j as f64).abs()) as f32));
        }
    }
    let builtin = Case { bias: Some(common::Dense { data: bias, shape: vec![d.hq, d.lq, d.lk] }), ..base.clone() };
    let modded = Case { score: Some(Scored { m: Arc::new(alibi), table: vec![], name: "alibi".into() }), ..base };
    let (a, b) = (builtin.reference64(false).unwrap(), modded.reference64(false).unwrap());
    let worst = a.out.iter().zip(&b.out).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-6, "ALiBi as a modification differs from its bias by {worst}");
}

/// The fastest kernel computes the soft-cap modification element for element as its built-in
/// soft-cap: outputs and gradients bit for bit.
#[test]
fn softcap_modification_is_the_builtin_bit_for_bit() {
    let d = common::dims(2, 4, 2, 70, 150, 16, 16);
    let base = Case { causal: true, ..Case::new(d, 12) };
    let builtin = Case { softcap: Some(4.0), ..base.clone() };
    let modded = Case { score: Some(Scored { m: Arc::new(Softcap(4.0)), table: vec![], name: "cap".into() }), ..base };
    let (a, b) = (builtin.run(Kernel::Auto, true).unwrap(), modded.run(Kernel::Auto, true).unwrap());
    common::assert_bit_identical("softcap as a modification", &a, &b);
    let dout = random_dout(&builtin, 4);
    let (ga, gb) = (
        gradients_parts::harness::grads(&builtin, Kernel::Auto, &dout).unwrap(),
        gradients_parts::harness::grads(&modded, Kernel::Auto, &dout).unwrap(),
    );
    assert!(ga.dq == gb.dq && ga.dk == gb.dk && ga.dv == gb.dv, "soft-cap gradients differ");
}

/// The reference's `dtable` against central differences of `Σ out·dO` in the table entries.
#[test]
fn table_gradient_matches_finite_differences() {
    let d = common::dims(1, 2, 1, 20, 30, 8, 8);
    for score in modifications(d.hq, d.lq, d.lk, 4).into_iter().filter(|s| !s.table.is_empty()) {
        let case = Case { causal: true, score: Some(score.clone()), ..Case::new(d, 8) };
        let dout = random_dout(&case, 3);
        let g = grads64(&case, &dout).dtable.expect("a table gradient");
        let loss = |table: Vec<f32>| -> f64 {
            let c = Case { score: Some(Scored { table, ..score.clone() }), ..case.clone() };
            let out = c.reference64(false).unwrap().out;
            out.iter().zip(&dout).map(|(o, &w)| o * w as f64).sum()
        };
        let h = 1.0 / 1024.0;
        for e in 0..score.table.len() {
            let at = |dx: f32| {
                let mut t = score.table.clone();
                t[e] += dx;
                loss(t)
            };
            let fd = (at(h) - at(-h)) / (2.0 * h as f64);
            assert!((fd - g[e]).abs() <= 1e-4 * (1.0 + fd.abs()), "{} entry {e}: {fd} vs {}", score.name, g[e]);
        }
    }
}

/// T5's buckets and an attention biased by a relative-position table against PyTorch in float64
/// (`scripts/gen_score_mod_fixtures.py`): buckets equal, the reference within float64 rounding,
/// every kernel (its `dtable` included) under the oracle rule.
#[test]
fn t5_bias_matches_pytorch() {
    use attn_testkit::fixtures::{le_f64, le_i64, parse};
    use attn_testkit::oracle::{check, GRADIENT_FACTOR, OUTPUT_FACTOR};
    for (kind, bidirectional) in [("bidirectional", true), ("causal", false)] {
        let path = format!("{}/tests/fixtures/score_mod/t5_{kind}.safetensors", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).unwrap();
        let (st, _) = parse(&path, &bytes).unwrap();
        let f64s = |name: &str| le_f64(st.tensor(name).unwrap().data());
        let rb = RelativeBias { heads: 2, buckets: 32, max_distance: 128, bidirectional };
        let (rel, bucket) = (le_i64(st.tensor("rel").unwrap().data()), le_i64(st.tensor("bucket").unwrap().data()));
        for (&r, &b) in rel.iter().zip(&bucket) {
            assert_eq!(rb.bucket(r as isize) as i64, b, "{kind}: bucket of {r}");
        }
        let f32s = |name: &str| f64s(name).iter().map(|&x| x as f32).collect::<Vec<_>>();
        let d = common::dims(1, 2, 2, 150, 150, 8, 8);
        let score = Scored { m: Arc::new(rb), table: f32s("table"), name: format!("t5 {kind}") };
        let case = Case {
            q: f32s("q"),
            k: f32s("k"),
            v: f32s("v"),
            causal: !bidirectional,
            score: Some(score),
            ..Case::new(d, 0)
        };
        // The inputs rounded to f32 are the reference's inputs: its f64 result is the torch one
        // only up to that rounding, so the rule is checked against the reference on those inputs,
        // and the reference against torch on the torch inputs' f32 rounding within 1e-5.
        let r64 = case.reference64(false).unwrap();
        let worst = r64.out.iter().zip(f64s("out")).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-5, "{kind}: reference out differs from torch by {worst}");
        let dout: Vec<f32> = f32s("grad_out");
        let g64 = grads64(&case, &dout);
        let want = f64s("dtable");
        let worst = g64.dtable.as_ref().unwrap().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "{kind}: reference dtable differs from torch by {worst}");
        let naive = gradients_parts::harness::grads(&case, Kernel::Reference, &dout).unwrap();
        let r32 = case.reference32(false).unwrap();
        for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available() && *k != Kernel::Reference) {
            let fast = case.run(kernel, false).unwrap();
            check("out", &fast.out, &r64.out, &r32.out, OUTPUT_FACTOR)
                .unwrap_or_else(|e| panic!("{kind} {}: {e}", kernel.name()));
            let g = gradients_parts::harness::grads(&case, kernel, &dout).unwrap();
            let (f, r, n) = (g.dtable.unwrap(), g64.dtable.as_ref().unwrap(), naive.dtable.as_ref().unwrap());
            check("dtable", &f, r, n, GRADIENT_FACTOR).unwrap_or_else(|e| panic!("{kind} {}: {e}", kernel.name()));
        }
    }
}

#[test]
fn a_table_of_the_wrong_length_is_refused() {
    let d = common::dims(1, 2, 1, 5, 5, 4, 4);
    let score = Scored { m: Arc::new(t5(2, true)), table: vec![0.0; 31], name: "short".into() };
    let case = Case { score: Some(score), ..Case::new(d, 1) };
    for kernel in [Kernel::Reference, Kernel::Auto] {
        match case.run(kernel, false) {
            Err(AttnError::DimMismatch { tensor: "score_table", expected: 32, found: 31, .. }) => {}
            other => panic!("{}: {other:?}", kernel.name()),
        }
    }
}
