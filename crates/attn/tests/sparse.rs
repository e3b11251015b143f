//! Block-sparse masks through the library: `SdpaOptions::block_mask` gives the results of the same
//! pattern as a dense boolean mask, forward and through candle's autograd, with one block mask
//! shared by several calls; `keep_mask` draws it; a mask for other sizes is refused.

use std::sync::Arc;

use attn::sparse::{BlockMask, BlockShape, MaskModExt, Pattern};
use attn::{random::uniform, sdpa, AttnLibError, Mask, SdpaOptions, Window};
use candle_core::{Tensor, Var};

const L: usize = 150;

fn inputs(seed: u64) -> (Var, Var, Var) {
    let var = |shape: &[usize], s| Var::from_tensor(&uniform(shape, -1.5, 1.5, s).unwrap()).unwrap();
    (var(&[2, 4, L, 16], seed), var(&[2, 2, L, 16], seed + 1), var(&[2, 2, L, 8], seed + 2))
}

/// Output and `dq`, `dk`, `dv` of `Σ out·w` for a fixed random `w`.
fn run(opts: &SdpaOptions, seed: u64) -> Vec<Vec<f32>> {
    let (q, k, v) = inputs(seed);
    let out = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), opts).unwrap();
    let w = uniform(out.dims(), -1.0, 1.0, 99).unwrap();
    let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut all = vec![flat(&out)];
    all.extend([&q, &k, &v].map(|x| flat(grads.get(x.as_tensor()).expect("a gradient"))));
    all
}

fn assert_close(what: &str, a: &[Vec<f32>], b: &[Vec<f32>]) {
    for (n, (x, y)) in a.iter().zip(b).enumerate() {
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs() / (1.0 + q.abs())).fold(0.0f32, f32::max);
        assert!(worst < 2e-5, "{what}: tensor {n} differs by {worst}");
    }
}

#[test]
fn block_mask_equals_its_dense_mask_forward_and_backward() {
    let window = Window { left: Some(20), right: Some(10) };
    for p in [
        Pattern::Longformer { window, global: 3 },
        Pattern::BigBird { window, global: 2, random: 1, seed: 4 },
        Pattern::Strided { stride: 12 },
        Pattern::Document { lengths: vec![40, 90, 20] },
    ] {
        let bm = Arc::new(p.block_mask(L, L).unwrap());
        let sparse = SdpaOptions::default().block_mask(bm.clone());
        let dense_keep = sparse.keep_mask(1, 1, L, L).unwrap();
        let dense = SdpaOptions::default().mask(Mask::keep(dense_keep));
        // One block mask serves several calls (and their backward) unchanged.
        for seed in [1, 7] {
            assert_close(p.name(), &run(&sparse, seed), &run(&dense, seed));
        }
        assert_eq!(Arc::strong_count(&bm), 2, "{}: the calls let go of the shared mask", p.name());
    }
}

#[test]
fn keep_mask_draws_the_pattern() {
    let p = Pattern::Sinks { sinks: 2, window: 5 };
    let opts = SdpaOptions::default().block_mask(Arc::new(p.block_mask(L, L).unwrap()));
    let keep = opts.keep_mask(1, 1, L, L).unwrap().flatten_all().unwrap().to_vec1::<u8>().unwrap();
    for i in 0..L {
        for j in 0..L {
            let want = j <= i && (j < 2 || i - j < 5);
            assert_eq!(keep[i * L + j] == 1, want, "({i}, {j})");
        }
    }
}

#[test]
fn a_predicate_composes_with_the_other_options() {
    // A programmable mask: even keys only, and causal through the options.
    let even = |_b: usize, _h: usize, _q: usize, kv: usize| kv.is_multiple_of(2);
    let all = |_b: usize, _h: usize, _q: usize, _kv: usize| true;
    let bm = BlockMask::build(BlockShape { batch: 1, heads: 1, lq: L, lk: L }, Arc::new(even.and(all))).unwrap();
    let sparse = SdpaOptions::default().block_mask(Arc::new(bm)).causal(true);
    let dense = SdpaOptions::default().mask(Mask::keep(sparse.keep_mask(1, 1, L, L).unwrap()));
    assert_close("even keys, causal", &run(&sparse, 3), &run(&dense, 3));
}

#[test]
fn a_block_mask_for_other_sizes_is_refused() {
    let bm = Arc::new(Pattern::PrefixLm { prefix: 4 }.block_mask(L + 1, L + 1).unwrap());
    let (q, k, v) = inputs(1);
    let err = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), &SdpaOptions::default().block_mask(bm)).unwrap_err();
    assert!(matches!(err, AttnLibError::Kernel(_)), "{err:?}");
    assert!(err.to_string().contains("block_mask"), "{err}");
}
