//! Criterion benchmarks of the gated delta rule (`attn_kernels::delta`): the chunked forward against
//! the recurrence in `f32`, and the chunked backward (the forward's recomputation included), on Qwen3-Next's head layout (16 value heads over 16 key
//! heads, `Dk = Dv = 128`), one sequence of `T` tokens, scalar gate, L2-normalised `q` and `k`.
//! Throughput is `Elements(flops)` of the recurrence, `4·Dk·Dv·2` per token and head (decay, read,
//! write, output: a multiply and an add each).
//!
//! Then one decode step of 8 sequences against their states (`delta_rule_decode_B8`, throughput
//! in the states' bytes).
//!
//! Run with `cargo bench -p attn-kernels --bench delta_rule`; add `-- --test` for one quick pass.

use std::hint::black_box;
use std::time::Duration;

use attn_kernels::delta::{delta_rule, delta_rule_backward, delta_rule_reference, DeltaDims, DeltaInputs, DeltaParams};
use attn_kernels::rng::SplitMix64;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    for t in [1024, 4096] {
        let d = DeltaDims { b: 1, t, hk: 16, hv: 16, dk: 128, dv: 128 };
        let mut rng = SplitMix64::new(1);
        let q = rng.uniform(d.qk_len(), -1.0, 1.0);
        let k = rng.uniform(d.qk_len(), -1.0, 1.0);
        let v = rng.uniform(d.v_len(), -1.0, 1.0);
        let g = rng.uniform(d.beta_len(), -0.2, -0.01);
        let beta = rng.uniform(d.beta_len(), 0.1, 0.9);
        let x = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, initial_state: None, cu_seqlens: None };
        let p = DeltaParams { l2norm_qk: true, ..DeltaParams::default() };
        let mut group = c.benchmark_group(format!("delta_rule_T{t}"));
        group.sample_size(10).measurement_time(Duration::from_secs(5));
        group.throughput(Throughput::Elements((8 * d.dk * d.dv * d.hv * t) as u64));
        group.bench_function(BenchmarkId::from_parameter("chunked"), |b| {
            b.iter(|| black_box(delta_rule(&d, &x, &p).unwrap()))
        });
        group.bench_function(BenchmarkId::from_parameter("recurrent"), |b| {
            b.iter(|| black_box(delta_rule_reference(&d, &x, &p).unwrap()))
        });
        let dout = rng.uniform(d.v_len(), -1.0, 1.0);
        group.bench_function(BenchmarkId::from_parameter("chunked_backward"), |b| {
            b.iter(|| black_box(delta_rule_backward(&d, &x, &p, &dout, None).unwrap()))
        });
        group.finish();
    }
}

/// One decode step: 8 sequences of one new token each against their states (16 value over 8 key
/// heads, D 128, as `scripts/delta_vs_torch.py`'s decode case), the states 8 MiB in all.
fn decode(c: &mut Criterion) {
    let d = DeltaDims { b: 8, t: 1, hk: 8, hv: 16, dk: 128, dv: 128 };
    let mut rng = SplitMix64::new(2);
    let q = rng.uniform(d.qk_len(), -1.0, 1.0);
    let k = rng.uniform(d.qk_len(), -1.0, 1.0);
    let v = rng.uniform(d.v_len(), -1.0, 1.0);
    let g = rng.uniform(d.beta_len(), -0.2, -0.01);
    let beta = rng.uniform(d.beta_len(), 0.1, 0.9);
    let s0 = rng.uniform(d.state_len(d.b), -0.5, 0.5);
    let x = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, initial_state: Some(&s0), cu_seqlens: None };
    let p = DeltaParams { l2norm_qk: true, ..DeltaParams::default() };
    let mut group = c.benchmark_group("delta_rule_decode_B8");
    group.sample_size(50).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Bytes((d.state_len(d.b) * 4) as u64));
    group.bench_function("step", |b| b.iter(|| black_box(delta_rule(&d, &x, &p).unwrap())));
    group.finish();
}

criterion_group!(benches, bench, decode);
criterion_main!(benches);
