//! `attn explain heads CHECKPOINT`: what each head of a model trained by `attn train` attends to
//! (`attn_train::experiments::heads`): mean attention distance and entropy per layer and head on
//! held-out pairs, against uniform attention over the same keys, and one pair's weights drawn as a
//! grid of heads per kind of attention and layer.

use std::path::PathBuf;

use attn::heatmap::{draw_head_grid, HeatmapStyle};
use attn_train::experiments::heads::{self, HeadsSettings, PatternStats};
use attn_train::translate::Translator;

use crate::commands::out_dir::OutDir;
use crate::commands::with_flag;

/// Arguments of `attn explain heads`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The folder `attn train --out` wrote.
    pub checkpoint: PathBuf,
    /// Held-out pairs of the checkpoint's task to measure.
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Which measured pair to draw (0-based).
    #[arg(long, default_value_t = 0)]
    pub example: usize,
    #[command(flatten)]
    pub out: OutDir,
}

/// `distance` (or `—`) and `entropy` as table cells.
fn cells(s: &PatternStats) -> String {
    let distance = s.distance.map_or_else(|| "—".into(), |d| format!("{d:.3}"));
    format!("{distance:>9} {:>9.3}", s.entropy)
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let translator = Translator::load(&args.checkpoint)?;
    let sample = heads::sample(&translator, &HeadsSettings { samples: args.samples, example: args.example })
        .map_err(with_flag::<Args>)?;
    let dir = args.out.prepare()?;
    let report = heads::run(&translator, &sample)?;
    println!(
        "{}: {} held-out pairs, teacher-forced; means over the real query rows of the distance \
         Σ_j w_ij·|i − j| (positions) and the entropy −Σ_j w_ij·ln w_ij (nats); layers from 1, heads \
         from 0 as in the pictures",
        args.checkpoint.display(),
        report.samples
    );
    println!("{:<9} {:>5} {:>5} {:>9} {:>9}", "attention", "layer", "head", "distance", "entropy");
    for row in &report.rows {
        println!("{:<9} {:>5} {:>5} {}", row.kind.name(), row.layer + 1, row.head, cells(&row.stats));
    }
    for (kind, stats) in &report.uniform {
        println!("{:<9} {:>11} {}", kind.name(), "uniform", cells(stats));
    }
    let (source, target) = &report.example;
    let mut written = Vec::new();
    for grid in &report.grids {
        let path = dir.join(format!("heads-{}-layer{}.png", grid.kind.name(), grid.layer + 1));
        let title = match grid.kind {
            heads::AttentionKind::EncoderSelf => {
                format!("encoder self-attention, layer {}: {source:?}", grid.layer + 1)
            }
            heads::AttentionKind::DecoderSelf => {
                format!("decoder self-attention, layer {}: {target:?}", grid.layer + 1)
            }
            heads::AttentionKind::Cross => {
                format!("cross-attention, layer {}: {source:?} → {target:?}", grid.layer + 1)
            }
        };
        let style = HeatmapStyle {
            title: Some(title),
            query_labels: Some(grid.query_tokens.clone()),
            key_labels: Some(grid.key_tokens.clone()),
            ..Default::default()
        };
        let (lq, lk) = (grid.query_tokens.len(), grid.key_tokens.len());
        draw_head_grid(&path, &grid.weights, Some(&grid.keep), report.heads, lq, lk, &style)?;
        written.push(path.display().to_string());
    }
    println!("wrote {}", written.join(", "));
    Ok(())
}
