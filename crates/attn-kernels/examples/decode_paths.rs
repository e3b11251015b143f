//! Times one decode-shaped call (`Hq/Hkv · Lq ≤ 16` stacked query rows per key/value head) three
//! ways on bf16 keys and values: the decode path (keys read in place, f32 products: what such a
//! call runs), and the prefill path forced (`Tuning::path`) with f32 and with bf16 products — the
//! measurement behind the decode path computing in f32 whatever `Precision` asks (README, "bf16
//! products"). The three are alternated round by round; medians and minima of all rounds' calls.
//!
//! `cargo run --release -p attn-kernels --example decode_paths -- HQ HKV LQ LK D ROUNDS THREADS`,
//! e.g. `-- 32 8 1 32768 128 3 2`.

use std::time::Instant;

use attn_kernels::{attention_tuned, AttnParams, Kernel, KvView, Path, Precision, Tuning, View4};
use half::bf16;

/// `n` values uniform in `[-1, 1)` rounded to bf16, from a fixed linear congruential sequence.
fn values(n: usize, seed: u64) -> Vec<bf16> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bf16::from_f32((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a whole number")).collect();
    let [hq, hkv, lq, lk, d, rounds, threads] = args[..] else {
        panic!("usage: decode_paths HQ HKV LQ LK D ROUNDS THREADS");
    };
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().expect("a thread pool");
    let q: Vec<f32> = values(hq * lq * d, 1).iter().map(|x| x.to_f32()).collect();
    let (k, v) = (values(hkv * lk * d, 2), values(hkv * lk * d, 3));
    let q = View4::contiguous("q", &q, [1, hq, lq, d]).expect("q");
    let k = KvView::Bf16(View4::contiguous("k", &k, [1, hkv, lk, d]).expect("k"));
    let v = KvView::Bf16(View4::contiguous("v", &v, [1, hkv, lk, d]).expect("v"));
    let ways = [
        ("decode, f32 products", Path::Decode, Precision::F32),
        ("prefill, f32 products", Path::Prefill, Precision::F32),
        ("prefill, bf16 products", Path::Prefill, Precision::Bf16),
    ];
    let flops = 4.0 * (hq * lq * lk * d) as f64;
    let calls = (2e8 / flops).clamp(3.0, 200.0) as usize;
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    for _ in 0..rounds {
        for (times, &(_, path, compute)) in ms.iter_mut().zip(&ways) {
            let params = AttnParams { compute, ..Default::default() };
            let tuning = Tuning { path: Some(path), shards: None, ..Tuning::DEFAULT };
            let call = || attention_tuned(Kernel::Auto, tuning, &q, &k, &v, &params, false).expect("the call");
            call();
            for _ in 0..calls {
                let t = Instant::now();
                std::hint::black_box(call());
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    println!("Hq {hq}, Hkv {hkv}, Lq {lq}, Lk {lk}, D {d}, {threads} threads, {rounds} rounds of {calls} calls");
    for (times, (name, _, _)) in ms.iter_mut().zip(&ways) {
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let gflops = flops / median / 1e6;
        println!("{name:24} median {median:9.3} ms  min {:9.3} ms  {gflops:6.1} GFLOP/s (median)", times[0]);
    }
}
