//! Decoding from a paged cache: 16 sequences with contexts drawn uniformly from 1K–8K tokens,
//! GQA 32/8, D 128, pages of 16 — the dense call (the flash kernel on a `[B, Hkv, 8K, D]` cache
//! with per-sequence key lengths) against the paged kernel on f32, bf16, q8_0 and fp8 pages, each
//! with the bytes of keys and values it reads as throughput (so criterion prints GiB/s); and a
//! streaming read of 1 GiB, the machine's memory bandwidth to compare them with. Cascade
//! attention against the flat paged call on a batch sharing a long prefix.

use std::hint::black_box;
use std::time::Duration;

use attn_kernels::paged::{
    cascade_attention, fp8_encode, paged_attention, q8_encode, PagedKv, PagedParams, Pages, FP8_MAX, Q8_BLOCK,
};
use attn_kernels::{attention, AttnParams, Isa, Kernel, KvView, MaskSpec, View4};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};

const B: usize = 16;
const HQ: usize = 32;
const HKV: usize = 8;
const D: usize = 128;
const PAGE: usize = 16;
const MAX: usize = 8192;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn bench_paged(c: &mut Criterion) {
    let lens: Vec<usize> = values(B, 7).iter().map(|u| 1024 + ((u + 1.0) / 2.0 * 7168.0) as usize).collect();
    let tokens: usize = lens.iter().sum();
    let pages_of: Vec<usize> = lens.iter().map(|n| n.div_ceil(PAGE)).collect();
    let np: usize = pages_of.iter().sum();
    let max_pages = MAX / PAGE;
    // Each sequence's pages interleaved with the others' (page p of sequence s at p·B + s where it
    // exists), as pages handed out to sequences decoding side by side end up.
    let mut table = vec![0i32; B * max_pages];
    let mut next = 0;
    for p in 0..max_pages {
        for s in 0..B {
            if p < pages_of[s] {
                table[s * max_pages + p] = next;
                next += 1;
            }
        }
    }
    let row = HKV * D;
    let kf = values(np * PAGE * row, 1);
    let vf = values(np * PAGE * row, 2);
    let q = values(B * HQ * D, 3);
    let seqlens: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
    let qv = View4::contiguous("q", &q, [B, HQ, 1, D]).expect("q");

    // The dense cache `[B, Hkv, MAX, D]` holding the same positions.
    let (mut kd, mut vd) = (vec![0.0f32; B * HKV * MAX * D], vec![0.0f32; B * HKV * MAX * D]);
    for s in 0..B {
        for j in 0..lens[s] {
            let page = table[s * max_pages + j / PAGE] as usize;
            for h in 0..HKV {
                let src = ((page * PAGE + j % PAGE) * HKV + h) * D;
                let dst = ((s * HKV + h) * MAX + j) * D;
                kd[dst..dst + D].copy_from_slice(&kf[src..src + D]);
                vd[dst..dst + D].copy_from_slice(&vf[src..src + D]);
            }
        }
    }
    let bf = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
    let q8 = |x: &[f32]| {
        let (mut q, mut s) = (vec![0i8; x.len()], vec![f16::ZERO; x.len() / Q8_BLOCK]);
        q8_encode(x, &mut q, &mut s);
        (q, s)
    };
    let fp8 = |x: &[f32]| x.iter().map(|&v| fp8_encode(v * FP8_MAX)).collect::<Vec<_>>();
    let (kb, vb) = (bf(&kf), bf(&vf));
    let ((kq, ks), (vq, vs)) = (q8(&kf), q8(&vf));
    let (k8, v8) = (fp8(&kf), fp8(&vf));
    let fp8_scales = [1.0 / FP8_MAX; HKV];
    let storages: Vec<(&str, Pages, Pages, usize)> = vec![
        ("paged_f32", Pages::F32(&kf), Pages::F32(&vf), 4 * D),
        ("paged_bf16", Pages::Bf16(&kb), Pages::Bf16(&vb), 2 * D),
        ("paged_int8", Pages::Q8 { values: &kq, scales: &ks }, Pages::Q8 { values: &vq, scales: &vs }, D + D / 16),
        (
            "paged_fp8",
            Pages::Fp8 { values: &k8, scales: &fp8_scales },
            Pages::Fp8 { values: &v8, scales: &fp8_scales },
            D,
        ),
    ];

    let mut group = c.benchmark_group("decode_b16_ctx1k-8k_hq32_hkv8_d128");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let read = |bytes_per_row: usize| (2 * tokens * HKV * bytes_per_row) as u64;
    group.throughput(Throughput::Bytes(read(4 * D)));
    let key_lengths: Vec<usize> = lens.clone();
    let params =
        AttnParams { mask: MaskSpec { key_lengths: Some(&key_lengths), ..Default::default() }, ..Default::default() };
    let kdv = KvView::F32(View4::contiguous("k", &kd, [B, HKV, MAX, D]).expect("k"));
    let vdv = KvView::F32(View4::contiguous("v", &vd, [B, HKV, MAX, D]).expect("v"));
    group.bench_function(BenchmarkId::from_parameter("dense_f32"), |bench| {
        bench.iter(|| attention(Kernel::Flash(Isa::best()), black_box(&qv), &kdv, &vdv, &params, false).expect("dense"))
    });
    let (mut out, mut lse) = (vec![0.0f32; B * HQ * D], vec![0.0f32; B * HQ]);
    for (name, k, v, bytes) in storages {
        let kv = PagedKv { k, v, page_size: PAGE, heads: HKV, dk: D, dv: D, block_table: &table, seqlens: &seqlens };
        group.throughput(Throughput::Bytes(read(bytes)));
        group.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| {
                paged_attention(black_box(&qv), &kv, &PagedParams::default(), &mut out, &mut lse).expect("paged")
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("memory");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let big = values(1 << 28, 5);
    group.throughput(Throughput::Bytes((big.len() * 4) as u64));
    group.bench_function(BenchmarkId::from_parameter("stream_read_1GiB"), |bench| {
        bench.iter(|| {
            use rayon::prelude::*;
            black_box(&big).par_chunks(1 << 16).map(sum16).sum::<f32>()
        })
    });
    group.finish();
}

/// Cascade attention: 32 sequences sharing a 4K-token prefix, each with 256 tokens of its own,
/// decoding one token (GQA 32/8, D 128, f32 pages of 16): the flat paged call (every sequence
/// reads the prefix) against the cascade (the prefix read once for all 32).
fn bench_cascade(c: &mut Criterion) {
    const SEQS: usize = 32;
    const PREFIX: usize = 4096;
    const OWN: usize = 256;
    let (np_prefix, np_own) = (PREFIX / PAGE, OWN / PAGE);
    let np = np_prefix + SEQS * np_own;
    let row = HKV * D;
    let (k, v) = (values(np * PAGE * row, 11), values(np * PAGE * row, 12));
    let q = values(SEQS * HQ * D, 13);
    let qv = View4::contiguous("q", &q, [SEQS, HQ, 1, D]).expect("q");
    let own_pages = |s: usize| (0..np_own).map(move |p| (np_prefix + p * SEQS + s) as i32);
    let flat: Vec<i32> = (0..SEQS).flat_map(|s| (0..np_prefix as i32).chain(own_pages(s))).collect();
    let suffix: Vec<i32> = (0..SEQS).flat_map(own_pages).collect();
    let prefix: Vec<i32> = (0..np_prefix as i32).collect();
    let (flat_lens, own_lens, prefix_len) =
        (vec![(PREFIX + OWN) as i32; SEQS], vec![OWN as i32; SEQS], [PREFIX as i32]);
    let flat_kv = PagedKv {
        k: Pages::F32(&k),
        v: Pages::F32(&v),
        page_size: PAGE,
        heads: HKV,
        dk: D,
        dv: D,
        block_table: &flat,
        seqlens: &flat_lens,
    };
    let prefix_kv = PagedKv { block_table: &prefix, seqlens: &prefix_len, ..flat_kv };
    let suffix_kv = PagedKv { block_table: &suffix, seqlens: &own_lens, ..flat_kv };
    let p = PagedParams { causal: true, ..Default::default() };
    let (mut out, mut lse) = (vec![0.0f32; SEQS * HQ * D], vec![0.0f32; SEQS * HQ]);
    let mut group = c.benchmark_group("cascade_b32_prefix4k_own256_hq32_hkv8_d128");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function(BenchmarkId::from_parameter("flat_paged"), |bench| {
        bench.iter(|| paged_attention(black_box(&qv), &flat_kv, &p, &mut out, &mut lse).expect("flat"))
    });
    group.bench_function(BenchmarkId::from_parameter("cascade"), |bench| {
        bench.iter(|| {
            cascade_attention(black_box(&qv), &prefix_kv, &suffix_kv, &p, &mut out, &mut lse).expect("cascade")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_paged, bench_cascade);
criterion_main!(benches);

/// The sum of `x` in 16 independent lanes (so the loop vectorises and is bound by the reads).
fn sum16(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for c in x.chunks_exact(16) {
        for (a, &b) in acc.iter_mut().zip(c) {
            *a += b;
        }
    }
    acc.iter().sum()
}
