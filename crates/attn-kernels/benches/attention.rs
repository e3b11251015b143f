//! Criterion benchmarks of `attn_kernels::attention`: one group per case (full, causal, a full
//! additive bias, soft-capping and ALiBi both built in and as score modifications, grouped-query
//! decoding), one benchmark per kernel (the reference
//! kernel only on the first case, where it finishes in reasonable time).
//! Throughput is given as `Elements(flops)`: criterion's "elements/s" are FLOP/s, counted as
//! `2·Dk + 2·Dv` per unmasked (query, key) pair per batch and query head (`attn bench --help`).
//!
//! Run with `cargo bench -p attn-kernels --bench attention`; add `-- --test` for one quick pass.

use std::hint::black_box;
use std::time::Duration;

use attn_kernels::score_mod::{Alibi, Softcap};
use attn_kernels::{attention, Align, AttnParams, Broadcast, Kernel, KvView, MaskSpec, ScoreFn, View4};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// One benchmark shape: `q: [b, hq, lq, d]`, `k, v: [b, hkv, lk, d]`.
struct Case {
    name: &'static str,
    b: usize,
    hq: usize,
    hkv: usize,
    lq: usize,
    lk: usize,
    d: usize,
    causal: bool,
    extra: Extra,
    with_reference: bool,
}

/// Score transformations beyond the causal mask.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    None,
    /// An additive bias `[Lq, Lk]` (the form Hugging Face models pass), 0 except −∞ on the last 8 keys.
    Bias,
    /// Logit soft-capping at 50 (Gemma 2).
    Softcap,
    /// Soft-capping at 50 as a score modification ([`Softcap`]).
    SoftcapMod,
    /// ALiBi as an additive bias `[Hq, Lq, Lk]` (the form the built-in path takes).
    AlibiBias,
    /// ALiBi as a score modification ([`Alibi`]).
    AlibiMod,
}

/// A `1×8×512×64` case.
const fn small(name: &'static str, causal: bool, extra: Extra, with_reference: bool) -> Case {
    Case { name, b: 1, hq: 8, hkv: 8, lq: 512, lk: 512, d: 64, causal, extra, with_reference }
}

const CASES: [Case; 10] = [
    small("1x8x512x64_full", false, Extra::None, true),
    small("1x8x512x64_causal", true, Extra::None, false),
    small("1x8x512x64_bias_lq_lk", false, Extra::Bias, false),
    small("1x8x512x64_softcap50", false, Extra::Softcap, false),
    small("1x8x512x64_softcap50_mod", false, Extra::SoftcapMod, false),
    small("1x8x512x64_causal_alibi_bias", true, Extra::AlibiBias, false),
    small("1x8x512x64_causal_alibi_mod", true, Extra::AlibiMod, false),
    Case { name: "1x8x2048x64_causal_alibi_bias", lq: 2048, lk: 2048, ..small("", true, Extra::AlibiBias, false) },
    Case { name: "1x8x2048x64_causal_alibi_mod", lq: 2048, lk: 2048, ..small("", true, Extra::AlibiMod, false) },
    Case {
        name: "decode_hq32_hkv8_lk4096_d128",
        b: 1,
        hq: 32,
        hkv: 8,
        lq: 1,
        lk: 4096,
        d: 128,
        causal: false,
        extra: Extra::None,
        with_reference: false,
    },
];

impl Case {
    /// FLOPs of one call: `4·d` per allowed (i, j) pair, causal pairs counted top-left.
    fn flops(&self) -> u64 {
        let pairs: usize = (0..self.lq).map(|i| if self.causal { (i + 1).min(self.lk) } else { self.lk }).sum();
        (pairs * 4 * self.d * self.b * self.hq) as u64
    }
}

/// Deterministic values in `[-1, 1)` from a small linear congruential generator.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn bench_attention(c: &mut Criterion) {
    for case in &CASES {
        let q = data(case.b * case.hq * case.lq * case.d, 1);
        let k = data(case.b * case.hkv * case.lk * case.d, 2);
        let v = data(case.b * case.hkv * case.lk * case.d, 3);
        let qv = View4::contiguous("q", &q, [case.b, case.hq, case.lq, case.d]).expect("q shape");
        let kv = KvView::F32(View4::contiguous("k", &k, [case.b, case.hkv, case.lk, case.d]).expect("k shape"));
        let vv = KvView::F32(View4::contiguous("v", &v, [case.b, case.hkv, case.lk, case.d]).expect("v shape"));
        let bias: Vec<f32> =
            (0..case.lq * case.lk).map(|x| if x % case.lk >= case.lk - 8 { f32::NEG_INFINITY } else { 0.0 }).collect();
        let alibi = Alibi::new(case.hq, case.lq, case.lk, Align::TopLeft);
        let alibi_bias: Vec<f32> = (0..case.hq * case.lq * case.lk)
            .map(|x| {
                (-alibi.slopes[x / (case.lq * case.lk)] * (x / case.lk % case.lq).abs_diff(x % case.lk) as f64) as f32
            })
            .collect();
        let bias = match case.extra {
            Extra::Bias => Some(Broadcast::new("bias", &bias, &[case.lq, case.lk]).expect("bias shape")),
            Extra::AlibiBias => Some(Broadcast::new("bias", &alibi_bias, &[case.hq, case.lq, case.lk]).expect("bias")),
            _ => None,
        };
        let cap = Softcap(50.0);
        let score_mod = match case.extra {
            Extra::SoftcapMod => Some(ScoreFn { m: &cap, table: &[] }),
            Extra::AlibiMod => Some(ScoreFn { m: &alibi, table: &[] }),
            _ => None,
        };
        let params = AttnParams {
            mask: MaskSpec { causal: case.causal, bias, ..Default::default() },
            softcap: (case.extra == Extra::Softcap).then_some(50.0),
            score_mod,
            ..Default::default()
        };

        let mut group = c.benchmark_group(case.name);
        group.throughput(Throughput::Elements(case.flops()));
        group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
        let kernels =
            Kernel::ALL.into_iter().filter(|k| k.is_available() && (case.with_reference || *k != Kernel::Reference));
        for kernel in kernels {
            group.bench_function(BenchmarkId::from_parameter(kernel.name()), |bench| {
                bench.iter(|| attention(kernel, black_box(&qv), &kv, &vv, &params, false).expect("attention"))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
