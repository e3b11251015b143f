//! The chunk-parallel (segmented) path of linear attention, forced through
//! `LinearParams::segments` so that a 2-core CI runs it: against the naive `f64` oracle under the
//! oracle rule (forward and gradients) for every feature map, causal (lengths off the chunk, below
//! it and one past it, grouped-query heads, key padding that empties whole segments) and not
//! (`Lq ≠ Lk`, padding, grouped heads); and against the sequential form in `f64` to rounding, with
//! the segment count chosen by the call on a pool with more threads than heads.

use crate::linear_common;

use attn_kernels::linear::FeatureMap;
use linear_common::{maps, max_diff, Case};

/// `c` with `segments` segments.
fn segmented(mut c: Case, segments: usize) -> Case {
    c.segments = segments;
    c
}

#[test]
fn every_map_matches_the_oracle_in_segments() {
    for map in maps(8, 24) {
        for segments in [2, 3, 5] {
            // 29 rows in chunks of 4: 8 chunks, the last of 1 row.
            let c = Case::new([1, 2, 2, 29, 29, 8, 6], map.clone(), true, 4, 21);
            segmented(c, segments).assert_oracle(true);
        }
    }
}

#[test]
fn lengths_off_below_and_one_past_the_chunk() {
    for (l, chunk) in [(16, 16), (17, 16), (15, 16), (1, 4), (40, 7), (33, 1)] {
        for segments in [2, 4, 64] {
            for map in [FeatureMap::Elu, maps(8, 8).pop().unwrap()] {
                let c = Case::new([1, 1, 1, l, l, 8, 8], map, true, chunk, 22);
                segmented(c, segments).assert_oracle(true);
            }
        }
    }
}

#[test]
fn grouped_heads_and_padding_that_empties_segments() {
    for map in maps(6, 16) {
        // Batch entry 0 has keys in the first segment only, entry 1 none at all.
        let mut c = Case::new([3, 4, 2, 30, 30, 6, 5], map.clone(), true, 4, 23);
        c.key_lens = Some(vec![5, 0, 30]);
        segmented(c, 3).assert_oracle(true);
        let mut c = Case::new([1, 6, 2, 21, 21, 6, 7], map, true, 3, 24);
        c.key_lens = Some(vec![17]);
        segmented(c, 4).assert_oracle(true);
    }
}

#[test]
fn wide_heads_in_segments_use_the_micro_kernel() {
    // f32 at D = Dv = 64 (full register blocks), and at sizes off the vector width.
    let c = Case::new([1, 1, 1, 300, 300, 64, 64], FeatureMap::Elu, true, 64, 25);
    segmented(c, 2).assert_oracle(true);
    let mut c = Case::new([1, 2, 1, 150, 150, 33, 65], FeatureMap::Elu, true, 32, 26);
    c.key_lens = Some(vec![101]);
    segmented(c, 3).assert_oracle(true);
}

#[test]
fn non_causal_segments_match_the_oracle() {
    for map in maps(8, 24) {
        for (lq, lk, segments) in [(29, 13, 2), (13, 29, 3), (40, 40, 9)] {
            let mut c = Case::new([2, 4, 2, lq, lk, 8, 6], map.clone(), false, 4, 28);
            c.key_lens = Some(vec![lk, lk / 2]);
            segmented(c, segments).assert_oracle(true);
        }
    }
    let c = Case::new([1, 1, 1, 200, 150, 64, 64], FeatureMap::Elu, false, 64, 29);
    segmented(c, 2).assert_oracle(true);
}

#[test]
fn segments_agree_with_the_sequential_form_to_rounding() {
    for (map, causal) in maps(8, 16).into_iter().flat_map(|m| [(m.clone(), true), (m, false)]) {
        let mut c = Case::new([2, 2, 1, 50, 50, 8, 8], map, causal, 6, 27);
        c.key_lens = Some(vec![50, 23]);
        let (one, fwd, bwd) = (segmented(c.clone(), 1), c.forward::<f64>(true), c.backward::<f64>(true));
        let (fwd1, bwd1) = (one.forward::<f64>(true), one.backward::<f64>(true));
        for segments in [0, 2, 3, 9] {
            let s = segmented(c.clone(), segments);
            let pool = rayon::ThreadPoolBuilder::new().num_threads(8).build().unwrap();
            // Segments 0: chosen by the call, with 8 threads for 2 heads.
            let (f, g) = pool.install(|| (s.forward::<f64>(true), s.backward::<f64>(true)));
            assert!(max_diff(&f, &fwd1) < 1e-12, "{}", s.describe());
            for (a, b) in [(&g.dq, &bwd1.dq), (&g.dk, &bwd1.dk), (&g.dv, &bwd1.dv)] {
                assert!(max_diff(a, b) < 1e-11, "{}: {}", s.describe(), max_diff(a, b));
            }
        }
        // And the default call on this pool agrees too.
        assert!(max_diff(&fwd, &fwd1) < 1e-12 && max_diff(&bwd.dk, &bwd1.dk) < 1e-11);
    }
}
