//! bfloat16 products (`Precision::Bf16`): the flash kernel's `Q·Kᵀ` and `P·V` forward, and the
//! backward's five products, with bfloat16 operands and f32 accumulation, checked by the oracle
//! rule (factor 2 for outputs, 3 for gradients) with PyTorch's bf16 math path as the baseline error
//! (every materialised tensor rounded to bf16: scores, probabilities, output, `dO`, `dP`, `dS` and
//! the gradients; `common::math_path_rounded`), on inputs already in bf16 (K and V given as bf16
//! views, q holding bf16 values); the decode path computing in f32 whatever `compute` asks (bit for
//! bit the f32 products' results). Every flash
//! instruction set runs: AVX-512 with AVX512-BF16's `VDPBF16PS` where the CPU has it (the test of
//! the native path is ignored, with the reason, where it lacks it), the emulation elsewhere; and
//! the forward's products on AMX tiles, in the software model on every AVX-512 CPU and on the
//! CPU's tiles where it has them.

use crate::common;
use crate::gradients_parts::harness;

use attn_kernels::{
    attention_tuned, AttnGrads, AttnOutput, BackwardTuning, Dropout, Kernel, KvView, Path, Precision, Tuning, View4,
    Window,
};
use attn_testkit::oracle::{self, OUTPUT_FACTOR};
use std::sync::Arc;

use attn_kernels::amx::{self, Emulated, TileChoice};
use attn_kernels::sparse::{BlockMask, BlockShape, SPARSE_BLOCK};
use attn_kernels::Isa;
use common::{dims, math_path_rounded, random_bias, random_keep, Case, MathPath, Rng, Sparse};
use half::bf16;
use harness::{assert_grads, grads64, grads_kv, random_dout, terms, FORCED_PLANS};

/// `x` rounded to bfloat16 and back.
fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// The case with bfloat16 products and q, k and v rounded to bfloat16 (as a bf16 model holds them).
fn in_bf16(mut case: Case) -> Case {
    for x in case.q.iter_mut().chain(case.k.iter_mut()).chain(case.v.iter_mut()) {
        *x = round(*x);
    }
    Case { compute: Precision::Bf16, ..case }
}

/// `x` in bfloat16.
fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// `kernel` with bfloat16 products on the case, K and V as bf16 views, under `tuning`.
fn run_bf16(case: &Case, kernel: Kernel, tuning: Tuning) -> AttnOutput<f32> {
    let (k16, v16) = (to_bf16(&case.k), to_bf16(&case.v));
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = KvView::Bf16(View4::contiguous("k", &k16, case.k_dims()).unwrap());
    let v = KvView::Bf16(View4::contiguous("v", &v16, case.v_dims()).unwrap());
    attention_tuned(kernel, tuning, &q, &k, &v, &case.params32(), false)
        .unwrap_or_else(|e| panic!("{}: {e}", case.describe()))
}

/// `kernel`'s forward then backward with bfloat16 products, K and V as bf16 views, under `plans`.
fn grads_bf16(case: &Case, kernel: Kernel, plans: (Tuning, BackwardTuning), dout: &[f32]) -> AttnGrads<f32> {
    let (k16, v16) = (to_bf16(&case.k), to_bf16(&case.v));
    let k = KvView::Bf16(View4::contiguous("k", &k16, case.k_dims()).unwrap());
    let v = KvView::Bf16(View4::contiguous("v", &v16, case.v_dims()).unwrap());
    grads_kv(case, kernel, plans, &k, &v, dout).unwrap_or_else(|e| panic!("{} {plans:?}: {e}", case.describe()))
}

/// The plans a case runs under: automatic, prefill whole, prefill split into shards, decode.
const PLANS: [Tuning; 4] = [
    Tuning { path: None, shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Prefill), shards: Some(3), ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Decode), shards: None, ..Tuning::DEFAULT },
];

/// Checks `kernel`'s bfloat16 products on `case` (rounded to bf16) under every plan, forward
/// and backward, with PyTorch's bf16 math path as the baseline.
fn check(kernel: Kernel, case: Case) {
    let case = in_bf16(case);
    let dout = random_dout(&case, 7);
    let base = math_path_rounded::<f32>(&case, &dout, round);
    check_forward(kernel, &case, &base, PLANS);
    let (g64, terms) = (grads64(&case, &dout), terms(&case, &dout));
    let plans = FORCED_PLANS
        .into_iter()
        .chain([(Tuning { path: Some(Path::Decode), shards: None, ..Tuning::DEFAULT }, BackwardTuning::default())]);
    for plans in plans.chain([Default::default()]) {
        let g = grads_bf16(&case, kernel, plans, &dout);
        assert_grads(&format!("{} {plans:?} [{}]", kernel.name(), case.describe()), &g, &g64, &base.grads, &terms);
    }
}

/// Checks `kernel`'s forward with bfloat16 products on `case` (already in bf16) under `plans`,
/// with PyTorch's bf16 math path `base` as the baseline.
fn check_forward(kernel: Kernel, case: &Case, base: &MathPath<f32>, plans: impl IntoIterator<Item = Tuning>) {
    let r64 = case.reference64(false).unwrap();
    for tuning in plans {
        let res = run_bf16(case, kernel, tuning);
        let label = format!("{} {tuning:?} [{}]", kernel.name(), case.describe());
        oracle::check("out", &res.out, &r64.out, &base.out, OUTPUT_FACTOR).unwrap_or_else(|e| panic!("{label}: {e}"));
        oracle::check("lse", &res.lse, &r64.lse, &base.lse, OUTPUT_FACTOR).unwrap_or_else(|e| panic!("{label}: {e}"));
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

/// Every mask, on head dimensions of 32 (which the tiles take too).
fn mask_cases() -> Vec<Case> {
    let d = dims(2, 4, 2, 70, 90, 32, 32);
    let mut rng = Rng::new(7);
    let base = || Case::new(d, 21);
    let mut cases = vec![
        Case { causal: true, ..base() },
        Case { causal: true, align: attn_kernels::Align::BottomRight, ..base() },
        Case { window: Some(Window { left: Some(9), right: Some(3) }), ..base() },
        Case { key_lengths: Some(vec![0, 61]), ..base() },
        Case { keep: Some(random_keep(&[d.b, 1, d.lq, d.lk], 0.7, &mut rng)), ..base() },
        Case { bias: Some(random_bias(&[d.lq, d.lk], 2.0, 0.1, &mut rng)), ..base() },
        Case { softcap: Some(5.0), scale: Some(0.9), ..base() },
        Case { dropout: Some(Dropout { p: 0.2, seed: 3 }), causal: true, ..base() },
        Case { sinks: Some(vec![0.5, -1.0, 2.0, 0.0]), ..base() },
    ];
    // A block mask listing runs of key blocks with gaps, a key in five masked: the forward
    // gathers the runs into tiles of several segments, each multiplied into its own value pairs.
    let d = dims(1, 2, 1, 70, 400, 32, 32);
    let pred =
        |_: usize, h: usize, i: usize, j: usize| (j / SPARSE_BLOCK + i / SPARSE_BLOCK + h) % 3 != 1 && j % 5 != 2;
    let mask = BlockMask::build(BlockShape { batch: 1, heads: 2, lq: d.lq, lk: d.lk }, Arc::new(pred)).unwrap();
    let sparse = Sparse { keep: Arc::new(pred), mask: Arc::new(mask), name: "runs with gaps".into() };
    cases.push(Case { sparse: Some(sparse), ..Case::new(d, 23) });
    // Query blocks listed with gaps for each key block, two query heads per key/value head, `Lq`
    // ending inside a block: the backward's tiles are the listed blocks, each its own micro-kernel
    // chunks, and its bfloat16 products pair their rows two at a time within the block.
    let d = dims(1, 4, 2, 300, 200, 32, 32);
    let pred = |_: usize, h: usize, i: usize, j: usize| (i / SPARSE_BLOCK + 2 * (j / SPARSE_BLOCK) + h) % 3 != 1;
    let mask = BlockMask::build(BlockShape { batch: 1, heads: 4, lq: d.lq, lk: d.lk }, Arc::new(pred)).unwrap();
    let sparse = Sparse { keep: Arc::new(pred), mask: Arc::new(mask), name: "gapped query blocks".into() };
    cases.push(Case { sparse: Some(sparse), causal: true, ..Case::new(d, 29) });
    cases
}

fn check_masks(kernel: Kernel) {
    mask_cases().into_iter().for_each(|case| check(kernel, case));
}

/// The products on AMX tiles (`Tuning::tiles` and `BackwardTuning::tiles`: the forward's two,
/// the backward's `S`, `dV`, `dK` and `dQ`): shapes the tiles take (head dimensions multiples of 32; rows and
/// keys off the tiles' 16 and 32; GQA) and every mask, under each prefill plan, forward and
/// gradients by the same rule; on the software model, which must count products for every call
/// (so the tiles really ran).
fn check_tiles(tiles: TileChoice) {
    let kernel = Kernel::Flash(Isa::Avx512);
    let shapes = [dims(1, 2, 2, 40, 40, 64, 64), dims(1, 3, 1, 100, 300, 64, 32), dims(1, 1, 1, 33, 200, 128, 64)];
    let cases = shapes.into_iter().enumerate().map(|(n, d)| Case::new(d, 40 + n as u64)).chain(mask_cases());
    let ran = |before: u64, what: &dyn std::fmt::Display| {
        if tiles == TileChoice::Emulated {
            assert!(Emulated::products() > before, "no tile products ran: {what}");
        }
    };
    for case in cases {
        let case = in_bf16(case);
        let dout = random_dout(&case, 7);
        let base = math_path_rounded::<f32>(&case, &dout, round);
        for plan in &PLANS[..3] {
            let before = Emulated::products();
            check_forward(kernel, &case, &base, [Tuning { tiles, ..*plan }]);
            ran(before, &format!("{plan:?} [{}]", case.describe()));
        }
        let (g64, terms) = (grads64(&case, &dout), terms(&case, &dout));
        let products_of = |plans| {
            let before = Emulated::products();
            (grads_bf16(&case, kernel, plans, &dout), Emulated::products() - before)
        };
        // The forward's products alone, to see that the backward's ran on tiles too.
        let forward_only =
            (Tuning { tiles, ..Tuning::DEFAULT }, BackwardTuning { tiles: TileChoice::Off, ..Default::default() });
        let (_, forward_products) = products_of(forward_only);
        for (fwd, bwd) in FORCED_PLANS.into_iter().chain([Default::default()]) {
            let plans = (Tuning { tiles, ..fwd }, BackwardTuning { tiles, ..bwd });
            let label = format!("{} {plans:?} [{}]", kernel.name(), case.describe());
            let (g, products) = products_of(plans);
            if tiles == TileChoice::Emulated {
                assert!(products > forward_products, "the backward ran no tile products: {label}");
            }
            assert_grads(&label, &g, &g64, &base.grads, &terms);
        }
    }
}

common::isa_test!([avx512] #[test]
fn tiles_emulated() {
    common::assert_available(Kernel::Flash(Isa::Avx512));
    check_tiles(TileChoice::Emulated)
});

common::isa_test!([amx] #[test]
fn tiles_native_amx() {
    assert_eq!(amx::status(), amx::Status::Ready, "the tiles are not ready here");
    check_tiles(TileChoice::Auto)
});

/// A masked key whose key and value rows are NaN must reach no output and no gradient (the
/// forward's tile and the backward's job fall back to f32 products), and the unmasked rows keep
/// the bf16 accuracy.
fn check_masked_nan_values(kernel: Kernel) {
    let d = dims(1, 2, 1, 48, 64, 16, 16);
    let mut case = Case { causal: true, ..Case::new(d, 5) };
    case.poison_key(0, 0, 40);
    let case = in_bf16(case);
    let plans = (Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT }, BackwardTuning::default());
    let res = run_bf16(&case, kernel, plans.0);
    let g = grads_bf16(&case, kernel, plans, &random_dout(&case, 3));
    for (r, (row, dq)) in res.out.chunks(d.dv).zip(g.dq.chunks(d.dk)).enumerate() {
        let i = r % d.lq;
        assert_eq!(row.iter().all(|x| x.is_finite()), i < 40, "out row {i}: {row:?}");
        assert_eq!(dq.iter().all(|x| x.is_finite()), i < 40, "dq row {i}: {dq:?}");
    }
}

/// bfloat16 products really run: the outputs and every gradient differ from the f32 products'
/// (P, dS and the operands are rounded), by no more than the oracle rule allows.
fn check_differs_from_f32(kernel: Kernel) {
    let case = in_bf16(Case::new(dims(1, 2, 2, 64, 128, 64, 64), 3));
    let f32_case = Case { compute: Precision::F32, ..case.clone() };
    let (bf, f) = (run_bf16(&case, kernel, Tuning::default()), f32_case.run(kernel, false).unwrap());
    assert!(bf.out.iter().zip(&f.out).any(|(a, b)| a != b), "bf16 products gave the f32 output bit for bit");
    let dout = random_dout(&case, 5);
    let bf = grads_bf16(&case, kernel, Default::default(), &dout);
    let f = grads_bf16(&f32_case, kernel, Default::default(), &dout);
    for (name, a, b) in [("dq", &bf.dq, &f.dq), ("dk", &bf.dk, &f.dk), ("dv", &bf.dv, &f.dv)] {
        assert!(a.iter().zip(b).any(|(x, y)| x != y), "bf16 products gave the f32 {name} bit for bit");
    }
}

/// A row that sees one key has softmax 1 whatever its score: `dq` and `dk` are exactly 0 with
/// bfloat16 products too (`Δ = dO·O` rounded as the product `dP = dO·Vᵀ` rounds, bit for bit),
/// over more rows than a vector has lanes and a `Dv` that is not a multiple of a pair of them.
fn check_one_key_rows(kernel: Kernel) {
    let case = in_bf16(Case { causal: true, scale: Some(2.0), ..Case::new(dims(1, 4, 2, 37, 1, 40, 70), 650) });
    let plans = (Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT }, BackwardTuning::default());
    let g = grads_bf16(&case, kernel, plans, &random_dout(&case, 8));
    let nonzero = g.dq.iter().chain(&g.dk).filter(|&&x| x != 0.0).count();
    assert_eq!(nonzero, 0, "{}: dq/dk of one-key rows not exactly 0", kernel.name());
    assert!(g.dv.iter().any(|&x| x != 0.0), "{}: dv of one-key rows is all 0", kernel.name());
}

/// Whether two results are equal bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The decode path (at most `DECODE_ROWS` stacked query rows per key/value head, keys read in
/// place) computes in f32 whatever `compute` asks, and so does the backward after it: a bf16-products call that takes it, automatically or forced, whole or in
/// key shards, gives the f32 products' output, log-sum-exp and gradients bit for bit, while the
/// prefill path on the same call does not.
fn check_decode_computes_in_f32(kernel: Kernel) {
    for (n, d) in [dims(1, 8, 2, 2, 300, 64, 64), dims(2, 4, 4, 1, 77, 33, 40)].into_iter().enumerate() {
        let case = in_bf16(Case { causal: n == 0, ..Case::new(d, 9 + n as u64) });
        let f32_case = Case { compute: Precision::F32, ..case.clone() };
        let label =
            |what: &str, t: &dyn std::fmt::Debug| format!("{} {t:?} [{}]: {what}", kernel.name(), case.describe());
        let decode = [None, Some(3)].map(|shards| Tuning { path: Some(Path::Decode), shards, ..Tuning::DEFAULT });
        for tuning in [Tuning::default()].into_iter().chain(decode) {
            let (bf, f) = (run_bf16(&case, kernel, tuning), run_bf16(&f32_case, kernel, tuning));
            assert_eq!(bf.path, Some(Path::Decode), "{}", label("path", &tuning));
            assert!(same_bits(&bf.out, &f.out) && same_bits(&bf.lse, &f.lse), "{}", label("forward", &tuning));
        }
        let dout = random_dout(&case, 4);
        for plans in [
            Default::default(),
            (decode[1], BackwardTuning { shards: Some(2), whole_heads: Some(false), ..BackwardTuning::DEFAULT }),
        ] {
            let (bf, f) = (grads_bf16(&case, kernel, plans, &dout), grads_bf16(&f32_case, kernel, plans, &dout));
            for (name, a, b) in [("dq", &bf.dq, &f.dq), ("dk", &bf.dk, &f.dk), ("dv", &bf.dv, &f.dv)] {
                assert!(same_bits(a, b), "{}", label(name, &plans));
            }
        }
        let prefill = Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT };
        let (bf, f) = (run_bf16(&case, kernel, prefill), run_bf16(&f32_case, kernel, prefill));
        assert!(!same_bits(&bf.out, &f.out), "{}", label("prefill gave the f32 output", &prefill));
    }
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
    decode_computes_in_f32 => check_decode_computes_in_f32,
    one_key_rows => check_one_key_rows,
}
