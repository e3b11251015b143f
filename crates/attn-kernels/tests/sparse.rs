//! Block-sparse and programmable masks ([`BlockMask`], [`MaskMod`]): every kernel, forward and
//! backward, on random block patterns (empty, full and partial blocks, empty rows, blocks crossing
//! the sequence end, broadcast over batch and heads) combined with every other mask and option,
//! against the `f64` reference under the oracle rule; the mask rules of the tests read the
//! pattern's predicate itself, so a block mask that misrepresents it fails. Also: the flash kernels
//! never call the predicate (the reference only in partial blocks), keys no row may see are never
//! read, the builder's classes are exact, and bad lists are typed errors naming the field.

use crate::common;
use crate::gradients_parts;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use attn_kernels::sparse::{BlockClass, BlockMask, BlockShape, MaskMod, MaskModExt, SPARSE_BLOCK};
use attn_kernels::{Align, AttnError, BackwardTuning, Dims, Dropout, Kernel, KvView, Tuning, View4, Window};
use common::{kernel_tests, random_bias, random_keep, Case, Rng, Sparse};
use gradients_parts::harness::{assert_grads, check_grads, grads, grads64, grads_kv, random_dout, Terms};
use half::bf16;

kernel_tests! {
    random_patterns => check_random_patterns,
    predicate_only_in_partial_blocks => check_predicate_only_in_partial_blocks,
    unseen_keys_never_read => check_unseen_keys_never_read,
    half_precision_kv => check_half_precision_kv,
    gathered_tiles => check_gathered_tiles,
    block_tiles => check_block_tiles,
}

/// A well-mixed hash of a few indices.
fn mix(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &x| {
        let mut z = (h ^ x).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// A random pattern over `batch × heads` (1 broadcasts): each block empty, full or partial with
/// the given chances (in percent), each element of a partial block kept with chance one half.
fn random_predicate(seed: u64, batch: usize, heads: usize, empty: u64, full: u64) -> impl MaskMod + Clone {
    move |b: usize, h: usize, i: usize, j: usize| {
        let (b, h) = (if batch == 1 { 0 } else { b as u64 }, if heads == 1 { 0 } else { h as u64 });
        let (qb, kb) = ((i / SPARSE_BLOCK) as u64, (j / SPARSE_BLOCK) as u64);
        match mix(&[seed, b, h, qb, kb]) % 100 {
            x if x < empty => false,
            x if x < empty + full => true,
            _ => mix(&[seed, b, h, i as u64, j as u64, 1]).is_multiple_of(2),
        }
    }
}

/// `pred` as a case's sparse part, its block mask built over `batch × heads`.
fn sparse_of<M: MaskMod + Clone + 'static>(pred: M, name: &str, batch: usize, heads: usize, d: &Dims) -> Sparse {
    let shape = BlockShape { batch, heads, lq: d.lq, lk: d.lk };
    let mask = BlockMask::build(shape, Arc::new(pred.clone())).expect("block mask");
    Sparse { keep: Arc::new(pred), mask: Arc::new(mask), name: name.into() }
}

const LENGTHS: [usize; 8] = [1, 40, 63, 64, 65, 128, 190, 257];

/// Configuration `n`: random sizes and pattern, and with some chance every other option.
fn configuration(n: usize) -> Case {
    let mut rng = Rng::new(0x5BA5 ^ n as u64);
    let (hkv, group) = (1 + rng.below(2), 1 + rng.below(3));
    let d = common::dims(
        1 + rng.below(2),
        hkv * group,
        hkv,
        LENGTHS[rng.below(LENGTHS.len())],
        LENGTHS[rng.below(LENGTHS.len())],
        [1, 8, 33, 64][rng.below(4)],
        [1, 8, 33, 64][rng.below(4)],
    );
    let batch = if rng.chance(0.5) { d.b } else { 1 };
    let heads = if rng.chance(0.5) { d.hq } else { 1 };
    let (empty, full) = [(40, 30), (0, 100), (100, 0), (20, 0), (60, 40)][rng.below(5)];
    let pred = random_predicate(n as u64, batch, heads, empty, full);
    let sparse = Some(sparse_of(pred, &format!("random#{n} {empty}/{full}"), batch, heads, &d));
    let target = [d.b, d.hq, d.lq, d.lk];
    let side = |rng: &mut Rng| rng.chance(0.7).then(|| rng.below(d.lk.max(d.lq) + 2));
    Case {
        sparse,
        causal: rng.chance(0.3),
        align: if rng.chance(0.5) { Align::BottomRight } else { Align::TopLeft },
        window: rng.chance(0.2).then(|| Window { left: side(&mut rng), right: side(&mut rng) }),
        key_lengths: rng.chance(0.2).then(|| (0..d.b).map(|_| rng.below(d.lk + 1)).collect()),
        keep: rng.chance(0.2).then(|| random_keep(&[d.lq, d.lk], 0.8, &mut rng)),
        bias: rng.chance(0.3).then(|| random_bias(&target[1..], 1.5, 0.05, &mut rng)),
        softcap: rng.chance(0.2).then(|| 0.5 + 20.0 * rng.unit()),
        dropout: rng.chance(0.2).then_some(Dropout { p: 0.2, seed: n as u64 }),
        ..Case::new(d, 0xB10C + n as u64)
    }
}

/// Every configuration's forward (forced plans: prefill, decode, split-KV; with weights) and
/// gradients meet the oracle rule, and fully masked rows give zeros, never NaN.
fn check_random_patterns(kernel: Kernel) {
    for n in 0..14 {
        let case = configuration(n);
        let res = case.check(kernel, "random block pattern");
        case.assert_structure(&format!("{} random pattern #{n}", kernel.name()), &res);
        check_grads(kernel, &case, "random block pattern");
    }
}

/// Tiles gathered from runs of listed blocks (the flash forward scores several runs side by side
/// in one tile): key blocks listed in runs of two with one-block gaps (shifted per head and query
/// block), one key in five masked everywhere with its K/V rows poisoned, with a bias and dropout,
/// at a head dimension of 16 (tiles of 256 keys) and 64 (192); then, without dropout, keys masked
/// for one query row in seven whose value rows hold +∞ (the rows that see them must get +∞ from
/// those very keys, the others finite). Each segment's columns must reach its own keys' masks,
/// bias, dropout, weights and values: forward, weights and gradients meet the oracle rule.
fn check_gathered_tiles(kernel: Kernel) {
    for (n, dk, seen_poison) in [(0u64, 16, false), (1, 64, false), (2, 64, true)] {
        let d = common::dims(1, 2, 1, 130, 700, dk, 24);
        let runs = |_: usize, h: usize, i: usize, j: usize| (j / SPARSE_BLOCK + i / SPARSE_BLOCK + h) % 3 != 1;
        let pred = runs.and(move |_: usize, _: usize, i: usize, j: usize| {
            j % 5 != 2 && (!seen_poison || !(i + j).is_multiple_of(7))
        });
        let mut case = Case {
            sparse: Some(sparse_of(pred, "runs of two blocks", 1, 2, &d)),
            bias: Some(random_bias(&[2, d.lq, d.lk], 1.0, 0.0, &mut Rng::new(n))),
            dropout: (!seen_poison).then_some(Dropout { p: 0.2, seed: n }),
            ..Case::new(d, 0x6A7 + n)
        };
        let dead = case.keys_masked_everywhere();
        assert!(dead.len() >= d.lk / 5, "every fifth key is masked everywhere");
        for &(b, g, j) in &dead {
            case.poison_key(b, g, j);
        }
        if seen_poison {
            for j in (3..d.lk).step_by(5) {
                case.kv_rows_mut(0, 0, j).1[0] = f32::INFINITY;
            }
        }
        let res = case.check(kernel, "gathered tiles");
        if !seen_poison {
            case.assert_structure(&format!("{} gathered tiles, Dk {dk}", kernel.name()), &res);
            check_grads(kernel, &case, "gathered tiles");
        }
    }
}

/// The backward's block tiles (each query block that a key block's transposed list names is one
/// tile of its rows, cut into micro-kernel calls per block): query blocks listed in gapped runs
/// (isolated and in pairs, shifted per key block and head), two query heads per key/value head
/// with different lists, a window that cuts listed blocks (their rows outside it must get `dS`
/// 0), a query block that lists nothing (empty rows: zeros), `Lq` ending inside a block, one key
/// in five masked everywhere with its K/V rows poisoned, a bias with its gradient and dropout;
/// every forced backward plan (whole-head and per-tile transposition, key shards) and the
/// forward meet the oracle rule, and the empty rows' outputs and `dq` are 0.
fn check_block_tiles(kernel: Kernel) {
    for (n, dk) in [(0u64, 64), (1, 24)] {
        let d = common::dims(1, 4, 2, 300, 330, dk, 16);
        let gapped = |_: usize, h: usize, i: usize, j: usize| {
            let (qb, kb) = (i / SPARSE_BLOCK, j / SPARSE_BLOCK);
            qb != 2 && (qb + 2 * kb + h) % 3 != 1 && j % 5 != 2
        };
        let mut case = Case {
            sparse: Some(sparse_of(gapped, "gapped query blocks", 1, 4, &d)),
            window: Some(Window { left: Some(150), right: Some(20) }),
            bias: Some(random_bias(&[4, d.lq, d.lk], 1.0, 0.0, &mut Rng::new(n))),
            dropout: Some(Dropout { p: 0.2, seed: n }),
            ..Case::new(d, 0xB7 + n)
        };
        for &(b, g, j) in &case.keys_masked_everywhere() {
            case.poison_key(b, g, j);
        }
        let res = case.check(kernel, "block tiles");
        case.assert_structure(&format!("{} block tiles, Dk {dk}", kernel.name()), &res);
        let g = check_grads(kernel, &case, "block tiles");
        let empty = |r: usize| (r % d.lq) / SPARSE_BLOCK == 2;
        assert!(g.dq.chunks(d.dk).enumerate().all(|(r, x)| !empty(r) || x.iter().all(|&x| x == 0.0)));
        assert!(res.out.chunks(d.dv).enumerate().all(|(r, x)| !empty(r) || x.iter().all(|&x| x == 0.0)));
    }
}

/// A block `(b, h, query block, key block)`.
type BlockAt = (usize, usize, usize, usize);

/// A predicate that counts its calls and records the blocks they fall in.
#[derive(Clone)]
struct Counting<M> {
    inner: M,
    calls: Arc<AtomicUsize>,
    blocks: Arc<Mutex<Vec<BlockAt>>>,
}

impl<M: MaskMod> MaskMod for Counting<M> {
    fn keep(&self, b: usize, h: usize, q: usize, kv: usize) -> bool {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.blocks.lock().unwrap().push((b, h, q / SPARSE_BLOCK, kv / SPARSE_BLOCK));
        self.inner.keep(b, h, q, kv)
    }
}

/// The flash kernels never call the predicate: the pairs of the partial blocks were decided when
/// the mask was built. The reference (the oracle) evaluates it per element, but only inside
/// partial blocks: never for a pattern of whole blocks.
fn check_predicate_only_in_partial_blocks(kernel: Kernel) {
    let d = common::dims(1, 2, 1, 200, 260, 16, 16);
    for (empty, full) in [(50, 50), (30, 30)] {
        let counting =
            Counting { inner: random_predicate(7, 1, 2, empty, full), calls: Arc::default(), blocks: Arc::default() };
        let case = Case { sparse: Some(sparse_of(counting.clone(), "counting", 1, 2, &d)), ..Case::new(d, 3) };
        counting.calls.store(0, Ordering::Relaxed);
        counting.blocks.lock().unwrap().clear();
        case.run(kernel, true).unwrap();
        grads(&case, kernel, &random_dout(&case, 1)).unwrap();
        let mask = &case.sparse.as_ref().unwrap().mask;
        let calls = counting.calls.load(Ordering::Relaxed);
        let blocks = counting.blocks.lock().unwrap();
        if kernel != Kernel::Reference || empty + full == 100 {
            assert_eq!(calls, 0, "{}: the predicate was called {calls} times", kernel.name());
        } else {
            assert!(calls > 0, "reference: a pattern with partial blocks never evaluated its predicate");
        }
        for &(b, h, qb, kb) in blocks.iter() {
            let class = mask.class(b, h, qb, kb);
            assert_eq!(class, BlockClass::Partial, "{}: predicate evaluated in a {class:?} block", kernel.name());
        }
    }
}

/// Keys that no query may see hold NaN and ±∞ in K and V: no output or gradient notices, and the
/// results still meet the oracle rule.
fn check_unseen_keys_never_read(kernel: Kernel) {
    let d = common::dims(1, 2, 1, 150, 300, 16, 16);
    let unseen = |_: usize, _: usize, _: usize, j: usize| j / SPARSE_BLOCK != 2 && j % 7 != 3;
    let pred = random_predicate(11, 1, 1, 40, 30).and(unseen);
    let mut case = Case { sparse: Some(sparse_of(pred, "sparse", 1, 1, &d)), ..Case::new(d, 5) };
    let dead = case.keys_masked_everywhere();
    assert!(dead.len() > 20, "the pattern leaves keys no query sees");
    for &(b, g, j) in &dead {
        case.poison_key(b, g, j);
    }
    let res = case.check(kernel, "poisoned unseen keys");
    assert!(res.out.iter().all(|x| x.is_finite()), "{}: out holds a non-finite value", kernel.name());
    let g = check_grads(kernel, &case, "poisoned unseen keys");
    for (name, x) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
        assert!(x.iter().all(|x| x.is_finite()), "{}: {name} holds a non-finite value", kernel.name());
    }
}

/// K/V stored as bf16 under a random pattern: forward and gradients of the widened values under
/// the oracle rule.
fn check_half_precision_kv(kernel: Kernel) {
    let case = configuration(3);
    let case = Case { dropout: None, ..case };
    let (k16, v16): (Vec<bf16>, Vec<bf16>) =
        (case.k.iter().map(|&x| bf16::from_f32(x)).collect(), case.v.iter().map(|&x| bf16::from_f32(x)).collect());
    let widened = Case {
        k: k16.iter().map(|x| x.to_f32()).collect(),
        v: v16.iter().map(|x| x.to_f32()).collect(),
        ..case.clone()
    };
    let (k, v) = (
        KvView::Bf16(View4::contiguous("k", &k16, case.k_dims()).unwrap()),
        KvView::Bf16(View4::contiguous("v", &v16, case.v_dims()).unwrap()),
    );
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let fwd = widened.run_views(kernel, &q, &k, &v, false).unwrap();
    common::assert_oracle(&format!("{} bf16 K/V", kernel.name()), &fwd, &widened.oracle());
    let dout = random_dout(&case, 7);
    let fast = grads_kv(&case, kernel, (Tuning::default(), BackwardTuning::default()), &k, &v, &dout).unwrap();
    let g32 = grads(&widened, Kernel::Reference, &dout).unwrap();
    assert_grads(&format!("{} bf16 K/V", kernel.name()), &fast, &grads64(&widened, &dout), &g32, &Terms::default());
}

/// The reference with a block mask equals, bit for bit, the reference with the predicate
/// materialised as a dense keep-mask.
#[test]
fn block_mask_equals_its_dense_predicate() {
    for n in 0..6 {
        let case = configuration(100 + n);
        let sp = case.sparse.clone().unwrap();
        let d = case.dims;
        let mut data = Vec::with_capacity(d.b * d.hq * d.lq * d.lk);
        for (b, h, i) in case.rows() {
            data.extend(
                (0..d.lk).map(|j| sp.keep.keep(b, h, i, j) && case.keep.as_ref().is_none_or(|m| m.at([b, h, i, j]))),
            );
        }
        let dense = common::Dense { data, shape: vec![d.b, d.hq, d.lq, d.lk] };
        let plain = Case { sparse: None, keep: Some(dense), dropout: None, ..case.clone() };
        let case = Case { dropout: None, ..case };
        let (a, b) = (case.reference64(true).unwrap(), plain.reference64(true).unwrap());
        assert!(a == b, "#{n}: reference with the block mask differs from the dense keep-mask [{}]", case.describe());
    }
}

/// The builder's classes are exact: a full block allows every pair, a listed partial block some,
/// an unlisted block none; so are `and` / `or` of two patterns.
#[test]
fn builder_classes_are_exact() {
    let (lq, lk) = (150, 200);
    let a = random_predicate(1, 1, 1, 40, 30);
    let b = random_predicate(2, 1, 1, 30, 40);
    let check = |name: &str, m: Arc<dyn MaskMod>| {
        let bm = BlockMask::build(BlockShape { batch: 1, heads: 1, lq, lk }, m.clone()).unwrap();
        let shape = bm.shape();
        for qb in 0..shape.q_blocks() {
            for kb in 0..shape.kv_blocks() {
                let (qs, ks) = shape.block(qb, kb);
                let want = common::block_truth(&*m, qs, ks);
                let got = bm.class(0, 0, qb, kb);
                let sound = got == want || (got == BlockClass::Partial && name != "plain");
                assert!(sound, "{name}: block ({qb}, {kb}) classed {got:?}, its elements say {want:?}");
            }
        }
    };
    check("plain", Arc::new(a.clone()));
    check("and", Arc::new(a.clone().and(b.clone())));
    check("or", Arc::new(a.clone().or(b.clone())));
    let (and, or) = (a.clone().and(b.clone()), a.clone().or(b.clone()));
    let mut row = [false; 100];
    for i in [0, 70, 149] {
        and.keep_row(0, 0, i, 50, &mut row);
        assert!(row.iter().enumerate().all(|(c, &x)| x == (a.keep(0, 0, i, 50 + c) && b.keep(0, 0, i, 50 + c))));
        or.keep_row(0, 0, i, 50, &mut row);
        assert!(row.iter().enumerate().all(|(c, &x)| x == (a.keep(0, 0, i, 50 + c) || b.keep(0, 0, i, 50 + c))));
    }
}

/// Explicit lists give the same results as the builder from the same predicate, and bad lists are
/// typed errors naming the field.
#[test]
fn explicit_lists() {
    let d = common::dims(1, 1, 1, 130, 200, 8, 8);
    let shape = BlockShape { batch: 1, heads: 1, lq: 130, lk: 200 };
    let pred = random_predicate(3, 1, 1, 30, 30);
    let built = BlockMask::build(shape, Arc::new(pred.clone())).unwrap();
    let (mut partial, mut full) = (Vec::new(), Vec::new());
    for qb in 0..shape.q_blocks() {
        let (bl, fl) = built.kv_blocks(0, 0, qb);
        partial.push(bl.iter().zip(fl).filter(|x| !*x.1).map(|x| *x.0 as usize).collect::<Vec<_>>());
        full.push(bl.iter().zip(fl).filter(|x| *x.1).map(|x| *x.0 as usize).collect::<Vec<_>>());
    }
    let listed = BlockMask::from_lists(shape, &partial, &full, Some(Arc::new(pred.clone()))).unwrap();
    let with = |mask: BlockMask| Case {
        sparse: Some(Sparse { keep: Arc::new(pred.clone()), mask: Arc::new(mask), name: "lists".into() }),
        ..Case::new(d, 9)
    };
    assert!(with(listed).reference64(true).unwrap() == with(built).reference64(true).unwrap());

    let err = |p: &[Vec<usize>], f: &[Vec<usize>], m: bool| {
        let pm: Option<Arc<dyn MaskMod>> = if m { Some(Arc::new(pred.clone())) } else { None };
        match BlockMask::from_lists(shape, p, f, pm) {
            Err(AttnError::Param { field, reason }) => format!("{field}: {reason}"),
            other => panic!("expected a parameter error, got {other:?}"),
        }
    };
    let rows = |r: Vec<usize>| vec![r, vec![], vec![]];
    let none = rows(vec![]);
    type ListCase<'a> = (&'a [Vec<usize>], &'a [Vec<usize>], bool, &'a str);
    let cases: [ListCase; 6] = [
        (&rows(vec![4]), &none, true, "block_mask.kv_indices: row 0: key block 4 out of range"),
        (&rows(vec![2, 1]), &none, true, "block_mask.kv_indices: row 0: unsorted"),
        (&none, &rows(vec![1, 1]), true, "block_mask.full_kv_indices: row 0: duplicate"),
        (&rows(vec![1]), &rows(vec![1]), true, "block_mask.full_kv_indices: row 0: key block 1 is listed both"),
        (&rows(vec![1]), &none, false, "block_mask.kv_indices: row 0 lists partial blocks but no mask_mod"),
        (&none[..2], &none, true, "block_mask.kv_indices: 2 rows, expected"),
    ];
    for (p, f, m, want) in cases {
        let got = err(p, f, m);
        assert!(got.starts_with(want), "expected '{want}…', got '{got}'");
    }
}

/// A block mask built for other sizes is refused by every kernel, naming `block_mask`.
#[test]
fn mismatched_block_mask_is_refused() {
    let d = common::dims(2, 2, 1, 70, 90, 8, 8);
    for (batch, heads, lq, lk) in [(3, 1, 70, 90), (1, 3, 70, 90), (1, 1, 71, 90), (1, 1, 70, 89)] {
        let pred = random_predicate(1, 1, 1, 30, 30);
        let mask = BlockMask::build(BlockShape { batch, heads, lq, lk }, Arc::new(pred.clone())).unwrap();
        let sparse = Some(Sparse { keep: Arc::new(pred), mask: Arc::new(mask), name: "wrong".into() });
        let case = Case { sparse, ..Case::new(d, 1) };
        for kernel in [Kernel::Reference, Kernel::Auto] {
            match case.run(kernel, false) {
                Err(AttnError::Param { field: "block_mask", .. }) => {}
                other => panic!("{}: expected a block_mask error, got {other:?}", kernel.name()),
            }
        }
    }
}
