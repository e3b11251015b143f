//! `attn bench --delta-rule gated|kda`: times the gated delta rule (`attn_kernels::delta`, called
//! directly on seeded `f32` inputs, like `--linear`) forward, or forward plus backward with
//! `--backward`, on `--shape B,H,T,D` read as `H` value heads of `Dk = D` (`--kv-heads`: the key
//! heads, `--dv`: `Dv`), `q` and `k` L2-normalised inside the rule as the models call it; reports
//! GFLOP/s by [`DELTA_FLOP_RULE`] and, with `--peak`, the share of the FMA peak.

use attn::random::SplitMix64;
use attn_kernels::delta::{
    delta_rule, delta_rule_backward, DeltaDims, DeltaGrads, DeltaInputs, DeltaOutput, DeltaParams, Gate, CHUNK,
};
use attn_kernels::Dims;
use serde_json::json;

use anyhow::Context;

use super::spec::shape_text;
use super::Args;
use crate::commands::run::DeltaRule;
use crate::measure::{self, Budget, Held, Measurement};

/// How the delta rule's FLOPs are counted.
pub const DELTA_FLOP_RULE: &str = "delta rule FLOPs, 2 per multiply-add, per value head and chunk of n ≤ 64 \
tokens (both gates: kda's factorised products have the same shapes): forward 6·n·Dk·Dv (K·S₀, Q·S₀, Kᵀ·U) + \
2·n²·(Dk + Dv) (the lower halves of K·Kᵀ, Q·Kᵀ, (I + A)⁻¹·Y, P·U) + n³/3 (the triangular inverse); backward the \
forward again (for the chunks' states) plus 14·n·Dk·Dv + 4·n²·(Dk + Dv) (its 15 products)";

/// FLOPs of one call by [`DELTA_FLOP_RULE`].
pub fn flops(d: &DeltaDims, backward: bool) -> u64 {
    let (dk, dv) = (d.dk as u64, d.dv as u64);
    let chunks = (0..d.t).step_by(CHUNK).map(|t0| CHUNK.min(d.t - t0) as u64);
    let fwd = |n: u64| 6 * n * dk * dv + 2 * n * n * (dk + dv) + n * n * n / 3;
    // The backward makes the forward again, then its own 15 products.
    let bwd = |n: u64| fwd(n) + 14 * n * dk * dv + 4 * n * n * (dk + dv);
    let per_head: u64 = chunks.map(|n| fwd(n) + if backward { bwd(n) } else { 0 }).sum();
    (d.b * d.hv) as u64 * per_head
}

/// Seeded inputs of one shape: `q`, `k`, `v`, `g`, `beta` and the output's gradient.
struct Data {
    d: DeltaDims,
    x: [Vec<f32>; 6],
    p: DeltaParams,
}

/// What one timed call returns.
struct Step {
    out: DeltaOutput<f32>,
    grads: Option<DeltaGrads<f32>>,
}

impl Held for Step {
    fn held_bytes(&self) -> usize {
        let g = self
            .grads
            .as_ref()
            .map_or(0, |g| [&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dinitial_state].iter().map(|x| x.len()).sum());
        (self.out.out.len() + self.out.final_state.len() + g) * std::mem::size_of::<f32>()
    }
}

impl Data {
    fn new(d: DeltaDims, gate: Gate, seed: u64) -> Self {
        let mut r = SplitMix64::new(seed);
        let x = [
            r.uniform(d.qk_len(), -1.0, 1.0),
            r.uniform(d.qk_len(), -1.0, 1.0),
            r.uniform(d.v_len(), -1.0, 1.0),
            r.uniform(d.g_len(gate), -0.2, -0.01),
            r.uniform(d.beta_len(), 0.1, 0.9),
            r.uniform(d.v_len(), -1.0, 1.0),
        ];
        Self { d, x, p: DeltaParams { l2norm_qk: true, gate, ..DeltaParams::default() } }
    }

    fn step(&self, backward: bool) -> anyhow::Result<Step> {
        let [q, k, v, g, beta, dout] = &self.x;
        let x = DeltaInputs { q, k, v, g, beta, initial_state: None, cu_seqlens: None };
        let out = delta_rule(&self.d, &x, &self.p)?;
        let grads = if backward { Some(delta_rule_backward(&self.d, &x, &self.p, dout, None)?) } else { None };
        Ok(Step { out, grads })
    }
}

/// The delta rule's sizes of a bench shape: `hq` value heads, `hkv` key heads.
fn delta_dims(d: &Dims) -> DeltaDims {
    DeltaDims { b: d.b, t: d.lq, hk: d.hkv, hv: d.hq, dk: d.dk, dv: d.dv }
}

/// `attn bench --delta-rule`: each shape timed and printed (after the FLOP rule and the header).
pub fn main(
    args: &Args,
    rule: DeltaRule,
    cases: Vec<Dims>,
    pool: &rayon::ThreadPool,
    peak: Option<f64>,
) -> anyhow::Result<()> {
    if !args.json {
        println!("{DELTA_FLOP_RULE}\n{}", header());
    }
    let gate = rule.gate();
    for d in cases {
        let dd = delta_dims(&d);
        let data = Data::new(dd, gate, args.data_seed);
        let budget = Budget { warmup: args.warmup, iters: args.iters, seconds: args.budget };
        let m = measure::measure(budget, || pool.install(|| data.step(args.backward)))
            .with_context(|| format!("--shape {}", shape_text(&d)))?;
        println!("{}", row(args, rule, &d, &m, flops(&dd, args.backward), peak));
    }
    Ok(())
}

/// One line of the table, or a JSON object with `--json`.
fn row(args: &Args, rule: DeltaRule, d: &Dims, m: &Measurement, flops: u64, peak: Option<f64>) -> String {
    let gflops = flops as f64 / m.median() / 1e9;
    let pct = peak.map(|p| 100.0 * gflops / p);
    let pass = if args.backward { "fwd+bwd" } else { "forward" };
    let threads = args.threads.get();
    if args.json {
        let v = json!({"shape": shape_text(d), "key_heads": d.hkv, "dv": d.dv, "delta_rule": rule.flag(),
            "backward": args.backward, "threads": threads, "median_s": m.median(), "min_s": m.min(), "max_s": m.max(),
            "flops": flops, "gflops": gflops, "pct_of_peak": pct, "extra_bytes": m.extra_bytes, "iters": m.times.len()});
        return v.to_string();
    }
    format!(
        "{:<18} {:>4} {:>4} {:<6} {:<8} {:>3} {:>11.4} {:>11.4} {:>11.4} {:>9.2} {:>6} {:>10} {:>5}",
        shape_text(d),
        d.hkv,
        d.dv,
        rule.flag(),
        pass,
        threads,
        m.median() * 1e3,
        m.min() * 1e3,
        m.max() * 1e3,
        gflops,
        pct.map_or("-".into(), |p| format!("{p:.1}")),
        attn::alloc::human_bytes(m.extra_bytes as f64, true),
        m.times.len()
    )
}

/// The table's header.
fn header() -> String {
    format!(
        "{:<18} {:>4} {:>4} {:<6} {:<8} {:>3} {:>11} {:>11} {:>11} {:>9} {:>6} {:>10} {:>5}",
        "shape B,Hv,T,Dk",
        "Hk",
        "Dv",
        "rule",
        "pass",
        "thr",
        "median ms",
        "min ms",
        "max ms",
        "GFLOP/s",
        "%peak",
        "memory",
        "iters"
    )
}
