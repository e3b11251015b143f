//! A linear layer's product with bfloat16 weights ([`Bf16Weights::matmul`]), stored as bfloat16
//! (`bf16/…`) or as 8-bit blocks (`int8/…`, [`Bf16Weights::pack_int8`]), on SmolLM2-135M's
//! shapes: a 512-token prefill (512 rows) and a decode step (1 row) through the attention
//! projection (576 → 576) and the feed-forward's up (576 → 1536) and down (1536 → 576)
//! projections. Throughput is counted in floating-point operations (2 per multiply-add), so
//! criterion's elements/s are FLOP/s, to compare with `attn bench --peak --compute bf16`.

use std::hint::black_box;

use attn_kernels::bf16_weights::{Bf16Weights, Packing};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i + seed) * 7919 % 2003) as f32 / 1001.0) - 1.0).collect()
}

fn bench_products(c: &mut Criterion) {
    let mut g = c.benchmark_group("bf16_weights");
    for (out, inn) in [(576, 576), (1536, 576), (576, 1536)] {
        let packings: [(&str, Packing); 2] = [("bf16", Bf16Weights::pack), ("int8", Bf16Weights::pack_int8)];
        for (storage, pack) in packings {
            let w = pack(&values(out * inn, 1), out, inn).expect("weights");
            for rows in [512, 1] {
                let x = values(rows * inn, 2);
                let mut y = vec![0.0; rows * out];
                g.throughput(Throughput::Elements((2 * rows * out * inn) as u64));
                g.bench_with_input(BenchmarkId::new(format!("{storage}/{inn}x{out}"), rows), &rows, |b, _| {
                    b.iter(|| w.matmul(black_box(&x), None, &mut y).expect("product"))
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench_products);
criterion_main!(benches);
