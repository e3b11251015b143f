//! Linear attention against its naive `f64` oracle under the oracle rule (forward and gradients),
//! for every feature map, causal and not, chunk sizes at and around the edges, key padding and
//! grouped-query heads, the vector micro-kernel's edge sizes; the oracle's own gradients against
//! finite differences.

use crate::linear_common;

use attn_kernels::linear::FeatureMap;
use linear_common::{maps, max_diff, Case};

#[test]
fn every_map_matches_the_oracle_causal_and_not() {
    for map in maps(8, 24) {
        for causal in [false, true] {
            let lk = if causal { 13 } else { 11 };
            Case::new([2, 2, 2, 13, lk, 8, 6], map.clone(), causal, 4, 1).assert_oracle(true);
        }
    }
}

#[test]
fn chunk_sizes_at_and_around_the_edges() {
    let l = 16;
    for chunk in [1, 2, 7, 15, 16, 17, 64] {
        for map in [FeatureMap::Elu, maps(8, 8).pop().unwrap()] {
            Case::new([1, 2, 1, l, l, 8, 8], map, true, chunk, 2).assert_oracle(true);
        }
    }
}

#[test]
fn wide_heads_use_every_register_block() {
    // D = Dv = 64 and 3 chunks: the products' full 32-column blocks and row blocks of 4.
    Case::new([1, 2, 1, 150, 150, 64, 64], FeatureMap::Elu, true, 64, 3).assert_oracle(true);
    Case::new([1, 1, 1, 70, 90, 64, 40], FeatureMap::Relu, false, 64, 3).assert_oracle(true);
}

#[test]
fn the_vector_micro_kernel_at_edge_sizes() {
    // f32 runs the SIMD micro-kernel: D and Dv not multiples of the vector width (16 or 8),
    // L not a multiple of the chunk, L below the chunk, grouped-query heads with key padding,
    // FAVOR+ with a feature count that is not either, and chunks of 128.
    Case::new([1, 2, 1, 150, 150, 33, 65], FeatureMap::Elu, true, 64, 11).assert_oracle(true);
    Case::new([1, 1, 1, 40, 40, 17, 16], FeatureMap::Elu, true, 64, 12).assert_oracle(true);
    Case::new([1, 1, 1, 200, 200, 64, 64], FeatureMap::Relu, true, 128, 13).assert_oracle(true);
    for causal in [false, true] {
        let mut c = Case::new([2, 4, 2, 100, 100, 48, 20], FeatureMap::Elu, causal, 64, 14);
        c.key_lens = Some(vec![100, 37]);
        c.assert_oracle(true);
        let mut c = Case::new([2, 2, 1, 70, 70, 20, 24], maps(20, 40).pop().unwrap(), causal, 32, 15);
        c.key_lens = Some(vec![70, 3]);
        c.assert_oracle(true);
    }
}

/// The query heads of a key/value head run together (sharing its key features and state): on one
/// thread, and on eight, more threads than the 4 key/value heads (a call may then cut the heads'
/// chunks into segments).
#[test]
fn grouped_query_heads_sum_their_key_gradients() {
    for (causal, threads) in [false, true].into_iter().flat_map(|c| [(c, 1), (c, 8)]) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| Case::new([2, 6, 2, 10, 10, 4, 5], FeatureMap::Elu, causal, 3, 4).assert_oracle(true));
    }
}

#[test]
fn padded_keys_are_left_out_and_get_no_gradient() {
    for causal in [false, true] {
        for map in maps(4, 16) {
            let mut c = Case::new([3, 2, 1, 9, 9, 4, 3], map, causal, 4, 5);
            c.key_lens = Some(vec![9, 5, 0]);
            c.assert_oracle(true);
            let g = c.backward::<f64>(true);
            // Batch entry 1 has 5 valid keys: keys 5..9 get exactly zero gradients.
            let (d, dv) = (4, 3);
            let tail = |x: &[f64], w: usize| x[(9 + 5) * w..18 * w].to_vec();
            assert!(tail(&g.dk, d).iter().chain(&tail(&g.dv, dv)).all(|&x| x == 0.0));
            // Changing a padded key or value does not change the output.
            let before = c.forward::<f64>(true);
            c.k[(9 + 7) * d] += 3.0;
            c.v[(9 + 7) * dv] = f64::NAN;
            assert_eq!(before, c.forward::<f64>(true), "{}", c.describe());
        }
    }
}

#[test]
fn all_padding_rows_are_zero_not_nan() {
    for causal in [false, true] {
        for map in maps(4, 8) {
            let mut c = Case::new([1, 1, 1, 5, 5, 4, 3], map, causal, 2, 6);
            c.key_lens = Some(vec![0]);
            assert!(c.forward::<f32>(true).iter().all(|&x| x == 0.0), "{}", c.describe());
            let g = c.backward::<f32>(true);
            assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0), "{}", c.describe());
        }
    }
}

#[test]
fn fast_f64_agrees_with_the_oracle_to_rounding() {
    for map in maps(8, 16) {
        let c = Case::new([1, 2, 2, 20, 20, 8, 8], map, true, 6, 7);
        let (fast, oracle) = (c.forward::<f64>(true), c.forward::<f64>(false));
        assert!(max_diff(&fast, &oracle) < 1e-12, "{}", c.describe());
        let (fast, oracle) = (c.backward::<f64>(true), c.backward::<f64>(false));
        for (a, b) in [(&fast.dq, &oracle.dq), (&fast.dk, &oracle.dk), (&fast.dv, &oracle.dv)] {
            assert!(max_diff(a, b) < 1e-10, "{}: {}", c.describe(), max_diff(a, b));
        }
    }
}

/// `Σ out ⊙ dout` by the oracle, for central differences.
fn loss(c: &Case) -> f64 {
    c.forward::<f64>(false).iter().zip(&c.dout).map(|(a, b)| a * b).sum()
}

#[test]
fn oracle_gradients_match_finite_differences() {
    for map in maps(3, 6) {
        for causal in [false, true] {
            let mut c = Case::new([1, 2, 1, 5, 5, 3, 2], map.clone(), causal, 2, 8);
            c.key_lens = Some(vec![4]);
            if matches!(map, FeatureMap::Favor(_)) {
                // FAVOR+'s stabilisers are constants to the backward; they move the loss only through
                // ε (relative to a denominator), which a tiny ε takes out of the comparison.
                c.eps = 1e-12;
            }
            let g = c.backward::<f64>(false);
            let h = 1e-6;
            for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
                for (i, &gi) in grad.iter().enumerate() {
                    let shifted = |by: f64| {
                        let mut c = c.clone();
                        [&mut c.q, &mut c.k, &mut c.v][which][i] += by;
                        c
                    };
                    let fd = (loss(&shifted(h)) - loss(&shifted(-h))) / (2.0 * h);
                    assert!(
                        (fd - gi).abs() < 1e-6 * (1.0 + fd.abs()),
                        "{} {which}[{i}]: fd {fd} vs {gi}",
                        c.describe()
                    );
                }
            }
        }
    }
}
