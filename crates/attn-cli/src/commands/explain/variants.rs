//! `attn explain variants`: what the attention variants cost as the length grows, and what
//! FAVOR+'s approximation costs in accuracy. Over `L` from `--min-len` to `--max-len` (doubling;
//! `[1, H, L, D]` causal self-attention, 8 heads of 64 by default), the forward and the
//! forward + backward of exact attention by the reference kernel (the formula one query row at a
//! time on one thread, up to `--dense-max`), flash attention, a sliding window, a block-sparse pattern
//! (Sparse Transformer's strided), linear attention (`elu+1`, FAVOR+ with 64 and 256
//! features) and the gated delta rule (Gated DeltaNet's, as Qwen3-Next calls it) are timed and their memory measured (`sweep`); log-log plots give each series its
//! fitted slope, and the seed table's complexity column is printed and written with the slopes
//! measured beside it. Then FAVOR+'s error against exact softmax attention as its features grow
//! (`favor`). A progress bar counts the cases; Ctrl-C stops after the case running, and the
//! table, plots and `variants.md` are written from what was measured.

mod favor;
mod sweep;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::commands::out_dir::OutDir;
use crate::commands::threads::Threads;
use crate::commands::Interrupted;

/// Arguments of `attn explain variants`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Shortest length L of the sweep (a power of two times it up to --max-len).
    #[arg(long, default_value_t = 256)]
    pub min_len: usize,
    /// Longest length L of the sweep.
    #[arg(long, default_value_t = 65536)]
    pub max_len: usize,
    /// Longest L at which the reference kernel (exact, one query row at a time, one thread) is run.
    #[arg(long, default_value_t = 4096)]
    pub dense_max: usize,
    /// Longest L at which the quadratic-time series (reference, flash) run their backward too.
    #[arg(long, default_value_t = 16384)]
    pub quadratic_backward_max: usize,
    /// Heads H of the `[1, H, L, D]` inputs.
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Head width D.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Most timed calls per case (after one untimed call below L = 8192; timing stops after 2
    /// seconds once 3 calls were made).
    #[arg(long, default_value_t = 3)]
    pub iters: usize,
    /// Length of FAVOR+'s error measurement (non-causal, against exact softmax attention).
    #[arg(long, default_value_t = 1024)]
    pub favor_len: usize,
    /// Most FAVOR+ features in the error measurement (16, 32, ... up to it).
    #[arg(long, default_value_t = 1024)]
    pub favor_max_features: usize,
    #[command(flatten)]
    pub threads: Threads,
    #[command(flatten)]
    pub out: OutDir,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if args.min_len == 0 || args.max_len < args.min_len {
        bail!("--min-len {} and --max-len {}: expected 0 < min ≤ max", args.min_len, args.max_len);
    }
    if args.heads == 0 || args.dim == 0 || args.iters == 0 || args.favor_len == 0 || args.favor_max_features < 16 {
        bail!("--heads, --dim, --iters and --favor-len must be positive, --favor-max-features at least 16");
    }
    let dir = args.out.prepare()?;
    let pool = args.threads.pool()?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("cannot install the Ctrl-C handler")?;
    let lengths: Vec<usize> =
        std::iter::successors(Some(args.min_len), |&l| Some(l * 2)).take_while(|&l| l <= args.max_len).collect();
    let plan = sweep::plan(&args, &lengths);
    let features = favor::features(args.favor_max_features);
    let style =
        ProgressStyle::with_template("{bar:30} {pos}/{len} cases · {msg} · ETA {eta}").expect("the template is valid");
    let bar = ProgressBar::new((plan.len() + features.len()) as u64).with_style(style);
    let points = sweep::run(&args, &plan, &pool, &bar, &stop)?;
    let errors =
        if stop.load(Ordering::Relaxed) { Vec::new() } else { favor::run(&args, &features, &pool, &bar, &stop)? };
    bar.finish_and_clear();
    let (mut written, sweep_md) = sweep::report(&args, &points, dir)?;
    let (favor_paths, favor_md) = favor::report(&args, &errors, dir)?;
    written.extend(favor_paths);
    let path = dir.join("variants.md");
    let md = format!("# attn explain variants\n\n{sweep_md}\n{favor_md}");
    attn::write_file::write_atomically(&path, |w| w.write_all(md.as_bytes()))?;
    written.push(path.display().to_string());
    println!("wrote {}", written.join(", "));
    if stop.load(Ordering::Relaxed) {
        println!("stopped by Ctrl-C: the files hold the cases measured before it");
        return Err(Interrupted.into());
    }
    Ok(())
}
