//! The sweep of `attn explain sparse`: at each length L, dense attention (up to `--dense-max`) and
//! three block-sparse patterns timed forward on seeded `[1, H, L, D]` inputs, each pattern's
//! block mask built once before timing (its building timed apart). Memory is what a call
//! allocates beyond its output plus the block mask's bytes. The table gives each point; the
//! log-log plots give each series its least-squares slope (`attn::chart::log_log_slope`).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use attn::alloc::human_bytes;
use attn::chart::{draw_lines, log_log_slope, LineChart, Series};
use attn::sparse::Pattern;
use attn::{sdpa_full, SdpaOptions, Window};

use super::Args;
use crate::measure::{measure, Budget, Measurement};

/// The series of the sweep.
const SERIES: [&str; 4] = ["dense", "window ±128", "strided, stride ≈ √L", "bigbird"];

/// The pattern of series `s` at length `l` (`None`: dense).
fn pattern(s: usize, l: usize) -> Option<Pattern> {
    let window = Window { left: Some(128), right: Some(128) };
    match s {
        0 => None,
        1 => Some(Pattern::Longformer { window, global: 0 }),
        2 => Some(Pattern::Strided { stride: block_stride(l) }),
        _ => Some(Pattern::BigBird { window, global: 64, random: 3, seed: 0 }),
    }
}

/// Sparse Transformer's stride for length `l`, about `√l` and a multiple of the 64-key block: a
/// stride column then falls in every `stride / 64`-th block of a row only (one of `√l` in general
/// touches most blocks: ⌈√32768⌉ = 182 lists 35% of them, 192 lists 17%).
fn block_stride(l: usize) -> usize {
    ((l as f64).sqrt() / 64.0).round().max(1.0) as usize * 64
}

/// One measured point.
struct Point {
    series: usize,
    l: usize,
    m: Measurement,
    /// Bytes of the block mask (0 for dense).
    mask_bytes: usize,
}

impl Point {
    fn ms(&self) -> f64 {
        self.m.median() * 1e3
    }
    fn mib(&self) -> f64 {
        (self.m.extra_bytes as f64 + self.mask_bytes as f64) / (1u64 << 20) as f64
    }
}

/// Runs the sweep, prints its table and slopes, and draws `sparse-time.png` and
/// `sparse-memory.png` in `dir`; returns the paths written.
pub(super) fn run(args: &Args, dir: &Path, pool: &rayon::ThreadPool) -> anyhow::Result<Vec<String>> {
    let (h, d) = (args.heads, args.dim);
    let budget = Budget { warmup: 1, iters: args.iters, seconds: 2.0 };
    println!(
        "forward time (median of up to {} calls) and memory (beyond the output, with the block mask) of \
         [1, {h}, L, {d}] self-attention, {} thread(s); dense up to L = {}",
        args.iters,
        pool.current_num_threads(),
        args.dense_max
    );
    println!(
        "  window ±128; strided, stride √L rounded to a multiple of 64; bigbird: window ±128, \
         64 global tokens, 3 random blocks per query block"
    );
    println!("{:>6} {:<22} {:>8} {:>10} {:>11} {:>12}", "L", "series", "blocks", "build ms", "forward ms", "memory");
    let mut points = Vec::new();
    for &l in &args.lengths {
        let x = |seed| attn::random::uniform(&[1, h, l, d], -1.0, 1.0, seed);
        let (q, k, v) = (x(1)?, x(2)?, x(3)?);
        for (s, name) in SERIES.iter().enumerate() {
            if s == 0 && l > args.dense_max {
                continue;
            }
            let (opts, blocks, build, mask_bytes) = match pattern(s, l) {
                None => (SdpaOptions::default(), 1.0, None, 0),
                Some(p) => {
                    let start = Instant::now();
                    let mask = pool.install(|| p.block_mask(l, l))?;
                    let build = start.elapsed().as_secs_f64();
                    let (density, bytes) = (mask.density(), mask.bytes());
                    (SdpaOptions::default().block_mask(Arc::new(mask)), density, Some(build), bytes)
                }
            };
            let m = measure(budget, || Ok(pool.install(|| sdpa_full(&q, &k, &v, &opts))?))?;
            let p = Point { series: s, l, m, mask_bytes };
            println!(
                "{l:>6} {name:<22} {blocks:>8.4} {:>10} {:>11.3} {:>12}",
                build.map_or("-".to_string(), |b| format!("{:.3}", b * 1e3)),
                p.ms(),
                human_bytes(p.m.extra_bytes as f64 + mask_bytes as f64, true)
            );
            points.push(p);
        }
    }
    let series = |value: fn(&Point) -> f64| -> Vec<Series> {
        SERIES
            .iter()
            .enumerate()
            .map(|(s, name)| {
                let pts: Vec<(f64, f64)> =
                    points.iter().filter(|p| p.series == s).map(|p| (p.l as f64, value(p))).collect();
                let slope = log_log_slope(&pts).map_or("-".to_string(), |k| format!("{k:.2}"));
                Series { name: format!("{name} (slope {slope})"), points: pts }
            })
            .collect()
    };
    let (time, mut memory) = (series(Point::ms), series(Point::mib));
    println!("fitted slopes of log time over log L: {}", names(&time));
    println!("fitted slopes of log memory over log L: {}", names(&memory));
    let lengths = args.lengths.iter().map(|&l| (l as f64, (l * l) as f64 / (1u64 << 20) as f64));
    memory.push(Series { name: "a dense [L, L] bool mask, L² bytes".into(), points: lengths.collect() });
    let chart = |title: String, y: &str, series| LineChart {
        title,
        x_label: "length L".into(),
        y_label: y.into(),
        log_x: true,
        log_y: true,
        series,
    };
    let time_path = dir.join("sparse-time.png");
    draw_lines(&time_path, &chart(format!("forward time, [1, {h}, L, {d}]"), "milliseconds", time))?;
    let memory_path = dir.join("sparse-memory.png");
    draw_lines(&memory_path, &chart("memory beyond the output, with the mask".into(), "MiB", memory))?;
    Ok(vec![time_path.display().to_string(), memory_path.display().to_string()])
}

/// The series' names (with their slopes), comma-separated.
fn names(series: &[Series]) -> String {
    series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
}
