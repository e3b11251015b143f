//! `attn explain scaling`: why attention scales `q·k` by `1/√d_k`. For each width `d_k`, random
//! unit-variance queries and keys (`attn_train::experiments::scaling`): the variance of `q·k`, and
//! the entropy and Jacobian norm (mean and median) of the softmax with and without the scale, as a
//! table and three plots over `d_k`.

use attn::chart::{draw_lines, LineChart, Series};
use attn_train::experiments::scaling::{self, ScalingRow, ScalingSettings, SoftmaxStats};

use crate::commands::out_dir::OutDir;
use crate::commands::with_flag;

/// Arguments of `attn explain scaling`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Key widths d_k, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64,128,256,512,1024")]
    pub dims: Vec<usize>,
    /// Keys per query (the length of each softmax).
    #[arg(long, default_value_t = 16)]
    pub keys: usize,
    /// Random queries per width.
    #[arg(long, default_value_t = 2000)]
    pub trials: usize,
    /// Seed of the random queries and keys.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub out: OutDir,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let settings = ScalingSettings { dims: args.dims, keys: args.keys, trials: args.trials, seed: args.seed };
    settings.check().map_err(with_flag::<Args>)?;
    let dir = args.out.prepare()?;
    let rows = scaling::run(&settings)?;
    println!(
        "{} keys per query, {} random queries per width; softmax of q·k (unscaled) and of q·k/√d_k (scaled)",
        settings.keys, settings.trials
    );
    println!(
        "{:>6} {:>10} {:>8} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11}",
        "d_k", "var(q·k)", "var/d_k", "H unsc", "H scaled", "|J| unsc", "|J| scaled", "med unsc", "med scaled"
    );
    for r in &rows {
        println!(
            "{:>6} {:>10.2} {:>8.3} {:>9.4} {:>9.4} {:>11.3e} {:>11.3e} {:>11.3e} {:>11.3e}",
            r.d_k,
            r.score_variance,
            r.score_variance / r.d_k as f64,
            r.unscaled.entropy,
            r.scaled.entropy,
            r.unscaled.jacobian_mean,
            r.scaled.jacobian_mean,
            r.unscaled.jacobian_median,
            r.scaled.jacobian_median
        );
    }
    println!(
        "H: mean softmax entropy in nats (uniform: ln {} = {:.4}); |J|, med: mean and median Frobenius norm \
         of the softmax Jacobian diag(p) − p·pᵀ",
        settings.keys,
        (settings.keys as f64).ln()
    );
    let series = |name: &str, f: &dyn Fn(&ScalingRow) -> f64| Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.d_k as f64, f(r))).collect(),
    };
    let both = |what: &str, f: fn(&SoftmaxStats) -> f64| {
        vec![
            series(&format!("{what}unscaled q·k"), &|r| f(&r.unscaled)),
            series(&format!("{what}scaled q·k/√d_k"), &|r| f(&r.scaled)),
        ]
    };
    // Mean then median of each: the chart draws every second series dashed, so the scaled mean
    // and median, which nearly coincide, stay told apart.
    let mean_and_median = |stats: fn(&ScalingRow) -> &SoftmaxStats, what: &str| {
        vec![
            series(&format!("mean, {what}"), &|r| stats(r).jacobian_mean),
            series(&format!("median, {what}"), &|r| stats(r).jacobian_median),
        ]
    };
    let chart = |title: &str, y: &str, log_y: bool, series: Vec<Series>| LineChart {
        title: title.into(),
        x_label: "d_k".into(),
        y_label: y.into(),
        log_x: true,
        log_y,
        series,
    };
    let files = [
        (
            "scaling-variance.png",
            chart(
                "variance of q·k for unit-variance q, k",
                "variance",
                true,
                vec![series("var(q·k), measured", &|r| r.score_variance), series("d_k", &|r| r.d_k as f64)],
            ),
        ),
        (
            "scaling-entropy.png",
            chart("softmax entropy (nats)", "mean entropy", false, both("", |s: &SoftmaxStats| s.entropy)),
        ),
        (
            "scaling-gradient.png",
            chart(
                "gradient through softmax: norm of its Jacobian",
                "Frobenius norm",
                true,
                [mean_and_median(|r| &r.unscaled, "unscaled q·k"), mean_and_median(|r| &r.scaled, "scaled q·k/√d_k")]
                    .concat(),
            ),
        ),
    ];
    let mut written = Vec::new();
    for (name, c) in &files {
        let path = dir.join(name);
        draw_lines(&path, c)?;
        written.push(path.display().to_string());
    }
    println!("wrote {}", written.join(", "));
    Ok(())
}
