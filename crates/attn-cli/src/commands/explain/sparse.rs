//! `attn explain sparse`: the named block-sparse patterns (`attn::sparse::Pattern`). Each is
//! drawn as a heatmap of its mask at a small length, its 64×64 blocks visible
//! (`attn::heatmap::draw_block_mask`); then the forward time and memory of dense attention and of
//! three patterns (a sliding window, Sparse Transformer's strided pattern with a stride near √L,
//! BigBird) over lengths L, as a table and two log-log plots with each series' fitted slope (the
//! exponent of `L` it grows with: 2 for dense time, 1 for O(L) work). See the `scaling` submodule.

mod scaling;

use anyhow::bail;
use attn::heatmap::{draw_block_mask, HeatmapStyle};
use attn::sparse::Pattern;
use attn::Window;

use crate::commands::out_dir::OutDir;
use crate::commands::threads::Threads;

/// Arguments of `attn explain sparse`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Length of the mask pictures (64 to 4096); each pattern's parameters scale with it.
    #[arg(long, default_value_t = 512)]
    pub picture_len: usize,
    /// Lengths L of the time and memory sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096,8192,16384,32768")]
    pub lengths: Vec<usize>,
    /// Longest L at which dense attention is timed (its time grows with L²).
    #[arg(long, default_value_t = 16384)]
    pub dense_max: usize,
    /// Query (and key/value) heads H of the sweep's `[1, H, L, D]` inputs.
    #[arg(long, default_value_t = 1)]
    pub heads: usize,
    /// Head width D of the sweep.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Most timed calls per length and series (after one untimed call; timing stops after 2
    /// seconds once 3 calls were made).
    #[arg(long, default_value_t = 3)]
    pub iters: usize,
    #[command(flatten)]
    pub threads: Threads,
    #[command(flatten)]
    pub out: OutDir,
}

/// Shortest and longest `--picture-len`.
const PICTURE_LENS: (usize, usize) = (64, 4096);

pub fn main(args: Args) -> anyhow::Result<()> {
    let (lo, hi) = PICTURE_LENS;
    if !(lo..=hi).contains(&args.picture_len) {
        bail!("--picture-len {}: expected {lo} to {hi}", args.picture_len);
    }
    if args.lengths.is_empty() || args.lengths.contains(&0) || args.heads == 0 || args.dim == 0 || args.iters == 0 {
        bail!("--lengths, --heads, --dim and --iters must all be positive");
    }
    let dir = args.out.prepare()?;
    let pool = args.threads.pool()?;
    let n = args.picture_len;
    println!("the patterns at L = {n} (a pair's colour: the share of its 64×64 block allowed)");
    let mut written = Vec::new();
    for pattern in picture_patterns(n) {
        let mask = pool.install(|| pattern.block_mask(n, n))?;
        let path = dir.join(format!("sparse-{}.png", pattern.name()));
        let title = format!("{pattern}, L {n}: {:.1}% of blocks", 100.0 * mask.density());
        let style = HeatmapStyle { title: Some(title), ..HeatmapStyle::default() };
        draw_block_mask(&path, &mask, 0, 0, &style)?;
        println!("  {:<58} {:>6.1}% of blocks, {:>6} bytes", pattern.to_string(), 100.0 * mask.density(), mask.bytes());
        written.push(path.display().to_string());
    }
    written.extend(scaling::run(&args, dir, &pool)?);
    println!("wrote {}", written.join(", "));
    Ok(())
}

/// Every named pattern with parameters that show its structure at length `n` (at least 64).
fn picture_patterns(n: usize) -> Vec<Pattern> {
    let window = Window { left: Some(n / 16), right: Some(n / 16) };
    let (global, stride) = (n / 32, n / 8);
    vec![
        Pattern::Strided { stride: (n as f64).sqrt().ceil() as usize },
        Pattern::Fixed { stride, summary: stride / 8 },
        Pattern::Longformer { window, global },
        Pattern::BigBird { window, global, random: 2, seed: 0 },
        Pattern::Document { lengths: vec![n * 3 / 16, n * 5 / 16, n / 8, n - n * 10 / 16] },
        Pattern::PrefixLm { prefix: n / 4 },
        Pattern::Sinks { sinks: global, window: stride },
    ]
}
