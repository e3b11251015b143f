//! Linear attention into the caller's buffers (`linear_attention_into`,
//! `linear_attention_backward_into`): bit for bit what the allocating forms return and within the
//! oracle rule, over buffers that held garbage (NaN, huge values) before — so nothing relies on
//! zeroed memory — causal and not, grouped-query heads, key padding, the segmented paths, empty
//! sizes; wrong buffer lengths are typed errors that leave every buffer as it was.

use crate::linear_common;

use attn_kernels::linear::{linear_attention_backward_into, linear_attention_into, FeatureMap, GradsMut};
use attn_kernels::{AttnError, AttnGrads, Real, View4};
use linear_common::{maps, Case};

/// The garbage a caller's buffer may hold before the call.
fn garbage<T: Real>() -> [T; 3] {
    [T::nan(), T::max_value(), T::from_f64(-1.5).unwrap()]
}

fn bits<T: Real>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().unwrap().to_bits()).collect()
}

/// The `_into` forms of `c` over every kind of garbage equal the allocating forms bit for bit.
fn assert_same_bits<T: Real>(c: &Case) {
    let (out, g) = (c.forward::<T>(true), c.backward::<T>(true));
    for fill in garbage::<T>() {
        assert_eq!(bits(&c.forward_into(fill)), bits(&out), "out over {fill:?}: {}", c.describe());
        let gi = c.backward_into(fill);
        for (name, a, b) in [("dq", &gi.dq, &g.dq), ("dk", &gi.dk, &g.dk), ("dv", &gi.dv, &g.dv)] {
            assert_eq!(bits(a), bits(b), "{name} over {fill:?}: {}", c.describe());
        }
    }
}

/// `c` in `f32` and `f64`, and its `f32` results written over NaN within the oracle rule.
fn check_case(c: &Case) {
    assert_same_bits::<f32>(c);
    assert_same_bits::<f64>(c);
    c.assert_oracle_of(&c.forward_into(f32::NAN), Some(&c.backward_into(f32::NAN)));
}

#[test]
fn every_map_causal_and_not_with_grouped_heads_and_padding() {
    for map in maps(8, 24) {
        for causal in [false, true] {
            let lk = if causal { 13 } else { 11 };
            let mut c = Case::new([2, 4, 2, 13, lk, 8, 6], map.clone(), causal, 4, 31);
            check_case(&c);
            // Padding: a whole chunk and a partial one of batch entry 0 beyond its keys, none in 1.
            c.key_lens = Some(vec![5, lk]);
            check_case(&c);
        }
    }
}

#[test]
fn a_batch_entry_without_keys_gets_zeros_not_garbage() {
    for causal in [false, true] {
        let mut c = Case::new([2, 2, 1, 9, 9, 4, 3], FeatureMap::Elu, causal, 4, 32);
        c.key_lens = Some(vec![0, 9]);
        check_case(&c);
        let g = c.backward_into(f32::NAN);
        // Entry 0's keys are all padding: exactly zero gradients, written over the NaN.
        assert!(g.dk[..9 * 4].iter().chain(&g.dv[..9 * 3]).all(|&x| x == 0.0));
        assert!(c.forward_into(f32::NAN)[..2 * 9 * 3].iter().all(|&x| x == 0.0));
    }
}

#[test]
fn the_segmented_paths_and_the_wide_micro_kernel() {
    for (causal, segments) in [(true, 2), (true, 3), (false, 2), (false, 3)] {
        let mut c = Case::new([2, 4, 2, 40, 40, 8, 6], FeatureMap::Elu, causal, 4, 33);
        c.key_lens = Some(vec![40, 17]);
        c.segments = segments;
        check_case(&c);
    }
    // D = Dv = 64, chunks of 64, L not a multiple of the chunk: the micro-kernel's full blocks.
    for causal in [false, true] {
        check_case(&Case::new([1, 2, 1, 150, 150, 64, 64], FeatureMap::Elu, causal, 64, 34));
    }
}

#[test]
fn empty_sizes_write_zeros_over_garbage() {
    for dims in [[1, 1, 1, 3, 0, 2, 2], [1, 1, 1, 3, 3, 0, 2], [0, 1, 1, 4, 4, 2, 2]] {
        let c = Case::new(dims, FeatureMap::Elu, false, 2, 35);
        assert!(c.forward_into(f32::NAN).iter().all(|&x| x == 0.0), "{}", c.describe());
        let g = c.backward_into(f32::NAN);
        assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0), "{}", c.describe());
    }
}

#[test]
fn wrong_buffer_lengths_are_typed_errors_naming_the_buffer() {
    let c = Case::new([1, 2, 1, 5, 5, 4, 3], FeatureMap::Elu, true, 2, 36);
    let [q, k, v, g] = c.inputs::<f64>();
    let [sq, sk, sv, so] = c.shapes();
    let view = |n, x, s| View4::contiguous(n, x, s).unwrap();
    let (qv, kv, vv, gv) = (view("q", &q, sq), view("k", &k, sk), view("v", &v, sv), view("dout", &g, so));
    let n = |s: [usize; 4]| s.iter().product::<usize>();
    for len in [n(so) - 1, n(so) + 1, 0] {
        let mut out = vec![7.0; len];
        let e = linear_attention_into(qv, kv, vv, &c.params(), &mut out).unwrap_err();
        assert_eq!(e, AttnError::Output { tensor: "out", expected: n(so), found: len });
        assert!(out.iter().all(|&x| x == 7.0), "a refused call writes nothing");
    }
    let out = c.forward::<f64>(true);
    let ov = view("out", &out, so);
    let right = [n(sq), n(sk), n(sv)];
    for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
        let mut bufs = right.map(|len| vec![7.0; len]);
        bufs[i].pop();
        let [dq, dk, dv] = &mut bufs;
        let e = linear_attention_backward_into(qv, kv, vv, ov, gv, &c.params(), GradsMut { dq, dk, dv }).unwrap_err();
        assert_eq!(e, AttnError::Output { tensor: name, expected: right[i], found: right[i] - 1 });
        assert!(bufs.iter().flatten().all(|&x| x == 7.0), "a refused call writes nothing");
    }
    // Right lengths: the same gradients as the allocating form.
    let mut bufs = right.map(|len| vec![7.0; len]);
    let [dq, dk, dv] = &mut bufs;
    linear_attention_backward_into(qv, kv, vv, ov, gv, &c.params(), GradsMut { dq, dk, dv }).unwrap();
    let AttnGrads { dq, dk, dv, .. } = c.backward::<f64>(true);
    assert_eq!(bufs, [dq, dk, dv]);
}
