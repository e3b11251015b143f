//! Linear attention at its edges: recurrent decoding equals the causal forward, empty sizes,
//! typed errors for bad inputs, and a property test over random shapes and options.

use crate::linear_common;

use attn_kernels::linear::{linear_attention, FavorFeatures, FeatureMap, LinearParams, LinearState};
use attn_kernels::{AttnError, View4};

fn view<'a>(name: &'static str, x: &'a [f64], dims: [usize; 4]) -> View4<'a, f64> {
    View4::contiguous(name, x, dims).unwrap()
}
use linear_common::{maps, max_diff, Case};
use proptest::prelude::*;

#[test]
fn recurrent_decoding_equals_the_causal_forward() {
    let (b, hq, hkv, l, d, dv) = (2, 4, 2, 12, 8, 5);
    for map in maps(d, 32) {
        let mut c = Case::new([b, hq, hkv, l, l, d, dv], map.clone(), true, 5, 9);
        if matches!(map, FeatureMap::Favor(_)) {
            // FAVOR+ stabilises the state by the running key maximum, the forward by the whole
            // head's: the two differ through ε only, which a tiny ε takes out of the comparison.
            c.eps = 1e-12;
        }
        let full = c.forward::<f64>(true);
        let mut state = LinearState::<f64>::new(map, c.eps, b, hkv, d, dv).unwrap();
        let slice = |x: &[f64], h: usize, w: usize, t: usize| -> Vec<f64> {
            (0..b * h).flat_map(|bh| x[(bh * l + t) * w..][..w].to_vec()).collect()
        };
        for t in 0..l {
            let (q, k, v) = (slice(&c.q, hq, d, t), slice(&c.k, hkv, d, t), slice(&c.v, hkv, dv, t));
            let out = state
                .step(view("q", &q, [b, hq, 1, d]), view("k", &k, [b, hkv, 1, d]), view("v", &v, [b, hkv, 1, dv]))
                .unwrap();
            let want = slice(&full, hq, dv, t);
            assert!(max_diff(&out, &want) < 1e-9, "{} step {t}: {}", c.describe(), max_diff(&out, &want));
        }
        assert_eq!(state.len(), l);
    }
}

#[test]
fn empty_sizes_give_empty_or_zero_results() {
    for dims in [
        [0, 1, 1, 4, 4, 2, 2],
        [1, 1, 1, 0, 3, 2, 2],
        [1, 1, 1, 3, 0, 2, 2],
        [1, 1, 1, 3, 3, 2, 0],
        [1, 1, 1, 3, 3, 0, 2],
    ] {
        let causal = dims[3] == dims[4];
        let c = Case::new(dims, FeatureMap::Elu, causal, 2, 10);
        let out = c.forward::<f32>(true);
        assert_eq!(out.len(), dims[0] * dims[1] * dims[3] * dims[6]);
        assert!(out.iter().all(|&x| x == 0.0));
        let g = c.backward::<f32>(true);
        assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0));
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    assert!(matches!(FavorFeatures::new(4, 0, 1), Err(AttnError::Param { field: "features", .. })));
    let x = vec![0.5f32; 64];
    let v4 = |n, dims: [usize; 4]| View4::contiguous(n, &x[..dims.iter().product()], dims).unwrap();
    let (q, k) = (v4("q", [1, 2, 4, 4]), v4("k", [1, 1, 4, 4]));
    let elu = FeatureMap::Elu;
    let run = |q, k, v, p: &LinearParams| linear_attention(q, k, v, p).unwrap_err();
    let p = LinearParams::new(&elu);
    assert_eq!(
        run(q, k, v4("v", [1, 1, 3, 4]), &p),
        AttnError::DimMismatch { tensor: "v", dim: "L", expected: 4, found: 3 }
    );
    assert_eq!(
        run(q, v4("k", [1, 1, 4, 2]), k, &p),
        AttnError::DimMismatch { tensor: "k", dim: "D", expected: 4, found: 2 }
    );
    assert!(matches!(run(q, v4("k", [1, 3, 4, 4]), v4("v", [1, 3, 4, 4]), &p), AttnError::Heads(_)));
    let causal = LinearParams { causal: true, ..LinearParams::new(&elu) };
    assert!(
        matches!(run(q, v4("k", [1, 1, 3, 4]), v4("v", [1, 1, 3, 4]), &causal), AttnError::DimMismatch { dim, .. } if dim.starts_with('L'))
    );
    for (eps, field) in [(0.0, "eps"), (f64::NAN, "eps")] {
        assert!(
            matches!(run(q, k, k, &LinearParams { eps, ..LinearParams::new(&elu) }), AttnError::Param { field: f, .. } if f == field)
        );
    }
    assert!(matches!(
        run(q, k, k, &LinearParams { chunk: 0, ..LinearParams::new(&elu) }),
        AttnError::Param { field: "chunk", .. }
    ));
    let lens = [5usize];
    assert!(matches!(
        run(q, k, k, &LinearParams { key_lens: Some(&lens), ..LinearParams::new(&elu) }),
        AttnError::Param { field: "key_lens", .. }
    ));
    let favor = FeatureMap::Favor(FavorFeatures::new(3, 8, 1).unwrap());
    assert_eq!(
        run(q, k, k, &LinearParams::new(&favor)),
        AttnError::DimMismatch { tensor: "favor features", dim: "D", expected: 4, found: 3 }
    );
    let mut state = LinearState::<f32>::new(FeatureMap::Elu, 1e-6, 1, 1, 4, 4).unwrap();
    assert!(matches!(
        state.step(v4("q", [1, 1, 1, 4]), v4("k", [1, 1, 2, 4]), v4("v", [1, 1, 2, 4])),
        Err(AttnError::DimMismatch { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_and_options_match_the_oracle(
        b in 1usize..3, hkv in 1usize..3, group in 1usize..3, l in 1usize..20, lk in 1usize..20, d in 1usize..10,
        dv in 1usize..10, map in 0usize..4, causal: bool, chunk in 1usize..9, pad in proptest::option::of(0usize..20),
        seed: u64,
    ) {
        let map = maps(d, 1 + d % 5).swap_remove(map);
        let lk = if causal { l } else { lk };
        let mut c = Case::new([b, hkv * group, hkv, l, lk, d, dv], map, causal, chunk, seed);
        c.key_lens = pad.map(|p| (0..b).map(|i| (p + i) % (lk + 1)).collect());
        let (fast, oracle) = (c.forward::<f64>(true), c.forward::<f64>(false));
        let scale = oracle.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        prop_assert!(max_diff(&fast, &oracle) <= 1e-9 * scale, "{}", c.describe());
        let (fast, oracle) = (c.backward::<f64>(true), c.backward::<f64>(false));
        for (a, o) in [(&fast.dq, &oracle.dq), (&fast.dk, &oracle.dk), (&fast.dv, &oracle.dv)] {
            let scale = o.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            prop_assert!(max_diff(a, o) <= 1e-8 * scale, "{}: {}", c.describe(), max_diff(a, o));
        }
    }
}
