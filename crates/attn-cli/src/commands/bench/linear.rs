//! `attn bench --linear MAP`: times linear attention (`attn_kernels::linear`, called directly on
//! seeded `f32` inputs, like `--backward`) forward, or forward plus backward with `--backward`,
//! non-causal or causal (chunked form), and reports GFLOP/s by [`LINEAR_FLOP_RULE`] and, with
//! `--peak`, the share of the FMA peak. Each call allocates fresh outputs, or with
//! `--reuse-outputs` writes into buffers allocated once before the timed loop.

use attn::linear::{FavorFeatures, FeatureMap, LinearOptions};
use attn::random::SplitMix64;
use attn_kernels::linear::{
    linear_attention, linear_attention_backward, linear_attention_backward_into, linear_attention_into, GradsMut,
};
use attn_kernels::{AttnGrads, Dims, View4};
use serde_json::json;

use anyhow::Context;

use super::spec::shape_text;
use super::Args;
use crate::measure::{self, Budget, Held, Measurement};

/// How linear attention's FLOPs are counted: the useful work of the chunked algorithm, so the
/// masked upper half of each chunk's products and the backward's second pass (which makes a chunk's
/// masked products again rather than keep them) are not counted.
pub const LINEAR_FLOP_RULE: &str = "linear FLOPs: the useful matrix products of the chunked algorithm, 2 per \
multiply-add, per (batch, query head) with F features (D, or --features for favor): non-causal forward \
2·Lk·F·Dv + 2·Lq·F·Dv; causal forward per chunk of n rows n·(n+1)·(F + Dv) + 4·n·F·Dv (each chunk's products \
over its lower triangle and diagonal only); backward non-causal 2·(Lk + 3·Lq)·F·Dv + 2·Lk·F·Dv, causal per \
chunk n·(n+1)·(3F + 2Dv) + 10·n·F·Dv (the masked products once, not their remaking in the second pass); \
favor adds 2·(Lq + Lk)·D·F for the features (twice that with the backward)";

/// The feature maps `attn bench --linear` times.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchMap {
    /// `elu(x) + 1`.
    Elu,
    /// `max(x, 0)`.
    Relu,
    /// `x`.
    Identity,
    /// FAVOR+ with `--features` random features.
    Favor,
}

/// The options of one shape.
fn options(args: &Args, map: BenchMap, d: usize) -> anyhow::Result<LinearOptions> {
    let map = match map {
        BenchMap::Elu => FeatureMap::Elu,
        BenchMap::Relu => FeatureMap::Relu,
        BenchMap::Identity => FeatureMap::Identity,
        BenchMap::Favor => FeatureMap::Favor(FavorFeatures::new(d, args.features, args.data_seed)?),
    };
    Ok(LinearOptions::new(map).causal(args.sdpa.causal).chunk(args.chunk).segments(args.segments))
}

/// FLOPs of one call by [`LINEAR_FLOP_RULE`].
pub fn flops(d: &Dims, opts: &LinearOptions, backward: bool) -> u64 {
    let f = opts.map.features(d.dk) as u64;
    let (lq, lk, dv, dk) = (d.lq as u64, d.lk as u64, d.dv as u64, d.dk as u64);
    let per_head = if opts.causal {
        let c = opts.chunk.max(1);
        let chunks = (0..lq).step_by(c).map(|t| (c as u64).min(lq - t));
        let fwd: u64 = chunks.clone().map(|n| n * (n + 1) * (f + dv) + 4 * n * f * dv).sum();
        let bwd: u64 = chunks.map(|n| n * (n + 1) * (3 * f + 2 * dv) + 10 * n * f * dv).sum();
        fwd + if backward { bwd } else { 0 }
    } else {
        let fwd = 2 * lk * f * dv + 2 * lq * f * dv;
        fwd + if backward { 2 * (lk + 3 * lq) * f * dv + 2 * lk * f * dv } else { 0 }
    };
    let favor = if matches!(opts.map, FeatureMap::Favor(_)) { 2 * (lq + lk) * dk * f } else { 0 };
    (d.b * d.hq) as u64 * (per_head + favor * if backward { 2 } else { 1 })
}

/// Seeded inputs of one shape and the output gradient.
struct Data {
    d: Dims,
    x: [Vec<f32>; 4],
}

/// What one timed call returns: its fresh outputs, or nothing when it wrote into [`Buffers`].
struct Step {
    out: Vec<f32>,
    grads: Option<AttnGrads<f32>>,
}

impl Held for Step {
    fn held_bytes(&self) -> usize {
        let g = self.grads.as_ref().map_or(0, |g| g.dq.len() + g.dk.len() + g.dv.len());
        (self.out.len() + g) * std::mem::size_of::<f32>()
    }
}

/// The outputs and gradients `--reuse-outputs` allocates once, as `[out, dq, dk, dv]`.
struct Buffers([Vec<f32>; 4]);

impl Data {
    fn new(d: Dims, seed: u64) -> Self {
        let mut g = SplitMix64::new(seed);
        let shapes =
            [d.b * d.hq * d.lq * d.dk, d.b * d.hkv * d.lk * d.dk, d.b * d.hkv * d.lk * d.dv, d.b * d.hq * d.lq * d.dv];
        Self { d, x: shapes.map(|n| g.uniform(n, -1.0, 1.0)) }
    }

    /// `[q, k, v, grad_out]`'s shapes.
    fn dims(&self) -> [[usize; 4]; 4] {
        let d = &self.d;
        [[d.b, d.hq, d.lq, d.dk], [d.b, d.hkv, d.lk, d.dk], [d.b, d.hkv, d.lk, d.dv], [d.b, d.hq, d.lq, d.dv]]
    }

    /// `[q, k, v, grad_out]` as views.
    fn views(&self) -> anyhow::Result<[View4<'_, f32>; 4]> {
        let dims = self.dims();
        let [q, k, v, g] = [0, 1, 2, 3].map(|i| View4::contiguous("x", &self.x[i], dims[i]));
        Ok([q?, k?, v?, g?])
    }

    /// Zeroed buffers for [`step_into`](Self::step_into): the output and, with `backward`, the
    /// gradients.
    fn buffers(&self, backward: bool) -> Buffers {
        let [sq, sk, sv, so] = self.dims().map(|s| s.iter().product::<usize>());
        let grads = |n: usize| vec![0.0; if backward { n } else { 0 }];
        Buffers([vec![0.0; so], grads(sq), grads(sk), grads(sv)])
    }

    /// One call with fresh outputs.
    fn step(&self, opts: &LinearOptions, backward: bool) -> anyhow::Result<Step> {
        let [q, k, v, g] = self.views()?;
        let out = linear_attention(q, k, v, &opts.params())?;
        let grads = if backward {
            let o = View4::contiguous("out", &out, self.dims()[3])?;
            Some(linear_attention_backward(q, k, v, o, g, &opts.params())?)
        } else {
            None
        };
        Ok(Step { out, grads })
    }

    /// One call writing into `bufs`.
    fn step_into(&self, opts: &LinearOptions, backward: bool, bufs: &mut Buffers) -> anyhow::Result<Step> {
        let [q, k, v, g] = self.views()?;
        let [out, dq, dk, dv] = &mut bufs.0;
        linear_attention_into(q, k, v, &opts.params(), out)?;
        if backward {
            let o = View4::contiguous("out", out, self.dims()[3])?;
            linear_attention_backward_into(q, k, v, o, g, &opts.params(), GradsMut { dq, dk, dv })?;
        }
        Ok(Step { out: Vec::new(), grads: None })
    }
}

/// `attn bench --linear`: each shape timed and printed (after the FLOP rule and the header).
pub fn main(
    args: &Args,
    map: BenchMap,
    cases: Vec<Dims>,
    pool: &rayon::ThreadPool,
    peak: Option<f64>,
) -> anyhow::Result<()> {
    if !args.json {
        println!("{LINEAR_FLOP_RULE}\n{}", header());
    }
    for d in cases {
        let (m, flops) = measure_case(args, map, pool, d).with_context(|| format!("--shape {}", shape_text(&d)))?;
        println!("{}", row(args, map, args.threads.get(), &d, &m, flops, peak));
    }
    Ok(())
}

/// Times one shape; returns the measurement and the FLOPs of a call.
pub fn measure_case(
    args: &Args,
    map: BenchMap,
    pool: &rayon::ThreadPool,
    d: Dims,
) -> anyhow::Result<(Measurement, u64)> {
    let opts = options(args, map, d.dk)?;
    let data = Data::new(d, args.data_seed);
    let budget = Budget { warmup: args.warmup, iters: args.iters, seconds: args.budget };
    let m = if args.reuse_outputs {
        let mut bufs = data.buffers(args.backward);
        measure::measure(budget, || pool.install(|| data.step_into(&opts, args.backward, &mut bufs)))?
    } else {
        measure::measure(budget, || pool.install(|| data.step(&opts, args.backward)))?
    };
    Ok((m, flops(&d, &opts, args.backward)))
}

/// One line of the table, or a JSON object with `--json`.
pub fn row(
    args: &Args,
    map: BenchMap,
    threads: usize,
    d: &Dims,
    m: &Measurement,
    flops: u64,
    peak: Option<f64>,
) -> String {
    let gflops = flops as f64 / m.median() / 1e9;
    let features = if map == BenchMap::Favor { args.features } else { d.dk };
    let pct = peak.map(|p| 100.0 * gflops / p);
    if args.json {
        let v = json!({"shape": shape_text(d), "kv_len": d.lk, "kv_heads": d.hkv, "dv": d.dv,
            "linear": format!("{map:?}").to_lowercase(), "features": features, "causal": args.sdpa.causal,
            "backward": args.backward, "outputs": outputs(args), "threads": threads, "median_s": m.median(), "min_s": m.min(), "max_s": m.max(),
            "flops": flops, "gflops": gflops, "pct_of_peak": pct, "iters": m.times.len()});
        return v.to_string();
    }
    format!(
        "{:<16} {:>7} {:>4} {:>4} {:<9} {:>5} {:<6} {:<7} {:>3} {:>11.4} {:>11.4} {:>11.4} {:>9.2} {:>6} {:>5}",
        shape_text(d),
        d.lk,
        d.hkv,
        d.dv,
        format!("{map:?}").to_lowercase(),
        features,
        if args.sdpa.causal { "causal" } else { "full" },
        outputs(args),
        threads,
        m.median() * 1e3,
        m.min() * 1e3,
        m.max() * 1e3,
        gflops,
        pct.map_or("-".into(), |p| format!("{p:.1}")),
        m.times.len()
    )
}

/// Which outputs the timed calls wrote: `fresh` (allocated by each call) or `reused`
/// (`--reuse-outputs`).
fn outputs(args: &Args) -> &'static str {
    if args.reuse_outputs {
        "reused"
    } else {
        "fresh"
    }
}

/// The table's header.
pub fn header() -> String {
    format!(
        "{:<16} {:>7} {:>4} {:>4} {:<9} {:>5} {:<6} {:<7} {:>3} {:>11} {:>11} {:>11} {:>9} {:>6} {:>5}",
        "shape B,H,Lq,D",
        "Lk",
        "Hkv",
        "Dv",
        "linear",
        "F",
        "mask",
        "outputs",
        "thr",
        "median ms",
        "min ms",
        "max ms",
        "GFLOP/s",
        "%peak",
        "iters"
    )
}
