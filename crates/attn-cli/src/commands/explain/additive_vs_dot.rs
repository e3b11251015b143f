//! `attn explain additive-vs-dot`: the forward time and the memory (allocated beyond the outputs)
//! of additive attention (`attn_nn::AdditiveAttention`, hidden width = D) and of scaled
//! dot-product attention (`attn::sdpa`, the fused kernel) on the same seeded `[B, L, D]` queries,
//! keys and values, for each length L. Additive attention materialises `[B, L, L, D]` features, so
//! its time and memory grow with `L²·D`; the fused kernel's memory does not grow with `L²`.

use anyhow::bail;
use attn::chart::{draw_lines, LineChart, Series};
use attn::SdpaOptions;
use attn_nn::{AdditiveAttention, AdditiveAttentionConfig, AdditiveOutput, AttnMasks, Mode};

use crate::commands::out_dir::OutDir;
use crate::measure::{measure, Budget, Held, Measurement};

/// Arguments of `attn explain additive-vs-dot`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sequence lengths (queries and keys), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128,256,512")]
    pub lengths: Vec<usize>,
    /// Batch size B.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Width D of queries, keys, values and of additive attention's hidden features.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Most timed calls per length and method.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    #[command(flatten)]
    pub out: OutDir,
}

impl Held for AdditiveOutput {
    fn held_bytes(&self) -> usize {
        self.out.held_bytes() + self.weights.held_bytes()
    }
}

/// Additive features of this many bytes or more are refused rather than attempted.
const MAX_FEATURE_BYTES: usize = 8 << 30;

pub fn main(args: Args) -> anyhow::Result<()> {
    let (b, d) = (args.batch, args.dim);
    if args.lengths.is_empty() || args.lengths.contains(&0) || b == 0 || d == 0 || args.iters == 0 {
        bail!("--lengths, --batch, --dim and --iters must all be positive");
    }
    for &l in &args.lengths {
        let bytes = b.saturating_mul(l).saturating_mul(l).saturating_mul(d).saturating_mul(4);
        if bytes >= MAX_FEATURE_BYTES {
            bail!(
                "--lengths {l}: additive attention would hold {:.1} GiB of [B, L, L, D] features (limit 8 GiB)",
                bytes as f64 / (1u64 << 30) as f64
            );
        }
    }
    let dir = args.out.prepare()?;
    let map = candle_nn::VarMap::new();
    let additive = AdditiveAttention::new(AdditiveAttentionConfig::new(d, d, d), attn_nn::init::seeded(&map, 0))?;
    let budget = Budget { warmup: 1, iters: args.iters, seconds: 2.0 };
    println!("B = {b}, D = {d}; forward time (median of up to {} calls) and memory beyond the outputs", args.iters);
    println!(
        "{:>6} {:>13} {:>13} {:>8} {:>15} {:>15}",
        "L", "additive ms", "dot ms", "ratio", "additive MiB", "dot MiB"
    );
    let mut rows: Vec<(usize, Measurement, Measurement)> = Vec::new();
    for &l in &args.lengths {
        let x = |seed| attn::random::uniform(&[b, l, d], -1.0, 1.0, seed);
        let (q, k, v) = (x(1)?, x(2)?, x(3)?);
        let add = measure(budget, || Ok(additive.forward(&q, &k, &v, &AttnMasks::default(), Mode::Eval)?))?;
        let dot = measure(budget, || Ok(attn::sdpa(&q, &k, &v, &SdpaOptions::default())?))?;
        let mib = |m: &Measurement| m.extra_bytes as f64 / (1u64 << 20) as f64;
        println!(
            "{l:>6} {:>13.3} {:>13.3} {:>8.1} {:>15.2} {:>15.2}",
            add.median() * 1e3,
            dot.median() * 1e3,
            add.median() / dot.median(),
            mib(&add),
            mib(&dot)
        );
        rows.push((l, add, dot));
    }
    let series = |name: &str, f: &dyn Fn(&(usize, Measurement, Measurement)) -> f64| Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.0 as f64, f(r))).collect(),
    };
    let chart = |title: &str, y: &str, a: Series, s: Series| LineChart {
        title: title.into(),
        x_label: "length L".into(),
        y_label: y.into(),
        log_x: true,
        log_y: true,
        series: vec![a, s],
    };
    let time = dir.join("additive-vs-dot-time.png");
    draw_lines(
        &time,
        &chart(
            &format!("forward time, B = {b}, D = {d}"),
            "milliseconds",
            series("additive", &|r| r.1.median() * 1e3),
            series("scaled dot-product", &|r| r.2.median() * 1e3),
        ),
    )?;
    let memory = dir.join("additive-vs-dot-memory.png");
    let mib = |m: &Measurement| (m.extra_bytes as f64 / (1u64 << 20) as f64).max(1e-3);
    draw_lines(
        &memory,
        &chart(
            "memory beyond the outputs",
            "MiB",
            series("additive", &|r| mib(&r.1)),
            series("scaled dot-product", &|r| mib(&r.2)),
        ),
    )?;
    println!("wrote {} and {}", time.display(), memory.display());
    Ok(())
}
