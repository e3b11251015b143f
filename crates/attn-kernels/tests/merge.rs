//! Merging partial results over disjoint key shards: any partition of the keys, contiguous or
//! not, merged through the log-sum-exps gives the unsplit result (under the oracle rule), shards
//! that mask a row entirely contribute nothing, and malformed partials are refused.

mod common;

use attn_kernels::{merge_partials, AttnError, Kernel, KvView, Partial, View4};
use attn_testkit::oracle;
use common::{dims, Case, Rng};

/// Runs `case` with only the keys where `in_shard(j)` allowed (a keep mask `[Lk]`), returning
/// `(out, lse)`.
fn shard(case: &Case, kernel: Kernel, in_shard: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<f32>) {
    let keep: Vec<bool> = (0..case.dims.lk).map(in_shard).collect();
    let mut params = case.params(None);
    params.mask.keep = Some(attn_kernels::Broadcast::new("mask", &keep, &[case.dims.lk]).unwrap());
    let q = View4::contiguous("q", &case.q, case.q_dims()).unwrap();
    let k = View4::contiguous("k", &case.k, case.k_dims()).unwrap();
    let v = View4::contiguous("v", &case.v, case.v_dims()).unwrap();
    let r = attn_kernels::attention(kernel, &q, &KvView::F32(k), &KvView::F32(v), &params, false).unwrap();
    (r.out, r.lse)
}

fn check_partition(case: &Case, owner: &[usize], shards: usize, label: &str) {
    let kernel = Kernel::Auto;
    let parts: Vec<_> = (0..shards).map(|s| shard(case, kernel, |j| owner[j] == s)).collect();
    let views: Vec<Partial> = parts.iter().map(|(o, l)| Partial { out: o, lse: l }).collect();
    let d = case.dims;
    let mut out = vec![0.0; d.out_len()];
    let mut lse = vec![0.0; d.lse_len()];
    merge_partials(&views, d.dv, &mut out, &mut lse).unwrap();
    let oracle = case.oracle();
    oracle::check(&format!("{label}: out"), &out, &oracle.r64.out, &oracle.r32.out, oracle::OUTPUT_FACTOR).unwrap();
    oracle::check(&format!("{label}: lse"), &lse, &oracle.r64.lse, &oracle.r32.lse, oracle::OUTPUT_FACTOR).unwrap();
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
