//! Merging partial results over disjoint key shards: any partition of the keys, contiguous or
//! not, merged through the log-sum-exps gives the unsplit result (under the oracle rule), shards
//! that mask a row entirely contribute nothing, and malformed partials are refused. With attention
//! sinks, shards computed without them, merged, then joined to the sinks once by `fold_sinks` give
//! the unsplit call with sinks; shards each computed with the sinks do not.

use crate::common;

use attn_kernels::{fold_sinks, merge_partials, AttnError, Kernel, KvView, Partial, View4};
use attn_testkit::oracle;
use common::{dims, Case, Rng};

/// Runs `case` with only the keys where `in_shard(j)` allowed (a keep mask `[Lk]`), returning
/// `(out, lse)`; with the case's sinks when it has them.
fn shard(case: &Case, kernel: Kernel, in_shard: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<f32>) {
    let keep: Vec<bool> = (0..case.dims.lk).map(in_shard).collect();
    let mut params = case.params(None, case.sinks.as_deref());
    params.mask.keep = Some(attn_kernels::Broadcast::new("mask", &keep, &[case.dims.lk]).unwrap());
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = View4::contiguous("k", &case.k, case.k_dims()).unwrap();
    let v = View4::contiguous("v", &case.v, case.v_dims()).unwrap();
    let r = attn_kernels::attention(kernel, &q, &KvView::F32(k), &KvView::F32(v), &params, false).unwrap();
    (r.out, r.lse)
}

/// `case`'s keys split among `shards` by `owner`, each shard run on its own (without the case's
/// sinks), merged, and the sinks then joined by `fold_sinks`: `(out, lse)`.
fn merged(case: &Case, owner: &[usize], shards: usize) -> (Vec<f32>, Vec<f32>) {
    let plain = Case { sinks: None, ..case.clone() };
    let parts: Vec<_> = (0..shards).map(|s| shard(&plain, Kernel::Auto, |j| owner[j] == s)).collect();
    let views: Vec<Partial> = parts.iter().map(|(o, l)| Partial { out: o, lse: l }).collect();
    let d = case.dims;
    let mut out = vec![0.0; d.out_len()];
    let mut lse = vec![0.0; d.lse_len()];
    merge_partials(&views, d.dv, &mut out, &mut lse).unwrap();
    if let Some(sinks) = &case.sinks {
        fold_sinks(sinks, d.lq, d.dv, &mut out, &mut lse).unwrap();
    }
    (out, lse)
}

/// The oracle rule's verdict on `(out, lse)` against `case` run whole.
fn verdict(case: &Case, (out, lse): &(Vec<f32>, Vec<f32>), label: &str) -> Result<(), String> {
    let oracle = case.oracle();
    oracle::check(&format!("{label}: out"), out, &oracle.r64.out, &oracle.r32.out, oracle::OUTPUT_FACTOR)?;
    oracle::check(&format!("{label}: lse"), lse, &oracle.r64.lse, &oracle.r32.lse, oracle::OUTPUT_FACTOR)
}

fn check_partition(case: &Case, owner: &[usize], shards: usize, label: &str) {
    verdict(case, &merged(case, owner, shards), label).unwrap();
}

#[test]
fn contiguous_and_scattered_partitions_give_the_unsplit_result() {
    let mut rng = Rng::new(7);
    for (n, causal) in [(1usize, false), (2, false), (3, true), (5, false), (8, true)] {
        let case = Case { causal, ..Case::new(dims(2, 4, 2, 9, 70, 16, 12), 11 + n as u64) };
        let lk = case.dims.lk;
        let contiguous: Vec<usize> = (0..lk).map(|j| j * n / lk).collect();
        check_partition(&case, &contiguous, n, &format!("{n} contiguous shards, causal {causal}"));
        let scattered: Vec<usize> = (0..lk).map(|_| rng.below(n)).collect();
        check_partition(&case, &scattered, n, &format!("{n} scattered shards, causal {causal}"));
    }
}

#[test]
fn a_shard_masking_every_key_contributes_nothing() {
    let case = Case::new(dims(1, 2, 2, 4, 30, 8, 8), 3);
    // Shard 2 owns no key at all: its rows are fully masked (out 0, lse −∞).
    let owner: Vec<usize> = (0..30).map(|j| j % 2).collect();
    let (o2, l2) = shard(&case, Kernel::Auto, |_| false);
    assert!(l2.iter().all(|&l| l == f32::NEG_INFINITY) && o2.iter().all(|&x| x == 0.0));
    check_partition(&case, &owner, 3, "with an empty shard");
}

#[test]
fn rows_masked_in_every_shard_stay_masked() {
    let (o, l) = (vec![0.0f32; 4], vec![f32::NEG_INFINITY; 2]);
    let parts = [Partial { out: &o, lse: &l }, Partial { out: &o, lse: &l }];
    let mut out = vec![1.0; 4];
    let mut lse = vec![1.0; 2];
    merge_partials(&parts, 2, &mut out, &mut lse).unwrap();
    assert!(out.iter().all(|&x| x == 0.0) && lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn malformed_partials_are_refused() {
    let (o, l) = (vec![0.0f32; 4], vec![0.0f32; 2]);
    let short = vec![0.0f32; 1];
    let mut out = vec![0.0; 4];
    let mut lse = vec![0.0; 2];
    let bad_lse = [Partial { out: &o, lse: &short }];
    assert!(matches!(merge_partials(&bad_lse, 2, &mut out, &mut lse), Err(AttnError::Output { .. })));
    let bad_out = [Partial { out: &short, lse: &l }];
    assert!(matches!(merge_partials(&bad_out, 2, &mut out, &mut lse), Err(AttnError::Output { .. })));
    assert!(matches!(merge_partials(&[], 3, &mut out, &mut lse), Err(AttnError::Output { .. })));
}

#[test]
fn sinks_are_joined_once_after_merging() {
    let mut rng = Rng::new(17);
    for (n, causal) in [(2usize, false), (3, true)] {
        let sinks = vec![2.0, f32::NEG_INFINITY, 4.5, 0.5];
        let case = Case { causal, sinks: Some(sinks), ..Case::new(dims(2, 4, 2, 9, 70, 16, 12), 40 + n as u64) };
        let owner: Vec<usize> = (0..case.dims.lk).map(|_| rng.below(n)).collect();
        check_partition(&case, &owner, n, &format!("{n} shards with sinks, causal {causal}"));
        // Each shard with the sinks counts them once per shard: far off the call with sinks.
        let parts: Vec<_> = (0..n).map(|s| shard(&case, Kernel::Auto, |j| owner[j] == s)).collect();
        let views: Vec<Partial> = parts.iter().map(|(o, l)| Partial { out: o, lse: l }).collect();
        let (mut out, mut lse) = (vec![0.0; case.dims.out_len()], vec![0.0; case.dims.lse_len()]);
        merge_partials(&views, case.dims.dv, &mut out, &mut lse).unwrap();
        assert!(verdict(&case, &(out, lse), "sinks in every shard").is_err(), "sinks merged per shard pass");
    }
}

#[test]
fn folding_sinks_into_rows_without_keys() {
    // Rows [B=1, Hq=2, Lq=2] of Dv=1: head 0 has no keys (lse −∞), head 1 has its sink −∞.
    let mut out = vec![0.0, 0.0, 0.5, -1.0];
    let mut lse = vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 1.25, 3.0];
    fold_sinks(&[0.75, f32::NEG_INFINITY], 2, 1, &mut out, &mut lse).unwrap();
    assert_eq!(out, [0.0, 0.0, 0.5, -1.0]);
    assert_eq!(lse, [0.75, 0.75, 1.25, 3.0]);
}

#[test]
fn malformed_sinks_are_refused() {
    let (mut out, mut lse) = (vec![0.0f32; 12], vec![0.0f32; 6]);
    // 6 rows are not a whole number of batches of Hq·Lq = 2·4.
    let err = fold_sinks(&[0.0, 1.0], 4, 2, &mut out, &mut lse).unwrap_err();
    assert!(matches!(err, AttnError::Layout { tensor: "lse", .. }), "{err}");
    let err = fold_sinks(&[0.0, 1.0, 2.0], 2, 3, &mut out, &mut lse).unwrap_err();
    assert!(matches!(err, AttnError::Output { tensor: "out", .. }), "{err}");
    let err = fold_sinks(&[0.0, f32::NAN, 2.0], 2, 2, &mut out, &mut lse).unwrap_err();
    assert!(matches!(err, AttnError::Param { field: "sinks", .. }), "{err}");
}
