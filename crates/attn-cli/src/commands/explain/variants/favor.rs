//! FAVOR+'s approximation error in `attn explain variants`: non-causal attention on seeded
//! `[1, H, --favor-len, D]` inputs, exact softmax attention (`softmax(q·kᵀ/√D)·v`) against linear
//! attention with FAVOR+ on `q` and `k` scaled by `D^(-1/4)` each (so `φ(q)·φ(k)` estimates
//! `exp(q·k/√D)`), with 16, 32, ... features, three projection seeds each. The error is the
//! relative Frobenius norm `‖approx − exact‖ / ‖exact‖`; Monte Carlo estimates shrink as
//! `m^(-1/2)`, so the fitted log-log slope should be near −0.5.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use attn::chart::{draw_lines, log_log_slope, LineChart, Series};
use attn::{LinearOptions, SdpaOptions};
use candle_core::Tensor;
use indicatif::ProgressBar;

use super::Args;

/// Projection seeds per feature count.
const SEEDS: u64 = 3;

/// The feature counts: 16, 32, ... up to `max`.
pub(super) fn features(max: usize) -> Vec<usize> {
    std::iter::successors(Some(16), |&m| Some(m * 2)).take_while(|&m| m <= max).collect()
}

/// The errors of one feature count over the seeds.
pub(super) struct ErrorPoint {
    m: usize,
    errors: Vec<f64>,
}

impl ErrorPoint {
    fn mean(&self) -> f64 {
        self.errors.iter().sum::<f64>() / self.errors.len() as f64
    }
}

/// `‖a − b‖ / ‖b‖`.
fn relative_error(a: &Tensor, b: &Tensor) -> anyhow::Result<f64> {
    let diff = (a - b)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    let norm = b.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    Ok((diff / norm.max(f64::MIN_POSITIVE)).sqrt())
}

/// Measures the error at each of `features` until done or `stop` is raised.
pub(super) fn run(
    args: &Args,
    features: &[usize],
    pool: &rayon::ThreadPool,
    bar: &ProgressBar,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<ErrorPoint>> {
    let (h, l, d) = (args.heads, args.favor_len, args.dim);
    let x = |seed| attn::random::uniform(&[1, h, l, d], -1.0, 1.0, seed);
    let (q, k, v) = (x(11)?, x(12)?, x(13)?);
    let exact = pool.install(|| attn::sdpa(&q, &k, &v, &SdpaOptions::default()))?;
    let scale = (d as f64).powf(-0.25);
    let (qs, ks) = ((&q * scale)?, (&k * scale)?);
    println!("FAVOR+ against exact softmax attention, [1, {h}, {l}, {d}] non-causal, {SEEDS} seeds per count:");
    let mut points = Vec::new();
    for &m in features {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        bar.set_message(format!("FAVOR+ error, {m} features"));
        let errors = (0..SEEDS)
            .map(|seed| {
                let approx =
                    pool.install(|| attn::linear_attention(&qs, &ks, &v, &LinearOptions::favor(d, m, seed)?))?;
                relative_error(&approx, &exact)
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        let p = ErrorPoint { m, errors };
        crate::commands::say(bar, format!("  {m:>5} features: relative error {:.4} (mean of {SEEDS})", p.mean()));
        points.push(p);
        bar.inc(1);
    }
    Ok(points)
}

/// Draws `variants-favor-error.png`; returns its path and the Markdown of the error table.
pub(super) fn report(args: &Args, points: &[ErrorPoint], dir: &Path) -> anyhow::Result<(Vec<String>, String)> {
    let pts: Vec<(f64, f64)> = points.iter().map(|p| (p.m as f64, p.mean())).collect();
    let slope = log_log_slope(&pts).map_or("-".to_string(), |k| format!("{k:.2}"));
    println!("fitted slope of log error over log features: {slope} (Monte Carlo: −0.5)");
    let (h, l, d) = (args.heads, args.favor_len, args.dim);
    let chart = LineChart {
        title: format!("FAVOR+ vs exact softmax, [1, {h}, {l}, {d}]"),
        x_label: "random features m".into(),
        y_label: "relative error".into(),
        log_x: true,
        log_y: true,
        series: vec![Series { name: format!("mean of {SEEDS} seeds (slope {slope})"), points: pts }],
    };
    let path = dir.join("variants-favor-error.png");
    draw_lines(&path, &chart)?;
    let mut md = format!(
        "## FAVOR+ against exact softmax attention\n\n`[1, {h}, {l}, {d}]`, non-causal; relative Frobenius error, \
         mean of {SEEDS} seeds; fitted log-log slope {slope} (Monte Carlo: −0.5).\n\n| features | error | seeds' errors |\n\
         |---|---|---|\n"
    );
    for p in points {
        let each: Vec<String> = p.errors.iter().map(|e| format!("{e:.4}")).collect();
        writeln!(md, "| {} | {:.4} | {} |", p.m, p.mean(), each.join(", "))?;
    }
    Ok((vec![path.display().to_string()], md))
}
